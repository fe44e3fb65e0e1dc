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
// Thread safety: every member may be called from any thread.
// fork(): a child never touches its parent's mutex or condition variable (a parent's thread
// waiting for a lift would be named there as a waiter, and a notify in the child could then block
// forever): its first use takes its own, with a copy of what the parent knew of a failover when
// the parent's mutex was free at the fork. Should a parent's thread have held it, the child
// starts with no failover raised.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>

#include <redislock/detail/token.hpp>
#include <redislock/detail/wait.hpp>

namespace redislock::detail {

class failover_fence {
public:
    /// A failover raised: the master it replaces, the sentinel that announced it, and when it
    /// stops holding calls back if nobody lifts it.
    struct raised_failover {
        std::string master;
        std::size_t announcer = 0;
        steady::time_point expires{};
    };

    failover_fence() : slot_{new slot{current_fork_generation()}} {}
    failover_fence(const failover_fence&) = delete;
    failover_fence& operator=(const failover_fence&) = delete;
    ~failover_fence() {
        slot* s = slot_.load(std::memory_order_acquire);
        if (s->generation == current_fork_generation()) {
            delete s;  // a parent's slot is left alone in a child: see current()
        }
    }

    /// A failover of the master at `master` ("host:port") was announced by sentinel number
    /// `announcer`. It stays raised until lift(), or `bound` from now, at the latest: a bound
    /// the sentinels' own failover timeout sets, should every sentinel fall silent. Returns true
    /// when it was not raised yet.
    bool raise(const std::string& master, std::size_t announcer, steady::duration bound) {
        slot& s = current();
        {
            std::lock_guard guard{s.mutex};
            if (raised_locked(s)) {
                return false;
            }
            s.known.master = master;
            s.known.announcer = announcer;
            s.known.expires = steady::now() + bound;
            s.known.raised = true;
            up_.store(true, std::memory_order_release);
            disturb_locked(s);
        }
        s.lifted.notify_all();
        return true;
    }

    /// The failover is over (the connection follows the new master, or it was aborted):
    /// commands may be sent again.
    void lift() {
        slot& s = current();
        {
            std::lock_guard guard{s.mutex};
            if (!s.known.raised) {
                return;
            }
            s.known.raised = false;
            up_.store(false, std::memory_order_release);
        }
        s.lifted.notify_all();
    }

    /// As lift(), only when `which` (what raised() said) is still the failover raised: a check
    /// of one that ended never lifts the next one, raised meanwhile.
    void lift(const raised_failover& which) {
        slot& s = current();
        {
            std::lock_guard guard{s.mutex};
            if (!s.known.raised || s.known.master != which.master ||
                s.known.announcer != which.announcer || s.known.expires != which.expires) {
                return;
            }
            s.known.raised = false;
            up_.store(false, std::memory_order_release);
        }
        s.lifted.notify_all();
    }

    /// The connection moved to another master, announced or not: a command under way on the
    /// old one is disturbed.
    void note_switch() {
        slot& s = current();
        std::lock_guard guard{s.mutex};
        disturb_locked(s);
    }

    /// True while a failover is raised (a cheap first look: raised() and wait_lifted() say it
    /// with its expiry checked).
    bool up() const noexcept { return up_.load(std::memory_order_acquire); }

    /// The master whose failover is raised, and the sentinel that announced it; nothing when
    /// none is.
    std::optional<raised_failover> raised() const {
        slot& s = current();
        std::lock_guard guard{s.mutex};
        if (!raised_locked(s)) {
            return std::nullopt;
        }
        return raised_failover{s.known.master, s.known.announcer, s.known.expires};
    }

    /// Waits until no failover is raised, `until`, or a stop request. True when none is.
    bool wait_lifted(steady::time_point until, const std::stop_token* stop) {
        slot& s = current();
        std::unique_lock lock{s.mutex};
        for (;;) {
            if (!raised_locked(s)) {
                return true;
            }
            const auto now = steady::now();
            if (now >= until || (stop != nullptr && stop->stop_requested())) {
                return false;
            }
            const auto limit = std::min(until, s.known.expires);
            if (stop != nullptr && stop->stop_possible()) {
                (void)s.lifted.wait_until(lock, *stop, limit, [&s] { return !s.known.raised; });
            } else {
                (void)s.lifted.wait_until(lock, limit, [&s] { return !s.known.raised; });
            }
        }
    }

    /// Bumped whenever a failover is raised or the master changes: a command that read one
    /// value before it was sent and finds another once answered was disturbed. Read it before
    /// up(): raise() marks a failover up before it counts it.
    std::uint64_t disturbances() const noexcept {
        return disturbances_.load(std::memory_order_acquire);
    }

private:
    // What is known of a failover.
    struct record {
        bool raised = false;
        std::string master;
        std::size_t announcer = 0;
        steady::time_point expires{};
    };

    // The mutex, the condition variable and what they guard, one set per process.
    struct slot {
        explicit slot(std::uint64_t g) : generation{g} {}
        std::mutex mutex;
        std::condition_variable_any lifted;
        record known;
        std::uint64_t generation;
    };

    static bool raised_locked(const slot& s) {
        return s.known.raised && steady::now() < s.known.expires;
    }

    void disturb_locked(slot&) { disturbances_.fetch_add(1, std::memory_order_acq_rel); }

    // This process's slot. A forked child copies its parent's record when the parent's mutex
    // was free at the fork; the parent's slot stays allocated in the child, never used again.
    slot& current() const {
        // The parent's mutex is found locked for a moment when another thread of the child is
        // copying the record: retry for a while before deciding a parent's thread held it.
        constexpr std::chrono::milliseconds inherit_for{10};
        const std::uint64_t generation = current_fork_generation();
        slot* s = slot_.load(std::memory_order_acquire);
        std::optional<steady::time_point> give_up;
        while (s->generation != generation) {
            auto fresh = std::make_unique<slot>(generation);
            if (s->mutex.try_lock()) {
                fresh->known = s->known;
                s->mutex.unlock();
            } else {
                const auto now = steady::now();
                if (!give_up) {
                    give_up = now + inherit_for;
                }
                if (now < *give_up) {
                    std::this_thread::yield();
                    s = slot_.load(std::memory_order_acquire);
                    continue;
                }
            }
            // Held while published, so that no raise() or lift() on it comes before up_ is set.
            std::lock_guard publishing{fresh->mutex};
            if (slot_.compare_exchange_strong(s, fresh.get(), std::memory_order_acq_rel)) {
                up_.store(fresh->known.raised, std::memory_order_release);
                return *fresh.release();
            }
        }
        return *s;
    }

    mutable std::atomic<slot*> slot_;
    std::atomic<std::uint64_t> disturbances_{0};
    mutable std::atomic<bool> up_{false};  // the record's `raised`, read without the mutex
};

}  // namespace redislock::detail
