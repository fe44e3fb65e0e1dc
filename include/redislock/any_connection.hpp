// redislock::any_connection: one connection type for every topology, chosen by the URI at run
// time. It holds a hiredis_connection (one node), a hiredis_cluster_connection or a
// sentinel_connection, and is what redislock::client talks through:
//
//   redislock::client one{"redis://127.0.0.1:6379"};
//   redislock::client ha{"redis-sentinel://10.0.0.1:26379,10.0.0.2:26379#mymaster"};
//   redislock::client sharded{"redis-cluster://10.0.1.1:7000,10.0.1.2:7000"};
//
// Schemes (docs/uri.md has every option):
//   redis://, rediss://, unix://                one node (endpoint.hpp); one host only: a list
//                                               of hosts is refused, naming the two schemes below
//   redis-sentinel://, rediss-sentinel://       the master Sentinel names (sentinel_endpoint.hpp)
//   redis-cluster://h1:p1[,h2:p2...][?options]  a Redis Cluster from its seeds (cluster.hpp)
//   rediss-cluster://...                        the same over TLS (the TLS options of rediss://),
//                                               in a build with TLS (REDISLOCK_HAVE_TLS)
//
// Connecting: the constructor checks the URI and the settings and opens nothing, so a service
// may start before its Redis does. The first call connects (reads the slot map, asks the
// sentinels) within its own deadline, and a failed connect is that call's error
// (connection_error, timeout_error), as a later reconnection would be. Only a malformed URI or
// option throws at construction (invalid_argument). A connection made from a ready concrete
// connection keeps that one as it is. (A client given an event hook asks the server for its
// eviction policy as it is made, which connects then: best-effort, bounded by the command
// timeout, and a failure there is not reported.)
//
// Cost: each command is one virtual call into the connection held, which then runs exactly as
// it would on its own; nothing is allocated per command beyond what that connection allocates.
//
// Thread safety: every member but the move operations and set_reconnect_handler() (see the
// connection held) may be called from any number of threads.
// Lifetime: movable, not copyable; a moved-from any_connection may only be destroyed or
// assigned to. Subscriber links must not outlive it.
#pragma once

#include <chrono>
#include <concepts>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/cluster.hpp>
#include <redislock/connection.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>
#include <redislock/sentinel.hpp>
#include <redislock/sentinel_endpoint.hpp>
#include <redislock/subscriber.hpp>

namespace redislock {

/// Which kind of connection an any_connection holds.
enum class topology {
    node,      ///< hiredis_connection: one server
    sentinel,  ///< sentinel_connection: the master Sentinel names
    cluster,   ///< hiredis_cluster_connection: a Redis Cluster
};

namespace detail {

/// What any_connection forwards to the connection it holds: one virtual call per command.
class connection_model {
public:
    virtual ~connection_model() = default;
    virtual reply execute(command argv) = 0;
    virtual reply execute(command argv, const call_context& how) = 0;
    virtual std::vector<reply> execute_pipeline(std::span<const command> commands) = 0;
    virtual std::vector<reply> execute_pipeline(std::span<const command> commands,
                                                std::span<const call_context> hows) = 0;
    virtual std::unique_ptr<subscriber_link> open_subscriber(std::string_view channel) = 0;
    virtual void set_reconnect_handler(std::function<void(std::string_view)> handler) = 0;
    virtual std::string node_for_key(std::string_view key) const = 0;
    virtual std::string subscriber_node(std::string_view channel) const = 0;
};

template <class C>
class connection_holder final : public connection_model {
public:
    explicit connection_holder(C conn) : conn_{std::move(conn)} {}

    reply execute(command argv) override { return conn_.execute(argv); }
    reply execute(command argv, const call_context& how) override {
        return conn_.execute(argv, how);
    }
    std::vector<reply> execute_pipeline(std::span<const command> commands) override {
        return conn_.execute_pipeline(commands);
    }
    std::vector<reply> execute_pipeline(std::span<const command> commands,
                                        std::span<const call_context> hows) override {
        return conn_.execute_pipeline(commands, hows);
    }
    std::unique_ptr<subscriber_link> open_subscriber(std::string_view channel) override {
        return conn_.open_subscriber(channel);
    }
    void set_reconnect_handler(std::function<void(std::string_view)> handler) override {
        conn_.set_reconnect_handler(std::move(handler));
    }

    // The server a key's cleanups go to (the reaper's lane): the node serving it in a cluster,
    // else the one server or the sentinels, as each connection type names them on its own.
    std::string node_for_key(std::string_view key) const override {
        if constexpr (std::same_as<C, hiredis_cluster_connection>) {
            return conn_.node_for_key(key);
        } else {
            return conn_.config().describe();
        }
    }

    // The subscriber link a channel's waiters share: per node in a cluster, else one for all.
    std::string subscriber_node(std::string_view channel) const override {
        if constexpr (std::same_as<C, hiredis_cluster_connection>) {
            return conn_.subscriber_node(channel);
        } else {
            return conn_.config().describe();
        }
    }

    C& get() noexcept { return conn_; }
    const C& get() const noexcept { return conn_; }

private:
    C conn_;
};

/// The scheme of `uri` up to "://", or empty.
inline std::string_view uri_scheme(std::string_view uri) {
    const auto end = uri.find("://");
    return end == std::string_view::npos ? std::string_view{} : uri.substr(0, end);
}

/// True when the authority of a redis:// or rediss:// URI lists several hosts.
inline bool lists_several_hosts(std::string_view uri) {
    std::string_view rest = uri.substr(uri.find("://") + 3);
    rest = rest.substr(0, rest.find_first_of("?#"));
    if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
        rest = rest.substr(at + 1);
    }
    return rest.substr(0, rest.find('/')).find(',') != std::string_view::npos;
}

/// The seeds of a redis-cluster:// or rediss-cluster:// URI, one endpoint each, with the
/// options (TLS ones too for rediss-cluster://) applied to every one.
inline std::vector<endpoint> cluster_seeds_from_scheme_uri(std::string_view uri, bool tls) {
    const std::string_view node_scheme = tls ? "rediss://" : "redis://";
    std::string_view rest = uri.substr(uri.find("://") + 3);
    std::string_view query;
    if (const auto q = rest.find('?'); q != std::string_view::npos) {
        query = rest.substr(q);
        rest = rest.substr(0, q);
    }
    std::string_view userinfo;
    if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
        userinfo = rest.substr(0, at + 1);
        rest = rest.substr(at + 1);
    }
    if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
        const std::string_view db = rest.substr(slash + 1);
        if (!db.empty() && db != "0") {
            bad_uri(uri, "a Redis Cluster has only database 0");
        }
        rest = rest.substr(0, slash);
    }
    std::vector<endpoint> seeds;
    for (;;) {
        const auto comma = rest.find(',');
        const std::string_view host = rest.substr(0, comma);
        if (host.empty()) {
            bad_uri(uri, "empty seed address");
        }
        endpoint ep = endpoint::from_uri(std::string{node_scheme} + std::string{userinfo} +
                                         std::string{host} + std::string{query});
        if (ep.db != 0) {
            bad_uri(uri, "a Redis Cluster has only database 0");
        }
        ep.check_tls();
        seeds.push_back(std::move(ep));
        if (comma == std::string_view::npos) {
            return seeds;
        }
        rest = rest.substr(comma + 1);
    }
}

}  // namespace detail

/// A connection to any topology, chosen at run time (see the top of this header). Models
/// redislock::connection with every optional capability a client uses.
class any_connection {
public:
    /// The settings every topology states: what the client bounds untimed calls by, and how it
    /// names the server in events.
    struct settings {
        /// Longest time one untimed command waits for its reply (Sentinel: the data nodes').
        std::chrono::milliseconds command_timeout{2000};
        /// "host:port", the socket path, the sentinels or the first cluster seed.
        std::string description;
        /// The description, for messages and events.
        const std::string& describe() const noexcept { return description; }
    };

    /// Picks the topology from the URI's scheme and checks the URI and settings; connects
    /// nothing (the first call does, within its deadline).
    /// @throws redislock::invalid_argument for an unknown scheme, a malformed URI or option, a
    ///         list of hosts in a redis:// or rediss:// URI, or TLS in a build without it.
    explicit any_connection(std::string_view uri) : any_connection{from_uri(uri)} {}

    /// One server, connected on the first call.
    /// @throws redislock::invalid_argument as hiredis_connection's constructor.
    explicit any_connection(endpoint ep)
        : any_connection{hiredis_connection{std::move(ep), defer_connect}} {}

    /// The master Sentinel names, found on the first call.
    /// @throws redislock::invalid_argument as sentinel_connection's constructor.
    explicit any_connection(sentinel_endpoint config)
        : any_connection{sentinel_connection{std::move(config), defer_connect}} {}

    /// Takes over a ready connection to one server.
    explicit any_connection(hiredis_connection conn)
        : any_connection{topology::node, conn.config().command_timeout, conn.config().describe(),
                         std::move(conn)} {}

    /// Takes over a ready connection to a Redis Cluster.
    explicit any_connection(hiredis_cluster_connection conn)
        : any_connection{topology::cluster, conn.config().command_timeout, conn.config().describe(),
                         std::move(conn)} {}

    /// Takes over a ready connection to the master Sentinel names.
    explicit any_connection(sentinel_connection conn)
        : any_connection{topology::sentinel, conn.config().node.command_timeout,
                         conn.config().describe(), std::move(conn)} {}

    /// Moves the held connection; the moved-from one holds none and may only be destroyed or
    /// assigned to.
    any_connection(any_connection&&) noexcept = default;
    /// Moves the held connection, closing the one this held.
    any_connection& operator=(any_connection&&) noexcept = default;
    ~any_connection() = default;

    /// Sends one command. @throws as the connection held: connection_error, timeout_error
    reply execute(command argv) { return impl_->execute(argv); }

    /// Sends one command, routed by how.key and bounded by how.deadline and *how.stop.
    /// @throws as the connection held: connection_error, timeout_error, cancelled_error
    reply execute(command argv, const call_context& how) { return impl_->execute(argv, how); }

    /// Sends every command in one round trip per server; replies in command order.
    std::vector<reply> execute_pipeline(std::span<const command> commands) {
        return impl_->execute_pipeline(commands);
    }

    /// As execute_pipeline(commands), hows[i] going with commands[i].
    std::vector<reply> execute_pipeline(std::span<const command> commands,
                                        std::span<const call_context> hows) {
        return impl_->execute_pipeline(commands, hows);
    }

    /// A subscriber link for `channel`'s waiters (see subscriber.hpp).
    /// @throws redislock::connection_error
    std::unique_ptr<subscriber_link> open_subscriber(std::string_view channel) {
        return impl_->open_subscriber(channel);
    }

    /// The name of the link `channel`'s waiters share: the node serving it in a cluster (empty
    /// when the slot map does not say yet), else one name for every channel.
    std::string subscriber_node(std::string_view channel) const {
        return impl_->subscriber_node(channel);
    }

    /// The server a key lives on: the node serving it in a cluster (empty when the slot map
    /// does not say yet), else the one server or the sentinels.
    std::string node_for_key(std::string_view key) const { return impl_->node_for_key(key); }

    /// Calls `handler` with the server's address each time a connection is reopened after one
    /// broke; see the connection held. Set it before the connection is shared between threads.
    void set_reconnect_handler(std::function<void(std::string_view server)> handler) {
        impl_->set_reconnect_handler(std::move(handler));
    }

    /// The command timeout and the description of the servers.
    const settings& config() const noexcept { return settings_; }

    /// Which kind of connection this holds.
    topology kind() const noexcept { return kind_; }

    /// The connection held when it is a C (hiredis_connection, hiredis_cluster_connection or
    /// sentinel_connection), for its own members (counters, the master, the slot map); else
    /// nullptr.
    template <class C>
    C* get() noexcept {
        if (!holds<C>()) {
            return nullptr;
        }
        return &static_cast<detail::connection_holder<C>*>(impl_.get())->get();
    }

    /// As get(), read-only.
    template <class C>
    const C* get() const noexcept {
        if (!holds<C>()) {
            return nullptr;
        }
        return &static_cast<const detail::connection_holder<C>*>(impl_.get())->get();
    }

    /// The connection `uri` names, not connected yet (see the constructor).
    /// @throws redislock::invalid_argument
    static any_connection from_uri(std::string_view uri) {
        const std::string_view scheme = detail::uri_scheme(uri);
        if (scheme == "redis" || scheme == "rediss" || scheme == "unix") {
            if (scheme != "unix" && detail::lists_several_hosts(uri)) {
                detail::bad_uri(uri,
                                "one host only: for a Redis Cluster use redis-cluster://h1,h2 "
                                "(or rediss-cluster://), for Sentinel "
                                "redis-sentinel://h1,h2#master (or rediss-sentinel://)");
            }
            return any_connection{endpoint::from_uri(uri)};
        }
        if (scheme == "redis-sentinel" || scheme == "rediss-sentinel") {
            return any_connection{sentinel_endpoint::from_uri(uri)};
        }
        if (scheme == "redis-cluster" || scheme == "rediss-cluster") {
            std::vector<endpoint> seeds =
                detail::cluster_seeds_from_scheme_uri(uri, scheme == "rediss-cluster");
            detail::require_tls_support(seeds.front());
            return any_connection{hiredis_cluster_connection{std::move(seeds), defer_connect}};
        }
        detail::bad_uri(uri,
                        "the scheme must be redis://, rediss://, unix://, redis-sentinel://, "
                        "rediss-sentinel://, redis-cluster:// or rediss-cluster://");
    }

private:
    // Whether the connection held is a C: each topology holds one type (no RTTI needed).
    template <class C>
    bool holds() const noexcept {
        if (impl_ == nullptr) {
            return false;
        }
        if constexpr (std::same_as<C, hiredis_connection>) {
            return kind_ == topology::node;
        } else if constexpr (std::same_as<C, sentinel_connection>) {
            return kind_ == topology::sentinel;
        } else if constexpr (std::same_as<C, hiredis_cluster_connection>) {
            return kind_ == topology::cluster;
        } else {
            return false;
        }
    }

    template <class C>
    any_connection(topology kind, std::chrono::milliseconds command_timeout,
                   std::string description, C conn)
        : impl_{std::make_unique<detail::connection_holder<C>>(std::move(conn))},
          settings_{command_timeout, std::move(description)},
          kind_{kind} {}

    std::unique_ptr<detail::connection_model> impl_;
    settings settings_;
    topology kind_;
};

}  // namespace redislock
