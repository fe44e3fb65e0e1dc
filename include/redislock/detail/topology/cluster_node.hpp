// detail::cluster_node: one node of a Redis Cluster, where it is and its connection pool once one
// was needed; and the seed list of a cluster URI (cluster_seeds_from_uri).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/engine/reconnect_relay.hpp>
#include <redislock/detail/topology/cluster_command.hpp>
#include <redislock/detail/topology/cluster_map.hpp>
#include <redislock/detail/topology/cluster_slot.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

/// One node of the cluster: where it is, and its pool of connections once one was needed.
class cluster_node {
public:
    /// `relay`, when given, hears of every connection the node's pool opens in place of one that
    /// broke; it must outlive the node.
    explicit cluster_node(endpoint config, const reconnect_relay* relay = nullptr)
        : config_{std::move(config)}, address_{config_.describe()}, relay_{relay} {}
    cluster_node(const cluster_node&) = delete;
    cluster_node& operator=(const cluster_node&) = delete;
    ~cluster_node() { delete pool_.load(std::memory_order_acquire); }

    const std::string& address() const noexcept { return address_; }
    const endpoint& config() const noexcept { return config_; }

    /// The node's pool, made on first use without connecting (and without a lock: a fork can
    /// never find one held): its first call opens a connection, bounded by that call's deadline.
    /// @throws redislock::invalid_argument when the pool cannot be made (TLS files).
    hiredis_connection& connection() {
        if (hiredis_connection* ready = pool_.load(std::memory_order_acquire)) {
            return *ready;
        }
        auto made = std::make_unique<hiredis_connection>(config_, defer_connect);
        if (relay_ != nullptr) {
            // Before the pool is published: no other thread can be using it yet.
            made->set_reconnect_handler(relay_->forward());
        }
        hiredis_connection* first = nullptr;
        if (pool_.compare_exchange_strong(first, made.get(), std::memory_order_acq_rel)) {
            return *made.release();
        }
        return *first;  // another thread made one first; ours is dropped
    }

    std::atomic<std::uint64_t> round_trips{0};
    /// The node's last slot-map read failed: the next refresh asks it last.
    std::atomic<bool> map_read_failed{false};

private:
    endpoint config_;
    std::string address_;
    const reconnect_relay* relay_;
    std::atomic<hiredis_connection*> pool_{nullptr};
};

/// Splits redis://[user:password@]host:port[,host:port...][?query] into one endpoint per seed.
inline std::vector<endpoint> cluster_seeds_from_uri(std::string_view uri) {
    constexpr std::string_view scheme = "redis://";
    if (!uri.starts_with(scheme)) {
        bad_uri(uri, "a cluster URI must start with redis://");
    }
    std::string_view rest = uri.substr(scheme.size());
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
    std::vector<endpoint> seeds;
    while (!rest.empty() || seeds.empty()) {
        const auto comma = rest.find(',');
        const std::string_view host = rest.substr(0, comma);
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        if (host.empty()) {
            bad_uri(uri, "empty seed address");
        }
        endpoint ep = endpoint::from_uri(std::string{scheme} + std::string{userinfo} +
                                         std::string{host} + std::string{query});
        if (ep.db != 0) {
            bad_uri(uri, "a Redis Cluster has only database 0");
        }
        seeds.push_back(std::move(ep));
        if (comma == std::string_view::npos) {
            break;
        }
    }
    return seeds;
}

}  // namespace redislock::detail
