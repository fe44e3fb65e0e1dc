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

    // Remembers entries that may be in Redis though this object does not count them, for the
    // owner's next acquisition through this object to settle, and has the reaper leave them
    // until the server answers: `entries` of `ref` sent as release `release`, leaving them at
    // most once however often it is sent (the item is forgotten once a script answered it).
    // Without an id (none could be drawn) nothing is sent again, as it might leave entries
    // twice: they expire with their lease.
    static void abandon(const std::shared_ptr<state>& st, const hold_ref& ref, std::size_t entries,
                        steady::time_point lease_end, const token& release) noexcept {
        if (release == token{}) {
            return;
        }
        std::string item;
        try {
            item = unsettled_item(ref.acquisition, entries, release.view());
            std::lock_guard guard{st->mutex};
            st->remember_unsettled(item, false);
        } catch (...) {
            // Out of memory: the reaper still leaves them, or they expire with their lease.
        }
        detail::leave_to_reaper(
            st, ref, lease_end,
            [entries, release, item = std::move(item)](state& s, const hold_ref& r,
                                                       steady::time_point deadline) {
                if (!leave_once(s, r, entries, deadline, release).is_integer()) {
                    return false;
                }
                std::lock_guard guard{s.mutex};
                s.forget_settled({item});
                return true;
            });
    }

    // A release's id; none (all zero) when no random value could be drawn (a thread's first
    // draw builds its source, which may fail): that release is then sent without one.
    static token release_id() noexcept {
        try {
            return token::random();
        } catch (...) {
            return token{};
        }
    }

    // Gives up the first entry of the attempt `ref` names (its acquisition: the attempt's id),
    // made by this object, whose outcome is unknown or that could not stand: it may be in
    // Redis, or land there later, though no object holds it, and another object of the owner
    // may join it. Only that entry is left, once (the script takes the attempt's id out of
    // firsts: with it), never the whole acquisition: what others joined stays theirs. The
    // reaper sends it until answered; the object's next acquisitions name it until newer ones
    // push it out (it may land after any answer), and every object of the client names it in
    // its next first entry until the attempt's lease ends (see given_up_registry.hpp).
    static void abandon_attempt(const std::shared_ptr<state>& st, const hold_ref& ref,
                                steady::time_point lease_end) noexcept {
        try {
            st->core->given_up->remember(st->name, ref.owner, ref.acquisition, lease_end);
            std::lock_guard guard{st->mutex};
            st->remember_unsettled(ref.acquisition, true);
        } catch (...) {
            // Out of memory: the reaper still leaves it, or it expires with its lease.
        }
        detail::leave_to_reaper(st, ref, lease_end,
                                [](state& s, const hold_ref& r, steady::time_point deadline) {
                                    return leave_attempt_once(s, r, deadline).is_integer();
                                });
    }

    // Sends one release, named `release` (none: all zero) so that it leaves entries at most once
    // however often it is sent; one that lets waiters in tells them.
    static reply leave_once(const state& st, const hold_ref& ref, std::size_t entries,
                            steady::time_point deadline, const token& release) {
        const decimal count{static_cast<long long>(entries)};
        return detail::send_release(
            st, scripts::shared_release,
            std::array<std::string_view, 7>{
                ref.owner, shared_mode_text(ref.kind), count.view(), st.channel, ref.acquisition,
                st.grace_text.view(), release == token{} ? std::string_view{} : release.view()},
            deadline);
    }

    // Sends the release of the first entry of the given-up attempt `ref` names, which leaves it
    // only while it is counted (see ARGV[8] of shared_release.lua): at most once.
    static reply leave_attempt_once(const state& st, const hold_ref& ref,
                                    steady::time_point deadline) {
        return detail::send_release(
            st, scripts::shared_release,
            std::array<std::string_view, 8>{ref.owner, shared_mode_text(ref.kind), "1", st.channel,
                                            ref.acquisition, st.grace_text.view(), "", "1"},
            deadline);
    }

    // After the loss of the hold `ref` names by expiry, once told (or before the object's next
    // acquisition in that mode, whichever comes first): leaves, in the background, the entries
    // this object surely holds in it (its depth; an uncertain one may not be there, and leaving
    // it could take another object's entry). Renewals or a re-entry whose WAIT saw too few
    // replicas still extended the entry and the key on the master; with our entries gone the
    // entry goes, and the key keeps only the other holders' leases, another object of the
    // owner's included: that one keeps what it was told it has, and its own loss or release ends
    // it. Named by the acquisition id, it never touches a later acquisition; given up as a
    // release whose reply was lost is (see abandon()): it leaves entries once.
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
        abandon(st, ref, entries, steady::now() + st->options.lease, release_id());
    }

    // Leaves `entries` entries, already counted out locally, of the hold `ref` in Redis, as one
    // release with its own id. A release whose outcome is unknown is given up: the reaper sends
    // it again, and the owner's next acquisition through this object settles it, each leaving
    // its entries only if it had not landed. `last_lease` is the hold's lease when these are its
    // last entries (else unused).
    static std::error_code leave(const std::shared_ptr<state>& st, const hold_ref& ref,
                                 std::size_t entries, bool last,
                                 const tracked_lease<C>& last_lease) noexcept {
        // An error reply says nothing about ownership, except WRONGTYPE: the name now holds
        // another type, so our entries are gone.
        const token release = release_id();
        return leave_entries(
            *st, last_lease, last,
            [&] { return leave_once(*st, ref, entries, st->core->untimed_deadline(), release); },
            [](const reply& r) { return !r.is_error() || r.is_error_code("WRONGTYPE"); },
            [&] { not_finished(st, ref, entries, last, last_lease.valid_until, release); },
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

    // A release whose outcome is unknown is given up (sent again in the background, settled by
    // the owner's next acquisition through this object), until the lease of what it leaves
    // surely ended: the hold's, or for an inner release of a hold still counted, its current
    // one's.
    static void not_finished(const std::shared_ptr<state>& st, const hold_ref& ref,
                             std::size_t entries, bool last, steady::time_point valid_until,
                             const token& release) noexcept {
        if (!last) {
            std::lock_guard guard{st->mutex};
            const hold* h = st->find(ref);
            valid_until = h != nullptr ? h->lease.valid_until : steady::now();
        }
        abandon(st, ref, entries, valid_until + st->options.lease, release);
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
