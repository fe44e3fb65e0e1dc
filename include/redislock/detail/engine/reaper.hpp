// detail::reaper: finishes releases that could not be finished in the caller's time.
//
// An unlock() whose reply was lost, an acquisition abandoned mid-flight (deadline, stop request,
// broken connection) or one that arrived too late may have left an entry in Redis. Each of these
// is queued here as a cleanup: a function that sends one compare-and-delete and says whether it
// is done. The reaper retries it with backoff until the server answers or the entry's lease has
// surely run out (then there is nothing left to clean). Cleanups are safe to repeat: each names
// what it removes (an acquisition, a release by its id, a given-up attempt's first entry), so it
// never touches a later one, nor removes anything twice.
//
// Cleanups go in lanes, one per server (server_lane() names it), each with its own thread: an
// attempt on a hung server blocks only the cleanups queued for that server, never another
// server's. A lane's thread starts with its first cleanup and ends once the lane has been empty
// for a while.
//
// One per process (background_reaper()), not one per client: a cleanup keeps its client's core,
// and so its connection, alive until it is done, and the last of those may then be destroyed on
// a lane's thread, which must not own it.
// Thread safety: add() may be called from any thread, a cleanup's included. Lifetime: the
// process's reaper is never destroyed; cleanups still queued at exit are dropped (their entries
// expire with their leases). A lane's thread that ends for want of work detaches itself, so
// none is left unjoined at exit. A reaper destroyed otherwise joins its lanes' running threads
// (a cleanup running then finishes its attempt first). fork(): a child gets its own
// (detail::per_process).
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/detail/engine/owned_thread.hpp>
#include <redislock/detail/engine/per_process.hpp>

namespace redislock::detail {

/// The lane of the cleanups that `conn`, the connection of the client at `client`, sends for
/// `key`: the server that serves the key when the connection can say (a cluster node, the one
/// server of a plain or Sentinel connection), else the client itself.
template <class C>
std::string server_lane(const C& conn, std::string_view key, const void* client) {
    if constexpr (requires {
                      { conn.node_for_key(key) } -> std::convertible_to<std::string>;
                  }) {
        try {
            if (std::string node = conn.node_for_key(key); !node.empty()) {
                return node;
            }
        } catch (...) {
            // No map to tell: the client's own lane.
        }
    } else if constexpr (requires {
                             { conn.config().describe() } -> std::convertible_to<std::string>;
                         }) {
        return conn.config().describe();
    }
    return "client@" + std::to_string(reinterpret_cast<std::uintptr_t>(client));
}

class reaper {
public:
    using clock = std::chrono::steady_clock;
    /// Sends one cleanup attempt that ends by the given deadline; true when done (released, or
    /// found gone), false to try again later. Must not throw.
    using cleanup = std::function<bool(clock::time_point deadline)>;

    /// The lane of cleanups that send nothing (they only let go of what they hold).
    static constexpr std::string_view no_server{};

    reaper() = default;
    reaper(const reaper&) = delete;
    reaper& operator=(const reaper&) = delete;
    ~reaper() {
        std::vector<owned_thread> threads;
        {
            std::lock_guard lock{mutex_};
            stopped_ = true;
            for (auto& [name, l] : lanes_) {
                threads.push_back(std::move(l->thread));
                l->wake.notify_all();
            }
        }
        for (owned_thread& t : threads) {
            t.end();
        }
    }

    /// Queues `work` on `lane` (see server_lane()), to be tried at once and then with backoff
    /// until `give_up_at`.
    /// @throws std::bad_alloc, std::system_error when the lane's thread cannot be started.
    void add(std::string_view lane_name, cleanup work, clock::time_point give_up_at) {
        std::lock_guard lock{mutex_};
        if (stopped_) {
            return;
        }
        forget_ended_lanes();
        auto it = lanes_.find(lane_name);
        if (it == lanes_.end()) {
            it = lanes_.emplace(std::string{lane_name}, std::make_unique<lane>()).first;
        }
        lane& l = *it->second;
        const auto queued =
            l.queue.emplace(clock::now(), job{std::move(work), give_up_at, initial_pause});
        ++pending_;
        if (!l.running) {
            try {
                l.thread = owned_thread{[this, &l] { run(l); }};  // an ended one let itself go
            } catch (...) {
                l.queue.erase(queued);
                --pending_;
                throw;
            }
            l.running = true;
        } else {
            l.wake.notify_all();
        }
    }

    /// Cleanups queued or running, in every lane.
    std::size_t pending() const {
        std::lock_guard lock{mutex_};
        return pending_;
    }

    /// Lanes whose thread runs now.
    std::size_t running_lanes() const {
        std::lock_guard lock{mutex_};
        return static_cast<std::size_t>(std::count_if(
            lanes_.begin(), lanes_.end(), [](const auto& entry) { return entry.second->running; }));
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

    struct lane {
        std::condition_variable wake;
        std::multimap<clock::time_point, job> queue;
        bool running = false;  // its thread runs its loop
        owned_thread thread;
    };

    static constexpr std::chrono::milliseconds initial_pause{10};
    static constexpr std::chrono::milliseconds longest_pause{1000};
    static constexpr std::chrono::milliseconds attempt_budget{1000};
    // How long a lane's thread waits for more work once its lane is empty before it ends.
    static constexpr std::chrono::milliseconds idle_linger{2000};

    void run(lane& l) {
        std::unique_lock lock{mutex_};
        while (!stopped_) {
            if (l.queue.empty()) {
                if (!l.wake.wait_for(lock, idle_linger,
                                     [&] { return stopped_ || !l.queue.empty(); })) {
                    break;
                }
                continue;
            }
            const auto due = l.queue.begin()->first;
            if (due > clock::now()) {
                l.wake.wait_until(lock, due);
                continue;
            }
            job j = std::move(l.queue.begin()->second);
            l.queue.erase(l.queue.begin());
            lock.unlock();
            const auto now = clock::now();
            const bool done =
                now >= j.give_up_at || j.work(std::min(j.give_up_at, now + attempt_budget));
            if (done || clock::now() >= j.give_up_at) {
                j.work = nullptr;  // may destroy a client's core: never with the mutex held
                lock.lock();
                --pending_;
                idle_.notify_all();
                continue;
            }
            lock.lock();
            const auto pause = j.pause;
            j.pause = std::min<clock::duration>(pause * 2, longest_pause);
            l.queue.emplace(clock::now() + pause, std::move(j));
        }
        // A thread that ended for want of work lets itself go: the process's reaper is never
        // destroyed, so nothing would join the last ones (a finished thread never joined is a
        // leak; ThreadSanitizer reports it at exit). One stopped by ~reaper() was moved out
        // there, to be joined. The last touch of `l` by this thread: add() may start another
        // thread for the lane, or drop it, from here on.
        l.thread.end();
        l.running = false;
    }

    // Drops the lanes whose thread ended with nothing queued (those threads let themselves go:
    // they touch nothing of the lane after saying they ended).
    void forget_ended_lanes() {
        std::erase_if(lanes_, [](const auto& entry) {
            return !entry.second->running && entry.second->queue.empty() &&
                   !entry.second->thread.is_current();
        });
    }

    mutable std::mutex mutex_;
    std::condition_variable idle_;
    std::map<std::string, std::unique_ptr<lane>, std::less<>> lanes_;
    std::size_t pending_ = 0;
    bool stopped_ = false;
};

/// The process's reaper. Never destroyed: a lock or client that outlives static destruction
/// (a global, a thread still running at exit) may still hand it a cleanup.
inline reaper& background_reaper() {
    static auto* const instance =
        new per_process<reaper>{[] { return std::make_unique<reaper>(); }};
    return instance->get();
}

}  // namespace redislock::detail
