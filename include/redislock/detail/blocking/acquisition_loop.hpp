// The acquisition loop every blocking lock call runs (acquire_until): it rides out transient
// failures within the caller's deadline, ends at once on a stop request, and bounds each round
// trip by the deadline (attempt_context); and the ROLE check of a node that granted a lock
// (serves_as_master).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <optional>
#include <stop_token>
#include <string_view>

#include <redislock/connection.hpp>
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

/// False when the node that serves `key` says it is no longer a master (ROLE): after a failover
/// a client pinned to a demoted master may still read its lock there, but the node cannot vouch
/// for it. A node that refuses ROLE (an ACL, a proxy) is taken at its word.
template <connection C>
bool serves_as_master(C& conn, std::string_view key, steady::time_point deadline) {
    const std::array<std::string_view, 1> role{"ROLE"};
    const reply r = execute(conn, role, call_context{key, deadline, nullptr});
    if (!r.is_array() || r.elements().empty()) {
        return true;
    }
    return r.elements().front().text() == "master";
}

/// True for failures a wait with time left rides out (then throws the last of them).
inline bool is_transient(const error& e) {
    return dynamic_cast<const connection_error*>(&e) != nullptr ||
           dynamic_cast<const unavailable_error*>(&e) != nullptr ||
           dynamic_cast<const replication_error*>(&e) != nullptr;  // a replica may catch up
}

/// The round-trip bound of one attempt of a call that ends at `deadline`: the deadline itself,
/// never more; for untimed calls, and for the first try of a call whose deadline had already
/// passed when it was made (`immediate`: try_lock(), a zero timeout), the connection's own
/// command timeout. No other attempt is started once the deadline has passed (see attempt_due).
inline call_context attempt_context(steady::time_point deadline, const std::stop_token& stop,
                                    bool immediate) {
    call_context how;
    if (!immediate) {
        how.deadline = deadline;
    }
    if (stop.stop_possible()) {
        how.stop = &stop;
    }
    return how;
}

/// Whether a waiting call may start another attempt: not once its deadline has passed, where
/// any round trip would end it late.
inline bool attempt_due(steady::time_point deadline) {
    return deadline == steady::time_point::max() || steady::now() < deadline;
}

/// Tries `attempt(how)` until it acquires, the deadline passes or a stop is requested; rides out
/// transient failures (connection errors, timeouts, LOADING, READONLY...) while the wait has time
/// left, then throws the last one. A call without a wait (deadline already past) throws at once,
/// and so does an untimed, unstoppable lock(): with no deadline and no way to stop it, riding out
/// an outage would hang its caller silently. A slot being migrated (slot_migrating_error) is
/// waited out as a held lock is, by every call. `attempt` returns std::nullopt when it acquired,
/// else the holder's TTL. No round trip of a waiting call lasts past its deadline (see
/// attempt_context).
template <class Attempt>
bool acquire_until(Attempt&& attempt, steady::time_point deadline, const std::stop_token& stop,
                   const lock_options& options) {
    backoff policy{options};
    // A replica that did not acknowledge says more than the timeout of a last attempt cut short
    // by the deadline: that is what the caller is told.
    std::exception_ptr unacknowledged;
    for (bool first = true;; first = false) {
        const bool immediate = first && !attempt_due(deadline);
        if (!immediate && !attempt_due(deadline)) {
            // Time is up before another attempt: one refused for too few replicas says why the
            // lock was not had, as another attempt would have said again.
            if (unacknowledged) {
                std::rethrow_exception(unacknowledged);
            }
            return false;
        }
        std::optional<holder_ttl> ttl;
        try {
            ttl = attempt(attempt_context(deadline, stop, immediate));
            if (!ttl) {
                return true;
            }
        } catch (const cancelled_error&) {
            return false;
        } catch (const error& e) {
            if (dynamic_cast<const replication_error*>(&e) != nullptr) {
                unacknowledged = std::current_exception();
            }
            const bool endless = deadline == steady::time_point::max() && !stop.stop_possible();
            if (!is_slot_migrating(e) && (endless || !is_transient(e) ||
                                          steady::now() >= deadline || stop.stop_requested())) {
                if (unacknowledged && dynamic_cast<const connection_error*>(&e) != nullptr) {
                    std::rethrow_exception(unacknowledged);
                }
                throw;
            }
            ttl = holder_ttl{-1};  // back off as if held with no known lease
        }
        const auto now = steady::now();
        if (now >= deadline || stop.stop_requested()) {
            return false;
        }
        const auto pause = std::min(policy.next(*ttl), deadline - now);
        if (!sleep_unless_stopped(pause, stop)) {
            return false;
        }
    }
}

}  // namespace redislock::detail
