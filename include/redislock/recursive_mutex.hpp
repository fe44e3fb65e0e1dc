// redislock::basic_recursive_mutex: the reentrant lock, one Redis hash per name.
//
// Layout: hash `name`, field <owner id> -> that owner's entry count, and field id:<owner id> ->
// a random id of the acquisition those entries belong to (a release or renewal names it, so one
// made for an acquisition that was lost never acts on a later one of the same owner); with
// fencing also field `fence` -> the first entry's token; handed:<owner id> marks an entry a
// release kept for that owner's waiter (lua/_queue.lua); firsts:<owner id> lists the attempts
// whose first entries the count holds, so that one given up leaves its entry once, and one that
// lands again counts nothing more; gone:<owner id> lists the attempts the client gave up, so that
// one whose script lands late adds no entry (lua/recursive_acquire.lua); left:<owner id> lists
// the owner's last releases that left entries in place, so that one sent again after a lost
// reply leaves nothing more (lua/recursive_release.lua). Each entry, re-entry and renewal sets
// the key's expiry to the lease, but never shortens it: another object of the same owner may
// count on a longer one. The waiting queue lives beside it, in {name}:queue and {name}:waiting (the
// same slot on Redis Cluster). The owner id is the client's instance id plus the calling thread, or
// plus lock_options::owner when set, so code that hops threads (coroutines, thread pools) can lock
// on one thread and unlock on another. The same owner re-entering through another object for the
// same name is a re-entry.
//
// TimedLockable like std::recursive_timed_mutex: lock() by the holder re-enters (one round trip
// that also refreshes the lease, never shortening it); each lock() is matched by one unlock().
//
// Thread safety: one object may be shared by several threads. Each thread is its own owner (unless
// lock_options::owner is set, which makes every caller the same owner): another thread of this
// process waits as another process does. unlock() from a thread that does not hold the lock
// through this object sends nothing, reports errc::not_holder through
// unlock(std::error_code&) and tells unlock_refused to the client's event hook (a guard released
// on another thread); it never touches the holder's count.
// Faults: every operation is safe to retry. Each attempt of a lock() call draws a fresh id; one
// sent again after a lost reply claims its own entry instead of re-entering it. An acquisition
// abandoned mid-flight is given up as a release of its one entry, which may land even after the
// attempt does: the client's reaper sends it, and the owner's next outermost lock() through this
// object, and through any object of the client within the attempt's lease, settles it (leaves
// that one entry unless it was left, then joins what remains, never taking an entry another
// object of the owner joined); an attempt that lands after that writes nothing. Every release
// carries its own id and leaves its entries once however often it lands (the script keeps the
// owner's last 32 that left entries in place): one whose reply was lost is sent again by the
// reaper, and the object's next lock() joins what is left, never taking over entries another
// object of the owner counts on. A re-entry whose reply was lost makes the outermost unlock()
// leave one entry more (the count may hold it). Loss is told at the local conservative deadline
// (see basic_mutex), through owned(), lost_token() and on_lost. Once a loss by expiry is told, the
// entries made through this object are left in the background (renewals or a re-entry that too few
// replicas acknowledged still extended the hash on the master, and must not keep rivals out past
// the loss); the entries of another object of the same owner, and what it was told it has, stay.
// The next unlock() then sends nothing and reports errc::lock_lost. A re-entry too few replicas
// acknowledged (lock_options::min_replicas) is refused like an acquisition: its entry is left again
// and the object keeps the deadline it had. A wait with time left rides out transient failures.
// With lock_options::watchdog the lease is renewed from the first entry through this object
// until the last one is left (see watchdog.hpp).
// Queries: is_locked(), holder_ttl() and hold_count() ask Redis about the name, whoever holds
// it: snapshots, which may be stale by the time the caller looks (see basic_mutex). Any thread
// may call them at any time, concurrently with the object's other calls: they read one key, in
// one round trip routed as the lock's other calls are, and change nothing, locally or in Redis.
// Events (client_options::on_event): acquired for a first entry through this object, released
// when its last entry is left; re-entries and inner releases report nothing (see events.hpp).
// Lifetime: independent of the client's (the connection is shared). Movable, not copyable; a
// moved-from object behaves as a lock never held (lock calls throw redislock::invalid_argument).
// Destroying a held lock leaves every entry made through it.
// Exceptions: lock calls throw redislock::error subclasses on failures (never for contention),
// redislock::lease_error when their replies keep coming after the lease (docs/guarantees.md);
// unlock() never throws, not even out of memory.
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

#include <redislock/connection.hpp>
#include <redislock/detail/blocking/acquisition_loop.hpp>
#include <redislock/detail/blocking/end_release.hpp>
#include <redislock/detail/blocking/entry_acquire.hpp>
#include <redislock/detail/blocking/lock_handle.hpp>
#include <redislock/detail/blocking/recursive_release.hpp>
#include <redislock/detail/blocking/timed_lockable.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/detail/kinds/holder_query.hpp>
#include <redislock/detail/kinds/lock_identity.hpp>
#include <redislock/detail/kinds/owner_id.hpp>
#include <redislock/detail/kinds/recursive_state.hpp>
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/acquire_in_line.hpp>
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

/// The reentrant lock: one Redis hash per name, owner -> entry count. TimedLockable; see the top
/// of this header for owners, threads, loss and faults.
template <connection C>
class basic_recursive_mutex
    : public detail::timed_lockable<basic_recursive_mutex<C>>,
      public detail::lock_handle<basic_recursive_mutex<C>, detail::recursive_state<C>> {
    using state = detail::recursive_state<C>;
    using handle = detail::lock_handle<basic_recursive_mutex, state>;

public:
    /// Usually made by client.recursive_mutex(name, options).
    /// @throws redislock::invalid_argument for an empty or oversized name, a lease out of
    ///         range, inconsistent backoff bounds or a max_hold below the lease.
    basic_recursive_mutex(basic_client<C>& client, std::string_view name, lock_options options = {})
        : handle{std::make_shared<state>(client.core_, name, std::move(options))} {
        detail::report_short_watchdog_lease(*state_, lock_kind::recursive_mutex);
    }

    /// Takes over another object's lock, held or not; the moved-from object is as one never held.
    basic_recursive_mutex(basic_recursive_mutex&&) noexcept = default;
    /// Releases the lock this object holds, if any, then takes over `other`'s.
    basic_recursive_mutex& operator=(basic_recursive_mutex&&) noexcept = default;

    /// Leaves one entry. Never throws; a lock found lost calls on_lost.
    void unlock() noexcept { handle::unlock(); }

    /// Leaves one entry and says how it went: no error (released, or still held by outer
    /// entries); errc::not_held or errc::not_holder (misuse: nothing is sent); errc::lock_lost
    /// (the entry had expired or the lock was taken: every entry through this object is gone;
    /// also once a loss by expiry was told: then nothing is sent, the entries having been left
    /// in the background, or the release that still found them left them);
    /// errc::connection_failed or errc::server_failed (the object counts the entry out anyway;
    /// the release is then sent again in the background until answered, leaving its entries
    /// once). Takes at most the command timeout.
    void unlock(std::error_code& ec) noexcept {
        typename state::left out;
        ec = handle::claim([&](state& st) { out = st.count_out(); });
        if (ec) {
            return;
        }
        if (out.last) {
            tracker().end(out.ended);
        }
        if (out.taken_back) {
            ec = errc::lock_lost;  // told already; its entries were left after the loss
            return;
        }
        if (out.entries == 0) {
            return;  // an inner entry left locally only (out of memory): the last release drops it
        }
        ec = release::leave(state_, std::move(out.entry), out.entries, out.last, out.ended);
    }

    /// Sets the lease to `lease` from now if the lock is still ours; never shorter than what the
    /// key has left, since another object of the same owner may count on that (the local
    /// deadline then stays as it was).
    /// Returns false (and calls on_lost) if the lock was lost; false at once if not held.
    /// @throws redislock::invalid_argument, redislock::connection_error;
    ///         redislock::server_error when the server answers with an error (the lock is not
    ///         taken for lost)
    bool extend(std::chrono::milliseconds lease) {
        detail::check_lease(lease);
        std::optional<held> entry = held_entry();
        if (!entry) {
            return false;
        }
        const detail::decimal lease_text{lease.count()};
        const auto sent = detail::steady::now();
        const reply r = detail::run_script(
            *state_->conn, detail::scripts::recursive_extend,
            std::array{std::string_view{state_->name}},
            std::array<std::string_view, 3>{entry->owner, lease_text.view(), entry->acquisition},
            call_context{{}, state_->core->untimed_deadline()}, &state_->core->events);
        return tracker().extend_replied(entry->epoch, r, sent, lease);
    }

    /// Local, conservative estimate of how long the lock stays ours (see basic_mutex).
    std::chrono::milliseconds remaining() const { return handle::held_remaining(); }

    /// Local: true while this object holds the lock, not known lost, and remaining() > 0.
    bool owned() const { return remaining() > std::chrono::milliseconds::zero(); }

    /// A token whose stop is requested when the current acquisition is lost (see basic_mutex).
    /// Already stopped when not held.
    std::stop_token lost_token() const { return handle::held_lost_token(); }

    /// Entries made through this object by its current holder (0 when not held).
    std::size_t depth() const {
        if (!state_) {
            return 0;
        }
        std::lock_guard guard{state_->mutex};
        return state_->depth;
    }

    /// Asks Redis whether the holder's acquisition is still there, on a node that is still a
    /// master (see basic_mutex::verify). A lock found lost calls on_lost.
    /// @throws redislock::connection_error; redislock::server_error when the server answers with
    ///         an error (the lock is not taken for lost). See https://redis.io/commands/hget/
    bool verify() {
        std::optional<held> entry = held_entry();
        if (!entry) {
            return false;
        }
        const std::string id_field = "id:" + entry->owner;
        const auto deadline = state_->core->untimed_deadline();
        const std::array<std::string_view, 3> hget{"HGET", state_->name, id_field};
        const reply r = detail::execute(*state_->conn, hget, call_context{state_->name, deadline});
        const bool ours = r.is_string() && r.text() == entry->acquisition;
        if (ours && detail::serves_as_master(*state_->conn, state_->name, deadline)) {
            return true;
        }
        detail::throw_unless_not_ours(r, "verify", state_->name);
        // Another acquisition of the owner says taken; no entry, another type or a demoted
        // master says the server lost it.
        tracker().lose(entry->epoch,
                       r.is_string() && !ours ? loss_reason::taken : loss_reason::server_lost);
        return false;
    }

    /// Asks Redis whether any owner holds the lock (this one included): whether some owner's
    /// field counts entries of an acquisition its `id:<owner>` field names. A hash holding only
    /// the books kept beside entries (fence, handed:, gone:, left:, firsts: fields) is held by no
    /// one; an
    /// entry a release handed to a waiter is held. A snapshot (see the top of this header). One
    /// round trip: a script that reads only (lua/recursive_query.lua).
    /// @throws redislock::invalid_argument on a moved-from object; redislock::connection_error;
    ///         redislock::server_error when the server answers with an error (WRONGTYPE: the key
    ///         holds something other than a reentrant lock).
    bool is_locked() const { return query({}).ttl != std::chrono::milliseconds::zero(); }

    /// Asks Redis how long the holder keeps the lock: the hash's time to live (PTTL; every entry
    /// of the holder shares it), at least 1 ms while held; zero when no one holds it;
    /// milliseconds::max() when another program wrote it with no expiry. A snapshot in the
    /// server's time, with no allowance for clock drift or the round trip: it does not tell this
    /// object how long it may act as the holder (remaining() does). One round trip, as
    /// is_locked(); throws as it does.
    std::chrono::milliseconds holder_ttl() const { return query({}).ttl; }

    /// Asks Redis how many entries the calling owner (the calling thread, or lock_options::owner:
    /// the owner lock() enters as) holds, through any of its objects for this name; 0 when it
    /// holds none. depth() counts only this object's, locally. A snapshot (see the top of this
    /// header), in one round trip, as is_locked(); throws as it does.
    std::size_t hold_count() const {
        const std::string owner = checked().caller_owner();
        return static_cast<std::size_t>(std::max<std::int64_t>(query(owner).count, 0));
    }

    /// The fencing token of the outermost acquisition; 0 when fencing is off or not held.
    std::int64_t fencing_token() const { return handle::held_fence(); }

    /// @throws redislock::invalid_argument on a moved-from object.
    const std::string& name() const { return checked().name; }
    /// @throws redislock::invalid_argument on a moved-from object.
    const lock_options& options() const { return checked().options; }

private:
    friend class detail::timed_lockable<basic_recursive_mutex>;
    friend handle;
    using handle::checked;
    using handle::state_;
    using handle::tracker;

    using held = detail::recursive_entry;
    using release = detail::recursive_release<C>;

    // Runs lua/recursive_query.lua, counting the entries of `owner` ('' for none).
    detail::holder_snapshot query(std::string_view owner) const {
        return detail::query_holder(state_.get(), detail::scripts::recursive_query,
                                    std::array{owner});
    }

    std::uint64_t epoch_now() const {
        std::lock_guard guard{state_->mutex};
        return state_->epoch;
    }

    std::optional<held> held_entry() const {
        checked();
        std::lock_guard guard{state_->mutex};
        if (state_->depth == 0 || state_->taken_back) {
            return std::nullopt;  // not held, or lost and its entries left
        }
        return state_->current();
    }

    bool acquire_until(detail::steady::time_point deadline, const std::stop_token& stop) {
        checked();
        const std::string owner = state_->caller_owner();
        const lock_options& opts = state_->options;
        // A possible re-entry whenever the owner may hold through another object (see
        // waiting/thread_holds.hpp). A fenced acquisition draws its token, and one that waits for
        // replicas checks WAIT, in its own round trip: neither can be handed over; nor can an
        // owner the waiter id cannot carry.
        const bool handed = !opts.fencing && opts.min_replicas == 0 &&
                            owner.find_first_of("@ ") == std::string::npos;
        return detail::acquire_in_line(
            *state_,
            [&](const call_context& how, const detail::queue_place& place) {
                return attempt(owner, detail::token::random(), how, place);
            },
            deadline, stop,
            detail::line_options{.reentry = !opts.owner.empty() || detail::thread_may_hold_any(),
                                 .handed = handed,
                                 .owner = owner,
                                 .kind = lock_kind::recursive_mutex});
    }

    // One attempt: std::nullopt when acquired or re-entered (a first entry reports acquired),
    // else how long to wait at most.
    std::optional<detail::holder_ttl> attempt(const std::string& owner,
                                              const detail::token& candidate,
                                              const call_context& how,
                                              const detail::queue_place& place) {
        bool outermost = false;
        std::string given_up;
        std::uint64_t epoch = 0;
        {
            std::lock_guard guard{state_->mutex};
            epoch = state_->epoch;
        }
        tracker().expire_if_due(epoch);     // its deadline passed: lost, as the timer would say
        release::take_back(state_, epoch);  // if lost here and not taken back yet
        release::settle(state_, std::min(how.deadline, state_->core->untimed_deadline()));
        {
            std::lock_guard guard{state_->mutex};
            outermost = state_->outermost(owner, given_up);
        }
        const auto sent = detail::steady::now();
        const detail::entry_grant grant = detail::send_entry(
            *state_, detail::scripts::recursive_acquire,
            std::array<std::string_view, 10>{
                owner, state_->lease_text.view(), state_->options.fencing ? "1" : "0",
                candidate.view(), outermost ? "1" : "0", given_up, place.waiter, place.keep(),
                state_->channel, state_->grace_text.view()},
            how, outermost, state_->options.fencing,
            "redislock: unexpected reply to a reentrant acquisition", [&] {
                // The entry may have landed, or may land later: a new acquisition's one entry is
                // given up (the reaper and the next first entries leave it once), a re-entry
                // makes the count uncertain (the last release leaves it too).
                if (outermost) {
                    release::abandon(state_, owner, candidate.str(), sent + state_->options.lease);
                } else {
                    std::lock_guard guard{state_->mutex};
                    ++state_->uncertain;
                }
            });
        const detail::entry_reply& got = grant.got;
        if (got.status == 0) {
            return detail::holder_ttl{got.value};
        }
        // Status 1 is a new acquisition for this object (made, or handed to this call and
        // claimed): giving it back leaves only this attempt's first entry, never the re-entries
        // other threads sharing an explicit owner made since.
        if (got.status == 1) {  // a new acquisition (a re-entry's entry is not given up)
            if (auto refused = detail::refuse_grant(*state_, sent, grant.replicas, [&] {
                    give_back(owner, candidate.str(), sent, how);
                })) {
                return refused;
            }
        } else if (detail::unacknowledged(grant.replicas, state_->options)) {
            refuse_reentry(owner, got.acquisition, grant.replicas, how);
        }
        if (place.counted != nullptr) {
            *place.counted = true;
        }
        on_entered(owner, got, sent, place.tally);
        return std::nullopt;
    }

    // Leaves one entry of `acquisition` now, with lease "0" (a leave never extends what
    // remains), within the call's time, as release `id` (none: all zero); false when that went
    // unanswered.
    bool leave_one_entry(const std::string& owner, const std::string& acquisition,
                         const call_context& how, const detail::token& id = {}) noexcept {
        try {
            return release::leave_once(*state_, "0", held{owner, 0, acquisition}, 1,
                                       std::min(how.deadline, state_->core->untimed_deadline()),
                                       release::id_text(id))
                .is_integer();
        } catch (...) {
            return false;
        }
    }

    // A new acquisition that cannot stand (too few replicas acknowledged it, or its reply came
    // after its lease) is left before the call returns, and only the first entry of `attempt`:
    // the owner's next acquisition, through another object, may join what is still there and
    // must keep it. Should that leave go unanswered, the attempt is given up as after a lost
    // reply (its entry is left once, whichever send lands).
    void give_back(const std::string& owner, const std::string& attempt,
                   detail::steady::time_point sent, const call_context& how) {
        bool answered = false;
        try {
            answered = release::leave_attempt_once(
                           *state_, held{owner, 0, attempt},
                           std::min(how.deadline, state_->core->untimed_deadline()))
                           .is_integer();
        } catch (...) {
        }
        if (!answered) {
            release::abandon(state_, owner, attempt, sent + state_->options.lease);
        }
    }

    // A re-entry too few replicas acknowledged does not count, as an acquisition would not: its
    // entry is left again, with lease "0" (the expiry it pushed out on the master goes with the
    // acquisition's other entries, at their release or at their loss by expiry), and the call
    // is told why. Should that leave go unanswered, the reaper sends it again as the same
    // release (it leaves the entry once).
    [[noreturn]] void refuse_reentry(const std::string& owner, const std::string& acquisition,
                                     std::int64_t replicas, const call_context& how) {
        const detail::token id = release::release_id();
        if (!leave_one_entry(owner, acquisition, how, id)) {
            detail::steady::time_point valid_until = detail::steady::now();
            {
                std::lock_guard guard{state_->mutex};
                if (state_->depth > 0 && state_->acquisition == acquisition) {
                    valid_until = state_->lease.valid_until;
                }
            }
            release::hand_to_reaper(state_, held{owner, 0, acquisition}, 1,
                                    valid_until + state_->options.lease, id);
        }
        detail::throw_unacknowledged(state_->name, replicas, state_->options);
    }

    // Counts an entry in; the first through this object reports the call's `wait` as acquired
    // before its lease can be found lost.
    void on_entered(const std::string& owner, const detail::entry_reply& got,
                    detail::steady::time_point sent, const detail::wait_tally* wait) {
        typename state::entered e;
        {
            std::lock_guard guard{state_->mutex};
            e = state_->enter(owner, got, sent);
        }
        if (!e.first_entry) {
            tracker().extended(epoch_now(), sent, state_->options.lease);  // re-entry refreshed it
        }
        tracker().replaced(e.previous, e.previous_lost);
        if (e.first_entry) {
            tracker().begin(
                *e.first_entry, sent, lock_kind::recursive_mutex, wait,
                [&] {
                    return detail::renewal_spec{
                        &detail::scripts::recursive_extend,
                        {state_->name},
                        {owner, std::string{state_->lease_text.view()}, got.acquisition}};
                },
                [this] { handle::unlock(); });
        }
    }

    static void release_on_destruction(const std::shared_ptr<state>& st) noexcept {
        release::leave_all(st);
    }
};

}  // namespace redislock
