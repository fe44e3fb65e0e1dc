// detail::mutex_state: what a simple lock object (basic_mutex) keeps about its acquisition and
// shares with its timer and watchdog callbacks: whether it is held, its token, holder thread,
// lease and fencing token. Its books are kept under its own mutex, which is never held across a
// round trip; lease_tracker finds the lease through find_lease().
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <thread>
#include <utility>

#include <redislock/connection.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/kinds/lock_identity.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/events.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

template <connection C>
struct mutex_state;

template <connection C, class State = mutex_state<C>>
struct mutex_release;

// What a simple lock object shares with its timer and watchdog callbacks.
template <connection C>
struct mutex_state : lock_identity<C> {
    using lock_identity<C>::lock_identity;
    using lease_key = detail::token;  // an acquisition is named by its token

    // How mutex_release gives an acquisition back: lua/mutex_release.lua on these keys, with
    // these arguments.
    static constexpr const script& release_script = scripts::mutex_release;
    std::array<std::string_view, 3> release_keys() const { return this->queue_keys(); }
    std::array<std::string_view, 3> release_args(const detail::token& t) const {
        return {t.view(), this->channel, this->grace_text.view()};
    }

    bool caller_is_holder() const { return this->caller_is(holder); }
    // Held by the parent this process was forked from: only the parent may release it.
    bool inherited_by_fork() const { return generation != current_fork_generation(); }
    const tracked_lease<C>* held_lease() const { return held ? &lease : nullptr; }
    // The tracked lease of the acquisition holding `t`, if it is still held.
    static tracked_lease<C>* find_lease(mutex_state& st, const detail::token& t) {
        return st.held && st.token == t ? &st.lease : nullptr;
    }

    // After the loss of acquisition `t` by expiry: releases it in the background, should a
    // renewal or extend that was never confirmed have kept its key past the lease the holder was
    // told of (see lease_tracker::take_back). A key already gone or taken is left alone.
    static void clean_up_expired(const std::shared_ptr<mutex_state>& st,
                                 const detail::token& t) noexcept {
        mutex_release<C>::hand_to_reaper(st, t, steady::now() + st->options.lease);
    }

    // How an acquisition came to this object.
    struct grant {
        steady::time_point sent;  // the granting attempt was sent then: the lease counts
        std::int64_t fence = 0;
        // The lock call's wait, reported as acquired before the lease can be found lost.
        const wait_tally* wait = nullptr;
    };

    // The books below need the mutex.

    // Records the acquisition `t`, granted as `g` says, as held by the calling thread; returns
    // the lease it replaces, `live` when that one was still held.
    tracked_lease<C> take(const detail::token& t, const grant& g, bool& live) {
        // Another thread of this object still thinks it holds: its lease ran out, since we could
        // take the key. Its acquisition is lost.
        live = held && !lease.lost;
        tracked_lease<C> previous = std::exchange(lease, {});
        held = true;
        token = t;
        holder = thread_number();
        holder_thread = std::this_thread::get_id();
        generation = current_fork_generation();
        lease.valid_until = valid_until(g.sent, this->options.lease);
        lease.acquired_at = g.sent;
        lease.kind = lock_kind::mutex;
        fence = g.fence;
        return previous;
    }

    // An acquisition given up by unlock() or the destructor, to be released.
    struct given_up {
        detail::token token;
        tracked_lease<C> lease;
    };

    // Marks the current acquisition as no longer held.
    given_up give_up() noexcept {
        held = false;
        return {token, std::exchange(lease, {})};
    }

    mutable std::mutex mutex;  // guards the members below; never held across a round trip
    bool held = false;
    detail::token token;
    std::uint64_t holder = 0;       // thread_number() of the holder thread
    std::thread::id holder_thread;  // the same thread, as unlock_refused events name it
    std::uint64_t generation = 0;   // fork generation of the acquisition
    std::int64_t fence = 0;
    tracked_lease<C> lease;
};

}  // namespace redislock::detail
