// detail::lock_handle<Derived, State>: what every lock object is besides its kind's own
// members: a movable handle on a state shared with callbacks, which gives up what it holds when
// destroyed or assigned over, unlock() without an error code, the tracker of its leases, and the
// queries every kind answers alike about the acquisition it holds.
//
// Derived provides `void unlock(std::error_code&) noexcept` (and brings this unlock() into
// scope with a using-declaration) and `static void release_on_destruction(const
// std::shared_ptr<State>&) noexcept`, static because it runs from this base's destructor, when
// Derived's members are already gone. A moved-from handle holds no state.
//
// The queries (held_remaining(), held_lost_token(), held_fence()) need State to have
// `const tracked_lease<C>* held_lease() const`, the lease of the acquisition held now or
// nullptr, called with its mutex held; tracker() needs what lease_tracker needs of State. A kind
// whose holds depend on the caller (the read-write lock) answers its queries itself, through
// of_caller().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>

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

    /// The state, for calls that a moved-from object refuses.
    /// @throws redislock::invalid_argument on a moved-from object.
    const State& checked() const {
        if (!state_) {
            throw invalid_argument{"redislock: use of a moved-from lock"};
        }
        return *state_;
    }

    /// The tracker of `st`'s leases (static: for release paths that run without the object).
    static lease_tracker<State> tracker_of(const std::shared_ptr<State>& st) {
        return lease_tracker<State>{st};
    }
    lease_tracker<State> tracker() const { return tracker_of(state_); }

    /// errc::not_held or errc::not_holder when the caller cannot release through this object
    /// (nothing is sent then; a thread other than the holder's is told as unlock_refused);
    /// else gives the acquisition up with `take(state&)`, which must not throw, called with the
    /// mutex held (State::caller_is_holder(), inherited_by_fork(), holder_thread), and returns no
    /// error.
    template <class Take>
    std::error_code claim(Take take) noexcept {
        if (!state_) {
            return errc::not_held;
        }
        lock_kind kind = lock_kind::none;
        std::thread::id holder;
        {
            std::lock_guard guard{state_->mutex};
            const auto* lease = state_->held_lease();
            if (lease == nullptr) {
                return errc::not_held;
            }
            if (state_->inherited_by_fork()) {
                return errc::not_holder;  // the parent's, as documented for fork(): not told
            }
            if (state_->caller_is_holder()) {
                take(*state_);
                return {};
            }
            kind = lease->kind;
            holder = state_->holder_thread;
        }
        report_unlock_refused(*state_, kind, holder);
        return errc::not_holder;
    }

    /// For release_on_destruction(): gives up the acquisition `st` holds with `take(state&)`,
    /// called with the mutex held, then releases it with `release(st, taken)`; nothing when
    /// none is held or it is the parent's this process was forked from (never released from a
    /// child).
    template <class Take, class Release>
    static void release_held(const std::shared_ptr<State>& st, Take take,
                             Release release) noexcept {
        std::unique_lock guard{st->mutex};
        if (st->held_lease() == nullptr || st->inherited_by_fork()) {
            return;
        }
        auto taken = take(*st);
        guard.unlock();
        (void)release(st, std::move(taken));
    }

    /// remaining() of the acquisition held now; zero when none is (or moved from).
    std::chrono::milliseconds held_remaining() const {
        if (!state_) {
            return std::chrono::milliseconds::zero();
        }
        std::lock_guard guard{state_->mutex};
        const auto* lease = state_->held_lease();
        return lease != nullptr ? lease->remaining() : std::chrono::milliseconds::zero();
    }

    /// The lost token of the acquisition held now; an already stopped one when none is.
    std::stop_token held_lost_token() const {
        if (!state_) {
            return stopped_token();
        }
        std::lock_guard guard{state_->mutex};
        const auto* lease = state_->held_lease();
        return lease != nullptr ? lease->lost_token() : stopped_token();
    }

    /// The fencing token of the acquisition held now (State::fence); 0 when none is.
    std::int64_t held_fence() const {
        if (!state_) {
            return 0;
        }
        std::lock_guard guard{state_->mutex};
        return state_->held_lease() != nullptr ? state_->fence : 0;
    }

    /// `query(state, caller's owner id)` with the mutex held; `none` when moved from.
    template <class T, class Query>
    T of_caller(T none, Query query) const {
        if (!state_) {
            return none;
        }
        const std::string owner = state_->caller_owner();
        std::lock_guard guard{state_->mutex};
        return query(*state_, owner);
    }

    std::shared_ptr<State> state_;  // null once moved from

private:
    void give_up() noexcept {
        if (state_) {
            Derived::release_on_destruction(state_);
        }
    }
};

}  // namespace redislock::detail
