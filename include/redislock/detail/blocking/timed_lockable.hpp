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

/// A lock's on_lost and on_lost_reason, made once with the lock and shared: a loss told on a
/// path that must not throw (unlock(), the loss timer) copies a pointer, never a handler, whose
/// copy could fail to allocate.
struct loss_handlers {
    std::function<void()> on_lost;
    std::function<void(loss_reason)> on_lost_reason;
};

/// The handlers of `options`; null when it has none.
inline std::shared_ptr<const loss_handlers> share_loss_handlers(const lock_options& options) {
    if (!options.on_lost && !options.on_lost_reason) {
        return nullptr;
    }
    return std::make_shared<const loss_handlers>(
        loss_handlers{options.on_lost, options.on_lost_reason});
}

/// Calls on_lost, then on_lost_reason with `reason`, through a reference taken before either
/// runs: a handler that destroys the lock, and with it its handlers, still runs to its end.
inline void call_on_lost(const std::shared_ptr<const loss_handlers>& handlers,
                         loss_reason reason) noexcept {
    if (!handlers) {
        return;
    }
    const std::shared_ptr<const loss_handlers> kept = handlers;
    if (kept->on_lost) {
        kept->on_lost();
    }
    if (kept->on_lost_reason) {
        kept->on_lost_reason(reason);
    }
}

/// When a lease granted to an attempt sent at `sent` surely still holds: the lease counted from
/// the send, minus a drift allowance of 1% of the lease + 2 ms for clock rate differences.
inline steady::time_point valid_until(steady::time_point sent, std::chrono::milliseconds lease) {
    return sent + lease -
           std::chrono::duration_cast<steady::duration>(lease / 100 + std::chrono::milliseconds{2});
}

/// Time left until `until`, in whole ms, never negative.
inline std::chrono::milliseconds time_left(steady::time_point until) {
    const auto left = until - steady::now();
    return left > steady::duration::zero()
               ? std::chrono::duration_cast<std::chrono::milliseconds>(left)
               : std::chrono::milliseconds::zero();
}

}  // namespace redislock::detail
