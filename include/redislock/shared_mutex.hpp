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
// Releases are not retried after a connection failure (a decrement is not idempotent).
// With lock_options::watchdog each held mode of each owner is renewed from its first entry
// through this object until its last one is left (see watchdog.hpp).
// Lifetime: independent of the client's (the connection is shared). Movable, not copyable; a
// moved-from object may only be destroyed or assigned to. Destroying the object leaves every
// entry made through it.
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
#include <redislock/detail/lock_identity.hpp>
#include <redislock/detail/lockable.hpp>
#include <redislock/detail/names.hpp>
#include <redislock/detail/owner.hpp>
#include <redislock/detail/scripts.hpp>
#include <redislock/detail/wait.hpp>
#include <redislock/error.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock {

template <connection C>
class basic_client;

template <connection C>
class basic_shared_mutex : public detail::timed_lockable<basic_shared_mutex<C>>,
                           public detail::shared_timed_lockable<basic_shared_mutex<C>> {
public:
    /// Usually made by client.shared_mutex(name, options).
    /// @throws redislock::invalid_argument for an empty or oversized name, a lease out of
    ///         range, or inconsistent backoff bounds.
    basic_shared_mutex(basic_client<C>& client, std::string_view name, lock_options options = {})
        : state_{std::make_unique<state>(client.core_, name, std::move(options))} {}

    basic_shared_mutex(basic_shared_mutex&&) noexcept = default;
    basic_shared_mutex& operator=(basic_shared_mutex&& other) noexcept {
        if (this != &other) {
            release_on_destruction();
            state_ = std::move(other.state_);
        }
        return *this;
    }
    ~basic_shared_mutex() { release_on_destruction(); }

    /// Leaves one write entry. Never throws; a lock found lost calls on_lost.
    void unlock() noexcept {
        std::error_code ignored;
        unlock(ignored);
    }
    /// As unlock(), saying how it went (see basic_recursive_mutex::unlock(std::error_code&)).
    void unlock(std::error_code& ec) noexcept { ec = leave_one(mode::write); }

    /// Leaves one read entry. Never throws; a lock found lost calls on_lost.
    void unlock_shared() noexcept {
        std::error_code ignored;
        unlock_shared(ignored);
    }
    void unlock_shared(std::error_code& ec) noexcept { ec = leave_one(mode::read); }

    /// Sets the lease of every mode the caller holds to `lease` from now.
    /// Returns false (and calls on_lost) if any was lost; false at once if the caller holds none.
    /// @throws redislock::invalid_argument, redislock::connection_error
    bool extend(std::chrono::milliseconds lease) {
        detail::check_lease(lease);
        return check_caller_holds(lease);
    }

    /// Asks Redis whether every mode the caller holds is still held. Lost ones call on_lost.
    /// @throws redislock::connection_error
    bool verify() { return check_caller_holds(std::chrono::milliseconds::zero()); }

    /// Local, conservative estimate of how long the caller's holds last (the shortest of them);
    /// zero when the caller holds none or one is known lost.
    std::chrono::milliseconds remaining() const {
        const std::string owner = state_->caller_owner();
        std::lock_guard guard{state_->mutex};
        std::optional<std::chrono::milliseconds> shortest;
        for (const hold& h : state_->holds) {
            if (h.owner == owner) {
                const auto left =
                    h.lost ? std::chrono::milliseconds::zero() : detail::time_left(h.valid_until);
                shortest = shortest ? std::min(*shortest, left) : left;
            }
        }
        return shortest.value_or(std::chrono::milliseconds::zero());
    }

    /// Local: true while the caller holds the lock in some mode and remaining() > 0.
    bool owned() const { return remaining() > std::chrono::milliseconds::zero(); }

    /// The fencing token of the caller's write acquisition; 0 when fencing is off or the caller
    /// does not hold the write lock.
    std::int64_t fencing_token() const {
        const std::string owner = state_->caller_owner();
        std::lock_guard guard{state_->mutex};
        const hold* h = find(owner, mode::write);
        return h ? h->fence : 0;
    }

    const std::string& name() const noexcept { return state_->name; }
    const lock_options& options() const noexcept { return state_->options; }

private:
    friend class detail::timed_lockable<basic_shared_mutex>;
    friend class detail::shared_timed_lockable<basic_shared_mutex>;

    enum class mode : char { read = 'r', write = 'w' };

    // One owner's entries in one mode, made through this object.
    struct hold {
        std::string owner;
        mode kind;
        std::size_t depth = 0;
        bool lost = false;
        detail::steady::time_point valid_until{};
        std::int64_t fence = 0;
        typename basic_watchdog<C>::lease_id renewal = 0;  // 0: not renewed
        std::uint64_t generation = 0;                      // fork generation of the first entry
        std::uint64_t epoch = 0;    // which acquisition: renewals and releases name it
        std::string acquisition{};  // the acquisition's id in Redis

        // Held by the parent this process was forked from: only the parent may release it.
        bool inherited_by_fork() const { return generation != detail::current_fork_generation(); }
    };

    // What a release or a renewal callback knows of the hold it acts for.
    struct hold_ref {
        std::string owner;
        mode kind;
        std::uint64_t epoch = 0;
        std::string acquisition;
        bool reported = false;  // its loss was already reported through on_lost
    };

    struct state : detail::lock_identity<C> {
        state(std::shared_ptr<detail::client_core<C>> client, std::string_view lock_name,
              lock_options opts)
            : detail::lock_identity<C>{std::move(client), lock_name, std::move(opts)},
              // After the options were checked: backoff_max is bounded by then.
              queue_text{std::max(std::chrono::milliseconds{1000}, 4 * this->options.backoff_max)
                             .count()} {}

        detail::decimal queue_text;  // how long a waiting writer keeps readers out

        mutable std::mutex mutex;  // guards the members below; never held across a round trip
        std::vector<hold> holds;
        std::uint64_t last_epoch = 0;
    };

    hold* find(const std::string& owner, mode kind) const { return find_in(*state_, owner, kind); }

    static hold* find_in(state& st, const std::string& owner, mode kind) {
        for (hold& h : st.holds) {
            if (h.owner == owner && h.kind == kind) {
                return &h;
            }
        }
        return nullptr;
    }

    // The hold `ref` names, if it is still the same acquisition and held.
    static hold* find_in(state& st, const hold_ref& ref) {
        hold* h = find_in(st, ref.owner, ref.kind);
        return h && h->epoch == ref.epoch && h->depth > 0 ? h : nullptr;
    }

    static std::string_view mode_text(mode kind) {
        return kind == mode::read ? std::string_view{"r"} : std::string_view{"w"};
    }

    bool acquire_until(detail::steady::time_point deadline, const std::stop_token& stop) {
        return acquire(mode::write, deadline, stop);
    }
    bool acquire_shared_until(detail::steady::time_point deadline, const std::stop_token& stop) {
        return acquire(mode::read, deadline, stop);
    }

    bool acquire(mode kind, detail::steady::time_point deadline, const std::stop_token& stop) {
        const std::string owner = state_->caller_owner();
        // A reader asking to write is refused by the script ({-1, 0}), not here: only the server
        // knows whether this owner also writes through another object (then it re-enters).
        // Only a writer that will wait queues, so a failed try_lock() never holds readers back.
        const bool queue = kind == mode::write && deadline > detail::steady::now();
        bool queued = false;
        bool acquired = false;
        try {
            acquired = detail::acquire_with_backoff(
                [&] {
                    auto ttl = attempt(owner, kind, queue);
                    queued = queued || ttl.has_value();
                    return ttl;
                },
                deadline, stop, state_->options);
        } catch (...) {
            // A writer that stops waiting because of an error must not hold readers back either.
            if (queue && queued) {
                leave_queue(owner);
            }
            throw;
        }
        if (!acquired && queue && queued) {
            leave_queue(owner);
        }
        return acquired;
    }

    [[noreturn]] void throw_upgrade() const {
        throw std::system_error{std::make_error_code(std::errc::resource_deadlock_would_occur),
                                "redislock: lock() of '" + state_->name +
                                    "' while holding its read lock would deadlock; "
                                    "unlock_shared() first"};
    }

    std::optional<detail::holder_ttl> attempt(const std::string& owner, mode kind, bool queue) {
        const detail::token candidate = detail::token::random();
        const auto sent = detail::steady::now();
        const reply r = detail::run_script(
            *state_->conn, detail::scripts::shared_acquire,
            std::array<std::string_view, 2>{state_->name, state_->fence_key},
            std::array<std::string_view, 6>{
                owner, mode_text(kind), state_->lease_text.view(),
                kind == mode::write && state_->options.fencing ? "1" : "0",
                queue ? state_->queue_text.view() : std::string_view{"0"}, candidate.view()});
        if (r.is_error()) {
            throw server_error{"redislock: cannot lock '" + state_->name + "': " + r.text()};
        }
        if (!r.is_array() || r.elements().size() != 3) {
            throw server_error{"redislock: unexpected reply to a read-write acquisition"};
        }
        const std::int64_t status = r.elements()[0].as_integer();
        const std::int64_t value = r.elements()[1].as_integer();
        const std::string& acquisition = r.elements()[2].text();
        if (status == -1) {
            throw_upgrade();
        }
        if (status == 0) {
            return detail::holder_ttl{value};
        }
        std::optional<hold_ref> first_entry;
        bool previous_lost = false;
        typename basic_watchdog<C>::lease_id previous_renewal = 0;
        {
            std::lock_guard guard{state_->mutex};
            hold* h = find(owner, kind);
            if (!h) {
                h = &state_->holds.emplace_back(hold{owner, kind});
            }
            // A new acquisition, or a re-entry into another acquisition of this owner, while
            // entries are still counted here means Redis lost them: their lease ran out, or they
            // were deleted.
            if (h->depth > 0 && (status == 1 || h->acquisition != acquisition)) {
                previous_lost = !h->lost;
                h->depth = 0;
            }
            if (h->depth == 0 || h->lost) {
                previous_renewal = std::exchange(h->renewal, 0);
                h->depth = 0;
                h->lost = false;
                h->fence = value;
                h->generation = detail::current_fork_generation();
                h->epoch = ++state_->last_epoch;
                h->acquisition = acquisition;
                first_entry = hold_ref{owner, kind, h->epoch, acquisition};
            }
            ++h->depth;
            h->valid_until = detail::valid_until(sent, state_->options.lease);
        }
        state_->core->watchdog.remove(previous_renewal);
        if (previous_lost) {
            notify_lost(*state_);
        }
        if (first_entry && state_->options.watchdog) {
            start_renewing(*first_entry, sent);
        }
        return std::nullopt;
    }

    void start_renewing(const hold_ref& ref, detail::steady::time_point sent) {
        state* st = state_.get();
        lease_renewal renewal{&detail::scripts::shared_extend,
                              {st->name},
                              {ref.owner, std::string{mode_text(ref.kind)},
                               std::string{st->lease_text.view()}, ref.acquisition},
                              st->options.lease,
                              st->options.max_hold,
                              [st, ref](detail::steady::time_point renewed_at) {
                                  std::lock_guard guard{st->mutex};
                                  if (hold* h = find_in(*st, ref)) {
                                      h->valid_until =
                                          detail::valid_until(renewed_at, st->options.lease);
                                  }
                              },
                              [st, ref] { mark_lost(*st, ref); }};
        const auto id = st->core->watchdog.add(std::move(renewal), sent);
        bool still_ours = false;
        {
            std::lock_guard guard{st->mutex};
            hold* h = find_in(*st, ref);
            still_ours = h && h->renewal == 0;
            if (still_ours) {
                h->renewal = id;
            }
        }
        if (!still_ours) {
            st->core->watchdog.remove(id);
        }
    }

    static void mark_lost(state& st, const hold_ref& ref) {
        {
            std::lock_guard guard{st.mutex};
            hold* h = find_in(st, ref);
            if (!h || h->lost) {
                return;
            }
            h->lost = true;
        }
        notify_lost(st);
    }

    void leave_queue(const std::string& owner) noexcept {
        try {
            const std::string field = "q:" + owner;
            const std::array<std::string_view, 3> hdel{"HDEL", state_->name, field};
            (void)state_->conn->execute(hdel);
        } catch (...) {
            // The claim expires on its own within queue_text ms.
        }
    }

    std::error_code leave_one(mode kind) noexcept {
        std::string owner;
        try {
            owner = state_->caller_owner();
        } catch (...) {
            return std::make_error_code(std::errc::not_enough_memory);
        }
        hold_ref ref;
        typename basic_watchdog<C>::lease_id renewal = 0;
        {
            std::lock_guard guard{state_->mutex};
            hold* h = find(owner, kind);
            if (!h || h->depth == 0) {
                return held_by_other_owner(kind) ? errc::not_holder : errc::not_held;
            }
            if (h->inherited_by_fork()) {
                return errc::not_holder;
            }
            ref = {owner, kind, h->epoch, h->acquisition, h->lost};
            // Counted out before the round trip, so an acquisition that lands right after the
            // release never mistakes the entry for a live one.
            if (--h->depth == 0) {
                renewal = std::exchange(h->renewal, 0);
                erase_released();
            }
        }
        state_->core->watchdog.remove(renewal);
        return leave(ref, 1);
    }

    // Drops holds with no entries left. Needs state_->mutex.
    void erase_released() {
        std::erase_if(state_->holds, [](const hold& h) { return h.depth == 0; });
    }

    bool held_by_other_owner(mode kind) const {
        return std::any_of(state_->holds.begin(), state_->holds.end(),
                           [kind](const hold& h) { return h.kind == kind && h.depth > 0; });
    }

    // Leaves `entries` entries, already counted out locally, of the hold `ref` in Redis.
    std::error_code leave(const hold_ref& ref, std::size_t entries) noexcept {
        reply r;
        try {
            const detail::decimal count{static_cast<long long>(entries)};
            r = detail::run_script(
                *state_->conn, detail::scripts::shared_release,
                std::array{std::string_view{state_->name}},
                std::array<std::string_view, 5>{ref.owner, mode_text(ref.kind), count.view(),
                                                state_->channel, ref.acquisition});
        } catch (...) {
            return errc::connection_failed;
        }
        // An error reply says nothing about ownership, except WRONGTYPE: the name now holds
        // another type, so our entries are gone.
        if (r.is_error() && !r.is_error_code("WRONGTYPE")) {
            return errc::server_failed;
        }
        if (r.is_integer() && r.as_integer() >= 0) {
            return {};
        }
        // The entries were gone: every entry of that acquisition is lost.
        bool notify = !ref.reported;
        typename basic_watchdog<C>::lease_id renewal = 0;
        {
            std::lock_guard guard{state_->mutex};
            if (hold* h = find_in(*state_, ref)) {
                notify = notify && !h->lost;
                h->depth = 0;
                renewal = std::exchange(h->renewal, 0);
                erase_released();
            }
        }
        state_->core->watchdog.remove(renewal);
        if (notify) {
            notify_lost(*state_);
        }
        return errc::lock_lost;
    }

    // Extends (lease > 0) or checks (lease == 0) every mode the caller holds.
    bool check_caller_holds(std::chrono::milliseconds lease) {
        const std::string owner = state_->caller_owner();
        std::vector<hold_ref> refs;
        {
            std::lock_guard guard{state_->mutex};
            for (const hold& h : state_->holds) {
                if (h.owner == owner && h.depth > 0) {
                    refs.push_back({h.owner, h.kind, h.epoch, h.acquisition, h.lost});
                }
            }
        }
        if (refs.empty()) {
            return false;
        }
        bool all_held = true;
        const detail::decimal lease_text{lease.count()};
        for (const hold_ref& ref : refs) {
            const auto sent = detail::steady::now();
            const reply r = detail::run_script(
                *state_->conn, detail::scripts::shared_extend,
                std::array{std::string_view{state_->name}},
                std::array<std::string_view, 4>{ref.owner, mode_text(ref.kind), lease_text.view(),
                                                ref.acquisition});
            if (r.is_error() && !r.is_error_code("WRONGTYPE")) {
                throw server_error{"redislock: cannot check '" + state_->name + "': " + r.text()};
            }
            const bool held = r.is_integer() && r.as_integer() == 1;
            all_held = all_held && held;
            if (held && lease > std::chrono::milliseconds::zero()) {
                std::lock_guard guard{state_->mutex};
                if (hold* h = find_in(*state_, ref)) {
                    h->valid_until = detail::valid_until(sent, lease);
                }
            } else if (!held) {
                mark_lost(*state_, ref);
            }
        }
        return all_held;
    }

    static void notify_lost(state& st) noexcept { detail::call_on_lost(st.options); }

    void release_on_destruction() noexcept {
        if (!state_) {
            return;
        }
        std::vector<std::pair<hold_ref, std::size_t>> releases;
        std::vector<typename basic_watchdog<C>::lease_id> renewals;
        {
            std::lock_guard guard{state_->mutex};
            for (hold& h : state_->holds) {
                if (h.depth == 0 || h.inherited_by_fork()) {
                    continue;  // nothing held, or the parent's entries: never left from a child
                }
                releases.emplace_back(hold_ref{h.owner, h.kind, h.epoch, h.acquisition, h.lost},
                                      h.depth);
                renewals.push_back(std::exchange(h.renewal, 0));
                h.depth = 0;
            }
            erase_released();
        }
        for (auto renewal : renewals) {
            state_->core->watchdog.remove(renewal);
        }
        for (const auto& [ref, entries] : releases) {
            (void)leave(ref, entries);
        }
    }

    std::unique_ptr<state> state_;
};

}  // namespace redislock
