// The waiting policy every lock kind shares: try at once, then back off exponentially with full
// jitter, never sleeping past the holder's remaining lease, the caller's deadline, or a stop
// request.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <type_traits>

#include <redislock/detail/util/token.hpp>
#include <redislock/lock_options.hpp>

namespace redislock::detail {

using steady = std::chrono::steady_clock;

/// What one acquisition attempt saw when it failed: the holder's PTTL in ms
/// (-1: the holder set no lease, -2: the key is gone, try again at once).
using holder_ttl = std::chrono::milliseconds;

/// A holder's TTL as a server told it (`ms`), cut to the longest lease: a longer one is no
/// lock's (a key with a TTL of centuries), a waiter asks again after that much anyway, and
/// `now + ttl` then stays far from overflowing steady_clock (about 292 years of nanoseconds).
/// Below -2 (no such answer) it is unknown: -1.
inline holder_ttl saturated_ttl(std::int64_t ms) noexcept {
    if (ms < -2) {
        return holder_ttl{-1};
    }
    return holder_ttl{std::min(ms, max_lease.count())};
}

/// `t + d` for a `d` >= 0, saturating at steady::time_point::max().
inline steady::time_point later_by(steady::time_point t, steady::duration d) noexcept {
    return d > steady::time_point::max() - t ? steady::time_point::max() : t + d;
}

/// Converts a deadline on any clock to the steady clock, saturating instead of overflowing.
template <class Clock, class Duration>
steady::time_point to_steady(const std::chrono::time_point<Clock, Duration>& deadline) {
    if constexpr (std::is_same_v<Clock, steady>) {
        return std::chrono::time_point_cast<steady::duration>(deadline);
    } else {
        const auto left = deadline - Clock::now();
        const auto now = steady::now();
        using left_type = std::remove_const_t<decltype(left)>;
        if (left > std::chrono::duration_cast<left_type>(steady::time_point::max() - now)) {
            return steady::time_point::max();
        }
        return now + std::chrono::duration_cast<steady::duration>(left);
    }
}

/// A deadline `timeout` from now, saturating.
template <class Rep, class Period>
steady::time_point deadline_after(const std::chrono::duration<Rep, Period>& timeout) {
    const auto now = steady::now();
    if (timeout <= timeout.zero()) {
        return now;
    }
    if (std::chrono::duration<double>(timeout) >=
        std::chrono::duration<double>(steady::time_point::max() - now)) {
        return steady::time_point::max();
    }
    return now + std::chrono::ceil<steady::duration>(timeout);
}

/// Sleeps for `how_long`, waking early on a stop request. Returns false if stopped.
inline bool sleep_unless_stopped(steady::duration how_long, const std::stop_token& stop) {
    if (!stop.stop_possible()) {
        std::this_thread::sleep_for(how_long);
        return true;
    }
    std::mutex mutex;
    std::condition_variable_any wake;
    std::unique_lock lock{mutex};
    (void)wake.wait_for(lock, stop, how_long, [] { return false; });
    return !stop.stop_requested();
}

/// Full-jitter backoff: the n-th sleep is uniform in [0, min(max, min * 2^n, holder's PTTL)].
class backoff {
public:
    explicit backoff(const lock_options& options)
        : min_{options.backoff_min}, max_{options.backoff_max} {}

    steady::duration next(holder_ttl ttl) {
        using std::chrono::milliseconds;
        // min * 2^round, saturating at max without overflowing.
        auto ceiling = max_;
        if (round_ < 62 && min_.count() <= (max_.count() >> round_)) {
            ceiling = min_ * (std::int64_t{1} << round_);
        }
        ++round_;
        if (ttl == milliseconds{-2}) {
            ceiling = std::min(ceiling, milliseconds{1});  // already free: retry almost at once
        } else if (ttl >= milliseconds::zero() && ttl < ceiling) {
            ceiling = ttl + milliseconds{1};  // (compared first: ttl + 1 ms cannot overflow)
        }
        const auto ceiling_us = std::chrono::duration_cast<std::chrono::microseconds>(ceiling);
        if (ceiling_us.count() <= 0) {
            return steady::duration::zero();
        }
        const auto jitter =
            random_source::next() % static_cast<std::uint64_t>(ceiling_us.count() + 1);
        return std::chrono::microseconds{static_cast<std::int64_t>(jitter)};
    }

private:
    std::chrono::milliseconds min_;
    std::chrono::milliseconds max_;
    unsigned round_ = 0;
};

/// Calls `attempt` until it acquires, the deadline passes or a stop is requested.
/// `attempt()` returns std::nullopt when it acquired, else the holder's TTL. The first attempt
/// is made at once; a deadline already past still gets that one attempt.
/// Returns true when acquired.
template <class Attempt>
bool acquire_with_backoff(Attempt&& attempt, steady::time_point deadline,
                          const std::stop_token& stop, const lock_options& options) {
    backoff policy{options};
    for (;;) {
        const std::optional<holder_ttl> ttl = attempt();
        if (!ttl) {
            return true;
        }
        const auto now = steady::now();
        if (now >= deadline || stop.stop_requested()) {
            return false;
        }
        const auto pause = std::min(policy.next(*ttl), deadline - now);
        if (!sleep_unless_stopped(pause, stop)) {
            return false;
        }
    }
}

}  // namespace redislock::detail
