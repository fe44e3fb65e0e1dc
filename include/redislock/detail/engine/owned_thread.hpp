// detail::owned_thread: the one thread a background engine (the loss timer, the reaper, the
// watchdog) runs its loop on.
//
// The owner starts it on first use and ends it in its stop(): it sets its own stop flag under
// its own mutex, moves the thread out there, wakes the loop, and only then calls end() (or lets
// the moved-out thread go out of scope), so no lock is held while the loop finishes. end() joins
// the thread, or, called from that thread itself (a callback that destroys or stops its
// engine), detaches it: the loop then ends when the callback returns, and must not touch the
// engine after that.
// fork(): a child has none of its parent's threads; engines live in a detail::per_process, so a
// child builds its own and never ends (or joins) the parent's.
#pragma once

#include <thread>
#include <utility>

namespace redislock::detail {

class owned_thread {
public:
    owned_thread() noexcept = default;

    /// Starts `loop` on a new thread.
    /// @throws std::system_error when no thread can be started.
    template <class Loop>
    explicit owned_thread(Loop&& loop) : thread_{std::forward<Loop>(loop)} {}

    owned_thread(owned_thread&&) noexcept = default;
    owned_thread& operator=(owned_thread&& other) noexcept {
        if (this != &other) {
            end();
            thread_ = std::move(other.thread_);
        }
        return *this;
    }
    owned_thread(const owned_thread&) = delete;
    owned_thread& operator=(const owned_thread&) = delete;
    ~owned_thread() { end(); }

    /// True from start until end() (or a move out).
    bool running() const noexcept { return thread_.joinable(); }

    /// True on the thread itself.
    bool is_current() const noexcept { return thread_.get_id() == std::this_thread::get_id(); }

    /// Waits for the loop to return, or from the thread itself leaves it to end on its own. The
    /// owner must have told the loop to stop first. Idempotent.
    void end() noexcept {
        if (!thread_.joinable()) {
            return;
        }
        if (is_current()) {
            thread_.detach();
        } else {
            thread_.join();
        }
    }

private:
    std::thread thread_;
};

}  // namespace redislock::detail
