// detail::watchdog_lease: what the watchdog engine keeps about each lease it renews (the renewal
// it was given, when it is due, when a grant was last confirmed, how a batch in flight is to
// settle it) and when that lease surely ran out. Apart from watchdog_engine.hpp so that the
// batch built from these records (renewal_batch.hpp) can read them without the engine's thread
// and queue. Each record is guarded by the engine's mutex.
#pragma once

#include <chrono>

#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/lease_renewal.hpp>

namespace redislock::detail {

struct watchdog_lease {
    lease_renewal renewal;
    detail::steady::time_point registered{};
    detail::steady::duration interval{};
    detail::steady::time_point due{};
    detail::steady::time_point confirmed_at{};  // reply to the last successful grant
    bool expiring = false;                      // max_hold reached: no more renewals
    bool removed = false;                       // remove() waits for it: settle nothing
    bool cancelled = false;                     // cancel()ed in flight: drop when settled
};

// The lease surely ran out this long after the reply that last granted it.
inline detail::steady::time_point surely_gone(const watchdog_lease& e) {
    const auto lease = e.renewal.lease;
    return e.confirmed_at + lease + lease / 100 + std::chrono::milliseconds{2};
}

}  // namespace redislock::detail
