// redislock::basic_redlock_client: locks held on a quorum of N independent Redis masters
// (Redlock), with the hiredis adapter as the default connection (redislock::redlock_client).
//
//   redislock::redlock_client rl{{"redis://10.0.0.1:6379", "redis://10.0.0.2:6379",
//                                 "redis://10.0.0.3:6379", "redis://10.0.0.4:6379",
//                                 "redis://10.0.0.5:6379"}};
//   auto m = rl.mutex("orders:42", {.lease = 10s});
//   if (std::unique_lock g{m, 2s}; g.owns_lock()) { ... }
//
// The masters must be independent (no replication between them): a lock is held when a
// majority of them hold its key, so any N/2 of them may be down or hung. See redlock_mutex.hpp
// for the algorithm and its outcomes.
//
// Only the simple lock is offered, without fencing: a fencing token needs one counter that
// every acquisition draws from in order, and independent masters have none. A counter on each
// master would let two acquisitions read the same or decreasing values from different
// majorities, so `lock_options{.fencing = true}` is refused with redislock::invalid_argument.
//
// Assumptions the safety of Redlock rests on (they are the algorithm's, not this library's):
// - Clocks: each master expires keys by its own clock, and this process measures validity on its
//   steady clock. Their rates may differ by at most the drift allowance, 1% of the lease
//   (+ 2 ms); a clock that jumps (a VM paused, a master's time set back) breaks the bound.
// - Restarts: a master restarted without persistence (or with AOF fsync less often than every
//   write) comes back without the keys it held, and could hand a lock out a second time while
//   the first holder still counts on it. Keep a restarted master out of service for at least
//   the longest lease in use (delayed restart), or run it with appendfsync always.
// - Pauses: a holder paused (GC, swap, SIGSTOP) past its validity may still act after the lock
//   passed to another; owned(), remaining() and lost_token() tell it as soon as it runs again,
//   but cannot stop work already under way.
//
// Thread safety: every member may be called from any thread.
// Lifetime: not copyable or movable. Locks share the client's core, so a lock may outlive its
// client and still release; the client's destructor stops lease renewals. A lock call runs its
// round on its own thread: it writes the command to every master's socket, then waits for all of
// them at once with poll(2) (no thread per master, no hand-off). A master with no connection
// open (first use, or its last one broke or went unanswered) is connected on a thread of its
// own meanwhile, and sent the command once connected if the round is not over: a master whose
// connects hang (dropped off the network, accept queue full) costs the round its answer only,
// never the other masters' (hiredis_connection, or any connection that models
// connected_fanout_connection). With connections that cannot start a command without waiting
// for its reply (see fanout_connection in connection.hpp) the masters are asked one after
// another instead.
// Threads per process that serve the client's locks, each started on first use: the loss timer
// and the watchdog (renewals); one per master while it is being connected (it ends 2 s after the
// last connect); releases that could not reach a master are finished by the process's reaper,
// on a thread per master with releases pending.
// fork(): a child never uses its parent's threads or connections; it makes its own on first
// use (the parent's copies are left untouched). As with any library that uses threads, fork()
// from a quiet moment: a fork while another thread is inside a lock call may leave the child's
// copy of an internal mutex locked.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/topology/redlock_core.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/quorum_error.hpp>
#include <redislock/redlock_mutex.hpp>
#include <redislock/redlock_options.hpp>

namespace redislock {

/// A client of N independent masters whose locks need a quorum of them (Redlock).
template <connection C>
class basic_redlock_client {
    static_assert(detail::check_connection<C>());

public:
    /// The connection type of each master.
    using connection_type = C;

    /// One master per URI (see endpoint.hpp). Nothing is sent yet: masters are connected on
    /// first use, so some may be down when the client is made.
    /// @throws redislock::invalid_argument for no URI, a malformed URI, the same master twice,
    ///         or a node_timeout that is not positive.
    explicit basic_redlock_client(
        const std::vector<std::string>& uris,
        redlock_options options = {}) requires std::constructible_from<C, endpoint>
        : basic_redlock_client{parse(uris), options} {}

    /// One master per endpoint. Each endpoint's connect and command timeouts are capped at
    /// options.node_timeout.
    /// @throws as the URI overload.
    explicit basic_redlock_client(
        std::span<const endpoint> masters,
        redlock_options options = {}) requires std::constructible_from<C, endpoint>
        : core_{make_core(masters, options)} {}

    basic_redlock_client(const basic_redlock_client&) = delete;
    basic_redlock_client& operator=(const basic_redlock_client&) = delete;
    ~basic_redlock_client() { core_->watchdog.stop(); }

    /// A simple lock on `name`, held on a quorum of the masters.
    /// @throws redislock::invalid_argument for a bad name or options, or fencing requested.
    basic_redlock_mutex<C> mutex(std::string_view name, lock_options options = {}) {
        return basic_redlock_mutex<C>{*this, name, std::move(options)};
    }

    /// The number of masters, N.
    std::size_t size() const noexcept { return core_->size(); }

    /// How many masters must agree: N/2 + 1.
    std::size_t quorum() const noexcept { return core_->quorum(); }

    /// The options the client was made with.
    const redlock_options& options() const noexcept { return core_->options(); }

private:
    template <redislock::connection D>
    friend class basic_redlock_mutex;

    static std::vector<endpoint> parse(const std::vector<std::string>& uris) {
        std::vector<endpoint> masters;
        masters.reserve(uris.size());
        for (const std::string& uri : uris) {
            masters.push_back(endpoint::from_uri(uri));
        }
        return masters;
    }

    static std::shared_ptr<detail::redlock_core<C>> make_core(std::span<const endpoint> masters,
                                                              redlock_options options) {
        if (masters.empty()) {
            throw invalid_argument{"redislock: a redlock client needs at least one master"};
        }
        if (options.node_timeout <= std::chrono::milliseconds::zero()) {
            throw invalid_argument{"redislock: redlock_options::node_timeout must be positive"};
        }
        std::vector<typename detail::redlock_core<C>::node_spec> nodes;
        nodes.reserve(masters.size());
        for (const endpoint& master : masters) {
            endpoint ep = master;
            ep.connect_timeout = std::min(ep.connect_timeout, options.node_timeout);
            ep.command_timeout = std::min(ep.command_timeout, options.node_timeout);
            std::string description = ep.describe();
            if (ep.db != 0) {
                description += "/" + std::to_string(ep.db);
            }
            for (const auto& node : nodes) {
                if (node.description == description) {
                    throw invalid_argument{"redislock: master " + description +
                                           " is listed twice; it would count twice in a quorum"};
                }
            }
            nodes.push_back({std::move(description), [ep] { return C{ep}; }});
        }
        return std::make_shared<detail::redlock_core<C>>(std::move(nodes), options);
    }

    std::shared_ptr<detail::redlock_core<C>> core_;
};

}  // namespace redislock
