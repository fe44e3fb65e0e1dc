// detail::shared_state: what a read-write lock object (basic_shared_mutex) keeps about its
// holders and shares with its timer and watchdog callbacks: one shared_hold per owner and mode
// held through the object, with its entry count, lease, fencing token and acquisition id, and what
// it left unsettled (releases whose reply was lost, attempts it gave up). Its books are kept
// under its own mutex, which is never held across a round trip; lease_tracker finds a hold's
// lease through find_lease().
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/given_up_registry.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/kinds/lock_identity.hpp>
#include <redislock/detail/kinds/owner_id.hpp>
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/thread_holds.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>

namespace redislock::detail {

enum class shared_mode : char { read = 'r', write = 'w' };

// What events say a hold of `kind` is.
inline lock_kind shared_lock_kind(shared_mode kind) noexcept {
    return kind == shared_mode::read ? lock_kind::shared_mutex_read : lock_kind::shared_mutex_write;
}

// How the scripts name `kind`.
inline std::string_view shared_mode_text(shared_mode kind) noexcept {
    return kind == shared_mode::read ? std::string_view{"r"} : std::string_view{"w"};
}

// One owner's entries in one mode, made through one read-write lock object.
template <connection C>
struct shared_hold {
    std::string owner;
    shared_mode kind = shared_mode::read;
    std::size_t depth = 0;
    // Re-entries whose reply was lost: the server's count may hold this many entries more than
    // depth says; the hold's last release leaves them too.
    std::size_t uncertain = 0;
    std::int64_t fence = 0;
    tracked_lease<C> lease;
    // Told lost by expiry, its entries handed to the take-back: its next release sends nothing
    // and reports the loss.
    bool taken_back = false;
    std::uint64_t generation = 0;  // fork generation of the first entry
    std::uint64_t epoch = 0;       // which acquisition: renewals and releases name it
    std::string acquisition{};     // the acquisition's id in Redis
    thread_hold_mark mark;     // the owner thread's count of its holds (waiting/thread_holds.hpp)
    std::thread::id thread{};  // the thread of its first entry, as unlock_refused names it

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

template <connection C>
struct shared_release;

// How an acquisition names a release of `entries` entries of `acquisition`, sent as `release`,
// whose reply was lost, so that it leaves them once (see ARGV[8] of shared_acquire.lua).
inline std::string unsettled_item(std::string_view acquisition, std::size_t entries,
                                  std::string_view release) {
    std::string item{acquisition};
    item.append(1, '/').append(std::to_string(entries)).append(1, '/').append(release);
    return item;
}

// What a read-write lock object shares with its timer and watchdog callbacks.
template <connection C>
struct shared_state : lock_identity<C> {
    using lock_identity<C>::lock_identity;
    using lease_key = shared_hold_ref;
    // The scripts never shorten an entry's expiry: objects of one owner share its entry in each
    // mode (see deadline_never_earlier).
    static constexpr bool expiry_never_shortened = true;

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

    // After the loss of the hold `ref` names by expiry: leaves its entries in the background,
    // should renewals or a re-entry that were never confirmed have kept them past the lease the
    // holder was told of (see shared_release::take_back).
    static void clean_up_expired(const std::shared_ptr<shared_state>& st,
                                 const shared_hold_ref& ref) noexcept {
        shared_release<C>::take_back(st, ref);
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

    // Whether `owner`'s next entry in `kind` is an outermost one, with what it settles
    // (space-separated) in `given_up_ids`: this object's items (see remember_unsettled()), and
    // for a first entry the attempts of the owner any object of the client gave up (see
    // given_up_registry.hpp). Each leaves only what is still counted, once: naming one that
    // is not the owner's changes nothing.
    bool outermost(const std::string& owner, shared_mode kind, std::string& given_up_ids) {
        // A hold lost here was handed to the take-back first (see shared_mutex::attempt): this
        // acquisition settles it too, so that an entry of ours left in the other mode never
        // refuses this one as an upgrade.
        const shared_hold<C>* h = find(owner, kind);
        for (const unsettled& u : given_up) {
            given_up_ids.append(given_up_ids.empty() ? "" : " ").append(u.item);
        }
        const bool first = h == nullptr || h->depth == 0 || h->lease.lost;
        if (first) {
            this->core->given_up->append_to(this->name, owner, given_up_ids);
        }
        return first;
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
            h->taken_back = false;
            h->fence = got.value;
            h->generation = current_fork_generation();
            h->epoch = ++last_epoch;
            h->acquisition = got.acquisition;
            e.first_entry = shared_hold_ref{owner, kind, h->epoch, got.acquisition, false};
            h->thread = std::this_thread::get_id();
            if (this->options.owner.empty()) {
                h->mark.count();
            }
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
        bool taken_back = false;  // the take-back after a loss by expiry had left every entry
        tracked_lease<C> ended;   // the hold's lease when these are its last entries
    };

    // Counts out one entry of the calling owner (lock_identity::caller_owner(), matched without
    // building it) in `kind` into `out`, or says why it cannot; for errc::not_holder because
    // another thread of this process holds that mode through this object, `other` is set to it.
    // Never throws: an inner entry whose names cannot be copied for its release (out of memory)
    // is counted out with no entries to send (it stays in Redis until the entry's expiry); a
    // hold's last entry moves its names out.
    std::error_code count_out_caller(shared_mode kind, left& out, std::thread::id& other) noexcept {
        shared_hold<C>* h = nullptr;
        for (shared_hold<C>& candidate : holds) {
            if (candidate.kind == kind &&
                is_owner_id(candidate.owner, this->core->instance_id, this->options.owner)) {
                h = &candidate;
            }
        }
        if (!h || h->depth == 0) {
            const shared_hold<C>* holder = held_by_other_owner(kind);
            if (holder == nullptr) {
                return errc::not_held;
            }
            if (!holder->inherited_by_fork()) {
                other = holder->thread;
            }
            return errc::not_holder;
        }
        if (h->inherited_by_fork()) {
            return errc::not_holder;
        }
        if (h->taken_back) {
            // Every entry was left by the take-back: nothing to send, all of them are gone.
            h->depth = 0;
            h->uncertain = 0;
            out.entries = 0;
            out.last = true;
            out.taken_back = true;
            out.ended = std::exchange(h->lease, {});
            erase_released();
            return {};
        }
        // Counted out before the round trip, so an acquisition that lands right after the
        // release never mistakes the entry for a live one.
        if (h->depth > 1) {
            try {
                out.ref = {h->owner, kind, h->epoch, h->acquisition, h->lease.lost};
            } catch (...) {
                out.entries = 0;
            }
            --h->depth;
            return {};
        }
        out.ref = {std::move(h->owner), kind, h->epoch, std::move(h->acquisition), h->lease.lost};
        h->depth = 0;
        out.last = true;
        out.entries += std::exchange(h->uncertain, 0);
        out.ended = std::exchange(h->lease, {});
        erase_released();
        return {};
    }

    // A hold of `kind` with entries, of any owner; nullptr when there is none.
    const shared_hold<C>* held_by_other_owner(shared_mode kind) const noexcept {
        const auto it = std::find_if(holds.begin(), holds.end(), [kind](const shared_hold<C>& h) {
            return h.kind == kind && h.depth > 0;
        });
        return it != holds.end() ? &*it : nullptr;
    }

    // A re-entry of `owner` in `kind` whose outcome is unknown: the server's count may hold one
    // entry more than depth says.
    void count_uncertain(const std::string& owner, shared_mode kind) {
        if (shared_hold<C>* h = find(owner, kind)) {
            ++h->uncertain;
        }
    }

    // Drops holds with no entries left.
    void erase_released() noexcept {
        for (shared_hold<C>& h : holds) {
            if (h.depth == 0) {
                h.mark.uncount();
            }
        }
        std::erase_if(holds, [](const shared_hold<C>& h) { return h.depth == 0; });
    }

    // Remembers what the owner's next acquisition through this object settles: an
    // unsettled_item() (a release whose reply was lost, forgotten once a script answered it) or,
    // with `attempt`, the id of an attempt it gave up, kept until newer ones push it out (its
    // entry may land after any answer; the script leaves it only while it is counted).
    void remember_unsettled(std::string item, bool attempt) {
        if (given_up.size() >= 8) {
            given_up.erase(given_up.begin());  // the oldest is surely settled by now or reaped
        }
        given_up.push_back({std::move(item), attempt});
    }

    // Forgets the release items in `settled`, which a script has answered; an abandoned
    // attempt's stay (see remember_unsettled()).
    void forget_settled(const std::vector<std::string>& settled) noexcept {
        std::erase_if(given_up, [&](const unsettled& u) {
            return !u.attempt && std::find(settled.begin(), settled.end(), u.item) != settled.end();
        });
    }

    // Every hold `owner` has.
    std::vector<shared_hold_ref> refs_of(const std::string& owner) const {
        std::vector<shared_hold_ref> refs;
        for (const shared_hold<C>& h : holds) {
            if (h.owner == owner && h.depth > 0 && !h.taken_back) {
                refs.push_back({h.owner, h.kind, h.epoch, h.acquisition, h.lease.lost});
            }
        }
        return refs;
    }

    // Takes every hold out (the object is going away): moving the vector allocates nothing.
    std::vector<shared_hold<C>> take_all() noexcept { return std::exchange(holds, {}); }

    // What leaving every entry of `h`, taken out by take_all(), gives the release; its names
    // are moved out.
    static left give_up(shared_hold<C>& h) noexcept {
        left out;
        out.ref = {std::move(h.owner), h.kind, h.epoch, std::move(h.acquisition), h.lease.lost};
        out.entries = h.taken_back ? 0 : h.depth + std::exchange(h.uncertain, 0);
        out.last = true;
        out.ended = std::exchange(h.lease, {});
        h.depth = 0;
        return out;
    }

    mutable std::mutex mutex;  // guards the members below; never held across a round trip
    std::vector<shared_hold<C>> holds;
    std::uint64_t last_epoch = 0;
    // What the owner's next acquisition through this object settles (see remember_unsettled()).
    struct unsettled {
        std::string item;
        bool attempt = false;
    };
    std::vector<unsettled> given_up;
};

}  // namespace redislock::detail
