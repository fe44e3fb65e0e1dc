// redislock::endpoint: where a Redis server is and how to talk to it, parsed from a URI.
//
//   redis://[[user]:password@]host[:port][/db][?option=value&...]
//   unix:///path/to/redis.sock[?option=value&...]
//
// Options in the query: db, user, password, connect_timeout (ms), command_timeout (ms),
// pool_size. user and password may be percent-encoded. An IPv6 host is written in brackets:
// redis://[::1]:6379.
#pragma once

#include <charconv>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include <redislock/error.hpp>

namespace redislock {

struct endpoint {
    std::string host = "127.0.0.1";
    int port = 6379;
    std::string unix_socket;  ///< when not empty, connect to this socket instead of host:port
    std::string user;         ///< ACL user; empty means AUTH with the password alone
    std::string password;     ///< empty means no AUTH
    int db = 0;               ///< SELECT'ed on every new connection when not 0
    std::chrono::milliseconds connect_timeout{2000};
    std::chrono::milliseconds command_timeout{2000};
    std::size_t pool_size = 8;  ///< most connections open at once

    /// Parses a URI as described at the top of this header.
    /// @throws redislock::invalid_argument naming what is wrong with the URI.
    static endpoint from_uri(std::string_view uri);

    /// "host:port" or the socket path, for messages.
    std::string describe() const {
        return unix_socket.empty() ? host + ":" + std::to_string(port) : unix_socket;
    }
};

namespace detail {

[[noreturn]] inline void bad_uri(std::string_view uri, std::string_view why) {
    throw invalid_argument{"redislock: bad Redis URI '" + std::string{uri} +
                           "': " + std::string{why}};
}

template <class Int>
Int parse_uri_number(std::string_view uri, std::string_view what, std::string_view text,
                     Int min_value) {
    Int value{};
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || end != text.data() + text.size() || value < min_value) {
        bad_uri(uri, std::string{what} + " '" + std::string{text} + "' is not a valid number");
    }
    return value;
}

inline std::string percent_decode(std::string_view uri, std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '%') {
            out += text[i];
            continue;
        }
        unsigned value = 0;
        if (i + 2 >= text.size()) {
            bad_uri(uri, "truncated percent escape");
        }
        auto [end, ec] = std::from_chars(text.data() + i + 1, text.data() + i + 3, value, 16);
        if (ec != std::errc{} || end != text.data() + i + 3) {
            bad_uri(uri, "bad percent escape");
        }
        out += static_cast<char>(value);
        i += 2;
    }
    return out;
}

inline void apply_uri_query(endpoint& ep, std::string_view uri, std::string_view query) {
    while (!query.empty()) {
        auto amp = query.find('&');
        auto pair = query.substr(0, amp);
        query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
        auto eq = pair.find('=');
        if (eq == std::string_view::npos) {
            bad_uri(uri, "query option '" + std::string{pair} + "' has no value");
        }
        auto key = pair.substr(0, eq);
        auto value = pair.substr(eq + 1);
        if (key == "db") {
            ep.db = parse_uri_number<int>(uri, "db", value, 0);
        } else if (key == "user") {
            ep.user = percent_decode(uri, value);
        } else if (key == "password") {
            ep.password = percent_decode(uri, value);
        } else if (key == "connect_timeout") {
            ep.connect_timeout =
                std::chrono::milliseconds{parse_uri_number<long long>(uri, key, value, 1)};
        } else if (key == "command_timeout") {
            ep.command_timeout =
                std::chrono::milliseconds{parse_uri_number<long long>(uri, key, value, 1)};
        } else if (key == "pool_size") {
            ep.pool_size = parse_uri_number<std::size_t>(uri, key, value, 1);
        } else {
            bad_uri(uri, "unknown query option '" + std::string{key} + "'");
        }
    }
}

}  // namespace detail

inline endpoint endpoint::from_uri(std::string_view uri) {
    endpoint ep;
    std::string_view rest = uri;
    std::string_view query;
    if (auto q = rest.find('?'); q != std::string_view::npos) {
        query = rest.substr(q + 1);
        rest = rest.substr(0, q);
    }

    constexpr std::string_view unix_scheme = "unix://";
    constexpr std::string_view redis_scheme = "redis://";
    if (rest.starts_with(unix_scheme)) {
        rest.remove_prefix(unix_scheme.size());
        if (!rest.starts_with('/')) {
            detail::bad_uri(uri, "a unix socket path must be absolute (unix:///path)");
        }
        ep.unix_socket = std::string{rest};
        detail::apply_uri_query(ep, uri, query);
        return ep;
    }
    if (!rest.starts_with(redis_scheme)) {
        detail::bad_uri(uri, "the scheme must be redis:// or unix://");
    }
    rest.remove_prefix(redis_scheme.size());

    if (auto at = rest.rfind('@'); at != std::string_view::npos) {
        auto userinfo = rest.substr(0, at);
        rest = rest.substr(at + 1);
        auto colon = userinfo.find(':');
        if (colon == std::string_view::npos) {
            ep.password = detail::percent_decode(uri, userinfo);
        } else {
            ep.user = detail::percent_decode(uri, userinfo.substr(0, colon));
            ep.password = detail::percent_decode(uri, userinfo.substr(colon + 1));
        }
    }

    std::string_view hostport = rest;
    if (auto slash = rest.find('/'); slash != std::string_view::npos) {
        hostport = rest.substr(0, slash);
        auto db = rest.substr(slash + 1);
        if (!db.empty()) {
            ep.db = detail::parse_uri_number<int>(uri, "db", db, 0);
        }
    }

    std::string_view port;
    if (hostport.starts_with('[')) {
        auto close = hostport.find(']');
        if (close == std::string_view::npos) {
            detail::bad_uri(uri, "unclosed '[' in the host");
        }
        ep.host = std::string{hostport.substr(1, close - 1)};
        auto after = hostport.substr(close + 1);
        if (!after.empty()) {
            if (!after.starts_with(':')) {
                detail::bad_uri(uri, "expected ':' after the IPv6 host");
            }
            port = after.substr(1);
        }
    } else if (auto colon = hostport.rfind(':'); colon != std::string_view::npos) {
        ep.host = std::string{hostport.substr(0, colon)};
        port = hostport.substr(colon + 1);
    } else {
        ep.host = std::string{hostport};
    }
    if (ep.host.empty()) {
        detail::bad_uri(uri, "no host");
    }
    if (!port.empty()) {
        ep.port = detail::parse_uri_number<int>(uri, "port", port, 1);
        if (ep.port > 65535) {
            detail::bad_uri(uri, "port " + std::string{port} + " is out of range");
        }
    }
    detail::apply_uri_query(ep, uri, query);
    return ep;
}

}  // namespace redislock
