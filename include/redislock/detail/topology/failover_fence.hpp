// detail::failover_fence: what a connection knows of a failover of its master under way, so that
// nothing the old master confirms after the failover was announced is taken for granted.
//
// A failover is raised when a sentinel announces one of its steps (+elected-leader ... the
// promotion of a replica) and lifted once the connection follows the new master, or the
// failover ended without a switch (an abort). Failovers of several masters may be raised at
// once; leaving a master lifts its own. While it is raised no command is
// sent to the master; a command that was under way when it was raised, or when the master changed
// without an announcement, is a disturbed one: its reply may come from a master whose writes the
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
#include <vector>

#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>

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
    /// `announcer`. It stays raised until lifted, or `bound` from now, at the latest: a bound
    /// the sentinels' own failover timeout sets, should every sentinel fall silent. Several
    /// masters may be failing over at once (one just promoted may be taken for down by a
    /// sentinel before the first failover ended), and two sentinels may each lead one of the
    /// same master: each is raised on its own. Returns true when `announcer` had not raised a
    /// failover of `master` yet.
    bool raise(const std::string& master, std::size_t announcer, steady::duration bound) {
        slot& s = current();
        {
            std::lock_guard guard{s.mutex};
            prune_locked(s);
            for (const raised_failover& r : s.known) {
                if (r.master == master && r.announcer == announcer) {
                    return false;
                }
            }
            s.known.push_back(raised_failover{master, announcer, steady::now() + bound});
            up_.store(true, std::memory_order_release);
            disturb_locked(s);
        }
        s.lifted.notify_all();
        return true;
    }

    /// Every failover raised is over: commands may be sent again.
    void lift() {
        lift_where([](const raised_failover&) { return true; });
    }

    /// As lift(), for `which` (what raised() said) only, if still raised: a check of one that
    /// ended never lifts the next one, raised meanwhile.
    void lift(const raised_failover& which) {
        lift_where([&](const raised_failover& r) {
            return r.master == which.master && r.announcer == which.announcer &&
                   r.expires == which.expires;
        });
    }

    /// As lift(), for the failover of `master` that sentinel number `announcer` raised, if any
    /// (that sentinel says it ended without a switch).
    void lift(const std::string& master, std::size_t announcer) {
        lift_where([&](const raised_failover& r) {
            return r.master == master && r.announcer == announcer;
        });
    }

    /// Every failover raised of the master at `master` is over: the connection left it, or a
    /// switch from it was announced while the connection was elsewhere.
    void lift_master(const std::string& master) {
        lift_where([&](const raised_failover& r) { return r.master == master; });
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

    /// A failover raised (the first announced of those still raised), with the master it
    /// replaces and the sentinel that announced it; nothing when none is.
    std::optional<raised_failover> raised() const {
        return first_where([](const raised_failover&) { return true; });
    }

    /// The failovers still raised that sentinel number `announcer` announced.
    std::vector<raised_failover> raised_by(std::size_t announcer) const {
        slot& s = current();
        std::lock_guard guard{s.mutex};
        const auto now = steady::now();
        std::vector<raised_failover> out;
        for (const raised_failover& r : s.known) {
            if (now < r.expires && r.announcer == announcer) {
                out.push_back(r);
            }
        }
        return out;
    }

    /// Waits until no failover is raised, `until`, or a stop request. True when none is.
    bool wait_lifted(steady::time_point until, const std::stop_token* stop) {
        slot& s = current();
        std::unique_lock lock{s.mutex};
        for (;;) {
            const auto now = steady::now();
            std::optional<steady::time_point> next_expiry;
            for (const raised_failover& r : s.known) {
                if (now < r.expires && (!next_expiry || r.expires < *next_expiry)) {
                    next_expiry = r.expires;
                }
            }
            if (!next_expiry) {
                return true;
            }
            if (now >= until || (stop != nullptr && stop->stop_requested())) {
                return false;
            }
            const auto limit = std::min(until, *next_expiry);
            const std::size_t count = s.known.size();
            const auto changed = [&s, count] { return s.known.size() < count; };
            if (stop != nullptr && stop->stop_possible()) {
                (void)s.lifted.wait_until(lock, *stop, limit, changed);
            } else {
                (void)s.lifted.wait_until(lock, limit, changed);
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
    // The mutex, the condition variable and what they guard, one set per process.
    struct slot {
        explicit slot(std::uint64_t g) : generation{g} {}
        std::mutex mutex;
        std::condition_variable_any lifted;
        std::vector<raised_failover> known;  // in the order announced; some may have expired
        std::uint64_t generation;
    };

    // Drops the failovers past their bound.
    void prune_locked(slot& s) {
        const auto now = steady::now();
        std::erase_if(s.known, [now](const raised_failover& r) { return now >= r.expires; });
        up_.store(!s.known.empty(), std::memory_order_release);
    }

    template <class Which>
    void lift_where(Which which) {
        slot& s = current();
        {
            std::lock_guard guard{s.mutex};
            const std::size_t before = s.known.size();
            std::erase_if(s.known, which);
            prune_locked(s);
            if (s.known.size() == before) {
                return;
            }
        }
        s.lifted.notify_all();
    }

    template <class Which>
    std::optional<raised_failover> first_where(Which which) const {
        slot& s = current();
        std::lock_guard guard{s.mutex};
        const auto now = steady::now();
        for (const raised_failover& r : s.known) {
            if (now < r.expires && which(r)) {
                return r;
            }
        }
        return std::nullopt;
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
                up_.store(!fresh->known.empty(), std::memory_order_release);
                return *fresh.release();
            }
        }
        return *s;
    }

    mutable std::atomic<slot*> slot_;
    std::atomic<std::uint64_t> disturbances_{0};
    mutable std::atomic<bool> up_{false};  // whether `known` is not empty, read without the mutex
};

}  // namespace redislock::detail
