// redislock::hiredis_cluster_connection: a connection to a Redis Cluster, one hiredis pool per
// node.
//
//   redislock::cluster_client cc{"redis://127.0.0.1:7000,127.0.0.1:7001?command_timeout=500"};
//
// Seeds: redis://[user:password@]host:port[,host:port...][?query], with the query options of
// endpoint (connect_timeout, command_timeout, pool_size, user, password); user, password,
// timeouts and pool size apply to every node of the cluster, including those found later. Any
// one seed that answers suffices. A cluster has only database 0.
//
// Routing: the slot map comes from CLUSTER SHARDS (Redis 7.0+), else CLUSTER SLOTS. Each command
// goes to the master of its key's slot: call_context::key when the library passes one, else the
// key read from the command (a script's first key, or the first argument); a command without a
// key (SCRIPT LOAD, PING) goes to any master. A pool of connections to a node is opened the first
// time a command goes there.
//
// Redirections and transient errors are handled here, never returned to the caller:
// - MOVED: the slot is pointed at the new node at once, the whole map is read again (at most once
//   per refresh interval, one thread reading for all: a call that finds a read under way does
//   not wait for it) and the command is sent again there.
// - ASK: ASKING and the command go to the named node in one pipeline on one connection; the map
//   is left alone.
// - TRYAGAIN (a slot being migrated, the command's keys partly on each side; also after an ASK,
//   from a target that lacks some of them): the command did not run. It is sent again after a
//   short backoff, on the node the map names (which may ASK again: such a round is not counted
//   as a redirection), until the call's deadline, else one command_timeout; then the call
//   returns that TRYAGAIN reply, unless an earlier attempt may have run (then as below).
// - CLUSTERDOWN, LOADING, MASTERDOWN, and a node that refuses or drops connections (a failover in
//   progress): the command is sent again after a short backoff, until the call's deadline
//   (call_context::deadline, else 3 x command_timeout); then the call throws a connection_error
//   (timeout_error when the caller's deadline passed) naming the node and slot.
//   A simple SET (the simple lock's acquisition) whose connection broke after it may have been
//   sent is not sent again: the error goes to the caller, which cleans up as on one node. A node
//   that accepted the command but did not answer within the command timeout ends the call with
//   timeout_error at once (the command may still run there).
// - NOSCRIPT: scripts are loaded per node and not replicated, so the connection remembers the
//   source of every script loaded through it (SCRIPT LOAD's reply is the SHA1) and loads it on
//   the node that answered NOSCRIPT before sending the EVALSHA again.
//
// Deadlines: a call given a deadline or a stop token ends by that deadline, or at once on the stop
// request, whatever the nodes do. Everything it does on the way gets no more than the time it has
// left: opening a connection to a node (pools are made on first use without connecting, so a node
// met mid-call is connected within the call), the commands and their retries, the SCRIPT LOAD
// after NOSCRIPT, and a slot-map read it makes, which gives each node it asks an equal share of
// the time left (at least min_map_read_share when that much is left) and asks the nodes whose
// last read failed last. Without a deadline, a call's retries and reads end after 3 x
// command_timeout.
//
// Pipelines (execute_pipeline): the commands are grouped by node, one pipeline per node, and the
// replies come back in the order of the commands; the commands a reply redirected or refused
// are sent again, grouped by node the same way. When some nodes answer and another cannot be
// reached before the deadline (or does not answer within the command timeout), that node's
// commands get an error reply ("ERR redislock: ...", detail::unanswered_prefix) instead of an
// exception, so a watchdog's renewals on healthy nodes still count; when no command could be
// served the call throws.
//
// Counters: round_trips() counts batches sent on behalf of callers (one per command, pipeline
// group or ASKING pair), in total and per node; map_refreshes() counts slot-map reads, and
// moved_redirections() and ask_redirections() the redirections followed.
//
// Reconnections: each node's pool replaces a connection that broke as hiredis_connection does,
// and tells the reconnect handler (set_reconnect_handler) with the node's address, which a
// cluster_client turns into a reconnected event. Only replacements count: opening the first
// connection to a node (one used for the first time, or new after a failover or resharding) is
// not reported.
//
// Slot migrations (resharding): every lock script declares all the keys it touches (the lock,
// its waiting queue and the queue's lapse times, and the fencing counter when it draws a token),
// so a node never runs one on keys it does not have. While a slot is half-migrated, a script
// whose keys are partly on each side is answered TRYAGAIN and changes nothing: lock calls wait
// for the slot as for a held lock (try_lock() answers false after one command timeout,
// try_lock_for() and lock(stop_token) by their deadline, an untimed lock() once the slot
// settles), and a release that cannot run within the command timeout is left to the client's
// reaper, which finishes it once the slot settles (within the lease). MIGRATE without REPLACE,
// as `redis-cli --cluster reshard` sends it, moves every key of a lock: none is ever created a
// second time on the target.
//
// Failover caveat: Redis replicates asynchronously. A lock acquired on a master that dies before
// the write reached its replica is lost when the replica is promoted, and another client may
// then take it while the first still believes it holds it. A graceful CLUSTER FAILOVER does not
// lose writes. Waiting for a replica to acknowledge each acquisition (WAIT) narrows the window
// but does not close it; fencing tokens let the protected storage reject the stale holder.
//
// Thread safety: every member may be called from any number of threads. No lock is held while a
// node is asked anything.
// Lifetime: movable, not copyable; every node's connections close on destruction.
// fork(): a child never uses its parent's nodes, map or mutexes (a parent's thread may have held
// one at the fork, mid-read): its first call makes its own, from the seeds and from what of its
// parent's nodes, map and scripts it can read without waiting, and opens its own connections.
// The reconnect handler and the counters carry over.
#pragma once

#include <algorithm>
#include <array>
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
#include <redislock/detail/topology/cluster_process_state.hpp>
#include <redislock/detail/topology/cluster_slot.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>

namespace redislock {

/// A connection to a Redis Cluster: one hiredis pool per node, each command sent to the master of
/// its key's slot, MOVED and ASK followed. Thread-safe.
class hiredis_cluster_connection {
public:
    /// Reads the slot map from the first seed that answers.
    /// @throws redislock::invalid_argument for a malformed URI, a pool size of 0 or a timeout
    ///         below 1 ms;
    ///         redislock::connection_error when no seed answers with a slot map.
    explicit hiredis_cluster_connection(std::string_view uri)
        : hiredis_cluster_connection{detail::cluster_seeds_from_uri(uri)} {}

    /// As above, from endpoints. The first one's user, password, timeouts and pool size apply to
    /// every node.
    explicit hiredis_cluster_connection(std::vector<endpoint> seeds)
        : hiredis_cluster_connection{std::move(seeds), defer_connect} {
        if (!refresh_now()) {
            throw connection_error{"redislock: no seed of the cluster answered with a slot map: " +
                                   st().last_refresh_problem};
        }
    }

    /// Checks the settings and reads no slot map: the first call reads it, within that call's
    /// deadline. @throws redislock::invalid_argument as the other constructors.
    hiredis_cluster_connection(std::vector<endpoint> seeds, defer_connect_t)
        : common_{std::make_unique<common>()} {
        if (seeds.empty()) {
            throw invalid_argument{"redislock: a cluster connection needs at least one seed"};
        }
        for (const endpoint& seed : seeds) {
            detail::check_connection_settings(seed);
            if (!seed.unix_socket.empty() || seed.db != 0) {
                throw invalid_argument{
                    "redislock: cluster seeds are host:port addresses on database 0"};
            }
        }
        common_->options = seeds.front();
        // A forked child makes its own state (nodes, map, the mutexes that guard them) from the
        // seeds and what it can read of its parent's without waiting.
        states_ = std::make_unique<detail::per_process<state>>(
            std::function<std::unique_ptr<state>(state*)>{
                [seeds, shared = common_.get()](state* parent) {
                    return std::make_unique<state>(seeds, *shared, parent);
                }});
    }

    /// Takes over another connection's nodes and slot map.
    hiredis_cluster_connection(hiredis_cluster_connection&&) noexcept = default;
    /// Takes over another connection's nodes and slot map.
    hiredis_cluster_connection& operator=(hiredis_cluster_connection&&) noexcept = default;

    /// Sends one command to the master of the slot of the key it touches and returns its reply.
    /// @throws redislock::connection_error, redislock::timeout_error
    reply execute(command argv) { return execute(argv, call_context{}); }

    /// As execute(argv), routed by how.key when not empty, bounded by how.deadline and *how.stop.
    /// @throws redislock::connection_error, redislock::timeout_error, redislock::cancelled_error
    reply execute(command argv, const call_context& how) {
        // The common case first, without the bookkeeping of run(): the map is right and the
        // node answers. Anything else starts over on the general path.
        item start;
        if (detail::cluster_node* node = route_first(argv, how)) {
            const std::uint64_t generation = st().generation.load(std::memory_order_acquire);
            try {
                reply r = node->connection().execute(argv, how);
                node->round_trips.fetch_add(1, std::memory_order_relaxed);
                if (!r.is_error()) {
                    remember_script(argv, r);
                    return r;
                }
                if (auto redirect = detail::parse_redirection(r)) {
                    // Followed from here, so the redirected command costs no extra round trip.
                    detail::cluster_node& to =
                        node_at(redirect->host.empty() ? node->config().host : redirect->host,
                                redirect->port);
                    start.target = &to;
                    start.asking = redirect->ask;
                    count_redirection(redirect->ask);
                    start.redirections = 1;
                    if (!redirect->ask) {
                        point_slot(redirect->slot, to);
                        refresh_after_trouble(generation, within_call(how));
                    }
                } else if (!detail::is_transient_cluster_error(r) &&
                           !(r.is_error_code("NOSCRIPT") && known_script(argv))) {
                    return r;
                }
            } catch (const connection_error& e) {
                if (!may_retry_after(e, argv, how)) {
                    throw;
                }
                start.may_have_run = !never_sent(e);
            }
        }
        std::vector<reply> replies = run(std::span<const command>{&argv, 1},
                                         std::span<const call_context>{&how, 1}, how, &start);
        return std::move(replies.front());
    }

    /// Sends the commands grouped by node, one pipeline per node; replies in command order.
    /// @throws redislock::connection_error when no command could be served
    std::vector<reply> execute_pipeline(std::span<const command> commands) {
        return run(commands, {}, call_context{});
    }

    /// As execute_pipeline(commands), hows[i] routing commands[i]; bounded by the earliest
    /// deadline of `hows` and by the first stop token among them.
    std::vector<reply> execute_pipeline(std::span<const command> commands,
                                        std::span<const call_context> hows) {
        call_context bound;
        for (const call_context& how : hows) {
            bound.deadline = std::min(bound.deadline, how.deadline);
            if (bound.stop == nullptr) {
                bound.stop = how.stop;
            }
        }
        return run(commands, hows, bound);
    }

    /// Batches sent for callers, over every node.
    std::uint64_t round_trips() const {
        std::uint64_t total = 0;
        for (const auto& [address, count] : round_trips_per_node()) {
            total += count;
        }
        return total;
    }

    /// Batches sent for callers, by node address ("host:port").
    std::map<std::string, std::uint64_t> round_trips_per_node() const {
        std::lock_guard lock{st().nodes_mutex};
        std::map<std::string, std::uint64_t> out;
        for (const auto& [address, node] : st().nodes) {
            out[address] = node->round_trips.load(std::memory_order_relaxed);
        }
        return out;
    }

    /// Slot-map reads so far, the constructor's included.
    std::uint64_t map_refreshes() const noexcept {
        return common_->refreshes.load(std::memory_order_relaxed);
    }

    /// MOVED replies followed so far.
    std::uint64_t moved_redirections() const noexcept {
        return common_->moved.load(std::memory_order_relaxed);
    }

    /// ASK replies followed so far.
    std::uint64_t ask_redirections() const noexcept {
        return common_->asked.load(std::memory_order_relaxed);
    }

    /// Reads the slot map again now, whatever the refresh interval. Returns false when no node
    /// answered (the old map is kept).
    bool refresh_map() { return refresh_now(); }

    /// The address of the master that the current map says serves `key`; empty if none.
    std::string node_for_key(std::string_view key) const {
        std::shared_lock lock{st().map_mutex};
        const detail::cluster_node* node = st().slots[detail::key_slot(key)];
        return node != nullptr ? node->address() : std::string{};
    }

    /// The addresses of the masters in the current map.
    std::vector<std::string> masters() const {
        std::shared_lock lock{st().map_mutex};
        std::vector<std::string> out;
        for (const detail::cluster_node* node : st().masters) {
            out.push_back(node->address());
        }
        return out;
    }

    /// The options every node's pool uses.
    const endpoint& config() const noexcept { return common_->options; }

    /// Calls `handler` with a node's address ("host:port") each time that node's pool opens a
    /// connection to replace one that broke (a failed or timed-out call, or one the node closed
    /// while idle), on the thread whose call opened it, with no internal lock held. It reaches
    /// every node's pool: those already open, and those opened later (a node first used, or
    /// learnt from a redirection or a slot-map read). The first connection to a node is not a
    /// reconnection, so a failover or a resharding that moves slots to other nodes is not
    /// reported here (see moved_redirections() and map_refreshes()). A reconnection made while
    /// the slot map is read is reported once the read is over, so the handler may call back into
    /// the connection (refresh_map(), a command). May be called at any time, from any thread; an
    /// empty handler stops the reports, but a report already under way when set() returns may
    /// still run the handler it replaced. What it throws is dropped.
    void set_reconnect_handler(std::function<void(std::string_view server)> handler) {
        common_->relay.set(std::move(handler));
    }

    /// The node that serves `channel`: sharded pub/sub follows the channel's slot, so waiters
    /// subscribe on that node (see subscriber.hpp).
    std::string subscriber_node(std::string_view channel) const { return node_for_key(channel); }

    /// A subscriber link to the master of `channel`'s slot.
    /// @throws redislock::connection_error when no node serves the slot or it cannot be reached
    std::unique_ptr<subscriber_link> open_subscriber(std::string_view channel) {
        detail::cluster_node* node = nullptr;
        {
            std::shared_lock lock{st().map_mutex};
            node = st().slots[detail::key_slot(channel)];
        }
        if (node == nullptr) {
            throw connection_error{"redislock: no node serves the slot of channel '" +
                                   std::string{channel} + "'"};
        }
        return node->connection().open_subscriber(channel);
    }

private:
    using steady = std::chrono::steady_clock;
    // Without a deadline from the caller, a call keeps retrying for this many command timeouts:
    // with the default 2 s, long enough for a replica to take over a failed master (node
    // timeout plus election, about 4 s with a 2 s node timeout).
    static constexpr int deadline_factor = 3;
    // More redirections than this for one command means the nodes disagree; stop following.
    static constexpr int max_redirections = 16;
    // During a resharding every client meets many MOVED replies; one map read per interval is
    // enough, the MOVED reply itself repoints its slot at once.
    static constexpr std::chrono::milliseconds refresh_interval{100};
    // The least time a slot-map read gives one node when the caller's time allows it: a healthy
    // node answers well within it, even on a loaded machine.
    static constexpr std::chrono::milliseconds min_map_read_share{20};
    static constexpr std::chrono::milliseconds first_backoff{2};
    static constexpr std::chrono::milliseconds max_backoff{100};

    using common = detail::cluster_shared;
    using state = detail::cluster_process_state;

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

    detail::cluster_node& node_at(const std::string& host, int port) {
        return st().node_at(host, port);
    }

    // This process's state.
    state& st() const { return states_->get(); }

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
                    throw connection_error{"redislock: cluster slot " +
                                           std::to_string(redirect->slot) + " redirected " +
                                           std::to_string(max_redirections) + " times; last to " +
                                           redirect->address()};
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

    // Before the states: their nodes report to its relay until they close.
    std::unique_ptr<common> common_;
    std::unique_ptr<detail::per_process<state>> states_;
};

static_assert(pipelining_connection<hiredis_cluster_connection>);
static_assert(contextual_connection<hiredis_cluster_connection>);
static_assert(contextual_pipelining_connection<hiredis_cluster_connection>);

}  // namespace redislock
