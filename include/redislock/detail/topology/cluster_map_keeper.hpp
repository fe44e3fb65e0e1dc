// detail::cluster_map_keeper: what a hiredis_cluster_connection knows of the cluster in this
// process (the nodes, the slot map and the scripts loaded, held in cluster_process_state) and how
// that changes: a slot repointed by a MOVED reply, the whole map read (one thread reading for
// all, after trouble at most once per refresh interval, each node asked within the caller's
// deadline), a script's source remembered as it is loaded. Apart from the router
// (cluster_router.hpp): once made, the map changes only here; the router and the public class
// only look slots up, under the map's shared lock.
//
// A base of hiredis_cluster_connection, never used alone. Thread-safe as that connection is: the
// state of each process is guarded by its own mutexes (see cluster_process_state.hpp), none held
// while a node is asked anything.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/topology/cluster_command.hpp>
#include <redislock/detail/topology/cluster_map.hpp>
#include <redislock/detail/topology/cluster_node.hpp>
#include <redislock/detail/topology/cluster_process_state.hpp>
#include <redislock/detail/topology/cluster_slot.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

/// The per-process nodes, slot map and scripts of a cluster connection, and the reading of the
/// map; the settings and counters every process shares.
class cluster_map_keeper {
protected:
    using steady = std::chrono::steady_clock;
    // During a resharding every client meets many MOVED replies; one map read per interval is
    // enough, the MOVED reply itself repoints its slot at once.
    static constexpr std::chrono::milliseconds refresh_interval{100};
    // The least time a slot-map read gives one node when the caller's time allows it: a healthy
    // node answers well within it, even on a loaded machine.
    static constexpr std::chrono::milliseconds min_map_read_share{20};

    using common = detail::cluster_shared;
    using state = detail::cluster_process_state;

    cluster_map_keeper() : common_{std::make_unique<common>()} {}

    detail::cluster_node& node_at(const std::string& host, int port) {
        return st().node_at(host, port);
    }

    // This process's state.
    state& st() const { return states_->get(); }

    bool known_script(command argv) const {
        if (argv.size() < 2 || !detail::same_command_word(argv[0], "EVALSHA")) {
            return false;
        }
        std::lock_guard lock{st().scripts_mutex};
        return st().scripts.contains(std::string{argv[1]});
    }

    void remember_script(command argv, const reply& r) {
        if (argv.size() == 3 && r.is_string() && detail::same_command_word(argv[0], "SCRIPT") &&
            detail::same_command_word(argv[1], "LOAD")) {
            std::lock_guard lock{st().scripts_mutex};
            st().scripts.try_emplace(r.text(), argv[2]);
        }
    }

    void point_slot(std::uint16_t slot, detail::cluster_node& to) {
        std::unique_lock lock{st().map_mutex};
        st().slots[slot] = &to;
        if (std::find(st().masters.begin(), st().masters.end(), &to) == st().masters.end()) {
            st().masters.push_back(&to);
        }
    }

    // Reads the map again unless another thread is reading it or did since `seen`, or the last
    // read is recent; the read ends by `bound`'s deadline and at its stop request (the caller,
    // who checks its stop token next, learns of the stop there). No lock is held while nodes
    // are asked. A node's pool that reconnects during the read reports once the read is over
    // (the deferral ends last), so a reconnect handler may call back into the client, even
    // refresh_map().
    void refresh_after_trouble(std::uint64_t seen, const call_context& bound) {
        const auto deferred = common_->relay.defer();
        state& s = st();
        {
            std::lock_guard lock{s.refresh_mutex};
            if (s.reading || s.generation.load(std::memory_order_acquire) != seen ||
                steady::now() - s.last_refresh < refresh_interval) {
                return;
            }
            s.reading = true;
            s.last_refresh = steady::now();
        }
        (void)read_and_install(s, bound);
    }

    // Reads the map now, after the read under way if there is one. Untimed: each node is given
    // its connect and command timeouts.
    bool refresh_now() {
        const auto deferred = common_->relay.defer();
        state& s = st();
        {
            std::unique_lock lock{s.refresh_mutex};
            s.read_done.wait(lock, [&] { return !s.reading; });
            s.reading = true;
            s.last_refresh = steady::now();
        }
        return read_and_install(s, call_context{});
    }

    // Asks the known masters, then every other known node (the seeds among them), those whose
    // last read failed last, for the slot map; installs the first complete answer. With a
    // deadline, each node is given an equal share of the time left (at least min_map_read_share,
    // when that much is left), so one that hangs cannot take it all. Ends the read that the
    // caller started (s.reading).
    bool read_and_install(state& s, const call_context& bound) {
        std::vector<detail::cluster_node*> candidates;
        std::string problems;
        bool installed = false;
        try {
            {
                std::shared_lock lock{s.map_mutex};
                candidates = s.masters;
            }
            {
                std::lock_guard lock{s.nodes_mutex};
                for (const auto& [address, node] : s.nodes) {
                    if (std::find(candidates.begin(), candidates.end(), node.get()) ==
                        candidates.end()) {
                        candidates.push_back(node.get());
                    }
                }
            }
            std::stable_partition(candidates.begin(), candidates.end(), [](const auto* node) {
                return !node->map_read_failed.load(std::memory_order_relaxed);
            });
            const bool timed = bound.deadline != steady::time_point::max();
            for (std::size_t i = 0; i < candidates.size() && !installed; ++i) {
                detail::cluster_node& node = *candidates[i];
                call_context how{.stop = bound.stop};
                if (timed) {
                    const auto now = steady::now();
                    if (now >= bound.deadline) {
                        problems += "no time left; ";
                        break;
                    }
                    const auto left = bound.deadline - now;
                    const auto share = left / static_cast<std::int64_t>(candidates.size() - i);
                    how.deadline =
                        now + std::min<steady::duration>(
                                  left, std::max<steady::duration>(share, min_map_read_share));
                }
                try {
                    std::vector<detail::shard_master> shards = read_map(node, how);
                    if (shards.empty()) {
                        problems += node.address() + ": no slots; ";
                        continue;
                    }
                    install(shards);
                    node.map_read_failed.store(false, std::memory_order_relaxed);
                    installed = true;
                } catch (const cancelled_error&) {
                    problems += "stopped; ";
                    break;
                } catch (const error& e) {
                    node.map_read_failed.store(true, std::memory_order_relaxed);
                    problems += node.address() + ": " + e.what() + "; ";
                }
            }
        } catch (...) {
            end_read(s, "out of memory");
            throw;
        }
        end_read(s, installed ? std::string{} : std::move(problems));
        return installed;
    }

    // Why a slot has no node: with no map read yet (a client made before its seeds answered),
    // what the last read of the seeds met is the cause worth telling.
    std::string no_node_problem() {
        std::string problem = "no node serves the slot in the current map";
        state& s = st();
        std::lock_guard lock{s.refresh_mutex};
        if (!s.last_refresh_problem.empty()) {
            problem += " (the last read of the map: " + s.last_refresh_problem + ")";
        }
        return problem;
    }

    void end_read(state& s, std::string problem) noexcept {
        {
            std::lock_guard lock{s.refresh_mutex};
            s.reading = false;
            s.last_refresh_problem = std::move(problem);
        }
        s.read_done.notify_all();
    }

    std::vector<detail::shard_master> read_map(detail::cluster_node& node,
                                               const call_context& how) {
        hiredis_connection& conn = node.connection();
        static constexpr std::array<std::string_view, 2> shards{"CLUSTER", "SHARDS"};
        reply r = conn.execute(shards, how);
        if (!r.is_error()) {
            return detail::parse_cluster_shards(r, node.config().host);
        }
        static constexpr std::array<std::string_view, 2> slots{"CLUSTER", "SLOTS"};
        r = conn.execute(slots, how);
        if (r.is_error()) {
            throw server_error{r.text()};
        }
        return detail::parse_cluster_slots(r, node.config().host);
    }

    void install(const std::vector<detail::shard_master>& shards) {
        std::array<detail::cluster_node*, detail::cluster_slot_count> table{};
        std::vector<detail::cluster_node*> masters;
        for (const detail::shard_master& shard : shards) {
            detail::cluster_node& node = node_at(shard.host, shard.port);
            if (std::find(masters.begin(), masters.end(), &node) == masters.end()) {
                masters.push_back(&node);
            }
            for (const auto& [first, last] : shard.ranges) {
                for (std::size_t slot = first; slot <= last; ++slot) {
                    table[slot] = &node;
                }
            }
        }
        {
            std::unique_lock lock{st().map_mutex};
            st().slots = table;
            st().masters = std::move(masters);
        }
        st().generation.fetch_add(1, std::memory_order_acq_rel);
        common_->refreshes.fetch_add(1, std::memory_order_relaxed);
    }

    // Before the states: their nodes report to its relay until they close.
    std::unique_ptr<common> common_;
    std::unique_ptr<detail::per_process<state>> states_;
};

}  // namespace redislock::detail
