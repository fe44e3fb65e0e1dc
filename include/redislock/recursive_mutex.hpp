// redislock::basic_recursive_mutex: the reentrant lock, one Redis hash per name.
//
// Layout: hash `name`, field <owner id> -> that owner's entry count, PEXPIRE'd with the lease on
// every entry, and field id:<owner id> -> a random id of the acquisition those entries belong to
// (a release or renewal names it, so one made for an acquisition that was lost never acts on a
// later one of the same owner); with fencing also field `fence` -> the first entry's token. The
// owner id is the client's instance id plus the calling thread, or plus lock_options::owner when
// set, so code that hops threads (coroutines, thread pools) can lock on one thread and unlock on
// another. The same owner re-entering through another object for the same name is a re-entry.
//
// TimedLockable like std::recursive_timed_mutex: lock() by the holder re-enters (one round trip
// that also refreshes the lease); each lock() is matched by one unlock().
//
// Thread safety: one object may be shared by several threads. Each thread is its own owner (unless
// lock_options::owner is set, which makes every caller the same owner): another thread of this
// process waits as another process does. unlock() from a thread that does not hold the lock
// through this object sends nothing and reports errc::not_holder through
// unlock(std::error_code&); it never touches the holder's count.
// Releases are not retried after a connection failure or an error reply (a decrement is not
// idempotent): the entry then stays in Redis until its lease runs out, and unlock(ec) says
// connection_failed or server_failed.
// With lock_options::watchdog the lease is renewed from the first entry through this object
// until the last one is left (see watchdog.hpp).
// Lifetime: independent of the client's (the connection is shared). Movable, not copyable; a
// moved-from object may only be destroyed or assigned to. Destroying a held lock leaves every
// entry made through it.
// Exceptions: lock calls throw redislock::error subclasses on failures (never for contention);
// unlock() never throws.
#pragma once

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
#include <thread>
#include <utility>

#include <redislock/connection.hpp>
#include <redislock/detail/client_core.hpp>
#include <redislock/detail/lock_identity.hpp>
#include <redislock/detail/lockable.hpp>
#include <redislock/detail/names.hpp>
#include <redislock/detail/owner.hpp>
#include <redislock/detail/scripts.hpp>
#include <redislock/detail/token.hpp>
#include <redislock/detail/wait.hpp>
#include <redislock/error.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock {

template <connection C>
class basic_client;

template <connection C>
class basic_recursive_mutex : public detail::timed_lockable<basic_recursive_mutex<C>> {
public:
    /// Usually made by client.recursive_mutex(name, options).
    /// @throws redislock::invalid_argument for an empty or oversized name, a lease out of
    ///         range, or inconsistent backoff bounds.
    basic_recursive_mutex(basic_client<C>& client, std::string_view name, lock_options options = {})
        : state_{std::make_unique<state>(client.core_, name, std::move(options))} {}

    basic_recursive_mutex(basic_recursive_mutex&&) noexcept = default;
    basic_recursive_mutex& operator=(basic_recursive_mutex&& other) noexcept {
        if (this != &other) {
            release_on_destruction();
            state_ = std::move(other.state_);
        }
        return *this;
    }
    ~basic_recursive_mutex() { release_on_destruction(); }

    /// Leaves one entry. Never throws; a lock found lost calls on_lost.
    void unlock() noexcept {
        std::error_code ignored;
        unlock(ignored);
    }

    /// Leaves one entry and says how it went: no error (released, or still held by outer
    /// entries); errc::not_held or errc::not_holder (misuse: nothing is sent); errc::lock_lost
    /// (the entry had expired or the lock was taken: every entry through this object is gone);
    /// errc::connection_failed or errc::server_failed (not retried; the entry stays until its
    /// lease runs out).
    void unlock(std::error_code& ec) noexcept {
        ec.clear();
        held entry;
        typename basic_watchdog<C>::lease_id renewal = 0;
        {
            std::lock_guard guard{state_->mutex};
            if (state_->depth == 0) {
                ec = errc::not_held;
                return;
            }
            if (!state_->caller_is_holder() || state_->inherited_by_fork()) {
                ec = errc::not_holder;
                return;
            }
            entry = {state_->holder_owner, state_->epoch, state_->acquisition};
            // Counted out before the round trip, so an acquisition through this object that
            // lands right after the release never mistakes the entry for a live one.
            if (--state_->depth == 0) {
                renewal = std::exchange(state_->renewal, 0);
            }
        }
        state_->core->watchdog.remove(renewal);
        ec = leave(entry, 1);
    }

    /// Sets the lease to `lease` from now if the lock is still ours.
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
            std::array<std::string_view, 3>{entry->owner, lease_text.view(), entry->acquisition});
        if (r.is_integer() && r.as_integer() == 1) {
            std::lock_guard guard{state_->mutex};
            if (state_->depth > 0 && state_->epoch == entry->epoch) {
                state_->valid_until = detail::valid_until(sent, lease);
            }
            return true;
        }
        throw_unless_not_ours(r, "extend");
        mark_lost(*state_, entry->epoch);
        return false;
    }

    /// Local, conservative estimate of how long the lock stays ours (see basic_mutex).
    std::chrono::milliseconds remaining() const {
        std::lock_guard guard{state_->mutex};
        if (state_->depth == 0 || state_->lost_epoch == state_->epoch) {
            return std::chrono::milliseconds::zero();
        }
        return detail::time_left(state_->valid_until);
    }

    /// Local: true while this object holds the lock, not known lost, and remaining() > 0.
    bool owned() const { return remaining() > std::chrono::milliseconds::zero(); }

    /// Entries made through this object by its current holder (0 when not held).
    std::size_t depth() const {
        std::lock_guard guard{state_->mutex};
        return state_->depth;
    }

    /// Asks Redis whether the holder's acquisition is still there. A lock found lost calls
    /// on_lost.
    /// @throws redislock::connection_error; redislock::server_error when the server answers with
    ///         an error (the lock is not taken for lost). See https://redis.io/commands/hget/
    bool verify() {
        std::optional<held> entry = held_entry();
        if (!entry) {
            return false;
        }
        const std::string id_field = "id:" + entry->owner;
        const std::array<std::string_view, 3> hget{"HGET", state_->name, id_field};
        const reply r = state_->conn->execute(hget);
        if (r.is_string() && r.text() == entry->acquisition) {
            return true;
        }
        throw_unless_not_ours(r, "verify");
        mark_lost(*state_, entry->epoch);
        return false;
    }

    /// The fencing token of the outermost acquisition; 0 when fencing is off or not held.
    std::int64_t fencing_token() const {
        std::lock_guard guard{state_->mutex};
        return state_->depth > 0 ? state_->fence : 0;
    }

    const std::string& name() const noexcept { return state_->name; }
    const lock_options& options() const noexcept { return state_->options; }

private:
    friend class detail::timed_lockable<basic_recursive_mutex>;

    struct state : detail::lock_identity<C> {
        using detail::lock_identity<C>::lock_identity;

        bool caller_is_holder() const { return this->caller_is(holder); }
        // Held by the parent this process was forked from: only the parent may release it.
        bool inherited_by_fork() const { return generation != detail::current_fork_generation(); }

        mutable std::mutex mutex;  // guards the members below; never held across a round trip
        std::size_t depth = 0;     // entries made through this object by its holder
        // Outermost acquisitions through this object so far, and the latest of them found lost
        // (on_lost called for it): on_lost runs once per acquisition.
        std::uint64_t epoch = 0;
        std::uint64_t lost_epoch = 0;
        std::thread::id holder;
        std::uint64_t generation = 0;  // fork generation of the first entry
        std::string holder_owner;
        std::string acquisition;  // id of the acquisition the entries belong to, in Redis
        detail::steady::time_point valid_until;
        std::int64_t fence = 0;
        typename basic_watchdog<C>::lease_id renewal = 0;  // 0: not renewed
    };

    // The entries of one outermost acquisition: who made them, and which acquisition it was
    // (here, and in Redis).
    struct held {
        std::string owner;
        std::uint64_t epoch = 0;
        std::string acquisition;
    };

    std::optional<held> held_entry() const {
        std::lock_guard guard{state_->mutex};
        if (state_->depth == 0) {
            return std::nullopt;
        }
        return held{state_->holder_owner, state_->epoch, state_->acquisition};
    }

    bool acquire_until(detail::steady::time_point deadline, const std::stop_token& stop) {
        const std::string owner = state_->caller_owner();
        return detail::acquire_with_backoff([&] { return attempt(owner); }, deadline, stop,
                                            state_->options);
    }

    // One attempt: std::nullopt when acquired or re-entered, else the holder's TTL.
    std::optional<detail::holder_ttl> attempt(const std::string& owner) {
        const detail::token candidate = detail::token::random();
        const auto sent = detail::steady::now();
        const reply r = detail::run_script(
            *state_->conn, detail::scripts::recursive_acquire,
            std::array<std::string_view, 2>{state_->name, state_->fence_key},
            std::array<std::string_view, 4>{owner, state_->lease_text.view(),
                                            state_->options.fencing ? "1" : "0", candidate.view()});
        if (r.is_error()) {
            throw server_error{"redislock: cannot lock '" + state_->name + "': " + r.text()};
        }
        if (!r.is_array() || r.elements().size() != 3) {
            throw server_error{"redislock: unexpected reply to a reentrant acquisition"};
        }
        const std::int64_t status = r.elements()[0].as_integer();
        const std::int64_t value = r.elements()[1].as_integer();
        const std::string& acquisition = r.elements()[2].text();
        if (status == 0) {
            return detail::holder_ttl{value};
        }
        bool previous_lost = false;
        std::optional<std::uint64_t> first_entry;
        typename basic_watchdog<C>::lease_id previous_renewal = 0;
        {
            std::lock_guard guard{state_->mutex};
            // Entries still counted here (unlock counts them out before its round trip) that
            // Redis no longer has: a new acquisition, an entry by another owner, or a re-entry
            // into another acquisition of this owner means their lease ran out or they were
            // deleted.
            if (state_->depth > 0 && (status == 1 || state_->holder_owner != owner ||
                                      state_->acquisition != acquisition)) {
                previous_lost = state_->lost_epoch < state_->epoch;
                state_->lost_epoch = state_->epoch;
                state_->depth = 0;
            }
            if (state_->depth == 0) {
                first_entry = ++state_->epoch;
                previous_renewal = std::exchange(state_->renewal, 0);
                state_->holder = std::this_thread::get_id();
                state_->generation = detail::current_fork_generation();
                state_->holder_owner = owner;
                state_->acquisition = acquisition;
                state_->fence = value;
            }
            ++state_->depth;
            state_->valid_until = detail::valid_until(sent, state_->options.lease);
        }
        state_->core->watchdog.remove(previous_renewal);
        if (previous_lost) {
            notify_lost(*state_);
        }
        if (first_entry && state_->options.watchdog) {
            start_renewing(held{owner, *first_entry, acquisition}, sent);
        }
        return std::nullopt;
    }

    void start_renewing(const held& entry, detail::steady::time_point sent) {
        state* st = state_.get();
        const std::uint64_t epoch = entry.epoch;
        lease_renewal renewal{&detail::scripts::recursive_extend,
                              {st->name},
                              {entry.owner, std::string{st->lease_text.view()}, entry.acquisition},
                              st->options.lease,
                              st->options.max_hold,
                              [st, epoch](detail::steady::time_point renewed_at) {
                                  std::lock_guard guard{st->mutex};
                                  if (st->depth > 0 && st->epoch == epoch) {
                                      st->valid_until =
                                          detail::valid_until(renewed_at, st->options.lease);
                                  }
                              },
                              [st, epoch] { mark_lost(*st, epoch); }};
        const auto id = st->core->watchdog.add(std::move(renewal), sent);
        bool still_ours = false;
        {
            std::lock_guard guard{st->mutex};
            still_ours = st->depth > 0 && st->epoch == epoch && st->renewal == 0;
            if (still_ours) {
                st->renewal = id;
            }
        }
        if (!still_ours) {
            st->core->watchdog.remove(id);
        }
    }

    // Leaves `entries` entries of `entry` in Redis; the caller has already counted them out.
    std::error_code leave(const held& entry, std::size_t entries) noexcept {
        reply r;
        try {
            const detail::decimal count{static_cast<long long>(entries)};
            r = detail::run_script(*state_->conn, detail::scripts::recursive_release,
                                   std::array{std::string_view{state_->name}},
                                   std::array<std::string_view, 5>{
                                       entry.owner, count.view(), state_->lease_text.view(),
                                       state_->channel, entry.acquisition});
        } catch (...) {
            return errc::connection_failed;
        }
        if (!r.is_integer()) {
            return errc::server_failed;
        }
        if (r.as_integer() >= 0) {
            return {};
        }
        // The entries were gone: every entry of that acquisition is lost.
        bool notify = false;
        typename basic_watchdog<C>::lease_id renewal = 0;
        {
            std::lock_guard guard{state_->mutex};
            notify = state_->lost_epoch < entry.epoch;
            if (notify) {
                state_->lost_epoch = entry.epoch;
            }
            if (state_->epoch == entry.epoch && state_->depth > 0) {
                state_->depth = 0;
                renewal = std::exchange(state_->renewal, 0);
            }
        }
        state_->core->watchdog.remove(renewal);
        if (notify) {
            notify_lost(*state_);
        }
        return errc::lock_lost;
    }

    // An error reply (LOADING, BUSY, READONLY...) says nothing about ownership, except WRONGTYPE:
    // the name now holds a key of another type, so our entry is gone.
    void throw_unless_not_ours(const reply& r, std::string_view what) const {
        if (r.is_error() && !r.is_error_code("WRONGTYPE")) {
            throw server_error{"redislock: cannot " + std::string{what} + " '" + state_->name +
                               "': " + r.text()};
        }
    }

    // Marks acquisition `epoch` lost and calls on_lost, once, if it is still held.
    static void mark_lost(state& st, std::uint64_t epoch) {
        {
            std::lock_guard guard{st.mutex};
            if (st.depth == 0 || st.epoch != epoch || st.lost_epoch >= epoch) {
                return;
            }
            st.lost_epoch = epoch;
        }
        notify_lost(st);
    }

    static void notify_lost(state& st) noexcept { detail::call_on_lost(st.options); }

    void release_on_destruction() noexcept {
        if (!state_) {
            return;
        }
        held entry;
        std::size_t entries = 0;
        typename basic_watchdog<C>::lease_id renewal = 0;
        {
            std::lock_guard guard{state_->mutex};
            if (state_->depth > 0 && state_->inherited_by_fork()) {
                return;  // the parent's entries: never left from a child
            }
            entries = std::exchange(state_->depth, 0);
            entry = {state_->holder_owner, state_->epoch, state_->acquisition};
            renewal = std::exchange(state_->renewal, 0);
        }
        state_->core->watchdog.remove(renewal);
        if (entries > 0) {
            (void)leave(entry, entries);
        }
    }

    std::unique_ptr<state> state_;
};

}  // namespace redislock
