// detail::cluster_router: how a call of hiredis_cluster_connection goes through the cluster. Each
// command is routed by its key's slot, the commands are grouped by node into one pipeline each,
// and MOVED, ASK, TRYAGAIN, NOSCRIPT and the transient errors are followed or waited out, all
// within the call's deadline, until every command has its final reply or the call gives up.
// Apart from the public class (cluster.hpp), which states the contract, and from the slot map
// it routes by (cluster_map_keeper.hpp), which changes only through the keeper.
//
// A base of hiredis_cluster_connection, never used alone. Each call keeps its progress on its
// own stack; what calls share is the keeper's, so any number of threads may call at once.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <shared_mutex>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/topology/cluster_command.hpp>
#include <redislock/detail/topology/cluster_map_keeper.hpp>
#include <redislock/detail/topology/cluster_node.hpp>
#include <redislock/detail/topology/cluster_slot.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

/// Routes and retries the commands of one call across the cluster's nodes.
class cluster_router : protected cluster_map_keeper {
protected:
    // Without a deadline from the caller, a call keeps retrying for this many command timeouts:
    // with the default 2 s, long enough for a replica to take over a failed master (node
    // timeout plus election, about 4 s with a 2 s node timeout).
    static constexpr int deadline_factor = 3;
    // More redirections than this for one command means the nodes disagree; pause, then retry.
    static constexpr int max_redirections = 16;
    static constexpr std::chrono::milliseconds first_backoff{2};
    static constexpr std::chrono::milliseconds max_backoff{100};

    // One command's progress through a call.
    struct item {
        std::optional<std::uint16_t> slot;       // none: any master
        detail::cluster_node* target = nullptr;  // set by a redirection
        bool asking = false;
        bool done = false;
        int redirections = 0;          // followed since the last pause
        int sends = 0;                 // how many times the command went out
        std::string problem;           // why the last attempt did not give a final reply
        std::optional<reply> refusal;  // the last attempt's TRYAGAIN, which did not run it
        bool may_have_run = false;     // an attempt's connection broke after it was sent
    };

    // A WAIT counts the replicas of the writes sent before it on its connection. When the write
    // right before it had to be sent again (redirected, NOSCRIPT, TRYAGAIN), the WAIT ran before
    // that write on another connection or node and vouches for nothing: it is answered as if no
    // replica acknowledged, so lock_options::min_replicas never accepts an unreplicated write.
    static void distrust_waits_after_resent_writes(std::span<const command> commands,
                                                   const std::vector<item>& items,
                                                   std::vector<reply>& results) {
        for (std::size_t i = 1; i < commands.size(); ++i) {
            if (!commands[i].empty() && detail::same_command_word(commands[i][0], "WAIT") &&
                items[i - 1].sends > 1) {
                results[i] = reply::error(
                    "NOREPLICAS the write before this WAIT was sent again; its acknowledgement is "
                    "unknown");
            }
        }
    }

    detail::cluster_node* route(const item& it) const {
        if (it.target != nullptr) {
            return it.target;
        }
        std::shared_lock lock{st().map_mutex};
        if (it.slot) {
            return st().slots[*it.slot];
        }
        return st().masters.empty() ? nullptr : st().masters.front();
    }

    // Sends every command until each has a final reply or the deadline passes. `start`, for a
    // single command, carries where a first attempt was redirected.
    std::vector<reply> run(std::span<const command> commands, std::span<const call_context> hows,
                           const call_context& bound, const item* start = nullptr) {
        std::vector<reply> results(commands.size());
        if (commands.empty()) {
            return results;
        }
        const auto started = steady::now();
        const bool caller_deadline = bound.deadline != steady::time_point::max();
        const auto deadline = caller_deadline
                                  ? bound.deadline
                                  : started + common_->options.command_timeout * deadline_factor;
        // A slot being migrated answers at once, and so does the cluster once it is moved: one
        // command timeout is enough when only TRYAGAIN kept a command from running.
        const auto migration_deadline =
            caller_deadline ? bound.deadline : started + common_->options.command_timeout;
        // What a slot-map read or a script load made for this call may take.
        const call_context limit{.deadline = deadline, .stop = bound.stop};
        std::vector<item> items(commands.size());
        for (std::size_t i = 0; i < commands.size(); ++i) {
            std::optional<std::string_view> key;
            if (i < hows.size() && !hows[i].key.empty()) {
                key = hows[i].key;
            } else {
                key = detail::routing_key(commands[i]);
            }
            if (key) {
                items[i].slot = detail::key_slot(*key);
            }
        }
        if (start != nullptr) {
            items.front().target = start->target;
            items.front().asking = start->asking;
            items.front().redirections = start->redirections;
            items.front().may_have_run = start->may_have_run;
        }

        auto backoff = std::chrono::duration_cast<steady::duration>(first_backoff);
        std::size_t served = 0;
        std::exception_ptr failure;
        for (;;) {
            check_stop(bound);
            const std::uint64_t generation = st().generation.load(std::memory_order_acquire);
            bool wait = false;
            bool stale_map = false;
            bool migrating_only = true;  // nothing but TRYAGAIN is waited for
            // Group what is left by node; a command with no known node waits for a new map.
            std::vector<std::pair<detail::cluster_node*, std::vector<std::size_t>>> groups;
            for (std::size_t i = 0; i < items.size(); ++i) {
                if (items[i].done) {
                    continue;
                }
                detail::cluster_node* node = route(items[i]);
                if (node == nullptr) {
                    items[i].problem = no_node_problem();
                    wait = stale_map = true;
                    migrating_only = false;
                    continue;
                }
                auto group = std::find_if(groups.begin(), groups.end(),
                                          [&](const auto& g) { return g.first == node; });
                if (group == groups.end()) {
                    groups.emplace_back(node, std::vector<std::size_t>{i});
                } else {
                    group->second.push_back(i);
                }
            }
            for (auto& [node, which] : groups) {
                const outcome o = send_group(*node, which, commands, hows, limit, items, results);
                served += o.served;
                wait = wait || o.wait;
                stale_map = stale_map || o.stale_map;
                migrating_only = migrating_only && !o.unsettled;
                if (o.failure && !failure) {
                    failure = o.failure;
                }
            }
            if (std::all_of(items.begin(), items.end(), [](const item& it) { return it.done; })) {
                if (served == 0 && failure) {
                    std::rethrow_exception(failure);
                }
                distrust_waits_after_resent_writes(commands, items, results);
                return results;
            }
            if (stale_map) {
                refresh_after_trouble(generation, limit);
            }
            if (!wait) {
                continue;  // redirected or reloaded: send again at once
            }
            const auto now = steady::now();
            if (now + backoff >= (migrating_only ? migration_deadline : deadline)) {
                return give_up(commands, items, results, served, caller_deadline, now - started);
            }
            if (!detail::sleep_unless_stopped(
                    backoff, bound.stop != nullptr ? *bound.stop : std::stop_token{})) {
                check_stop(bound);
            }
            backoff =
                std::min(backoff * 2, std::chrono::duration_cast<steady::duration>(max_backoff));
        }
    }

    struct outcome {
        std::size_t served = 0;
        bool wait = false;           // something to retry after a pause
        bool unsettled = false;      // ... for another reason than TRYAGAIN
        bool stale_map = false;      // the map needs reading again
        std::exception_ptr failure;  // a failure that ended some commands for good
    };

    // Sends one node's share as one pipeline (ASKING before each asked command) and settles
    // each reply.
    outcome send_group(detail::cluster_node& node, const std::vector<std::size_t>& which,
                       std::span<const command> commands, std::span<const call_context> hows,
                       const call_context& limit, std::vector<item>& items,
                       std::vector<reply>& results) {
        static constexpr std::array<std::string_view, 1> asking{"ASKING"};
        outcome o;
        std::vector<command> batch;
        std::vector<call_context> batch_hows;
        batch.reserve(which.size());
        for (std::size_t i : which) {
            const call_context how = i < hows.size() ? hows[i] : call_context{};
            if (items[i].asking) {
                batch.emplace_back(asking);
                batch_hows.push_back(how);
            }
            batch.push_back(commands[i]);
            batch_hows.push_back(how);
            ++items[i].sends;
        }
        std::vector<reply> replies;
        try {
            replies = send(node, batch, batch_hows, !hows.empty());
        } catch (const connection_error& e) {
            for (std::size_t i : which) {
                items[i].problem = "node " + node.address() + ": " + e.what();
                items[i].target = nullptr;
                items[i].asking = false;
                items[i].refusal.reset();
                items[i].may_have_run = items[i].may_have_run || !never_sent(e);
                if (!may_retry_after(e, commands[i], i < hows.size() ? hows[i] : call_context{})) {
                    if (commands.size() == 1) {
                        throw;
                    }
                    // In a pipeline the other nodes' commands still go out and count (a hung
                    // node must not keep the watchdog's renewals from the healthy ones).
                    results[i] =
                        reply::error(std::string{detail::unanswered_prefix} + items[i].problem);
                    items[i].done = true;
                    o.failure = std::current_exception();
                } else {
                    o.wait = o.stale_map = o.unsettled = true;
                }
            }
            return o;
        }
        std::size_t at = 0;
        std::vector<std::size_t> unloaded;
        for (std::size_t i : which) {
            if (items[i].asking) {
                ++at;  // ASKING's own +OK
            }
            reply& r = replies[at++];
            item& it = items[i];
            const bool was_asking = it.asking;
            it.asking = false;
            it.target = nullptr;
            if (auto redirect = detail::parse_redirection(r)) {
                if (++it.redirections > max_redirections) {
                    // Nodes that name each other, as they can for a moment after a migration or
                    // a failover until gossip settles the owner: read the map again and pause.
                    it.problem = "slot " + std::to_string(redirect->slot) + " redirected " +
                                 std::to_string(max_redirections) + " times in a row, last to " +
                                 redirect->address() + ": the nodes disagree on its owner";
                    it.redirections = 0;
                    it.refusal.reset();
                    o.wait = o.stale_map = o.unsettled = true;
                    continue;
                }
                detail::cluster_node& to = node_at(
                    redirect->host.empty() ? node.config().host : redirect->host, redirect->port);
                it.target = &to;
                count_redirection(redirect->ask);
                if (redirect->ask) {
                    it.asking = true;
                } else {
                    point_slot(redirect->slot, to);
                    o.stale_map = true;
                }
                continue;
            }
            if (r.is_error_code("NOSCRIPT") && known_script(commands[i]) &&
                ++it.redirections <= max_redirections) {
                it.problem = "node " + node.address() + " answered " + r.text();
                it.target = &node;
                it.asking = was_asking;
                unloaded.push_back(i);
                continue;
            }
            if (detail::is_transient_cluster_error(r)) {
                it.problem = "node " + node.address() + " answered " + r.text();
                o.wait = true;
                // A pause comes before the next send: an ASK that led here is no loop between
                // nodes that disagree.
                it.redirections = 0;
                if (r.text().starts_with("TRYAGAIN")) {
                    it.refusal = std::move(r);
                } else {
                    it.refusal.reset();
                    o.stale_map = o.unsettled = true;
                }
                continue;
            }
            remember_script(commands[i], r);
            results[i] = std::move(r);
            it.done = true;
            ++o.served;
        }
        if (!unloaded.empty()) {
            load_scripts(node, commands, unloaded, limit, items, results, o);
        }
        return o;
    }

    // Loads, on `node`, the scripts that it answered NOSCRIPT for, within `limit`. A command
    // whose script the node still refuses to load gets that reply.
    void load_scripts(detail::cluster_node& node, std::span<const command> commands,
                      const std::vector<std::size_t>& which, const call_context& limit,
                      std::vector<item>& items, std::vector<reply>& results, outcome& o) {
        std::vector<std::string> loaded;
        for (std::size_t i : which) {
            const std::string sha1{commands[i][1]};
            if (std::find(loaded.begin(), loaded.end(), sha1) != loaded.end()) {
                continue;
            }
            std::string source;
            {
                std::lock_guard lock{st().scripts_mutex};
                source = st().scripts.at(sha1);
            }
            const std::array<std::string_view, 3> load{"SCRIPT", "LOAD", source};
            try {
                reply r = send_one(node, load, limit);
                if (r.is_error()) {
                    for (std::size_t j : which) {
                        if (commands[j][1] == sha1) {
                            results[j] = r;
                            items[j].done = true;
                            ++o.served;
                        }
                    }
                }
            } catch (const connection_error&) {
                o.wait = o.stale_map = o.unsettled = true;
            }
            loaded.push_back(sha1);
        }
    }

    // One round trip to `node`: the batch as a pipeline, or a single command as one.
    std::vector<reply> send(detail::cluster_node& node, std::span<const command> batch,
                            std::span<const call_context> hows, bool contextual) {
        hiredis_connection& conn = node.connection();
        std::vector<reply> replies;
        if (batch.size() == 1) {
            replies.push_back(contextual ? conn.execute(batch.front(), hows.front())
                                         : conn.execute(batch.front()));
        } else {
            replies =
                contextual ? conn.execute_pipeline(batch, hows) : conn.execute_pipeline(batch);
        }
        node.round_trips.fetch_add(1, std::memory_order_relaxed);
        return replies;
    }

    reply send_one(detail::cluster_node& node, command single, const call_context& how) {
        reply r = node.connection().execute(single, how);
        node.round_trips.fetch_add(1, std::memory_order_relaxed);
        return r;
    }

    // True when the failure `e` came before the command could be sent: a node that refuses or
    // does not accept connections (down, or being replaced) never saw it.
    static bool never_sent(const connection_error& e) {
        const std::string_view what{e.what()};
        return what.find("cannot connect") != std::string_view::npos ||
               what.find("connecting to") != std::string_view::npos;
    }

    // Whether `argv` may be sent again after it failed with `e`. A node that never saw the
    // command may be sent it again. One that took it and then went silent may still run it: the
    // caller's timeout stands. One whose connection broke may have run it: every command may run
    // twice without harm but the simple lock's SET NX, whose second run would find the first
    // one's key and report the lock taken.
    static bool may_retry_after(const connection_error& e, command argv,
                                const call_context& how = {}) {
        if (never_sent(e)) {
            return true;
        }
        if (dynamic_cast<const timeout_error*>(&e) != nullptr || !how.repeatable) {
            return false;
        }
        return argv.empty() || !detail::same_command_word(argv[0], "SET");
    }

    // The master the current map names for a single command, or none (no map entry).
    detail::cluster_node* route_first(command argv, const call_context& how) const {
        std::optional<std::string_view> key;
        if (!how.key.empty()) {
            key = how.key;
        } else {
            key = detail::routing_key(argv);
        }
        std::shared_lock lock{st().map_mutex};
        if (key) {
            return st().slots[detail::key_slot(*key)];
        }
        return st().masters.empty() ? nullptr : st().masters.front();
    }

    void count_redirection(bool ask) noexcept {
        (ask ? common_->asked : common_->moved).fetch_add(1, std::memory_order_relaxed);
    }

    // `how`, its deadline made finite as run() makes it: a slot-map read on behalf of an untimed
    // call gets as long as that call's retries.
    call_context within_call(const call_context& how) const {
        call_context limit{.deadline = how.deadline, .stop = how.stop};
        if (limit.deadline == steady::time_point::max()) {
            limit.deadline = steady::now() + common_->options.command_timeout * deadline_factor;
        }
        return limit;
    }

    static void check_stop(const call_context& how) {
        if (how.stop != nullptr && how.stop->stop_requested()) {
            throw cancelled_error{"redislock: a stop was requested during a cluster call"};
        }
    }

    // Ends a call whose deadline came first. A command last refused with TRYAGAIN, which no
    // attempt may have run, gets that reply. The others get error replies when some command
    // got an answer, else the call throws an exception naming the node and slot of the first.
    std::vector<reply> give_up(std::span<const command> commands, std::vector<item>& items,
                               std::vector<reply>& results, std::size_t served, bool timed_out,
                               steady::duration waited) {
        std::string first;
        for (std::size_t i = 0; i < items.size(); ++i) {
            if (items[i].done) {
                continue;
            }
            if (items[i].refusal && !items[i].may_have_run) {
                results[i] = std::move(*items[i].refusal);
                ++served;
                continue;
            }
            std::string what = "redislock: cluster ";
            what += items[i].slot ? "slot " + std::to_string(*items[i].slot) : "command";
            what += " (" + std::string{commands[i].empty() ? "" : commands[i][0]} +
                    ") not served after " +
                    std::to_string(
                        std::chrono::duration_cast<std::chrono::milliseconds>(waited).count()) +
                    " ms: " + items[i].problem;
            if (first.empty()) {
                first = what;
            }
            results[i] = reply::error("ERR " + what);  // starts with detail::unanswered_prefix
        }
        if (served > 0) {
            return std::move(results);
        }
        if (timed_out) {
            throw timeout_error{first};
        }
        throw connection_error{first};
    }
};

}  // namespace redislock::detail
