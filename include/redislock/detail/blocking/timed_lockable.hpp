// The standard lock members (TimedLockable, SharedTimedLockable) written once for every kind.
// A lock kind derives from these and provides
//   bool acquire_until(steady::time_point deadline, const std::stop_token&)         (exclusive)
//   bool acquire_shared_until(steady::time_point deadline, const std::stop_token&)  (shared)
// which try at once and then wait (detail/waiting/backoff.hpp) until the deadline or a stop
// request.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <stop_token>

#include <redislock/detail/kinds/lease_time.hpp>
#include <redislock/detail/kinds/loss_handlers.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/events.hpp>
#include <redislock/lock_options.hpp>

namespace redislock::detail {

template <class Derived>
class timed_lockable {
public:
    /// Blocks until the lock is acquired: tries at once, then backs off with jitter.
    void lock() { (void)self().acquire_until(steady::time_point::max(), {}); }

    /// Blocks until acquired or `stop` is requested. Returns false when stopped first.
    [[nodiscard]] bool lock(std::stop_token stop) {
        return self().acquire_until(steady::time_point::max(), stop);
    }

    /// Tries once. Returns false if someone else holds the lock.
    [[nodiscard]] bool try_lock() { return self().acquire_until(steady::now(), {}); }

    /// Tries until `timeout` has passed (at least once) or `stop` is requested.
    template <class Rep, class Period>
    [[nodiscard]] bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout,
                                    std::stop_token stop = {}) {
        return self().acquire_until(deadline_after(timeout), stop);
    }

    /// Tries until `deadline` (at least once) or until `stop` is requested.
    template <class Clock, class Duration>
    [[nodiscard]] bool try_lock_until(const std::chrono::time_point<Clock, Duration>& deadline,
                                      std::stop_token stop = {}) {
        return self().acquire_until(to_steady(deadline), stop);
    }

private:
    Derived& self() { return static_cast<Derived&>(*this); }
};

template <class Derived>
class shared_timed_lockable {
public:
    /// Blocks until the shared lock is acquired.
    void lock_shared() { (void)self().acquire_shared_until(steady::time_point::max(), {}); }

    /// Blocks until acquired or `stop` is requested. Returns false when stopped first.
    [[nodiscard]] bool lock_shared(std::stop_token stop) {
        return self().acquire_shared_until(steady::time_point::max(), stop);
    }

    /// Tries once.
    [[nodiscard]] bool try_lock_shared() { return self().acquire_shared_until(steady::now(), {}); }

    template <class Rep, class Period>
    [[nodiscard]] bool try_lock_shared_for(const std::chrono::duration<Rep, Period>& timeout,
                                           std::stop_token stop = {}) {
        return self().acquire_shared_until(deadline_after(timeout), stop);
    }

    template <class Clock, class Duration>
    [[nodiscard]] bool try_lock_shared_until(
        const std::chrono::time_point<Clock, Duration>& deadline, std::stop_token stop = {}) {
        return self().acquire_shared_until(to_steady(deadline), stop);
    }

private:
    Derived& self() { return static_cast<Derived&>(*this); }
};

}  // namespace redislock::detail
