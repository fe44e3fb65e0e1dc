// redislock::lock_options: how one lock behaves (lease, watchdog, fencing, loss handler, waiting).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include <redislock/events.hpp>

namespace redislock {

/// Options of one lock object, given to client.mutex(), client.recursive_mutex() or
/// client.shared_mutex(). An aggregate: write `lock_options{.lease = 20s, .watchdog = true}`.
struct lock_options {
    /// How long Redis keeps the lock if its holder goes silent. Must be in (0, max_lease].
    std::chrono::milliseconds lease{30'000};

    /// Renew the lease while the lock is held (see watchdog.hpp). The lease should then be at
    /// least 6 x the connection's command_timeout (12 s with the default 2 s), so a stalled
    /// renewal can be retried twice before the local deadline; a lock made with a shorter one is
    /// told as lease_too_short (events.hpp).
    bool watchdog = false;

    /// Draw a strictly increasing fencing token on every new acquisition (fencing_token()).
    bool fencing = false;

    /// Called once when a held lock is found lost: expired, deleted, or taken by another holder.
    /// Called from the thread that found out (a lock call, the watchdog thread, or the loss
    /// timer's thread), never while the library holds an internal lock, so it may call back into
    /// the lock. Must not throw. on_lost_reason (below) is its sibling that is told why.
    std::function<void()> on_lost{};

    /// Waiting: exponential backoff with full jitter, from backoff_min doubling up to
    /// backoff_max, never past the holder's remaining lease.
    std::chrono::milliseconds backoff_min{1};
    /// The longest pause between two attempts (see backoff_min).
    std::chrono::milliseconds backoff_max{128};

    /// Explicit owner id for the reentrant kinds (and the lock's identity for the simple one):
    /// replaces the calling thread in the owner, so a task may lock on one thread and unlock on
    /// another. Empty means "the calling thread".
    std::string owner{};

    /// With the watchdog: the longest a lock is kept alive by renewals, counted from its
    /// acquisition; past it renewals stop, the lease runs out and the loss is reported through
    /// on_lost. Zero (the default) means no cap.
    std::chrono::milliseconds max_hold{0};

    /// Replicas that must acknowledge an acquisition, and each watchdog renewal, before it
    /// counts: the library sends WAIT min_replicas replica_timeout on the same connection, in the
    /// same round trip. An acquisition with fewer acknowledgements is undone (a re-entry of a
    /// reentrant or read-write lock too: its entry is left again and the object keeps the
    /// deadline it had); a wait with time left tries again, and the call throws
    /// redislock::replication_error (not contention) when none is left; a renewal with fewer is
    /// retried, and the lock reported lost if none is acknowledged before its lease runs out
    /// (what the lost object holds is then released in the background: the renewals that did not
    /// count still extended the key on the master, and must not keep rivals out past the loss;
    /// another object of the same owner keeps its own entries). WAIT is not
    /// consensus: an acknowledged write can still be lost if the replicas that hold it all fail,
    /// and a failover may promote a replica that had not acknowledged it yet; it narrows the
    /// window in which a hard master failure loses a just-acquired lock, it does not close it.
    /// Needs a pipelining connection. 0 (the default) sends no WAIT. See
    /// https://redis.io/commands/wait/
    int min_replicas = 0;

    /// How long WAIT waits for the replicas; must be positive and below the lease when
    /// min_replicas > 0 (WAIT with 0 would block for ever).
    std::chrono::milliseconds replica_timeout{100};

    /// As on_lost, and told why (the reason the client's lost event carries, see events.hpp).
    /// When both are set, on_lost runs first, then this, once each per loss, on the same thread
    /// and under the same rules.
    std::function<void(loss_reason)> on_lost_reason{};
};

/// The longest lease accepted: 2^40 ms, about 34 years (the steady clock and PX both hold it).
inline constexpr std::chrono::milliseconds max_lease{1LL << 40};

}  // namespace redislock
