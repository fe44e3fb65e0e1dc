// redislock::script and detail::run_script: Lua scripts run with EVALSHA.
//
// Every script is embedded in detail/scripts.hpp (generated from lua/*.lua) with the SHA1 that
// Redis computes for it, so no digest is ever computed at run time. A call sends EVALSHA; when
// the server answers NOSCRIPT (after a restart, SCRIPT FLUSH or failover) it sends SCRIPT LOAD
// and retries once.
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include <redislock/connection.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>

namespace redislock {

/// A Lua script known at compile time. Values are static strings; copying is free.
struct script {
    std::string_view name;
    std::string_view source;
    std::string_view sha1;  ///< hex SHA1 of source, as SCRIPT LOAD returns it
};

namespace detail {

/// Runs `s` with EVALSHA over `keys` then `args`; loads it and retries once on NOSCRIPT.
/// `how` carries the deadline and stop token; its key is set to keys[0] (the node that runs the
/// script is the node that must load it). Returns the script's reply, which may be an error
/// reply raised by the script itself.
/// @throws redislock::connection_error; redislock::server_error if SCRIPT LOAD is refused;
///         redislock::cancelled_error on a stop request.
template <connection C, std::size_t KeyCount, std::size_t ArgCount>
reply run_script(C& conn, const script& s, const std::array<std::string_view, KeyCount>& keys,
                 const std::array<std::string_view, ArgCount>& args, call_context how = {}) {
    // Enough for any key count the scripts use; keeps the argument count off the heap.
    static_assert(KeyCount < 10, "run_script writes the key count as one digit");
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

    if constexpr (KeyCount > 0) {
        how.key = keys[0];
    }
    reply r = detail::execute(conn, argv, how);
    if (!r.is_error_code("NOSCRIPT")) {
        return r;
    }
    const std::array<std::string_view, 3> load{"SCRIPT", "LOAD", s.source};
    reply loaded = detail::execute(conn, load, how);
    if (loaded.is_error()) {
        throw server_error{"redislock: SCRIPT LOAD of " + std::string{s.name} +
                           " was refused: " + loaded.text()};
    }
    return detail::execute(conn, argv, how);
}

}  // namespace detail

}  // namespace redislock
