// redislock::lease_renewal: what the watchdog needs to keep one lease alive, and
// redislock::watchdog_stats, its counters. Plain aggregates: thread safety and lifetimes are the
// caller's. See watchdog.hpp for the watchdog that uses them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/events.hpp>
#include <redislock/script.hpp>

namespace redislock {

/// What the watchdog needs to keep one lease alive.
struct lease_renewal {
    const script* renew_script = nullptr;  ///< compare-and-PEXPIRE: returns 1 renewed, 0 lost
    /// The keys the renewal script is run with.
    std::vector<std::string> keys;
    /// Its arguments.
    std::vector<std::string> args;
    /// The lease each renewal grants; renewals are sent every third of it.
    std::chrono::milliseconds lease{};
    std::chrono::milliseconds max_hold{};  ///< 0: renew until removed
    /// Called after each successful renewal with the time it was sent.
    std::function<void(detail::steady::time_point sent)> renewed{};
    /// Called once when the lease is found lost or has run out (max_hold, failures).
    std::function<void()> lost{};
    /// Replicas that must acknowledge each renewal (WAIT after it); 0: none.
    int min_replicas = 0;
    /// How long each WAIT for replicas may take.
    std::chrono::milliseconds replica_timeout{};
    /// As `lost`, told why: the reason, and what the renewal got (an error reply, "max_hold
    /// reached"...), valid during the call. Called instead of `lost` when set.
    std::function<void(loss_reason reason, std::string_view why)> lost_because{};
    /// Called when a renewal got no answer or an error reply and will be sent again while the
    /// lease lasts, with what it got.
    std::function<void(std::string_view why)> retried{};
    /// Called when stop() drops the lease while it is still registered: it is renewed no more.
    std::function<void()> dropped{};
    /// Called once when max_hold stops the renewals: the lease now runs out with the grant just
    /// confirmed (told right after that grant's `renewed`), and its loss follows as `lost_because`.
    std::function<void()> capped{};
};

/// Counters for tests and benchmarks.
struct watchdog_stats {
    std::uint64_t renewals = 0;           ///< renewal commands sent
    std::uint64_t round_trips = 0;        ///< batches (pipelined) or single commands sent
    std::uint64_t losses = 0;             ///< leases reported lost
    std::chrono::nanoseconds cpu_time{};  ///< CPU time used by the watchdog thread
};

}  // namespace redislock
