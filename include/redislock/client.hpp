// redislock::basic_client: the entry point. Owns the connection and the process's instance id,
// and makes the locks.
//
//   redislock::client client{"redis://127.0.0.1:6379"};
//   auto m = client.mutex("orders:42", {.lease = 5s});
//
//   redislock::client observed{"redis://127.0.0.1:6379", {.on_event = hook}};  // events.hpp
//
// The default client, redislock::client (redislock.hpp), is basic_client<any_connection>: it
// takes one node, Sentinel or Cluster from the URI's scheme at run time (any_connection.hpp), so
// a service that runs one node in development and Sentinel or Cluster in production writes its
// lock code once, with one set of lock types (redislock::mutex, recursive_mutex, shared_mutex),
// and can be constructed before its servers are up. The topology costs one virtual call per
// command, far below one round trip. basic_client<C> with a connection type of one topology
// (node_client, sentinel_client, cluster_client) or a custom one fixes it at compile time.
//
// Thread safety: every member may be called from any thread.
// Lifetime: not copyable or movable. Locks share the client's machinery (connection, watchdog,
// loss timer, reaper), so a lock may outlive its client and is still renewed, told of its loss
// and released; the threads stop and are joined when the client and the last of its locks are
// gone.
// fork(): a child's copies of its parent's locks never renew or release them (unlock() there
// reports errc::not_holder, destruction sends nothing); the child may take locks of its own
// through the same client, and the hiredis adapter opens fresh connections for it. As with any
// library that uses threads, fork() while another thread is inside a lock call may leave the
// child's copy of an internal mutex locked: fork from a quiet moment, or make a new client.
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include <redislock/client_options.hpp>
#include <redislock/connection.hpp>
#include <redislock/counting_semaphore.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/events.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/mutex.hpp>
#include <redislock/recursive_mutex.hpp>
#include <redislock/semaphore_options.hpp>
#include <redislock/shared_mutex.hpp>

namespace redislock {

/// The entry point: owns the connection, the process's instance id and the watchdog, and makes
/// the locks. Every member may be called from any thread.
template <connection C>
class basic_client {
    static_assert(detail::check_connection<C>());

public:
    /// The connection type the client talks through.
    using connection_type = C;

    /// Takes ownership of a ready connection.
    explicit basic_client(C conn)
        : core_{std::make_shared<detail::client_core<C>>(client_options{}, std::move(conn))} {}

    /// Builds the connection in place from its constructor's arguments, e.g. a URI or an
    /// endpoint for hiredis_connection.
    /// @throws whatever C's constructor throws (for hiredis_connection: connection_error,
    ///         timeout_error, server_error, invalid_argument).
    template <class... Args>
    requires(sizeof...(Args) > 0 && std::constructible_from<C, Args...> &&
             !(sizeof...(Args) == 1 && (std::same_as<std::remove_cvref_t<Args>, basic_client> ||
                                        ...))) explicit basic_client(Args&&... args)
        : core_{std::make_shared<detail::client_core<C>>(client_options{},
                                                         std::forward<Args>(args)...)} {}

    /// Builds the connection from `arg` (a ready connection, a URI, an endpoint) and takes
    /// `options`: `redislock::client c{uri, {.on_event = hook}}`.
    /// @throws whatever C's constructor throws.
    template <class Arg>
    requires std::constructible_from<C, Arg> basic_client(Arg&& arg, client_options options)
        : core_{std::make_shared<detail::client_core<C>>(std::move(options),
                                                         std::forward<Arg>(arg))} {}

    basic_client(const basic_client&) = delete;
    basic_client& operator=(const basic_client&) = delete;
    ~basic_client() = default;

    /// A simple lock (SET NX PX) on `name`. @throws redislock::invalid_argument
    basic_mutex<C> mutex(std::string_view name, lock_options options = {}) {
        return basic_mutex<C>{*this, name, std::move(options)};
    }

    /// A reentrant lock (hash of owner -> count) on `name`. @throws redislock::invalid_argument
    basic_recursive_mutex<C> recursive_mutex(std::string_view name, lock_options options = {}) {
        return basic_recursive_mutex<C>{*this, name, std::move(options)};
    }

    /// A read-write lock (one hash, per-holder leases) on `name`.
    /// @throws redislock::invalid_argument
    basic_shared_mutex<C> shared_mutex(std::string_view name, lock_options options = {}) {
        return basic_shared_mutex<C>{*this, name, std::move(options)};
    }

    /// A counting semaphore of leased permits on `name` (counting_semaphore.hpp).
    /// @throws redislock::invalid_argument
    basic_counting_semaphore<C> semaphore(std::string_view name, semaphore_options options = {}) {
        return basic_counting_semaphore<C>{*this, name, std::move(options)};
    }

    /// The connection the client's locks share, for commands of the caller's own.
    C& connection() noexcept { return core_->connection; }

    /// Random 128-bit id of this client, the first half of every owner id it writes.
    const std::string& instance_id() const noexcept { return core_->instance_id; }

    /// The thread that renews leases of locks with lock_options::watchdog.
    basic_watchdog<C>& watchdog() noexcept { return core_->watchdog; }

private:
    template <redislock::connection D>
    friend class basic_mutex;
    template <redislock::connection D>
    friend class basic_recursive_mutex;
    template <redislock::connection D>
    friend class basic_shared_mutex;
    template <redislock::connection D>
    friend class basic_counting_semaphore;

    std::shared_ptr<detail::client_core<C>> core_;
};

}  // namespace redislock
