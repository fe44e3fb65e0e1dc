// detail::extend_token: extend() of the kinds whose acquisition is one token under the name
// (basic_mutex, and a permit of basic_counting_semaphore): one script that sets the lease of
// that token's entry if it is still there, and what its answer means for the local deadline.
#pragma once

#include <array>
#include <chrono>
#include <string_view>

#include <redislock/connection.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

/// Sets the lease of acquisition `t` of `st` to `lease` from now with `s` (KEYS[1] the name,
/// ARGV the token and the lease in ms; returns 1 when extended, 0 when not ours). Returns false
/// (and tells the loss) when it was not ours. A lease shorter than the one left counts locally
/// from when it is sent, even if the call then fails: it may have landed.
/// @throws redislock::connection_error; redislock::server_error when the server answers with an
///         error (the acquisition is not taken for lost).
template <class State>
bool extend_token(lease_tracker<State> tracker, const State& st, const script& s, const token& t,
                  std::chrono::milliseconds lease) {
    const decimal lease_text{lease.count()};
    const auto sent = steady::now();
    const bool shortening = tracker.extend_sending(t, sent, lease);
    bool ours = false;
    try {
        const reply r = run_script(*st.conn, s, std::array{std::string_view{st.name}},
                                   std::array{t.view(), lease_text.view()},
                                   call_context{{}, st.core->untimed_deadline()}, &st.core->events);
        ours = tracker.extend_replied(t, r, sent, lease);
    } catch (...) {
        if (shortening) {
            tracker.extend_returned(t);
        }
        throw;
    }
    if (shortening) {
        tracker.extend_returned(t);
    }
    return ours;
}

}  // namespace redislock::detail
