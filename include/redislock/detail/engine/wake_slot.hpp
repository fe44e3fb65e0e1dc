// detail::wake_slot: what one waiting lock() call sleeps on, and what wakes it: a release that
// names it, a closer check asked for, its link's loss, or a stop request.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>

#include <redislock/detail/waiting/backoff.hpp>

namespace redislock::detail {

/// What one waiting lock() call sleeps on. Thread safety: all members may be called from any
/// thread.
class wake_slot {
public:
    explicit wake_slot(steady::duration grace) : grace_{grace} {}

    /// Forgets past wake-ups: called before each attempt, so one that comes during the attempt
    /// is not lost.
    void reset() {
        std::lock_guard guard{mutex_};
        woken_ = false;
        changed_ = false;
        signalled_.store(false, std::memory_order_relaxed);
        check_at_ = steady::time_point::max();
    }

    /// True when woken or named standby since the last reset(): sleep_until() would return at
    /// once or compute a new limit. Read without the mutex, for a waiter that spins.
    bool signalled() const noexcept { return signalled_.load(std::memory_order_acquire); }

    /// Sleeps until woken, named standby and its grace is over, `until`, or a stop request.
    /// True when woken or the standby time came.
    bool sleep_until(steady::time_point until, const std::stop_token& stop) {
        std::unique_lock lock{mutex_};
        // The limit is computed again after every wake-up: standby() may bring it closer.
        for (;;) {
            if (woken_ || steady::now() >= check_at_) {
                return true;
            }
            if (stop.stop_requested() || steady::now() >= until) {
                return false;
            }
            const auto limit = std::min(until, check_at_);
            const auto changed = [this] { return changed_; };
            if (stop.stop_possible()) {
                (void)wake_.wait_until(lock, stop, limit, changed);
            } else {
                (void)wake_.wait_until(lock, limit, changed);
            }
            changed_ = false;
        }
    }

    /// True while the channel is subscribed on a live link: a release will reach this waiter.
    bool subscribed() const noexcept { return subscribed_.load(std::memory_order_acquire); }

    /// Wakes the waiter to try again: a release named it, or its link was lost (a message may
    /// be missing).
    void wake() noexcept {
        {
            std::lock_guard guard{mutex_};
            woken_ = true;
            changed_ = true;
            signalled_.store(true, std::memory_order_release);
        }
        wake_.notify_all();
    }

    void standby() {
        {
            std::lock_guard guard{mutex_};
            check_at_ = std::min(check_at_, steady::now() + grace_);
            changed_ = true;
            signalled_.store(true, std::memory_order_release);
        }
        wake_.notify_all();
    }

    void set_subscribed(bool on) noexcept { subscribed_.store(on, std::memory_order_release); }

private:
    std::mutex mutex_;
    std::condition_variable_any wake_;
    bool woken_ = false;
    bool changed_ = false;  // woken or given a closer check since the sleeper last looked
    steady::time_point check_at_ = steady::time_point::max();
    steady::duration grace_;
    std::atomic<bool> subscribed_{false};
    std::atomic<bool> signalled_{false};  // changed_ since the last reset(), read without the mutex
};

}  // namespace redislock::detail
