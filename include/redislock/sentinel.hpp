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
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/engine/reconnect_relay.hpp>
#include <redislock/detail/topology/failover_fence.hpp>
#include <redislock/detail/topology/sentinel_follower.hpp>
#include <redislock/detail/topology/sentinel_process_state.hpp>
#include <redislock/detail/topology/sentinel_protocol.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>
#include <redislock/sentinel_endpoint.hpp>
#include <redislock/subscriber.hpp>

namespace redislock {

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

    using process_state = detail::sentinel_process_state;
    using state = detail::sentinel_follower;

    std::unique_ptr<state> state_;
};

static_assert(pipelining_connection<sentinel_connection>);
static_assert(contextual_connection<sentinel_connection>);
static_assert(contextual_pipelining_connection<sentinel_connection>);

}  // namespace redislock
