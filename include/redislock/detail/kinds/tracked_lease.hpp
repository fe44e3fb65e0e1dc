// tracked_lease: what a held acquisition keeps besides its kind's own fields: its local
// deadline, registered with the client's loss timer so the loss is told at that moment whatever
// a blocked round trip is doing; its watchdog renewal; the stop source of lost_token(); whether
// its loss was already told. And how a lock's acquisition, loss, release and refused unlock are
// told to its events and handlers.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/detail/engine/loss_timer.hpp>
#include <redislock/detail/kinds/lease_time.hpp>
#include <redislock/detail/kinds/loss_handlers.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/events.hpp>
#include <redislock/script.hpp>
#include <redislock/watchdog.hpp>

namespace redislock::detail {

/// A stop token that is already stopped: what lost_token() gives for a lock that is not held.
inline std::stop_token stopped_token() {
    std::stop_source source;
    source.request_stop();
    return source.get_token();
}

/// What a held acquisition keeps besides its kind's own fields. Guarded by its lock's mutex.
template <connection C>
struct tracked_lease {
    steady::time_point valid_until{};
    steady::time_point acquired_at{};  // held since then: hold times count from it
    // When the last extend() to a shorter lease returned (while in flight: when it was sent): a
    // renewal sent before that may have run before it on the server, so its reply no longer
    // moves the deadline.
    steady::time_point shortened_at{};
    lock_kind kind = lock_kind::none;  // what its events say it is
    bool lost = false;                 // told through on_lost and the stop source
    bool renewal_stopped = false;      // the watchdog stopped while it was renewed
    bool renewal_capped = false;       // the watchdog stopped renewing it at max_hold
    typename basic_watchdog<C>::lease_id renewal = 0;
    loss_timer::entry_id timer = 0;
    // Made by the first lost_token() (a stop state is an allocation most acquisitions never
    // need); stopped when the loss is told.
    mutable std::stop_source lost_source{std::nostopstate};
    std::uint64_t generation = current_fork_generation();  // whose engines the ids above name

    /// Local, conservative time left; zero once lost.
    std::chrono::milliseconds remaining() const {
        return lost ? std::chrono::milliseconds::zero() : time_left(valid_until);
    }

    /// The token whose stop is requested when this acquisition is told lost; already stopped
    /// once it is marked lost. Needs the lock's mutex, like every member.
    std::stop_token lost_token() const {
        if (lost) {
            return stopped_token();
        }
        if (!lost_source.stop_possible()) {
            lost_source = std::stop_source{};
        }
        return lost_source.get_token();
    }
};

/// Tells a loss on the calling thread: the lost event, then on_lost and on_lost_reason. The
/// handlers may destroy the lock: nothing of `lk` is read once they run.
template <class State>
void report_loss(const State& lk, lock_kind kind, loss_reason reason,
                 steady::time_point acquired_at) noexcept {
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::lost;
        e.kind = kind;
        e.name = lk.name;
        e.reason = reason;
        e.held = micros_since(acquired_at);
        return e;
    });
    call_on_lost(lk.lost_handlers, reason);
}

/// Tells that an acquisition of `lk` whose lease `t` was given back ended well.
template <class State, class Lease>
void report_release(const State& lk, const Lease& t, std::string_view detail = {}) noexcept {
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::released;
        e.kind = t.kind;
        e.name = lk.name;
        e.held = micros_since(t.acquired_at);
        e.detail = detail;
        return e;
    });
}

/// Tells that a lock call of `lk` acquired after the wait `tally` counted.
template <class State>
void report_acquired(const State& lk, lock_kind kind, const wait_tally& tally) noexcept {
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::acquired;
        e.kind = kind;
        e.name = lk.name;
        e.wait = micros_since(tally.started);
        e.attempts = tally.attempts;
        return e;
    });
}

/// Tells that an unlock() of `lk`, held as `kind` by `holder`, was refused to the calling thread
/// (errc::not_holder): nothing was sent and the holder keeps the lock, so a guard released on
/// the wrong thread is not silent.
template <class State>
void report_unlock_refused(const State& lk, lock_kind kind, std::thread::id holder) noexcept {
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::unlock_refused;
        e.kind = kind;
        e.name = lk.name;
        e.holder_thread = holder;
        e.caller_thread = std::this_thread::get_id();
        e.detail =
            "unlock() from a thread that does not hold the lock: nothing was sent, and the "
            "holder keeps the lock (and its renewals) until it unlocks on its own thread";
        return e;
    });
}

/// A watchdog lease should be at least this many command timeouts (docs/configuration.md, "Rules
/// of thumb"): a renewal is first sent at a third of the lease, and one that stalls for a whole
/// command timeout must leave room for two more before the local deadline.
inline constexpr int watchdog_lease_timeouts = 6;

/// The command timeout `conn` is configured with (a Sentinel connection's: its data nodes');
/// nothing for a connection that does not say.
template <class C>
std::optional<std::chrono::milliseconds> configured_command_timeout(const C& conn) {
    using std::chrono::milliseconds;
    if constexpr (requires { conn.config().command_timeout; }) {
        return std::chrono::duration_cast<milliseconds>(conn.config().command_timeout);
    } else if constexpr (requires { conn.config().node.command_timeout; }) {
        return std::chrono::duration_cast<milliseconds>(conn.config().node.command_timeout);
    } else {
        return std::nullopt;
    }
}

/// Tells lease_too_short for a lock `lk` of `kind` just made with the watchdog and a lease below
/// watchdog_lease_timeouts x the command timeout of its client's connection.
template <class State>
void report_short_watchdog_lease(const State& lk, lock_kind kind) noexcept {
    if (!lk.options.watchdog || !lk.core->events.observed()) {
        return;
    }
    std::optional<std::chrono::milliseconds> timeout;
    try {
        timeout = configured_command_timeout(lk.core->connection);
    } catch (...) {
        return;  // the connection's settings cannot be read here (out of memory after a fork)
    }
    if (!timeout || lk.options.lease >= watchdog_lease_timeouts * *timeout) {
        return;
    }
    const std::chrono::milliseconds command_timeout = *timeout;
    std::string detail;
    try {
        detail = "lease " + std::to_string(lk.options.lease.count()) + " ms is below " +
                 std::to_string(watchdog_lease_timeouts) + " x command_timeout (" +
                 std::to_string(command_timeout.count()) +
                 " ms): a renewal stalled for a whole command timeout cannot be retried twice "
                 "before the local deadline";
    } catch (...) {
        // Out of memory: the event goes without its text.
    }
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::lease_too_short;
        e.kind = kind;
        e.name = lk.name;
        e.detail = detail;
        return e;
    });
}

/// How the watchdog renews one acquisition: its kind's compare-and-PEXPIRE script, run over
/// `keys` and `args`.
struct renewal_spec {
    const script* renew_script = nullptr;
    std::vector<std::string> keys;
    std::vector<std::string> args;
};

/// True for a State whose scripts never shorten the server's expiry (`static constexpr bool
/// expiry_never_shortened = true`): the kinds whose entries several objects of one owner share.
/// A renewal or re-entry then never moves a local deadline earlier, since the one held stays
/// below the server's expiry; a shorter one would be told lost while still held.
template <class State>
inline constexpr bool deadline_never_earlier = requires {
    requires State::expiry_never_shortened;
};

}  // namespace redislock::detail
