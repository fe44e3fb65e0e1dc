// redislock::basic_shared_mutex: the read-write lock, one Redis hash per name.
//
// Layout (see lua/shared_acquire.lua): field r:<owner> or w:<owner> =
// "<count> <expiry ms> <acquisition id>" for every holder, each with its own lease in server
// time, so one reader's release or expiry never frees another, and a release or renewal names
// its acquisition, so one made for a lost acquisition never acts on a later one; a waiting
// writer in the queue makes new readers wait (no writer starvation); `mode` marks the
// hash as a read-write lock; `fence` holds the writer's fencing token. The key's own TTL is the
// longest lease in it; no re-entry, release or renewal shortens an entry's expiry that another
// object of the same owner counts on. The waiting queue lives beside it, in {name}:queue and
// {name}:waiting, and the fencing counter in {name}:fence: every key of a name is in one slot on
// Redis Cluster, and every script declares the keys it touches. Owners are as
// for basic_recursive_mutex: client instance id plus the calling thread, or plus
// lock_options::owner.
//
// TimedLockable (write side) and SharedTimedLockable (read side), so std::unique_lock,
// std::shared_lock and std::scoped_lock work with it.
//
//   state               | lock()            | lock_shared()       | unlock()   | unlock_shared()
//   --------------------+-------------------+---------------------+------------+----------------
//   free                | writes            | reads               | not_held   | not_held
//   others read         | waits             | reads; waits while  | not_held   | not_held
//                       |                   | a writer waits      |            |
//   others write        | waits             | waits               | not_held   | not_held
//   caller reads        | throws (deadlock) | re-enters           | not_held   | leaves one
//   caller writes       | re-enters         | reads (downgrade)   | leaves one | not_held
//   caller writes+reads | re-enters         | re-enters           | leaves one | leaves one
//
//   (unlock calls report not_holder instead of not_held when another owner holds that mode
//   through the same object, and tell unlock_refused to the client's event hook: a guard
//   released on another thread.)
//
// Thread safety: one object may be shared by several threads; each thread is its own owner
// (unless lock_options::owner is set), so several threads may read through one object at once.
// owned(), remaining(), extend(), verify() and fencing_token() concern the calling owner.
// Faults: every operation is safe to retry, as for basic_recursive_mutex: each attempt of a
// lock() call draws a fresh id; an acquisition abandoned mid-flight is given up as a release of
// its one entry (below), which may land even after the attempt does: the reaper sends it, and the
// owner's next acquisitions through this object, and through any object of the client within
// the attempt's lease, settle it, leaving that one entry once. Each release
// carries its own id (field left:<owner> lists the owner's last 32 that left entries in place),
// so a release whose reply was lost is sent again by the reaper, and settled by the owner's next
// acquisition through this object (so it never makes lock() refuse as an upgrade), leaving its
// entries once: never those of another object of the owner that shares the entry. A re-entry
// whose reply was lost makes the hold's last release leave one entry more (the count may hold
// it). Loss is told at the local
// conservative deadline through owned(), lost_token() and on_lost; once a loss by expiry is told,
// the hold's entries are left in the background, and its next release sends nothing and reports
// errc::lock_lost (see basic_recursive_mutex, which also says how a re-entry too few replicas
// acknowledged is refused).
// With lock_options::watchdog each held mode of each owner is renewed from its first entry
// through this object until its last one is left (see watchdog.hpp).
// Queries: is_locked() and holder_ttl() ask Redis about the name, whoever holds it, in either
// mode: snapshots, which may be stale by the time the caller looks (see basic_mutex). Any thread
// may call them at any time, concurrently with the object's other calls: they read one key, in
// one round trip routed as the lock's other calls are, and change nothing, locally or in Redis.
// Events (client_options::on_event): acquired for each mode's first entry through this object
// (lock_kind::shared_mutex_write or shared_mutex_read), released when its last entry is left;
// re-entries and inner releases report nothing (see events.hpp).
// Lifetime: independent of the client's (the connection is shared). Movable, not copyable; a
// moved-from object behaves as a lock never held (lock calls throw redislock::invalid_argument).
// Destroying the object leaves every entry made through it.
// Exceptions: lock calls throw redislock::error subclasses on failures (never for contention),
// redislock::lease_error when their replies keep coming after the lease (docs/guarantees.md),
// and std::system_error(resource_deadlock_would_occur) for a reader asking to write;
// unlock() and unlock_shared() never throw, not even out of memory.
#pragma once

#include <algorithm>
#include <array>
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
#include <redislock/detail/blocking/acquisition_loop.hpp>
#include <redislock/detail/blocking/end_release.hpp>
#include <redislock/detail/blocking/entry_acquire.hpp>
#include <redislock/detail/blocking/entry_release.hpp>
#include <redislock/detail/blocking/lock_handle.hpp>
#include <redislock/detail/blocking/shared_release.hpp>
#include <redislock/detail/blocking/timed_lockable.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/detail/kinds/holder_query.hpp>
#include <redislock/detail/kinds/lock_identity.hpp>
#include <redislock/detail/kinds/owner_id.hpp>
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/detail/kinds/shared_state.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/waiting/acquire_in_line.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock {

template <connection C>
class basic_client;

/// The read-write lock: one Redis hash per name, each holder with its own lease. TimedLockable
/// and SharedTimedLockable; see the state table at the top of this header.
template <connection C>
class basic_shared_mutex
    : public detail::timed_lockable<basic_shared_mutex<C>>,
      public detail::shared_timed_lockable<basic_shared_mutex<C>>,
      public detail::lock_handle<basic_shared_mutex<C>, detail::shared_state<C>> {
    using state = detail::shared_state<C>;
    using handle = detail::lock_handle<basic_shared_mutex, state>;

public:
    /// Usually made by client.shared_mutex(name, options).
    /// @throws redislock::invalid_argument for an empty or oversized name, a lease out of
    ///         range, or inconsistent backoff bounds.
    basic_shared_mutex(basic_client<C>& client, std::string_view name, lock_options options = {})
        : handle{std::make_shared<state>(client.core_, name, std::move(options))} {
        detail::report_short_watchdog_lease(*state_, lock_kind::shared_mutex_write);
    }

    /// Takes over another object's lock, held or not; the moved-from object is as one never held.
    basic_shared_mutex(basic_shared_mutex&&) noexcept = default;
    /// Releases the lock this object holds, if any, then takes over `other`'s.
    basic_shared_mutex& operator=(basic_shared_mutex&&) noexcept = default;

    /// Leaves one write entry. Never throws; a lock found lost calls on_lost.
    void unlock() noexcept { handle::unlock(); }
    /// As unlock(), saying how it went (see basic_recursive_mutex::unlock(std::error_code&)).
    void unlock(std::error_code& ec) noexcept { ec = leave_one(mode::write); }

    /// Leaves one read entry. Never throws; a lock found lost calls on_lost.
    void unlock_shared() noexcept {
        std::error_code ignored;
        unlock_shared(ignored);
    }
    /// As unlock_shared(), saying how it went (see
    /// basic_recursive_mutex::unlock(std::error_code&)).
    void unlock_shared(std::error_code& ec) noexcept { ec = leave_one(mode::read); }

    /// Sets the lease of every mode the caller holds to `lease` from now; never shorter than what
    /// an entry has left, since another object of the same owner may count on that (the local
    /// deadline then stays as it was).
    /// Returns false (and calls on_lost) if any was lost; false at once if the caller holds none.
    /// @throws redislock::invalid_argument, redislock::connection_error
    bool extend(std::chrono::milliseconds lease) {
        detail::check_lease(lease);
        return state_ && check_caller_holds(lease);
    }

    /// Asks Redis whether every mode the caller holds is still held. Lost ones call on_lost.
    /// @throws redislock::connection_error
    bool verify() { return state_ && check_caller_holds(std::chrono::milliseconds::zero()); }

    /// A token whose stop is requested when the caller's hold (its write hold when it has both)
    /// is lost, at the latest at its local conservative deadline. Already stopped when the
    /// caller holds nothing.
    std::stop_token lost_token() const {
        const auto held =
            of_caller(std::optional<std::stop_token>{}, [](state& st, const std::string& owner) {
                const auto* lease = st.lease_of(owner);
                return lease != nullptr ? std::optional{lease->lost_token()} : std::nullopt;
            });
        return held ? *held : detail::stopped_token();
    }

    /// Local, conservative estimate of how long the caller's holds last (the shortest of them);
    /// zero when the caller holds none or one is known lost.
    std::chrono::milliseconds remaining() const {
        return of_caller(
            std::chrono::milliseconds::zero(),
            [](state& st, const std::string& owner) { return st.remaining_of(owner); });
    }

    /// Local: true while the caller holds the lock in some mode and remaining() > 0.
    bool owned() const { return remaining() > std::chrono::milliseconds::zero(); }

    /// Asks Redis whether any owner holds the lock, reading or writing (the caller included):
    /// whether some `r:<owner>` or `w:<owner>` entry is still within its own lease. Entries past
    /// theirs stay in the hash until a script prunes them, and hold nothing; a hash holding only
    /// those and the books kept beside them (mode, fence) is held by no one. A snapshot (see the
    /// top of this header). One round trip: a script that reads only (lua/shared_query.lua).
    /// @throws redislock::invalid_argument on a moved-from object; redislock::connection_error;
    ///         redislock::server_error when the server answers with an error (WRONGTYPE: the key
    ///         holds something other than a read-write lock).
    bool is_locked() const { return holder_ttl() != std::chrono::milliseconds::zero(); }

    /// Asks Redis how long the lock stays held: the time left of the holder whose lease ends
    /// last (several readers each have their own lease: the longest), read from the entries' own
    /// expiries in server time and never more than the hash's time to live; at least 1 ms while
    /// held, zero when no one holds it. A snapshot in the server's time, with no allowance for
    /// clock drift or the round trip: it does not tell the caller how long it may act as a holder
    /// (remaining() does). One round trip, as is_locked(); throws as it does.
    std::chrono::milliseconds holder_ttl() const {
        return detail::query_holder(state_.get(), detail::scripts::shared_query,
                                    std::array<std::string_view, 0>{})
            .ttl;
    }

    /// The fencing token of the caller's write acquisition; 0 when fencing is off or the caller
    /// does not hold the write lock.
    std::int64_t fencing_token() const {
        return of_caller(std::int64_t{0}, [](state& st, const std::string& owner) {
            const hold* h = st.find(owner, mode::write);
            return h ? h->fence : 0;
        });
    }

    /// @throws redislock::invalid_argument on a moved-from object.
    const std::string& name() const { return checked().name; }
    /// @throws redislock::invalid_argument on a moved-from object.
    const lock_options& options() const { return checked().options; }

private:
    friend class detail::timed_lockable<basic_shared_mutex>;
    friend class detail::shared_timed_lockable<basic_shared_mutex>;
    friend handle;
    using handle::checked;
    using handle::of_caller;
    using handle::state_;
    using handle::tracker;
    using mode = detail::shared_mode;
    using hold = detail::shared_hold<C>;
    using hold_ref = detail::shared_hold_ref;
    using release = detail::shared_release<C>;

    bool acquire_until(detail::steady::time_point deadline, const std::stop_token& stop) {
        return acquire(mode::write, deadline, stop);
    }
    bool acquire_shared_until(detail::steady::time_point deadline, const std::stop_token& stop) {
        return acquire(mode::read, deadline, stop);
    }

    bool acquire(mode kind, detail::steady::time_point deadline, const std::stop_token& stop) {
        checked();
        const std::string owner = state_->caller_owner();
        // A reader asking to write is refused by the script ({-1, 0}), not here: only the server
        // knows whether this owner also writes through another object (then it re-enters). So
        // an acquisition is a possible re-entry whenever the owner may hold any lock (see
        // waiting/thread_holds.hpp).
        return detail::acquire_in_line(
            *state_,
            [&](const call_context& how, const detail::queue_place& place) {
                return attempt(owner, kind, detail::token::random(), how, place);
            },
            deadline, stop,
            detail::line_options{
                .reader = kind == mode::read,
                .reentry = !state_->options.owner.empty() || detail::thread_may_hold_any(),
                .kind = detail::shared_lock_kind(kind)});
    }

    [[noreturn]] void throw_upgrade() const {
        throw std::system_error{std::make_error_code(std::errc::resource_deadlock_would_occur),
                                "redislock: lock() of '" + state_->name +
                                    "' while holding its read lock would deadlock; "
                                    "unlock_shared() first"};
    }

    // One attempt: std::nullopt when acquired or re-entered (a first entry reports acquired),
    // else how long to wait at most.
    std::optional<detail::holder_ttl> attempt(const std::string& owner, mode kind,
                                              const detail::token& candidate,
                                              const call_context& how,
                                              const detail::queue_place& place) {
        bool outermost = false;
        std::string given_up;
        std::vector<std::string> carried;  // the object's items this attempt settles
        std::vector<hold_ref> lost_here;   // in either mode: a read entry left would refuse a write
        std::vector<hold_ref> held_here;
        {
            std::lock_guard guard{state_->mutex};
            held_here = state_->refs_of(owner);
        }
        for (const hold_ref& ref : held_here) {
            tracker().expire_if_due(ref);  // its deadline passed: lost, as the timer would say
        }
        {
            std::lock_guard guard{state_->mutex};
            for (const hold& h : state_->holds) {
                if (h.owner == owner && h.depth > 0 && h.lease.lost && !h.taken_back) {
                    lost_here.push_back(hold_ref{h.owner, h.kind, h.epoch, h.acquisition, true});
                }
            }
        }
        for (const hold_ref& ref : lost_here) {
            release::take_back(state_, ref);  // not waiting for the loss timer to run it
        }
        {
            std::lock_guard guard{state_->mutex};
            outermost = state_->outermost(owner, kind, given_up);
            for (const auto& u : state_->given_up) {
                carried.push_back(u.item);
            }
        }
        const auto sent = detail::steady::now();
        const bool fenced = kind == mode::write && state_->options.fencing;
        const detail::entry_grant grant = detail::send_entry(
            *state_, detail::scripts::shared_acquire,
            std::array<std::string_view, 11>{
                owner, detail::shared_mode_text(kind), state_->lease_text.view(),
                fenced ? "1" : "0", place.waiter, candidate.view(), outermost ? "1" : "0", given_up,
                place.keep(), state_->channel, state_->grace_text.view()},
            how, outermost, fenced, "redislock: unexpected reply to a read-write acquisition", [&] {
                // The entry may have landed, or may land later. A new acquisition's one entry
                // is given up (the reaper and the next acquisitions leave it once); a re-entry
                // whose count is now unknown is left with the hold's last release.
                if (outermost) {
                    release::abandon_attempt(state_,
                                             hold_ref{owner, kind, 0, candidate.str(), false},
                                             sent + state_->options.lease);
                } else {
                    std::lock_guard guard{state_->mutex};
                    state_->count_uncertain(owner, kind);
                }
            });
        {
            std::lock_guard guard{state_->mutex};
            state_->forget_settled(carried);  // the script ran: it settled them
        }
        const detail::entry_reply& got = grant.got;
        if (got.status == -1) {
            throw_upgrade();
        }
        if (got.status == 0) {
            return detail::holder_ttl{got.value};
        }
        if (got.status == 1) {  // a new acquisition (a re-entry's entry is not given up)
            if (auto refused = detail::refuse_grant(*state_, sent, grant.replicas, [&] {
                    give_back(hold_ref{owner, kind, 0, got.acquisition, false}, sent, how);
                })) {
                return refused;
            }
        } else if (detail::unacknowledged(grant.replicas, state_->options)) {
            refuse_reentry(owner, kind, got.acquisition, grant.replicas, how);
        }
        typename state::entered e;
        {
            std::lock_guard guard{state_->mutex};
            e = state_->enter(owner, kind, got, sent);
        }
        if (e.reentered) {
            tracker().extended(*e.reentered, sent, state_->options.lease);  // re-entry refreshed it
        }
        tracker().replaced(e.previous, e.previous_lost);
        if (e.first_entry) {
            tracker().begin(
                *e.first_entry, sent, detail::shared_lock_kind(kind), place.tally,
                [&] {
                    return detail::renewal_spec{
                        &detail::scripts::shared_extend,
                        {state_->name},
                        {owner, std::string{detail::shared_mode_text(kind)},
                         std::string{state_->lease_text.view()}, got.acquisition}};
                },
                [&] { (void)leave_one(kind); });
        }
        return std::nullopt;
    }

    // Leaves one entry of `ref` now, within the call's time, as release `id`; false when that
    // went unanswered.
    bool leave_one_entry(const hold_ref& ref, const call_context& how,
                         const detail::token& id) noexcept {
        try {
            return release::leave_once(*state_, ref, 1,
                                       std::min(how.deadline, state_->core->untimed_deadline()), id)
                .is_integer();
        } catch (...) {
            return false;
        }
    }

    // A new acquisition that cannot stand (too few replicas acknowledged it, or its reply came
    // after its lease) is left before the call returns, and only its one entry, named by the
    // attempt (`ref`'s acquisition is the attempt's id): the owner's next acquisition, through
    // another object, may join what is still there and must keep it. Should that leave go
    // unanswered, the attempt is given up as after a lost reply (its entry is left once).
    void give_back(const hold_ref& ref, detail::steady::time_point sent, const call_context& how) {
        bool answered = false;
        try {
            answered = release::leave_attempt_once(
                           *state_, ref, std::min(how.deadline, state_->core->untimed_deadline()))
                           .is_integer();
        } catch (...) {
        }
        if (!answered) {
            release::abandon_attempt(state_, ref, sent + state_->options.lease);
        }
    }

    // A re-entry too few replicas acknowledged does not count, as an acquisition would not: its
    // entry is left again (the expiry it pushed out on the master goes with the hold's other
    // entries, at their release or at their loss by expiry), and the call is told why. Should
    // that leave go unanswered, it is given up as a release is.
    [[noreturn]] void refuse_reentry(const std::string& owner, mode kind,
                                     const std::string& acquisition, std::int64_t replicas,
                                     const call_context& how) {
        const hold_ref ref{owner, kind, 0, acquisition, false};
        const detail::token id = release::release_id();
        if (!leave_one_entry(ref, how, id)) {
            detail::steady::time_point valid_until = detail::steady::now();
            {
                std::lock_guard guard{state_->mutex};
                if (const hold* h = state_->find(owner, kind); h && h->acquisition == acquisition) {
                    valid_until = h->lease.valid_until;
                }
            }
            release::abandon(state_, ref, 1, valid_until + state_->options.lease, id);
        }
        detail::throw_unacknowledged(state_->name, replicas, state_->options);
    }

    // Leaves one entry of the caller in `kind`. Allocates nothing before the entry is counted
    // out, so that no failure can leave it held (see shared_state::count_out_caller).
    std::error_code leave_one(mode kind) noexcept {
        if (!state_) {
            return errc::not_held;
        }
        typename state::left out;
        std::thread::id holder;
        std::error_code ec;
        {
            std::lock_guard guard{state_->mutex};
            ec = state_->count_out_caller(kind, out, holder);
        }
        if (ec) {
            if (holder != std::thread::id{}) {
                detail::report_unlock_refused(*state_, detail::shared_lock_kind(kind), holder);
            }
            return ec;
        }
        tracker().end(out.ended);
        if (out.taken_back) {
            return errc::lock_lost;  // told already; its entries were left after the loss
        }
        if (out.entries == 0) {
            return {};  // an inner entry left locally only (out of memory): it goes with the
                        // entry's expiry
        }
        return release::leave(state_, out.ref, out.entries, out.last, out.ended);
    }

    // Extends (lease > 0) or checks (lease == 0) every mode the caller holds.
    bool check_caller_holds(std::chrono::milliseconds lease) {
        const std::string owner = state_->caller_owner();
        std::vector<hold_ref> refs;
        {
            std::lock_guard guard{state_->mutex};
            refs = state_->refs_of(owner);
        }
        if (refs.empty()) {
            return false;
        }
        bool all_held = true;
        if (lease == std::chrono::milliseconds::zero() &&
            !detail::serves_as_master(*state_->conn, state_->name,
                                      state_->core->untimed_deadline())) {
            for (const hold_ref& ref : refs) {
                // A demoted master cannot vouch for any of them.
                tracker().lose(ref, loss_reason::server_lost);
            }
            return false;
        }
        const detail::decimal lease_text{lease.count()};
        for (const hold_ref& ref : refs) {
            const auto sent = detail::steady::now();
            const reply r = detail::run_script(
                *state_->conn, detail::scripts::shared_extend,
                std::array{std::string_view{state_->name}},
                std::array<std::string_view, 4>{ref.owner, detail::shared_mode_text(ref.kind),
                                                lease_text.view(), ref.acquisition},
                call_context{{}, state_->core->untimed_deadline()}, &state_->core->events);
            all_held = tracker().extend_replied(ref, r, sent, lease, "check") && all_held;
        }
        return all_held;
    }

    static void release_on_destruction(const std::shared_ptr<state>& st) noexcept {
        release::leave_all(st);
    }
};

}  // namespace redislock
