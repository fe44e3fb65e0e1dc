// detail::shared_release: how a read-write lock object (basic_shared_mutex) leaves its holds in
// Redis: the release script's round trip, what its answer means (entries gone: the hold is lost),
// and a release or an abandoned acquisition that could not be finished, remembered as given up
// and handed to the client's reaper. Static functions on the object's shared_state, which the
// reaper keeps alive while it retries; each takes the state's mutex only between round trips.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/blocking/end_release.hpp>
#include <redislock/detail/blocking/entry_release.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/kinds/shared_state.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

template <connection C>
struct shared_release {
    using state = shared_state<C>;
    using hold = shared_hold<C>;
    using hold_ref = shared_hold_ref;

    // Remembers an acquisition whose entry may be in Redis though this object does not hold it
    // (the owner's next acquisition through this object drops it), and has the reaper leave
    // `entries` of its entries (drop_all for one this object created and abandoned).
    static void abandon(const std::shared_ptr<state>& st, const hold_ref& ref, std::size_t entries,
                        steady::time_point lease_end) noexcept {
        try {
            std::lock_guard guard{st->mutex};
            st->remember_given_up(ref.acquisition);
        } catch (...) {
            return;  // Out of memory: the entry expires with its lease.
        }

        detail::leave_to_reaper(
            st, ref, lease_end,
            [entries](const state& s, const hold_ref& r, steady::time_point deadline) {
                return leave_once(s, r, entries, deadline).is_integer();
            });
    }

    // Gives up a new acquisition, made by an attempt of this object whose outcome is unknown or
    // that could not stand: its entry may be in Redis though no object holds it. Every object of
    // the client names it as given up (see given_up_registry.hpp; not for a release that could
    // not be finished, whose entries another object of the owner may have joined), and the
    // reaper drops it.
    static void abandon_attempt(const std::shared_ptr<state>& st, const hold_ref& ref,
                                steady::time_point lease_end) noexcept {
        try {
            st->core->given_up->remember(st->name, ref.owner, ref.acquisition, lease_end);
        } catch (...) {
            // This process's registry could not be built: the object still names it.
        }
        abandon(st, ref, drop_all, lease_end);
    }

    // Sends one release; one that lets waiters in tells them.
    static reply leave_once(const state& st, const hold_ref& ref, std::size_t entries,
                            steady::time_point deadline) {
        const decimal count{static_cast<long long>(entries)};
        return detail::send_release(
            st, scripts::shared_release,
            std::array<std::string_view, 6>{ref.owner, shared_mode_text(ref.kind), count.view(),
                                            st.channel, ref.acquisition, st.grace_text.view()},
            entries, deadline);
    }

    // After the loss of the hold `ref` names by expiry, once told: leaves, in the background, the
    // entries this object surely holds in it (its depth; an uncertain one, whose reply was lost,
    // may not be there, and leaving it could take another object's entry). Renewals or a
    // re-entry whose WAIT saw too few replicas still extended the entry and the key on the
    // master; with our entries gone the entry goes, and the key keeps only the other holders'
    // leases, another object of the owner's included: that one keeps what it was told it has, and
    // its own loss or release ends it. Named by the acquisition id, it never touches a later
    // acquisition. Sent once: a count left twice would take another object's entry, so a lost
    // answer leaves the entry to expire with what the renewals gave it.
    static void take_back(const std::shared_ptr<state>& st, const hold_ref& ref) noexcept {
        std::size_t entries = 0;
        {
            std::lock_guard guard{st->mutex};
            hold* h = st->find(ref);
            if (h == nullptr || !h->lease.lost || h->taken_back) {
                return;  // left by its release, or a later acquisition
            }
            entries = h->depth;  // the uncertain ones may not be there: they expire with the key
            h->uncertain = 0;
            h->taken_back = true;
        }
        detail::leave_to_reaper(
            st, ref, steady::now() + st->options.lease,
            [entries](const state& s, const hold_ref& r, steady::time_point deadline) {
                try {
                    (void)leave_once(s, r, entries, deadline);
                } catch (...) {
                    // Its outcome is unknown: not sent again (see above).
                }
                return true;
            });
    }

    // Leaves `entries` entries, already counted out locally, of the hold `ref` in Redis. A
    // hold's last release drops every entry of its acquisition, so a re-entry whose reply was
    // lost cannot keep it alive. A release whose outcome is unknown is given up: the reaper
    // finishes it (an inner entry stays counted until the hold's last release). `last_lease` is
    // the hold's lease when these are its last entries (else unused).
    static std::error_code leave(const std::shared_ptr<state>& st, const hold_ref& ref,
                                 std::size_t entries, bool last,
                                 const tracked_lease<C>& last_lease) noexcept {
        // An error reply says nothing about ownership, except WRONGTYPE: the name now holds
        // another type, so our entries are gone.
        return leave_entries(
            *st, last_lease, last,
            [&] { return leave_once(*st, ref, entries, st->core->untimed_deadline()); },
            [](const reply& r) { return !r.is_error() || r.is_error_code("WRONGTYPE"); },
            [&] { not_finished(st, ref, entries, last, last_lease.valid_until); },
            [&](const reply& r) { return gone(st, ref, last, last_lease, r); });
    }

    // The entries `ref` names were gone, answered `r`: every entry of that acquisition is lost.
    static std::error_code gone(const std::shared_ptr<state>& st, const hold_ref& ref, bool last,
                                const tracked_lease<C>& last_lease, const reply& r) {
        bool notify = !ref.reported;
        auto acquired_at = last_lease.acquired_at;
        tracked_lease<C> ended;
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
        lease_tracker<state>{st}.end(ended);
        if (notify) {
            // Work watching lost_token() stops, as for a loss found any other way.
            std::stop_source source = last ? last_lease.lost_source : ended.lost_source;
            source.request_stop();
            detail::report_loss(*st, shared_lock_kind(ref.kind),
                                r.is_error() ? loss_reason::server_lost : loss_reason::taken,
                                acquired_at);
        }
        return errc::lock_lost;
    }

    // A release whose outcome is unknown: an inner entry makes the hold's count uncertain; the
    // last one is given up (retried in the background, dropped by the owner's next acquisition).
    static void not_finished(const std::shared_ptr<state>& st, const hold_ref& ref,
                             std::size_t entries, bool last,
                             steady::time_point valid_until) noexcept {
        if (last) {
            abandon(st, ref, entries, valid_until + st->options.lease);
            return;
        }
        std::lock_guard guard{st->mutex};
        if (hold* h = st->find(ref)) {
            ++h->uncertain;
        }
    }

    // Leaves every hold (the object is going away), but the parent's this process was forked
    // from: their entries are never left from a child.
    static void leave_all(const std::shared_ptr<state>& st) noexcept {
        std::vector<hold> taken;
        {
            std::lock_guard guard{st->mutex};
            taken = st->take_all();
        }
        for (hold& h : taken) {
            h.mark.uncount();
            if (h.depth == 0 || h.inherited_by_fork()) {
                continue;
            }
            typename state::left given = state::give_up(h);
            lease_tracker<state>{st}.end(given.ended);
            if (given.entries > 0) {  // none when the take-back left them
                (void)leave(st, given.ref, given.entries, true, given.ended);
            }
        }
    }
};

}  // namespace redislock::detail
