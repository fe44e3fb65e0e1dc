// detail::failover_fence: what a connection knows of a failover of its master under way, so that
// nothing the old master confirms after the failover was announced is taken for granted.
//
// A failover is raised when a sentinel announces one of its steps (+elected-leader ... the
// promotion of a replica) and lifted once the connection follows the new master, or the
// failover ended without a switch (an abort). While it is raised no command is sent to the
// master; a command that was under way when it was raised, or when the master changed without
// an announcement, is a disturbed one: its reply may come from a master whose writes the
// failover loses (a replica that was not promoted may even have acknowledged them).
//
// settled_since(conn, since) asks any connection whether its master was disturbed since a
// moment: a connection that knows nothing of failovers is always settled.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>

#include <redislock/detail/wait.hpp>

namespace redislock::detail {

class failover_fence {
public:
    /// A failover of the master at `master` ("host:port") was announced by sentinel number
    /// `announcer`. It stays raised until lift(), or `bound` from now, at the latest: a bound
    /// the sentinels' own failover timeout sets, should every sentinel fall silent. Returns true
    /// when it was not raised yet.
    bool raise(const std::string& master, std::size_t announcer, steady::duration bound) {
        {
            std::lock_guard guard{mutex_};
            if (raised_locked()) {
                return false;
            }
            master_ = master;
            announcer_ = announcer;
            expires_ = steady::now() + bound;
            raised_ = true;
            up_.store(true, std::memory_order_release);
            disturb_locked();
        }
        lifted_.notify_all();
        return true;
    }

    /// The failover is over (the connection follows the new master, or it was aborted):
    /// commands may be sent again.
    void lift() {
        {
            std::lock_guard guard{mutex_};
            if (!raised_) {
                return;
            }
            raised_ = false;
            up_.store(false, std::memory_order_release);
        }
        lifted_.notify_all();
    }

    /// The connection moved to another master, announced or not: a command under way on the
    /// old one is disturbed.
    void note_switch() {
        std::lock_guard guard{mutex_};
        disturb_locked();
    }

    /// True while a failover is raised (a cheap first look: raised() and wait_lifted() say it
    /// with its expiry checked).
    bool up() const noexcept { return up_.load(std::memory_order_acquire); }

    /// The master whose failover is raised, and the sentinel that announced it; nothing when
    /// none is.
    struct raised_failover {
        std::string master;
        std::size_t announcer = 0;
        steady::time_point expires{};
    };
    std::optional<raised_failover> raised() const {
        std::lock_guard guard{mutex_};
        if (!raised_locked()) {
            return std::nullopt;
        }
        return raised_failover{master_, announcer_, expires_};
    }

    /// Waits until no failover is raised, `until`, or a stop request. True when none is.
    bool wait_lifted(steady::time_point until, const std::stop_token* stop) {
        std::unique_lock lock{mutex_};
        for (;;) {
            if (!raised_locked()) {
                return true;
            }
            const auto now = steady::now();
            if (now >= until || (stop != nullptr && stop->stop_requested())) {
                return false;
            }
            const auto limit = std::min(until, expires_);
            if (stop != nullptr && stop->stop_possible()) {
                (void)lifted_.wait_until(lock, *stop, limit, [this] { return !raised_; });
            } else {
                (void)lifted_.wait_until(lock, limit, [this] { return !raised_; });
            }
        }
    }

    /// Bumped whenever a failover is raised or the master changes: a command that read one
    /// value before it was sent and finds another once answered was disturbed.
    std::uint64_t disturbances() const noexcept {
        return disturbances_.load(std::memory_order_acquire);
    }

    /// False when a failover is raised now, or one was raised or the master changed at or after
    /// `since`.
    bool settled_since(steady::time_point since) const {
        std::lock_guard guard{mutex_};
        return !raised_locked() && last_disturbed_ < since;
    }

private:
    bool raised_locked() const { return raised_ && steady::now() < expires_; }

    void disturb_locked() {
        last_disturbed_ = steady::now();
        disturbances_.fetch_add(1, std::memory_order_acq_rel);
    }

    mutable std::mutex mutex_;
    std::condition_variable_any lifted_;
    bool raised_ = false;
    std::string master_;
    std::size_t announcer_ = 0;
    steady::time_point expires_{};
    steady::time_point last_disturbed_{};
    std::atomic<std::uint64_t> disturbances_{0};
    std::atomic<bool> up_{false};  // raised_, read without the mutex
};

/// False when `conn` says its master was disturbed (a failover announced, or the master
/// changed) at or after `since`, or a failover is under way: what the master confirmed since
/// may be lost. True for a connection that knows nothing of failovers.
template <class C>
bool settled_since(const C& conn, steady::time_point since) {
    if constexpr (requires {
                      { conn.settled_since(since) } -> std::convertible_to<bool>;
                  }) {
        return conn.settled_since(since);
    } else {
        return true;
    }
}

}  // namespace redislock::detail
