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
// one, which takes at most node_timeout and a quarter); later attempts of try_lock_for and
// try_lock_until end by the caller's deadline, their calls cut short if need be (a call cut
// short counts as contention, never as an outage).
//
// Outcomes: contention (the name held by others on enough masters) makes try_lock* return
// false. Too few masters reachable to ever form a quorum (down, hung past node_timeout, error
// replies) throws redislock::quorum_error naming each master and its answer, within the
// per-master timeout (the masters are asked in parallel, never one after another). lock() and
// try_lock_for() throw it too instead of waiting for masters to come back: an outage is not
// contention, and a caller that wants to ride one out catches it and retries.
//
// Loss: the lock is known lost when a quorum round finds the key gone or taken on more than
// N - quorum masters, or locally when its validity runs out without a renewal confirmed by a
// quorum, whatever a blocked round trip is doing (a timer that does no I/O fires at that
// deadline). Each acquisition reports its loss once: on_lost is called, lost_token() is
// requested and owned() turns false. on_lost runs on the thread that found out (a lock call,
// the loss timer's or the renewal thread); it must not throw and should return quickly, as it
// delays other locks' loss deadlines while it runs.
//
// Renewal (lock_options::watchdog): every lease/3 a compare-and-PEXPIRE round goes to the
// masters; only a quorum's confirmation moves the validity (counted from when the round was
// sent). A round that finds the key gone on more than N - quorum masters reports the loss; one
// with too few answers is tried again soon, and the loss timer ends the lock at its deadline if
// none succeeds. Rounds of all locks of a client run one after another on one thread, each
// bounded by node_timeout.
//
// Thread safety: one object may be shared by several threads, as a std::mutex is; the thread
// that locked it holds it (or, with lock_options::owner set, the object does). lock() from the
// holder throws std::system_error(resource_deadlock_would_occur); unlock() from another thread
// does nothing and reports errc::not_holder.
// Lifetime: independent of the client's (the core is shared). Movable, not copyable; a
// moved-from object may only be destroyed or assigned to. Destroying a held lock releases it.
// Exceptions: lock calls, extend() and verify() throw redislock::error subclasses on failures
// (never for contention); unlock() never throws.
// fork(): as the single-master lock: a child's copy of a lock its parent holds never renews or
// releases it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
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
#include <redislock/detail/lockable.hpp>
#include <redislock/detail/names.hpp>
#include <redislock/detail/quorum_round.hpp>
#include <redislock/detail/redlock_core.hpp>
#include <redislock/detail/token.hpp>
#include <redislock/detail/wait.hpp>
#include <redislock/error.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/quorum_error.hpp>

namespace redislock {

template <connection C>
class basic_redlock_client;

/// A simple lock held on a quorum of independent masters (Redlock). TimedLockable; see the top
/// of this header for validity, loss and faults.
template <connection C>
class basic_redlock_mutex : public detail::timed_lockable<basic_redlock_mutex<C>> {
public:
    /// Usually made by redlock_client.mutex(name, options).
    /// @throws redislock::invalid_argument for an empty or oversized name, a lease out of range
    ///         or not above redlock_options::node_timeout plus the drift allowance, inconsistent
    ///         backoff bounds, or lock_options::fencing (see redlock.hpp: no counter
    ///         can order acquisitions made on independent masters).
    basic_redlock_mutex(basic_redlock_client<C>& client, std::string_view name,
                        lock_options options = {})
        : core_{client.core_},
          state_{std::make_shared<state>(name, std::move(options), core_->options().node_timeout)} {
    }

    /// Takes over another object's lock, held or not; the moved-from object is as one never held.
    basic_redlock_mutex(basic_redlock_mutex&&) noexcept = default;
    /// Releases the lock this object holds, if any, then takes over `other`'s.
    basic_redlock_mutex& operator=(basic_redlock_mutex&& other) noexcept {
        if (this != &other) {
            release_on_destruction();
            core_ = std::move(other.core_);
            state_ = std::move(other.state_);
        }
        return *this;
    }
    ~basic_redlock_mutex() { release_on_destruction(); }

    /// Releases the lock on every master. Never throws; a lock found lost calls on_lost.
    void unlock() noexcept {
        std::error_code ignored;
        unlock(ignored);
    }

    /// Releases the lock on every master, waiting for each one's answer (at most
    /// redlock_options::node_timeout), and says how it went: no error (a quorum released it);
    /// errc::not_held or errc::not_holder (misuse: nothing is sent); errc::lock_lost (more than N -
    /// quorum masters no longer had it); errc::connection_failed or errc::server_failed (too few
    /// answers to tell). Masters that could not be reached get the release again in the background
    /// (redlock_options::release_retries) while the lease may still run; past that their key is
    /// left to expire.
    void unlock(std::error_code& ec) noexcept {
        ec.clear();
        given_up released;
        {
            std::lock_guard guard{state_->mutex};
            if (!state_->held) {
                ec = errc::not_held;
                return;
            }
            if (!state_->caller_is_holder() || state_->inherited_by_fork()) {
                ec = errc::not_holder;
                return;
            }
            released = give_up_locked();
        }
        ec = release(released);
    }

    /// Sets the lease to `lease` from now on every master that still holds our token.
    /// Returns true when a quorum did; false (and reports the loss) when more than N - quorum
    /// masters no longer hold it; false at once if not held.
    /// @throws redislock::invalid_argument for a lease out of range; redislock::quorum_error
    ///         when too few masters answered to tell. See https://redis.io/commands/pexpire/
    bool extend(std::chrono::milliseconds lease) {
        detail::check_lease(lease);
        const auto acq = held_acquisition();
        if (!acq) {
            return false;
        }
        std::optional<quorum_error> error;
        switch (renew_on(*core_, *state_, acq, lease, detail::steady::now(), &error)) {
            case renewal::renewed:
                return true;
            case renewal::lost:
                return false;
            case renewal::unknown:
                break;
        }
        throw std::move(*error);
    }

    /// Local, conservative estimate of how long the lock stays ours: the lease counted from when
    /// the last round a quorum confirmed was sent, minus a drift allowance (1% of the lease +
    /// 2 ms). Zero when not held or known lost.
    std::chrono::milliseconds remaining() const {
        std::lock_guard guard{state_->mutex};
        if (!state_->held || state_->lost) {
            return std::chrono::milliseconds::zero();
        }
        return detail::time_left(state_->valid_until);
    }

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
        const auto deadline = detail::steady::now() + core_->options().node_timeout;
        auto round = core_->start_round(detail::node_op::verify, acq, deadline);
        const auto outcomes = core_->finish_round(*round, deadline);
        const detail::quorum_tally t = detail::tally(outcomes);
        if (t.yes >= core_->quorum()) {
            return true;
        }
        if (t.no > core_->size() - core_->quorum()) {
            mark_lost(*state_, acq);
            return false;
        }
        throw core_->no_quorum("verify", state_->name, outcomes);
    }

    /// Requested when the current (or, once released, the last) acquisition is lost: found
    /// gone on a quorum round, or its validity ran out unrenewed. unlock() does not request it.
    /// A token from before the first acquisition is never requested.
    std::stop_token lost_token() const {
        std::lock_guard guard{state_->mutex};
        return state_->lost_source.get_token();
    }

    /// The lock's name: its key on every master.
    const std::string& name() const noexcept { return state_->name; }
    /// The options the lock was made with.
    const lock_options& options() const noexcept { return state_->options; }

private:
    friend class detail::timed_lockable<basic_redlock_mutex>;
    using core_type = detail::redlock_core<C>;
    using acquisition_ptr = std::shared_ptr<detail::redlock_acquisition>;

    struct state {
        state(std::string_view lock_name, lock_options opts, std::chrono::milliseconds node_timeout)
            : name{lock_name}, options{std::move(opts)}, lease_text{options.lease.count()} {
            detail::check_options(name, options);
            if (options.lease <=
                node_timeout + options.lease / 100 + std::chrono::milliseconds{2}) {
                throw invalid_argument{
                    "redislock: a redlock lease must exceed redlock_options::node_timeout (" +
                    std::to_string(node_timeout.count()) +
                    " ms) plus the drift allowance, or no acquisition could ever be valid"};
            }
            if (options.fencing) {
                throw invalid_argument{
                    "redislock: a redlock lock cannot offer fencing tokens: no single counter "
                    "orders acquisitions made on independent masters, so the tokens would not "
                    "reliably grow (use a single-master client for '" +
                    name + "')"};
            }
            channel = detail::derived_key(name, "released");
        }

        bool caller_is_holder() const {
            return !options.owner.empty() || holder == std::this_thread::get_id();
        }
        bool inherited_by_fork() const { return generation != detail::current_fork_generation(); }

        std::string name;
        lock_options options;
        detail::decimal lease_text;
        std::string channel;

        mutable std::mutex mutex;  // guards the members below; never held across a round
        bool held = false;
        bool lost = false;  // held, but found lost (reported)
        acquisition_ptr acq;
        std::thread::id holder;
        std::uint64_t generation = 0;
        detail::steady::time_point acquired_at;
        detail::steady::time_point valid_until;
        std::stop_source lost_source;
        detail::deadline_timer::id loss_check = 0;
        detail::deadline_timer::id renewal = 0;
    };

    enum class renewal { renewed, lost, unknown };

    acquisition_ptr held_acquisition() const {
        std::lock_guard guard{state_->mutex};
        return state_->held && !state_->inherited_by_fork() ? state_->acq : nullptr;
    }

    bool acquire_until(detail::steady::time_point deadline, const std::stop_token& stop) {
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
        bool first = true;
        return detail::acquire_with_backoff(
            [this, &stop, &first, deadline] {
                return attempt(stop, std::exchange(first, false) ? detail::steady::time_point::max()
                                                                 : deadline);
            },
            deadline, stop, state_->options);
    }

    // One round on every master: std::nullopt when acquired; else an unknown holder TTL. Its
    // calls end by `give_up_by` if that comes before the node timeout; masters cut short that
    // way say nothing about an outage, so such a round counts as contention.
    std::optional<detail::holder_ttl> attempt(const std::stop_token& stop,
                                              detail::steady::time_point give_up_by) {
        auto acq = std::make_shared<detail::redlock_acquisition>(
            state_->name, state_->channel, state_->options.lease, core_->size());
        acq->sent = detail::steady::now();
        acq->may_live_until(acq->sent + state_->options.lease);
        const auto full = acq->sent + core_->options().node_timeout;
        const auto node_deadline =
            std::min(full, std::max(give_up_by, acq->sent + std::chrono::milliseconds{1}));
        const bool cut_short = node_deadline < full;
        auto round = core_->start_round(detail::node_op::acquire, acq, node_deadline, {}, true,
                                        stop.stop_possible() ? &stop : nullptr);
        const auto outcomes =
            cut_short
                ? core_->finish_round_by(*round, node_deadline + std::chrono::milliseconds{1}, stop)
                : core_->finish_round(*round, node_deadline, stop);
        const detail::quorum_tally t = detail::tally(outcomes);
        const auto valid_until = detail::valid_until(acq->sent, state_->options.lease);
        if (t.yes >= core_->quorum() && detail::steady::now() < valid_until) {
            on_acquired(acq, valid_until);
            return std::nullopt;
        }
        core_->release_in_background(acq);
        if (!stop.stop_requested() && !cut_short && t.failed > core_->size() - core_->quorum()) {
            throw core_->no_quorum("lock", state_->name, outcomes);
        }
        return detail::holder_ttl{-1};
    }

    void on_acquired(const acquisition_ptr& acq, detail::steady::time_point valid_until) {
        std::optional<std::stop_source> previous_lost;
        detail::deadline_timer::id previous_check = 0;
        detail::deadline_timer::id previous_renewal = 0;
        {
            std::lock_guard guard{state_->mutex};
            // Another thread of this object still thinks it holds: its validity ran out, since
            // a quorum let us in. That acquisition is lost. One made by the parent this process
            // was forked from is the parent's business, and its timers are not ours to cancel.
            if (!state_->inherited_by_fork()) {
                if (state_->held && !state_->lost) {
                    previous_lost = state_->lost_source;
                }
                previous_check = state_->loss_check;
                previous_renewal = state_->renewal;
            }
            state_->loss_check = 0;
            state_->renewal = 0;
            state_->held = true;
            state_->lost = false;
            state_->acq = acq;
            state_->holder = std::this_thread::get_id();
            state_->generation = detail::current_fork_generation();
            state_->acquired_at = acq->sent;
            state_->valid_until = valid_until;
            state_->lost_source = std::stop_source{};
        }
        core_->loss_timer().cancel(previous_check);
        core_->renewal_timer().cancel(previous_renewal);
        if (previous_lost) {
            previous_lost->request_stop();
            detail::call_on_lost(state_->options);
        }
        schedule_loss_check(core_.get(), state_, acq, valid_until);
        if (state_->options.watchdog) {
            schedule_renewal(core_.get(), state_, acq, acq->sent + state_->options.lease / 3);
        }
    }

    // At the local deadline, with no I/O: the acquisition is lost unless a quorum renewal
    // moved the deadline, in which case the check moves with it.
    static void schedule_loss_check(core_type* core, const std::shared_ptr<state>& st,
                                    const acquisition_ptr& acq, detail::steady::time_point when) {
        std::weak_ptr<state> weak = st;
        const auto id = core->loss_timer().schedule(when, [core, weak, acq] {
            const auto locked = weak.lock();
            if (!locked) {
                return;
            }
            detail::steady::time_point later{};
            {
                std::lock_guard guard{locked->mutex};
                if (!locked->held || locked->acq != acq || locked->lost) {
                    return;
                }
                if (detail::steady::now() < locked->valid_until) {
                    later = locked->valid_until;
                }
            }
            if (later != detail::steady::time_point{}) {
                schedule_loss_check(core, locked, acq, later);
                return;
            }
            mark_lost(*locked, acq);
        });
        remember_timer(core->loss_timer(), *st, acq, id, &state::loss_check);
    }

    static void schedule_renewal(core_type* core, const std::shared_ptr<state>& st,
                                 const acquisition_ptr& acq, detail::steady::time_point when) {
        std::weak_ptr<state> weak = st;
        const auto id = core->renewal_timer().schedule(when, [core, weak, acq] {
            const auto locked = weak.lock();
            if (!locked || core->renewals_stopped()) {
                return;
            }
            {
                std::lock_guard guard{locked->mutex};
                if (!locked->held || locked->acq != acq || locked->lost) {
                    return;
                }
                const auto max_hold = locked->options.max_hold;
                if (max_hold > std::chrono::milliseconds::zero() &&
                    detail::steady::now() >= locked->acquired_at + max_hold) {
                    return;  // renewals stop; the loss check reports the lease running out
                }
            }
            const auto lease = locked->options.lease;
            const auto sent = detail::steady::now();
            switch (renew_on(*core, *locked, acq, lease, sent)) {
                case renewal::renewed:
                    schedule_renewal(core, locked, acq, sent + lease / 3);
                    break;
                case renewal::lost:
                    break;
                case renewal::unknown: {
                    // Too few answers: try again soon; the loss check ends it at the deadline.
                    const auto soon = std::max<std::chrono::milliseconds>(
                        core->options().node_timeout, lease / 10);
                    schedule_renewal(core, locked, acq, detail::steady::now() + soon);
                    break;
                }
            }
        });
        remember_timer(core->renewal_timer(), *st, acq, id, &state::renewal);
    }

    // Stores a timer id in `st` if `acq` is still its acquisition, else cancels the timer.
    static void remember_timer(detail::deadline_timer& timer, state& st, const acquisition_ptr& acq,
                               detail::deadline_timer::id id,
                               detail::deadline_timer::id state::*slot) {
        {
            std::lock_guard guard{st.mutex};
            if (st.held && st.acq == acq && !st.lost) {
                st.*slot = id;
                return;
            }
        }
        timer.cancel(id);
    }

    // A compare-and-PEXPIRE round: renewed when a quorum extended it (the validity then counts
    // from `sent`), lost when more than N - quorum no longer hold it.
    static renewal renew_on(core_type& core, state& st, const acquisition_ptr& acq,
                            std::chrono::milliseconds lease, detail::steady::time_point sent,
                            std::optional<quorum_error>* error = nullptr) {
        const detail::decimal lease_text{lease.count()};
        const auto deadline = sent + core.options().node_timeout;
        auto round = core.start_round(detail::node_op::extend, acq, deadline,
                                      std::string{lease_text.view()});
        const auto outcomes = core.finish_round(*round, deadline);
        const detail::quorum_tally t = detail::tally(outcomes);
        if (t.yes >= core.quorum()) {
            acq->may_live_until(sent + lease);
            const auto valid_until = detail::valid_until(sent, lease);
            std::lock_guard guard{st.mutex};
            if (st.held && st.acq == acq && !st.lost) {
                st.valid_until = valid_until;
            }
            return renewal::renewed;
        }
        if (t.no > core.size() - core.quorum()) {
            mark_lost(st, acq);
            return renewal::lost;
        }
        if (error != nullptr) {
            error->emplace(core.no_quorum("extend", st.name, outcomes));
        }
        return renewal::unknown;
    }

    // Marks the acquisition `acq` lost and reports it, once per acquisition.
    static void mark_lost(state& st, const acquisition_ptr& acq) {
        std::stop_source source;
        {
            std::lock_guard guard{st.mutex};
            if (!st.held || st.acq != acq || st.lost) {
                return;
            }
            st.lost = true;
            source = st.lost_source;
        }
        source.request_stop();
        detail::call_on_lost(st.options);
    }

    // An acquisition given up by unlock() or the destructor, to be released.
    struct given_up {
        acquisition_ptr acq;
        bool reported = false;  // its loss was already reported
        std::stop_source source;
        detail::deadline_timer::id loss_check = 0;
        detail::deadline_timer::id renewal = 0;
    };

    // Marks the current acquisition as no longer held. Needs state_->mutex.
    given_up give_up_locked() {
        given_up g{std::move(state_->acq), state_->lost, state_->lost_source,
                   std::exchange(state_->loss_check, 0), std::exchange(state_->renewal, 0)};
        state_->held = false;
        state_->lost = false;
        return g;
    }

    std::error_code release(const given_up& g) noexcept {
        try {
            core_->loss_timer().cancel(g.loss_check);
            core_->renewal_timer().cancel(g.renewal);
            const auto deadline = detail::steady::now() + core_->options().node_timeout;
            auto round = core_->start_round(detail::node_op::release, g.acq, deadline);
            // Every master, not just a quorum: a process that exits right after unlock() must
            // not leave its key on a minority until the lease runs out.
            const auto outcomes = core_->finish_round(*round, deadline, {}, true);
            const detail::quorum_tally t = detail::tally(outcomes);
            if (t.yes >= core_->quorum()) {
                return {};
            }
            if (t.no > core_->size() - core_->quorum()) {
                if (!g.reported) {
                    std::stop_source source = g.source;
                    source.request_stop();
                    detail::call_on_lost(state_->options);
                }
                return errc::lock_lost;
            }
            for (const detail::node_outcome& o : outcomes) {
                if (o.answer == detail::node_answer::failed && !o.server_error) {
                    return errc::connection_failed;
                }
            }
            return errc::server_failed;
        } catch (...) {
            return errc::connection_failed;
        }
    }

    void release_on_destruction() noexcept {
        if (!state_) {
            return;
        }
        std::optional<given_up> held;
        {
            std::lock_guard guard{state_->mutex};
            if (!state_->held || state_->inherited_by_fork()) {
                return;  // nothing held, or the parent's keys: never released from a child
            }
            held = give_up_locked();
        }
        (void)release(*held);
    }

    std::shared_ptr<core_type> core_;
    std::shared_ptr<state> state_;
};

}  // namespace redislock
