// redislock::basic_mutex: the simple lock, one Redis string per name.
//
// Acquire: SET name token NX PX lease, with a fresh random 128-bit token per acquisition; the
// same command redis-py's Lock, node-redlock and redsync send, so they exclude each other on the
// same name. Release and extend are compare-and-act scripts: they act only while the key still
// holds our token. With lock_options::fencing, acquisition runs a script that also draws the
// fencing token from a counter beside the name ({name}:fence): never below the server clock
// in microseconds, and expiring a day after its last use.
//
// TimedLockable, so std::unique_lock, std::scoped_lock and std::lock work with it.
//
// Thread safety: one object may be shared by several threads, as a std::mutex is. The thread
// that locked it holds it (or, with lock_options::owner set, the object itself does); lock()
// from the holder throws std::system_error(resource_deadlock_would_occur); unlock() from
// another thread (a guard released there) does nothing, reports errc::not_holder through
// unlock(std::error_code&) and tells unlock_refused to the client's event hook.
// With lock_options::watchdog the client's watchdog renews the lease until unlock() (see
// watchdog.hpp); unlock() stops the renewals before it releases.
// Loss: told no later than the local conservative deadline (remaining() reaching zero) when no
// renewal was confirmed by then — through owned(), lost_token() and on_lost, once — whatever a
// round trip blocked on a stalled connection is doing. Once told, that acquisition is released
// in the background (by the client's reaper): renewals or an extend() that never counted (too
// few replicas acknowledged them, their answer was lost) may have kept the key past the deadline
// the holder was told of, and must not keep rivals out longer.
// Queries: is_locked() and holder_ttl() ask Redis about the name, whoever holds it (this object,
// another one, another process): snapshots, which may be stale by the time the caller looks, so
// they never decide whether to take the lock (try_lock() does that in one step). Any thread may
// call them at any time, concurrently with the object's other calls: they read one key, in one
// round trip routed as the lock's other calls are, and change nothing, locally or in Redis.
// Events: with a client event hook (client_options::on_event) a lock call that takes the lock
// reports acquired, each attempt that finds it held contended, unlock() released, and a loss
// lost with its reason (see events.hpp).
// Faults: an acquisition whose reply comes back after its lease ran out is released and counts
// as a failed attempt (told as late_grant; three attempts of a call in a row answered that late
// throw redislock::lease_error, see docs/guarantees.md); one abandoned mid-flight (deadline, stop
// request, broken connection) and a release that could not be finished are cleaned up by the
// client's reaper once the server answers. A wait with time left rides out connection errors and
// LOADING/READONLY; a Cluster slot being migrated (TRYAGAIN) is waited out by every lock call,
// try_lock() included, as a held lock is (see cluster.hpp). Lifetime: independent of the
// client's (the connection is shared).
// Movable, not copyable; a moved-from object behaves as a lock never held (queries answer "not
// held", lock calls throw redislock::invalid_argument). Destroying a held lock releases it.
// Exceptions: lock calls throw redislock::error subclasses on failures (never for contention),
// redislock::lease_error when their replies keep coming after the lease (docs/guarantees.md);
// unlock() never throws, not even out of memory.
#pragma once

#include <array>
#include <chrono>
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
#include <redislock/detail/blocking/lock_handle.hpp>
#include <redislock/detail/blocking/mutex_release.hpp>
#include <redislock/detail/blocking/timed_lockable.hpp>
#include <redislock/detail/blocking/token_extend.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/detail/kinds/holder_query.hpp>
#include <redislock/detail/kinds/lock_identity.hpp>
#include <redislock/detail/kinds/mutex_state.hpp>
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

/// The simple lock: one Redis string per name, taken with SET NX PX and a random token.
/// TimedLockable; see the top of this header for threads, loss and faults.
template <connection C>
class basic_mutex : public detail::timed_lockable<basic_mutex<C>>,
                    public detail::lock_handle<basic_mutex<C>, detail::mutex_state<C>> {
    using state = detail::mutex_state<C>;
    using handle = detail::lock_handle<basic_mutex, state>;

public:
    /// Usually made by client.mutex(name, options).
    /// @throws redislock::invalid_argument for an empty or oversized name, a lease out of
    ///         range, inconsistent backoff bounds or a max_hold below the lease.
    basic_mutex(basic_client<C>& client, std::string_view name, lock_options options = {})
        : handle{std::make_shared<state>(client.core_, name, std::move(options))} {
        detail::report_short_watchdog_lease(*state_, lock_kind::mutex);
    }

    using handle::unlock;

    /// Releases the lock and says how it went: no error; errc::not_held or errc::not_holder
    /// (misuse: nothing is sent); errc::lock_lost (it had expired or been taken, or its loss was
    /// already told: then also when the release still found it);
    /// errc::connection_failed (no answer within the command timeout) or errc::server_failed
    /// (the server answered with an error, whose text is in the message): the release is then
    /// finished in the background by the client's reaper. Takes at most the command timeout.
    void unlock(std::error_code& ec) noexcept {
        given_up released;
        ec = handle::claim([&](state& st) { released = give_up_locked(st); });
        if (!ec) {
            ec = release::leave(state_, std::move(released));
        }
    }

    /// Sets the lease to `lease` from now if the lock is still ours.
    /// Returns false (and calls on_lost) if the lock was lost; false at once if not held. A lease
    /// shorter than remaining() counts locally from when it is sent, even if the call then fails:
    /// it may have landed.
    /// @throws redislock::invalid_argument for a lease out of range;
    ///         redislock::connection_error; redislock::server_error when the server answers with
    ///         an error (the lock is not taken for lost). See https://redis.io/commands/pexpire/
    bool extend(std::chrono::milliseconds lease) {
        detail::check_lease(lease);
        std::optional<detail::token> token = held_token();
        if (!token) {
            return false;
        }
        return detail::extend_token(tracker(), *state_, detail::scripts::mutex_extend, *token,
                                    lease);
    }

    /// Local, conservative estimate of how long the lock stays ours: the lease counted from when
    /// the successful attempt (or the last confirmed renewal) was sent, on the steady clock,
    /// minus a drift allowance (1% of the lease + 2 ms). Zero when not held or known lost.
    std::chrono::milliseconds remaining() const { return handle::held_remaining(); }

    /// Local: true while this object holds the lock, it is not known lost, and remaining() > 0.
    bool owned() const { return remaining() > std::chrono::milliseconds::zero(); }

    /// A token whose stop is requested when the current acquisition is lost (at the latest when
    /// remaining() reaches zero without a confirmed renewal). Already stopped when not held.
    std::stop_token lost_token() const { return handle::held_lost_token(); }

    /// Asks Redis whether the key still holds our token, on a node that is still a master (ROLE:
    /// a demoted master may keep the key until it resyncs). A lock found lost calls on_lost.
    /// @throws redislock::connection_error; redislock::server_error when the server answers with
    ///         an error (the lock is not taken for lost). See https://redis.io/commands/get/
    bool verify() {
        std::optional<detail::token> token = held_token();
        if (!token) {
            return false;
        }
        const auto deadline = state_->core->untimed_deadline();
        const std::array<std::string_view, 2> get{"GET", state_->name};
        const reply r = detail::execute(*state_->conn, get, call_context{state_->name, deadline});
        const bool ours = r.is_string() && r.text() == token->view();
        if (ours && detail::serves_as_master(*state_->conn, state_->name, deadline)) {
            return true;
        }
        detail::throw_unless_not_ours(r, "verify", state_->name);
        // Another holder's token says taken; no key, another type or a demoted master says the
        // server lost it.
        tracker().lose(*token,
                       r.is_string() && !ours ? loss_reason::taken : loss_reason::server_lost);
        return false;
    }

    /// Asks Redis whether anyone holds the lock: this object, another object or process, or a
    /// waiter a release handed it to. A lock a release keeps free for a waiter told it may go is
    /// held by no one. A snapshot (see the top of this header). One round trip: a script that
    /// reads only (lua/mutex_query.lua).
    /// @throws redislock::invalid_argument on a moved-from object; redislock::connection_error;
    ///         redislock::server_error when the server answers with an error (WRONGTYPE: the key
    ///         holds something other than a simple lock).
    bool is_locked() const { return holder_ttl() != std::chrono::milliseconds::zero(); }

    /// Asks Redis how long the holder, whoever it is, keeps the lock: the key's time to live
    /// (PTTL), at least 1 ms while held; zero when no one holds it (as is_locked() tells);
    /// milliseconds::max() when another program set the key with no expiry. A snapshot in the
    /// server's time, with no allowance for clock drift or the round trip: it does not tell this
    /// object how long it may act as the holder (remaining() does). One round trip, as
    /// is_locked(); throws as it does.
    std::chrono::milliseconds holder_ttl() const {
        return detail::query_holder(state_.get(), detail::scripts::mutex_query,
                                    std::array<std::string_view, 0>{})
            .ttl;
    }

    /// The fencing token of the current acquisition (lock_options::fencing); 0 when fencing is
    /// off or the lock is not held. Strictly increases across acquisitions of the same name, also
    /// across FLUSHALL and restarts without persistence (see lua/mutex_acquire.lua).
    std::int64_t fencing_token() const { return handle::held_fence(); }

    /// @throws redislock::invalid_argument on a moved-from object.
    const std::string& name() const { return checked().name; }
    /// @throws redislock::invalid_argument on a moved-from object.
    const lock_options& options() const { return checked().options; }

private:
    friend class detail::timed_lockable<basic_mutex>;
    friend handle;
    using handle::checked;
    using handle::state_;
    using handle::tracker;
    using release = detail::mutex_release<C>;

    std::optional<detail::token> held_token() const {
        checked();
        std::lock_guard guard{state_->mutex};
        if (!state_->held) {
            return std::nullopt;
        }
        return state_->token;
    }

    bool acquire_until(detail::steady::time_point deadline, const std::stop_token& stop) {
        checked();
        {
            std::lock_guard guard{state_->mutex};
            if (state_->held && state_->caller_is_holder()) {
                throw std::system_error{
                    std::make_error_code(std::errc::resource_deadlock_would_occur),
                    "redislock: lock() of '" + state_->name + "' by its holder"};
            }
        }
        const lock_options& opts = state_->options;
        return detail::acquire_in_line(
            *state_,
            [this](const call_context& how, const detail::queue_place& place) {
                return attempt(how, place);
            },
            deadline, stop,
            // A fenced acquisition draws its token, and one that waits for replicas checks
            // WAIT, in its own round trip: neither can be handed over.
            detail::line_options{.simple = true,
                                 .handed = !opts.fencing && opts.min_replicas == 0,
                                 .kind = lock_kind::mutex});
    }

    // One acquisition attempt: std::nullopt when acquired, else how long to wait at most.
    // Uncontended it is a plain SET NX PX; a fenced attempt, and one that joins the waiting
    // queue, runs lua/mutex_acquire.lua.
    std::optional<detail::holder_ttl> attempt(call_context how, const detail::queue_place& place) {
        const detail::token token = detail::token::random();
        const auto sent = detail::steady::now();
        how.key = state_->name;
        const lock_options& opts = state_->options;
        std::int64_t fence = 0;
        std::int64_t replicas = -1;
        try {
            bool set = false;
            if (!opts.fencing && !place.join) {
                const std::array<std::string_view, 6> set_nx{
                    "SET", state_->name, token.view(), "NX", "PX", state_->lease_text.view()};
                auto [r, acks] = detail::execute_acknowledged(
                    *state_->conn, set_nx, how, opts.min_replicas, opts.replica_timeout);
                replicas = acks;
                if (r.is_error()) {
                    detail::throw_reply_error(r, "lock", state_->name);
                }
                if (r.is_nil() && place.waits) {
                    return detail::holder_ttl{-1};  // the next attempt joins the queue
                }
                set = !r.is_nil();
            }
            // A try that found the key taken asks the script too: it says WRONGTYPE when the
            // key is not a lock, and takes the lock if it was freed meanwhile.
            if (!set) {
                auto [r, acks] = state_->with_acquisition_keys(opts.fencing, [&](const auto& keys) {
                    return detail::run_script_acknowledged(
                        *state_->conn, detail::scripts::mutex_acquire, keys,
                        std::array{token.view(), state_->lease_text.view(),
                                   std::string_view{opts.fencing ? "1" : "0"}, place.waiter,
                                   place.keep(), std::string_view{state_->channel},
                                   state_->grace_text.view()},
                        how, opts.min_replicas, opts.replica_timeout, &state_->core->events);
                });
                replicas = acks;
                if (r.is_error()) {
                    detail::throw_reply_error(r, "lock", state_->name);
                }
                if (!r.is_array() || r.elements().size() != 2) {
                    throw server_error{"redislock: unexpected reply to an acquisition"};
                }
                if (r.elements()[0].as_integer() == 0) {
                    return detail::saturated_ttl(r.elements()[1].as_integer());
                }
                fence = r.elements()[1].as_integer();
            }
        } catch (const connection_error&) {
            abandon(token, sent);  // the SET may have landed before the connection failed
            throw;
        } catch (const cancelled_error&) {
            abandon(token, sent);
            throw;
        }
        if (auto refused =
                detail::refuse_grant(*state_, sent, replicas, [&] { abandon(token, sent); })) {
            return refused;
        }
        on_acquired(token, {.sent = sent, .fence = fence, .wait = place.tally});
        return std::nullopt;
    }

    void on_acquired(const detail::token& token, const typename state::grant& g) {
        bool previous_live = false;
        detail::tracked_lease<C> previous_lease;
        {
            std::lock_guard guard{state_->mutex};
            previous_lease = state_->take(token, g, previous_live);
        }
        tracker().replaced(previous_lease, previous_live);
        tracker().begin(
            token, g.sent, lock_kind::mutex, g.wait,
            [&] {
                return detail::renewal_spec{&detail::scripts::mutex_extend,
                                            {state_->name},
                                            {token.str(), std::string{state_->lease_text.view()}}};
            },
            [this] { handle::unlock(); });
    }

    using given_up = typename state::given_up;

    static given_up give_up_locked(state& st) noexcept { return st.give_up(); }

    // An attempt whose outcome is unknown, or known too late: its key, if it landed, is ours to
    // delete, in the background.
    void abandon(const detail::token& token, detail::steady::time_point sent) noexcept {
        release::hand_to_reaper(state_, token, sent + state_->options.lease);
    }

    static void release_on_destruction(const std::shared_ptr<state>& st) noexcept {
        handle::release_held(st, &give_up_locked, &release::leave);
    }
};

}  // namespace redislock
