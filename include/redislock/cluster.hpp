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
//   per refresh interval, one thread reading for all) and the command is sent again there.
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
// Thread safety: every member may be called from any number of threads.
// Lifetime: movable, not copyable; every node's connections close on destruction. Like
// hiredis_connection, a forked child opens its own connections.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
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
#include <redislock/detail/cluster_command.hpp>
#include <redislock/detail/cluster_map.hpp>
#include <redislock/detail/cluster_slot.hpp>
#include <redislock/detail/reconnect_relay.hpp>
#include <redislock/detail/wait.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>

namespace redislock {

namespace detail {

/// One node of the cluster: where it is, and its pool of connections once one was needed.
class cluster_node {
public:
    /// `relay`, when given, hears of every connection the node's pool opens in place of one that
    /// broke; it must outlive the node.
    explicit cluster_node(endpoint config, const reconnect_relay* relay = nullptr)
        : config_{std::move(config)}, address_{config_.describe()}, relay_{relay} {}

    const std::string& address() const noexcept { return address_; }
    const endpoint& config() const noexcept { return config_; }

    /// The node's pool, opened on first use.
    /// @throws redislock::connection_error when the node cannot be reached.
    hiredis_connection& connection() {
        if (hiredis_connection* ready = ready_.load(std::memory_order_acquire)) {
            return *ready;
        }
        std::lock_guard lock{open_mutex_};
        if (!owned_) {
            auto pool = std::make_unique<hiredis_connection>(config_);
            if (relay_ != nullptr) {
                // Before the pool is published: no other thread can be using it yet.
                pool->set_reconnect_handler(relay_->forward());
            }
            owned_ = std::move(pool);
            ready_.store(owned_.get(), std::memory_order_release);
        }
        return *owned_;
    }

    std::atomic<std::uint64_t> round_trips{0};

private:
    endpoint config_;
    std::string address_;
    const reconnect_relay* relay_;
    std::mutex open_mutex_;
    std::unique_ptr<hiredis_connection> owned_;
    std::atomic<hiredis_connection*> ready_{nullptr};
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

}  // namespace detail

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
        : state_{std::make_unique<state>()} {
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
        state_->options = seeds.front();
        for (const endpoint& seed : seeds) {
            (void)node_at(seed.host, seed.port);
        }
        if (!refresh_now()) {
            throw connection_error{"redislock: no seed of the cluster answered with a slot map: " +
                                   state_->last_refresh_problem};
        }
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
            const std::uint64_t generation = state_->generation.load(std::memory_order_acquire);
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
                        refresh_after_trouble(generation);
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
        std::lock_guard lock{state_->nodes_mutex};
        std::map<std::string, std::uint64_t> out;
        for (const auto& [address, node] : state_->nodes) {
            out[address] = node->round_trips.load(std::memory_order_relaxed);
        }
        return out;
    }

    /// Slot-map reads so far, the constructor's included.
    std::uint64_t map_refreshes() const noexcept {
        return state_->refreshes.load(std::memory_order_relaxed);
    }

    /// MOVED replies followed so far.
    std::uint64_t moved_redirections() const noexcept {
        return state_->moved.load(std::memory_order_relaxed);
    }

    /// ASK replies followed so far.
    std::uint64_t ask_redirections() const noexcept {
        return state_->asked.load(std::memory_order_relaxed);
    }

    /// Reads the slot map again now, whatever the refresh interval. Returns false when no node
    /// answered (the old map is kept).
    bool refresh_map() { return refresh_now(); }

    /// The address of the master that the current map says serves `key`; empty if none.
    std::string node_for_key(std::string_view key) const {
        std::shared_lock lock{state_->map_mutex};
        const detail::cluster_node* node = state_->slots[detail::key_slot(key)];
        return node != nullptr ? node->address() : std::string{};
    }

    /// The addresses of the masters in the current map.
    std::vector<std::string> masters() const {
        std::shared_lock lock{state_->map_mutex};
        std::vector<std::string> out;
        for (const detail::cluster_node* node : state_->masters) {
            out.push_back(node->address());
        }
        return out;
    }

    /// The options every node's pool uses.
    const endpoint& config() const noexcept { return state_->options; }

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
        state_->reconnect.set(std::move(handler));
    }

    /// The node that serves `channel`: sharded pub/sub follows the channel's slot, so waiters
    /// subscribe on that node (see subscriber.hpp).
    std::string subscriber_node(std::string_view channel) const { return node_for_key(channel); }

    /// A subscriber link to the master of `channel`'s slot.
    /// @throws redislock::connection_error when no node serves the slot or it cannot be reached
    std::unique_ptr<subscriber_link> open_subscriber(std::string_view channel) {
        detail::cluster_node* node = nullptr;
        {
            std::shared_lock lock{state_->map_mutex};
            node = state_->slots[detail::key_slot(channel)];
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
    static constexpr std::chrono::milliseconds first_backoff{2};
    static constexpr std::chrono::milliseconds max_backoff{100};

    struct state {
        endpoint options;

        // Before the nodes, whose pools report to it until they close.
        detail::reconnect_relay reconnect;

        mutable std::mutex nodes_mutex;
        // Never erased while the connection lives: the slot table points into it.
        std::map<std::string, std::unique_ptr<detail::cluster_node>> nodes;

        mutable std::shared_mutex map_mutex;
        std::array<detail::cluster_node*, detail::cluster_slot_count> slots{};
        std::vector<detail::cluster_node*> masters;

        std::mutex refresh_mutex;
        std::atomic<std::uint64_t> generation{0};
        steady::time_point last_refresh{};
        std::string last_refresh_problem;
        std::atomic<std::uint64_t> refreshes{0};
        std::atomic<std::uint64_t> moved{0};
        std::atomic<std::uint64_t> asked{0};

        std::mutex scripts_mutex;
        std::unordered_map<std::string, std::string> scripts;  // SHA1 -> source
    };

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
        endpoint config = state_->options;
        config.host = host;
        config.port = port;
        const std::string address = config.describe();
        std::lock_guard lock{state_->nodes_mutex};
        auto& slot = state_->nodes[address];
        if (!slot) {
            slot = std::make_unique<detail::cluster_node>(std::move(config), &state_->reconnect);
        }
        return *slot;
    }

    detail::cluster_node* route(const item& it) const {
        if (it.target != nullptr) {
            return it.target;
        }
        std::shared_lock lock{state_->map_mutex};
        if (it.slot) {
            return state_->slots[*it.slot];
        }
        return state_->masters.empty() ? nullptr : state_->masters.front();
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
                                  : started + state_->options.command_timeout * deadline_factor;
        // A slot being migrated answers at once, and so does the cluster once it is moved: one
        // command timeout is enough when only TRYAGAIN kept a command from running.
        const auto migration_deadline =
            caller_deadline ? bound.deadline : started + state_->options.command_timeout;
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
            const std::uint64_t generation = state_->generation.load(std::memory_order_acquire);
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
                    items[i].problem = "no node serves the slot in the current map";
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
                const outcome o = send_group(*node, which, commands, hows, items, results);
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
                refresh_after_trouble(generation);
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
                       std::vector<item>& items, std::vector<reply>& results) {
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
            load_scripts(node, commands, unloaded, items, results, o);
        }
        return o;
    }

    // Loads, on `node`, the scripts that it answered NOSCRIPT for. A command whose script the
    // node still refuses to load gets that reply.
    void load_scripts(detail::cluster_node& node, std::span<const command> commands,
                      const std::vector<std::size_t>& which, std::vector<item>& items,
                      std::vector<reply>& results, outcome& o) {
        std::vector<std::string> loaded;
        for (std::size_t i : which) {
            const std::string sha1{commands[i][1]};
            if (std::find(loaded.begin(), loaded.end(), sha1) != loaded.end()) {
                continue;
            }
            std::string source;
            {
                std::lock_guard lock{state_->scripts_mutex};
                source = state_->scripts.at(sha1);
            }
            const std::array<std::string_view, 3> load{"SCRIPT", "LOAD", source};
            try {
                reply r = send_one(node, load);
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

    reply send_one(detail::cluster_node& node, command single) {
        reply r = node.connection().execute(single);
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
        std::shared_lock lock{state_->map_mutex};
        if (key) {
            return state_->slots[detail::key_slot(*key)];
        }
        return state_->masters.empty() ? nullptr : state_->masters.front();
    }

    bool known_script(command argv) const {
        if (argv.size() < 2 || !detail::same_command_word(argv[0], "EVALSHA")) {
            return false;
        }
        std::lock_guard lock{state_->scripts_mutex};
        return state_->scripts.contains(std::string{argv[1]});
    }

    void remember_script(command argv, const reply& r) {
        if (argv.size() == 3 && r.is_string() && detail::same_command_word(argv[0], "SCRIPT") &&
            detail::same_command_word(argv[1], "LOAD")) {
            std::lock_guard lock{state_->scripts_mutex};
            state_->scripts.try_emplace(r.text(), argv[2]);
        }
    }

    void point_slot(std::uint16_t slot, detail::cluster_node& to) {
        std::unique_lock lock{state_->map_mutex};
        state_->slots[slot] = &to;
        if (std::find(state_->masters.begin(), state_->masters.end(), &to) ==
            state_->masters.end()) {
            state_->masters.push_back(&to);
        }
    }

    // Reads the map again unless another thread did since `seen` or the last read is recent.
    // A node's pool that reconnects during the read reports once refresh_mutex is released (the
    // deferral is opened before the lock), so a reconnect handler may call back into the client.
    void refresh_after_trouble(std::uint64_t seen) {
        const auto deferred = state_->reconnect.defer();
        std::lock_guard lock{state_->refresh_mutex};
        if (state_->generation.load(std::memory_order_acquire) != seen ||
            steady::now() - state_->last_refresh < refresh_interval) {
            return;
        }
        (void)refresh_locked();
    }

    bool refresh_now() {
        const auto deferred = state_->reconnect.defer();
        std::lock_guard lock{state_->refresh_mutex};
        return refresh_locked();
    }

    // Asks the known masters, then every other known node (the seeds among them), for the slot
    // map; installs the first complete answer.
    bool refresh_locked() {
        std::vector<detail::cluster_node*> candidates;
        {
            std::shared_lock lock{state_->map_mutex};
            candidates = state_->masters;
        }
        {
            std::lock_guard lock{state_->nodes_mutex};
            for (const auto& [address, node] : state_->nodes) {
                if (std::find(candidates.begin(), candidates.end(), node.get()) ==
                    candidates.end()) {
                    candidates.push_back(node.get());
                }
            }
        }
        state_->last_refresh = steady::now();
        std::string problems;
        for (detail::cluster_node* node : candidates) {
            try {
                std::vector<detail::shard_master> shards = read_map(*node);
                if (shards.empty()) {
                    problems += node->address() + ": no slots; ";
                    continue;
                }
                install(shards);
                state_->last_refresh_problem.clear();
                return true;
            } catch (const error& e) {
                problems += node->address() + ": " + e.what() + "; ";
            }
        }
        state_->last_refresh_problem = problems;
        return false;
    }

    std::vector<detail::shard_master> read_map(detail::cluster_node& node) {
        hiredis_connection& conn = node.connection();
        static constexpr std::array<std::string_view, 2> shards{"CLUSTER", "SHARDS"};
        reply r = conn.execute(shards);
        if (!r.is_error()) {
            return detail::parse_cluster_shards(r, node.config().host);
        }
        static constexpr std::array<std::string_view, 2> slots{"CLUSTER", "SLOTS"};
        r = conn.execute(slots);
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
            std::unique_lock lock{state_->map_mutex};
            state_->slots = table;
            state_->masters = std::move(masters);
        }
        state_->generation.fetch_add(1, std::memory_order_acq_rel);
        state_->refreshes.fetch_add(1, std::memory_order_relaxed);
    }

    void count_redirection(bool ask) noexcept {
        (ask ? state_->asked : state_->moved).fetch_add(1, std::memory_order_relaxed);
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

    std::unique_ptr<state> state_;
};

static_assert(pipelining_connection<hiredis_cluster_connection>);
static_assert(contextual_connection<hiredis_cluster_connection>);
static_assert(contextual_pipelining_connection<hiredis_cluster_connection>);

}  // namespace redislock
