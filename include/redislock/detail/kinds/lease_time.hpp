// How long a lease surely holds on this side: valid_until(), the local deadline of a grant
// counted from its send with the drift allowance, and time_left() until such a deadline.
#pragma once

#include <chrono>

#include <redislock/detail/waiting/backoff.hpp>

namespace redislock::detail {

/// When a lease granted to an attempt sent at `sent` surely still holds: the lease counted from
/// the send, minus a drift allowance of 1% of the lease + 2 ms for clock rate differences.
inline steady::time_point valid_until(steady::time_point sent, std::chrono::milliseconds lease) {
    return sent + lease -
           std::chrono::duration_cast<steady::duration>(lease / 100 + std::chrono::milliseconds{2});
}

/// Time left until `until`, in whole ms, never negative.
inline std::chrono::milliseconds time_left(steady::time_point until) {
    const auto left = until - steady::now();
    return left > steady::duration::zero()
               ? std::chrono::duration_cast<std::chrono::milliseconds>(left)
               : std::chrono::milliseconds::zero();
}

}  // namespace redislock::detail
