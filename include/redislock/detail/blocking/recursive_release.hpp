// detail::recursive_release: how a reentrant lock object (basic_recursive_mutex) leaves its
// entries in Redis: the release script's round trip, what its answer means (entries gone: the
// acquisition is lost), and a release or an abandoned acquisition that could not be finished,
// remembered as given up and handed to the client's reaper. Static functions on the object's
// recursive_state, which the reaper keeps alive while it retries; each takes the state's mutex
// only between round trips.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <redislock/connection.hpp>
#include <redislock/detail/blocking/end_release.hpp>
#include <redislock/detail/blocking/entry_release.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/kinds/recursive_state.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

template <connection C>
struct recursive_release {
    using state = recursive_state<C>;
    using held = recursive_entry;

    // Gives up the first entry of `attempt`, made by this object, whose outcome is unknown or
    // that could not stand: it may be in Redis, or land there later, though no object holds it,
    // and another object of the owner may join it. Only that entry is left, once (the script
    // takes the attempt's id out of firsts:<owner> with it), never the whole acquisition: what
    // others joined stays theirs. The reaper sends it until answered; the owner's next first
    // entries through this object, and through any object of the client until `lease_end` (see
    // given_up_registry.hpp), name it too.
    static void abandon(const std::shared_ptr<state>& st, const std::string& owner,
                        const std::string& attempt, steady::time_point lease_end) noexcept {
        try {
            st->core->given_up->remember(st->name, owner, attempt, lease_end);
            std::lock_guard guard{st->mutex};
            st->remember_given_up(attempt);
        } catch (...) {
            // Out of memory: the reaper still leaves it, or it expires with its lease.
        }
        detail::leave_to_reaper(st, held{owner, 0, attempt}, lease_end,
                                [](state& s, const held& e, steady::time_point deadline) {
                                    return leave_attempt_once(s, e, deadline).is_integer();
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

    static std::string_view id_text(const token& release) noexcept {
        return release == token{} ? std::string_view{} : release.view();
    }

    // Sends one release of `entries` entries of `entry`, ending by `deadline`; a release that
    // frees the lock tells the next waiter, if any. `release` names it (or is empty), so that
    // it leaves entries at most once however often it is sent (see recursive_release.lua).
    static reply leave_once(const state& st, std::string_view lease_text, const held& entry,
                            std::size_t entries, steady::time_point deadline,
                            std::string_view release) {
        const decimal count{static_cast<long long>(entries)};
        return detail::send_release(
            st, scripts::recursive_release,
            std::array<std::string_view, 7>{entry.owner, count.view(), lease_text, st.channel,
                                            entry.acquisition, st.grace_text.view(), release},
            deadline);
    }

    // Sends the release of the first entry of the given-up attempt `entry` names (its
    // acquisition: the attempt's id), which leaves it only while it is counted (see ARGV[8] of
    // recursive_release.lua): at most once. Lease "0": it never extends what remains.
    static reply leave_attempt_once(const state& st, const held& entry,
                                    steady::time_point deadline) {
        return detail::send_release(
            st, scripts::recursive_release,
            std::array<std::string_view, 8>{entry.owner, "1", "0", st.channel, entry.acquisition,
                                            st.grace_text.view(), "", "1"},
            deadline);
    }

    // Retries leaving `entries` entries of `entry` until the server answers or the lease surely
    // ended, as release `release`: if an earlier send of it landed, leaving them again would
    // take entries another object of the owner joined (so one without an id, when none could be
    // drawn, is not sent again: its entries expire with the key).
    static void hand_to_reaper(const std::shared_ptr<state>& st, const held& entry,
                               std::size_t entries, steady::time_point lease_end,
                               const token& release) noexcept {
        if (release == token{}) {
            return;  // no id could be drawn: sent again, it might leave entries twice
        }
        detail::leave_to_reaper(
            st, entry, lease_end,
            [entries, release](state& s, const held& e, steady::time_point deadline) {
                // Lease "0": a background release never extends what remains.
                if (!leave_once(s, "0", e, entries, deadline, id_text(release)).is_integer()) {
                    return false;
                }
                settled(s, release);
                return true;
            });
    }

    // The release named `release` was answered: the object's next lock() need not send it.
    static void settled(state& s, const token& release) noexcept {
        std::lock_guard guard{s.mutex};
        if (s.unsettled && s.unsettled->release == release) {
            s.unsettled.reset();
        }
    }

    // Sends the object's last release whose reply was lost, if any, again now, by `deadline`:
    // the next lock() then starts from what Redis really holds. Throws as a round trip does;
    // an error reply leaves it to the reaper.
    static void settle(const std::shared_ptr<state>& st, steady::time_point deadline) {
        std::optional<recursive_unsettled> pending;
        {
            std::lock_guard guard{st->mutex};
            pending = st->unsettled;
        }
        if (pending && leave_once(*st, "0", pending->entry, pending->entries, deadline,
                                  id_text(pending->release))
                           .is_integer()) {
            settled(*st, pending->release);
        }
    }

    // After the loss of acquisition `epoch` by expiry, once told (or before the object's next
    // lock(), whichever comes first): leaves, in the background, the entries this object counts
    // (its depth; an uncertain one may not be there, and leaving it could take another
    // object's entry), with lease "0" so that what remains keeps its TTL. Renewals
    // or a re-entry whose WAIT saw too few replicas still extended the hash on the master; with
    // our entries gone it is deleted, unless another object of the owner still holds entries
    // there: that one keeps what it was told it has, and its own loss or release ends it. Named
    // by the acquisition id, it never touches a later acquisition; sent as one release until
    // answered (it leaves entries once).
    static void take_back(const std::shared_ptr<state>& st, std::uint64_t epoch) noexcept {
        held entry;
        std::size_t entries = 0;
        {
            std::lock_guard guard{st->mutex};
            if (st->epoch != epoch || st->depth == 0 || !st->lease.lost || st->taken_back) {
                return;  // left by unlock(), or a later acquisition
            }
            try {
                entry = st->current();
            } catch (...) {
                return;  // Out of memory: the entries expire with what the renewals gave them.
            }
            entries = st->depth;  // the uncertain ones may not be there: they expire with the key
            st->uncertain = 0;
            st->taken_back = true;
        }
        hand_to_reaper(st, entry, entries, steady::now() + st->options.lease, release_id());
    }

    // Leaves `entries` entries of `entry` in Redis; the caller has already counted them out.
    // `ended` is the acquisition's lease when these are its last entries (else unused).
    static std::error_code leave(const std::shared_ptr<state>& st, held entry, std::size_t entries,
                                 bool last, const tracked_lease<C>& ended) noexcept {
        const token release = release_id();
        return leave_entries(
            *st, ended, last,
            [&] {
                return leave_once(*st, st->lease_text.view(), entry, entries,
                                  st->core->untimed_deadline(), id_text(release));
            },
            [](const reply& r) { return r.is_integer(); },
            [&] { not_finished(st, entry, entries, last, ended.valid_until, release); },
            [&](const reply&) {
                // The entries were gone: every entry of that acquisition is lost.
                if (!last) {
                    lease_tracker<state>{st}.lose(entry.epoch, loss_reason::taken);
                    std::lock_guard guard{st->mutex};
                    if (st->epoch == entry.epoch && st->depth > 0) {
                        st->depth = 0;
                        st->mark.uncount();
                    }
                    return std::error_code{errc::lock_lost};
                }
                return detail::end_release(*st, ended, release_end::lost);
            });
    }

    // A release whose outcome is unknown is sent again in the background, as the same release
    // (it leaves entries once), until the lease of what it leaves surely ended: the
    // acquisition's, or for an inner release of one still held, its current one's. A last one is
    // sent by the object's next lock() too, before its attempt (see recursive_state::unsettled).
    static void not_finished(const std::shared_ptr<state>& st, const held& entry,
                             std::size_t entries, bool last, steady::time_point valid_until,
                             const token& release) noexcept {
        {
            std::lock_guard guard{st->mutex};
            if (!last) {
                valid_until = st->epoch == entry.epoch && st->depth > 0 ? st->lease.valid_until
                                                                        : steady::now();
            } else if (release != token{}) {
                try {
                    st->unsettled = recursive_unsettled{entry, entries, release};
                } catch (...) {
                    // Out of memory: the reaper alone sends it again.
                }
            }
        }
        hand_to_reaper(st, entry, entries, valid_until + st->options.lease, release);
    }

    // Leaves every entry (the object is going away), but the parent's this process was forked
    // from: their entries are never left from a child.
    static void leave_all(const std::shared_ptr<state>& st) noexcept {
        typename state::left out;
        {
            std::lock_guard guard{st->mutex};
            if (st->depth > 0 && st->inherited_by_fork()) {
                return;
            }
            out = st->give_up_all();
        }
        lease_tracker<state>{st}.end(out.ended);
        if (out.entries > 0) {
            (void)leave(st, std::move(out.entry), out.entries, true, out.ended);
        }
    }
};

}  // namespace redislock::detail
