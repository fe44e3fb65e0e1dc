// detail::report_eviction_policy: tells a client's event hook that the server it connected to may
// evict keys. Under any maxmemory-policy but noeviction, Redis drops keys when it reaches
// maxmemory, and every key of a lock has a TTL, so volatile-* policies reach them too: an evicted
// lock is a second holder, an evicted queue key jams or reorders its waiters. The locks need
// noeviction (docs/configuration.md).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/events.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

/// The value of `field` in the text of an INFO reply ("field:value" lines), or "" when absent.
inline std::string_view info_field(std::string_view info, std::string_view field) {
    for (std::size_t at = 0; at < info.size();) {
        std::size_t end = info.find('\n', at);
        if (end == std::string_view::npos) {
            end = info.size();
        }
        std::string_view line = info.substr(at, end - at);
        if (!line.empty() && line.back() == '\r') {
            line.remove_suffix(1);
        }
        if (line.size() > field.size() && line.substr(0, field.size()) == field &&
            line[field.size()] == ':') {
            return line.substr(field.size() + 1);
        }
        at = end + 1;
    }
    return {};
}

/// Asks the server `conn` talks to for its maxmemory-policy (INFO memory, one round trip bounded
/// by `timeout`) and tells `events` (event_type::evicting_server) when it is not noeviction. Only
/// when someone listens; a server that refuses INFO, or answers without the field, and a failed
/// call, tell nothing.
template <connection C>
void report_eviction_policy(C& conn, const event_sink& events,
                            std::chrono::milliseconds timeout) noexcept {
    if (!events.observed()) {
        return;
    }
    try {
        const std::array<std::string_view, 2> info{"INFO", "memory"};
        const reply r =
            execute(conn, info, call_context{{}, std::chrono::steady_clock::now() + timeout});
        if (!r.is_string()) {
            return;
        }
        const std::string_view policy = info_field(r.text(), "maxmemory_policy");
        if (policy.empty() || policy == "noeviction") {
            return;
        }
        std::string server;
        if constexpr (requires { conn.config().describe(); }) {
            server = conn.config().describe();
        }
        const std::string detail = "maxmemory-policy " + std::string{policy} + ", maxmemory " +
                                   std::string{info_field(r.text(), "maxmemory")} +
                                   ": the server may evict a lock or its queue (needs noeviction)";
        events.emit([&] {
            lock_event e;
            e.type = event_type::evicting_server;
            e.name = server;
            e.detail = detail;
            return e;
        });
    } catch (...) {
        // Out of memory, or a connection that failed: nothing to tell.
    }
}

}  // namespace redislock::detail
