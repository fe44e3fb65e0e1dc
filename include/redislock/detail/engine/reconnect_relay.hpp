// detail::reconnect_relay: the reconnect handler of a connection made of several hiredis pools
// (a Cluster's nodes, a Sentinel's successive masters). Each pool is given forward() when it is
// made, before any other thread can reach it; the handler itself lives here, so it may be set
// before or after the pools exist, from any thread, and a pool made concurrently by another
// thread reports to whatever handler is set when its report comes.
//
// The handler is promised to run with no internal lock held, so that it may call back into the
// connection. A connection that talks to a pool while it holds a lock of its own (a Cluster's
// slot-map read, a Sentinel's resolution) opens a deferral first (defer(), before the lock):
// what this thread reports while it lasts is queued, and told when it ends, after the lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/detail/util/token.hpp>

namespace redislock::detail {

class reconnect_relay {
public:
    using handler = std::function<void(std::string_view server)>;

    /// Holds back what this thread reports to one relay until it ends; see defer().
    class deferral {
    public:
        deferral(const deferral&) = delete;
        deferral& operator=(const deferral&) = delete;

        /// Tells the handler what was held back, unless an outer deferral of the same relay is
        /// still open on this thread (it tells them when it ends).
        ~deferral() {
            innermost() = outer_;
            for (const std::string& server : held_) {
                relay_.report(server);
            }
        }

        /// Takes what was held back so far, for the caller to report later, elsewhere: a
        /// connection opened on one thread for a call made on another is reported by that call.
        std::vector<std::string> take() noexcept { return std::exchange(held_, {}); }

    private:
        friend class reconnect_relay;

        explicit deferral(const reconnect_relay& relay) : relay_{relay}, outer_{innermost()} {
            innermost() = this;
        }

        // The deferrals open on this thread form a stack through outer_.
        static deferral*& innermost() noexcept {
            thread_local deferral* top = nullptr;
            return top;
        }

        const reconnect_relay& relay_;
        deferral* outer_;
        std::vector<std::string> held_;
    };

    reconnect_relay() : slot_{new slot{current_fork_generation()}} {}
    reconnect_relay(const reconnect_relay&) = delete;
    reconnect_relay& operator=(const reconnect_relay&) = delete;
    ~reconnect_relay() {
        slot* s = slot_.load(std::memory_order_acquire);
        if (s->generation == current_fork_generation()) {
            delete s;  // a parent's slot is left alone in a child: see current()
        }
    }

    /// Replaces the handler (an empty one stops the reports). A report already under way
    /// finishes with the handler it started with, even after set() returned.
    void set(handler next) {
        std::shared_ptr<const handler> kept;
        if (next) {
            kept = std::make_shared<const handler>(std::move(next));
        }
        slot& s = current();
        {
            std::lock_guard lock{s.mutex};
            s.installed.swap(kept);
        }
        // The old handler (now in `kept`) is destroyed here, outside the mutex.
    }

    /// Tells the handler, when there is one, that a connection to `server` was opened in place
    /// of one that broke. Call it with no lock held; while this thread has a deferral open for
    /// this relay, the report waits for the outermost one to end. What the handler throws is
    /// dropped.
    void report(std::string_view server) const noexcept {
        deferral* outermost = nullptr;
        for (deferral* d = deferral::innermost(); d != nullptr; d = d->outer_) {
            if (&d->relay_ == this) {
                outermost = d;
            }
        }
        if (outermost != nullptr) {
            try {
                outermost->held_.emplace_back(server);
            } catch (...) {
                // Out of memory: the report is lost, as one the handler throws from would be.
            }
            return;
        }
        try {
            std::shared_ptr<const handler> installed;
            {
                slot& s = current();
                std::lock_guard lock{s.mutex};
                installed = s.installed;
            }
            if (installed) {
                (*installed)(server);
            }
        } catch (...) {
        }
    }

    /// Holds back this thread's reports to this relay until the returned deferral ends: open it
    /// before taking a lock under which a pool may report, so that it ends after the lock.
    [[nodiscard]] deferral defer() const { return deferral{*this}; }

    /// A handler for one pool (hiredis_connection::set_reconnect_handler) that reports here.
    /// The relay must outlive the pool.
    handler forward() const {
        return [this](std::string_view server) { report(server); };
    }

private:
    // The handler and its mutex, one per process: after fork() a parent's thread may have held
    // the parent's mutex, so a child takes its own slot at its first use.
    struct slot {
        explicit slot(std::uint64_t g) : generation{g} {}
        std::mutex mutex;
        std::shared_ptr<const handler> installed;
        std::uint64_t generation;
    };

    // This process's slot. A forked child starts with the parent's handler, copied when the
    // parent's mutex was free at the fork; when a parent's thread held it (the handler may be
    // half replaced), the child starts with none, and its reports are dropped until set() is
    // called there. The parent's slot stays allocated in the child, never used again.
    slot& current() const {
        // The parent's mutex is found locked for a moment when another thread of the child is
        // copying the handler: retry for a while before deciding a parent's thread held it.
        constexpr std::chrono::milliseconds inherit_for{10};
        const std::uint64_t generation = current_fork_generation();
        slot* s = slot_.load(std::memory_order_acquire);
        std::optional<std::chrono::steady_clock::time_point> give_up;
        while (s->generation != generation) {
            auto fresh = std::make_unique<slot>(generation);
            if (s->mutex.try_lock()) {
                fresh->installed = s->installed;
                s->mutex.unlock();
            } else {
                const auto now = std::chrono::steady_clock::now();
                if (!give_up) {
                    give_up = now + inherit_for;
                }
                if (now < *give_up) {
                    std::this_thread::yield();
                    s = slot_.load(std::memory_order_acquire);
                    continue;
                }
            }
            if (slot_.compare_exchange_strong(s, fresh.get(), std::memory_order_acq_rel)) {
                return *fresh.release();
            }
        }
        return *s;
    }

    mutable std::atomic<slot*> slot_;
};

}  // namespace redislock::detail
