// What a cluster connection reads from a command and its reply: the key that routes the command,
// and the redirections and transient errors a cluster node answers with.
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <redislock/connection.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

/// Case-insensitive ASCII comparison; command names may come in any case.
inline bool same_command_word(std::string_view a, std::string_view b) noexcept {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::toupper(static_cast<unsigned char>(x)) ==
                      std::toupper(static_cast<unsigned char>(y));
           });
}

/// The key that decides which node serves `argv`, or std::nullopt for a command that any node
/// serves (SCRIPT, PING, CLUSTER, PUBLISH, ...). Scripts and functions are routed by their first
/// declared key; a script without keys runs anywhere.
inline std::optional<std::string_view> routing_key(command argv) noexcept {
    if (argv.size() < 2) {
        return std::nullopt;
    }
    const std::string_view name = argv[0];
    static constexpr std::array<std::string_view, 6> scripted{"EVALSHA", "EVAL",  "EVALSHA_RO",
                                                              "EVAL_RO", "FCALL", "FCALL_RO"};
    for (std::string_view s : scripted) {
        if (same_command_word(name, s)) {
            if (argv.size() < 4) {
                return std::nullopt;
            }
            std::uint64_t keys = 0;
            const auto [end, ec] =
                std::from_chars(argv[2].data(), argv[2].data() + argv[2].size(), keys);
            if (ec != std::errc{} || end != argv[2].data() + argv[2].size() || keys == 0) {
                return std::nullopt;
            }
            return argv[3];
        }
    }
    static constexpr std::array<std::string_view, 27> keyless{
        "SCRIPT",  "PING",     "ECHO",      "INFO",    "CLUSTER", "TIME",      "CLIENT",
        "CONFIG",  "DBSIZE",   "FLUSHALL",  "FLUSHDB", "PUBLISH", "SUBSCRIBE", "PSUBSCRIBE",
        "WAIT",    "READONLY", "READWRITE", "ASKING",  "AUTH",    "SELECT",    "HELLO",
        "COMMAND", "ROLE",     "FUNCTION",  "ACL",     "SCAN",    "KEYS"};
    for (std::string_view k : keyless) {
        if (same_command_word(name, k)) {
            return std::nullopt;
        }
    }
    if (same_command_word(name, "OBJECT") || same_command_word(name, "MEMORY") ||
        same_command_word(name, "XINFO")) {
        return argv.size() > 2 ? std::optional{argv[2]} : std::nullopt;
    }
    return argv[1];
}

/// A MOVED or ASK redirection: the slot and the node that serves it.
struct redirection {
    bool ask = false;
    std::uint16_t slot = 0;
    std::string host;
    int port = 0;

    std::string address() const { return host + ":" + std::to_string(port); }
};

/// Parses "MOVED 3999 127.0.0.1:6381" or "ASK 3999 127.0.0.1:6381"; std::nullopt for any other
/// reply. An empty host ("MOVED 3999 :6381") means the node that answered.
inline std::optional<redirection> parse_redirection(const reply& r) {
    if (!r.is_error()) {
        return std::nullopt;
    }
    std::string_view text = r.text();
    redirection out;
    if (text.starts_with("MOVED ")) {
        text.remove_prefix(6);
    } else if (text.starts_with("ASK ")) {
        text.remove_prefix(4);
        out.ask = true;
    } else {
        return std::nullopt;
    }
    const auto space = text.find(' ');
    if (space == std::string_view::npos) {
        return std::nullopt;
    }
    const auto slot_text = text.substr(0, space);
    unsigned slot = 0;
    if (auto [end, ec] =
            std::from_chars(slot_text.data(), slot_text.data() + slot_text.size(), slot);
        ec != std::errc{} || slot >= 16384) {
        return std::nullopt;
    }
    out.slot = static_cast<std::uint16_t>(slot);
    const auto address = text.substr(space + 1);
    const auto colon = address.rfind(':');
    if (colon == std::string_view::npos) {
        return std::nullopt;
    }
    const auto port_text = address.substr(colon + 1);
    if (auto [end, ec] =
            std::from_chars(port_text.data(), port_text.data() + port_text.size(), out.port);
        ec != std::errc{} || out.port <= 0 || out.port > 65535) {
        return std::nullopt;
    }
    std::string_view host = address.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
        host = host.substr(1, host.size() - 2);
    }
    out.host = std::string{host};
    return out;
}

/// Errors after which the same command may succeed a moment later: a slot being moved
/// (TRYAGAIN), a cluster that lost a master (CLUSTERDOWN), a node loading its data (LOADING) or
/// whose master is unreachable (MASTERDOWN).
inline bool is_transient_cluster_error(const reply& r) noexcept {
    return r.is_error() &&
           (r.text().starts_with("TRYAGAIN") || r.text().starts_with("CLUSTERDOWN") ||
            r.text().starts_with("LOADING") || r.text().starts_with("MASTERDOWN"));
}

}  // namespace redislock::detail
