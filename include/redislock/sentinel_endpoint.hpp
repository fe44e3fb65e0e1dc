// redislock::sentinel_endpoint: the sentinels, the master name and the data-node settings of a
// Sentinel deployment, parsed from a URI.
//
//   redis-sentinel://[[user]:password@]host[:port][,host[:port]...][/db][?options]#master-name
//   rediss-sentinel://...                  the same, with TLS to the sentinels and the data nodes
//
// (the form Lettuce uses). The hosts are sentinels (default port 26379); user, password, db and
// the query options of redis:// / rediss:// (timeouts, pool_size, tls_*) apply to the data nodes.
// The sentinels take their own credentials from the query: sentinel_user, sentinel_password
// (default: none). The master name may also be given as the option master_name.
//
// Thread safety: a plain value type. Parsing throws redislock::invalid_argument.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>

namespace redislock {

/// Where the sentinels are, which master to follow, and how to talk to the data nodes.
struct sentinel_endpoint {
    /// One sentinel's address.
    struct address {
        /// Host name or IP address.
        std::string host;
        /// TCP port.
        int port = 26379;
    };

    /// The sentinels asked for the master, in order.
    std::vector<address> sentinels;
    /// The name the sentinels know the master by.
    std::string master_name;
    std::string sentinel_user;      ///< ACL user for the sentinels; empty: AUTH with the password
    std::string sentinel_password;  ///< empty: the sentinels need no AUTH
    endpoint node;  ///< data-node settings (credentials, db, timeouts, pool, TLS); host and port
                    ///< are replaced by the master's

    /// Parses a URI as described at the top of this header.
    /// @throws redislock::invalid_argument naming what is wrong with the URI.
    static sentinel_endpoint from_uri(std::string_view uri);

    /// The endpoint used to talk to one sentinel.
    endpoint sentinel(const address& where) const {
        endpoint ep = node;
        ep.host = where.host;
        ep.port = where.port;
        ep.unix_socket.clear();
        ep.user = sentinel_user;
        ep.password = sentinel_password;
        ep.db = 0;
        ep.pool_size = 1;
        return ep;
    }

    /// "host:port,host:port" for messages.
    std::string describe() const {
        std::string text;
        for (const address& a : sentinels) {
            text += (text.empty() ? "" : ",") + a.host + ":" + std::to_string(a.port);
        }
        return text;
    }
};

inline sentinel_endpoint sentinel_endpoint::from_uri(std::string_view uri) {
    sentinel_endpoint out;
    std::string_view rest = uri;
    if (auto hash = rest.find('#'); hash != std::string_view::npos) {
        out.master_name = detail::percent_decode(uri, rest.substr(hash + 1));
        rest = rest.substr(0, hash);
    }
    std::string_view query;
    if (auto q = rest.find('?'); q != std::string_view::npos) {
        query = rest.substr(q + 1);
        rest = rest.substr(0, q);
    }
    constexpr std::string_view plain_scheme = "redis-sentinel://";
    constexpr std::string_view tls_scheme = "rediss-sentinel://";
    if (rest.starts_with(tls_scheme)) {
        out.node.tls.enabled = true;
        rest.remove_prefix(tls_scheme.size());
    } else if (rest.starts_with(plain_scheme)) {
        rest.remove_prefix(plain_scheme.size());
    } else {
        detail::bad_uri(uri, "the scheme must be redis-sentinel:// or rediss-sentinel://");
    }
    if (auto at = rest.rfind('@'); at != std::string_view::npos) {
        detail::parse_userinfo(uri, rest.substr(0, at), out.node.user, out.node.password);
        rest = rest.substr(at + 1);
    }
    std::string_view hosts = rest;
    // A '/' before the first ']' or after the last one starts the db; IPv6 hosts have none.
    if (auto slash =
            rest.find('/', rest.rfind(']') == std::string_view::npos ? 0 : rest.rfind(']'));
        slash != std::string_view::npos) {
        hosts = rest.substr(0, slash);
        if (auto db = rest.substr(slash + 1); !db.empty()) {
            out.node.db = detail::parse_uri_number<int>(uri, "db", db, 0);
        }
    }
    while (!hosts.empty() || out.sentinels.empty()) {
        const auto comma = hosts.find(',');
        address a;
        detail::parse_host_port(uri, hosts.substr(0, comma), a.host, a.port);
        out.sentinels.push_back(std::move(a));
        hosts = comma == std::string_view::npos ? std::string_view{} : hosts.substr(comma + 1);
        if (comma != std::string_view::npos && hosts.empty()) {
            detail::bad_uri(uri, "empty sentinel address after ','");
        }
    }
    detail::apply_uri_query(out.node, uri, query,
                            [&](std::string_view key, std::string_view value) {
                                if (key == "sentinel_user") {
                                    out.sentinel_user = detail::percent_decode(uri, value);
                                } else if (key == "sentinel_password") {
                                    out.sentinel_password = detail::percent_decode(uri, value);
                                } else if (key == "master_name") {
                                    out.master_name = detail::percent_decode(uri, value);
                                } else {
                                    return false;
                                }
                                return true;
                            });
    if (out.master_name.empty()) {
        detail::bad_uri(uri, "no master name: end the URI with #master-name");
    }
    detail::check_tls_options(out.node.tls, [&](const char* why) { detail::bad_uri(uri, why); });
    return out;
}

}  // namespace redislock
