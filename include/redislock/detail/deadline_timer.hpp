// detail::deadline_timer: one thread that runs callbacks at given times on the steady clock.
//
// Callbacks run on the timer's thread, one at a time, without any lock of the timer held, so
// they may schedule or cancel. A callback delays every later one while it runs: an instance
// whose deadlines must be met (the redlock client's loss timer) is given only callbacks that do
// no I/O and never block; renewals that talk to Redis run on an instance of their own.
//
// Destruction stops the thread; callbacks not yet due are dropped. The thread co-owns the
// queue, so a callback that ends up destroying its own timer (a loss handler that destroys the
// last lock of a client) is safe: the thread is detached and finishes on its own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

namespace redislock::detail {

class deadline_timer {
public:
    using clock = std::chrono::steady_clock;
    using id = std::uint64_t;

    deadline_timer() : impl_{std::make_shared<impl>()} {
        thread_ = std::thread{[shared = impl_] { shared->run(); }};
    }

    deadline_timer(const deadline_timer&) = delete;
    deadline_timer& operator=(const deadline_timer&) = delete;

    ~deadline_timer() {
        {
            std::lock_guard guard{impl_->mutex};
            impl_->stopping = true;
        }
        impl_->wake.notify_all();
        if (thread_.get_id() == std::this_thread::get_id()) {
            thread_.detach();
        } else {
            thread_.join();
        }
    }

    /// Runs `callback` at `when` (at once if it has passed). Returns an id for cancel().
    id schedule(clock::time_point when, std::function<void()> callback) {
        id assigned = 0;
        bool earliest = false;
        {
            std::lock_guard guard{impl_->mutex};
            assigned = impl_->next_id++;
            impl_->queue.emplace(std::pair{when, assigned}, std::move(callback));
            impl_->due.emplace(assigned, when);
            earliest = impl_->queue.begin()->first.second == assigned;
        }
        if (earliest) {
            impl_->wake.notify_all();
        }
        return assigned;
    }

    /// Drops a callback not yet started; does nothing for 0, a callback already run or running.
    void cancel(id which) noexcept {
        if (which == 0) {
            return;
        }
        std::function<void()> dropped;  // destroyed after the lock is released
        std::lock_guard guard{impl_->mutex};
        const auto found = impl_->due.find(which);
        if (found == impl_->due.end()) {
            return;
        }
        const auto entry = impl_->queue.find(std::pair{found->second, which});
        if (entry != impl_->queue.end()) {
            dropped = std::move(entry->second);
            impl_->queue.erase(entry);
        }
        impl_->due.erase(found);
    }

private:
    struct impl {
        std::mutex mutex;
        std::condition_variable wake;
        bool stopping = false;
        id next_id = 1;
        std::map<std::pair<clock::time_point, id>, std::function<void()>> queue;
        std::unordered_map<id, clock::time_point> due;

        void run() {
            std::unique_lock lock{mutex};
            while (!stopping) {
                if (queue.empty()) {
                    wake.wait(lock);
                    continue;
                }
                const auto first = queue.begin();
                const clock::time_point when = first->first.first;
                if (clock::now() < when) {
                    wake.wait_until(lock, when);
                    continue;
                }
                std::function<void()> callback = std::move(first->second);
                due.erase(first->first.second);
                queue.erase(first);
                lock.unlock();
                try {
                    callback();
                } catch (...) {
                    // A callback must not throw; one that does must not end the timer.
                }
                callback = nullptr;
                lock.lock();
            }
        }
    };

    std::shared_ptr<impl> impl_;
    std::thread thread_;
};

}  // namespace redislock::detail
