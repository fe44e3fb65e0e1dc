// Reading a Redis Cluster's slot map from CLUSTER SHARDS (Redis 7.0+) or CLUSTER SLOTS (older).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/reply.hpp>

namespace redislock::detail {

/// One master and the slot ranges it serves (both ends included).
struct shard_master {
    std::string host;
    int port = 0;
    std::vector<std::pair<std::uint16_t, std::uint16_t>> ranges;
};

inline std::optional<std::int64_t> slot_map_number(const reply& r) {
    if (r.is_integer()) {
        return r.as_integer();
    }
    if (r.is_string() || r.is_status()) {
        try {
            std::size_t used = 0;
            const long long value = std::stoll(r.text(), &used);
            if (used == r.text().size()) {
                return value;
            }
        } catch (const std::exception&) {
        }
    }
    return std::nullopt;
}

inline bool valid_slot_range(std::int64_t first, std::int64_t last) {
    return first >= 0 && last >= first && last < 16384;
}

/// Masters from a CLUSTER SHARDS reply (a list of maps, flattened to arrays over RESP2). A host
/// that is empty or "?" means the node that answered (`asked_host`). A shard without a master
/// reported healthy falls back to its master in any state, so its slots stay mapped.
inline std::vector<shard_master> parse_cluster_shards(const reply& r, std::string_view asked_host) {
    std::vector<shard_master> out;
    for (const reply& shard : r.elements()) {
        const auto& fields = shard.elements();
        const reply* slots = nullptr;
        const reply* nodes = nullptr;
        for (std::size_t i = 0; i + 1 < fields.size(); i += 2) {
            if (fields[i].text() == "slots") {
                slots = &fields[i + 1];
            } else if (fields[i].text() == "nodes") {
                nodes = &fields[i + 1];
            }
        }
        if (slots == nullptr || nodes == nullptr || slots->elements().empty()) {
            continue;
        }
        std::optional<shard_master> chosen;
        bool chosen_online = false;
        for (const reply& node : nodes->elements()) {
            shard_master m;
            std::string role;
            std::string health;
            std::string ip;
            std::string endpoint;
            const auto& attrs = node.elements();
            for (std::size_t i = 0; i + 1 < attrs.size(); i += 2) {
                const std::string& name = attrs[i].text();
                const reply& value = attrs[i + 1];
                if (name == "port") {
                    m.port = static_cast<int>(slot_map_number(value).value_or(0));
                } else if (name == "ip") {
                    ip = value.text();
                } else if (name == "endpoint") {
                    endpoint = value.text();
                } else if (name == "role") {
                    role = value.text();
                } else if (name == "health") {
                    health = value.text();
                }
            }
            if (role != "master" || m.port <= 0) {
                continue;
            }
            m.host = !endpoint.empty() && endpoint != "?" ? endpoint : ip;
            if (m.host.empty() || m.host == "?") {
                m.host = std::string{asked_host};
            }
            const bool online = health.empty() || health == "online";
            if (!chosen || (online && !chosen_online)) {
                chosen = std::move(m);
                chosen_online = online;
            }
        }
        if (!chosen) {
            continue;
        }
        const auto& bounds = slots->elements();
        for (std::size_t i = 0; i + 1 < bounds.size(); i += 2) {
            const auto first = slot_map_number(bounds[i]);
            const auto last = slot_map_number(bounds[i + 1]);
            if (first && last && valid_slot_range(*first, *last)) {
                chosen->ranges.emplace_back(static_cast<std::uint16_t>(*first),
                                            static_cast<std::uint16_t>(*last));
            }
        }
        out.push_back(std::move(*chosen));
    }
    return out;
}

/// Masters from a CLUSTER SLOTS reply: [[first, last, [host, port, id, ...], replicas...], ...].
inline std::vector<shard_master> parse_cluster_slots(const reply& r, std::string_view asked_host) {
    std::vector<shard_master> out;
    for (const reply& range : r.elements()) {
        const auto& parts = range.elements();
        if (parts.size() < 3 || parts[2].elements().size() < 2) {
            continue;
        }
        const auto first = slot_map_number(parts[0]);
        const auto last = slot_map_number(parts[1]);
        const auto port = slot_map_number(parts[2].elements()[1]);
        if (!first || !last || !port || !valid_slot_range(*first, *last) || *port <= 0) {
            continue;
        }
        std::string host = parts[2].elements()[0].text();
        if (host.empty() || host == "?") {
            host = std::string{asked_host};
        }
        shard_master* master = nullptr;
        for (auto& m : out) {
            if (m.host == host && m.port == *port) {
                master = &m;
            }
        }
        if (master == nullptr) {
            master = &out.emplace_back(shard_master{host, static_cast<int>(*port), {}});
        }
        master->ranges.emplace_back(static_cast<std::uint16_t>(*first),
                                    static_cast<std::uint16_t>(*last));
    }
    return out;
}

}  // namespace redislock::detail
