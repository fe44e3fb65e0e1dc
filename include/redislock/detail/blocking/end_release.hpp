// How every lock kind ends a release: what unlock(std::error_code&) reports and what the events
// and on_lost are told for each way a release can end (end_release), and the hand-off to the
// client's reaper of a release, or an abandoned acquisition, that could not be finished in the
// caller's time (leave_to_reaper).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <stop_token>
#include <system_error>

#include <redislock/detail/engine/reaper.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>

namespace redislock::detail {

/// How the release of an acquisition ended.
enum class release_end {
    released,    // the server let it go (or handed it on)
    lost,        // it was no longer ours: expired, or taken
    unanswered,  // no answer in time: left to the reaper
    refused,     // an error reply: left to the reaper
};

/// Tells how the release of an acquisition whose lease `t` was given back (by unlock() or the
/// destructor) ended, and returns what unlock(std::error_code&) reports: no error;
/// errc::lock_lost, the loss told through `t`'s stop source and on_lost; errc::connection_failed
/// or errc::server_failed, told as released with the reaper to finish it. Nothing is told for a
/// lease already told lost, nor without `tell` (an inner entry of a reentrant lock). A lease
/// already told lost that the release still found is errc::lock_lost too: whether its key was
/// still there depends only on whether the background take-back after the loss (see
/// lease_tracker) had run yet.
template <class State, class Lease>
std::error_code end_release(const State& lk, const Lease& t, release_end how,
                            bool tell = true) noexcept {
    const bool told_lost = t.lost;
    tell = tell && !told_lost;
    switch (how) {
        case release_end::released:
            if (tell) {
                report_release(lk, t);
            }
            if (told_lost) {
                return errc::lock_lost;
            }
            return {};
        case release_end::lost:
            if (tell) {
                std::stop_source source = t.lost_source;
                source.request_stop();
                report_loss(lk, t.kind, loss_reason::taken, t.acquired_at);
            }
            return errc::lock_lost;
        case release_end::unanswered:
            if (tell) {
                report_release(lk, t, "no answer: left to the reaper");
            }
            return errc::connection_failed;
        case release_end::refused:
            if (tell) {
                report_release(lk, t, "refused: left to the reaper");
            }
            return errc::server_failed;
    }
    return errc::connection_failed;
}

/// Has the reaper retry `once(*st, entry, deadline)`, one release of `entry` that returns true
/// when done (released, or found gone), until it is done or the lease that `entry` may hold,
/// ending at `lease_end`, has surely ended (plus the drift allowance). The reaper keeps `st`, and
/// so the client's core and connection, alive meanwhile; it waits in the lane of the server that
/// serves the lock's name. `once` may throw (a failed attempt); copying it must not.
template <class State, class Entry, class Once>
void leave_to_reaper(const std::shared_ptr<State>& st, const Entry& entry,
                     steady::time_point lease_end, Once once) noexcept {
    try {
        const auto give_up_at = lease_end + st->options.lease / 100 + std::chrono::milliseconds{2};
        background_reaper().add(
            server_lane(st->core->connection, st->name, st->core.get()),
            [st, entry, once](steady::time_point deadline) {
                try {
                    return once(*st, entry, deadline);
                } catch (...) {
                    return false;
                }
            },
            give_up_at);
    } catch (...) {
        // Out of memory: the entry expires with its lease.
    }
}

}  // namespace redislock::detail
