// detail::redlock_release: how a redlock lock object (basic_redlock_mutex) releases an
// acquisition: one release round on every master and what the tally of their answers means.
// Masters that did not answer get the release again in the background (redlock_core); none of
// this holds the state's mutex.
#pragma once

#include <memory>
#include <system_error>

#include <redislock/connection.hpp>
#include <redislock/detail/blocking/end_release.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/topology/quorum_round.hpp>
#include <redislock/detail/topology/redlock_core.hpp>
#include <redislock/detail/topology/redlock_state.hpp>

namespace redislock::detail {

template <connection C>
struct redlock_release {
    using state = redlock_state<C>;
    using given_up = typename state::given_up;

    // Stops the timer and renewals of `g`, then releases it on every master.
    static std::error_code leave(const std::shared_ptr<state>& st, given_up g) noexcept {
        try {
            lease_tracker<state>{st}.end(g.lease);
            const redlock_core<C>& masters = *st->core;
            // Every master, not just a quorum: a process that exits right after unlock() must
            // not leave its key on a minority until the lease runs out.
            const auto outcomes = st->core->release(g.acq);
            const quorum_tally t = tally(outcomes);
            if (t.yes >= masters.quorum()) {
                return detail::end_release(*st, g.lease, release_end::released);
            }
            if (t.no > masters.size() - masters.quorum()) {
                return detail::end_release(*st, g.lease, release_end::lost);
            }
            // No quorum either way: the masters that did not answer get it in the background.
            bool unanswered = false;
            for (const node_outcome& o : outcomes) {
                unanswered = unanswered || (o.answer == node_answer::failed && !o.server_error);
            }
            return detail::end_release(*st, g.lease,
                                       unanswered ? release_end::unanswered : release_end::refused);
        } catch (...) {
            return detail::end_release(*st, g.lease, release_end::unanswered);
        }
    }
};

}  // namespace redislock::detail
