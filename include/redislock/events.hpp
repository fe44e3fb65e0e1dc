// redislock::lock_event: what a client tells its event hook (client_options::on_event), for
// metrics, logs and traces.
//
//   type             | when                                        | fields set (beside type)
//   -----------------+---------------------------------------------+-----------------------------
//   acquired         | a lock call took the lock (not a re-entry)  | name, kind, wait, attempts
//   contended        | an attempt found the lock held              | name, kind, attempts,
//                    |                                             | holder_ttl
//   released         | unlock() (or destruction) gave it back      | name, kind, held, detail
//                    |                                             | (when left to the reaper)
//   renewal_retried  | a watchdog renewal got no answer or an      | name, kind, detail
//                    | error reply, and will be sent again         |
//   renewal_failed   | a lease the watchdog renewed was given up:  | name, kind, reason, detail
//                    | refused, unconfirmed until its deadline, or |
//                    | max_hold reached; a lost event follows      |
//   lost             | a held lock was found lost                  | name, kind, held, reason
//   reconnected      | a connection was opened to replace one that | name (the server)
//                    | broke (on any node of a Cluster, any master |
//                    | of a Redlock client), or a Sentinel client  |
//                    | opened a pool to the master in place of an  |
//                    | earlier one (a switch)                      |
//   script_reloaded  | NOSCRIPT was answered with SCRIPT LOAD: the | name (the key it ran for),
//                    | script's first use on a server, or after a  | detail (the script)
//                    | restart, SCRIPT FLUSH or failover           |
//   subscription_    | the channel a lock's waiters of this client | name (the lock), detail (the
//   refused          | are told on was refused: the server said no | server's error, or what the
//                    | (NOPERM under a channel ACL, MOVED while    | connection threw)
//                    | its slot moves, no sharded pub/sub), or the |
//                    | connection could not name its node, or open |
//                    | a subscriber link to it (one that fails     |
//                    | before its first answer counts). Those      |
//                    | waiters poll, bounded by the holder's lease,|
//                    | until it is asked for again (10 s after     |
//                    | NOPERM, up to 10 s after an open that timed |
//                    | out, else 200 ms; never again without       |
//                    | sharded pub/sub)                            |
//   unlock_refused   | unlock() or unlock_shared() from a thread   | name, kind, holder_thread,
//                    | that does not hold the lock (a guard        | caller_thread, detail
//                    | released on another thread, a coroutine     |
//                    | resumed elsewhere): errc::not_holder,       |
//                    | nothing is sent, the holder keeps the lock  |
//                    | (and its watchdog renewals) until it unlocks|
//                    | on its own thread or the object is destroyed|
//   lease_too_short  | a lock object with lock_options::watchdog   | name, kind, detail (the
//                    | was made with a lease below 6 x the         | lease, the command timeout)
//                    | connection's command_timeout: a renewal that|
//                    | stalls for a whole command timeout cannot be|
//                    | retried twice before the local deadline     |
//   late_grant       | an attempt was granted the lock, but its    | name, kind, attempts,
//                    | reply came after the lease had run out: the | round_trip, detail
//                    | grant is given back and counts as a failed  |
//                    | attempt. Three attempts in a row answered   |
//                    | that late end the call with lease_error     |
//                    | (see "Attempts that can never succeed" in   |
//                    | docs/guarantees.md)                         |
//   evicting_server  | the client was made, and the server it      | name (the server, when the
//                    | connected to has a maxmemory-policy other   | connection says: "host:port"),
//                    | than noeviction: it may evict a lock (a     | detail (the policy and
//                    | second holder) or its queue keys. Locks     | maxmemory)
//                    | need noeviction. Asked with one INFO when   |
//                    | the client is made, only when a hook is set |
//                    | (for a Cluster: one master)                 |
//   permits_differ   | a semaphore object's acquisition found a    | name, kind (semaphore),
//                    | count of permits in Redis other than its    | detail (both counts)
//                    | semaphore_options::permits: the stored count|
//                    | stands (set_permits() changes it). Once per |
//                    | object, on the thread of the acquire call   |
//
// A lock's events come from its own calls, the client's watchdog and its loss timer; the
// connection's from the connection (see below). An acquisition reports acquired once, then
// released or lost once. A waiting call reports contended once per attempt that joined the queue
// (its first plain try, when it is followed at once by one that joins, is not counted). Redlock
// locks (redlock_options::on_event) report acquired, contended (each round that did not win a
// quorum), released, renewal_retried, renewal_failed and lost, about the lock as a whole, never
// one master; the Redlock client reports reconnected, naming one master (see below).
//
// Who reports reconnected, always naming the server as "host:port" (or its socket path):
// - hiredis_connection (node_client; redislock::client on a node URI): a context opened to
//   replace one that broke (a failed or timed-out call, or one the server closed while idle:
//   restart, CLIENT KILL, idle timeout).
// - hiredis_cluster_connection (cluster_client; redislock::client on redis-cluster://): the same
//   on each node's pool, naming the node. The first connection to a node is not a reconnection,
//   so a failover or resharding that moves slots to other nodes is not reported
//   (moved_redirections() and map_refreshes() count those).
// - sentinel_connection (sentinel_client): the same on the master's pool (while it is the
//   master's: a call that took the pool before a switch and reconnects to the demoted master is
//   not reported), and also a pool opened to the master in place of an earlier one: a switch to
//   a new master (named), or the same master confirmed again after no sentinel could confirm it
//   and its pool was dropped. Finding the first master is not one, and connections to the
//   sentinels themselves are never reported.
// - redlock_client (redlock_options::on_event): the same on each master's connection, naming
//   that master. The first connection to a master is not a reconnection.
// A reconnection is reported as the call that made it ends, once it holds no internal lock and
// gave its connection back (one made while a Cluster's slot map is read, or while a Sentinel
// master is resolved, is reported when that is over; one made during a Redlock round, when the
// round is over, so the hook never delays reading the other masters' answers). The hook's time
// still counts against a Redlock lock's validity, which is checked after it: a hook slower than
// the lease turns a won round into a failed attempt, or a watchdog renewal into a loss, both on
// the side of giving the lock up.
// Subscriber links (notified waiting), opened anew when one is lost, are not reported. A
// connection type of your own reports it when it has
// set_reconnect_handler(std::function<void(std::string_view)>).
//
// Threads: acquired and contended come on the thread that called lock(), try_lock*() or
// lock_shared(); released on the thread that called unlock() or destroyed the lock; lost on the
// thread that found out: a lock call (unlock, verify, extend, the next lock()), the client's
// watchdog thread (a refused renewal), or the client's loss timer thread (expired and
// client_shutdown: the local deadline passed without a confirmed renewal); renewal_retried on
// the watchdog thread, renewal_failed on the watchdog thread or, for a lease whose renewals went
// unconfirmed until its deadline, on the loss timer thread just before its lost event;
// reconnected and script_reloaded on whichever thread's call did it (a lock call, the watchdog,
// or the reaper that finishes background releases); what the sentinel_connection's subscription
// thread finds when it checks the master (after +switch-master, or after it subscribed again) is
// reported on that thread: a pool opened to a new master, or a connection of the master's pool
// reopened; subscription_refused on the client's subscriber thread, once per lock while the same
// refusal lasts (again for another reason, after a subscription succeeded, or a minute later);
// unlock_refused on the thread whose unlock() was refused; lease_too_short on the thread that
// made the lock object (client.mutex() and the others), each time one is made; late_grant on the
// thread of the lock call.
// evicting_server on the thread that makes the client, inside its constructor (the hook must not
// use that client then).
//
// Lifetime: the hook may be called as long as any lock of the client, or a release or queue
// exit left to the background reaper, is alive: after the client itself is gone, and for a
// few seconds after the last lock. What it captures must live that long (capture by shared_ptr,
// or use objects that live until the process exits).
// The hook is called with no internal lock held, so it may call back into the lock or the
// client; but contended and acquired events come while their thread holds the process's place
// in line for that name, so a slow hook delays the process's other waiters for it, and a hook
// that locks the same name on the same thread waits behind itself. It should be short: the
// watchdog, loss timer and subscriber threads serve every lock of the client (while it runs on
// the subscriber thread, no sleeping waiter of the client hears of a release). Do not wait for a
// lock in a subscription_refused hook: each attempt of that wait would wait out the command
// timeout for a subscription only the thread the hook holds can make. It must
// not throw; an exception it throws is caught and dropped. The string_views in an event are valid
// during the call only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>
#include <thread>

namespace redislock {

/// What happened; see the table at the top of events.hpp.
enum class event_type {
    acquired,              ///< a lock call took the lock
    contended,             ///< an attempt found the lock held
    released,              ///< unlock() or destruction gave the lock back
    renewal_retried,       ///< a watchdog renewal failed and will be sent again
    renewal_failed,        ///< a lease the watchdog renewed was given up
    lost,                  ///< a held lock was found lost
    reconnected,           ///< a broken connection was replaced, or a Sentinel master switched
    script_reloaded,       ///< NOSCRIPT was answered with SCRIPT LOAD
    subscription_refused,  ///< waiters of a lock poll: their channel was refused, or no
                           ///< subscriber link could be opened
    unlock_refused,        ///< unlock() from a thread that does not hold the lock: nothing sent
    lease_too_short,       ///< a watchdog lease below 6 x the connection's command_timeout
    late_grant,            ///< a grant whose reply came after its lease ran out was given back
    evicting_server,       ///< the server's maxmemory-policy may evict locks (not noeviction)
    permits_differ,        ///< a semaphore found a count of permits other than its options'
};

/// Which lock an event is about.
enum class lock_kind {
    none,                ///< not about one lock (reconnected, script_reloaded)
    mutex,               ///< basic_mutex
    recursive_mutex,     ///< basic_recursive_mutex
    shared_mutex_write,  ///< basic_shared_mutex, write side
    shared_mutex_read,   ///< basic_shared_mutex, read side
    redlock_mutex,       ///< basic_redlock_mutex (redlock_options::on_event)
    semaphore,           ///< basic_counting_semaphore
};

/// Why a held lock was lost (lock_event::reason, lock_options::on_lost_reason).
enum class loss_reason {
    /// The local conservative deadline passed without a confirmed renewal: no watchdog, renewals
    /// that got no answer in time, or max_hold reached.
    expired,
    /// The server says the lock is no longer ours: its token is gone or another holder's.
    taken,
    /// The server cannot vouch for it: a demoted master (READONLY, ROLE), the name now holds
    /// another type (WRONGTYPE), or the key was gone when verify() asked.
    server_lost,
    /// The client's watchdog was stopped while the lock was held, so the lease ran out.
    client_shutdown,
};

/// One event; which fields are set depends on its type (see the table at the top of events.hpp).
struct lock_event {
    /// What happened.
    event_type type{};
    /// Which kind of lock; lock_kind::none for events about the connection, and for
    /// subscription_refused.
    lock_kind kind = lock_kind::none;
    /// The lock's name; for reconnected the server ("host:port": the node, or the Sentinel
    /// master), for script_reloaded the key it ran for.
    std::string_view name{};
    /// acquired: from the call to the grant, waiting in line and between attempts included.
    std::chrono::microseconds wait{};
    /// acquired, contended: attempts the call has made so far (1 when the lock was free).
    std::uint32_t attempts = 0;
    /// released, lost: how long the acquisition was held, counted from when its granting attempt
    /// was sent.
    std::chrono::microseconds held{};
    /// contended: the holder's remaining lease as the server told it; negative when unknown.
    std::chrono::milliseconds holder_ttl{-1};
    /// lost, renewal_failed: why.
    loss_reason reason = loss_reason::expired;
    /// Free text: the script reloaded, the error a renewal got, a release left to the reaper, why
    /// a subscription was refused, what a misuse or a short lease risks.
    std::string_view detail{};
    /// unlock_refused: the thread that holds the lock (one of them for a read lock held by
    /// several), and the thread whose unlock() was refused.
    std::thread::id holder_thread{};
    /// unlock_refused: see holder_thread.
    std::thread::id caller_thread{};
    /// late_grant: how long the attempt's reply took, counted from its send.
    std::chrono::microseconds round_trip{};
};

/// The type of client_options::on_event.
using event_hook = std::function<void(const lock_event&)>;

/// The event type's name, e.g. "acquired".
constexpr std::string_view to_string(event_type type) noexcept {
    switch (type) {
        case event_type::acquired:
            return "acquired";
        case event_type::contended:
            return "contended";
        case event_type::released:
            return "released";
        case event_type::renewal_retried:
            return "renewal_retried";
        case event_type::renewal_failed:
            return "renewal_failed";
        case event_type::lost:
            return "lost";
        case event_type::reconnected:
            return "reconnected";
        case event_type::script_reloaded:
            return "script_reloaded";
        case event_type::subscription_refused:
            return "subscription_refused";
        case event_type::unlock_refused:
            return "unlock_refused";
        case event_type::lease_too_short:
            return "lease_too_short";
        case event_type::late_grant:
            return "late_grant";
        case event_type::evicting_server:
            return "evicting_server";
        case event_type::permits_differ:
            return "permits_differ";
    }
    return "unknown";
}

/// The lock kind's name, e.g. "mutex".
constexpr std::string_view to_string(lock_kind kind) noexcept {
    switch (kind) {
        case lock_kind::none:
            return "none";
        case lock_kind::mutex:
            return "mutex";
        case lock_kind::recursive_mutex:
            return "recursive_mutex";
        case lock_kind::shared_mutex_write:
            return "shared_mutex_write";
        case lock_kind::shared_mutex_read:
            return "shared_mutex_read";
        case lock_kind::redlock_mutex:
            return "redlock_mutex";
        case lock_kind::semaphore:
            return "semaphore";
    }
    return "unknown";
}

/// The loss reason's name, e.g. "expired".
constexpr std::string_view to_string(loss_reason reason) noexcept {
    switch (reason) {
        case loss_reason::expired:
            return "expired";
        case loss_reason::taken:
            return "taken";
        case loss_reason::server_lost:
            return "server_lost";
        case loss_reason::client_shutdown:
            return "client_shutdown";
    }
    return "unknown";
}

}  // namespace redislock
