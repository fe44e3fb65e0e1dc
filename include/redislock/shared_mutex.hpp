// redislock::basic_shared_mutex: the read-write lock, one Redis hash per name.
//
// Layout (see lua/shared_acquire.lua): field r:<owner> or w:<owner> =
// "<count> <expiry ms> <acquisition id>" for every holder, each with its own lease in server
// time, so one reader's release or expiry never frees another, and a release or renewal names
// its acquisition, so one made for a lost acquisition never acts on a later one; q:<owner>
// marks a waiting writer, which makes new readers wait (no writer starvation); `mode` marks the
// hash as a read-write lock; `fence` holds the writer's fencing token. The key's own TTL is the
// longest lease in it. Everything is in one key, so it works on Redis Cluster. Owners are as
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
//   through the same object.)
//
// Thread safety: one object may be shared by several threads; each thread is its own owner
// (unless lock_options::owner is set), so several threads may read through one object at once.
// owned(), remaining(), extend(), verify() and fencing_token() concern the calling owner.
// Faults: every operation is safe to retry, as for basic_recursive_mutex: each attempt of a
// lock() call draws a fresh id and names the earlier ones as given up; a release that could not be
// finished, or an acquisition abandoned mid-flight, is remembered as given up (the owner's next
// acquisition through this object drops its entry, so a lost release never makes lock() refuse as
// an upgrade) and dropped in the background by the client's reaper. Loss is told at the local
// conservative deadline through owned(), lost_token() and on_lost.
// With lock_options::watchdog each held mode of each owner is renewed from its first entry
// through this object until its last one is left (see watchdog.hpp).
// Events (client_options::on_event): acquired for each mode's first entry through this object
// (lock_kind::shared_mutex_write or shared_mutex_read), released when its last entry is left;
// re-entries and inner releases report nothing (see events.hpp).
// Lifetime: independent of the client's (the connection is shared). Movable, not copyable; a
// moved-from object behaves as a lock never held (lock calls throw redislock::invalid_argument).
// Destroying the object leaves every entry made through it.
// Exceptions: lock calls throw redislock::error subclasses on failures (never for contention),
// and std::system_error(resource_deadlock_would_occur) for a reader asking to write;
// unlock() and unlock_shared() never throw.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/client_core.hpp>
#include <redislock/detail/fair_wait.hpp>
#include <redislock/detail/lock_core.hpp>
#include <redislock/detail/lock_handle.hpp>
#include <redislock/detail/lock_identity.hpp>
#include <redislock/detail/lock_release.hpp>
#include <redislock/detail/lockable.hpp>
#include <redislock/detail/names.hpp>
#include <redislock/detail/owner.hpp>
#include <redislock/detail/scripts.hpp>
#include <redislock/detail/wait.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock {

template <connection C>
class basic_client;

namespace detail {

enum class shared_mode : char { read = 'r', write = 'w' };

// What events say a hold of `kind` is.
inline lock_kind shared_lock_kind(shared_mode kind) {
    return kind == shared_mode::read ? lock_kind::shared_mutex_read : lock_kind::shared_mutex_write;
}

// One owner's entries in one mode, made through one read-write lock object.
template <connection C>
struct shared_hold {
    std::string owner;
    shared_mode kind = shared_mode::read;
    std::size_t depth = 0;
    // Re-entries and releases whose outcome is unknown (a lost reply): the server's count
    // may hold this many entries more than depth says; the last release leaves them too.
    std::size_t uncertain = 0;
    std::int64_t fence = 0;
    tracked_lease<C> lease;
    std::uint64_t generation = 0;  // fork generation of the first entry
    std::uint64_t epoch = 0;       // which acquisition: renewals and releases name it
    std::string acquisition{};     // the acquisition's id in Redis

    // Held by the parent this process was forked from: only the parent may release it.
    bool inherited_by_fork() const { return generation != current_fork_generation(); }
};

// What a release or a renewal callback knows of the hold it acts for.
struct shared_hold_ref {
    std::string owner;
    shared_mode kind;
    std::uint64_t epoch = 0;
    std::string acquisition;
    bool reported = false;  // its loss was already reported through on_lost
};

// What a read-write lock object shares with its timer and watchdog callbacks.
template <connection C>
struct shared_state : lock_identity<C> {
    using lock_identity<C>::lock_identity;
    using lease_key = shared_hold_ref;

    shared_hold<C>* find(const std::string& owner, shared_mode kind) {
        for (shared_hold<C>& h : holds) {
            if (h.owner == owner && h.kind == kind) {
                return &h;
            }
        }
        return nullptr;
    }
    // The hold `ref` names, if it is still the same acquisition and held.
    shared_hold<C>* find(const shared_hold_ref& ref) {
        shared_hold<C>* h = find(ref.owner, ref.kind);
        return h && h->epoch == ref.epoch && h->depth > 0 ? h : nullptr;
    }
    static tracked_lease<C>* find_lease(shared_state& st, const shared_hold_ref& ref) {
        shared_hold<C>* h = st.find(ref);
        return h ? &h->lease : nullptr;
    }

    // The books below need the mutex.

    // The lease `owner`'s lost_token() follows: its write hold's when it has both.
    const tracked_lease<C>* lease_of(const std::string& owner) {
        const shared_hold<C>* h = find(owner, shared_mode::write);
        if (h == nullptr || h->depth == 0) {
            h = find(owner, shared_mode::read);
        }
        return h != nullptr && h->depth > 0 ? &h->lease : nullptr;
    }

    // The shortest remaining() of `owner`'s holds; zero when it holds none.
    std::chrono::milliseconds remaining_of(const std::string& owner) const {
        std::optional<std::chrono::milliseconds> shortest;
        for (const shared_hold<C>& h : holds) {
            if (h.owner == owner) {
                const auto left = h.lease.remaining();
                shortest = shortest ? std::min(*shortest, left) : left;
            }
        }
        return shortest.value_or(std::chrono::milliseconds::zero());
    }

    // Whether `owner`'s next entry in `kind` is an outermost one, with the acquisitions it
    // names as given up (space-separated) in `given_up_ids`.
    bool outermost(const std::string& owner, shared_mode kind, std::string& given_up_ids) {
        const shared_hold<C>* h = find(owner, kind);
        for (const std::string& id : given_up) {
            given_up_ids.append(given_up_ids.empty() ? "" : " ").append(id);
        }
        if (h != nullptr && h->depth > 0 && h->lease.lost) {
            // Lost here: its entries are dropped and the acquisition made anew.
            given_up_ids.append(given_up_ids.empty() ? "" : " ").append(h->acquisition);
        }
        return h == nullptr || h->depth == 0 || h->lease.lost;
    }

    // What counting an entry in found.
    struct entered {
        std::optional<shared_hold_ref> first_entry;  // an outermost one: its hold starts afresh
        std::optional<shared_hold_ref> reentered;    // else the hold it re-entered
        tracked_lease<C> previous;                   // the lease a fresh hold replaced
        bool previous_lost = false;                  // which was still live
    };

    // Counts in an entry of `owner` in `kind` that `got` granted to an attempt sent at `sent`.
    entered enter(const std::string& owner, shared_mode kind, const entry_reply& got,
                  steady::time_point sent) {
        entered e;
        shared_hold<C>* h = find(owner, kind);
        if (!h) {
            h = &holds.emplace_back();
            h->owner = owner;
            h->kind = kind;
        }
        // A new acquisition, or a re-entry into another acquisition of this owner, while
        // entries are still counted here means Redis lost them: their lease ran out, or they
        // were deleted.
        if (h->depth > 0 && (got.status == 1 || h->acquisition != got.acquisition)) {
            e.previous_lost = !h->lease.lost;
            h->depth = 0;
        }
        if (h->depth == 0 || h->lease.lost) {
            e.previous = std::exchange(h->lease, {});
            h->lease.valid_until = valid_until(sent, this->options.lease);
            h->lease.acquired_at = sent;
            h->lease.kind = shared_lock_kind(kind);
            h->depth = 0;
            h->uncertain = 0;
            h->fence = got.value;
            h->generation = current_fork_generation();
            h->epoch = ++last_epoch;
            h->acquisition = got.acquisition;
            e.first_entry = shared_hold_ref{owner, kind, h->epoch, got.acquisition, false};
        }
        ++h->depth;
        if (!e.first_entry) {
            e.reentered = shared_hold_ref{owner, kind, h->epoch, got.acquisition, false};
        }
        return e;
    }

    // What counting an entry out gives the release.
    struct left {
        shared_hold_ref ref;
        std::size_t entries = 1;
        bool last = false;
        tracked_lease<C> ended;  // the hold's lease when these are its last entries
    };

    // Counts out one entry of `owner` in `kind` into `out`, or says why it cannot.
    std::error_code count_out(const std::string& owner, shared_mode kind, left& out) {
        shared_hold<C>* h = find(owner, kind);
        if (!h || h->depth == 0) {
            return held_by_other_owner(kind) ? errc::not_holder : errc::not_held;
        }
        if (h->inherited_by_fork()) {
            return errc::not_holder;
        }
        out.ref = {owner, kind, h->epoch, h->acquisition, h->lease.lost};
        // Counted out before the round trip, so an acquisition that lands right after the
        // release never mistakes the entry for a live one.
        if (--h->depth == 0) {
            out.last = true;
            out.entries += std::exchange(h->uncertain, 0);
            out.ended = std::exchange(h->lease, {});
            erase_released();
        }
        return {};
    }

    bool held_by_other_owner(shared_mode kind) const {
        return std::any_of(holds.begin(), holds.end(), [kind](const shared_hold<C>& h) {
            return h.kind == kind && h.depth > 0;
        });
    }

    // Drops holds with no entries left.
    void erase_released() {
        std::erase_if(holds, [](const shared_hold<C>& h) { return h.depth == 0; });
    }

    // Remembers an acquisition whose entry may be in Redis though this object does not hold it
    // (the owner's next acquisition through this object drops it).
    void remember_given_up(const std::string& acquisition) {
        if (given_up.size() >= 4) {
            given_up.erase(given_up.begin());  // the oldest is surely gone by now or reaped
        }
        given_up.push_back(acquisition);
    }

    // Every hold `owner` has.
    std::vector<shared_hold_ref> refs_of(const std::string& owner) const {
        std::vector<shared_hold_ref> refs;
        for (const shared_hold<C>& h : holds) {
            if (h.owner == owner && h.depth > 0) {
                refs.push_back({h.owner, h.kind, h.epoch, h.acquisition, h.lease.lost});
            }
        }
        return refs;
    }

    // Gives up every hold (the object is going away), but the parent's this process was
    // forked from: their entries are never left from a child.
    std::vector<left> give_up_all() {
        std::vector<left> given;
        for (shared_hold<C>& h : holds) {
            if (h.depth == 0 || h.inherited_by_fork()) {
                continue;
            }
            given.push_back({shared_hold_ref{h.owner, h.kind, h.epoch, h.acquisition, h.lease.lost},
                             h.depth + std::exchange(h.uncertain, 0), true,
                             std::exchange(h.lease, {})});
            h.depth = 0;
        }
        erase_released();
        return given;
    }

    mutable std::mutex mutex;  // guards the members below; never held across a round trip
    std::vector<shared_hold<C>> holds;
    std::uint64_t last_epoch = 0;
    // Acquisitions this object gave up whose entries may still be in Redis (see the script).
    std::vector<std::string> given_up;
};

}  // namespace detail

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
        : handle{std::make_shared<state>(client.core_, name, std::move(options))} {}

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

    /// Sets the lease of every mode the caller holds to `lease` from now.
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
                return lease != nullptr ? std::optional{lease->lost_source.get_token()}
                                        : std::nullopt;
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
    using handle::state_;
    using handle::tracker;
    using handle::tracker_of;
    using mode = detail::shared_mode;
    using hold = detail::shared_hold<C>;
    using hold_ref = detail::shared_hold_ref;

    static std::string_view mode_text(mode kind) {
        return kind == mode::read ? std::string_view{"r"} : std::string_view{"w"};
    }

    static lock_kind kind_of(mode kind) { return detail::shared_lock_kind(kind); }

    // `query(state, caller's owner id)` with the mutex held; `none` for a moved-from object.
    template <class T, class Query>
    T of_caller(T none, Query query) const {
        if (!state_) {
            return none;
        }
        const std::string owner = state_->caller_owner();
        std::lock_guard guard{state_->mutex};
        return query(*state_, owner);
    }

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
        // knows whether this owner also writes through another object (then it re-enters), which
        // makes every acquisition a possible re-entry.
        return detail::acquire_in_line(
            *state_,
            [&](const call_context& how, const detail::queue_place& place) {
                return attempt(owner, kind, detail::token::random(), how, place);
            },
            deadline, stop,
            detail::line_options{
                .reader = kind == mode::read, .reentry = true, .kind = kind_of(kind)});
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
        {
            std::lock_guard guard{state_->mutex};
            outermost = state_->outermost(owner, kind, given_up);
        }
        call_context attempt_how = how;
        attempt_how.repeatable = outermost;  // a re-entry's count change must not run twice
        const auto sent = detail::steady::now();
        reply r;
        std::int64_t replicas = -1;
        try {
            auto acknowledged = detail::run_script_acknowledged(
                *state_->conn, detail::scripts::shared_acquire,
                std::array<std::string_view, 2>{state_->name, state_->fence_key},
                std::array<std::string_view, 11>{
                    owner, mode_text(kind), state_->lease_text.view(),
                    kind == mode::write && state_->options.fencing ? "1" : "0", place.waiter,
                    candidate.view(), outermost ? "1" : "0", given_up, place.keep(),
                    state_->queue_key, state_->lapse_key},
                attempt_how, state_->options.min_replicas, state_->options.replica_timeout,
                &state_->core->events);
            r = std::move(acknowledged.value);
            replicas = acknowledged.replicas;
        } catch (const error& e) {
            if (dynamic_cast<const connection_error*>(&e) ||
                dynamic_cast<const cancelled_error*>(&e)) {
                // The entry may have landed. A new acquisition is given up (the next attempt of
                // this call takes it over by its id; the reaper drops it otherwise); a re-entry
                // whose count is now unknown is dropped with the hold's last release.
                if (outermost) {
                    abandon(state_, hold_ref{owner, kind, 0, candidate.str(), false},
                            detail::drop_all, sent + state_->options.lease);
                } else {
                    std::lock_guard guard{state_->mutex};
                    if (hold* h = state_->find(owner, kind)) {
                        ++h->uncertain;
                    }
                }
            }
            throw;
        }
        const detail::entry_reply got = detail::decode_entry(
            r, state_->name, "redislock: unexpected reply to a read-write acquisition");
        if (got.status == -1) {
            throw_upgrade();
        }
        if (got.status == 0) {
            return detail::holder_ttl{got.value};
        }
        if (got.status == 1) {  // a new acquisition (a re-entry's entry is not given up)
            if (auto refused = detail::refuse_grant(*state_, sent, replicas, [&] {
                    abandon(state_, hold_ref{owner, kind, 0, got.acquisition, false},
                            detail::drop_all, sent + state_->options.lease);
                })) {
                return refused;
            }
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
                *e.first_entry, sent, kind_of(kind), place.tally,
                [&] {
                    return detail::renewal_spec{
                        &detail::scripts::shared_extend,
                        {state_->name},
                        {owner, std::string{mode_text(kind)},
                         std::string{state_->lease_text.view()}, got.acquisition}};
                },
                [&] { (void)leave_one(kind); });
        }
        return std::nullopt;
    }

    // Remembers an acquisition whose entry may be in Redis though this object does not hold it
    // (the owner's next acquisition through this object drops it), and has the reaper leave
    // `entries` of its entries (drop_all for one this object created and abandoned).
    static void abandon(const std::shared_ptr<state>& st, const hold_ref& ref, std::size_t entries,
                        detail::steady::time_point lease_end) noexcept {
        try {
            std::lock_guard guard{st->mutex};
            st->remember_given_up(ref.acquisition);
        } catch (...) {
            return;  // Out of memory: the entry expires with its lease.
        }
        detail::leave_to_reaper(
            st, ref, lease_end,
            [entries](const state& s, const hold_ref& r, detail::steady::time_point deadline) {
                return leave_once(s, r, entries, deadline).is_integer();
            });
    }

    // Sends one release; one that lets waiters in tells them.
    static reply leave_once(const state& st, const hold_ref& ref, std::size_t entries,
                            detail::steady::time_point deadline) {
        const detail::decimal count{static_cast<long long>(entries)};
        call_context how{{}, deadline};
        how.repeatable = entries == detail::drop_all;  // a count change must not run twice
        reply r = detail::run_script(
            st.core->connection, detail::scripts::shared_release,
            std::array<std::string_view, 1>{st.name},
            std::array<std::string_view, 8>{ref.owner, mode_text(ref.kind), count.view(),
                                            st.channel, ref.acquisition, st.grace_text.view(),
                                            st.queue_key, st.lapse_key},
            how, &st.core->events);
        if (r.is_integer() && r.as_integer() >= 1) {
            st.core->waiting->gates.note_contention(st.name, r.as_integer() == 2);
        }
        return r;
    }

    std::error_code leave_one(mode kind) noexcept {
        if (!state_) {
            return errc::not_held;
        }
        std::string owner;
        try {
            owner = state_->caller_owner();
        } catch (...) {
            return std::make_error_code(std::errc::not_enough_memory);
        }
        typename state::left out;
        {
            std::lock_guard guard{state_->mutex};
            if (const std::error_code ec = state_->count_out(owner, kind, out)) {
                return ec;
            }
        }
        tracker().end(out.ended);
        return leave(state_, out.ref, out.entries, out.last, out.ended);
    }

    // Leaves `entries` entries, already counted out locally, of the hold `ref` in Redis. A
    // hold's last release drops every entry of its acquisition, so a re-entry whose reply was
    // lost cannot keep it alive. A release whose outcome is unknown is given up: the reaper
    // finishes it (an inner entry stays counted until the hold's last release). `last_lease` is
    // the hold's lease when these are its last entries (else unused).
    static std::error_code leave(const std::shared_ptr<state>& st, const hold_ref& ref,
                                 std::size_t entries, bool last,
                                 const detail::tracked_lease<C>& last_lease) noexcept {
        reply r;
        try {
            r = leave_once(*st, ref, entries, st->core->untimed_deadline());
        } catch (...) {
            not_finished(st, ref, entries, last, last_lease.valid_until);
            return detail::end_release(*st, last_lease, detail::release_end::unanswered, last);
        }
        // An error reply says nothing about ownership, except WRONGTYPE: the name now holds
        // another type, so our entries are gone.
        if (r.is_error() && !r.is_error_code("WRONGTYPE")) {
            not_finished(st, ref, entries, last, last_lease.valid_until);
            (void)detail::end_release(*st, last_lease, detail::release_end::refused, last);
            return detail::server_failure(r);
        }
        if (r.is_integer() && r.as_integer() >= 0) {
            return detail::end_release(*st, last_lease, detail::release_end::released, last);
        }
        // The entries were gone: every entry of that acquisition is lost.
        bool notify = !ref.reported;
        auto acquired_at = last_lease.acquired_at;
        detail::tracked_lease<C> ended;
        {
            std::lock_guard guard{st->mutex};
            if (hold* h = st->find(ref)) {
                notify = notify && !h->lease.lost;
                h->depth = 0;
                acquired_at = h->lease.acquired_at;
                ended = std::exchange(h->lease, {});
                st->erase_released();
            }
        }
        tracker_of(st).end(ended);
        if (notify) {
            // Work watching lost_token() stops, as for a loss found any other way.
            std::stop_source source = last ? last_lease.lost_source : ended.lost_source;
            source.request_stop();
            detail::report_loss(*st, kind_of(ref.kind),
                                r.is_error() ? loss_reason::server_lost : loss_reason::taken,
                                acquired_at);
        }
        return errc::lock_lost;
    }

    // A release whose outcome is unknown: an inner entry makes the hold's count uncertain; the
    // last one is given up (retried in the background, dropped by the owner's next acquisition).
    static void not_finished(const std::shared_ptr<state>& st, const hold_ref& ref,
                             std::size_t entries, bool last,
                             detail::steady::time_point valid_until) noexcept {
        if (last) {
            abandon(st, ref, entries, valid_until + st->options.lease);
            return;
        }
        std::lock_guard guard{st->mutex};
        if (hold* h = st->find(ref)) {
            ++h->uncertain;
        }
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
                std::array<std::string_view, 4>{ref.owner, mode_text(ref.kind), lease_text.view(),
                                                ref.acquisition},
                call_context{{}, state_->core->untimed_deadline()}, &state_->core->events);
            all_held = tracker().extend_replied(ref, r, sent, lease, "check") && all_held;
        }
        return all_held;
    }

    static void release_on_destruction(const std::shared_ptr<state>& st) noexcept {
        std::vector<typename state::left> given;
        {
            std::lock_guard guard{st->mutex};
            given = st->give_up_all();
        }
        for (auto& g : given) {
            tracker_of(st).end(g.ended);
            (void)leave(st, g.ref, g.entries, true, g.ended);
        }
    }
};

}  // namespace redislock
