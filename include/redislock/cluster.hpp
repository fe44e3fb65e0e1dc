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
#include <redislock/detail/topology/cluster_router.hpp>
#include <redislock/detail/topology/cluster_slot.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>

namespace redislock {

/// A connection to a Redis Cluster: one hiredis pool per node, each command sent to the master of
/// its key's slot, MOVED and ASK followed. Thread-safe.
class hiredis_cluster_connection : private detail::cluster_router {
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
    hiredis_cluster_connection(std::vector<endpoint> seeds, defer_connect_t) {
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
};

static_assert(pipelining_connection<hiredis_cluster_connection>);
static_assert(contextual_connection<hiredis_cluster_connection>);
static_assert(contextual_pipelining_connection<hiredis_cluster_connection>);

}  // namespace redislock
