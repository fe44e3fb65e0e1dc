// The machinery every lock kind shares, so that each safety rule is written once:
//   - what a reply means: an error reply transient or a real failure (is_transient,
//     throw_reply_error), one that says the lock is not ours (throw_unless_not_ours), a grant
//     that cannot stand (refuse_grant), an entry script's answer (decode_entry);
//   - a lock call whose grants can never stand: its replies counted against the lease
//     (late_replies), until it throws lease_error;
//   - tracked_lease: what a held acquisition keeps besides its kind's own fields — its local
//     deadline, registered with the client's loss timer so the loss is told at that moment
//     whatever a blocked round trip is doing; its watchdog renewal; the stop source of
//     lost_token(); whether its loss was already told;
//   - lease_tracker: starts, renews, loses and ends a tracked_lease for one lock object, and
//     tells its acquisition, its loss (the lost event, on_lost, on_lost_reason) and its
//     renewals' troubles;
//   - the acquisition loop (acquire_until) that rides out transient failures within the
//     caller's deadline and ends at once on a stop request.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/blocking/timed_lockable.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/detail/engine/reaper.hpp>
#include <redislock/detail/kinds/lock_identity.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/reply.hpp>
#include <redislock/watchdog.hpp>

namespace redislock::detail {

/// True for error replies that say "not now" rather than "no".
inline bool is_transient(const reply& r) {
    for (std::string_view code :
         {"LOADING", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "BUSY", "NOREPLICAS"}) {
        if (r.is_error_code(code)) {
            return true;
        }
    }
    // A script that reaches an undeclared key missing on a slot being migrated (the library's
    // declare every key they touch; a script of the caller's may not): the slot settles within
    // the migration. Redis 7.0 says "non local key"; later versions say the undeclared keys were
    // accessed "during rehashing of the slot".
    return r.is_error() && (r.text().find("non local key") != std::string::npos ||
                            r.text().find("rehashing of the slot") != std::string::npos);
}

/// TRYAGAIN: the lock's slot is being migrated and the keys the command declares are partly on
/// each side, so it did not run. To an acquisition it is no failure: waits ride it out as they
/// would a held lock (an untimed lock() too, since the cluster settles the slot), and a wait that
/// meets it until its deadline, try_lock() included, is not acquired.
class slot_migrating_error : public unavailable_error {
public:
    using unavailable_error::unavailable_error;
};

/// True when `e` says the attempt did not run because its slot is being migrated.
inline bool is_slot_migrating(const error& e) {
    return dynamic_cast<const slot_migrating_error*>(&e) != nullptr;
}

/// Throws the exception an error reply to `what` on `name` deserves.
[[noreturn]] inline void throw_reply_error(const reply& r, std::string_view what,
                                           std::string_view name) {
    const std::string message =
        "redislock: cannot " + std::string{what} + " '" + std::string{name} + "': " + r.text();
    if (r.is_error_code("TRYAGAIN")) {
        throw slot_migrating_error{message};
    }
    if (is_transient(r)) {
        throw unavailable_error{message};
    }
    throw server_error{message};
}

/// Throws for an error reply to `what` on `name` other than WRONGTYPE, which means the name now
/// holds another type, so the lock is surely not ours; other error replies (LOADING, BUSY,
/// READONLY...) say nothing about ownership.
inline void throw_unless_not_ours(const reply& r, std::string_view what, std::string_view name) {
    if (r.is_error() && !r.is_error_code("WRONGTYPE")) {
        throw_reply_error(r, what, name);
    }
}

/// errc::server_failed for a release or renewal answered with `r`, an error reply; the reply's
/// text becomes the code's message on this thread.
inline std::error_code server_failure(const reply& r) noexcept {
    try {
        last_server_failure() = r.text();
    } catch (...) {
    }
    return errc::server_failed;
}

/// False when the node that serves `key` says it is no longer a master (ROLE): after a failover
/// a client pinned to a demoted master may still read its lock there, but the node cannot vouch
/// for it. A node that refuses ROLE (an ACL, a proxy) is taken at its word.
template <connection C>
bool serves_as_master(C& conn, std::string_view key, steady::time_point deadline) {
    const std::array<std::string_view, 1> role{"ROLE"};
    const reply r = execute(conn, role, call_context{key, deadline, nullptr});
    if (!r.is_array() || r.elements().empty()) {
        return true;
    }
    return r.elements().front().text() == "master";
}

/// True when an acquisition that WAIT counted `replicas` for lacks the acknowledgements
/// lock_options::min_replicas asks for.
inline bool unacknowledged(std::int64_t replicas, const lock_options& options) {
    return options.min_replicas > 0 && replicas < options.min_replicas;
}

[[noreturn]] inline void throw_unacknowledged(std::string_view name, std::int64_t replicas,
                                              const lock_options& options) {
    throw replication_error{
        "redislock: '" + std::string{name} + "' was acquired but only " + std::to_string(replicas) +
        " of the " + std::to_string(options.min_replicas) +
        " replicas asked for acknowledged it within " +
        std::to_string(options.replica_timeout.count()) + " ms; the acquisition was undone"};
}

/// What refuse_grant() throws for a grant whose reply came after its lease ran out, given back:
/// a failed attempt, which the lock call counts (late_replies) and tells (late_grant event). Not
/// a redislock::error: it never leaves a lock call.
struct late_grant {
    steady::duration round_trip;  // from the attempt's send to its reply
};

/// Gives up, with `abandon()`, a grant of `lk` sent at `sent` that cannot stand: too few of the
/// replicas asked for acknowledged it (throws replication_error), or its lease ran out before
/// the reply came (throws late_grant: it counts as a failed attempt). std::nullopt when the
/// grant stands.
template <class State, class Abandon>
std::optional<holder_ttl> refuse_grant(const State& lk, steady::time_point sent,
                                       std::int64_t replicas, Abandon abandon) {
    if (unacknowledged(replicas, lk.options)) {
        abandon();
        throw_unacknowledged(lk.name, replicas, lk.options);
    }
    if (const auto now = steady::now(); now >= valid_until(sent, lk.options.lease)) {
        abandon();  // granted, but its lease ran out before the reply came
        throw late_grant{now - sent};
    }
    return std::nullopt;
}

/// Counts the attempts of one lock call that were answered only after their lease ran out
/// (counted from each attempt's send, with the drift allowance of valid_until()), granted or
/// not: such a reply proves that no grant could have stood. `limit` of them in a row, with no
/// attempt answered in time between them, end the call with lease_error; an attempt that failed
/// (timeout, connection error) neither counts nor breaks the row. One stall of the server or the
/// network thus costs an attempt or two, while round trips that always outlast the lease end the
/// call after three.
class late_replies {
public:
    static constexpr int limit = 3;

    /// Notes an attempt sent at `sent` and answered at `answered`; true once `limit` in a row
    /// were late.
    bool note(steady::time_point sent, steady::time_point answered,
              std::chrono::milliseconds lease) {
        if (answered < valid_until(sent, lease)) {
            in_a_row_ = 0;
            return false;
        }
        ++in_a_row_;
        last_ = answered - sent;
        return in_a_row_ >= limit;
    }

    /// Throws the lease_error that ends a lock call of `name` with `lease`.
    [[noreturn]] void fail(std::string_view name, std::chrono::milliseconds lease) const {
        throw lease_error{
            "redislock: cannot lock '" + std::string{name} + "': " + std::to_string(in_a_row_) +
            " attempts in a row were answered after their lease of " +
            std::to_string(lease.count()) + " ms had run out (the last after " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(last_).count()) +
            " ms), so no grant could stand; the lease must be longer than the round trips to "
            "the server"};
    }

private:
    int in_a_row_ = 0;
    steady::duration last_{};
};

/// What a reentrant or read-write acquisition script answers: its status (0: not acquired, then
/// `value` is the holder's TTL, saturated_ttl(); 1: a new acquisition; 2: a re-entry...), `value`
/// (the fencing token when acquired) and the id of the acquisition the entry belongs to.
struct entry_reply {
    std::int64_t status = 0;
    std::int64_t value = 0;
    std::string acquisition;
};

/// Decodes `r`, the reply of an entry script acquiring `name`.
/// @throws what throw_reply_error() throws for an error reply; redislock::server_error saying
///         `unexpected` for a reply of another shape.
inline entry_reply decode_entry(const reply& r, std::string_view name, const char* unexpected) {
    if (r.is_error()) {
        throw_reply_error(r, "lock", name);
    }
    if (!r.is_array() || r.elements().size() != 3) {
        throw server_error{unexpected};
    }
    entry_reply got{r.elements()[0].as_integer(), r.elements()[1].as_integer(),
                    r.elements()[2].text()};
    if (got.status == 0) {
        got.value = saturated_ttl(got.value).count();
    }
    return got;
}

/// True for failures a wait with time left rides out (then throws the last of them).
inline bool is_transient(const error& e) {
    return dynamic_cast<const connection_error*>(&e) != nullptr ||
           dynamic_cast<const unavailable_error*>(&e) != nullptr ||
           dynamic_cast<const replication_error*>(&e) != nullptr;  // a replica may catch up
}

/// The round-trip bound of one attempt of a call that ends at `deadline`: the deadline itself,
/// never more; for untimed calls, and for the first try of a call whose deadline had already
/// passed when it was made (`immediate`: try_lock(), a zero timeout), the connection's own
/// command timeout. No other attempt is started once the deadline has passed (see attempt_due).
inline call_context attempt_context(steady::time_point deadline, const std::stop_token& stop,
                                    bool immediate) {
    call_context how;
    if (!immediate) {
        how.deadline = deadline;
    }
    if (stop.stop_possible()) {
        how.stop = &stop;
    }
    return how;
}

/// Whether a waiting call may start another attempt: not once its deadline has passed, where
/// any round trip would end it late.
inline bool attempt_due(steady::time_point deadline) {
    return deadline == steady::time_point::max() || steady::now() < deadline;
}

/// Tries `attempt(how)` until it acquires, the deadline passes or a stop is requested; rides out
/// transient failures (connection errors, timeouts, LOADING, READONLY...) while the wait has time
/// left, then throws the last one. A call without a wait (deadline already past) throws at once,
/// and so does an untimed, unstoppable lock(): with no deadline and no way to stop it, riding out
/// an outage would hang its caller silently. A slot being migrated (slot_migrating_error) is
/// waited out as a held lock is, by every call. `attempt` returns std::nullopt when it acquired,
/// else the holder's TTL. No round trip of a waiting call lasts past its deadline (see
/// attempt_context).
template <class Attempt>
bool acquire_until(Attempt&& attempt, steady::time_point deadline, const std::stop_token& stop,
                   const lock_options& options) {
    backoff policy{options};
    // A replica that did not acknowledge says more than the timeout of a last attempt cut short
    // by the deadline: that is what the caller is told.
    std::exception_ptr unacknowledged;
    for (bool first = true;; first = false) {
        const bool immediate = first && !attempt_due(deadline);
        if (!immediate && !attempt_due(deadline)) {
            // Time is up before another attempt: one refused for too few replicas says why the
            // lock was not had, as another attempt would have said again.
            if (unacknowledged) {
                std::rethrow_exception(unacknowledged);
            }
            return false;
        }
        std::optional<holder_ttl> ttl;
        try {
            ttl = attempt(attempt_context(deadline, stop, immediate));
            if (!ttl) {
                return true;
            }
        } catch (const cancelled_error&) {
            return false;
        } catch (const error& e) {
            if (dynamic_cast<const replication_error*>(&e) != nullptr) {
                unacknowledged = std::current_exception();
            }
            const bool endless = deadline == steady::time_point::max() && !stop.stop_possible();
            if (!is_slot_migrating(e) && (endless || !is_transient(e) ||
                                          steady::now() >= deadline || stop.stop_requested())) {
                if (unacknowledged && dynamic_cast<const connection_error*>(&e) != nullptr) {
                    std::rethrow_exception(unacknowledged);
                }
                throw;
            }
            ttl = holder_ttl{-1};  // back off as if held with no known lease
        }
        const auto now = steady::now();
        if (now >= deadline || stop.stop_requested()) {
            return false;
        }
        const auto pause = std::min(policy.next(*ttl), deadline - now);
        if (!sleep_unless_stopped(pause, stop)) {
            return false;
        }
    }
}

/// A stop token that is already stopped: what lost_token() gives for a lock that is not held.
inline std::stop_token stopped_token() {
    std::stop_source source;
    source.request_stop();
    return source.get_token();
}

/// What a held acquisition keeps besides its kind's own fields. Guarded by its lock's mutex.
template <connection C>
struct tracked_lease {
    steady::time_point valid_until{};
    steady::time_point acquired_at{};  // held since then: hold times count from it
    lock_kind kind = lock_kind::none;  // what its events say it is
    bool lost = false;                 // told through on_lost and the stop source
    bool renewal_stopped = false;      // the watchdog stopped while it was renewed
    bool renewal_capped = false;       // the watchdog stopped renewing it at max_hold
    typename basic_watchdog<C>::lease_id renewal = 0;
    loss_timer::entry_id timer = 0;
    // Made by the first lost_token() (a stop state is an allocation most acquisitions never
    // need); stopped when the loss is told.
    mutable std::stop_source lost_source{std::nostopstate};
    std::uint64_t generation = current_fork_generation();  // whose engines the ids above name

    /// Local, conservative time left; zero once lost.
    std::chrono::milliseconds remaining() const {
        return lost ? std::chrono::milliseconds::zero() : time_left(valid_until);
    }

    /// The token whose stop is requested when this acquisition is told lost; already stopped
    /// once it is marked lost. Needs the lock's mutex, like every member.
    std::stop_token lost_token() const {
        if (lost) {
            return stopped_token();
        }
        if (!lost_source.stop_possible()) {
            lost_source = std::stop_source{};
        }
        return lost_source.get_token();
    }
};

/// Tells a loss on the calling thread: the lost event, then on_lost and on_lost_reason. The
/// handlers may destroy the lock: nothing of `lk` is read once they run.
template <class State>
void report_loss(const State& lk, lock_kind kind, loss_reason reason,
                 steady::time_point acquired_at) noexcept {
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::lost;
        e.kind = kind;
        e.name = lk.name;
        e.reason = reason;
        e.held = micros_since(acquired_at);
        return e;
    });
    call_on_lost(lk.lost_handlers, reason);
}

/// Tells that an acquisition of `lk` whose lease `t` was given back ended well.
template <class State, class Lease>
void report_release(const State& lk, const Lease& t, std::string_view detail = {}) noexcept {
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::released;
        e.kind = t.kind;
        e.name = lk.name;
        e.held = micros_since(t.acquired_at);
        e.detail = detail;
        return e;
    });
}

/// Tells that a lock call of `lk` acquired after the wait `tally` counted.
template <class State>
void report_acquired(const State& lk, lock_kind kind, const wait_tally& tally) noexcept {
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::acquired;
        e.kind = kind;
        e.name = lk.name;
        e.wait = micros_since(tally.started);
        e.attempts = tally.attempts;
        return e;
    });
}

/// Tells that an unlock() of `lk`, held as `kind` by `holder`, was refused to the calling thread
/// (errc::not_holder): nothing was sent and the holder keeps the lock, so a guard released on
/// the wrong thread is not silent.
template <class State>
void report_unlock_refused(const State& lk, lock_kind kind, std::thread::id holder) noexcept {
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::unlock_refused;
        e.kind = kind;
        e.name = lk.name;
        e.holder_thread = holder;
        e.caller_thread = std::this_thread::get_id();
        e.detail =
            "unlock() from a thread that does not hold the lock: nothing was sent, and the "
            "holder keeps the lock (and its renewals) until it unlocks on its own thread";
        return e;
    });
}

/// A watchdog lease should be at least this many command timeouts (docs/configuration.md, "Rules
/// of thumb"): a renewal is first sent at a third of the lease, and one that stalls for a whole
/// command timeout must leave room for two more before the local deadline.
inline constexpr int watchdog_lease_timeouts = 6;

/// The command timeout `conn` is configured with (a Sentinel connection's: its data nodes');
/// nothing for a connection that does not say.
template <class C>
std::optional<std::chrono::milliseconds> configured_command_timeout(const C& conn) {
    using std::chrono::milliseconds;
    if constexpr (requires { conn.config().command_timeout; }) {
        return std::chrono::duration_cast<milliseconds>(conn.config().command_timeout);
    } else if constexpr (requires { conn.config().node.command_timeout; }) {
        return std::chrono::duration_cast<milliseconds>(conn.config().node.command_timeout);
    } else {
        return std::nullopt;
    }
}

/// Tells lease_too_short for a lock `lk` of `kind` just made with the watchdog and a lease below
/// watchdog_lease_timeouts x the command timeout of its client's connection.
template <class State>
void report_short_watchdog_lease(const State& lk, lock_kind kind) noexcept {
    if (!lk.options.watchdog || !lk.core->events.observed()) {
        return;
    }
    std::optional<std::chrono::milliseconds> timeout;
    try {
        timeout = configured_command_timeout(lk.core->connection);
    } catch (...) {
        return;  // the connection's settings cannot be read here (out of memory after a fork)
    }
    if (!timeout || lk.options.lease >= watchdog_lease_timeouts * *timeout) {
        return;
    }
    const std::chrono::milliseconds command_timeout = *timeout;
    std::string detail;
    try {
        detail = "lease " + std::to_string(lk.options.lease.count()) + " ms is below " +
                 std::to_string(watchdog_lease_timeouts) + " x command_timeout (" +
                 std::to_string(command_timeout.count()) +
                 " ms): a renewal stalled for a whole command timeout cannot be retried twice "
                 "before the local deadline";
    } catch (...) {
        // Out of memory: the event goes without its text.
    }
    lk.core->events.emit([&] {
        lock_event e;
        e.type = event_type::lease_too_short;
        e.kind = kind;
        e.name = lk.name;
        e.detail = detail;
        return e;
    });
}

/// How the watchdog renews one acquisition: its kind's compare-and-PEXPIRE script, run over
/// `keys` and `args`.
struct renewal_spec {
    const script* renew_script = nullptr;
    std::vector<std::string> keys;
    std::vector<std::string> args;
};

/// True for a State whose scripts never shorten the server's expiry (`static constexpr bool
/// expiry_never_shortened = true`): the kinds whose entries several objects of one owner share.
/// A renewal or re-entry then never moves a local deadline earlier, since the one held stays
/// below the server's expiry; a shorter one would be told lost while still held.
template <class State>
inline constexpr bool deadline_never_earlier = requires {
    requires State::expiry_never_shortened;
};

/// Starts, renews, loses and ends tracked leases for one lock object. Its State has a
/// `std::mutex mutex`, `connection_type` (the C of its tracked_lease<C>), `lease_key` (what names
/// one acquisition) and `static tracked_lease<C>* find_lease(State&, const lease_key&)`, which
/// maps a key to its lease, or nullptr when that acquisition is no longer held; it is called with
/// the mutex held. Timer and watchdog callbacks hold the state weakly: a lock destroyed while
/// one of them runs is never touched after it is gone. Losses and renewal troubles are told with
/// no lock held, on the thread that found them.
template <class State>
class lease_tracker {
public:
    using tracked = tracked_lease<typename State::connection_type>;
    using key_type = typename State::lease_key;

    explicit lease_tracker(const std::shared_ptr<State>& st) : st_{st.get()}, self_{st} {}

    /// Ends the tracking of `previous`, the lease a fresh acquisition replaced in the state, and
    /// tells its loss when `live` (still held here: the fresh grant proves its lease ran out).
    void replaced(tracked& previous, bool live) {
        end(previous);
        if (live) {
            previous.lost_source.request_stop();
            report_loss(*st_, previous.kind, loss_reason::taken, previous.acquired_at);
        }
    }

    /// Tells the lock call's `wait` (when there is one) as acquired, then start()s tracking the
    /// fresh acquisition `key` of `kind`: acquired is thus told before its lease can be found
    /// lost. When tracking cannot start, `give_back()` releases the acquisition before the
    /// failure propagates: an untracked lease is not safe to hand out. `renewal()` makes the
    /// renewal_spec, called only with lock_options::watchdog.
    template <class Renewal, class GiveBack>
    void begin(const key_type& key, steady::time_point sent, lock_kind kind, const wait_tally* wait,
               Renewal renewal, GiveBack give_back) {
        if (wait != nullptr) {
            report_acquired(*st_, kind, *wait);
        }
        try {
            start(key, sent, renewal);
        } catch (...) {
            give_back();
            throw;
        }
    }

    /// Registers a fresh acquisition whose grant was sent at `sent`: the loss timer and, with
    /// lock_options::watchdog, renewals as the renewal_spec `make_renewal()` returns says.
    template <class MakeRenewal>
    void start(const key_type& key, steady::time_point sent, MakeRenewal make_renewal) {
        const auto deadline = valid_until(sent, st_->options.lease);
        // The key is captured as a copy of its own: a captured const key would be copied, not
        // moved, as the timer's entry moves.
        const auto timer = core().timer->add(
            deadline, [self = self_, key = key_type{key}]() -> loss_timer::loss_notice {
                // On the timer thread: mark the loss at once; the stop and the report are run by
                // the timer after every due lease was marked.
                auto st = self.lock();
                loss_timer::loss_notice notice;
                if (st) {
                    if (auto m = lease_tracker{st}.mark_only(key)) {
                        try {
                            notice.handler = then_take_back(deferred_report(*st, *m), self, key);
                            notice.source = m->source;
                        } catch (...) {
                            // Out of memory: told at once on this thread, stop first, rather
                            // than after every due lease is marked.
                            m->source.request_stop();
                            report_marked(*st, *m);
                            take_back(self, key);
                        }
                    }
                }
                let_go(std::move(st));
                return notice;
            });
        if (!attach(key, [&](tracked& t) {
                t.timer = timer;
                // Moved on meanwhile (a re-entry or extend() from the acquired event's hook).
                if (t.valid_until != deadline) {
                    core().timer->move(timer, t.valid_until);
                }
            })) {
            core().timer->remove(timer);
            return;
        }
        if (!st_->options.watchdog) {
            return;
        }
        renewal_spec renewal = make_renewal();
        lease_renewal watched{renewal.renew_script,
                              std::move(renewal.keys),
                              std::move(renewal.args),
                              st_->options.lease,
                              st_->options.max_hold,
                              [self = self_, key](steady::time_point renewed_at) {
                                  if (auto st = self.lock()) {
                                      lease_tracker{st}.renewed(key, renewed_at);
                                      let_go(std::move(st));
                                  }
                              },
                              {},
                              st_->options.min_replicas,
                              st_->options.replica_timeout};
        watched.lost_because = [self = self_, key](loss_reason reason, std::string_view why) {
            if (auto st = self.lock()) {
                lease_tracker{st}.renewal_failed(key, reason, why);
                let_go(std::move(st));
            }
        };
        if (core().events.observed()) {
            watched.retried = [self = self_, key](std::string_view why) {
                if (auto st = self.lock()) {
                    lease_tracker{st}.renewal_retried(key, why);
                    let_go(std::move(st));
                }
            };
            // Only the detail of the renewal_failed event that follows depends on it.
            watched.capped = [self = self_, key] {
                if (auto st = self.lock()) {
                    lease_tracker{st}.renewal_capped(key);
                    let_go(std::move(st));
                }
            };
        }
        if (core().events.observed() || st_->options.on_lost_reason) {
            // Only the reason of the loss that follows depends on it.
            watched.dropped = [self = self_, key] {
                if (auto st = self.lock()) {
                    lease_tracker{st}.renewal_dropped(key);
                    let_go(std::move(st));
                }
            };
        }
        const auto id = core().watchdog.add(std::move(watched), sent);
        if (!attach(key, [&](tracked& t) {
                t.renewal = id;
                t.renewal_stopped = id == 0;  // the watchdog had stopped: nothing renews it
            })) {
            core().watchdog.cancel(id);
        }
    }

    /// A renewal sent at `renewed_at` was confirmed: the local deadline moves.
    void renewed(const key_type& key, steady::time_point renewed_at) {
        renewed_for(key, renewed_at, st_->options.lease);
    }

    /// An extend() of `lease` sent at `sent` succeeded.
    void extended(const key_type& key, steady::time_point sent, std::chrono::milliseconds lease) {
        renewed_for(key, sent, lease);
    }

    /// What an extend() (or, with a zero `lease`, a check) of `key` sent at `sent` learns from
    /// its script's reply `r` (1: still ours; 0 or WRONGTYPE: no longer): true when still ours,
    /// the local deadline moved for `lease`; false when not, the loss told.
    /// @throws what throw_reply_error() throws for another error reply to `what`, which says
    ///         nothing about ownership.
    bool extend_replied(const key_type& key, const reply& r, steady::time_point sent,
                        std::chrono::milliseconds lease, std::string_view what = "extend") {
        if (r.is_integer() && r.as_integer() == 1) {
            if (lease > std::chrono::milliseconds::zero()) {
                extended(key, sent, lease);
            }
            return true;
        }
        throw_unless_not_ours(r, what, st_->name);
        lose(key, r.is_error() ? loss_reason::server_lost : loss_reason::taken);
        return false;
    }

    /// Marks the acquisition lost and tells it (stop source, lost event, on_lost), once.
    void lose(const key_type& key, loss_reason reason) {
        if (auto m = mark_only(key)) {
            // Outside the mutex: stop callbacks run inside request_stop() and may call the lock.
            m->source.request_stop();
            report_loss(*st_, m->kind, reason, m->acquired_at);
        }
    }

    /// What marking a loss found: the source to stop and what the report needs.
    struct marked {
        std::stop_source source;
        steady::time_point acquired_at;
        lock_kind kind;
        bool renewed;   // the watchdog was renewing it
        bool shutdown;  // the watchdog had stopped while renewing it
        bool capped;    // the watchdog had stopped at max_hold
    };

    /// Marks the acquisition lost and leaves the stop and the report to the caller, or returns
    /// nothing when it was already lost or gone. Its renewals stop: renewing a lost lease could
    /// only revive it behind a rival's back. Runs no user code and allocates nothing (a
    /// default-made std::stop_source would: it runs on the loss timer's thread and in unlock()).
    std::optional<marked> mark_only(const key_type& key) noexcept {
        decltype(tracked::renewal) renewal = 0;
        std::optional<marked> m;
        {
            std::lock_guard guard{st_->mutex};
            tracked* t = State::find_lease(*st_, key);
            if (t == nullptr || t->lost) {
                return std::nullopt;
            }
            t->lost = true;
            renewal = std::exchange(t->renewal, 0);
            m.emplace(marked{t->lost_source, t->acquired_at, t->kind, renewal != 0,
                             t->renewal_stopped, t->renewal_capped});
        }
        if (renewal != 0) {
            core().watchdog.cancel(renewal);  // never waits: the timer thread must not block
        }
        return m;
    }

    /// Stops the timer and renewals of an acquisition that ended; `t` was taken out of the
    /// state with the mutex held (its ids are this acquisition's alone). Never waits for a
    /// renewal in flight: its callbacks find the acquisition gone. Allocates nothing: an id is
    /// only looked up in an engine of this process that made it.
    void end(tracked& t) noexcept {
        const auto renewal = std::exchange(t.renewal, 0);
        const auto timer = std::exchange(t.timer, 0);
        if (t.generation != current_fork_generation()) {
            return;  // the parent's ids: they mean other leases in this process's engines
        }
        if (renewal != 0) {
            core().watchdog.cancel(renewal);
        }
        if (timer != 0) {
            core().timer->remove(timer);
        }
    }

private:
    // A callback may hold the last reference to a lock whose owner just destroyed it; the state
    // then ends on the reaper's thread, since its end may end the client's core, which owns the
    // thread the callback runs on.
    static void let_go(std::shared_ptr<State>&& st) {
        if (st && st.use_count() == 1) {
            try {
                background_reaper().add(
                    reaper::no_server, [last = std::move(st)](steady::time_point) { return true; },
                    steady::now() + std::chrono::seconds{1});
            } catch (...) {
                // Out of memory: st ends here, as it would have without this step.
            }
        }
    }

    // After a loss by expiry, once it is told: has the kind take back, in the background, what
    // renewals or extends that were never confirmed (too few replicas acknowledged them, no
    // answer, no quorum) may have left in Redis past the lease the holder was told of
    // (State::clean_up_expired(st, key), for kinds that have it). Told first, taken back after,
    // so no rival gets in before the holder knows; a lost reply only delays it (the reaper tries
    // again), and a later acquisition is never touched (each is named by its own key).
    static void take_back(const std::weak_ptr<State>& self, const key_type& key) noexcept {
        if constexpr (requires(const std::shared_ptr<State>& st) {
                          State::clean_up_expired(st, key);
                      }) {
            if (auto st = self.lock()) {
                State::clean_up_expired(st, key);
                let_go(std::move(st));
            }
        }
    }

    // `report`, then take_back().
    static std::function<void()> then_take_back(std::function<void()> report,
                                                const std::weak_ptr<State>& self,
                                                const key_type& key) {
        if constexpr (requires(const std::shared_ptr<State>& st) {
                          State::clean_up_expired(st, key);
                      }) {
            return [report = std::move(report), self, key] {
                if (report) {
                    report();
                }
                take_back(self, key);
            };
        } else {
            return report;
        }
    }

    // What the loss timer runs once every due lease is marked: for a lease the watchdog renewed,
    // renewal_failed first (no renewal was confirmed in time); then the lost event, on_lost and
    // on_lost_reason. Empty when nobody listens.
    static std::function<void()> deferred_report(const State& st, const marked& m) {
        const event_hook& hook = st.core->events.hook();
        if (!hook && !st.lost_handlers) {
            return {};
        }
        const loss_reason reason = expiry_reason(m);
        const auto held = hook ? micros_since(m.acquired_at) : std::chrono::microseconds{};
        return [hook, handlers = st.lost_handlers, name = st.name, kind = m.kind, reason, held,
                capped = m.capped, failed = m.renewed && !m.shutdown] {
            if (failed) {
                emit_to(hook, [&] { return expiry_renewal_failed(name, kind, reason, capped); });
            }
            emit_to(hook, [&] {
                lock_event e;
                e.type = event_type::lost;
                e.kind = kind;
                e.name = name;
                e.reason = reason;
                e.held = held;
                return e;
            });
            call_on_lost(handlers, reason);
        };
    }

    // Why a lease marked lost at its deadline was lost.
    static loss_reason expiry_reason(const marked& m) noexcept {
        return m.shutdown ? loss_reason::client_shutdown : loss_reason::expired;
    }

    // The renewal_failed event told before the loss of a lease the watchdog renewed until its
    // deadline.
    static lock_event expiry_renewal_failed(std::string_view name, lock_kind kind,
                                            loss_reason reason, bool capped) noexcept {
        lock_event e;
        e.type = event_type::renewal_failed;
        e.kind = kind;
        e.name = name;
        e.reason = reason;
        e.detail =
            capped ? "max_hold reached" : "no renewal was confirmed before the local deadline";
        return e;
    }

    // What deferred_report() would tell, told at once (when it cannot be deferred).
    static void report_marked(const State& st, const marked& m) noexcept {
        const loss_reason reason = expiry_reason(m);
        if (m.renewed && !m.shutdown) {
            st.core->events.emit(
                [&] { return expiry_renewal_failed(st.name, m.kind, reason, m.capped); });
        }
        report_loss(st, m.kind, reason, m.acquired_at);
    }

    // On the watchdog thread: a renewal found the lease gone or gave it up.
    void renewal_failed(const key_type& key, loss_reason reason, std::string_view why) {
        auto m = mark_only(key);
        if (!m) {
            return;
        }
        m->source.request_stop();
        core().events.emit([&] {
            lock_event e;
            e.type = event_type::renewal_failed;
            e.kind = m->kind;
            e.name = st_->name;
            e.reason = reason;
            e.detail = why;
            return e;
        });
        report_loss(*st_, m->kind, reason, m->acquired_at);
        if (reason == loss_reason::expired) {
            take_back(self_, key);
        }
    }

    // On the watchdog thread: a renewal failed and will be sent again.
    void renewal_retried(const key_type& key, std::string_view why) {
        lock_kind kind = lock_kind::none;
        {
            std::lock_guard guard{st_->mutex};
            tracked* t = State::find_lease(*st_, key);
            if (t == nullptr || t->lost) {
                return;
            }
            kind = t->kind;
        }
        core().events.emit([&] {
            lock_event e;
            e.type = event_type::renewal_retried;
            e.kind = kind;
            e.name = st_->name;
            e.detail = why;
            return e;
        });
    }

    // On the watchdog thread: max_hold stopped the renewals; the loss that follows says so.
    void renewal_capped(const key_type& key) {
        std::lock_guard guard{st_->mutex};
        if (tracked* t = State::find_lease(*st_, key); t && !t->lost) {
            t->renewal_capped = true;
        }
    }

    // The watchdog stopped with the lease registered: its loss, when the lease runs out, is the
    // client's shutdown.
    void renewal_dropped(const key_type& key) {
        std::lock_guard guard{st_->mutex};
        if (tracked* t = State::find_lease(*st_, key); t && !t->lost) {
            t->renewal = 0;
            t->renewal_stopped = true;
        }
    }

    void renewed_for(const key_type& key, steady::time_point sent,
                     std::chrono::milliseconds lease) {
        std::lock_guard guard{st_->mutex};
        if (tracked* t = State::find_lease(*st_, key); t && !t->lost) {
            auto until = valid_until(sent, lease);
            if constexpr (deadline_never_earlier<State>) {
                until = std::max(until, t->valid_until);
            }
            t->valid_until = until;
            core().timer->move(t->timer, t->valid_until);
        }
    }

    // Stores an id in a live, not yet lost acquisition; false when it is gone or lost.
    template <class Set>
    bool attach(const key_type& key, Set set) {
        std::lock_guard guard{st_->mutex};
        tracked* t = State::find_lease(*st_, key);
        if (t == nullptr || t->lost) {
            return false;
        }
        set(*t);
        return true;
    }

    // The client's core (client_core<C>, or a Redlock client's): its loss timer and watchdog.
    auto& core() { return *st_->core; }

    State* st_;
    std::weak_ptr<State> self_;
};

}  // namespace redislock::detail
