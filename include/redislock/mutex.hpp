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
    /// errc::connection_failed (the release could not be sent, even on a retry: the key stays
    /// until its lease runs out, and the next lock() on this object retries the release first).
    void unlock(std::error_code& ec) noexcept {
        ec.clear();
        detail::token token;
        {
            std::lock_guard guard{state_->mutex};
            if (!state_->held) {
                ec = errc::not_held;
                return;
            }
            if (!state_->caller_is_holder()) {
                ec = errc::not_holder;
                return;
            }
            token = state_->token;
            state_->held = false;
            state_->release_pending = true;
        }
        stop_renewing();
        ec = release(token);
    }

    /// Sets the lease to `lease` from now if the lock is still ours.
    /// Returns false (and calls on_lost) if the lock was lost; false at once if not held.
    /// @throws redislock::invalid_argument for a lease out of range;
    ///         redislock::connection_error. See https://redis.io/commands/pexpire/
    bool extend(std::chrono::milliseconds lease) {
        detail::check_lease(lease);
        std::optional<detail::token> token = held_token();
        if (!token) {
            return false;
        }
        const detail::decimal lease_text{lease.count()};
        const auto sent = detail::steady::now();
        const reply r = detail::run_script(
            *state_->conn, detail::scripts::mutex_extend, std::array{std::string_view{state_->name}},
            std::array{token->view(), lease_text.view()});
        if (r.is_integer() && r.as_integer() == 1) {
            std::lock_guard guard{state_->mutex};
            if (state_->held && state_->token == *token) {
                state_->valid_until = detail::valid_until(sent, lease);
            }
            return true;
        }
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
    /// @throws redislock::connection_error. See https://redis.io/commands/get/
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

    struct state {
        state(std::shared_ptr<detail::client_core<C>> client, std::string_view lock_name,
              lock_options opts)
            : core{std::move(client)}, conn{&core->connection}, name{lock_name},
              options{std::move(opts)}, lease_text{options.lease.count()} {
            detail::check_options(name, options);
            fence_key = detail::derived_key(name, "fence");
            channel = detail::derived_key(name, "released");
        }

        bool caller_is_holder() const {
            return !options.owner.empty() || holder == std::this_thread::get_id();
        }

        std::shared_ptr<detail::client_core<C>> core;
        C* conn;
        std::string name;
        lock_options options;
        detail::decimal lease_text;
        std::string fence_key;
        std::string channel;

        mutable std::mutex mutex;  // guards the members below; never held across a round trip
        bool held = false;
        bool lost = false;             // held, but a round trip found it gone (on_lost called)
        bool release_pending = false;  // unlock() could not reach the server; token still set
        detail::token token;
        std::thread::id holder;
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
        {
            std::lock_guard guard{state_->mutex};
            if (state_->held && state_->caller_is_holder()) {
                throw std::system_error{
                    std::make_error_code(std::errc::resource_deadlock_would_occur),
                    "redislock: lock() of '" + state_->name + "' by its holder"};
            }
        }
        retry_pending_release();
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
            // The SET may have landed before the connection failed: take it back if we can.
            (void)release_quietly(token, 1);
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
            state_->release_pending = false;
            state_->token = token;
            state_->holder = std::this_thread::get_id();
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

    void stop_renewing() noexcept {
        typename basic_watchdog<C>::lease_id id = 0;
        {
            std::lock_guard guard{state_->mutex};
            id = std::exchange(state_->renewal, 0);
        }
        state_->core->watchdog.remove(id);
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

    static void notify_lost(state& st) noexcept {
        if (st.options.on_lost) {
            st.options.on_lost();
        }
    }

    // Sends the compare-and-delete, retrying once on a connection failure (it is idempotent).
    // Returns 1 released, 0 not ours, nullopt when the server could not be reached.
    std::optional<int> release_quietly(const detail::token& token, int tries = 2) noexcept {
        for (int i = 0; i < tries; ++i) {
            try {
                const reply r = detail::run_script(
                    *state_->conn, detail::scripts::mutex_release,
                    std::array{std::string_view{state_->name}},
                    std::array<std::string_view, 2>{token.view(), state_->channel});
                return r.is_integer() && r.as_integer() == 1 ? 1 : 0;
            } catch (...) {
            }
        }
        return std::nullopt;
    }

    std::error_code release(const detail::token& token) noexcept {
        const std::optional<int> released = release_quietly(token);
        bool was_lost = false;
        {
            std::lock_guard guard{state_->mutex};
            if (!released) {
                return errc::connection_failed;  // release_pending stays set with the token
            }
            if (state_->release_pending && state_->token == token) {
                state_->release_pending = false;
                was_lost = *released == 0 && !state_->lost;
                state_->lost = false;
            }
        }
        if (*released == 1) {
            return {};
        }
        if (was_lost) {
            notify_lost(*state_);
        }
        return errc::lock_lost;
    }

    void retry_pending_release() {
        std::optional<detail::token> token;
        {
            std::lock_guard guard{state_->mutex};
            if (state_->release_pending) {
                token = state_->token;
            }
        }
        if (token && release(*token) == errc::connection_failed) {
            throw connection_error{"redislock: cannot reach the server to finish releasing '" +
                                   state_->name + "'"};
        }
    }

    void release_on_destruction() noexcept {
        if (!state_) {
            return;
        }
        std::optional<detail::token> token;
        {
            std::lock_guard guard{state_->mutex};
            if (state_->held || state_->release_pending) {
                token = state_->token;
                state_->held = false;
                state_->release_pending = true;
            }
        }
        stop_renewing();
        if (token) {
            (void)release(*token);
        }
    }

    std::unique_ptr<state> state_;
};

}  // namespace redislock
