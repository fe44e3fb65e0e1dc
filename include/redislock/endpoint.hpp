// redislock::endpoint: where a Redis server is and how to talk to it, parsed from a URI.
//
//   redis://[[user]:password@]host[:port][/db][?option=value&...]
//   rediss://[[user]:password@]host[:port][/db][?option=value&...]      (TLS)
//   unix:///path/to/redis.sock[?option=value&...]
//
// Options in the query: db, user, password, connect_timeout (ms), command_timeout (ms),
// pool_size. user, password and file names may be percent-encoded. An IPv6 host is written in
// brackets: redis://[::1]:6379.
//
// TLS options, for rediss:// only (anywhere else they are an error, not silently ignored):
//   tls_ca_file=PATH      trust the CAs in this PEM file instead of the system's
//   tls_ca_dir=PATH       trust the CAs in this OpenSSL hashed directory
//   tls_cert_file=PATH    client certificate (mutual TLS); needs tls_key_file
//   tls_key_file=PATH     the client certificate's private key; needs tls_cert_file
//   tls_server_name=NAME  SNI, and the name the certificate must carry (default: the host)
//   tls_verify=full       (default) the chain must lead to a trusted CA and the certificate
//                         must name the host (or tls_server_name)
//   tls_verify=ca         the chain is checked, the name is not
//   tls_verify=none       no check at all (tests only; a man in the middle goes unnoticed).
//                         Cannot be combined with tls_ca_file or tls_ca_dir.
// Whether rediss:// can be used depends on the hiredis the program was built with (see
// hiredis.hpp); the parser accepts it either way.
#pragma once

#include <charconv>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include <redislock/error.hpp>

namespace redislock {

/// How a TLS connection checks the server's certificate.
enum class tls_verify {
    full,     ///< chain to a trusted CA, and the certificate names the host
    ca_only,  ///< chain to a trusted CA, any name
    none,     ///< no check (tests only)
};

/// TLS settings of an endpoint; used only when `enabled` (rediss://).
struct tls_options {
    /// True for rediss://: every connection uses TLS.
    bool enabled = false;
    std::string ca_file;      ///< PEM bundle of trusted CAs; empty: the system's
    std::string ca_dir;       ///< OpenSSL hashed CA directory
    std::string cert_file;    ///< client certificate (PEM) for mutual TLS
    std::string key_file;     ///< its private key (PEM)
    std::string server_name;  ///< SNI and expected name; empty: the endpoint's host
    /// How the server's certificate is checked.
    tls_verify verify = tls_verify::full;
};

/// Where a Redis server is and how to talk to it; from_uri() parses the URI forms listed at the top
/// of this header.
struct endpoint {
    /// Host name or IP address (an IPv6 address without its brackets).
    std::string host = "127.0.0.1";
    /// TCP port.
    int port = 6379;
    std::string unix_socket;  ///< when not empty, connect to this socket instead of host:port
    std::string user;         ///< ACL user; empty means AUTH with the password alone
    std::string password;     ///< empty means no AUTH
    int db = 0;               ///< SELECT'ed on every new connection when not 0
    /// Longest time opening one connection may take (TCP connect and TLS handshake); a call
    /// with a deadline cuts it to the time it has left. 1 ms to 365 days: a connection refuses
    /// other values (redislock::invalid_argument) when it is made.
    std::chrono::milliseconds connect_timeout{2000};
    /// Longest time one command may wait for its reply (each of AUTH and SELECT on a new
    /// connection too); a call with a deadline cuts it to the time it has left. 1 ms to 365 days:
    /// a connection refuses other values (redislock::invalid_argument) when it is made.
    std::chrono::milliseconds command_timeout{2000};
    std::size_t pool_size = 8;  ///< most connections open at once
    tls_options tls;            ///< rediss://: how to set up TLS

    /// Parses a URI as described at the top of this header.
    /// @throws redislock::invalid_argument naming what is wrong with the URI.
    static endpoint from_uri(std::string_view uri);

    /// "host:port" or the socket path, for messages.
    std::string describe() const {
        return unix_socket.empty() ? host + ":" + std::to_string(port) : unix_socket;
    }

    /// Checks the TLS settings for contradictions (from_uri does this for URIs).
    /// @throws redislock::invalid_argument naming what is wrong.
    void check_tls() const;
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

inline void apply_tls_option(tls_options& tls, std::string_view uri, std::string_view key,
                             std::string_view value) {
    if (key == "tls_verify") {
        if (value == "full" || value == "true") {
            tls.verify = tls_verify::full;
        } else if (value == "ca") {
            tls.verify = tls_verify::ca_only;
        } else if (value == "none" || value == "false") {
            tls.verify = tls_verify::none;
        } else {
            bad_uri(uri, "tls_verify must be full, ca or none (true/false), not '" +
                             std::string{value} + "'");
        }
        return;
    }
    std::string* target = key == "tls_ca_file"       ? &tls.ca_file
                          : key == "tls_ca_dir"      ? &tls.ca_dir
                          : key == "tls_cert_file"   ? &tls.cert_file
                          : key == "tls_key_file"    ? &tls.key_file
                          : key == "tls_server_name" ? &tls.server_name
                                                     : nullptr;
    if (target == nullptr) {
        bad_uri(uri, "unknown TLS option '" + std::string{key} +
                         "' (known: tls_ca_file, tls_ca_dir, tls_cert_file, tls_key_file, "
                         "tls_server_name, tls_verify)");
    }
    *target = percent_decode(uri, value);
    if (target->empty()) {
        bad_uri(uri, "option '" + std::string{key} + "' is empty");
    }
}

// The TLS settings that contradict each other; `fail` throws with the reason.
template <class Fail>
void check_tls_options(const tls_options& tls, Fail&& fail) {
    if (!tls.enabled) {
        if (!tls.ca_file.empty() || !tls.ca_dir.empty() || !tls.cert_file.empty() ||
            !tls.key_file.empty() || !tls.server_name.empty()) {
            fail("TLS options are set but TLS is not enabled");
        }
        return;
    }
    if (tls.cert_file.empty() != tls.key_file.empty()) {
        fail("a client certificate needs both tls_cert_file and tls_key_file");
    }
    if (tls.verify == tls_verify::none && (!tls.ca_file.empty() || !tls.ca_dir.empty())) {
        fail("tls_verify=none contradicts tls_ca_file/tls_ca_dir (nothing would be checked)");
    }
}

// A query option that is neither a connection nor a TLS option goes to `extra`, which returns
// false when it does not know it either (so another URI form can add options of its own).
template <class Extra>
void apply_uri_query(endpoint& ep, std::string_view uri, std::string_view query, Extra&& extra) {
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
        } else if (key.starts_with("tls_")) {
            if (!ep.tls.enabled) {
                bad_uri(uri, "option '" + std::string{key} +
                                 "' needs TLS: use rediss:// (or rediss-sentinel://)");
            }
            apply_tls_option(ep.tls, uri, key, value);
        } else if (!extra(key, value)) {
            bad_uri(uri, "unknown query option '" + std::string{key} + "'");
        }
    }
}

inline void apply_uri_query(endpoint& ep, std::string_view uri, std::string_view query) {
    apply_uri_query(ep, uri, query, [](std::string_view, std::string_view) { return false; });
}

// Splits "host[:port]" or "[v6]:port"; keeps `port` as it is when the text has none.
inline void parse_host_port(std::string_view uri, std::string_view hostport, std::string& host,
                            int& port) {
    std::string_view port_text;
    bool has_colon = false;  // "host:" with nothing after it is a mistake, not the default port
    if (hostport.starts_with('[')) {
        auto close = hostport.find(']');
        if (close == std::string_view::npos) {
            bad_uri(uri, "unclosed '[' in the host");
        }
        host = std::string{hostport.substr(1, close - 1)};
        auto after = hostport.substr(close + 1);
        if (!after.empty()) {
            if (!after.starts_with(':')) {
                bad_uri(uri, "expected ':' after the IPv6 host");
            }
            has_colon = true;
            port_text = after.substr(1);
        }
    } else if (auto colon = hostport.rfind(':'); colon != std::string_view::npos) {
        host = std::string{hostport.substr(0, colon)};
        has_colon = true;
        port_text = hostport.substr(colon + 1);
    } else {
        host = std::string{hostport};
    }
    if (host.empty()) {
        bad_uri(uri, "no host");
    }
    if (has_colon && port_text.empty()) {
        bad_uri(uri, "empty port after ':'");
    }
    if (!port_text.empty()) {
        port = parse_uri_number<int>(uri, "port", port_text, 1);
        if (port > 65535) {
            bad_uri(uri, "port " + std::string{port_text} + " is out of range");
        }
    }
}

// "[user:]password" before the '@'.
inline void parse_userinfo(std::string_view uri, std::string_view userinfo, std::string& user,
                           std::string& password) {
    auto colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
        password = percent_decode(uri, userinfo);
    } else {
        user = percent_decode(uri, userinfo.substr(0, colon));
        password = percent_decode(uri, userinfo.substr(colon + 1));
    }
}

}  // namespace detail

inline void endpoint::check_tls() const {
    detail::check_tls_options(tls, [](const char* why) {
        throw invalid_argument{std::string{"redislock: bad TLS settings: "} + why};
    });
}

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
    constexpr std::string_view rediss_scheme = "rediss://";
    if (rest.starts_with(unix_scheme)) {
        rest.remove_prefix(unix_scheme.size());
        if (!rest.starts_with('/')) {
            detail::bad_uri(uri, "a unix socket path must be absolute (unix:///path)");
        }
        ep.unix_socket = std::string{rest};
        detail::apply_uri_query(ep, uri, query);
        return ep;
    }
    if (rest.starts_with(rediss_scheme)) {
        ep.tls.enabled = true;
        rest.remove_prefix(rediss_scheme.size());
    } else if (rest.starts_with(redis_scheme)) {
        rest.remove_prefix(redis_scheme.size());
    } else {
        detail::bad_uri(uri, "the scheme must be redis://, rediss:// or unix://");
    }

    if (auto at = rest.rfind('@'); at != std::string_view::npos) {
        detail::parse_userinfo(uri, rest.substr(0, at), ep.user, ep.password);
        rest = rest.substr(at + 1);
    }

    std::string_view hostport = rest;
    if (auto slash = rest.find('/'); slash != std::string_view::npos) {
        hostport = rest.substr(0, slash);
        auto db = rest.substr(slash + 1);
        if (!db.empty()) {
            ep.db = detail::parse_uri_number<int>(uri, "db", db, 0);
        }
    }
    detail::parse_host_port(uri, hostport, ep.host, ep.port);
    detail::apply_uri_query(ep, uri, query);
    detail::check_tls_options(ep.tls, [&](const char* why) { detail::bad_uri(uri, why); });
    return ep;
}

}  // namespace redislock
