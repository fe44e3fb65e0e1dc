// The acquisition round trip of the kinds whose entries are counted per owner (the reentrant and
// read-write locks): one attempt of their entry script, with what to do when it may have landed
// unanswered, and its answer decoded (send_entry). Stateless: thread safety and lifetimes are
// those of the lock state it is given.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include <redislock/connection.hpp>
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

/// An entry script's answer to one attempt, and how many replicas WAIT counted (-1: not asked).
struct entry_grant {
    entry_reply got;
    std::int64_t replicas = -1;
};

/// Runs `s`, the entry script of `lk`, over its keys (name, queue, lapse times, and the fencing
/// counter when the attempt may draw a token: `fenced`) and `args` for one attempt bounded by
/// `how`. Only an `outermost` entry's attempt may be sent twice: a re-entry's count change must
/// not run twice. When the entry may have landed without an answer (a connection error or
/// cancellation) runs `unknown()`, then rethrows.
/// @throws what run_script_acknowledged() and decode_entry() throw (`unexpected` for a reply of
///         another shape).
template <class State, std::size_t ArgCount, class Unknown>
entry_grant send_entry(const State& lk, const script& s,
                       const std::array<std::string_view, ArgCount>& args, const call_context& how,
                       bool outermost, bool fenced, const char* unexpected, Unknown unknown) {
    call_context attempt_how = how;
    attempt_how.repeatable = outermost;
    reply r;
    std::int64_t replicas = -1;
    try {
        auto acknowledged = lk.with_acquisition_keys(fenced, [&](const auto& keys) {
            return detail::run_script_acknowledged(*lk.conn, s, keys, args, attempt_how,
                                                   lk.options.min_replicas,
                                                   lk.options.replica_timeout, &lk.core->events);
        });
        r = std::move(acknowledged.value);
        replicas = acknowledged.replicas;
    } catch (const error& e) {
        if (dynamic_cast<const connection_error*>(&e) || dynamic_cast<const cancelled_error*>(&e)) {
            unknown();
        }
        throw;
    }
    return {decode_entry(r, lk.name, unexpected), replicas};
}

}  // namespace redislock::detail
