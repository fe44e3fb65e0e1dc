// The connection concept: what the locks need from a Redis client.
//
// A lock talks to Redis only through a type C that models redislock::connection:
//
//   expression                       type                 meaning
//   -------------------------------  -------------------  ------------------------------------
//   c.execute(argv)                  redislock::reply     send one command, wait for its reply
//   c.execute_pipeline(commands)     std::vector<reply>   optional (pipelining_connection): send
//                                                         every command, then read every reply,
//                                                         one reply per command, in order
//   c.execute(argv, how)             redislock::reply     optional (contextual_connection): as
//                                                         execute(argv), sent to the node that
//                                                         serves how.key, ending by how.deadline
//                                                         or when *how.stop is requested
//   c.execute_pipeline(commands,     std::vector<reply>   optional (contextual_pipelining_
//                      hows)                              connection): hows[i] goes with
//                                                         commands[i]; commands may be grouped
//                                                         by node, replies come back in order
//   c.start(commands, how)           C::call              optional (fanout_connection): sends
//                                                         every command and returns without
//                                                         waiting for a reply (table below)
//   c.start_if_connected(commands,   std::optional<       optional (connected_fanout_
//                        how)        C::call>             connection): as start() on a connection
//                                                         already open and free; std::nullopt,
//                                                         nothing sent, when start() would first
//                                                         have to connect or wait for one
//   c.connect(how)                   void                 with start_if_connected: has one
//                                                         connection open and free, opening one
//                                                         if need be, by how.deadline
//
// A C::call is one batch in flight, so that one thread can have commands outstanding on several
// connections at once and wait for all of them with poll(2) (Redlock's fan-out to its masters):
//
//   call.fd()         int                  the socket to poll for POLLIN; -1 once the call ended
//   call.buffered()   bool                 replies may be readable without the socket becoming
//                                          readable (bytes already decrypted by TLS)
//   call.read()       bool                 reads what has arrived, without blocking when the
//                                          socket is readable or buffered() is true; true once
//                                          every reply is in or the call failed
//   call.take()       std::vector<reply>   after read() returned true: one reply per command, in
//                                          order; throws redislock::connection_error on failure
//
// A call destroyed before read() returned true must close its connection (or otherwise make sure
// its late replies are never taken for another command's). start() bounds its own waiting (a
// free connection, connecting, writing) by how.deadline and *how.stop as execute() does; reading
// is bounded by the caller, who stops polling at its deadline and destroys the call.
//
// where `c` is a C&, `argv` a redislock::command (the command name and its arguments, as
// std::string_view, valid only during the call), `commands` a std::span<const command>, `how` a
// const redislock::call_context& and `hows` a std::span<const call_context>.
//
// The library always passes a call_context where the connection takes one: the key the command
// touches (a cluster connection routes by it; SCRIPT LOAD carries the key of the script it is
// loaded for, so it reaches the same node), the caller's deadline and stop token. A connection
// that honours the deadline throws redislock::timeout_error when it passes, and one that honours
// the stop token throws redislock::cancelled_error when a stop is requested mid-call. A custom
// connection that implements execute(argv) alone keeps working on a single node: its calls are
// then bounded only by its own timeouts.
//
// execute() returns error replies as reply values (reply::is_error()); it throws
// redislock::connection_error (or timeout_error) when the command could not be sent or its
// reply not read. It must be safe to call from several threads at once: the locks of one client
// share its connection. execute_pipeline() throws the same way, except that a connection whose
// batch spans several nodes may, when some commands were answered and others got no answer,
// return for each unanswered one an error reply starting with "ERR redislock: "
// (detail::unanswered_prefix), which no server sends.
//
// Optional capabilities are detected at compile time; a connection without them still works
// (the library then sends one command per call).
#pragma once

#include <redislock/detail/util/platform.hpp>

#include <chrono>
#include <concepts>
#include <optional>
#include <span>
#include <stop_token>
#include <string_view>
#include <vector>

#include <redislock/reply.hpp>

namespace redislock {

/// One command: its name and arguments, e.g. {"SET", key, value, "NX"}.
using command = std::span<const std::string_view>;

namespace detail {
/// How a pipelined command's error reply starts when a connection stands it in for an answer
/// that never came (see the top of this file).
inline constexpr std::string_view unanswered_prefix = "ERR redislock: ";
}  // namespace detail

template <class C>
concept connection = requires(C& c, command argv) {
    { c.execute(argv) } -> std::same_as<reply>;
};

/// How the library wants one call made.
struct call_context {
    /// The first key the command touches, or for a keyless command sent on a key's behalf
    /// (SCRIPT LOAD) that key. Empty: any node will do.
    std::string_view key{};
    /// The call must end by then; std::chrono::steady_clock::time_point::max() means only the
    /// connection's own command timeout bounds it.
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
    /// When not null, a stop request ends the call early (redislock::cancelled_error).
    const std::stop_token* stop = nullptr;
    /// False when running the command twice would apply it twice (a reentrant count's change):
    /// a connection must then not send it again after a failure that may have let it run.
    bool repeatable = true;
};

/// A connection that takes a call_context: routing by key, per-call deadline, stop requests.
template <class C>
concept contextual_connection = connection<C> &&
    requires(C& c, command argv, const call_context& how) {
    { c.execute(argv, how) } -> std::same_as<reply>;
};

/// A connection that can send several commands in one round trip.
template <class C>
concept pipelining_connection = connection<C> && requires(C& c, std::span<const command> commands) {
    { c.execute_pipeline(commands) } -> std::same_as<std::vector<reply>>;
};

/// A pipelining connection that takes one call_context per command.
template <class C>
concept contextual_pipelining_connection = connection<C> &&
    requires(C& c, std::span<const command> commands, std::span<const call_context> hows) {
    { c.execute_pipeline(commands, hows) } -> std::same_as<std::vector<reply>>;
};

/// A connection that can start a batch of commands and let the caller poll for the replies.
template <class C>
concept fanout_connection = connection<C> &&
    requires(C& c, std::span<const command> commands, const call_context& how) {
    { c.start(commands, how) } -> std::same_as<typename C::call>;
} && requires(typename C::call& call, const typename C::call& ended) {
    { ended.fd() } -> std::same_as<int>;
    { ended.buffered() } -> std::same_as<bool>;
    { call.read() } -> std::same_as<bool>;
    { call.take() } -> std::same_as<std::vector<reply>>;
};

/// A fanout connection that can tell, without waiting, that starting a batch would first need a
/// connection opened, and open one apart: Redlock then connects on another thread, so a master
/// whose connects hang never holds up the others' commands.
template <class C>
concept connected_fanout_connection = fanout_connection<C> &&
    requires(C& c, std::span<const command> commands, const call_context& how) {
    { c.start_if_connected(commands, how) } -> std::same_as<std::optional<typename C::call>>;
    c.connect(how);
};

namespace detail {

/// Sends one command the best way `conn` supports.
template <connection C>
reply execute(C& conn, command argv, const call_context& how) {
    if constexpr (contextual_connection<C>) {
        return conn.execute(argv, how);
    } else {
        return conn.execute(argv);
    }
}

/// Checks `connection<C>` part by part, so a type that misses it fails with a sentence rather
/// than a page of template diagnostics. Use as `static_assert(detail::check_connection<C>())`.
template <class C>
consteval bool check_connection() {
    constexpr bool has_execute = requires(C & c, command argv) {
        c.execute(argv);
    };
    static_assert(has_execute,
                  "redislock: a connection type needs a member function "
                  "execute(redislock::command) (see redislock/connection.hpp)");
    if constexpr (has_execute) {
        static_assert(std::same_as<decltype(std::declval<C&>().execute(command{})), reply>,
                      "redislock: a connection's execute(redislock::command) must return "
                      "redislock::reply");
    }
    return connection<C>;
}

}  // namespace detail

}  // namespace redislock
