// detail::recursive_state: what a reentrant lock object (basic_recursive_mutex) keeps about its
// acquisition and shares with its timer and watchdog callbacks: the holder's entry count, owner,
// acquisition id, lease and fencing token, and the attempts it gave up. Its books are kept
// under its own mutex, which is never held across a round trip; lease_tracker finds the lease
// through find_lease().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/kinds/lock_identity.hpp>
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/thread_holds.hpp>
#include <redislock/events.hpp>

namespace redislock::detail {

template <connection C>
struct recursive_release;

// The entries of one outermost acquisition: who made them, and which acquisition it was (here,
// and in Redis).
struct recursive_entry {
    std::string owner;
    std::uint64_t epoch = 0;
    std::string acquisition;
};

// A release through a reentrant lock object whose reply was lost: what it leaves, as which release.
struct recursive_unsettled {
    recursive_entry entry;
    std::size_t entries = 0;
    token release{};
};

// What a reentrant lock object shares with its timer and watchdog callbacks.
template <connection C>
struct recursive_state : lock_identity<C> {
    using lock_identity<C>::lock_identity;
    using lease_key = std::uint64_t;  // an outermost acquisition is named by its epoch
    // The scripts never shorten the key's expiry: objects of one owner share its entries (see
    // deadline_never_earlier).
    static constexpr bool expiry_never_shortened = true;

    bool caller_is_holder() const { return this->caller_is(holder); }
    // Held by the parent this process was forked from: only the parent may release it.
    bool inherited_by_fork() const { return generation != current_fork_generation(); }
    const tracked_lease<C>* held_lease() const { return depth > 0 ? &lease : nullptr; }
    static tracked_lease<C>* find_lease(recursive_state& st, const std::uint64_t& epoch) {
        return st.depth > 0 && st.epoch == epoch ? &st.lease : nullptr;
    }

    // After the loss of acquisition `epoch` by expiry: leaves its entries in the background,
    // should renewals or a re-entry that were never confirmed have kept them past the lease the
    // holder was told of (see recursive_release::take_back).
    static void clean_up_expired(const std::shared_ptr<recursive_state>& st,
                                 const std::uint64_t& epoch) noexcept {
        recursive_release<C>::take_back(st, epoch);
    }

    // The books below need the mutex.

    // The holder's entries.
    recursive_entry current() const { return {holder_owner, epoch, acquisition}; }

    // The holder's entries, their names moved out: for their last release (depth zero), after
    // which nothing reads them until a new first entry sets them again.
    recursive_entry taken_entry() noexcept {
        return {std::move(holder_owner), epoch, std::move(acquisition)};
    }

    // Whether `owner`'s next entry is an outermost one, with the ids of the attempts it names as
    // given up (space-separated) in `given_up_ids`: this object's, and those of the owner any
    // object of the client gave up (see given_up_registry.hpp).
    // An acquisition lost here by expiry is joined, not taken over (another object of the owner
    // may count on it): its take-back leaves only this object's entries (see
    // recursive_release::take_back, which the caller runs first).
    bool outermost(const std::string& owner, std::string& given_up_ids) const {
        for (const std::string& item : given_up) {
            given_up_ids.append(given_up_ids.empty() ? "" : " ").append(item);
        }
        const bool first = depth == 0 || holder_owner != owner || lease.lost;
        if (first) {
            this->core->given_up->append_to(this->name, owner, given_up_ids);
        }
        return first;
    }

    // Remembers the id of an attempt this object gave up, for its next first entry to settle;
    // the newest few only (an older one is surely settled by the reaper by then, or named by
    // the client's registry).
    void remember_given_up(std::string item) {
        if (given_up.size() >= 8) {
            given_up.erase(given_up.begin());
        }
        given_up.push_back(std::move(item));
    }

    // What counting an entry in found.
    struct entered {
        std::optional<std::uint64_t> first_entry;  // an outermost one: its epoch
        tracked_lease<C> previous;                 // the lease it replaced
        bool previous_lost = false;                // which was still live
    };

    // Counts in an entry of `owner` that `got` granted to an attempt sent at `sent`.
    entered enter(const std::string& owner, const entry_reply& got, steady::time_point sent) {
        entered e;
        // Entries still counted here (unlock counts them out before its round trip) that Redis
        // no longer has: a new acquisition, an entry by another owner, or a re-entry into
        // another acquisition of this owner means their lease ran out or they were deleted.
        if (depth > 0 &&
            (got.status == 1 || holder_owner != owner || acquisition != got.acquisition)) {
            e.previous_lost = !lease.lost;
            depth = 0;
        }
        // A re-entry into an acquisition already reported lost starts afresh here: it gets its
        // own deadline and renewals (the lost one has neither).
        if (depth == 0 || lease.lost) {
            depth = 0;
            uncertain = 0;
            taken_back = false;
            given_up.clear();  // settled by the script that made this first entry
            e.first_entry = ++epoch;
            e.previous = std::exchange(lease, {});
            holder = thread_number();
            holder_thread = std::this_thread::get_id();
            generation = current_fork_generation();
            holder_owner = owner;
            acquisition = got.acquisition;
            fence = got.value;
            lease.valid_until = valid_until(sent, this->options.lease);
            lease.acquired_at = sent;
            lease.kind = lock_kind::recursive_mutex;
            if (this->options.owner.empty()) {
                mark.count();
            }
        }
        ++depth;
        return e;
    }

    // What counting entries out gives the release.
    struct left {
        recursive_entry entry;
        std::size_t entries = 0;
        bool last = false;
        bool taken_back = false;  // the take-back after a loss by expiry had left every entry
        tracked_lease<C> ended;   // the acquisition's lease when these are its last entries
    };

    // Counts one entry out (unlock). Never throws: an inner entry whose names cannot be copied
    // for its release (out of memory) is counted out with no entries to send (it stays in Redis
    // until the key's expiry); the last entry's names are moved out, as nothing reads them once
    // depth is zero.
    left count_out() noexcept {
        left out;
        if (taken_back) {
            // Every entry was left by the take-back: nothing to send, all of them are gone.
            taken_back = false;
            depth = 0;
            uncertain = 0;
            mark.uncount();
            out.last = true;
            out.taken_back = true;
            out.ended = std::exchange(lease, {});
            return out;
        }
        out.entries = 1;
        // Counted out before the round trip, so an acquisition through this object that lands
        // right after the release never mistakes the entry for a live one.
        if (depth > 1) {
            try {
                out.entry = current();
            } catch (...) {
                out.entries = 0;
            }
            --depth;
            return out;
        }
        depth = 0;
        mark.uncount();
        out.last = true;
        out.entry = taken_entry();
        out.ended = std::exchange(lease, {});
        out.entries += std::exchange(uncertain, 0);
        return out;
    }

    // Counts every entry out (the object is going away); none when none is held. Never throws.
    left give_up_all() noexcept {
        left out;
        out.entries = std::exchange(depth, 0);
        out.last = true;
        mark.uncount();
        if (std::exchange(taken_back, false)) {
            out.entries = 0;  // left by the take-back already
        }
        if (out.entries > 0) {
            out.entries += std::exchange(uncertain, 0);
            out.entry = taken_entry();
        }
        out.ended = std::exchange(lease, {});
        return out;
    }

    mutable std::mutex mutex;       // guards the members below; never held across a round trip
    std::size_t depth = 0;          // entries made through this object by its holder
    std::uint64_t epoch = 0;        // outermost acquisitions through this object so far
    std::uint64_t holder = 0;       // thread_number() of the holder thread
    std::thread::id holder_thread;  // the same thread, as unlock_refused events name it
    std::uint64_t generation = 0;   // fork generation of the first entry
    std::string holder_owner;
    std::string acquisition;            // id of the acquisition the entries belong to, in Redis
    std::vector<std::string> given_up;  // the attempts this object gave up (remember_given_up())
    // The last release through this object whose reply was lost, until an answer settles it: the
    // object's next outermost lock() sends it first (joined instead, a lost reply of that lock()
    // would leave a count no one leaves).
    std::optional<recursive_unsettled> unsettled;
    // Re-entries through this object whose reply was lost: the server's count may hold this
    // many entries more than depth says; the last release leaves them too.
    std::size_t uncertain = 0;
    // The acquisition was told lost by expiry and its entries handed to the take-back: the next
    // unlock() sends nothing and reports the loss.
    bool taken_back = false;
    std::int64_t fence = 0;
    tracked_lease<C> lease;
    thread_hold_mark mark;  // the holder thread's count of its holds (waiting/thread_holds.hpp)
};

}  // namespace redislock::detail
