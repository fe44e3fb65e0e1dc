// redislock::basic_mutex: the simple lock, one Redis string per name.
//
// Acquire: SET name token NX PX lease, with a fresh random 128-bit token per acquisition; the
// same command redis-py's Lock, node-redlock and redsync send, so they exclude each other on the
// same name. Release and extend are compare-and-act scripts: they act only while the key still
// holds our token. With lock_options::fencing, acquisition runs a script that also draws the
// fencing token from a counter beside the name ({name}:fence), which never expires.
//
// TimedLockable, so std::unique_lock, std::scoped_lock and std::lock work with it.
//
// Thread safety: one object may be shared by several threads, as a std::mutex is. The thread
// that locked it holds it (or, with lock_options::owner set, the object itself does); lock()
// from the holder throws std::system_error(resource_deadlock_would_occur); unlock() from
// another thread does nothing and reports errc::not_holder through unlock(std::error_code&).
// With lock_options::watchdog the client's watchdog renews the lease until unlock() (see
// watchdog.hpp); unlock() stops the renewals before it releases.
// Lifetime: independent of the client's (the connection is shared). Movable, not copyable; a
// moved-from object may only be destroyed or assigned to. Destroying a held lock releases it.
// Exceptions: lock calls throw redislock::error subclasses on failures (never for contention);
// unlock() never throws.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
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
class basic_mutex : public detail::timed_lockable<basic_mutex<C>> {
public:
    /// Usually made by client.mutex(name, options).
    /// @throws redislock::invalid_argument for an empty or oversized name, a lease out of
    ///         range, or inconsistent backoff bounds.
    basic_mutex(basic_client<C>& client, std::string_view name, lock_options options = {})
        : state_{std::make_unique<state>(client.core_, name, std::move(options))} {}

    basic_mutex(basic_mutex&&) noexcept = default;
    basic_mutex& operator=(basic_mutex&& other) noexcept {
        if (this != &other) {
            release_on_destruction();
            state_ = std::move(other.state_);
        }
        return *this;
    }
    ~basic_mutex() { release_on_destruction(); }

    /// Releases the lock. Never throws; a lock found lost calls on_lost.
    void unlock() noexcept {
        std::error_code ignored;
        unlock(ignored);
    }

    /// Releases the lock and says how it went: no error; errc::not_held or errc::not_holder
    /// (misuse: nothing is sent); errc::lock_lost (it had expired or been taken);
    /// errc::connection_failed (the release could not be sent, even on a retry) or
    /// errc::server_failed (the server answered it with an error): the key stays until its lease
    /// runs out, and the next lock() on this object retries the release first.
    void unlock(std::error_code& ec) noexcept {
        ec.clear();
        given_up released;
        {
            std::lock_guard guard{state_->mutex};
            if (!state_->held) {
                ec = errc::not_held;
                return;
            }
            if (!state_->caller_is_holder() || state_->inherited_by_fork()) {
                ec = errc::not_holder;
                return;
            }
            released = give_up_locked();
        }
        state_->core->watchdog.remove(released.renewal);
        ec = release(released);
    }

    /// Sets the lease to `lease` from now if the lock is still ours.
    /// Returns false (and calls on_lost) if the lock was lost; false at once if not held.
    /// @throws redislock::invalid_argument for a lease out of range;
    ///         redislock::connection_error; redislock::server_error when the server answers with
    ///         an error (the lock is not taken for lost). See https://redis.io/commands/pexpire/
    bool extend(std::chrono::milliseconds lease) {
        detail::check_lease(lease);
        std::optional<detail::token> token = held_token();
        if (!token) {
            return false;
        }
        const detail::decimal lease_text{lease.count()};
        const auto sent = detail::steady::now();
        const reply r = detail::run_script(*state_->conn, detail::scripts::mutex_extend,
                                           std::array{std::string_view{state_->name}},
                                           std::array{token->view(), lease_text.view()});
        if (r.is_integer() && r.as_integer() == 1) {
            std::lock_guard guard{state_->mutex};
            if (state_->held && state_->token == *token) {
                state_->valid_until = detail::valid_until(sent, lease);
            }
            return true;
        }
        throw_unless_not_ours(r, "extend");
        mark_lost(*state_, *token);
        return false;
    }

    /// Local, conservative estimate of how long the lock stays ours: the lease counted from when
    /// the successful attempt was sent, on the steady clock, minus a drift allowance
    /// (1% of the lease + 2 ms). Zero when not held or known lost.
    std::chrono::milliseconds remaining() const {
        std::lock_guard guard{state_->mutex};
        if (!state_->held || state_->lost) {
            return std::chrono::milliseconds::zero();
        }
        return detail::time_left(state_->valid_until);
    }

    /// Local: true while this object holds the lock, it is not known lost, and remaining() > 0.
    bool owned() const { return remaining() > std::chrono::milliseconds::zero(); }

    /// Asks Redis whether the key still holds our token. A lock found lost calls on_lost.
    /// @throws redislock::connection_error; redislock::server_error when the server answers with
    ///         an error (the lock is not taken for lost). See https://redis.io/commands/get/
    bool verify() {
        std::optional<detail::token> token = held_token();
        if (!token) {
            return false;
        }
        const std::array<std::string_view, 2> get{"GET", state_->name};
        const reply r = state_->conn->execute(get);
        if (r.is_string() && r.text() == token->view()) {
            return true;
        }
        throw_unless_not_ours(r, "verify");
        mark_lost(*state_, *token);
        return false;
    }

    /// The fencing token of the current acquisition (lock_options::fencing); 0 when fencing is
    /// off or the lock is not held. Strictly increases across acquisitions of the same name.
    std::int64_t fencing_token() const {
        std::lock_guard guard{state_->mutex};
        return state_->held ? state_->fence : 0;
    }

    const std::string& name() const noexcept { return state_->name; }
    const lock_options& options() const noexcept { return state_->options; }

private:
    friend class detail::timed_lockable<basic_mutex>;

    struct state : detail::lock_identity<C> {
        using detail::lock_identity<C>::lock_identity;

        bool caller_is_holder() const { return this->caller_is(holder); }
        // Held by the parent this process was forked from: only the parent may release it.
        bool inherited_by_fork() const { return generation != detail::current_fork_generation(); }

        mutable std::mutex mutex;  // guards the members below; never held across a round trip
        bool held = false;
        bool lost = false;  // held, but a round trip found it gone (on_lost called)
        detail::token token;
        // An earlier acquisition whose release failed (network or error reply): its key may stay
        // until its lease runs out, so the next lock() on this object releases it first.
        std::optional<detail::token> unreleased;
        std::thread::id holder;
        std::uint64_t generation = 0;  // fork generation of the acquisition
        detail::steady::time_point valid_until;
        std::int64_t fence = 0;
        typename basic_watchdog<C>::lease_id renewal = 0;  // 0: not renewed
    };

    std::optional<detail::token> held_token() const {
        std::lock_guard guard{state_->mutex};
        if (!state_->held) {
            return std::nullopt;
        }
        return state_->token;
    }

    bool acquire_until(detail::steady::time_point deadline, const std::stop_token& stop) {
        std::optional<detail::token> unreleased;
        {
            std::lock_guard guard{state_->mutex};
            if (state_->held && state_->caller_is_holder()) {
                throw std::system_error{
                    std::make_error_code(std::errc::resource_deadlock_would_occur),
                    "redislock: lock() of '" + state_->name + "' by its holder"};
            }
            unreleased = std::exchange(state_->unreleased, std::nullopt);
        }
        if (unreleased) {
            finish_unreleased(*unreleased);
        }
        return detail::acquire_with_backoff([this] { return attempt(); }, deadline, stop,
                                            state_->options);
    }

    // One acquisition attempt: std::nullopt when acquired, else the holder's TTL.
    std::optional<detail::holder_ttl> attempt() {
        const detail::token token = detail::token::random();
        const auto sent = detail::steady::now();
        std::int64_t fence = 0;
        try {
            if (state_->options.fencing) {
                const reply r = detail::run_script(
                    *state_->conn, detail::scripts::mutex_acquire_fenced,
                    std::array<std::string_view, 2>{state_->name, state_->fence_key},
                    std::array{token.view(), state_->lease_text.view()});
                r.throw_if_error();
                if (!r.is_array() || r.elements().size() != 2) {
                    throw server_error{"redislock: unexpected reply to a fenced acquisition"};
                }
                if (r.elements()[0].as_integer() == 0) {
                    return detail::holder_ttl{r.elements()[1].as_integer()};
                }
                fence = r.elements()[1].as_integer();
            } else {
                const std::array<std::string_view, 6> set{
                    "SET", state_->name, token.view(), "NX", "PX", state_->lease_text.view()};
                const reply r = state_->conn->execute(set);
                r.throw_if_error();
                if (r.is_nil()) {
                    return holder_ttl_after_failed_set();
                }
            }
        } catch (const connection_error&) {
            // The SET may have landed before the connection failed: take it back if we can,
            // else have the next lock() on this object try again.
            if (release_quietly(token, 1).outcome == release_outcome::unreachable) {
                keep_unreleased(token, false);
            }
            throw;
        }
        on_acquired(token, sent, fence);
        return std::nullopt;
    }

    detail::holder_ttl holder_ttl_after_failed_set() {
        const reply r = detail::run_script(*state_->conn, detail::scripts::mutex_probe,
                                           std::array{std::string_view{state_->name}},
                                           std::array<std::string_view, 0>{});
        if (r.is_error()) {
            throw server_error{"redislock: cannot lock '" + state_->name + "': " + r.text()};
        }
        return detail::holder_ttl{r.as_integer()};
    }

    void on_acquired(const detail::token& token, detail::steady::time_point sent,
                     std::int64_t fence) {
        bool previous_lost = false;
        typename basic_watchdog<C>::lease_id previous_renewal = 0;
        {
            std::lock_guard guard{state_->mutex};
            // Another thread of this object still thinks it holds: its lease ran out, since we
            // could take the key. Its acquisition is lost.
            previous_lost = state_->held && !state_->lost;
            previous_renewal = std::exchange(state_->renewal, 0);
            state_->held = true;
            state_->lost = false;
            state_->unreleased.reset();  // SET NX found the name free: no older key is left
            state_->token = token;
            state_->holder = std::this_thread::get_id();
            state_->generation = detail::current_fork_generation();
            state_->valid_until = detail::valid_until(sent, state_->options.lease);
            state_->fence = fence;
        }
        state_->core->watchdog.remove(previous_renewal);
        if (previous_lost) {
            notify_lost(*state_);
        }
        if (state_->options.watchdog) {
            start_renewing(token, sent);
        }
    }

    void start_renewing(const detail::token& token, detail::steady::time_point sent) {
        state* st = state_.get();
        lease_renewal renewal{&detail::scripts::mutex_extend,
                              {st->name},
                              {token.str(), std::string{st->lease_text.view()}},
                              st->options.lease,
                              st->options.max_hold,
                              [st, token](detail::steady::time_point renewed_at) {
                                  std::lock_guard guard{st->mutex};
                                  if (st->held && st->token == token) {
                                      st->valid_until =
                                          detail::valid_until(renewed_at, st->options.lease);
                                  }
                              },
                              [st, token] { mark_lost(*st, token); }};
        const auto id = st->core->watchdog.add(std::move(renewal), sent);
        bool still_ours = false;
        {
            std::lock_guard guard{st->mutex};
            still_ours = st->held && st->token == token;
            if (still_ours) {
                st->renewal = id;
            }
        }
        if (!still_ours) {
            st->core->watchdog.remove(id);
        }
    }

    // Marks the acquisition holding `token` lost and calls on_lost, once per acquisition.
    static void mark_lost(state& st, const detail::token& token) {
        {
            std::lock_guard guard{st.mutex};
            if (!st.held || st.token != token || st.lost) {
                return;
            }
            st.lost = true;
        }
        notify_lost(st);
    }

    static void notify_lost(state& st) noexcept { detail::call_on_lost(st.options); }

    // An acquisition given up by unlock() or the destructor, to be released.
    struct given_up {
        detail::token token;
        detail::steady::time_point valid_until;
        bool reported = false;  // its loss was already reported through on_lost
        typename basic_watchdog<C>::lease_id renewal = 0;  // to stop before releasing
    };

    // Marks the current acquisition as no longer held. Needs state_->mutex.
    given_up give_up_locked() {
        // The renewal is taken in the same step, so it cannot be a later acquisition's.
        given_up g{state_->token, state_->valid_until, state_->lost,
                   std::exchange(state_->renewal, 0)};
        state_->held = false;
        state_->lost = false;
        return g;
    }

    enum class release_outcome { released, not_ours, unreachable, refused };

    struct release_result {
        release_outcome outcome;
        bool after_failure;  // an earlier try failed on the network, and may have landed
    };

    // Sends the compare-and-delete, retrying once on a connection failure (it is idempotent).
    release_result release_quietly(const detail::token& token, int tries = 2) noexcept {
        bool failed = false;
        for (int i = 0; i < tries; ++i) {
            try {
                const reply r = detail::run_script(
                    *state_->conn, detail::scripts::mutex_release,
                    std::array{std::string_view{state_->name}},
                    std::array<std::string_view, 2>{token.view(), state_->channel});
                if (r.is_integer()) {
                    return {
                        r.as_integer() == 1 ? release_outcome::released : release_outcome::not_ours,
                        failed};
                }
                // Another type at the name is surely not our lock; other errors say nothing.
                return {r.is_error_code("WRONGTYPE") ? release_outcome::not_ours
                                                     : release_outcome::refused,
                        failed};
            } catch (const connection_error&) {
                failed = true;
            } catch (...) {
                return {release_outcome::refused, failed};
            }
        }
        return {release_outcome::unreachable, true};
    }

    std::error_code release(const given_up& g) noexcept {
        const release_result result = release_quietly(g.token);
        switch (result.outcome) {
            case release_outcome::released:
                return {};
            case release_outcome::not_ours:
                // After a try whose reply was lost, "not ours" most likely means that try deleted
                // the key: while the lease surely held, nobody else could have taken it.
                if (result.after_failure && detail::steady::now() < g.valid_until) {
                    return {};
                }
                if (!g.reported) {
                    notify_lost(*state_);
                }
                return errc::lock_lost;
            case release_outcome::unreachable:
                keep_unreleased(g.token, true);
                return errc::connection_failed;
            case release_outcome::refused:
                keep_unreleased(g.token, true);
                return errc::server_failed;
        }
        return errc::connection_failed;
    }

    // Remembers a key left behind, unless this object has acquired since (then the name was
    // free, so the key is gone) or, without `replace`, another one is remembered already.
    void keep_unreleased(const detail::token& token, bool replace) noexcept {
        std::lock_guard guard{state_->mutex};
        if (!state_->held && (replace || !state_->unreleased)) {
            state_->unreleased = token;
        }
    }

    // Releases a key an earlier unlock() left behind. Its loss, if it was lost, is not reported:
    // that acquisition ended when unlock() returned.
    void finish_unreleased(const detail::token& token) {
        const release_result result = release_quietly(token);
        if (result.outcome == release_outcome::unreachable) {
            keep_unreleased(token, false);
            throw connection_error{"redislock: cannot reach the server to finish releasing '" +
                                   state_->name + "'"};
        }
        if (result.outcome == release_outcome::refused) {
            keep_unreleased(token, false);
            throw server_error{"redislock: the server refused to finish releasing '" +
                               state_->name + "'"};
        }
    }

    // Throws server_error for an error reply other than WRONGTYPE (which means the name now
    // holds another type, so the lock is surely not ours).
    void throw_unless_not_ours(const reply& r, std::string_view what) const {
        if (r.is_error() && !r.is_error_code("WRONGTYPE")) {
            throw server_error{"redislock: cannot " + std::string{what} + " '" + state_->name +
                               "': " + r.text()};
        }
    }

    void release_on_destruction() noexcept {
        if (!state_) {
            return;
        }
        std::optional<given_up> held;
        std::optional<detail::token> unreleased;
        {
            std::lock_guard guard{state_->mutex};
            if (state_->inherited_by_fork()) {
                return;  // the parent's keys: never released from a child
            }
            if (state_->held) {
                held = give_up_locked();
            }
            unreleased = std::exchange(state_->unreleased, std::nullopt);
        }
        if (held) {
            state_->core->watchdog.remove(held->renewal);
            (void)release(*held);
        }
        if (unreleased) {
            (void)release_quietly(*unreleased);
        }
    }

    std::unique_ptr<state> state_;
};

}  // namespace redislock
