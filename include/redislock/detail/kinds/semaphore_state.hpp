// detail::semaphore_state: what a counting semaphore object (basic_counting_semaphore) keeps
// about the one permit it may hold. A permit is kept as a simple lock's acquisition is (its id,
// lease, fencing token), by the object rather than by a thread, so the books of mutex_state
// serve; what differs is where it lives in Redis (a member of the holders' sorted set, see
// lua/semaphore_acquire.lua), the count of permits beside it, and how it is given back.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/detail/kinds/mutex_state.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/script.hpp>
#include <redislock/semaphore_options.hpp>

namespace redislock::detail {

/// The most permits a semaphore may have: every count stays an exact integer in its scripts.
inline constexpr std::int64_t max_permits = 1'000'000'000'000;

/// @throws redislock::invalid_argument for a count of permits out of [1, max_permits].
inline void check_permits(std::int64_t permits) {
    if (permits < 1 || permits > max_permits) {
        throw invalid_argument{"redislock: a semaphore has from 1 to 10^12 permits, not " +
                               std::to_string(permits)};
    }
}

/// The lock_options a semaphore's permit is kept with. The owner makes the object, not the
/// calling thread, the holder: a permit may be given back from any thread, as with
/// std::counting_semaphore.
inline lock_options permit_options(const semaphore_options& o) {
    check_permits(o.permits);
    return lock_options{.lease = o.lease,
                        .watchdog = o.watchdog,
                        .fencing = o.fencing,
                        .on_lost = o.on_lost,
                        .backoff_min = o.backoff_min,
                        .backoff_max = o.backoff_max,
                        .owner = "permit",
                        .max_hold = o.max_hold,
                        .min_replicas = o.min_replicas,
                        .replica_timeout = o.replica_timeout,
                        .on_lost_reason = o.on_lost_reason};
}

template <connection C>
struct semaphore_state : mutex_state<C> {
    /// @throws redislock::invalid_argument for a bad name or options.
    semaphore_state(std::shared_ptr<client_core<C>> client, std::string_view name,
                    const semaphore_options& o)
        : mutex_state<C>{std::move(client), name, permit_options(o)},
          permits_key{derived_key(name, "permits")},
          permits{o.permits},
          permits_text{o.permits} {}

    // How mutex_release gives a permit back: lua/semaphore_release.lua on these keys, with
    // these arguments.
    static constexpr const script& release_script = scripts::semaphore_release;
    std::array<std::string_view, 4> release_keys() const {
        return {this->name, this->queue_key, this->lapse_key, permits_key};
    }
    std::array<std::string_view, 4> release_args(const detail::token& t) const {
        return {t.view(), this->channel, this->grace_text.view(), permits_text.view()};
    }

    // After the loss of permit `t` by expiry: gives it back in the background (see
    // mutex_state::clean_up_expired).
    static void clean_up_expired(const std::shared_ptr<semaphore_state>& st,
                                 const detail::token& t) noexcept {
        mutex_release<C, semaphore_state>::hand_to_reaper(st, t, steady::now() + st->options.lease);
    }

    // Records permit `t` as held by this object (see mutex_state::take).
    tracked_lease<C> take(const detail::token& t, const typename mutex_state<C>::grant& g,
                          bool& live) {
        tracked_lease<C> previous = mutex_state<C>::take(t, g, live);
        this->lease.kind = lock_kind::semaphore;
        return previous;
    }

    std::string permits_key;  // the count of permits, shared by every object of the name
    std::int64_t permits;     // semaphore_options::permits
    decimal permits_text;
    std::atomic<bool> differ_told{false};  // permits_differ told by this object
    // An acquire call under way, and in which fork generation (guarded by the mutex): a child
    // forked meanwhile has no such call, whatever its copy of the flag says.
    bool acquiring = false;
    std::uint64_t acquiring_generation = 0;

    bool acquiring_here() const {
        return acquiring && acquiring_generation == current_fork_generation();
    }
};

}  // namespace redislock::detail
