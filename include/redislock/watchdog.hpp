// redislock::basic_watchdog: renews the leases of held locks while work runs.
//
// One background thread per client, however many locks are held. It keeps a timer queue of
// leases ordered by next renewal; each lease is renewed every lease/3 by its lock's
// compare-and-PEXPIRE script, counted from when the previous renewal was *sent*. Renewals that
// fall due together (within a quarter of their interval) go to Redis as one pipelined batch when
// the connection models pipelining_connection, one command each otherwise.
//
// A renewal that finds the lock gone (expired, deleted, taken, server restarted) marks it lost:
// the lock's owned() turns false and on_lost is called once, from the watchdog thread, with no
// library lock held (the handler may call unlock(), verify() or take other locks). A renewal
// that fails on the network is retried while lease time is left, and reported lost once the
// lease has surely run out. lock_options::max_hold caps how long a lock is kept alive: past it
// renewals stop and the expiry is reported like a loss. With a client event hook these show as
// renewal_retried, renewal_failed and lost events (events.hpp), and a NOSCRIPT healed by the
// watchdog as script_reloaded, all on the watchdog thread.
//
// Thread safety: every member may be called from any thread, including from on_lost handlers
// on the watchdog thread. remove() waits for a renewal of that lease in flight to finish (unless
// called from the watchdog thread), so once it returns no callback of the lease runs again.
// Lifetime: the thread starts with the first lease and is stopped and joined by stop() or the
// destructor; leases still registered then are dropped (their locks keep their current lease).
// A lease added after stop() is not renewed. An on_lost handler may destroy its own lock, but
// must leave at least one lock or the client alive until it returns (the thread still runs).
// A handler that blocks delays every renewal of the client, and unlock() on another thread
// waits for the batch in flight, handlers included: keep handlers short and non-blocking.
// A renewal's round trip ends by the time its lease surely runs out; a lock is told of its loss
// at that moment by the client's loss timer (detail/engine/loss_timer.hpp) even if the round trip
// is still blocked.
// fork(): the thread does not exist in a child; a child never renews its parent's leases. The
// child's first use builds a fresh watchdog (new thread, mutexes and condition variables) and
// never touches the parent's copy.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/detail/engine/owned_thread.hpp>
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/engine/watchdog_engine.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/lease_renewal.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock {

/// One thread that renews the leases of every lock of a client that asked for it
/// (lock_options::watchdog), at a third of each lease, pipelining renewals to the same server.
template <connection C>
class basic_watchdog {
public:
    /// Names one lease for remove() and cancel().
    using lease_id = std::uint64_t;

    /// Renews over `conn`, which must outlive the watchdog. The thread starts with the first lease.
    explicit basic_watchdog(C& conn) : basic_watchdog{conn, nullptr} {}

    /// As above, telling script reloads to `events` (a client's), which must outlive the
    /// watchdog; null tells nobody.
    basic_watchdog(C& conn, const detail::event_sink* events)
        : engine_{[&conn, events] {
              return std::make_unique<detail::watchdog_engine<C>>(conn, events);
          }} {}
    basic_watchdog(const basic_watchdog&) = delete;
    basic_watchdog& operator=(const basic_watchdog&) = delete;

    /// Starts renewing a lease whose last grant was sent at `sent`. Returns its id for remove(),
    /// or 0 when the watchdog was stopped (the lock keeps its current lease).
    /// @throws redislock::invalid_argument for a renewal without script or lease.
    lease_id add(lease_renewal renewal, detail::steady::time_point sent) {
        return engine_->add(std::move(renewal), sent);
    }

    /// Stops renewing a lease. Once it returns, none of the lease's callbacks runs again
    /// (a renewal already sent may still reach Redis; the scripts compare before they act).
    void remove(lease_id id) { engine_->remove(id); }

    /// Stops renewing a lease without waiting for a renewal in flight; its callbacks are skipped.
    void cancel(lease_id id) { engine_->cancel(id); }

    /// Stops and joins the thread; drops every lease. Idempotent.
    void stop() { engine_->stop(); }

    /// The number of leases being renewed.
    std::size_t size() { return engine_->size(); }
    /// Counters of what the watchdog sent.
    watchdog_stats stats() { return engine_->stats(); }

private:
    detail::per_process<detail::watchdog_engine<C>> engine_;
};

}  // namespace redislock
