// What the masters' answers to a Redlock round mean: one master's reply to the command a round
// sent it (node_outcome_of), why a master gave none (why_unanswered), and the error that names
// each master when a round reached no quorum (no_quorum_error). Apart from redlock_core.hpp,
// which sends the rounds: these read replies and outcomes only, and do no I/O.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/detail/topology/quorum_round.hpp>
#include <redislock/detail/topology/redlock_acquisition.hpp>
#include <redislock/quorum_error.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

/// What one master's reply `r` to the command of `op` for `acq` means.
inline node_outcome node_outcome_of(node_op op, const redlock_acquisition& acq, const reply& r) {
    switch (op) {
        case node_op::acquire:
            if (r.is_status()) {
                return {node_answer::yes, {}, false, false};
            }
            if (r.is_nil()) {
                return {node_answer::no, {}, false, false};
            }
            break;
        case node_op::release:
        case node_op::extend:
            // compare_and_delete and mutex_extend: 1 done, 0 not ours.
            if (r.is_integer()) {
                return {r.as_integer() == 1 ? node_answer::yes : node_answer::no, {}, false};
            }
            if (r.is_error_code("WRONGTYPE")) {
                return {node_answer::no, {}, false, false};  // another type: surely not our lock
            }
            break;
        case node_op::verify:
            if (r.is_string()) {
                return {r.text() == acq.tok.view() ? node_answer::yes : node_answer::no, {}, false};
            }
            if (r.is_nil() || r.is_error_code("WRONGTYPE")) {
                return {node_answer::no, {}, false, false};
            }
            break;
    }
    return {node_answer::failed, r.is_error() ? r.text() : "unexpected reply", true, false};
}

/// Why a master did not answer a round whose masters each had `node_timeout`.
inline std::string why_unanswered(const node_replies& r, std::chrono::milliseconds node_timeout) {
    if (r.late) {
        return "no answer within " + std::to_string(node_timeout.count()) + " ms";
    }
    return r.error.empty() ? std::string{"no answer"} : r.error;
}

/// The error for a round that reached fewer than `quorum` of the `masters`, naming each
/// (`describe(i)`, a string) and its answer.
template <class Describe>
quorum_error no_quorum_error(std::string_view what, std::string_view name,
                             const std::vector<node_outcome>& outcomes, std::size_t quorum,
                             std::size_t masters, const Describe& describe) {
    std::string message = "redislock: cannot " + std::string{what} + " '" + std::string{name} +
                          "': a quorum of " + std::to_string(quorum) + " of " +
                          std::to_string(masters) + " masters is out of reach:";
    std::vector<quorum_error::node_failure> failures;
    for (std::size_t i = 0; i < outcomes.size(); ++i) {
        message += "\n  " + describe(i) + ": ";
        switch (outcomes[i].answer) {
            case node_answer::yes:
                message += "ok";
                break;
            case node_answer::no:
                message += "not ours";
                break;
            case node_answer::pending:
            case node_answer::failed:
                message += outcomes[i].error;
                failures.push_back({describe(i), outcomes[i].error});
                break;
        }
    }
    return quorum_error{std::move(message), std::move(failures)};
}

}  // namespace redislock::detail
