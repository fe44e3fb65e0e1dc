// redislock::basic_counting_semaphore: a semaphore whose permits are leases. At most N objects,
// in any processes, hold a permit of a name at once; a holder that dies gives its permit back
// when its lease ends.
//
//   auto jobs = client.semaphore("exports", {.permits = 4, .lease = 20s, .watchdog = true});
//   redislock::permit_guard permit{jobs};  // acquire() ... release()
//
// Shaped like std::counting_semaphore, with one difference that leases make necessary: each
// object holds at most one permit, and release(), remaining(), lost_token() and
// fencing_token() refer to it; k permits are k objects. The object, not a thread, holds it:
// any thread may release it. acquire() on an object that holds its permit, or while another
// thread's acquire call on it is under way, throws
// std::system_error(resource_deadlock_would_occur).
//
// In Redis (lua/semaphore_acquire.lua): a sorted set of the holders' permit ids, scored by when
// each lease ends, and the count of permits beside it (`{name}:permits`, kept without expiry:
// the one key a semaphore leaves behind, with its fencing counter). The count is written from
// semaphore_options::permits by the first acquisition that finds none; set_permits() changes it
// for everyone, and lowering it revokes no permit, it only stops grants until enough are given
// back. Waiting is fair and notified, as for the locks (arrival order,
// waiting/acquire_in_line.hpp): a release tells as many waiters as permits are free. Topologies:
// one node, Sentinel and Cluster (every key of a name in one hash slot), through any client; not
// Redlock.
//
// Thread safety: one object may be shared by several threads. Loss, the watchdog, faults and
// events are as basic_mutex's (mutex.hpp), with lock_kind::semaphore; an object that finds a
// count in Redis other than its options' is told permits_differ (once per object).
// Lifetime: independent of the client's. Movable, not copyable; a moved-from object holds no
// permit and its calls throw redislock::invalid_argument. Destroying a holding object gives its
// permit back. Exceptions: acquire calls throw redislock::error subclasses on failures (never
// because no permit is free); release() never throws.
#pragma once

#include <algorithm>
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
#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/detail/kinds/semaphore_state.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/acquire_in_line.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>
#include <redislock/semaphore_options.hpp>

namespace redislock {

template <connection C>
class basic_client;

/// A counting semaphore of leased permits; see the top of this header. Also TimedLockable
/// (lock() is acquire(), unlock() is release()), so std::unique_lock can hold a permit too.
template <connection C>
class basic_counting_semaphore
    : public detail::timed_lockable<basic_counting_semaphore<C>>,
      public detail::lock_handle<basic_counting_semaphore<C>, detail::semaphore_state<C>> {
    using state = detail::semaphore_state<C>;
    using handle = detail::lock_handle<basic_counting_semaphore, state>;
    using lockable = detail::timed_lockable<basic_counting_semaphore>;

public:
    /// Usually made by client.semaphore(name, options).
    /// @throws redislock::invalid_argument for an empty or oversized name, fewer than 1 permit, a
    ///         lease out of range or inconsistent backoff bounds.
    basic_counting_semaphore(basic_client<C>& client, std::string_view name,
                             semaphore_options options = {})
        : handle{std::make_shared<state>(client.core_, name, options)} {
        detail::report_short_watchdog_lease(*state_, lock_kind::semaphore);
    }

    /// Blocks until this object holds a permit.
    void acquire() { lockable::lock(); }
    /// Blocks until this object holds a permit or `stop` is requested (false then).
    [[nodiscard]] bool acquire(std::stop_token stop) { return lockable::lock(std::move(stop)); }
    /// Tries once.
    [[nodiscard]] bool try_acquire() { return lockable::try_lock(); }
    /// Tries until `timeout` has passed (at least once) or `stop` is requested.
    template <class Rep, class Period>
    [[nodiscard]] bool try_acquire_for(const std::chrono::duration<Rep, Period>& timeout,
                                       std::stop_token stop = {}) {
        return lockable::try_lock_for(timeout, std::move(stop));
    }
    /// Tries until `deadline` (at least once) or `stop` is requested.
    template <class Clock, class Duration>
    [[nodiscard]] bool try_acquire_until(const std::chrono::time_point<Clock, Duration>& deadline,
                                         std::stop_token stop = {}) {
        return lockable::try_lock_until(deadline, std::move(stop));
    }

    /// Gives the permit back; never throws. Nothing is sent when none is held.
    void release() noexcept { handle::unlock(); }

    /// Gives the permit back and says how it went, as basic_mutex::unlock(std::error_code&)
    /// does: errc::not_held (nothing sent), errc::lock_lost, errc::connection_failed or
    /// errc::server_failed (then finished in the background by the client's reaper).
    void release(std::error_code& ec) noexcept { unlock(ec); }

    using handle::unlock;

    /// release(ec), for the TimedLockable shape.
    void unlock(std::error_code& ec) noexcept {
        given_up released;
        ec = handle::claim([&](state& st) { released = st.give_up(); });
        if (!ec) {
            ec = giving_back::leave(state_, std::move(released));
        }
    }

    /// Sets the permit's lease to `lease` from now if it is still ours; false (and on_lost)
    /// when it was lost, false at once when none is held.
    /// @throws redislock::invalid_argument for a lease out of range;
    ///         redislock::connection_error; redislock::server_error.
    bool extend(std::chrono::milliseconds lease) {
        detail::check_lease(lease);
        std::optional<detail::token> token = held_token();
        if (!token) {
            return false;
        }
        return detail::extend_token(tracker(), *state_, detail::scripts::semaphore_extend, *token,
                                    lease);
    }

    /// The id of the permit held now (its member in the holders' sorted set, as
    /// redislock-inspect lists it); empty when none is held.
    /// @throws redislock::invalid_argument on a moved-from object.
    std::string permit_id() const {
        std::optional<detail::token> token = held_token();
        return token ? token->str() : std::string{};
    }

    /// Local, conservative estimate of how long the permit stays ours (as
    /// basic_mutex::remaining()); zero when none is held or it is known lost.
    std::chrono::milliseconds remaining() const { return handle::held_remaining(); }

    /// Local: true while this object holds a permit not known lost, with remaining() > 0.
    bool owned() const { return remaining() > std::chrono::milliseconds::zero(); }

    /// Stopped when the permit held now is lost; already stopped when none is held.
    std::stop_token lost_token() const { return handle::held_lost_token(); }

    /// The fencing token of the permit held now (semaphore_options::fencing); 0 when fencing is
    /// off or none is held. Strictly increases across the permits granted for the name.
    std::int64_t fencing_token() const { return handle::held_fence(); }

    /// Asks Redis whether the permit this object holds is still live there, on a node that is
    /// still a master (ROLE). A permit found lost calls on_lost. False at once when none is
    /// held. @throws redislock::connection_error; redislock::server_error (the permit is not
    /// taken for lost).
    bool verify() {
        std::optional<detail::token> token = held_token();
        if (!token) {
            return false;
        }
        const auto deadline = state_->core->untimed_deadline();
        const reply r = detail::run_script(
            *state_->conn, detail::scripts::semaphore_query,
            std::array<std::string_view, 2>{state_->name, state_->permits_key},
            std::array{token->view()}, call_context{{}, deadline}, &state_->core->events);
        if (r.is_error()) {
            detail::throw_reply_error(r, "verify", state_->name);
        }
        if (!r.is_array() || r.elements().size() != 3 || !r.elements()[2].is_integer()) {
            throw server_error{"redislock: unexpected reply to a semaphore query"};
        }
        if (r.elements()[2].as_integer() == 1 &&
            detail::serves_as_master(*state_->conn, state_->name, deadline)) {
            return true;
        }
        // Gone from the holders (its lease ended there, or it was freed by hand) or held on a
        // demoted master: the server cannot vouch for it.
        tracker().lose(*token, loss_reason::server_lost);
        return false;
    }

    /// Asks Redis how many permits are free now: the count (this object's
    /// semaphore_options::permits while none is stored) less the live holders, never below 0.
    /// A snapshot, which may be stale by the time the caller looks; one round trip that changes
    /// nothing. @throws redislock::invalid_argument on a moved-from object;
    /// redislock::connection_error; redislock::server_error (WRONGTYPE: not a semaphore).
    std::int64_t available_permits() const {
        const state& st = checked();
        const reply r =
            detail::run_script(*st.conn, detail::scripts::semaphore_query,
                               std::array<std::string_view, 2>{st.name, st.permits_key},
                               std::array<std::string_view, 0>{},
                               call_context{{}, st.core->untimed_deadline()}, &st.core->events);
        if (r.is_error()) {
            detail::throw_reply_error(r, "query", st.name);
        }
        if (!r.is_array() || r.elements().size() != 3 || !r.elements()[0].is_integer() ||
            !r.elements()[1].is_integer()) {
            throw server_error{"redislock: unexpected reply to a semaphore query"};
        }
        const std::int64_t count =
            r.elements()[0].as_integer() < 0 ? st.permits : r.elements()[0].as_integer();
        return std::max<std::int64_t>(count - r.elements()[1].as_integer(), 0);
    }

    /// Sets the count of permits in Redis for every object of the name. Held permits are never
    /// revoked: a lower count only stops grants until enough are given back; a higher one
    /// tells the waiters that may take the new permits. Returns the count before (-1: none was
    /// stored; a call sent again after its reply was lost sees its own count).
    /// @throws redislock::invalid_argument for a count out of [1, 10^12] or a moved-from object;
    /// redislock::connection_error; redislock::server_error.
    std::int64_t set_permits(std::int64_t permits) {
        const state& st = checked();
        detail::check_permits(permits);
        const detail::decimal text{permits};
        const reply r = detail::run_script(
            *st.conn, detail::scripts::semaphore_set_permits, st.release_keys(),
            std::array{text.view(), std::string_view{st.channel}, st.grace_text.view()},
            call_context{{}, st.core->untimed_deadline()}, &st.core->events);
        if (r.is_error()) {
            detail::throw_reply_error(r, "set_permits", st.name);
        }
        if (!r.is_integer()) {
            throw server_error{"redislock: unexpected reply to set_permits"};
        }
        return r.as_integer();
    }

    /// @throws redislock::invalid_argument on a moved-from object.
    const std::string& name() const { return checked().name; }
    /// The count of permits this object writes when none is stored.
    /// @throws redislock::invalid_argument on a moved-from object.
    std::int64_t permits() const { return checked().permits; }

private:
    friend lockable;
    friend handle;
    using handle::checked;
    using handle::state_;
    using handle::tracker;
    using giving_back = detail::mutex_release<C, state>;
    using given_up = typename state::given_up;

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
            if (state_->held || state_->acquiring_here()) {
                throw std::system_error{
                    std::make_error_code(std::errc::resource_deadlock_would_occur),
                    "redislock: acquire() of '" + state_->name + "' by an object that " +
                        (state_->held ? "holds" : "is already acquiring") +
                        " a permit (k permits are k objects)"};
            }
            state_->acquiring = true;
            state_->acquiring_generation = detail::current_fork_generation();
        }
        // One call at a time per object: another thread's would take a second permit.
        struct acquiring_ends {
            state& st;
            ~acquiring_ends() {
                std::lock_guard guard{st.mutex};
                st.acquiring = false;
            }
        } ends{*state_};
        return detail::acquire_in_line(
            *state_,
            [this](const call_context& how, const detail::queue_place& place) {
                return attempt(how, place);
            },
            deadline, stop,
            detail::line_options{.count_key = state_->permits_key,
                                 .assumed_count = state_->permits_text.view(),
                                 .kind = lock_kind::semaphore});
    }

    // One attempt (lua/semaphore_acquire.lua): std::nullopt when acquired, else how long to
    // wait at most.
    std::optional<detail::holder_ttl> attempt(call_context how, const detail::queue_place& place) {
        const detail::token token = detail::token::random();
        const auto sent = detail::steady::now();
        how.key = state_->name;
        const bool fenced = state_->options.fencing;
        std::int64_t fence = 0;
        std::int64_t replicas = -1;
        try {
            const auto args = std::array{token.view(),
                                         state_->lease_text.view(),
                                         std::string_view{fenced ? "1" : "0"},
                                         place.waiter,
                                         place.keep(),
                                         std::string_view{state_->channel},
                                         state_->grace_text.view(),
                                         state_->permits_text.view()};
            const auto run = [&](const auto& keys) {
                return detail::run_script_acknowledged(
                    *state_->conn, detail::scripts::semaphore_acquire, keys, args, how,
                    state_->options.min_replicas, state_->options.replica_timeout,
                    &state_->core->events);
            };
            auto [r, acks] =
                fenced
                    ? run(std::array<std::string_view, 5>{state_->name, state_->queue_key,
                                                          state_->lapse_key, state_->permits_key,
                                                          state_->fence_key})
                    : run(std::array<std::string_view, 4>{state_->name, state_->queue_key,
                                                          state_->lapse_key, state_->permits_key});
            replicas = acks;
            if (r.is_error()) {
                detail::throw_reply_error(r, "acquire", state_->name);
            }
            if (!r.is_array() || r.elements().size() != 3) {
                throw server_error{"redislock: unexpected reply to a semaphore acquisition"};
            }
            tell_if_permits_differ(r.elements()[2].as_integer());
            if (r.elements()[0].as_integer() == 0) {
                return detail::saturated_ttl(r.elements()[1].as_integer());
            }
            fence = r.elements()[1].as_integer();
        } catch (const connection_error&) {
            abandon(token, sent);  // the grant may have landed before the connection failed
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

    // Never throws: it runs between a grant and its recording.
    void tell_if_permits_differ(std::int64_t stored) noexcept try {
        if (stored == state_->permits || !state_->core->events.observed() ||
            state_->differ_told.exchange(true)) {
            return;
        }
        // lock_event::detail is a view: the text must outlive the hook's call.
        const std::string detail =
            "Redis holds " + std::to_string(stored) + " permits; this object's options say " +
            std::to_string(state_->permits) + " (set_permits() changes the count for everyone)";
        state_->core->events.emit([&] {
            lock_event e;
            e.type = event_type::permits_differ;
            e.kind = lock_kind::semaphore;
            e.name = state_->name;
            e.detail = detail;
            return e;
        });
    } catch (...) {
        // Out of memory: the event is not told.
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
            token, g.sent, lock_kind::semaphore, g.wait,
            [&] {
                return detail::renewal_spec{&detail::scripts::semaphore_extend,
                                            {state_->name},
                                            {token.str(), std::string{state_->lease_text.view()}}};
            },
            [this] { handle::unlock(); });
    }

    // An attempt whose outcome is unknown, or known too late: its permit, if it was granted, is
    // ours to give back, in the background.
    void abandon(const detail::token& token, detail::steady::time_point sent) noexcept {
        giving_back::hand_to_reaper(state_, token, sent + state_->options.lease);
    }

    static void release_on_destruction(const std::shared_ptr<state>& st) noexcept {
        handle::release_held(
            st, [](state& s) noexcept { return s.give_up(); }, &giving_back::leave);
    }
};

/// Holds one permit for a scope: acquires it on construction (or tries, with std::try_to_lock,
/// or adopts one held, with std::adopt_lock) and gives it back on destruction. Move-only; one
/// guard per semaphore object, which must outlive it.
template <class Semaphore>
class permit_guard {
public:
    /// Blocks until a permit is held. @throws what Semaphore::acquire() throws.
    explicit permit_guard(Semaphore& s) : semaphore_{&s} {
        s.acquire();
        held_ = true;
    }
    /// Tries once; owns_permit() says whether it got one.
    permit_guard(Semaphore& s, std::try_to_lock_t) : semaphore_{&s}, held_{s.try_acquire()} {}
    /// Takes over the permit `s` holds.
    permit_guard(Semaphore& s, std::adopt_lock_t) noexcept : semaphore_{&s}, held_{true} {}

    /// Takes over `other`'s permit; `other` holds none after.
    permit_guard(permit_guard&& other) noexcept
        : semaphore_{std::exchange(other.semaphore_, nullptr)},
          held_{std::exchange(other.held_, false)} {}
    /// Gives back this guard's permit, then takes over `other`'s.
    permit_guard& operator=(permit_guard&& other) noexcept {
        if (this != &other) {
            release();
            semaphore_ = std::exchange(other.semaphore_, nullptr);
            held_ = std::exchange(other.held_, false);
        }
        return *this;
    }
    permit_guard(const permit_guard&) = delete;
    permit_guard& operator=(const permit_guard&) = delete;
    ~permit_guard() { release(); }

    /// Gives the permit back now; never throws.
    void release() noexcept {
        if (held_) {
            held_ = false;
            semaphore_->release();
        }
    }
    /// Whether the guard holds a permit (it gives it back when destroyed).
    bool owns_permit() const noexcept { return held_; }
    /// owns_permit().
    explicit operator bool() const noexcept { return held_; }

private:
    Semaphore* semaphore_;
    bool held_ = false;
};

}  // namespace redislock
