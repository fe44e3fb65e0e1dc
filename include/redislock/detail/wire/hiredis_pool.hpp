// detail::hiredis_pool: the contexts of one hiredis_connection in one process: the idle ones,
// how many are open, the TLS context they share, and how a context is taken, opened (connect,
// TLS handshake, AUTH, SELECT) and given back. Guarded by its own mutex; see hiredis.hpp for the
// connection that owns it.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

#include <redislock/connection.hpp>
#if defined(REDISLOCK_HAVE_TLS) && REDISLOCK_HAVE_TLS
#include <redislock/detail/wire/tls_context.hpp>
#endif
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/wire/hiredis_io.hpp>
#include <redislock/detail/wire/resp_command.hpp>
#include <redislock/detail/wire/socket_io.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/subscriber.hpp>

namespace redislock::detail {

struct hiredis_pool {
    explicit hiredis_pool(endpoint ep) : config{std::move(ep)} {
        if (!config.tls.enabled) {
            return;
        }
        detail::require_tls_support(config);
#if defined(REDISLOCK_HAVE_TLS) && REDISLOCK_HAVE_TLS
        tls = std::make_unique<detail::tls_context>(config);
#endif
    }

    endpoint config;
    // See detail::blocking_read_floor.
    std::chrono::milliseconds blocking_read_floor =
        detail::blocking_read_floor(config.command_timeout);
#if defined(REDISLOCK_HAVE_TLS) && REDISLOCK_HAVE_TLS
    std::unique_ptr<detail::tls_context> tls;  // after config, before any context
#endif
    std::mutex mutex;
    std::condition_variable_any slot_freed;
    struct idle_context {
        detail::context_ptr ctx;
        std::chrono::steady_clock::time_point since;
    };
    std::vector<idle_context> idle;  // most recently used last
    std::size_t open_count = 0;      // idle + in use
    std::size_t broken = 0;          // contexts that broke and were not replaced yet
    std::atomic<std::uint64_t> opened{0};
    std::atomic<std::uint64_t> round_trips{0};

    detail::context_ptr acquire() {
        return acquire(std::chrono::steady_clock::time_point::max(), nullptr);
    }

    // Waits for a free slot no longer than the connect plus command timeouts, `deadline`, or
    // until *stop is requested. Sets *reopened when the context replaces a broken one.
    detail::context_ptr acquire(std::chrono::steady_clock::time_point deadline,
                                const std::stop_token* stop, bool* reopened = nullptr) {
        std::unique_lock lock{mutex};
        for (;;) {
            while (!idle.empty()) {
                idle_context entry = std::move(idle.back());
                idle.pop_back();
                if (std::chrono::steady_clock::now() - entry.since < recheck_after ||
                    still_open(*entry.ctx)) {
                    return std::move(entry.ctx);
                }
                --open_count;  // closed by the server while idle: drop it and try the next
                ++broken;
            }
            if (open_count < config.pool_size) {
                ++open_count;
                const bool replaces = broken > 0;
                if (replaces) {
                    --broken;
                }
                lock.unlock();
                try {
                    auto ctx = open(deadline, stop);
                    if (reopened != nullptr) {
                        *reopened = replaces;
                    }
                    return ctx;
                } catch (...) {
                    lock.lock();
                    --open_count;
                    if (replaces) {
                        ++broken;
                    }
                    slot_freed.notify_one();
                    throw;
                }
            }
            const auto until =
                std::min(deadline, std::chrono::steady_clock::now() + config.connect_timeout +
                                       config.command_timeout);
            const auto slot_free = [&] { return !idle.empty() || open_count < config.pool_size; };
            const bool freed = stop != nullptr
                                   ? slot_freed.wait_until(lock, *stop, until, slot_free)
                                   : slot_freed.wait_until(lock, until, slot_free);
            if (stop != nullptr && stop->stop_requested()) {
                throw cancelled_error{
                    "redislock: a stop was requested while waiting for a "
                    "connection to " +
                    config.describe()};
            }
            if (!freed) {
                throw timeout_error{"redislock: no connection to " + config.describe() +
                                    " became free in time (pool_size " +
                                    std::to_string(config.pool_size) + ")"};
            }
        }
    }

    // An idle context that is still open, or null when there is none (those found closed
    // are dropped, as acquire() drops them).
    detail::context_ptr take_idle() {
        std::lock_guard lock{mutex};
        while (!idle.empty()) {
            idle_context entry = std::move(idle.back());
            idle.pop_back();
            if (std::chrono::steady_clock::now() - entry.since < recheck_after ||
                still_open(*entry.ctx)) {
                return std::move(entry.ctx);
            }
            --open_count;
            ++broken;
        }
        return nullptr;
    }

    void release(detail::context_ptr ctx) noexcept {
        {
            std::lock_guard lock{mutex};
            try {
                idle.push_back({std::move(ctx), std::chrono::steady_clock::now()});
            } catch (...) {
                --open_count;  // out of memory: the context is closed instead of kept
            }
        }
        slot_freed.notify_one();
    }

    // Forgets a context that was closed; `broken` when it failed rather than was given up.
    void discard(bool broken_context) noexcept {
        {
            std::lock_guard lock{mutex};
            --open_count;
            if (broken_context) {
                ++broken;
            }
        }
        slot_freed.notify_one();
    }

    static constexpr std::chrono::milliseconds recheck_after{1};

    // An idle connection has nothing to read; readable or hung up means the server closed it.
    static bool still_open(const redisContext& ctx) noexcept {
        pollfd pfd{ctx.fd, POLLIN, 0};
        return ::poll(&pfd, 1, 0) == 0;
    }

    // Opens a context: connects and runs the TLS handshake within the connect timeout, then
    // AUTH, SELECT and (TLS) PING, each within the command timeout; every step ends by
    // `deadline` too, and at once when *stop is requested.
    detail::context_ptr open(std::chrono::steady_clock::time_point deadline =
                                 std::chrono::steady_clock::time_point::max(),
                             const std::stop_token* stop = nullptr) {
        using namespace std::chrono;
        const auto started = steady_clock::now();
        const auto connect_by = std::min(deadline, started + config.connect_timeout);
        const detail::connect_attempt attempt{
            config, connect_by,
            std::max(ceil<milliseconds>(connect_by - started), milliseconds::zero()), stop};
        detail::socket_fd fd = detail::connect_socket(attempt);
        detail::context_ptr ctx{redisConnectFd(fd.get())};
        if (!ctx || ctx->err) {
            throw connection_error{"redislock: cannot allocate a connection to " +
                                   config.describe()};
        }
        (void)fd.release();  // the context closes it now
        if (redisSetTimeout(ctx.get(), detail::to_timeval(detail::socket_timeout(
                                           config.command_timeout))) != REDIS_OK) {
            throw connection_error{"redislock: cannot set the command timeout on " +
                                   config.describe()};
        }
        start_tls(*ctx, attempt);
        if (!config.password.empty()) {
            if (config.user.empty()) {
                handshake(*ctx, {"AUTH", config.password}, "AUTH", deadline, stop);
            } else {
                handshake(*ctx, {"AUTH", config.user, config.password}, "AUTH", deadline, stop);
            }
        }
        if (config.db != 0) {
            handshake(*ctx, {"SELECT", std::to_string(config.db)}, "SELECT", deadline, stop);
        }
        if (config.tls.enabled) {
            // Reads what the server sent after the handshake (TLS 1.3 session tickets, or
            // the alert of a server that wanted a client certificate), so an idle context
            // has nothing to read, as the reuse check expects, and a refusal shows here.
            handshake(*ctx, {"PING"}, "the first command over TLS (PING)", deadline, stop);
        }
        opened.fetch_add(1, std::memory_order_relaxed);
        return ctx;
    }

    // The TLS handshake, by the connect deadline; the SSL object is kept in the context's
    // user slot for tls_pending(). The context is non-blocking from here.
    void start_tls([[maybe_unused]] redisContext& ctx,
                   [[maybe_unused]] const detail::connect_attempt& attempt) {
#if defined(REDISLOCK_HAVE_TLS) && REDISLOCK_HAVE_TLS
        if (!tls) {
            return;
        }
        ctx.privdata = tls->attach(ctx, config.host, config.describe(), attempt.deadline,
                                   attempt.allowed, attempt.stop);
        ctx.free_privdata = nullptr;  // hiredis frees the SSL object itself
#endif
    }

    // Sends one set-up command and reads its reply, within the command timeout and by
    // `deadline`, ending at once when *stop is requested.
    void handshake(redisContext& ctx, std::vector<std::string> words, std::string_view what,
                   std::chrono::steady_clock::time_point deadline, const std::stop_token* stop) {
        using namespace std::chrono;
        const auto by = std::min(deadline, steady_clock::now() + config.command_timeout);
        const auto allowed = ceil<milliseconds>(by - steady_clock::now()).count();
        const auto timed_out = [&] {
            return timeout_error{"redislock: " + std::string{what} + " on " + config.describe() +
                                 " got no answer within " +
                                 std::to_string(std::max<long long>(allowed, 0)) + " ms"};
        };
        const auto stopped = [&] {
            return cancelled_error{"redislock: a stop was requested during " + std::string{what} +
                                   " on " + config.describe()};
        };
        const std::vector<std::string_view> argv{words.begin(), words.end()};
        const command cmd{argv};
        switch (detail::send_commands(ctx, std::span<const command>{&cmd, 1}, by, stop)) {
            case detail::send_outcome::sent:
                break;
            case detail::send_outcome::timed_out:
                throw timed_out();
            case detail::send_outcome::stopped:
                throw stopped();
            case detail::send_outcome::failed:
                throw set_up_failed(ctx, what);
        }
        for (;;) {
            void* raw = nullptr;
            if (redisGetReplyFromReader(&ctx, &raw) != REDIS_OK) {
                throw set_up_failed(ctx, what);
            }
            if (raw != nullptr) {
                const detail::hiredis_reply_ptr owned{raw};
                const auto& r = *static_cast<redisReply*>(raw);
                if (r.type == REDIS_REPLY_ERROR) {
                    throw server_error{"redislock: " + std::string{what} + " on " +
                                       config.describe() +
                                       " was refused: " + std::string{r.str, r.len}};
                }
                return;
            }
            if (!detail::hiredis_tls_pending(ctx)) {
                switch (detail::wait_socket(ctx.fd, POLLIN, by, stop)) {
                    case detail::socket_wait::ready:
                        break;
                    case detail::socket_wait::timed_out:
                        throw timed_out();
                    case detail::socket_wait::stopped:
                        throw stopped();
                    case detail::socket_wait::failed:
                        detail::set_context_error(ctx, REDIS_ERR_IO, std::strerror(errno));
                        throw set_up_failed(ctx, what);
                }
            }
            if (redisBufferRead(&ctx) != REDIS_OK) {
                throw set_up_failed(ctx, what);
            }
        }
    }

    connection_error set_up_failed(const redisContext& ctx, std::string_view what) const {
        std::string why = ctx.errstr[0] != '\0' ? ctx.errstr : "connection closed";
        if (config.tls.enabled && config.tls.cert_file.empty()) {
            why +=
                " (a server that requires client certificates closes the "
                "connection here: see tls_cert_file and tls_key_file)";
        }
        return connection_error{"redislock: " + std::string{what} + " on " + config.describe() +
                                " failed: " + why};
    }
};

}  // namespace redislock::detail
