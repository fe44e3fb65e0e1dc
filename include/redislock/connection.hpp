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
//
// where `c` is a C&, `argv` a redislock::command (the command name and its arguments, as
// std::string_view, valid only during the call) and `commands` a std::span<const command>.
//
// execute() returns error replies as reply values (reply::is_error()); it throws
// redislock::connection_error (or timeout_error) when the command could not be sent or its
// reply not read. It must be safe to call from several threads at once: the locks of one client
// share its connection.
//
// Optional capabilities are detected at compile time; a connection without them still works
// (the library then sends one command per call).
#pragma once

#include <concepts>
#include <span>
#include <string_view>
#include <vector>

#include <redislock/reply.hpp>

namespace redislock {

/// One command: its name and arguments, e.g. {"SET", key, value, "NX"}.
using command = std::span<const std::string_view>;

template <class C>
concept connection = requires(C& c, command argv) {
    { c.execute(argv) } -> std::same_as<reply>;
};

/// A connection that can send several commands in one round trip.
template <class C>
concept pipelining_connection = connection<C> && requires(C& c, std::span<const command> commands) {
    { c.execute_pipeline(commands) } -> std::same_as<std::vector<reply>>;
};

namespace detail {

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
