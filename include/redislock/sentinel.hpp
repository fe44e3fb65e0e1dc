// redislock::sentinel_connection: the master that Redis Sentinel names, followed across failovers.
//
//   redislock::sentinel_client client{"redis-sentinel://10.0.0.1:26379,10.0.0.2:26379/0#mymaster"};
//
// The URI and its options are described in sentinel_endpoint.hpp.
//
// How the master is found: every reachable sentinel is asked for its view of the master
// (SENTINEL MASTER, or SENTINEL GET-MASTER-ADDR-BY-NAME where ACLs allow only that), the view
// with the highest config epoch wins (a sentinel that has not yet heard of a failover reports an
// older epoch), and the node it names must answer ROLE with "master". A pool of
// hiredis_connection contexts is then kept to that node. Done for a call with a deadline or a
// stop token, every step of this (connecting to a sentinel or to the node included: those pools
// open on first use) gets no more than the time the call has left, and a stop request ends it.
//
// When the master changes: background threads, one per configured sentinel, each keep a
// subscription on their sentinel (reopened after a pause when it fails or stops answering its
// PINGs). When a switch of the master in use is announced (+switch-master), the new master it names
// is followed as soon as it answers ROLE with "master", without asking the sentinels first (one
// that hangs would hold the switch back for its command timeout); otherwise, and after any other
// switch, the master is resolved again. A call that gets a READONLY reply or a connection error
// re-resolves too. A demoted master is never used again: on a switch the old pool is dropped (calls
// already in flight on it finish there), and when no sentinel confirms a master the pool is dropped
// as well, so calls fail until one does. Subscriber links (notified waiting) opened to the old
// master report themselves broken once the pool is replaced, even though the old master may stay up
// and writable for a while: their waiters try again and subscribe on the new master, where releases
// publish.
//
// Failovers under way: between the promotion of a replica and +switch-master the old master still
// accepts writes, which the failover loses, even those a replica that was not promoted
// acknowledged. The sentinel that leads a failover announces its steps first (+elected-leader,
// +selected-slave, +failover-state-send-slaveof-noone, +promoted-slave...), and only that one:
// hence a subscription on every sentinel. From the first step announced for the master in use until
// the connection follows the next master (or the failover ends without a switch, as that sentinel
// announces, or its SENTINEL MASTER flags tell, asked every 250 ms meanwhile by the thread that
// listens to it and by no other), nothing is sent to the master. A step about a master the
// connection has not followed yet holds calls back too (on a loaded machine a sentinel may take a
// master just promoted for down before another announced the switch to it), until that failover
// ends or a switch from that master is announced; should the connection follow that master
// meanwhile, nothing is sent to it before. Steps about a master the connection left are late news
// of a failover it followed and hold nothing back. While calls are held back, a call waits until
// its deadline (an untimed one for the command timeout), then fails with timeout_error having sent
// nothing. A reply that comes after a step was announced, or after the connection moved to another
// master, is not returned: the command is sent again on the next master when that is safe (see
// "Retries"), else the call fails with connection_error, its outcome unknown. So a lock is never
// granted, and a renewal never confirmed, by a master after its failover was announced. Should
// every sentinel fall silent, a failover stops holding calls back after twice the sentinels'
// failover-timeout; so does an aborted one whose abort was not heard where an ACL refuses SENTINEL
// MASTER (its flags cannot be read then).
//
// Retries: a call that fails that way re-resolves and is retried once, within its deadline,
// when that is safe: after READONLY always (the node did not run the command); after a
// connection error or timeout (the command may have run) only for commands whose repetition
// cannot do harm: reads (GET, PTTL, EXISTS, PING, TIME, ROLE), SCRIPT, PUBLISH, WAIT, and scripts
// (EVAL/EVALSHA). The library's lock scripts are all compare-and-act on the caller's token, and
// an acquisition script sent again finds its own token and answers "acquired": running one twice
// acts at most once, so retrying them is safe. But then it writes nothing, and a WAIT sent behind
// it, on another connection, vouches for nothing: in a call sent again every WAIT is answered
// NOREPLICAS, as if no replica acknowledged (a lock with min_replicas undoes the acquisition). A
// SET, even with NX, is not sent again: when the first one landed late, the repeat finds its key
// and answers nil, which would say "taken by someone else" of a lock that is the caller's own; the
// caller gets the error instead, as from hiredis_connection, and a lock abandons the attempt (its
// reaper deletes the key if it landed). A pipeline is retried only when each of its commands is.
// Scripts of your own sent through this connection are retried too: they must be safe to run twice.
//
// Reconnections: the reconnect handler (set_reconnect_handler), which a sentinel_client turns
// into a reconnected event, is told the master's address ("host:port") when
// - the master's pool opens a connection to replace one that broke (as hiredis_connection does),
//   while that pool is still the master's: a caller that took the pool before a switch and
//   reconnects to the old, demoted master afterwards is not reported;
// - the connection opens a pool to the master in place of an earlier one: a switch to a new
//   master (one per address change, as counted by switches()), or the same master confirmed
//   again after no sentinel could confirm it and its pool was dropped. Finding the first master,
//   in the constructor, is not a reconnection.
// The handler runs with no internal lock held (a report made while the master is being resolved
// waits until the resolution ends), on the thread whose call opened the connection or the pool:
// a caller's, or a subscription thread when a check it makes after +switch-master (or after
// resubscribing) opens a pool to a new master or reopens a connection of the master's pool.
// Connections to the sentinels themselves (the queries and the subscriptions, which are reopened
// whenever they fail) are never reported: a sentinel that restarts or hangs would flood the
// handler with events that say nothing about the master.
//
// What this does not do: a failover loses writes the old master had not yet replicated. One the
// connection hears of only through +switch-master (every link to the leading sentinel lost, its
// announcements missed) is not held back: until the switch, the old master may grant locks whose
// writes the failover loses, and a rival may take the same lock on the new master. Replica
// acknowledgement (lock_options::min_replicas) narrows that; docs/planned-switchover.md says what
// is promised when.
//
// Thread safety: every member may be called from any number of threads.
// Lifetime: movable, not copyable. The destructor stops and joins the subscription threads
// (within the sentinels' connect and command timeouts).
// fork(): a child never uses its parent's sockets, threads or mutexes (a parent's thread may have
// held one at the fork, in the middle of a search for the master): its first call makes its own
// state, with the parent's master when the parent's mutex was free (else it asks the sentinels),
// its own connections and its own subscription threads. A failover under way at the fork is
// still held back in the child, until its own threads hear it end.
#pragma once

#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/failover_fence.hpp>
#include <redislock/detail/per_process.hpp>
#include <redislock/detail/reconnect_relay.hpp>
#include <redislock/detail/token.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>
#include <redislock/sentinel_endpoint.hpp>
#include <redislock/subscriber.hpp>

namespace redislock {

namespace detail {

inline bool equals_ignoring_case(std::string_view a, std::string_view b) noexcept {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::toupper(static_cast<unsigned char>(x)) ==
                      std::toupper(static_cast<unsigned char>(y));
           });
}

/// Whether sending `argv` a second time, after a first attempt whose outcome is unknown, can do
/// no harm (see "Retries" at the top of this header).
inline bool safe_to_repeat(command argv) noexcept {
    if (argv.empty()) {
        return false;
    }
    // Not SET, even with NX: a repeat after a first one that landed late answers nil, "taken",
    // where the key is the caller's own.
    constexpr std::array<std::string_view, 14> repeatable{
        "EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "SCRIPT", "GET",     "PTTL",
        "EXISTS",  "PING", "TIME",       "ROLE",    "WAIT",   "PUBLISH", "SPUBLISH"};
    return std::any_of(repeatable.begin(), repeatable.end(),
                       [&](std::string_view name) { return equals_ignoring_case(argv[0], name); });
}

/// Called by every sentinel_connection call once it found no failover of the master under way,
/// right before it sends, with the connection's failover_fence: null (nothing is called) unless
/// a test sets it, to announce a failover at that very moment.
inline std::atomic<void (*)(failover_fence&)> sentinel_call_admitted{nullptr};

inline bool is_readonly(const reply& r) {
    return r.is_error() && r.text().starts_with("READONLY");
}

/// One sentinel's view of the master.
struct master_view {
    std::string host;
    int port = 0;
    long long epoch = -1;  ///< -1: not known (GET-MASTER-ADDR-BY-NAME)
    /// The sentinel leads a failover of this master: until it ends, it may show the new config
    /// epoch with the old master's address while the others already name the new master.
    bool failover_in_progress = false;
};

/// The sentinels' channels a connection listens to: +switch-master, the steps of a failover
/// (only the sentinel that leads it announces them), and the ends of one that was aborted.
inline constexpr std::array<std::string_view, 13> sentinel_channels{
    "+switch-master",
    "+elected-leader",
    "+failover-state-select-slave",
    "+selected-slave",
    "+failover-state-send-slaveof-noone",
    "+failover-state-wait-promotion",
    "+promoted-slave",
    "+failover-state-reconf-slaves",
    "+failover-end",
    "+failover-end-for-timeout",
    "-failover-abort-not-elected",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout"};

/// What one sentinel announcement says about a master.
struct sentinel_event {
    enum class kind {
        other,     ///< nothing the connection acts on
        switched,  ///< +switch-master
        step,      ///< a step of a failover: the master is being replaced
        aborted,   ///< the failover ended without a switch
    };
    kind what = kind::other;
    std::string master_name;
    /// The master it is about ("ip:port"; for a switch, the old one).
    std::string master_address;
    /// For a switch, the new master ("ip:port").
    std::string new_address;
};

/// Parses a message on one of sentinel_channels: "+switch-master" carries
/// "<name> <old-ip> <old-port> <new-ip> <new-port>"; the others "master <name> <ip> <port> ..."
/// or, for a replica, "slave <id> <ip> <port> @ <name> <master-ip> <master-port>".
inline sentinel_event parse_sentinel_event(std::string_view channel, std::string_view payload) {
    std::vector<std::string_view> words;
    while (!payload.empty()) {
        const auto space = payload.find(' ');
        if (space != 0) {
            words.push_back(payload.substr(0, space));
        }
        payload = space == std::string_view::npos ? std::string_view{} : payload.substr(space + 1);
    }
    const auto named = [&](std::size_t at) {
        sentinel_event e;
        if (at + 2 < words.size()) {
            e.master_name = words[at];
            e.master_address = std::string{words[at + 1]} + ":" + std::string{words[at + 2]};
        }
        return e;
    };
    if (channel == "+switch-master") {
        sentinel_event e = named(0);
        e.what = sentinel_event::kind::switched;
        if (words.size() >= 5) {
            e.new_address = std::string{words[3]} + ":" + std::string{words[4]};
        }
        return e;
    }
    sentinel_event e;
    if (!words.empty() && words[0] == "master") {
        e = named(1);
    } else if (auto at = std::find(words.begin(), words.end(), "@"); at != words.end()) {
        e = named(static_cast<std::size_t>(at - words.begin()) + 1);
    }
    if (channel.starts_with("-failover-abort")) {
        e.what = sentinel_event::kind::aborted;
    } else if (std::find(sentinel_channels.begin() + 1, sentinel_channels.end(), channel) !=
               sentinel_channels.end()) {
        e.what = sentinel_event::kind::step;
    }
    return e;
}

/// A subscriber link to the master of one generation of a sentinel_connection. A demoted master
/// stays up, and may stay a writable master for a while, so a link to it does not break by
/// itself while releases publish on the new master: once the connection has moved on (its
/// generation changed), the link says it is broken, and the notifier wakes its waiters, who try
/// again and subscribe on the master in use then.
class master_subscriber_link final : public subscriber_link {
public:
    master_subscriber_link(std::unique_ptr<subscriber_link> link,
                           std::shared_ptr<hiredis_connection> pool,
                           const std::atomic<std::uint64_t>& current, std::uint64_t generation)
        : link_{std::move(link)},
          pool_{std::move(pool)},
          current_{current},
          generation_{generation} {}

    int fd() const noexcept override { return link_->fd(); }

    void send(command argv) override {
        check();
        link_->send(argv);
    }

    void read(std::vector<reply>& out) override {
        check();
        link_->read(out);
    }

    bool buffered() const noexcept override { return link_->buffered(); }
    bool reads_without_blocking() const noexcept override {
        return link_->reads_without_blocking();
    }

private:
    void check() const {
        if (current_.load(std::memory_order_acquire) != generation_) {
            throw connection_error{
                "redislock: " + pool_->config().describe() +
                " is no longer the master in use: its subscriber link is closed"};
        }
    }

    std::unique_ptr<subscriber_link> link_;
    std::shared_ptr<hiredis_connection> pool_;  // the link may share its TLS context
    const std::atomic<std::uint64_t>& current_;
    std::uint64_t generation_;
};

}  // namespace detail

/// A connection to the master that Redis Sentinel names: asks the sentinels, follows failovers,
/// never keeps using a demoted master. Thread-safe.
class sentinel_connection {
public:
    /// Finds the master at once, so unreachable sentinels or an unknown master name fail here,
    /// and starts the subscription thread.
    /// @throws redislock::connection_error when no sentinel names a master that answers ROLE
    ///         with "master"; redislock::invalid_argument for a bad URI or settings, or
    ///         rediss-sentinel:// in a build without TLS.
    explicit sentinel_connection(sentinel_endpoint config)
        : state_{std::make_unique<state>(checked(std::move(config)))} {
        (void)state_->current();
        state_->start_watcher();
    }

    /// Checks the settings and starts the subscription threads, but finds no master: the first
    /// call does, within that call's deadline. @throws redislock::invalid_argument as above.
    sentinel_connection(sentinel_endpoint config, defer_connect_t)
        : state_{std::make_unique<state>(checked(std::move(config)))} {
        state_->start_watcher();
    }

    /// @throws redislock::invalid_argument for a malformed URI; else as the other constructor.
    explicit sentinel_connection(std::string_view uri)
        : sentinel_connection{sentinel_endpoint::from_uri(uri)} {}

    /// Takes over another connection's sentinels and master.
    sentinel_connection(sentinel_connection&&) noexcept = default;
    /// Takes over another connection's sentinels and master.
    sentinel_connection& operator=(sentinel_connection&&) noexcept = default;
    ~sentinel_connection() = default;

    /// Sends one command to the current master (see "Retries" above).
    /// @throws redislock::connection_error, redislock::timeout_error
    reply execute(command argv) {
        return call(detail::safe_to_repeat(argv), no_deadline(), nullptr, {&argv, 1},
                    [&](hiredis_connection& c, clock::time_point by) {
                        return c.execute(argv, call_context{.deadline = by});
                    });
    }

    /// As execute(argv), ending by how.deadline or when *how.stop is requested; a retry happens
    /// only while the deadline has not passed.
    /// @throws redislock::connection_error, redislock::timeout_error, redislock::cancelled_error
    reply execute(command argv, const call_context& how) {
        return call(how.repeatable && detail::safe_to_repeat(argv), how.deadline, how.stop,
                    {&argv, 1}, [&](hiredis_connection& c, clock::time_point by) {
                        call_context bounded = how;
                        bounded.deadline = by;
                        return c.execute(argv, bounded);
                    });
    }

    /// Sends every command to the current master in one round trip.
    std::vector<reply> execute_pipeline(std::span<const command> commands) {
        return call(all_safe(commands), no_deadline(), nullptr, commands,
                    [&](hiredis_connection& c, clock::time_point by) {
                        const call_context bounded{.deadline = by};
                        return c.execute_pipeline(commands, {&bounded, 1});
                    });
    }

    /// As execute_pipeline(commands), bounded by the earliest deadline of `hows`.
    std::vector<reply> execute_pipeline(std::span<const command> commands,
                                        std::span<const call_context> hows) {
        auto deadline = no_deadline();
        const std::stop_token* stop = nullptr;
        for (const call_context& how : hows) {
            deadline = std::min(deadline, how.deadline);
            if (stop == nullptr) {
                stop = how.stop;
            }
        }
        const bool repeatable = std::all_of(hows.begin(), hows.end(),
                                            [](const call_context& how) { return how.repeatable; });
        return call(repeatable && all_safe(commands), deadline, stop, commands,
                    [&](hiredis_connection& c, clock::time_point by) {
                        std::vector<call_context> bounded{hows.begin(), hows.end()};
                        bounded.push_back(call_context{.deadline = by, .stop = stop});
                        return c.execute_pipeline(commands, bounded);
                    });
    }

    /// A subscriber link to the master in use now (see subscriber.hpp). Once the connection
    /// moves to another master (or drops this one), the link reports itself broken on its next
    /// read, although the old master may still be up: the notifier then wakes its waiters, who
    /// try again on the new master and subscribe there.
    /// @throws redislock::connection_error when no master can be found
    std::unique_ptr<subscriber_link> open_subscriber(std::string_view channel) {
        auto [pool, generation] = state_->current();
        return std::make_unique<detail::master_subscriber_link>(
            pool->open_subscriber(channel), pool, state_->this_process().published_generation,
            generation);
    }

    /// The master in use now, resolving it first if there is none.
    /// @throws redislock::connection_error when no master can be found
    endpoint master() { return state_->current().first->config(); }

    /// How many times this connection moved to another master (a master confirmed at another
    /// address than the one before it).
    std::uint64_t switches() const noexcept {
        return state_->switches.load(std::memory_order_relaxed);
    }

    /// The settings the connection was made with.
    const sentinel_endpoint& config() const noexcept { return state_->config; }

    /// Calls `handler` with the master's address ("host:port") each time the connection
    /// reconnects to the master: its pool replaced a connection that broke, or a pool was opened
    /// to a new master (or to the same one, after it had been dropped) in place of the earlier
    /// one; see "Reconnections" at the top of this header. Called with no internal lock held, so
    /// it may call back into the connection, on the thread whose call opened the connection or
    /// the pool: a caller's, or the subscription thread when one of its checks did. Connections
    /// to the sentinels are not reported. May be called at any time, from any thread; an empty
    /// handler stops the reports, but a report already under way when set() returns may still
    /// run the handler it replaced. What it throws is dropped.
    void set_reconnect_handler(std::function<void(std::string_view server)> handler) {
        state_->reconnect.set(std::move(handler));
    }

private:
    using clock = std::chrono::steady_clock;
    using pool_ptr = std::shared_ptr<hiredis_connection>;

    static sentinel_endpoint checked(sentinel_endpoint config) {
        if (config.sentinels.empty()) {
            throw invalid_argument{"redislock: a sentinel_endpoint needs at least one sentinel"};
        }
        if (config.master_name.empty()) {
            throw invalid_argument{"redislock: a sentinel_endpoint needs a master name"};
        }
        detail::check_connection_settings(config.node);
        config.node.check_tls();
        detail::require_tls_support(config.node);
        return config;
    }

    static clock::time_point no_deadline() noexcept { return clock::time_point::max(); }

    static bool all_safe(std::span<const command> commands) noexcept {
        return std::all_of(commands.begin(), commands.end(), detail::safe_to_repeat);
    }

    static bool readonly_reply(const reply& r) { return detail::is_readonly(r); }
    static bool readonly_reply(const std::vector<reply>& rs) {
        return std::any_of(rs.begin(), rs.end(), detail::is_readonly);
    }

    // A WAIT counts the replicas of the writes sent before it on its own connection. In a call
    // sent again, the write before it may have landed the first time: found again, it writes
    // nothing, and the WAIT behind it, on another connection, vouches for nothing (it may count
    // every replica at once). It is answered as if no replica acknowledged, so
    // lock_options::min_replicas never accepts a write no replica acknowledged.
    static reply distrusted_wait() {
        return reply::error(
            "NOREPLICAS the command was sent again: this WAIT may not cover the write before it");
    }
    static void distrust_waits(std::span<const command> commands, reply& r) {
        if (!commands.empty() && is_wait(commands[0])) {
            r = distrusted_wait();
        }
    }
    static void distrust_waits(std::span<const command> commands, std::vector<reply>& rs) {
        for (std::size_t i = 0; i < commands.size() && i < rs.size(); ++i) {
            if (is_wait(commands[i])) {
                rs[i] = distrusted_wait();
            }
        }
    }
    static bool is_wait(command argv) {
        return !argv.empty() && detail::equals_ignoring_case(argv[0], "WAIT");
    }

    // Runs `f` on the current master's pool once no failover of it is under way; on READONLY or
    // a connection error re-resolves, and retries once if that is safe and the deadline allows.
    // A reply that comes after a failover was announced, or after the master changed, may come
    // from a master whose writes the failover loses: it is not returned. The command is sent
    // again on the next master when that is safe, else the call fails as after a broken
    // connection (its outcome is unknown). Finding the master ends by `deadline` too, and at
    // once when *stop is requested. `commands` are what `f` sends (for the WAITs of a repeat);
    // `f` is given the deadline its round trip must end by. An untimed call is given one connect
    // and one command timeout in all.
    template <class F>
    std::invoke_result_t<F&, hiredis_connection&, clock::time_point> call(
        bool repeatable, clock::time_point deadline, const std::stop_token* stop,
        std::span<const command> commands, F&& f) {
        if (deadline == no_deadline()) {
            // An untimed call, retries and waits for a failover included, takes no longer than
            // one connect and one command would.
            deadline = clock::now() + config().node.connect_timeout + config().node.command_timeout;
        }
        for (bool last = false;; last = true) {
            const std::uint64_t disturbances = state_->await_settled(deadline, stop, last);
            if (auto* admitted = detail::sentinel_call_admitted.load(std::memory_order_acquire)) {
                admitted(state_->fence);
            }
            auto [pool, generation] = state_->current(deadline, stop);
            std::optional<std::invoke_result_t<F&, hiredis_connection&, clock::time_point>> result;
            try {
                result.emplace(f(*pool, deadline));
            } catch (const cancelled_error&) {
                throw;
            } catch (const connection_error&) {
                state_->re_resolve(generation, deadline, stop);
                if (!repeatable || last || clock::now() >= deadline) {
                    throw;
                }
                continue;
            }
            if (state_->fence.disturbances() != disturbances) {
                if (!repeatable || last || clock::now() >= deadline) {
                    throw connection_error{"redislock: a failover of '" + config().master_name +
                                           "' was announced, or its master changed, while " +
                                           pool->config().describe() +
                                           " ran the command: its outcome is unknown"};
                }
                continue;
            }
            if (last) {
                distrust_waits(commands, *result);
            }
            if (!readonly_reply(*result)) {
                return std::move(*result);
            }
            // The node was demoted. A command refused with READONLY did not run, so a single one
            // may always be sent again; in a pipeline the others may have run.
            state_->re_resolve(generation, deadline, stop);
            if (!(repeatable || single(*result)) || last || clock::now() >= deadline) {
                return std::move(*result);
            }
        }
    }

    static bool single(const reply&) noexcept { return true; }
    static bool single(const std::vector<reply>& rs) noexcept { return rs.size() == 1; }

    // What one process knows of the master, and the threads and connections it keeps to follow
    // it. A forked child makes its own (detail/per_process.hpp): a thread of the parent may have
    // held its mutexes at the fork, in the middle of a search for the master, and the parent's
    // subscription threads do not exist in the child. The child takes the parent's master if the
    // parent's mutex was free at the fork (the pool opens its own connections in the child), and
    // starts its own subscription threads at its first call.
    struct process_state {
        process_state(std::size_t sentinels, process_state* parent) : sentinel_links(sentinels) {
            if (parent != nullptr && parent->mutex.try_lock()) {
                master = parent->master;
                generation = parent->generation;
                last_master = parent->last_master;
                departed = parent->departed;
                parent->mutex.unlock();
                published_generation.store(generation, std::memory_order_release);
            }
        }
        process_state(const process_state&) = delete;
        process_state& operator=(const process_state&) = delete;

        ~process_state() { stop_watchers(); }

        // All asked to stop first, then joined, without the mutex they take: each ends within
        // the sentinels' connect and command timeouts. Only once no call can start them again.
        void stop_watchers() {
            for (std::jthread& w : watchers) {
                w.request_stop();
            }
            for (std::jthread& w : watchers) {
                if (w.joinable()) {
                    w.join();
                }
            }
        }

        std::mutex mutex;  // guards master, generation, last_master, departed, watchers
        pool_ptr master;
        std::uint64_t generation = 0;  // bumped whenever `master` is replaced or dropped
        // `generation` as subscriber links read it, without the mutex.
        std::atomic<std::uint64_t> published_generation{0};
        std::string last_master;  // "host:port" of the last confirmed master
        // The masters this process followed before the last one, most recent last (a few):
        // announcements of their failovers come late, about a switch already followed.
        std::vector<std::string> departed;
        std::vector<std::jthread> watchers;  // one per sentinel, once started

        std::timed_mutex resolve_mutex;  // one resolution at a time; guards what follows
        std::vector<std::unique_ptr<hiredis_connection>> sentinel_links;

        // Needs `mutex`.
        void bump_generation_locked() noexcept {
            ++generation;
            published_generation.store(generation, std::memory_order_release);
        }
    };

    struct state {
        explicit state(sentinel_endpoint c)
            : config{std::move(c)},
              processes{std::make_unique<detail::per_process<process_state>>(
                  std::function<std::unique_ptr<process_state>(process_state*)>{
                      [sentinels = config.sentinels.size()](process_state* parent) {
                          return std::make_unique<process_state>(sentinels, parent);
                      }})} {}

        // The subscription threads are joined while everything they use is whole.
        ~state() { this_process().stop_watchers(); }
        state(const state&) = delete;
        state& operator=(const state&) = delete;

        sentinel_endpoint config;

        // Before the master's pool, which reports to it until it closes.
        detail::reconnect_relay reconnect;

        std::atomic<std::uint64_t> switches{0};

        // A failover of the master announced and not yet followed (see "Failovers under way").
        // Fork-safe by itself: a child forked during a failover still holds its calls back.
        detail::failover_fence fence;
        // The sentinels' failover-timeout, as SENTINEL MASTER last said (ms).
        std::atomic<long long> failover_timeout_ms{180'000};
        // Set once the constructor found the master: every process then runs subscription
        // threads. Written before the connection is shared.
        bool watching = false;

        // This process's master, subscription threads and sentinel links (see process_state).
        std::unique_ptr<detail::per_process<process_state>> processes;

        // This process's.
        process_state& this_process() { return processes->get(); }

        // Returns once no failover of the master is under way, with the count of disturbances
        // read before that was checked: raise() marks a failover up before it counts it, so one
        // raised after the check is counted after this value, and the reply it disturbs is not
        // returned. A call that cannot wait that long (its deadline, or for an untimed one the
        // command timeout) throws timeout_error, and one stopped meanwhile cancelled_error.
        // `again`: the command was sent once before.
        std::uint64_t await_settled(clock::time_point deadline, const std::stop_token* stop,
                                    bool again) {
            for (;;) {
                const std::uint64_t disturbances = fence.disturbances();
                if (!fence.up() || !fence.raised()) {
                    return disturbances;  // (up, but past its bound: not raised)
                }
                wait_lifted(deadline, stop, again);
            }
        }

        void wait_lifted(clock::time_point deadline, const std::stop_token* stop, bool again) {
            {
                // A child forked during a failover inherits it raised: its own subscription
                // threads, started here rather than on its first use of the master, lift it.
                process_state& l = this_process();
                std::lock_guard lock{l.mutex};
                start_watchers_locked(l);
            }
            const auto until = deadline != clock::time_point::max()
                                   ? deadline
                                   : clock::now() + config.node.command_timeout;
            if (fence.wait_lifted(until, stop)) {
                return;
            }
            const auto raised = fence.raised();
            const std::string what = "a failover of '" + config.master_name + "'" +
                                     (raised ? " (" + raised->master + ")" : std::string{}) +
                                     " is under way";
            const std::string sent =
                again ? "; the command, sent before it was announced, was not sent again: its "
                        "outcome is unknown"
                      : ": nothing is sent to the master until the sentinels name the next one";
            if (stop != nullptr && stop->stop_requested()) {
                throw cancelled_error{"redislock: stopped while " + what + sent};
            }
            throw timeout_error{"redislock: " + what + sent};
        }

        // The master's pool and the generation it belongs to; resolves when there is none.
        std::pair<pool_ptr, std::uint64_t> current(
            clock::time_point deadline = clock::time_point::max(),
            const std::stop_token* stop = nullptr) {
            process_state& l = this_process();
            std::uint64_t seen = 0;
            {
                std::lock_guard lock{l.mutex};
                start_watchers_locked(l);
                if (l.master) {
                    return {l.master, l.generation};
                }
                seen = l.generation;
            }
            resolve(seen, deadline, stop);
            std::lock_guard lock{l.mutex};
            if (!l.master) {
                throw connection_error{"redislock: no master for '" + config.master_name +
                                       "' through the sentinels " + config.describe()};
            }
            return {l.master, l.generation};
        }

        // The pool of generation `seen` failed: find the master again, unless another thread did
        // since. A failure here is left to the next current(), which reports it.
        void re_resolve(std::uint64_t seen, clock::time_point deadline = clock::time_point::max(),
                        const std::stop_token* stop = nullptr) noexcept {
            try {
                resolve(seen, deadline, stop);
            } catch (...) {
            }
        }

        // Finds the master again; a new pool in place of an earlier master's is reported as a
        // reconnection, and so is a connection the kept pool reopened while confirming it, once
        // resolve_mutex is released (the deferral ends after it).
        void resolve(std::uint64_t seen, clock::time_point deadline, const std::stop_token* stop) {
            const auto deferred = reconnect.defer();
            const std::string reopened = resolve_serially(seen, deadline, stop);
            if (!reopened.empty()) {
                reconnect.report(reopened);
            }
        }

        // The reconnect handler of a master's pool: reports only while the pool is the master's.
        // A caller that took a pool before a switch may reopen a connection to the old, demoted
        // master afterwards; that is not a reconnection to the master.
        std::function<void(std::string_view)> forward_while_current(
            const hiredis_connection* pool) {
            return [this, pool](std::string_view server) {
                {
                    process_state& l = this_process();
                    std::lock_guard lock{l.mutex};
                    if (l.master.get() != pool) {
                        return;
                    }
                }
                reconnect.report(server);
            };
        }

        // Each round trip (connecting included: pools open on first use) is bounded by
        // `deadline` and ends at once when *stop is requested; a caller whose deadline passes
        // (or whose stop is requested) while another thread resolves stops waiting for it.
        // Returns the master's address when a new pool replaced an earlier master's (not for the
        // first master found), else "".
        std::string resolve_serially(std::uint64_t seen, clock::time_point deadline,
                                     const std::stop_token* stop) {
            process_state& l = this_process();
            std::unique_lock serial{l.resolve_mutex, std::defer_lock};
            if (deadline == clock::time_point::max() &&
                (stop == nullptr || !stop->stop_possible())) {
                serial.lock();
            } else {
                constexpr std::chrono::milliseconds stop_check{5};
                while (!serial.try_lock_until(std::min(deadline, clock::now() + stop_check))) {
                    // The search under way has not concluded: say why this call did not wait
                    // for it (with no master, "no master" would be a guess).
                    if (stop != nullptr && stop->stop_requested()) {
                        throw cancelled_error{
                            "redislock: stopped while waiting for a search for "
                            "the master '" +
                            config.master_name + "' under way"};
                    }
                    if (clock::now() >= deadline) {
                        throw timeout_error{"redislock: a search for the master '" +
                                            config.master_name + "' under way did not end in time"};
                    }
                }
            }
            const call_context bound{.deadline = deadline, .stop = stop};
            pool_ptr kept;
            {
                std::lock_guard lock{l.mutex};
                if (l.generation != seen) {
                    return {};
                }
                kept = l.master;
            }
            std::string why;
            std::vector<std::string> tried;
            for (const detail::master_view& view : ask_sentinels(l, why, bound)) {
                const std::string address = view.host + ":" + std::to_string(view.port);
                if (std::find(tried.begin(), tried.end(), address) != tried.end()) {
                    continue;  // several sentinels name the same node: one check is enough
                }
                tried.push_back(address);
                try {
                    const bool same = kept && kept->config().host == view.host &&
                                      kept->config().port == view.port;
                    pool_ptr pool = same ? kept : open_pool(view.host, view.port);
                    if (!answers_as_master(*pool, bound)) {
                        why += " " + address + " is not a master;";
                        continue;
                    }
                    std::lock_guard lock{l.mutex};
                    if (l.generation != seen) {
                        return {};  // a switch announced meanwhile was followed: it is newer
                    }
                    return publish_locked(l, address, std::move(pool));
                } catch (const cancelled_error&) {
                    throw;  // says nothing about the master: keep it
                } catch (const error& e) {
                    why += std::string{" "} + e.what() + ";";
                }
            }
            if (clock::now() >= deadline) {
                // The caller ran out of time, which says nothing about the master: keep it.
                throw timeout_error{"redislock: finding the master '" + config.master_name +
                                    "' through the sentinels did not finish in time:" + why};
            }
            {
                std::lock_guard lock{l.mutex};
                if (l.master && l.generation == seen) {
                    l.master.reset();
                    l.bump_generation_locked();
                }
            }
            throw connection_error{"redislock: no sentinel of " + config.describe() +
                                   " named a reachable master '" + config.master_name + "':" + why};
        }

        static bool answers_as_master(hiredis_connection& pool, const call_context& bound) {
            const std::array<std::string_view, 1> role{"ROLE"};
            const reply r = pool.execute(role, bound);
            return r.is_array() && !r.elements().empty() && r.elements()[0].is_string() &&
                   r.elements()[0].text() == "master";
        }

        // A pool to the node at `address` ("host:port", as the sentinels name it), reporting to
        // the reconnect handler while it is the master's.
        pool_ptr open_pool(const std::string& host, int port) {
            endpoint ep = config.node;
            ep.host = host;
            ep.port = port;
            ep.unix_socket.clear();
            // Not connected yet: the caller's first command connects, within its deadline.
            auto pool = std::make_shared<hiredis_connection>(std::move(ep), defer_connect);
            // Before the pool is published: no other thread can be using it yet.
            pool->set_reconnect_handler(forward_while_current(pool.get()));
            return pool;
        }

        // Needs `l.mutex`. Makes `pool`, confirmed a master at `address`, the master in use;
        // returns its address when it replaced an earlier master's pool (a reconnection to
        // report), else "".
        std::string publish_locked(process_state& l, const std::string& address, pool_ptr pool) {
            // Everything that may throw comes before the first change.
            constexpr std::size_t remembered = 8;
            const bool first = l.last_master.empty();
            const bool moved = !first && l.last_master != address;
            std::string next = address;
            std::string reopened =
                !first && l.master != pool ? pool->config().describe() : std::string{};
            l.departed.reserve(remembered + 1);
            if (moved) {
                switches.fetch_add(1, std::memory_order_relaxed);
                fence.note_switch();  // what is under way on the old master is disturbed
                if (l.departed.size() >= remembered) {
                    l.departed.erase(l.departed.begin());
                }
                l.departed.push_back(std::move(l.last_master));
            }
            std::erase(l.departed, address);
            l.last_master = std::move(next);
            if (l.master != pool) {
                l.master = std::move(pool);
                l.bump_generation_locked();
            }
            if (moved) {
                // The failover of the master left is followed: calls go on here, unless this
                // master's own failover was announced already (lifted when it is over). Should
                // this throw (out of memory in a forked child), the record stays to its bound.
                fence.lift_master(l.departed.back());
            }
            return reopened;
        }

        // A sentinel names `address` as the master (a switch to it, or its view): steps about it
        // from now on are news, even if this process followed it once before.
        void forget_departed(const std::string& address) {
            process_state& l = this_process();
            std::lock_guard lock{l.mutex};
            std::erase(l.departed, address);
        }

        // A sentinel announced that the master in use was replaced by the one at `to`: check
        // that one (ROLE) and follow it at once, without asking the sentinels first, where a
        // sentinel that hangs would hold the switch back for its command timeout. When it does
        // not answer as a master, the sentinels are asked as after any failure.
        void follow_switch(const std::string& from, const std::string& to) {
            process_state& l = this_process();
            std::uint64_t seen = 0;
            bool ours = false;  // the switch replaces the master in use
            bool followed = false;
            {
                std::lock_guard lock{l.mutex};
                followed = l.last_master == to;
                seen = l.generation;
                ours = l.last_master == from;
            }
            if (!ours) {
                fence.lift_master(from);  // its failover is over, and nothing goes there
            }
            if (followed) {
                return;
            }
            if (const auto colon = to.rfind(':'); ours && colon != std::string::npos) {
                try {
                    pool_ptr pool =
                        open_pool(to.substr(0, colon), std::atoi(to.c_str() + colon + 1));
                    const call_context bound{.deadline =
                                                 clock::now() + config.node.command_timeout};
                    if (answers_as_master(*pool, bound)) {
                        const auto deferred = reconnect.defer();
                        std::string reopened;
                        {
                            std::lock_guard lock{l.mutex};
                            if (l.generation != seen) {
                                return;  // another check published a master meanwhile
                            }
                            reopened = publish_locked(l, to, std::move(pool));
                        }
                        if (!reopened.empty()) {
                            reconnect.report(reopened);
                        }
                        return;
                    }
                } catch (const error&) {
                    // Not reachable yet: the sentinels are asked.
                }
            }
            re_resolve(seen);
        }

        // Every reachable sentinel's view, the newest config epoch first; on a tie, views of a
        // sentinel that is not leading a failover come first (a leader shows the new epoch with
        // the old address until its failover ends, while the others already name the new master
        // it announced, and a forced failover's old master still answers ROLE as a master).
        // Needs `l.resolve_mutex`.
        std::vector<detail::master_view> ask_sentinels(process_state& l, std::string& why,
                                                       const call_context& bound) {
            std::vector<detail::master_view> views;
            for (std::size_t i = 0; i < config.sentinels.size(); ++i) {
                const auto& where = config.sentinels[i];
                const std::string name = where.host + ":" + std::to_string(where.port);
                try {
                    if (!l.sentinel_links[i]) {
                        l.sentinel_links[i] = std::make_unique<hiredis_connection>(
                            config.sentinel(where), defer_connect);
                    }
                    if (auto view = ask(*l.sentinel_links[i], name, why, bound)) {
                        views.push_back(std::move(*view));
                    }
                } catch (const cancelled_error&) {
                    throw;
                } catch (const error& e) {
                    l.sentinel_links[i].reset();
                    why += " sentinel " + name + ": " + e.what() + ";";
                }
            }
            std::stable_sort(views.begin(), views.end(), [](const auto& a, const auto& b) {
                if (a.epoch != b.epoch) {
                    return a.epoch > b.epoch;
                }
                return !a.failover_in_progress && b.failover_in_progress;
            });
            return views;
        }

        std::optional<detail::master_view> ask(hiredis_connection& sentinel,
                                               const std::string& name, std::string& why,
                                               const call_context& bound) {
            const std::array<std::string_view, 3> master_cmd{"SENTINEL", "MASTER",
                                                             config.master_name};
            const reply r = sentinel.execute(master_cmd, bound);
            if (r.is_array()) {
                detail::master_view view;
                const auto& fields = r.elements();
                for (std::size_t k = 0; k + 1 < fields.size(); k += 2) {
                    if (!fields[k].is_string() || !fields[k + 1].is_string()) {
                        continue;
                    }
                    const std::string& key = fields[k].text();
                    const std::string& value = fields[k + 1].text();
                    if (key == "ip") {
                        view.host = value;
                    } else if (key == "port") {
                        view.port = std::atoi(value.c_str());
                    } else if (key == "config-epoch") {
                        view.epoch = std::atoll(value.c_str());
                    } else if (key == "flags") {
                        view.failover_in_progress =
                            value.find("failover_in_progress") != std::string::npos;
                    } else if (key == "failover-timeout") {
                        if (const long long ms = std::atoll(value.c_str()); ms > 0) {
                            failover_timeout_ms.store(ms, std::memory_order_relaxed);
                        }
                    }
                }
                if (!view.host.empty() && view.port > 0) {
                    return view;
                }
                why += " sentinel " + name + " gave no address;";
                return std::nullopt;
            }
            if (r.is_error() && r.text().find("No such master") == std::string::npos) {
                // An ACL may allow only the command the Sentinel client guidelines name.
                const std::array<std::string_view, 3> addr_cmd{
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", config.master_name};
                const reply a = sentinel.execute(addr_cmd, bound);
                if (a.is_array() && a.elements().size() == 2 && a.elements()[0].is_string() &&
                    a.elements()[1].is_string()) {
                    return detail::master_view{a.elements()[0].text(),
                                               std::atoi(a.elements()[1].text().c_str()), -1};
                }
            }
            why += " sentinel " + name + " does not know '" + config.master_name + "'" +
                   (r.is_error() ? " (" + r.text() + ")" : std::string{}) + ";";
            return std::nullopt;
        }

        // Starts this process's subscription threads (the constructor, once it found the
        // master; a forked child at its first call).
        void start_watcher() {
            watching = true;
            process_state& l = this_process();
            std::lock_guard lock{l.mutex};
            start_watchers_locked(l);
        }

        // Needs `l.mutex`. One subscription thread per sentinel: only the sentinel that leads a
        // failover announces its steps, and a hung sentinel must not hold up the others.
        void start_watchers_locked(process_state& l) {
            if (!watching || !l.watchers.empty()) {
                return;
            }
            for (std::size_t i = 0; i < config.sentinels.size(); ++i) {
                l.watchers.emplace_back([this, i](std::stop_token stop) { watch(stop, i); });
            }
        }

        /// What one subscription thread keeps across its links.
        struct watcher_state {
            std::size_t index = 0;  ///< its sentinel
            /// A link of this thread subscribed before: a new one may have missed announcements.
            bool subscribed_before = false;
            /// Its own link for the queries about a failover its sentinel announced (no
            /// resolve_mutex, so that a resolution held up by another sentinel delays nothing).
            std::unique_ptr<hiredis_connection> query;
            clock::time_point next_check{};  ///< of the failover its sentinel announced
        };

        // The subscription thread of sentinel `index`: its announcements about the master,
        // reconnecting after a pause whenever the link fails.
        void watch(std::stop_token stop, std::size_t index) {
            using namespace std::chrono;
            const auto& where = config.sentinels[index];
            watcher_state w;
            w.index = index;
            while (!stop.stop_requested()) {
                try {
                    hiredis_connection link{config.sentinel(where)};
                    detail::context_ptr ctx = link.open_dedicated();
                    if (!follow(*ctx, stop, w)) {
                        return;
                    }
                } catch (const std::exception&) {
                    // Unreachable or failed sentinel: again after a pause.
                }
                std::mutex pause_mutex;
                std::condition_variable_any pause;
                std::unique_lock pause_lock{pause_mutex};
                for (int slice = 0; slice < 4 && !stop.stop_requested(); ++slice) {
                    check_fence_if_due(w);
                    pause.wait_for(pause_lock, stop, milliseconds{50}, [] { return false; });
                }
            }
        }

        // Reads one subscription until it fails (returns true: open it again) or a stop is
        // requested (returns false). PINGs the sentinel so a hung one is noticed.
        bool follow(redisContext& ctx, std::stop_token& stop, watcher_state& w) {
            using namespace std::chrono;
            constexpr milliseconds slice{50};
            constexpr milliseconds ping_every{1000};
            const milliseconds silence_limit =
                std::max(milliseconds{3000}, config.node.command_timeout);
            std::array<const char*, detail::sentinel_channels.size() + 1> argv{"SUBSCRIBE"};
            std::array<std::size_t, detail::sentinel_channels.size() + 1> lengths{9};
            for (std::size_t i = 0; i < detail::sentinel_channels.size(); ++i) {
                argv[i + 1] = detail::sentinel_channels[i].data();
                lengths[i + 1] = detail::sentinel_channels[i].size();
            }
            if (redisAppendCommandArgv(&ctx, static_cast<int>(argv.size()), argv.data(),
                                       lengths.data()) != REDIS_OK) {
                return true;
            }
            auto last_heard = clock::now();
            auto last_ping = clock::now();
            for (int done = 0;;) {
                if (redisBufferWrite(&ctx, &done) != REDIS_OK) {
                    return true;
                }
                if (done != 0) {
                    break;
                }
            }
            bool confirmed = false;  // this link's first subscription was confirmed
            while (!stop.stop_requested()) {
                void* raw = nullptr;
                if (redisGetReplyFromReader(&ctx, &raw) != REDIS_OK) {
                    return true;
                }
                if (raw != nullptr) {
                    detail::hiredis_reply_ptr owned{raw};
                    last_heard = clock::now();
                    handle(detail::convert_reply(*static_cast<redisReply*>(raw)), w, confirmed);
                    continue;
                }
                check_fence_if_due(w);
                const auto now = clock::now();
                if (now - last_heard > silence_limit) {
                    return true;  // no pong: the sentinel hangs
                }
                if (now - last_ping >= ping_every) {
                    last_ping = now;
                    int done = 0;
                    if (redisAppendCommand(&ctx, "PING") != REDIS_OK ||
                        redisBufferWrite(&ctx, &done) != REDIS_OK) {
                        return true;
                    }
                }
                if (!detail::hiredis_tls_pending(ctx)) {
                    pollfd pfd{ctx.fd, POLLIN, 0};
                    const int ready = ::poll(&pfd, 1, static_cast<int>(slice.count()));
                    if (ready <= 0) {
                        continue;
                    }
                }
                if (redisBufferRead(&ctx) != REDIS_OK) {
                    return true;
                }
            }
            return false;
        }

        void handle(const reply& r, watcher_state& w, bool& confirmed) {
            if (!r.is_array() || r.elements().size() < 3 || !r.elements()[0].is_string()) {
                return;  // a pong, or a reply we do not act on
            }
            const std::string& kind = r.elements()[0].text();
            if (kind == "subscribe") {
                // Announcements made while this link was down may have been missed: check now.
                if (!confirmed && w.subscribed_before) {
                    check_now();
                }
                confirmed = true;
                w.subscribed_before = true;
                return;
            }
            if (kind != "message" || !r.elements()[1].is_string() || !r.elements()[2].is_string()) {
                return;
            }
            const detail::sentinel_event e =
                detail::parse_sentinel_event(r.elements()[1].text(), r.elements()[2].text());
            if (e.master_name != config.master_name) {
                return;
            }
            switch (e.what) {
                case detail::sentinel_event::kind::switched:
                    // The new master lifts the failover raised for the old one. (A sentinel
                    // announces the switch to a master before any step about that master.)
                    forget_departed(e.new_address);
                    follow_switch(e.master_address, e.new_address);
                    break;
                case detail::sentinel_event::kind::step:
                    raise_fence(e.master_address, w);
                    break;
                case detail::sentinel_event::kind::aborted:
                    // The sentinel that leads a failover ended it without a switch: the master
                    // stays. (A sentinel that was not elected to lead one says so too: that
                    // says nothing of the failover its rival leads.)
                    fence.lift(e.master_address, w.index);
                    break;
                case detail::sentinel_event::kind::other:
                    break;
            }
        }

        // Sentinel `w.index` announced a step of a failover of the master at `failing`: nothing
        // more is sent to the master until the connection follows the next one or the failover
        // ends. That holds for a master not followed yet too: a sentinel may take one just
        // promoted for down before another announced the switch to it, and a connection that
        // then followed it would send to a master whose writes the second failover loses.
        void raise_fence(const std::string& failing, watcher_state& w) {
            // Under the mutex, so that no switch away from `failing` comes between the check
            // and the raise (it would leave the raise behind).
            process_state& l = this_process();
            std::lock_guard lock{l.mutex};
            if (std::find(l.departed.begin(), l.departed.end(), failing) != l.departed.end()) {
                return;  // a master left already (a late announcement of a past failover)
            }
            // No failover lasts longer than the sentinels' failover-timeout for its promotion and
            // again for the replicas' reconfiguration: should every sentinel fall silent, calls
            // go on after that.
            const auto bound =
                2 * std::chrono::milliseconds{failover_timeout_ms.load()} + std::chrono::seconds{1};
            if (fence.raise(failing, w.index, bound)) {
                w.next_check = clock::now() + fence_check_every;
            }
        }

        static constexpr std::chrono::milliseconds fence_check_every{250};

        // While a failover is raised, the subscription thread of the sentinel that announced it
        // asks that sentinel, every fence_check_every, whether it is over, in case its
        // announcement of the end was missed: it then names the next master, which is followed
        // at once, or the same one with no failover in progress (aborted), and calls go on
        // there. Only that sentinel is asked, and only on its own thread: no other sentinel,
        // hung or slow, holds up the others' announcements.
        void check_fence_if_due(watcher_state& w) {
            if (!fence.up() || clock::now() < w.next_check) {
                return;
            }
            const auto raised = fence.raised_by(w.index);
            if (raised.empty()) {
                return;
            }
            w.next_check = clock::now() + fence_check_every;
            const auto& where = config.sentinels[w.index];
            std::optional<detail::master_view> view;
            try {
                if (!w.query) {
                    w.query = std::make_unique<hiredis_connection>(config.sentinel(where));
                }
                std::string why;
                const call_context bound{.deadline = clock::now() + config.node.command_timeout};
                view = ask(*w.query, where.host + ":" + std::to_string(where.port), why, bound);
            } catch (const error&) {
                w.query.reset();
                return;
            }
            if (!view) {
                return;
            }
            const std::string named = view->host + ":" + std::to_string(view->port);
            forget_departed(named);
            for (const auto& one : raised) {
                if (named != one.master) {
                    // Switched: followed if it is the master in use, else simply over.
                    follow_switch(one.master, named);
                } else if (view->epoch >= 0 && !view->failover_in_progress) {
                    // Aborted: the master stays. (Only SENTINEL MASTER tells the flags: a view
                    // from GET-MASTER-ADDR-BY-NAME, where ACLs allow only that, says nothing of
                    // them.)
                    fence.lift(one);
                }
            }
        }

        void check_now() {
            process_state& l = this_process();
            std::uint64_t seen = 0;
            {
                std::lock_guard lock{l.mutex};
                seen = l.generation;
            }
            re_resolve(seen);  // a failure shows in the callers' next call
        }
    };

    std::unique_ptr<state> state_;
};

static_assert(pipelining_connection<sentinel_connection>);
static_assert(contextual_connection<sentinel_connection>);
static_assert(contextual_pipelining_connection<sentinel_connection>);

}  // namespace redislock
