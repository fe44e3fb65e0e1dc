// detail::redlock_core<C>: what a redlock_client shares with its locks: one connection per
// master, the rounds that send one command to every master at once and tally the answers, the
// loss timer and the watchdog (over quorum_connection, which makes one renewal batch a round).
//
// A round runs on the thread that asks for it (detail/topology/quorum_round.hpp): it writes the
// command to every master's socket, then polls all of them until every master answered or the node
// timeout passed. Releases that could not reach a master are finished by the process's reaper.
//
// A master's connection that can report reconnections (reconnect_reporting) reports them, when
// the client has an event hook, as reconnected events naming the master; what a round reports
// is held back until the round is over (detail/engine/reconnect_relay.hpp), so the hook never runs
// between the moment a round starts and the moment its answers are in.
//
// Locks hold the core by shared_ptr, so a lock that outlives its client still releases. The
// connections, the loss timer and the watchdog are per process (detail/engine/per_process.hpp): a
// forked child makes its own and never touches its parent's sockets or threads.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/detail/engine/loss_timer.hpp>
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/engine/reaper.hpp>
#include <redislock/detail/engine/reconnect_relay.hpp>
#include <redislock/detail/topology/node_connector.hpp>
#include <redislock/detail/topology/quorum_connection.hpp>
#include <redislock/detail/topology/quorum_round.hpp>
#include <redislock/detail/topology/redlock_acquisition.hpp>
#include <redislock/detail/topology/redlock_replies.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/quorum_error.hpp>
#include <redislock/redlock_options.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>
#include <redislock/watchdog.hpp>

namespace redislock::detail {

template <connection C>
class redlock_core : public std::enable_shared_from_this<redlock_core<C>> {
public:
    using clock = std::chrono::steady_clock;

    struct node_spec {
        std::string description;
        std::function<C()> make_connection;
    };

    redlock_core(std::vector<node_spec> nodes, redlock_options options)
        : events{options.on_event},
          specs_{std::move(nodes)},
          options_{std::move(options)},
          nodes_{[this, count = specs_.size()] {
              return std::make_unique<node_table>(*this, count);
          }} {
        if constexpr (reconnect_reporting<C>) {
            if (events.observed()) {
                // The connections report through reconnects_, which the core outlives.
                reconnects_.set([this](std::string_view server) { events.reconnected(server); });
            }
        }
    }

    redlock_core(const redlock_core&) = delete;
    redlock_core& operator=(const redlock_core&) = delete;

    std::size_t size() const noexcept { return specs_.size(); }
    std::size_t quorum() const noexcept { return specs_.size() / 2 + 1; }
    const redlock_options& options() const noexcept { return options_; }
    const std::string& describe(std::size_t node) const { return specs_[node].description; }

    /// Sends `op` for `acq` to every master it concerns (all for an acquisition, those that may
    /// hold the key otherwise; the others count as `no`) and returns each master's answer,
    /// once every master answered, `deadline` passed or `stop` was requested. `extend_lease` is
    /// the new lease for node_op::extend. Reconnections made during the round are reported as
    /// it returns.
    std::vector<node_outcome> round(node_op op, redlock_acquisition& acq,
                                    clock::time_point deadline, const std::stop_token& stop = {},
                                    std::string_view extend_lease = {}) {
        const auto reconnects_held = reconnects_.defer();
        std::vector<node_outcome> outcomes(size());
        std::vector<bool> ask(size(), op == node_op::acquire);
        if (op != node_op::acquire) {
            for (std::size_t i = 0; i < size(); ++i) {
                ask[i] = acq.may_hold(i);
                if (!ask[i]) {
                    outcomes[i].answer = node_answer::no;  // nothing of ours there
                }
            }
        }
        const std::array<std::string_view, 6> set{"SET", acq.name, acq.tok.view(),
                                                  "NX",  "PX",     acq.lease_text.view()};
        const std::array<std::string_view, 2> get{"GET", acq.name};
        const std::array<std::string_view, 1> keys{acq.name};
        const auto release =
            evalsha_argv(scripts::compare_and_delete, keys, std::array{acq.tok.view()});
        const auto extend =
            evalsha_argv(scripts::mutex_extend, keys, std::array{acq.tok.view(), extend_lease});
        fanout_command cmd;
        switch (op) {
            case node_op::acquire:
                cmd.argv = set;
                break;
            case node_op::verify:
                cmd.argv = get;
                break;
            case node_op::release:
                cmd = {release, &scripts::compare_and_delete};
                break;
            case node_op::extend:
                cmd = {extend, &scripts::mutex_extend};
                break;
        }
        const std::vector<node_replies> replies =
            run(ask, std::span<const fanout_command>{&cmd, 1}, acq.name, deadline, stop);
        for (std::size_t i = 0; i < size(); ++i) {
            if (!ask[i]) {
                continue;
            }
            const node_replies& r = replies[i];
            if (op == node_op::acquire && r.sent) {
                acq.set_hold(i, node_hold::unconfirmed);
            }
            if (!r.answered) {
                outcomes[i] = {node_answer::failed, why_unanswered(r, options_.node_timeout), false,
                               r.first_connect};
                continue;
            }
            outcomes[i] = node_outcome_of(op, acq, r.replies.front());
            if (op == node_op::acquire) {
                acq.set_hold(i, outcomes[i].answer == node_answer::yes ? node_hold::set
                                                                       : node_hold::not_set);
            } else if (op == node_op::extend && outcomes[i].answer == node_answer::yes) {
                acq.set_hold(i, node_hold::set);  // a SET that landed late is ours after all
            }
        }
        return outcomes;
    }

    /// Releases `acq` on every master that may hold it, waiting for their answers (at most the
    /// node timeout); masters that could not say are released again by the reaper in the
    /// background. Returns the round's outcomes.
    std::vector<node_outcome> release(const std::shared_ptr<redlock_acquisition>& acq) {
        const auto started = clock::now();
        std::vector<node_outcome> outcomes =
            round(node_op::release, *acq, started + options_.node_timeout);
        std::vector<std::size_t> again;
        std::vector<bool> heard(size(), false);
        for (std::size_t i = 0; i < size(); ++i) {
            const bool unsure =
                outcomes[i].answer == node_answer::failed && !outcomes[i].server_error;
            // A SET never confirmed may land after a "not ours": ask again once it surely did.
            const bool early =
                outcomes[i].answer == node_answer::no && acq->hold(i) == node_hold::unconfirmed;
            if (unsure || early) {
                again.push_back(i);
            }
            heard[i] = !unsure;
        }
        release_later(acq, again, heard, started);
        return outcomes;
    }

    /// Releases `acq` on every master that may hold it, in the background.
    void release_in_background(const std::shared_ptr<redlock_acquisition>& acq) {
        release_in_background(acq, acq->sent);
    }

    /// As above, for keys a grant sent at `granted` (the acquisition, or its last renewal
    /// round) may have set: tried while that grant's lease may still run.
    void release_in_background(const std::shared_ptr<redlock_acquisition>& acq,
                               clock::time_point granted) {
        std::vector<std::size_t> nodes;
        std::vector<bool> heard(size(), false);
        for (std::size_t i = 0; i < size(); ++i) {
            if (acq->may_hold(i)) {
                nodes.push_back(i);
            }
            heard[i] = acq->hold(i) == node_hold::set;
        }
        release_later(acq, nodes, heard, granted);
    }

    /// The replies of a quorum_connection batch: see there.
    std::vector<reply> quorum_replies(std::span<const command> commands,
                                      clock::time_point deadline) {
        const std::vector<fanout_command> batch = quorum_batch(commands);
        const std::string_view key = commands.front().size() > 3 ? commands.front()[3] : "";
        const std::vector<bool> all(size(), true);
        const auto replies =
            run(all, batch, key, std::min(deadline, clock::now() + options_.node_timeout), {});
        return quorum_replies_of(replies, commands.size(), size(), quorum());
    }

    /// The error for a round that reached too few masters, naming each and its answer.
    quorum_error no_quorum(std::string_view what, std::string_view name,
                           const std::vector<node_outcome>& outcomes) const {
        return no_quorum_error(what, name, outcomes, quorum(), size(),
                               [this](std::size_t i) -> const std::string& { return describe(i); });
    }

private:
    struct node_slot {
        std::mutex mutex;  // guards making the connection
        std::unique_ptr<C> connection;
        std::atomic<C*> made{nullptr};      // `connection` once made, read without the mutex
        std::atomic<bool> answering{true};  // its last call got an answer
    };

    struct node_table {
        node_table(redlock_core& core, std::size_t count) : slots(count) {
            if constexpr (fanout_connection<C>) {
                connectors.reserve(count);
                for (std::size_t i = 0; i < count; ++i) {
                    connectors.push_back(std::make_unique<node_connector>(
                        [&core, i](clock::time_point deadline) {
                            return core.warm_up(i, deadline);
                        },
                        [&core](std::string_view server) { core.reconnects_.report(server); },
                        core.options_.node_timeout));
                }
            }
        }
        std::vector<node_slot> slots;
        // Declared after the slots, so they stop (and their warm-ups end) before the
        // connections go.
        std::vector<std::unique_ptr<node_connector>> connectors;
    };

    // How a round reaches the masters: see fan_out().
    struct node_access {
        redlock_core* core;
        node_table* table;

        auto start(std::size_t node, std::span<const command> batch, const call_context& how) {
            return core->start_connected(*table, node, batch, how);
        }
        node_connector& connector(std::size_t node) { return *table->connectors[node]; }
        C* connection(std::size_t node) { return core->connection(node); }
    };

public:
    /// The connections come before the machinery that uses them, and go after it.
    quorum_connection<C> quorum_link{*this};
    per_process<loss_timer> timer{[] { return std::make_unique<loss_timer>(); }};
    /// Where the locks' events go (redlock_options::on_event).
    event_sink events;

private:
    // The connection to `node`, made now if there is none (outside the slot's mutex: a master
    // slow to connect must not hold up other threads' rounds).
    C* connection(std::size_t node) {
        node_slot& slot = nodes_.get().slots[node];
        {
            std::lock_guard guard{slot.mutex};
            if (slot.connection) {
                return slot.connection.get();
            }
        }
        auto made = std::make_unique<C>(specs_[node].make_connection());
        if constexpr (reconnect_reporting<C>) {
            if (events.observed()) {
                made->set_reconnect_handler(reconnects_.forward());  // before any call is made
            }
        }
        std::lock_guard guard{slot.mutex};
        if (!slot.connection) {
            slot.connection = std::move(made);
            slot.made.store(slot.connection.get(), std::memory_order_release);
        }
        return slot.connection.get();
    }

    // Starts `batch` on master `node` if that needs no connect first; std::nullopt otherwise
    // (nothing sent): its connector opens one. Without start_if_connected, a connection that
    // answered last time is taken to be open.
    auto start_connected(node_table& table, std::size_t node, std::span<const command> batch,
                         const call_context& how) {
        using call = typename C::call;
        node_slot& slot = table.slots[node];
        C* conn = slot.made.load(std::memory_order_acquire);
        if (conn == nullptr) {
            return std::optional<call>{};
        }
        if constexpr (connected_fanout_connection<C>) {
            return conn->start_if_connected(batch, how);
        } else {
            if (!slot.answering.load(std::memory_order_relaxed)) {
                return std::optional<call>{};
            }
            return std::optional<call>{conn->start(batch, how)};
        }
    }

    // Makes master `node`'s connection usable by `deadline`, on its connector's thread: made now
    // (its constructor connects), or given a connection open and free (connect(); without it, a
    // PING, which opens one when none is open). Returns the reconnections seen meanwhile, for the
    // round that goes on to use the connection to report as it ends.
    std::vector<std::string> warm_up(std::size_t node, clock::time_point deadline) {
        auto held = reconnects_.defer();
        node_slot& slot = nodes_.get().slots[node];
        if (C* conn = slot.made.load(std::memory_order_acquire)) {
            const call_context how{{}, deadline};
            if constexpr (connected_fanout_connection<C>) {
                conn->connect(how);
            } else {
                const std::array<std::string_view, 1> ping{"PING"};
                const reply r = detail::execute(*conn, ping, how);
                if (r.is_error()) {
                    throw server_error{"redislock: " + describe(node) +
                                       " answered PING with: " + r.text()};
                }
            }
        } else {
            (void)connection(node);
        }
        slot.answering.store(true, std::memory_order_relaxed);
        return held.take();
    }

    std::vector<node_replies> run(const std::vector<bool>& ask,
                                  std::span<const fanout_command> batch, std::string_view key,
                                  clock::time_point deadline, const std::stop_token& stop) {
        // Every fan-out (a renewal, a background release too) reports its reconnections once
        // all of its calls are over, not between two masters' answers.
        const auto reconnects_held = reconnects_.defer();
        node_table& table = nodes_.get();
        // Masters that answered last time first: with connections that can only be asked one
        // after another, one slow to connect delays only those after it.
        std::vector<std::size_t> order;
        order.reserve(size());
        for (const bool answering : {true, false}) {
            for (std::size_t i = 0; i < size(); ++i) {
                if (ask[i] &&
                    table.slots[i].answering.load(std::memory_order_relaxed) == answering) {
                    order.push_back(i);
                }
            }
        }
        const call_context how{key, deadline, stop.stop_possible() ? &stop : nullptr};
        std::vector<node_replies> replies =
            fan_out<C>(size(), node_access{this, &table}, order, batch, how);
        for (std::size_t i : order) {
            const bool cancelled = how.stop != nullptr && how.stop->stop_requested();
            if (replies[i].answered || !cancelled) {
                table.slots[i].answering.store(replies[i].answered, std::memory_order_relaxed);
            }
        }
        return replies;
    }

    // Hands the release of `acq` on `nodes` to the reaper, one cleanup per master in that
    // master's lane (a hung master never delays another's): sent again with backoff, at most
    // release_retries times, while the lease granted at `granted` may still run. A master's
    // "not ours" is final only once `heard` says it answered something of this acquisition
    // before: until then its SET may still be queued behind a hang, and land after.
    void release_later(const std::shared_ptr<redlock_acquisition>& acq,
                       const std::vector<std::size_t>& nodes, const std::vector<bool>& heard,
                       clock::time_point granted) {
        if (options_.release_retries <= 0) {
            return;
        }
        struct pending {
            std::shared_ptr<redlock_core> core;
            std::shared_ptr<redlock_acquisition> acq;
            std::size_t node;
            bool heard;
            int attempts_left;
        };
        const auto lease = acq->lease;
        const auto give_up_at = granted + lease + lease / 100 + std::chrono::milliseconds{2};
        for (const std::size_t node : nodes) {
            try {
                auto work = std::make_shared<pending>(pending{
                    this->shared_from_this(), acq, node, heard[node], options_.release_retries});
                background_reaper().add(
                    describe(node),
                    [work](clock::time_point deadline) {
                        try {
                            if (work->core->release_attempt(*work->acq, work->node, work->heard,
                                                            deadline)) {
                                return true;
                            }
                        } catch (...) {
                            // Out of memory: an attempt like any that failed.
                        }
                        return --work->attempts_left <= 0;
                    },
                    give_up_at);
            } catch (...) {
                // Out of memory: the key expires with its lease.
            }
        }
    }

    // One background release of `acq` on `node`. True when done with that master.
    bool release_attempt(redlock_acquisition& acq, std::size_t node, bool& heard,
                         clock::time_point deadline) {
        std::vector<bool> ask(size(), false);
        ask[node] = true;
        const std::array<std::string_view, 1> keys{acq.name};
        const auto release =
            evalsha_argv(scripts::compare_and_delete, keys, std::array{acq.tok.view()});
        const fanout_command cmd{release, &scripts::compare_and_delete};
        const auto replies = run(ask, std::span<const fanout_command>{&cmd, 1}, acq.name,
                                 std::min(deadline, clock::now() + options_.node_timeout), {});
        if (!replies[node].answered) {
            return false;
        }
        const node_outcome o =
            node_outcome_of(node_op::release, acq, replies[node].replies.front());
        const bool done = o.answer == node_answer::yes || o.server_error || heard;
        heard = true;
        return done;
    }

    // Where the masters' connections report reconnections; declared before them, so it
    // outlives them.
    reconnect_relay reconnects_;
    std::vector<node_spec> specs_;
    redlock_options options_;
    per_process<node_table> nodes_;

public:
    /// Renews leases by quorum rounds; declared last, so it stops before what it uses goes.
    basic_watchdog<quorum_connection<C>> watchdog{quorum_link};
};

}  // namespace redislock::detail
