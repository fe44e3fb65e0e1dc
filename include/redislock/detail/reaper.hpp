// detail::reaper: finishes releases that could not be finished in the caller's time.
//
// An unlock() whose reply was lost, an acquisition abandoned mid-flight (deadline, stop request,
// broken connection) or one that arrived too late may have left an entry in Redis. Each of these
// is queued here as a cleanup: a function that sends one compare-and-delete and says whether it
// is done. This thread retries it with backoff until the server answers or the entry's lease has
// surely run out (then there is nothing left to clean). Cleanups are safe to repeat: each names
// the acquisition it removes, so it never touches a later one.
//
// One per process (background_reaper()), not one per client: a cleanup keeps its client's core,
// and so its connection, alive until it is done, and the last of those may then be destroyed on
// this thread, which must not own it.
// Thread safety: add() may be called from any thread. Lifetime: the thread starts with the first
// cleanup and ends with the process; cleanups still queued then are dropped (their entries
// expire with their leases). fork(): a child gets its own (detail::per_process).
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <redislock/detail/owned_thread.hpp>
#include <redislock/detail/per_process.hpp>

namespace redislock::detail {

class reaper {
public:
    using clock = std::chrono::steady_clock;
    /// Sends one cleanup attempt that ends by the given deadline; true when done (released, or
    /// found gone), false to try again later. Must not throw.
    using cleanup = std::function<bool(clock::time_point deadline)>;

    reaper() = default;
    reaper(const reaper&) = delete;
    reaper& operator=(const reaper&) = delete;
    ~reaper() {
        owned_thread thread;
        {
            std::lock_guard lock{mutex_};
            stopped_ = true;
            thread = std::move(thread_);
        }
        wake_.notify_all();
        thread.end();
    }

    /// Queues `work`, to be tried at once and then with backoff until `give_up_at`.
    void add(cleanup work, clock::time_point give_up_at) {
        std::lock_guard lock{mutex_};
        if (stopped_) {
            return;
        }
        queue_.emplace(clock::now(), job{std::move(work), give_up_at, initial_pause});
        ++pending_;
        if (!thread_.running()) {
            thread_ = owned_thread{[this] { run(); }};
        } else {
            wake_.notify_all();
        }
    }

    /// Cleanups queued or running.
    std::size_t pending() const {
        std::lock_guard lock{mutex_};
        return pending_;
    }

    /// Waits until no cleanup is pending or `timeout` passes. For tests and orderly shutdown.
    bool wait_idle(std::chrono::milliseconds timeout) {
        std::unique_lock lock{mutex_};
        return idle_.wait_for(lock, timeout, [&] { return pending_ == 0; });
    }

private:
    struct job {
        cleanup work;
        clock::time_point give_up_at;
        clock::duration pause;
    };

    static constexpr std::chrono::milliseconds initial_pause{10};
    static constexpr std::chrono::milliseconds longest_pause{1000};
    static constexpr std::chrono::milliseconds attempt_budget{1000};

    void run() {
        std::unique_lock lock{mutex_};
        while (!stopped_) {
            if (queue_.empty()) {
                wake_.wait(lock);
                continue;
            }
            const auto due = queue_.begin()->first;
            if (due > clock::now()) {
                wake_.wait_until(lock, due);
                continue;
            }
            job j = std::move(queue_.begin()->second);
            queue_.erase(queue_.begin());
            lock.unlock();
            const auto now = clock::now();
            const bool done =
                now >= j.give_up_at || j.work(std::min(j.give_up_at, now + attempt_budget));
            lock.lock();
            if (done || clock::now() >= j.give_up_at) {
                lock.unlock();
                j.work = nullptr;  // may destroy a client's core: never with the mutex held
                lock.lock();
                --pending_;
                idle_.notify_all();
                continue;
            }
            const auto pause = j.pause;
            j.pause = std::min<clock::duration>(pause * 2, longest_pause);
            queue_.emplace(clock::now() + pause, std::move(j));
        }
    }

    mutable std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable idle_;
    std::multimap<clock::time_point, job> queue_;
    std::size_t pending_ = 0;
    bool stopped_ = false;
    owned_thread thread_;
};

/// The process's reaper.
/// The process's reaper. Never destroyed: a lock or client that outlives static destruction
/// (a global, a thread still running at exit) may still hand it a cleanup.
inline reaper& background_reaper() {
    static auto* const instance =
        new per_process<reaper>{[] { return std::make_unique<reaper>(); }};
    return instance->get();
}

}  // namespace redislock::detail
