// redislock::basic_redlock_mutex: a simple lock held on a quorum of independent masters
// (Redlock), made by basic_redlock_client::mutex().
//
// Acquire: SET name token NX PX lease with one random token, sent to every master at once, each
// call bounded by redlock_options::node_timeout. The lock is acquired when at least N/2+1
// masters said OK and the validity, lease - elapsed - drift (1% of the lease + 2 ms), is still
// positive. Otherwise the attempt is released on every master it was sent to, including those
// that failed or timed out (a hung master may still run the SET when it wakes up), and tried
// again after a random delay while the caller's deadline allows. Release, extend and renewal are
// the compare-and-delete and compare-and-PEXPIRE scripts of the single-master lock, sent to
// every master; key and value are those of redsync and node-redlock, so all three exclude each
// other on the same masters.
//
// TimedLockable, so std::unique_lock, std::scoped_lock and std::lock work with it.
//
// Timed calls: the first attempt always gets the full node_timeout (try_lock() makes exactly
// one, which takes at most node_timeout, connecting included); later attempts of
// try_lock_for and try_lock_until end by the caller's deadline, their calls cut short if need be
// (a call cut short counts as contention, never as an outage).
//
// Outcomes: contention (the name held by others on enough masters) makes try_lock* return
// false. Too few masters reachable to ever form a quorum (down, hung past node_timeout, error
// replies) throws redislock::quorum_error naming each master and its answer, within the
// per-master timeout (the masters are asked in parallel, never one after another). lock() and
// try_lock_for() throw it too instead of waiting for masters to come back: an outage is not
// contention, and a caller that wants to ride one out catches it and retries. Masters whose
// first connection is still being opened (a client just made, or a forked child) are not an
// outage: such an attempt counts as contention.
//
// Loss: the lock is known lost when a quorum round finds the key gone or taken on more than
// N - quorum masters, or locally when its validity runs out without a renewal confirmed by a
// quorum, whatever a blocked round trip is doing (a timer that does no I/O fires at that
// deadline). Once a loss by expiry is told, the acquisition is released on every master in the
// background: renewals or an extend() without a quorum still extended the key on the masters
// that answered, and must not keep it there past the validity the holder was told of. Each
// acquisition reports its loss once: on_lost is called, lost_token() is requested and owned() turns
// false. on_lost runs on the thread that found out (a lock call, the loss timer's or the
// watchdog's); it must not throw and should return quickly, as it delays other locks' loss reports
// (or renewals) while it runs.
//
// Renewal (lock_options::watchdog): the client's watchdog (watchdog.hpp) renews every lease/3
// with the compare-and-PEXPIRE script, sent to every master at once; only a quorum's
// confirmation moves the validity (counted from when the round was sent). A round that finds the
// key gone on more than N - quorum masters reports the loss; one with too few answers is tried
// again soon, and the loss timer ends the lock at its deadline if none succeeds. Renewals of the
// locks of one client that fall due together go out as one batch per master, each round bounded
// by node_timeout.
//
// Events (redlock_options::on_event, see events.hpp): acquired, contended (a round that won no
// quorum), released, lost and the watchdog's renewal events, about the lock as a whole; the
// client's reconnected events name one master.
//
// Thread safety: one object may be shared by several threads, as a std::mutex is; the thread
// that locked it holds it (or, with lock_options::owner set, the object does). lock() from the
// holder throws std::system_error(resource_deadlock_would_occur); unlock() from another thread
// does nothing, reports errc::not_holder and tells unlock_refused (redlock_options::on_event).
// Lifetime: independent of the client's (the core is shared). Movable, not copyable; a
// moved-from object behaves as a lock never held (queries answer "not held", lock calls throw
// redislock::invalid_argument). Destroying a held lock releases it.
// Exceptions: lock calls, extend() and verify() throw redislock::error subclasses on failures
// (never for contention); unlock() never throws.
// fork(): as the single-master lock: a child's copy of a lock its parent holds never renews or
// releases it.
#pragma once

#include <chrono>
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
#include <redislock/detail/blocking/acquisition_loop.hpp>
#include <redislock/detail/blocking/lock_handle.hpp>
#include <redislock/detail/blocking/timed_lockable.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/topology/quorum_round.hpp>
#include <redislock/detail/topology/redlock_core.hpp>
#include <redislock/detail/topology/redlock_release.hpp>
#include <redislock/detail/topology/redlock_state.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/quorum_error.hpp>

namespace redislock {

template <connection C>
class basic_redlock_client;

/// A simple lock held on a quorum of independent masters (Redlock). TimedLockable; see the top
/// of this header for validity, loss and faults.
template <connection C>
class basic_redlock_mutex
    : public detail::timed_lockable<basic_redlock_mutex<C>>,
      public detail::lock_handle<basic_redlock_mutex<C>, detail::redlock_state<C>> {
    using state = detail::redlock_state<C>;
    using handle = detail::lock_handle<basic_redlock_mutex, state>;
    using release = detail::redlock_release<C>;

public:
    /// Usually made by redlock_client.mutex(name, options). lock_options::min_replicas is
    /// ignored: independent masters have no replicas.
    /// @throws redislock::invalid_argument for an empty or oversized name, a lease out of range
    ///         or not above redlock_options::node_timeout plus the drift allowance, inconsistent
    ///         backoff bounds, or lock_options::fencing (see redlock.hpp: no counter
    ///         can order acquisitions made on independent masters).
    basic_redlock_mutex(basic_redlock_client<C>& client, std::string_view name,
                        lock_options options = {})
        : handle{std::make_shared<state>(client.core_, name, std::move(options))} {}

    using handle::unlock;

    /// Releases the lock on every master, waiting for each one's answer (at most
    /// redlock_options::node_timeout), and says how it went: no error (a quorum released it);
    /// errc::not_held or errc::not_holder (misuse: nothing is sent); errc::lock_lost (more than N -
    /// quorum masters no longer had it, or its loss was already told and a quorum still released
    /// it); errc::connection_failed or errc::server_failed (too few
    /// answers to tell). Masters that could not be reached get the release again in the background
    /// (redlock_options::release_retries) while the lease may still run; past that their key is
    /// left to expire.
    void unlock(std::error_code& ec) noexcept {
        given_up released;
        ec = handle::claim([&](state& st) { released = give_up_locked(st); });
        if (!ec) {
            ec = release::leave(state_, std::move(released));
        }
    }

    /// Sets the lease to `lease` from now on every master that still holds our token.
    /// Returns true when a quorum did; false (and reports the loss) when more than N - quorum
    /// masters no longer hold it; false at once if not held. A lease shorter than remaining()
    /// counts locally from when it is sent, whatever the outcome: it may have landed.
    /// @throws redislock::invalid_argument for a lease out of range; redislock::quorum_error
    ///         when too few masters answered to tell. See https://redis.io/commands/pexpire/
    bool extend(std::chrono::milliseconds lease) {
        detail::check_lease(lease);
        const auto acq = held_acquisition();
        if (!acq) {
            return false;
        }
        const detail::decimal lease_text{lease.count()};
        const auto sent = detail::steady::now();
        const bool shortening = tracker().extend_sending(acq->tok, sent, lease);
        bool held = false;
        try {
            const auto outcomes =
                core().round(detail::node_op::extend, *acq, sent + core().options().node_timeout,
                             {}, lease_text.view());
            held = quorum_holds(*acq, outcomes, "extend");
            if (held) {
                tracker().extended(acq->tok, sent, lease);
            }
        } catch (...) {
            if (shortening) {
                tracker().extend_returned(acq->tok);
            }
            throw;
        }
        if (shortening) {
            tracker().extend_returned(acq->tok);
        }
        return held;
    }

    /// Local, conservative estimate of how long the lock stays ours: the lease counted from when
    /// the last round a quorum confirmed was sent, minus a drift allowance (1% of the lease +
    /// 2 ms). Zero when not held or known lost.
    std::chrono::milliseconds remaining() const { return handle::held_remaining(); }

    /// Local: true while this object holds the lock, it is not known lost, and remaining() > 0.
    bool owned() const { return remaining() > std::chrono::milliseconds::zero(); }

    /// Asks every master whether the key still holds our token. Returns true when a quorum
    /// does; false (and reports the loss) when more than N - quorum do not; false if not held.
    /// @throws redislock::quorum_error when too few masters answered to tell.
    ///         See https://redis.io/commands/get/
    bool verify() {
        const auto acq = held_acquisition();
        if (!acq) {
            return false;
        }
        const auto outcomes = core().round(detail::node_op::verify, *acq,
                                           detail::steady::now() + core().options().node_timeout);
        return quorum_holds(*acq, outcomes, "verify");
    }

    /// Requested when the current (or, once released, the last) acquisition is lost: found
    /// gone on a quorum round, or its validity ran out unrenewed. unlock() does not request it.
    /// A token from before the first acquisition, or of a moved-from lock, is never requested.
    std::stop_token lost_token() const {
        if (!state_) {
            return {};
        }
        std::lock_guard guard{state_->mutex};
        return state_->lost_source.get_token();
    }

    /// @throws redislock::invalid_argument on a moved-from object.
    const std::string& name() const { return checked().name; }
    /// @throws redislock::invalid_argument on a moved-from object.
    const lock_options& options() const { return checked().options; }

private:
    friend class detail::timed_lockable<basic_redlock_mutex>;
    friend handle;
    using handle::checked;
    using handle::state_;
    using handle::tracker;
    using acquisition_ptr = std::shared_ptr<detail::redlock_acquisition>;

    detail::redlock_core<C>& core() const { return *checked().core; }

    acquisition_ptr held_acquisition() const {
        checked();
        std::lock_guard guard{state_->mutex};
        return state_->held && !state_->inherited_by_fork() ? state_->acq : nullptr;
    }

    // What a round on `acq` says: true when a quorum still holds it; false, with the loss
    // reported, when more than N - quorum masters no longer do.
    // @throws quorum_error naming `what` when too few answered to tell.
    bool quorum_holds(const detail::redlock_acquisition& acq,
                      const std::vector<detail::node_outcome>& outcomes, std::string_view what) {
        const detail::quorum_tally t = detail::tally(outcomes);
        if (t.yes >= core().quorum()) {
            return true;
        }
        if (t.no > core().size() - core().quorum()) {
            tracker().lose(acq.tok, loss_reason::taken);
            return false;
        }
        throw core().no_quorum(what, state_->name, outcomes);
    }

    bool acquire_until(detail::steady::time_point deadline, const std::stop_token& stop) {
        checked();
        {
            std::lock_guard guard{state_->mutex};
            if (state_->held && state_->caller_is_holder() && !state_->inherited_by_fork()) {
                throw std::system_error{
                    std::make_error_code(std::errc::resource_deadlock_would_occur),
                    "redislock: lock() of '" + state_->name + "' by its holder"};
            }
        }
        // The first attempt gets the full node timeout (try_lock() makes exactly one); later
        // ones end by the caller's deadline.
        const detail::event_sink& events = state_->core->events;
        detail::wait_tally tally;
        if (events.observed()) {
            tally.started = detail::steady::now();
        }
        const bool acquired = detail::acquire_with_backoff(
            [&] {
                ++tally.attempts;
                auto ttl = attempt(
                    stop, tally.attempts == 1 ? detail::steady::time_point::max() : deadline,
                    tally);
                if (ttl && !stop.stop_requested()) {
                    events.emit([&] {
                        lock_event e;
                        e.type = event_type::contended;
                        e.kind = lock_kind::redlock_mutex;
                        e.name = state_->name;
                        e.attempts = tally.attempts;
                        return e;
                    });
                }
                return ttl;
            },
            deadline, stop, state_->options);
        return acquired;
    }

    // One round on every master: std::nullopt when acquired; else an unknown holder TTL. Its
    // calls end by `give_up_by` if that comes before the node timeout; masters cut short that
    // way say nothing about an outage, so such a round counts as contention.
    std::optional<detail::holder_ttl> attempt(const std::stop_token& stop,
                                              detail::steady::time_point give_up_by,
                                              const detail::wait_tally& tally) {
        detail::redlock_core<C>& masters = core();
        auto acq = std::make_shared<detail::redlock_acquisition>(
            state_->name, state_->options.lease, masters.size());
        acq->sent = detail::steady::now();
        const auto full = acq->sent + masters.options().node_timeout;
        const auto node_deadline =
            std::min(full, std::max(give_up_by, acq->sent + std::chrono::milliseconds{1}));
        const bool cut_short = node_deadline < full;
        const auto outcomes = masters.round(detail::node_op::acquire, *acq, node_deadline, stop);
        const detail::quorum_tally t = detail::tally(outcomes);
        const auto valid_until = detail::valid_until(acq->sent, state_->options.lease);
        if (t.yes >= masters.quorum() && detail::steady::now() < valid_until) {
            on_acquired(acq, tally);
            return std::nullopt;
        }
        masters.release_in_background(acq);
        // Masters still opening their first connection say nothing of an outage (a client just
        // made, or a forked child, on a busy machine): a call with time left tries again.
        if (!stop.stop_requested() && !cut_short &&
            t.failed - t.first_connects > masters.size() - masters.quorum()) {
            throw masters.no_quorum("lock", state_->name, outcomes);
        }
        return detail::holder_ttl{-1};
    }

    // Records `acq` as held; reports the call's wait as acquired before its lease can be found
    // lost.
    void on_acquired(const acquisition_ptr& acq, const detail::wait_tally& tally) {
        bool previous_live = false;
        detail::tracked_lease<C> previous_lease;
        // lost_token() is kept past unlock(): this acquisition's stop state is made here, before
        // the books change (making it may throw; handing it over below cannot).
        std::stop_source lost_source;
        {
            std::lock_guard guard{state_->mutex};
            // Another thread of this object still thinks it holds: its validity ran out, since
            // a quorum let us in. That acquisition is lost. One made by the parent this process
            // was forked from is the parent's business.
            if (!state_->inherited_by_fork()) {
                previous_live = state_->held && !state_->lease.lost;
                previous_lease = std::exchange(state_->lease, {});
            } else {
                state_->lease = {};
            }
            state_->held = true;
            state_->acq = acq;
            state_->holder = detail::thread_number();
            state_->holder_thread = std::this_thread::get_id();
            state_->generation = detail::current_fork_generation();
            state_->lease.valid_until = detail::valid_until(acq->sent, state_->options.lease);
            state_->lease.acquired_at = acq->sent;
            state_->lease.kind = lock_kind::redlock_mutex;
            state_->lease.lost_source = lost_source;
            state_->lost_source = std::move(lost_source);
        }
        tracker().replaced(previous_lease, previous_live);
        tracker().begin(
            acq->tok, acq->sent, lock_kind::redlock_mutex, &tally,
            [&] {
                return detail::renewal_spec{
                    &detail::scripts::mutex_extend,
                    {state_->name},
                    {acq->tok.str(), std::string{state_->lease_text.view()}}};
            },
            [this] { handle::unlock(); });
    }

    using given_up = typename state::given_up;

    static given_up give_up_locked(state& st) noexcept { return st.give_up(); }

    static void release_on_destruction(const std::shared_ptr<state>& st) noexcept {
        handle::release_held(st, &give_up_locked, &release::leave);
    }
};

}  // namespace redislock
