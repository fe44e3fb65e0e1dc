// detail::redlock_core<C>: what a redlock_client shares with its locks: one worker per master,
// the loss timer, the renewal timer, and the rounds that send one command to every master at
// once and tally the answers.
//
// Locks hold the core by shared_ptr, so a lock that outlives its client still releases. The
// workers and timers are made on first use in each process (detail/fork_local.hpp): a forked
// child gets its own and never touches its parent's threads.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/deadline_timer.hpp>
#include <redislock/detail/fork_local.hpp>
#include <redislock/detail/names.hpp>
#include <redislock/detail/node_worker.hpp>
#include <redislock/detail/quorum_round.hpp>
#include <redislock/detail/scripts.hpp>
#include <redislock/detail/token.hpp>
#include <redislock/error.hpp>
#include <redislock/quorum_error.hpp>
#include <redislock/redlock_options.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

/// One acquisition attempt, shared by the tasks that act on it on every master.
struct redlock_acquisition {
    redlock_acquisition(std::string_view lock_name, std::string_view release_channel,
                        std::chrono::milliseconds lease_ms, std::size_t nodes)
        : name{lock_name},
          channel{release_channel},
          tok{token::random()},
          lease{lease_ms},
          lease_text{lease_ms.count()},
          sent_to(nodes) {}

    /// Records that the keys were set or renewed at `when` for `ms`: they may live until then.
    void may_live_until(std::chrono::steady_clock::time_point when) noexcept {
        const auto ns = when.time_since_epoch().count();
        auto current = expires.load(std::memory_order_relaxed);
        while (current < ns &&
               !expires.compare_exchange_weak(current, ns, std::memory_order_relaxed)) {
        }
    }

    /// The latest time a key of this acquisition may still exist.
    std::chrono::steady_clock::time_point latest_expiry() const noexcept {
        return std::chrono::steady_clock::time_point{
            std::chrono::steady_clock::duration{expires.load(std::memory_order_relaxed)}};
    }

    std::string name;
    std::string channel;
    token tok;
    std::chrono::milliseconds lease;
    decimal lease_text;
    std::chrono::steady_clock::time_point sent{};
    // Whether the SET went out to each master. Written and read by that master's worker only
    // (its tasks run in order), read by other threads only to skip masters it never reached.
    std::vector<std::atomic<bool>> sent_to;
    std::atomic<std::chrono::steady_clock::rep> expires{0};
};

enum class node_op { acquire, release, extend, verify };

template <connection C>
class redlock_core {
public:
    using clock = std::chrono::steady_clock;

    struct node_spec {
        std::string description;
        std::function<C()> make_connection;
    };

    redlock_core(std::vector<node_spec> nodes, redlock_options options)
        : nodes_{std::move(nodes)}, options_{options}, engine_{[this] {
              return std::make_unique<engine>(nodes_);
          }} {}

    redlock_core(const redlock_core&) = delete;
    redlock_core& operator=(const redlock_core&) = delete;

    // The workers run what is queued before they stop; nothing they do may schedule more.
    ~redlock_core() { closing_.store(true, std::memory_order_release); }

    std::size_t size() const noexcept { return nodes_.size(); }
    std::size_t quorum() const noexcept { return nodes_.size() / 2 + 1; }
    const redlock_options& options() const noexcept { return options_; }
    const std::string& describe(std::size_t node) const { return nodes_[node].description; }

    /// The timer that declares locks lost at their local deadline. Its callbacks do no I/O.
    deadline_timer& loss_timer() { return engine_.get().loss; }

    /// The timer whose callbacks renew leases (a blocking round each).
    deadline_timer& renewal_timer() { return engine_.get().renewal; }

    /// Renewals scheduled after this are skipped (the client is gone).
    void stop_renewals() noexcept { renewals_stopped_.store(true, std::memory_order_release); }
    bool renewals_stopped() const noexcept {
        return renewals_stopped_.load(std::memory_order_acquire);
    }

    /// How long a caller waits for a round past its node deadline: time for a worker whose
    /// call just ended to report.
    std::chrono::milliseconds grace() const noexcept {
        return options_.node_timeout / 4 + std::chrono::milliseconds{1};
    }

    /// Sends `op` for `acq` to every master at once and returns the round their answers go to.
    /// Every call ends by `deadline`. `extend_lease` is the new lease text for node_op::extend.
    /// With `here`, the calling thread makes one of the calls itself (on a master that answered
    /// its last call and has nothing queued), which blocks it for that call, or until *stop is
    /// requested when `stop` is not null.
    std::shared_ptr<quorum_round> start_round(node_op op,
                                              const std::shared_ptr<redlock_acquisition>& acq,
                                              clock::time_point deadline,
                                              std::string extend_lease = {}, bool here = true,
                                              const std::stop_token* stop = nullptr) {
        auto round = std::make_shared<quorum_round>(size(), quorum());
        engine& e = engine_.get();
        std::size_t own = size();
        if (here) {
            for (std::size_t i = 0; i < size(); ++i) {
                if (e.workers[i]->answering()) {
                    own = i;
                    break;
                }
            }
        }
        for (std::size_t i = 0; i < size(); ++i) {
            if (i != own) {
                e.workers[i]->post(node_call{this, op, acq, i, deadline, round, extend_lease,
                                             options_.release_retries});
            }
        }
        if (own < size()) {
            node_call call{this,     op,    acq,          own,
                           deadline, round, extend_lease, options_.release_retries};
            call.stop = stop;  // only while it runs here: the caller's token outlives the call
            if (!e.workers[own]->try_run_here(call)) {
                call.stop = nullptr;
                e.workers[own]->post(std::move(call));
            }
        }
        return round;
    }

    /// Sends the compare-and-delete for `acq` to every master it may have reached, without
    /// waiting; masters out of reach are retried in the background.
    void release_in_background(const std::shared_ptr<redlock_acquisition>& acq) {
        (void)start_round(node_op::release, acq, clock::now() + options_.node_timeout, {}, false);
    }

    /// Outcomes of `round`, waiting until settled (with `every_node`, until every master
    /// answered), `deadline` + grace() passed, or `stop`. Masters that have not answered by then
    /// are reported failed.
    std::vector<node_outcome> finish_round(quorum_round& round, clock::time_point deadline,
                                           const std::stop_token& stop = {},
                                           bool every_node = false) {
        return finish_round_by(round, deadline + grace(), stop, every_node);
    }

    /// As finish_round(), giving up at `until` itself.
    std::vector<node_outcome> finish_round_by(quorum_round& round, clock::time_point until,
                                              const std::stop_token& stop = {},
                                              bool every_node = false) {
        std::vector<node_outcome> outcomes = round.wait(until, stop, every_node);
        const bool timed_out = clock::now() >= until;
        for (node_outcome& o : outcomes) {
            if (o.answer == node_answer::pending) {
                o.answer = node_answer::failed;
                o.error = timed_out ? "no answer within " +
                                          std::to_string(options_.node_timeout.count()) + " ms"
                                    : std::string{"no answer yet when the outcome was settled"};
            }
        }
        return outcomes;
    }

    /// The error for a round that reached too few masters, naming each and its answer.
    quorum_error no_quorum(std::string_view what, std::string_view name,
                           const std::vector<node_outcome>& outcomes) const {
        std::string message = "redislock: cannot " + std::string{what} + " '" + std::string{name} +
                              "': a quorum of " + std::to_string(quorum()) + " of " +
                              std::to_string(size()) + " masters is out of reach:";
        std::vector<quorum_error::node_failure> failures;
        for (std::size_t i = 0; i < outcomes.size(); ++i) {
            message += "\n  " + describe(i) + ": ";
            switch (outcomes[i].answer) {
                case node_answer::yes:
                    message += "ok";
                    break;
                case node_answer::no:
                    message += "not ours";
                    break;
                case node_answer::pending:
                case node_answer::failed:
                    message += outcomes[i].error;
                    failures.push_back({describe(i), outcomes[i].error});
                    break;
            }
        }
        return quorum_error{std::move(message), std::move(failures)};
    }

private:
    struct engine {
        explicit engine(const std::vector<node_spec>& nodes) {
            workers.reserve(nodes.size());
            for (const node_spec& node : nodes) {
                workers.push_back(
                    std::make_unique<node_worker<C>>(node.make_connection, node.description));
            }
        }
        // Declared first, destroyed last: the timers post to the workers.
        std::vector<std::unique_ptr<node_worker<C>>> workers;
        deadline_timer loss;
        deadline_timer renewal;
    };

    // One command to one master, run on that master's worker.
    struct node_call {
        redlock_core* core;
        node_op op;
        std::shared_ptr<redlock_acquisition> acq;
        std::size_t node;
        clock::time_point deadline;
        std::shared_ptr<quorum_round> round;  // null for a background retry
        std::string extend_lease;
        int retries_left;
        const std::stop_token* stop = nullptr;  // the caller's, for a call made on its thread

        void operator()(node_worker<C>& worker) const {
            if (op != node_op::acquire && !acq->sent_to[node].load(std::memory_order_acquire)) {
                answer(node_answer::no, "never sent");  // the SET never left: nothing of ours
                return;
            }
            if (clock::now() >= deadline) {
                // Queued behind a slow call: not sent, so it cannot land late either.
                answer(node_answer::failed, "busy past the deadline, not sent");
                retry_release();
                return;
            }
            const call_context how{acq->name, deadline, stop};
            try {
                C& conn = worker.connection();
                if (clock::now() >= deadline) {
                    // Connecting took the whole budget: better not sent than sent late.
                    answer(node_answer::failed, "connected past the deadline, not sent");
                    retry_release();
                    return;
                }
                switch (op) {
                    case node_op::acquire:
                        acquire(conn, how);
                        break;
                    case node_op::release:
                        run_compare(conn, scripts::mutex_release, acq->channel, how);
                        break;
                    case node_op::extend:
                        run_compare(conn, scripts::mutex_extend, extend_lease, how);
                        break;
                    case node_op::verify:
                        verify(conn, how);
                        break;
                }
            } catch (const server_error& e) {
                answer(node_answer::failed, e.what(), true);
                return;
            } catch (const cancelled_error& e) {
                answer(node_answer::failed, e.what());  // says nothing about the master
                return;
            } catch (const std::exception& e) {
                worker.record_answer(false);
                answer(node_answer::failed, e.what());
                retry_release();
                return;
            }
            worker.record_answer(true);
        }

        void acquire(C& conn, const call_context& how) const {
            acq->sent_to[node].store(true, std::memory_order_release);
            const std::array<std::string_view, 6> set{"SET", acq->name, acq->tok.view(),
                                                      "NX",  "PX",      acq->lease_text.view()};
            const reply r = detail::execute(conn, set, how);
            if (r.is_status()) {
                answer(node_answer::yes);
            } else if (r.is_nil()) {
                answer(node_answer::no);
            } else {
                answer(node_answer::failed, r.is_error() ? r.text() : "unexpected reply", true);
            }
        }

        // mutex_release and mutex_extend: 1 done, 0 not ours.
        void run_compare(C& conn, const script& s, std::string_view arg,
                         const call_context& how) const {
            const reply r = run_script(conn, s, std::array{std::string_view{acq->name}},
                                       std::array{acq->tok.view(), arg}, how);
            if (r.is_integer()) {
                answer(r.as_integer() == 1 ? node_answer::yes : node_answer::no);
            } else if (r.is_error_code("WRONGTYPE")) {
                answer(node_answer::no);  // another type at the name is surely not our lock
            } else {
                answer(node_answer::failed, r.is_error() ? r.text() : "unexpected reply", true);
            }
        }

        void verify(C& conn, const call_context& how) const {
            const std::array<std::string_view, 2> get{"GET", acq->name};
            const reply r = detail::execute(conn, get, how);
            if (r.is_string()) {
                answer(r.text() == acq->tok.view() ? node_answer::yes : node_answer::no);
            } else if (r.is_nil() || r.is_error_code("WRONGTYPE")) {
                answer(node_answer::no);
            } else {
                answer(node_answer::failed, r.is_error() ? r.text() : "unexpected reply", true);
            }
        }

        void answer(node_answer a, std::string error = {}, bool server = false) const {
            if (round) {
                round->report(node, a, std::move(error), server);
            }
        }

        // A release that did not get through may have to undo a SET that lands later (a hung
        // master runs what it received when it wakes up): send it again, while the lease may
        // still run.
        void retry_release() const {
            if (op != node_op::release || retries_left <= 0 ||
                core->closing_.load(std::memory_order_acquire)) {
                return;
            }
            const int attempt = core->options_.release_retries - retries_left;
            const auto delay = core->options_.node_timeout * (2LL << std::min(attempt, 20));
            const auto when = clock::now() + delay;
            if (when >= acq->latest_expiry()) {
                return;  // the key, if any, has expired by then
            }
            node_call again{core,
                            op,
                            acq,
                            node,
                            when + core->options_.node_timeout,
                            nullptr,
                            {},
                            retries_left - 1};
            redlock_core* owner = core;
            const std::size_t target = node;
            owner->loss_timer().schedule(when, [owner, target, again = std::move(again)] {
                owner->engine_.get().workers[target]->post(again);
            });
        }
    };

    std::vector<node_spec> nodes_;
    redlock_options options_;
    std::atomic<bool> renewals_stopped_{false};
    std::atomic<bool> closing_{false};
    fork_local<engine> engine_;  // last: its threads use the members above
};

}  // namespace redislock::detail
