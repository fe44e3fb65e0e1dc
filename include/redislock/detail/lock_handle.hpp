// detail::lock_handle<Derived, State>: what every lock object is besides its kind's own
// members: a movable handle on a state shared with callbacks, which gives up what it holds when
// destroyed or assigned over, and unlock() without an error code.
//
// Derived provides `void unlock(std::error_code&) noexcept` (and brings this unlock() into
// scope with a using-declaration) and `static void release_on_destruction(const
// std::shared_ptr<State>&) noexcept`, static because it runs from this base's destructor, when
// Derived's members are already gone. A moved-from handle holds no state.
#pragma once

#include <memory>
#include <system_error>
#include <utility>

namespace redislock::detail {

template <class Derived, class State>
class lock_handle {
public:
    /// Releases the lock. Never throws; a lock found lost calls on_lost.
    void unlock() noexcept {
        std::error_code ignored;
        static_cast<Derived&>(*this).unlock(ignored);
    }

protected:
    explicit lock_handle(std::shared_ptr<State> st) noexcept : state_{std::move(st)} {}
    lock_handle(lock_handle&&) noexcept = default;
    lock_handle& operator=(lock_handle&& other) noexcept {
        if (this != &other) {
            give_up();
            state_ = std::move(other.state_);
        }
        return *this;
    }
    ~lock_handle() { give_up(); }

    std::shared_ptr<State> state_;  // null once moved from

private:
    void give_up() noexcept {
        if (state_) {
            Derived::release_on_destruction(state_);
        }
    }
};

}  // namespace redislock::detail
