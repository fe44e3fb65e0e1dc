// The release round trip of the kinds whose entries are counted per owner (the reentrant and
// read-write locks): one run of their release script for entries already counted out locally
// (send_release), and what its answer means for unlock(std::error_code&), the events and on_lost
// (leave_entries). Stateless: thread safety and lifetimes are those of the lock state it is given.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>
#include <system_error>

#include <redislock/connection.hpp>
#include <redislock/detail/blocking/end_release.hpp>
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

/// Sends `s`, the release script of `st`, over its keys (name, queue, lapse times) and `args`,
/// ending by `deadline`; a release that lets waiters in tells them.
template <class State, std::size_t ArgCount>
reply send_release(const State& st, const script& s,
                   const std::array<std::string_view, ArgCount>& args,
                   steady::time_point deadline) {
    call_context how{{}, deadline};
    how.repeatable = false;  // a count change must not run twice (the reaper resends by id)
    reply r =
        detail::run_script(st.core->connection, s, st.queue_keys(), args, how, &st.core->events);
    if (r.is_integer() && r.as_integer() >= 1) {
        st.core->note_contention(st.name, r.as_integer() == 2);
    }
    return r;
}

/// Ends a release of entries of `st` already counted out locally, whose reply `once()` (a
/// send_release) gives: `last` when they were their acquisition's last, whose lease was `ended`
/// (else unused). No answer, or one that says nothing about ownership (`answered(r)` false),
/// leaves the release unfinished: `not_finished()` hands it on. A non-negative count released;
/// any other answer means the entries were gone, and `gone(r)` says what to report.
template <class State, class Lease, class Once, class Answered, class NotFinished, class Gone>
std::error_code leave_entries(const State& st, const Lease& ended, bool last, Once once,
                              Answered answered, NotFinished not_finished, Gone gone) noexcept {
    reply r;
    try {
        r = once();
    } catch (...) {
        not_finished();
        return detail::end_release(st, ended, release_end::unanswered, last);
    }
    if (!answered(r)) {
        not_finished();
        (void)detail::end_release(st, ended, release_end::refused, last);
        return server_failure(r);
    }
    if (r.is_integer() && r.as_integer() >= 0) {
        return detail::end_release(st, ended, release_end::released, last);
    }
    return gone(r);
}

}  // namespace redislock::detail
