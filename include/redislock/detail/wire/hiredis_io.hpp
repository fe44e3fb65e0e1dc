// The hiredis adapter's I/O on one context: hiredis contexts and replies owned, a reply converted
// to redislock::reply, the socket timeouts a command timeout asks for, the settings a pool
// accepts, and commands sent on a context by a deadline (send_commands).
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
#include <redislock/detail/wire/resp_command.hpp>
#include <redislock/detail/wire/socket_io.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/subscriber.hpp>

namespace redislock::detail {

struct context_deleter {
    void operator()(redisContext* ctx) const noexcept { redisFree(ctx); }
};
using context_ptr = std::unique_ptr<redisContext, context_deleter>;

struct reply_deleter {
    void operator()(void* r) const noexcept { freeReplyObject(r); }
};
using hiredis_reply_ptr = std::unique_ptr<void, reply_deleter>;

/// Whether this build can open rediss:// connections.
inline constexpr bool hiredis_has_tls =
#if defined(REDISLOCK_HAVE_TLS) && REDISLOCK_HAVE_TLS
    true;
#else
    false;
#endif

/// Whether OpenSSL holds decrypted bytes of `ctx` that poll(2) on its socket cannot see. Always
/// false for a plain context. The adapter keeps a TLS context's SSL object in its user slot.
inline bool hiredis_tls_pending([[maybe_unused]] const redisContext& ctx) noexcept {
#if defined(REDISLOCK_HAVE_TLS) && REDISLOCK_HAVE_TLS
    return ctx.privdata != nullptr && tls_context::pending(static_cast<const SSL*>(ctx.privdata));
#else
    return false;
#endif
}

/// Whether `ctx` speaks TLS: its bytes are read through OpenSSL, never straight off the socket.
inline bool hiredis_is_tls([[maybe_unused]] const redisContext& ctx) noexcept {
#if defined(REDISLOCK_HAVE_TLS) && REDISLOCK_HAVE_TLS
    return ctx.privdata != nullptr;
#else
    return false;
#endif
}

/// Marks `ctx` failed as hiredis itself would, for a read the adapter made on its socket.
inline void set_context_error(redisContext& ctx, int type, const char* why) noexcept {
    ctx.err = type;
    std::snprintf(ctx.errstr, sizeof ctx.errstr, "%s", why);
}

/// The receive (and send) timeout set on a context's socket for a command timeout
/// `command_timeout`. The kernel rounds a socket timeout up to whole clock ticks and its timer
/// wheel may fire it up to 8/63 late plus a tick; this one, even that late, ends within the
/// command timeout (at 100 to 1000 ticks a second). Below 80 ms the socket gets the command
/// timeout itself and no call reads blocking (see blocking_read_floor).
inline std::chrono::milliseconds socket_timeout(std::chrono::milliseconds command_timeout) {
    using std::chrono::milliseconds;
    if (command_timeout < milliseconds{80}) {
        return command_timeout;
    }
    return (command_timeout - milliseconds{40}) * 7 / 8;
}

/// The least time a call must have left to read blocking: more than its socket timeout may take
/// at the latest. Above the command timeout (so never) below 80 ms.
inline std::chrono::milliseconds blocking_read_floor(std::chrono::milliseconds command_timeout) {
    return socket_timeout(command_timeout) * 8 / 7 + std::chrono::milliseconds{30};
}

/// Throws unless this build can open `ep`: rediss:// needs TLS support.
/// @throws redislock::invalid_argument saying what to install
inline void require_tls_support(const endpoint& ep) {
    if (!ep.tls.enabled || hiredis_has_tls) {
        return;
    }
    throw invalid_argument{
        "redislock: rediss:// (TLS to " + ep.describe() +
        ") needs hiredis >= 1.0 built with TLS (hiredis_ssl, OpenSSL); this program was built "
        "against hiredis " +
        std::to_string(HIREDIS_MAJOR) + "." + std::to_string(HIREDIS_MINOR) +
        " without it. Install hiredis 1.x with hiredis_ssl (cmake -DENABLE_SSL=ON) and rebuild: "
        "redislock's CMake package enables TLS when it finds it (redislock_TLS_FOUND)"};
}

/// The shortest connect and command timeouts accepted: a zero socket timeout would mean none at
/// all, so a blocking read could wait forever.
inline constexpr std::chrono::milliseconds min_timeout{1};

/// The longest connect and command timeouts accepted: a year, far beyond any useful wait, and
/// far below where the time arithmetic (deadlines on the steady clock, several timeouts added)
/// could overflow.
inline constexpr std::chrono::milliseconds max_timeout{std::chrono::hours{24 * 365}};

/// Throws unless `ep`'s pool size and timeouts can work.
/// @throws redislock::invalid_argument naming the setting
inline void check_connection_settings(const endpoint& ep) {
    if (ep.pool_size == 0) {
        throw invalid_argument{"redislock: endpoint::pool_size must be at least 1"};
    }
    for (const auto& [name, value] : {std::pair{"command_timeout", ep.command_timeout},
                                      std::pair{"connect_timeout", ep.connect_timeout}}) {
        if (value < min_timeout) {
            throw invalid_argument{
                "redislock: endpoint::command_timeout and connect_timeout "
                "must be at least 1 ms (" +
                std::string{name} + " is " + std::to_string(value.count()) + " ms)"};
        }
        if (value > max_timeout) {
            throw invalid_argument{"redislock: endpoint::" + std::string{name} + " of " +
                                   std::to_string(value.count()) + " ms is out of range (" +
                                   std::to_string(min_timeout.count()) + " to " +
                                   std::to_string(max_timeout.count()) + " ms)"};
        }
    }
}

inline timeval to_timeval(std::chrono::milliseconds ms) {
    timeval tv{};
    tv.tv_sec = static_cast<decltype(tv.tv_sec)>(ms.count() / 1000);
    tv.tv_usec = static_cast<decltype(tv.tv_usec)>((ms.count() % 1000) * 1000);
    return tv;
}

inline reply convert_reply(const redisReply& r) {
    switch (r.type) {
        case REDIS_REPLY_STRING:
#ifdef REDIS_REPLY_VERB
        case REDIS_REPLY_VERB:
#endif
#ifdef REDIS_REPLY_BIGNUM
        case REDIS_REPLY_BIGNUM:
#endif
#ifdef REDIS_REPLY_DOUBLE
        case REDIS_REPLY_DOUBLE:
#endif
            return reply::string(std::string{r.str, r.len});
        case REDIS_REPLY_STATUS:
            return reply::status(std::string{r.str, r.len});
        case REDIS_REPLY_ERROR:
            return reply::error(std::string{r.str, r.len});
        case REDIS_REPLY_INTEGER:
#ifdef REDIS_REPLY_BOOL
        case REDIS_REPLY_BOOL:
#endif
            return reply::integer(r.integer);
        case REDIS_REPLY_ARRAY:
#ifdef REDIS_REPLY_MAP
        case REDIS_REPLY_MAP:
#endif
#ifdef REDIS_REPLY_SET
        case REDIS_REPLY_SET:
#endif
#ifdef REDIS_REPLY_PUSH
        case REDIS_REPLY_PUSH:
#endif
        {
            std::vector<reply> elements;
            elements.reserve(r.elements);
            for (std::size_t i = 0; i < r.elements; ++i) {
                elements.push_back(convert_reply(*r.element[i]));
            }
            return reply::array(std::move(elements));
        }
        default:
            return reply::nil();
    }
}

/// Appends `argv` to the context's output buffer, formatted by resp_command. False when that
/// fails, out of memory included, as hiredis's own formatting would: the caller drops the context.
inline bool append_command(redisContext* ctx, command argv) noexcept {
    try {
        const resp_command text{argv};
        return redisAppendFormattedCommand(ctx, text.data(), text.size()) == REDIS_OK;
    } catch (const std::bad_alloc&) {
        return false;
    }
}

/// Sends `commands` on `ctx` by `deadline` or until *stop is requested: on a plain context
/// straight to its socket, never blocking in send(2); on a TLS one (non-blocking) through
/// hiredis and OpenSSL, waiting for room with poll(2). On send_outcome::failed, ctx.err says
/// why. A context that did not send everything must be closed: part of a command may be out.
inline send_outcome send_commands(redisContext& ctx, std::span<const command> commands,
                                  std::chrono::steady_clock::time_point deadline,
                                  const std::stop_token* stop) noexcept {
    if (hiredis_is_tls(ctx)) {
        for (command argv : commands) {
            if (!append_command(&ctx, argv)) {
                set_context_error(ctx, REDIS_ERR_OOM, "out of memory");
                return send_outcome::failed;
            }
        }
        for (;;) {
            int done = 0;
            if (redisBufferWrite(&ctx, &done) != REDIS_OK) {
                return send_outcome::failed;
            }
            if (done != 0) {
                return send_outcome::sent;
            }
            switch (wait_socket(ctx.fd, POLLOUT, deadline, stop)) {
                case socket_wait::ready:
                    break;
                case socket_wait::timed_out:
                    return send_outcome::timed_out;
                case socket_wait::stopped:
                    return send_outcome::stopped;
                case socket_wait::failed:
                    set_context_error(ctx, REDIS_ERR_IO, std::strerror(errno));
                    return send_outcome::failed;
            }
        }
    }
    send_outcome outcome = send_outcome::failed;
    try {
        if (commands.size() == 1) {
            const resp_command text{commands.front()};
            outcome = send_all(ctx.fd, {text.data(), text.size()}, deadline, stop);
        } else {
            std::string batch;
            for (command argv : commands) {
                const resp_command text{argv};
                batch.append(text.data(), text.size());
            }
            outcome = send_all(ctx.fd, batch, deadline, stop);
        }
    } catch (const std::bad_alloc&) {
        set_context_error(ctx, REDIS_ERR_OOM, "out of memory");
        return send_outcome::failed;
    }
    if (outcome == send_outcome::failed) {
        set_context_error(ctx, REDIS_ERR_IO, std::strerror(errno));
    }
    return outcome;
}

}  // namespace redislock::detail
