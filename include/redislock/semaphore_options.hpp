// redislock::semaphore_options: how one counting semaphore object behaves (the count of permits
// it writes when none exists, and the lease, watchdog, fencing, loss handlers and waiting of the
// permit it takes).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

#include <redislock/events.hpp>
#include <redislock/lock_options.hpp>

namespace redislock {

/// Options of one counting semaphore object, given to client.semaphore(). An aggregate: write
/// `semaphore_options{.permits = 4, .lease = 20s, .watchdog = true}`. The members after
/// `permits` mean for the object's permit what lock_options' members of the same names mean for
/// a lock.
struct semaphore_options {
    /// The count of permits, written to Redis only when none is stored there yet: the first
    /// object to acquire sets it for everyone, later ones find it (one that finds another count
    /// is told as permits_differ, events.hpp), and set_permits() changes it. From 1 to 10^12.
    std::int64_t permits = 1;
    /// How long Redis keeps this object's permit if its holder goes silent; in (0, max_lease].
    std::chrono::milliseconds lease{30'000};
    /// Renew the permit's lease while it is held (see watchdog.hpp and lock_options::watchdog).
    bool watchdog = false;
    /// Draw a strictly increasing fencing token with every permit granted (fencing_token()).
    bool fencing = false;
    /// Called once when a held permit is found lost (see lock_options::on_lost).
    std::function<void()> on_lost{};
    /// Waiting: exponential backoff with full jitter (see lock_options::backoff_min).
    std::chrono::milliseconds backoff_min{1};
    /// The longest pause between two attempts.
    std::chrono::milliseconds backoff_max{128};
    /// Zero, or the longest the watchdog keeps the permit (see lock_options::max_hold).
    std::chrono::milliseconds max_hold{0};
    /// Replicas that must acknowledge a grant (see lock_options::min_replicas).
    int min_replicas = 0;
    /// How long a grant waits for those acknowledgements.
    std::chrono::milliseconds replica_timeout{100};
    /// Called once, with the reason, when a held permit is found lost.
    std::function<void(loss_reason)> on_lost_reason{};
};

}  // namespace redislock
