// The waiting every lock kind shares: notified, fair and cheap.
//
//   - Threads of one process that wait for one name line up in its local gate
//     (waiting/local_gate.hpp); only the first waits in Redis.
//   - In Redis, a waiter joins the lock's queue (lua/_queue.lua) with the attempt that fails, and
//     sleeps until a release names it (engine/notifier.hpp), with the holder's PTTL as the bound
//     should the message be lost; then it tries again. Releases only publish when someone waits.
//   - A waiter that gives up (deadline, stop request, failure) leaves the queue in the background,
//     telling the next waiters if it stood before them; if it cannot, its entry lapses by itself.
//   - Without notifications (a connection that cannot subscribe, a server without sharded
//     pub/sub, a lost subscriber link) a waiter polls with backoff instead, still in line.
//   - Each attempt is counted, and one that finds the lock held is told to the client's event
//     hook (contended) on the waiting thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

#include <redislock/connection.hpp>
#include <redislock/detail/blocking/acquisition_loop.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/detail/engine/reaper.hpp>
#include <redislock/detail/kinds/lock_identity.hpp>
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/detail/topology/failover_fence.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

/// How one attempt stands towards the queue: the waiter id of its lock() call ('r...' for a
/// reader, 'w...' otherwise) and whether it joins the queue when it does not acquire.
struct queue_place {
    std::string_view waiter;
    bool join = false;
    bool waits = false;  // the call waits if this attempt fails (else it is a try_lock)
    /// The call's wait so far, attempts counted: an attempt that acquires reports it (acquired
    /// event) before its lease can be reported lost.
    const wait_tally* tally = nullptr;
    /// Set by an attempt whose entry the server counted, before the lock records it: should the
    /// recording throw (and give the entry back itself), the call's leaving the queue must not
    /// take back an entry handed to it too.
    bool* counted = nullptr;

    /// How long a queue entry outlives the wait its reply asks for.
    static constexpr std::chrono::milliseconds kept{2000};

    /// The script argument saying how long a queue entry outlives the wait its reply asks for
    /// ('0': do not join).
    std::string_view keep() const {
        static const std::string kept_text = std::to_string(kept.count());
        return join ? std::string_view{kept_text} : "0";
    }
};

/// Takes waiter `waiter` out of `lk`'s queue (see lua/queue_leave.lua, whose ARGV[4] `kind` is):
/// at once if the server answers within a few milliseconds, so a process that exits right after
/// giving up leaves nothing handed to it; else in the background, for at least 2 s and until
/// `lapses_by`, when its entry lapses by itself (until then a release may still hand the lock to
/// it). A semaphore's waiter (kind 's') also names its count of permits, `count_key`, and the
/// count to assume when none is stored.
template <connection C>
void leave_queue(const lock_identity<C>& lk, const std::string& waiter, std::string_view kind,
                 steady::time_point lapses_by, std::string_view count_key = {},
                 std::string_view assumed_count = {}) noexcept {
    try {
        // Made inside the try: its copies allocate, and this runs from a destructor.
        const auto leave = [core = lk.core, key = lk.name, queue = lk.queue_key,
                            lapses = lk.lapse_key, channel = lk.channel, waiter,
                            grace = std::string{lk.grace_text.view()}, kind,
                            count = std::string{count_key},
                            assumed = std::string{assumed_count}](steady::time_point deadline) {
            try {
                const call_context how{key, deadline};
                const reply r =
                    count.empty()
                        ? detail::run_script(
                              core->connection, scripts::queue_leave,
                              std::array<std::string_view, 3>{key, queue, lapses},
                              std::array<std::string_view, 4>{waiter, channel, grace, kind}, how,
                              &core->events)
                        : detail::run_script(
                              core->connection, scripts::queue_leave,
                              std::array<std::string_view, 4>{key, queue, lapses, count},
                              std::array<std::string_view, 5>{waiter, channel, grace, kind,
                                                              assumed},
                              how, &core->events);
                return !r.is_error() || r.is_error_code("WRONGTYPE");
            } catch (...) {
                return false;
            }
        };
        if (!leave(steady::now() + std::chrono::milliseconds{10})) {
            background_reaper().add(server_lane(lk.core->connection, lk.name, lk.core.get()), leave,
                                    std::max(steady::now() + std::chrono::seconds{2}, lapses_by));
        }
    } catch (...) {
        // Out of memory: the entry lapses by itself.
    }
}

/// How a lock kind waits in line.
struct line_options {
    bool reader = false;   // a shared acquisition
    bool reentry = false;  // the caller may hold already, here or through another object of the
                           // same owner: its first attempt skips the gate, since its own release
                           // is what the threads in the gate wait for
    bool simple = false;   // a simple lock (see queue_leave.lua)
    // A semaphore's count of permits, and the count its object assumes while none is stored:
    // a semaphore's waiter that leaves tells those that may take the free permits.
    std::string_view count_key = {};
    std::string_view assumed_count = {};
    // The lock may be handed to this waiter: kept for it under a token of its own, for a simple
    // lock (see queue_hand_on), or, with `owner` set, as an entry of that owner, for a reentrant
    // lock (see queue_hand_on_entry), until its next attempt takes it; the owner then holds
    // neither '@' nor ' '.
    bool handed = false;
    std::string_view owner = {};
    lock_kind kind = lock_kind::none;  // what contended events say it is
};

/// Runs `attempt(how, place)` until it acquires, the deadline passes or a stop is requested,
/// waiting in line between attempts. `attempt` returns std::nullopt when it acquired, else how
/// long to wait at most before trying again (the holder's PTTL; negative: unknown); a grant it
/// gave back because its reply came too late (late_grant) is told and counts as a failed
/// attempt. A release that names this waiter wakes it for its next attempt at once; with
/// line_options::handed that attempt takes the lock kept for it. It is never taken without that
/// round trip: a lock handed to a waiter that does not come must be free again within the grace,
/// whatever its lease. Failures are handled as acquire_until() does, a slot being migrated
/// included; attempts answered after their lease ran out, three in a row, throw lease_error (see
/// late_replies).
template <connection C, class Attempt>
bool acquire_in_line(const lock_identity<C>& lk, Attempt&& attempt, steady::time_point deadline,
                     const std::stop_token& stop, const line_options& line) {
    waiting_room& room = lk.core->waiting.get();
    const bool may_wait = deadline > steady::now();
    // Built when first needed: an uncontended call pays for none of it.
    std::string waiter;
    const auto waiter_id = [&]() -> const std::string& {
        if (waiter.empty()) {
            if (line.handed) {
                waiter = (line.owner.empty() ? "g" : "h") + token::random().str() + "." +
                         std::string{lk.lease_text.view()};
                if (!line.owner.empty()) {
                    waiter.append(".").append(line.owner);
                }
            } else {
                waiter = (line.reader ? "r" : "w") + token::random().str();
            }
            if (room.notify.available()) {
                waiter.append(room.notify.id_suffix());  // told on this client's channel
            }
        }
        return waiter;
    };
    std::string listen;  // the channel this call is told on, once it enrolled
    const std::string_view trying = line.reader ? "r" : "w";  // a try that does not join
    steady::time_point lapses_by{};  // when the queue entry lapses at the latest, as last told
    holder_ttl longest_wait{0};      // the longest wait a joining attempt was told
    std::optional<local_gates::place> place;
    std::shared_ptr<wake_slot> slot;
    bool joined = false;
    bool acquired = false;
    bool counted = false;  // see queue_place::counted
    struct cleanup {
        const lock_identity<C>& lk;
        waiting_room& room;
        const std::string& listen;
        const std::string& waiter;
        std::shared_ptr<wake_slot>& slot;
        bool& joined;
        bool& acquired;
        bool& counted;
        const steady::time_point& lapses_by;
        const line_options& line;
        ~cleanup() {
            if (slot) {
                room.notify.withdraw(listen, waiter);
            }
            if (joined && !acquired) {
                leave_queue(lk, waiter,
                            !line.count_key.empty() ? "s"
                            : line.simple           ? "m"
                            : counted               ? "k"
                                                    : "",
                            lapses_by, line.count_key, line.assumed_count);
            }
        }
    } on_exit{lk, room, listen, waiter, slot, joined, acquired, counted, lapses_by, line};

    const local_gates::view gate = room.gates.look(lk.name);
    // Whether the last attempt got a definite "not acquired": until then a possible re-entry
    // keeps skipping the gate.
    bool refused = false;
    const auto grace = handoff_grace(lk.options.lease);
    const event_sink& events = lk.core->events;
    wait_tally tally;  // the call's attempts, and its start when observed
    if (events.observed()) {
        tally.started = steady::now();
    }
    backoff policy{lk.options};
    late_replies late;
    std::exception_ptr unacknowledged;
    for (bool first = true;; first = false) {
        // Only the thread at the head of its process's gate joins the queue in Redis: one that
        // joined and then waited in the gate could be told its turn while it cannot come. An
        // attempt that does not join needs no place: the first one when the name was not
        // contended lately, and, while the server has not said the owner holds nothing, a
        // possible re-entry (its own release is what the threads in the gate wait for).
        bool probe = true;
        if (may_wait && !place) {
            probe = first ? (gate.idle ? !gate.contended : line.reentry) : line.reentry && !refused;
        } else if (may_wait) {
            probe = false;
        }
        if (!probe && !place) {
            place.emplace(room.gates, lk.name);
            if (!place->wait_turn(deadline, stop)) {
                return false;
            }
        }
        const bool join = !probe;
        if (join && (!slot || !slot->subscribed()) && room.notify.available()) {
            if (!slot) {
                listen = room.notify.listen_channel(lk.channel);
                slot = std::make_shared<wake_slot>(grace);
            }
            const auto budget = steady::now() + command_budget(lk.core->connection);
            (void)room.notify.enroll(listen, lk.name, waiter_id(), slot, std::min(deadline, budget),
                                     stop);
        }
        if (slot) {
            slot->reset();
        }
        // A call's first try, made before it waited at all, is made even when its deadline has
        // already passed (try_lock(), a zero timeout), as try_lock() makes it; any later one only
        // while the deadline has not passed, and bounded by it.
        const bool immediate = first && probe && !attempt_due(deadline);
        if (!immediate && !attempt_due(deadline)) {
            // Time is up before another attempt: one refused for too few replicas says why the
            // lock was not had, as another attempt would have said again.
            if (unacknowledged) {
                std::rethrow_exception(unacknowledged);
            }
            return false;
        }
        std::optional<holder_ttl> ttl;
        try {
            joined = joined || join;
            refused = false;
            counted = false;
            ++tally.attempts;
            const auto sent = steady::now();
            bool given_back_late = false;
            try {
                ttl = attempt(attempt_context(deadline, stop, immediate),
                              queue_place{join ? std::string_view{waiter_id()} : trying, join,
                                          may_wait, &tally, &counted});
            } catch (const late_grant& given_back) {
                events.emit([&] {
                    lock_event e;
                    e.type = event_type::late_grant;
                    e.kind = line.kind;
                    e.name = lk.name;
                    e.attempts = tally.attempts;
                    e.round_trip = std::chrono::duration_cast<std::chrono::microseconds>(
                        given_back.round_trip);
                    e.detail =
                        "granted, but the reply came after the lease had run out: given back";
                    return e;
                });
                given_back_late = true;
                ttl = holder_ttl::zero();  // a failed attempt: the lock may be free again at once
            }
            if (ttl && late.note(sent, steady::now(), lk.options.lease)) {
                late.fail(lk.name, lk.options.lease);
            }
            refused = ttl.has_value();
            if (ttl) {
                ttl = saturated_ttl(ttl->count());  // whatever the attempt read it from
            }
            if (join && ttl) {
                longest_wait = std::max(longest_wait, *ttl);
                lapses_by =
                    std::max(lapses_by, later_by(steady::now(), std::max(*ttl, holder_ttl::zero()) +
                                                                    queue_place::kept));
            }
            if (!ttl) {
                acquired = true;
                if (join) {
                    room.gates.note_contention(lk.name, true);
                }
                return true;
            }
            if (!join && may_wait) {
                // A plain try, followed at once by one that joins: the two count as one attempt.
                --tally.attempts;
                continue;
            }
            if (!given_back_late) {  // that one was told as late_grant
                events.emit([&] {
                    lock_event e;
                    e.type = event_type::contended;
                    e.kind = line.kind;
                    e.name = lk.name;
                    e.attempts = tally.attempts;
                    e.holder_ttl = *ttl;
                    return e;
                });
            }
        } catch (const cancelled_error&) {
            return false;
        } catch (const error& e) {
            if (dynamic_cast<const replication_error*>(&e) != nullptr) {
                unacknowledged = std::current_exception();
            }
            const bool endless = deadline == steady::time_point::max() && !stop.stop_possible();
            // A slot being migrated: the attempt did not run. Not acquired, as if held with no
            // known lease, until the slot settles or the deadline passes, whatever the call.
            const bool migrating = is_slot_migrating(e);
            if (!migrating && (endless || !is_transient(e) || steady::now() >= deadline ||
                               stop.stop_requested())) {
                if (unacknowledged && dynamic_cast<const connection_error*>(&e) != nullptr) {
                    std::rethrow_exception(unacknowledged);
                }
                throw;
            }
            if (join && !migrating) {
                // The attempt may have joined (or kept its place) with a wait not told: the
                // holder's lease left, assumed no longer than the longest known or this lock's.
                const auto assumed = std::max(longest_wait, holder_ttl{lk.options.lease});
                lapses_by =
                    std::max(lapses_by, later_by(steady::now(), assumed + queue_place::kept));
            }
            ttl = holder_ttl{-1};
        }
        const auto now = steady::now();
        if (now >= deadline || stop.stop_requested()) {
            return false;
        }
        if (!join && refused) {
            continue;  // a try the server refused: join with the next attempt, at once
        }
        steady::time_point until;
        if (slot && slot->subscribed() && *ttl >= holder_ttl::zero()) {
            until = later_by(now, *ttl + std::chrono::milliseconds{1});
        } else {
            // Polling: often enough not to miss the grace of a turn given to this waiter.
            until = later_by(now, std::min<steady::duration>(policy.next(*ttl), grace / 2));
        }
        until = std::min(until, deadline);
        const bool woken =
            slot ? room.notify.wait(*slot, until, stop) : sleep_unless_stopped(until - now, stop);
        if (!woken && stop.stop_requested()) {
            return false;
        }
    }
}

}  // namespace redislock::detail
