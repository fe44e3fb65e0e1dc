// redislock::script and detail::run_script: Lua scripts run with EVALSHA.
//
// Every script is embedded in detail/wire/scripts.hpp (generated from lua/*.lua) with the SHA1 that
// Redis computes for it, so no digest is ever computed at run time. A call sends EVALSHA; when
// the server answers NOSCRIPT (after a restart, SCRIPT FLUSH or failover) it sends SCRIPT LOAD
// and retries once, and tells a client's event hook (script_reloaded) when given its sink.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/reply.hpp>

namespace redislock {

/// A Lua script known at compile time. Values are static strings; copying is free.
struct script {
    /// A short name for messages, such as "mutex_release".
    std::string_view name;
    /// The Lua source, as SCRIPT LOAD is sent it.
    std::string_view source;
    std::string_view sha1;  ///< hex SHA1 of source, as SCRIPT LOAD returns it
};

namespace detail {

/// EVALSHA sha numkeys keys... args..., on the stack.
template <std::size_t KeyCount, std::size_t ArgCount>
std::array<std::string_view, 3 + KeyCount + ArgCount> evalsha_argv(
    const script& s, const std::array<std::string_view, KeyCount>& keys,
    const std::array<std::string_view, ArgCount>& args) {
    // Enough for any key count the scripts use; keeps the argument count off the heap.
    static_assert(KeyCount < 10, "the key count is written as one digit");
    static constexpr char key_count[2] = {static_cast<char>('0' + KeyCount), '\0'};
    std::array<std::string_view, 3 + KeyCount + ArgCount> argv{};
    argv[0] = "EVALSHA";
    argv[1] = s.sha1;
    argv[2] = std::string_view{key_count, 1};
    std::size_t i = 3;
    for (auto key : keys) {
        argv[i++] = key;
    }
    for (auto arg : args) {
        argv[i++] = arg;
    }
    return argv;
}

/// Sends SCRIPT LOAD of `s` as `how` says, after a NOSCRIPT; tells `events` (when not null).
/// @throws as the connection; redislock::server_error if SCRIPT LOAD is refused.
template <connection C>
void reload_script(C& conn, const script& s, const call_context& how, const event_sink* events) {
    const std::array<std::string_view, 3> load{"SCRIPT", "LOAD", s.source};
    reply loaded = detail::execute(conn, load, how);
    if (loaded.is_error()) {
        throw server_error{"redislock: SCRIPT LOAD of " + std::string{s.name} +
                           " was refused: " + loaded.text()};
    }
    if (events != nullptr) {
        events->emit([&] {
            lock_event e;
            e.type = event_type::script_reloaded;
            e.name = how.key;
            e.detail = s.name;
            return e;
        });
    }
}

/// Runs `s` with EVALSHA over `keys` then `args`; loads it and retries once on NOSCRIPT.
/// `how` carries the deadline and stop token; its key is set to keys[0] (the node that runs the
/// script is the node that must load it). A reload is told to `events` when not null. Returns
/// the script's reply, which may be an error reply raised by the script itself.
/// @throws redislock::connection_error; redislock::server_error if SCRIPT LOAD is refused;
///         redislock::cancelled_error on a stop request.
template <connection C, std::size_t KeyCount, std::size_t ArgCount>
reply run_script(C& conn, const script& s, const std::array<std::string_view, KeyCount>& keys,
                 const std::array<std::string_view, ArgCount>& args, call_context how = {},
                 const event_sink* events = nullptr) {
    const auto argv = evalsha_argv(s, keys, args);
    if constexpr (KeyCount > 0) {
        how.key = keys[0];
    }
    reply r = detail::execute(conn, argv, how);
    if (!r.is_error_code("NOSCRIPT")) {
        return r;
    }
    reload_script(conn, s, how, events);
    return detail::execute(conn, argv, how);
}

/// Throws connection_error when `r` is the error reply a connection stood in for a pipelined
/// command's answer that never came ("ERR redislock: ...", see connection.hpp): the command may
/// have run or not, as when a single command gets no answer.
inline void throw_if_unanswered(const reply& r) {
    if (r.is_error() && r.text().starts_with(unanswered_prefix)) {
        throw connection_error{r.text().substr(4)};
    }
}

/// As run_script, for a script that may publish to a waiting client: the EVALSHA goes behind a
/// PING in one pipeline, so that the message reaches the waiter before this caller's reply.
/// Redis queues a client for writing at its first reply of an event-loop pass and writes the
/// clients it queued newest first. The PING's reply queues the caller before the script's message
/// queues the waiter's subscriber link, so the message is written first; without it the caller's
/// reply goes out first, and the caller it wakes takes the CPU the waiter needs when both run on
/// one core. The PING's own reply (even an error) is ignored. A connection that cannot route a
/// pipeline per command (contextual_pipelining_connection) runs the script alone. A script that
/// got no answer while the PING did is told as run_script tells it, by connection_error, not as
/// the error reply a connection may stand in for it ("ERR redislock: ...", see connection.hpp).
/// @throws as run_script; redislock::connection_error when the pipeline's replies do not match.
template <connection C, std::size_t KeyCount, std::size_t ArgCount>
reply run_script_after_ping(C& conn, const script& s,
                            const std::array<std::string_view, KeyCount>& keys,
                            const std::array<std::string_view, ArgCount>& args,
                            call_context how = {}, const event_sink* events = nullptr) {
    if constexpr (contextual_pipelining_connection<C> && KeyCount > 0) {
        const auto argv = evalsha_argv(s, keys, args);
        how.key = keys[0];
        static constexpr std::array<std::string_view, 1> ping{"PING"};
        const std::array<command, 2> commands{command{ping}, command{argv}};
        const std::array<call_context, 2> hows{call_context{how.key, how.deadline, how.stop, true},
                                               how};
        std::vector<reply> replies = conn.execute_pipeline(commands, hows);
        if (replies.size() != 2) {
            throw connection_error{"redislock: a pipeline of 2 commands got " +
                                   std::to_string(replies.size()) + " replies"};
        }
        throw_if_unanswered(replies[1]);
        if (!replies[1].is_error_code("NOSCRIPT")) {
            return std::move(replies[1]);
        }
        reload_script(conn, s, how, events);
        return detail::execute(conn, argv, how);
    } else {
        return run_script(conn, s, keys, args, how, events);
    }
}

/// What a write acknowledged by replicas returned: its own reply, and how many replicas WAIT
/// counted (-1 when no WAIT was sent).
struct acknowledged_reply {
    reply value;
    std::int64_t replicas = -1;
};

/// How late a server may answer a WAIT after its timeout: it notices the timeout at its next
/// timer tick, up to 100 ms later at the default hz 10.
inline constexpr std::chrono::milliseconds wait_reply_lateness{100};

/// The timeout to send with WAIT for a call bounded by `deadline`: `timeout`, cut to half of what
/// the call has left after wait_reply_lateness, so that WAIT answers (with the replicas it
/// counted) while the call can still read it; never 0, which would make WAIT wait forever.
inline std::chrono::milliseconds wait_timeout_within(
    std::chrono::milliseconds timeout, std::chrono::steady_clock::time_point deadline) {
    using namespace std::chrono;
    if (deadline == steady_clock::time_point::max()) {
        return timeout;
    }
    const auto left = floor<milliseconds>(deadline - steady_clock::now());
    return std::max(milliseconds{1}, std::min(timeout, (left - wait_reply_lateness) / 2));
}

/// Sends `argv` and, when `min_replicas` > 0, WAIT min_replicas timeout right behind it in one
/// pipeline, so the WAIT covers the write on the same connection. The WAIT gets no more than the
/// time `how` leaves (see wait_timeout_within).
/// @throws as the connection's execute / execute_pipeline; connection_error when the write got
///         no answer though the WAIT did (see throw_if_unanswered).
template <connection C>
acknowledged_reply execute_acknowledged(C& conn, command argv, const call_context& how,
                                        int min_replicas, std::chrono::milliseconds timeout) {
    if (min_replicas <= 0) {
        return {detail::execute(conn, argv, how), -1};
    }
    if constexpr (pipelining_connection<C>) {
        const std::string replicas = std::to_string(min_replicas);
        const std::string wait_ms =
            std::to_string(wait_timeout_within(timeout, how.deadline).count());
        const std::array<std::string_view, 3> wait{"WAIT", replicas, wait_ms};
        const std::array<command, 2> commands{argv, command{wait}};
        std::vector<reply> replies;
        if constexpr (contextual_pipelining_connection<C>) {
            const std::array<call_context, 2> hows{how, how};
            replies = conn.execute_pipeline(commands, hows);
        } else {
            replies = conn.execute_pipeline(commands);
        }
        if (replies.size() != 2) {
            throw connection_error{"redislock: a pipeline of 2 commands got " +
                                   std::to_string(replies.size()) + " replies"};
        }
        throw_if_unanswered(replies[0]);
        const std::int64_t acknowledged = replies[1].is_integer() ? replies[1].as_integer() : 0;
        return {std::move(replies[0]), acknowledged};
    } else {
        throw invalid_argument{"redislock: min_replicas needs a pipelining connection"};
    }
}

/// As run_script, followed by WAIT as in execute_acknowledged.
template <connection C, std::size_t KeyCount, std::size_t ArgCount>
acknowledged_reply run_script_acknowledged(C& conn, const script& s,
                                           const std::array<std::string_view, KeyCount>& keys,
                                           const std::array<std::string_view, ArgCount>& args,
                                           call_context how, int min_replicas,
                                           std::chrono::milliseconds timeout,
                                           const event_sink* events = nullptr) {
    if (min_replicas <= 0) {
        return {run_script(conn, s, keys, args, how, events), -1};
    }
    static_assert(KeyCount > 0, "a write to acknowledge touches a key");
    const auto argv = evalsha_argv(s, keys, args);
    how.key = keys[0];
    acknowledged_reply r = execute_acknowledged(conn, argv, how, min_replicas, timeout);
    if (!r.value.is_error_code("NOSCRIPT")) {
        return r;
    }
    reload_script(conn, s, how, events);
    return execute_acknowledged(conn, argv, how, min_replicas, timeout);
}

}  // namespace detail

}  // namespace redislock
