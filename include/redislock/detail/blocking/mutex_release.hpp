// detail::mutex_release: how a simple lock object (basic_mutex), or a semaphore's permit
// (basic_counting_semaphore), releases an acquisition in Redis: the compare-and-delete script's
// round trip and what its answer means, and a release, or an acquisition abandoned mid-flight,
// that could not be finished, handed to the client's reaper. Static functions on the object's
// state (mutex_state, or one that extends it and names its own release_script and
// release_keys()), which the reaper keeps alive while it retries; none holds the state's mutex.
#pragma once

#include <array>
#include <memory>
#include <string_view>
#include <system_error>

#include <redislock/connection.hpp>
#include <redislock/detail/blocking/end_release.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/kinds/mutex_state.hpp>
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

template <connection C, class State>
struct mutex_release {
    using state = State;
    using given_up = typename state::given_up;

    enum class release_outcome { released, handed_on, not_ours, unreachable, refused };

    // One compare-and-delete of `token`, ending by `deadline`; tells the next waiter, if any
    // (`waiters_likely`: as soon as it can, see run_script_after_ping).
    static release_outcome release_once(const state& st, const detail::token& token,
                                        steady::time_point deadline,
                                        bool waiters_likely = false) noexcept {
        try {
            const auto keys = st.release_keys();
            const auto args = st.release_args(token);
            const call_context how{{}, deadline};
            const reply r =
                waiters_likely
                    ? detail::run_script_after_ping(st.core->connection, state::release_script,
                                                    keys, args, how, &st.core->events)
                    : detail::run_script(st.core->connection, state::release_script, keys, args,
                                         how, &st.core->events);
            if (r.is_integer()) {
                switch (r.as_integer()) {
                    case 1:
                        return release_outcome::released;
                    case 2:
                        return release_outcome::handed_on;
                    default:
                        return release_outcome::not_ours;
                }
            }
            // Another type at the name is surely not our lock; other errors say nothing.
            if (r.is_error_code("WRONGTYPE")) {
                return release_outcome::not_ours;
            }
            (void)server_failure(r);
            return release_outcome::refused;
        } catch (...) {
            return release_outcome::unreachable;
        }
    }

    // Stops the timer and renewals of `g`, then releases it.
    static std::error_code leave(const std::shared_ptr<state>& st, given_up g) noexcept {
        lease_tracker<state>{st}.end(g.lease);
        const bool contended = st->core->contended_lately(st->name);
        const auto outcome = release_once(*st, g.token, st->core->untimed_deadline(), contended);
        switch (outcome) {
            case release_outcome::released:
            case release_outcome::handed_on:
                st->core->note_contention(st->name, outcome == release_outcome::handed_on);
                return detail::end_release(*st, g.lease, release_end::released);
            case release_outcome::not_ours:
                return detail::end_release(*st, g.lease, release_end::lost);
            case release_outcome::unreachable:
                hand_to_reaper(st, g.token, g.lease.valid_until + st->options.lease);
                return detail::end_release(*st, g.lease, release_end::unanswered);
            case release_outcome::refused:
                hand_to_reaper(st, g.token, g.lease.valid_until + st->options.lease);
                return detail::end_release(*st, g.lease, release_end::refused);
        }
        return errc::connection_failed;
    }

    // Retries the compare-and-delete of `token` until the server answers or the lease that token
    // may hold has surely ended.
    static void hand_to_reaper(const std::shared_ptr<state>& st, const detail::token& token,
                               steady::time_point lease_end) noexcept {
        detail::leave_to_reaper(
            st, token, lease_end,
            [](const state& s, const detail::token& t, steady::time_point deadline) {
                const auto outcome = release_once(s, t, deadline);
                return outcome != release_outcome::unreachable &&
                       outcome != release_outcome::refused;
            });
    }
};

}  // namespace redislock::detail
