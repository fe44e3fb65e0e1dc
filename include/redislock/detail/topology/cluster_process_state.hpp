// What a hiredis_cluster_connection knows of the cluster: the settings and counters every process
// shares (cluster_shared), and the per-process state (cluster_process_state): the nodes, the slot
// map, the bookkeeping of slot-map reads and the scripts loaded. Per process: a forked child never
// touches its parent's mutexes, which a parent's thread may have held at the fork.
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
#include <redislock/detail/topology/cluster_node.hpp>
#include <redislock/detail/topology/cluster_slot.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

// Everything a process knows of the cluster. Per process (see the constructor): a child never
// touches its parent's mutexes, which a parent's thread may have held at the fork.
// What every process's state shares, and what a moved connection keeps: the settings, the
// reconnect handler, the counters.
struct cluster_shared {
    endpoint options;
    detail::reconnect_relay relay;
    std::atomic<std::uint64_t> refreshes{0};
    std::atomic<std::uint64_t> moved{0};
    std::atomic<std::uint64_t> asked{0};
};

struct cluster_process_state {
    cluster_process_state(const std::vector<endpoint>& seeds, const cluster_shared& shared,
                          cluster_process_state* parent)
        : options{shared.options}, relay{&shared.relay} {
        for (const endpoint& seed : seeds) {
            (void)node_at(seed.host, seed.port);
        }
        if (parent != nullptr) {
            inherit(*parent);
        }
    }

    endpoint options;
    const detail::reconnect_relay* relay;  // the connection's: outlives the nodes

    mutable std::mutex nodes_mutex;
    // Never erased while the connection lives: the slot table points into it.
    std::map<std::string, std::unique_ptr<detail::cluster_node>> nodes;

    mutable std::shared_mutex map_mutex;
    std::array<detail::cluster_node*, detail::cluster_slot_count> slots{};
    std::vector<detail::cluster_node*> masters;

    // Guards what follows; never held across a round trip. One slot-map read at a time:
    // `reading` is set while one is under way, and `read_done` announces its end.
    std::mutex refresh_mutex;
    std::condition_variable_any read_done;
    bool reading = false;
    steady::time_point last_refresh{};
    std::string last_refresh_problem;
    std::atomic<std::uint64_t> generation{0};

    std::mutex scripts_mutex;
    std::unordered_map<std::string, std::string> scripts;  // SHA1 -> source

    detail::cluster_node& node_at(const std::string& host, int port) {
        endpoint config = options;
        config.host = host;
        config.port = port;
        const std::string address = config.describe();
        std::lock_guard lock{nodes_mutex};
        auto& slot = nodes[address];
        if (!slot) {
            slot = std::make_unique<detail::cluster_node>(std::move(config), relay);
        }
        return *slot;
    }

    // Takes the parent's nodes, map and scripts, each only if its mutex is free: one a
    // parent's thread held at the fork may guard something half changed.
    void inherit(cluster_process_state& parent) {
        std::vector<std::pair<std::string, int>> known;
        if (parent.nodes_mutex.try_lock()) {
            for (const auto& [address, node] : parent.nodes) {
                known.emplace_back(node->config().host, node->config().port);
            }
            parent.nodes_mutex.unlock();
        }
        for (const auto& [host, port] : known) {
            (void)node_at(host, port);
        }
        if (parent.map_mutex.try_lock_shared()) {
            std::map<const detail::cluster_node*, detail::cluster_node*> mine;
            const auto translate = [&](const detail::cluster_node* theirs) {
                auto& ours = mine[theirs];
                if (ours == nullptr) {
                    ours = &node_at(theirs->config().host, theirs->config().port);
                }
                return ours;
            };
            for (std::size_t slot = 0; slot < slots.size(); ++slot) {
                if (parent.slots[slot] != nullptr) {
                    slots[slot] = translate(parent.slots[slot]);
                }
            }
            for (const detail::cluster_node* master : parent.masters) {
                masters.push_back(translate(master));
            }
            parent.map_mutex.unlock_shared();
        }
        if (parent.scripts_mutex.try_lock()) {
            scripts = parent.scripts;
            parent.scripts_mutex.unlock();
        }
    }
};

}  // namespace redislock::detail
