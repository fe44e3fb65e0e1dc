// detail::hiredis_round_trips: the round trips of a hiredis_connection, from taking a context of
// its pool to giving it back: sending by the call's deadline, the one reply loop (a blocking read
// or poll(2)), and closing a context given up mid-reply, so that its late reply is never read as
// the next command's; and the reconnect handler, told as a call ends. Apart from the public class
// (hiredis.hpp), which states the contract and adds the fan-out calls, and from the pool
// (hiredis_pool.hpp), which opens and keeps the contexts.
//
// A base of hiredis_connection, never used alone. A round trip holds its context alone, so any
// number of threads may make them at once.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/wire/hiredis_io.hpp>
#include <redislock/detail/wire/hiredis_pool.hpp>
#include <redislock/detail/wire/socket_io.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

/// The per-process pool and the reconnect handler of a hiredis_connection, and its round trips.
class hiredis_round_trips {
protected:
    using pool = hiredis_pool;

    explicit hiredis_round_trips(std::unique_ptr<per_process<pool>> pools)
        : pool_{std::move(pools)} {}

    // Tells the reconnect handler, when the call's context replaced a broken one, as the call
    // ends: declared before the context, it reports after the context went back to the pool (or
    // was closed), so a handler that calls into this connection finds a free slot even with
    // pool_size 1.
    class reconnect_notice {
    public:
        explicit reconnect_notice(const hiredis_round_trips& owner) noexcept : owner_{owner} {}
        reconnect_notice(const reconnect_notice&) = delete;
        reconnect_notice& operator=(const reconnect_notice&) = delete;
        ~reconnect_notice() {
            if (!reopened || !owner_.on_reconnect_) {
                return;
            }
            try {
                owner_.on_reconnect_(owner_.this_pool().config.describe());
            } catch (...) {
            }
        }

        bool reopened = false;

    private:
        const hiredis_round_trips& owner_;
    };

    // A context from the pool; `notice` learns whether it replaces a broken one.
    detail::context_ptr take(reconnect_notice& notice,
                             std::chrono::steady_clock::time_point deadline =
                                 std::chrono::steady_clock::time_point::max(),
                             const std::stop_token* stop = nullptr) {
        return this_pool().acquire(deadline, stop, &notice.reopened);
    }

    static bool bounded(const call_context& how) noexcept {
        return how.deadline != std::chrono::steady_clock::time_point::max() ||
               (how.stop != nullptr && how.stop->stop_possible());
    }

    // The one reply loop: append, write, then read until every reply is in. The replies are
    // bounded by how.deadline and the command timeout, and end early when *how.stop is
    // requested. A context given up mid-reply is closed, never reused (its late reply would be
    // read as the next command's).
    std::vector<reply> exchange_all(std::span<const command> commands, const call_context& how) {
        std::vector<reply> results;
        if (commands.empty()) {
            return results;
        }
        results.reserve(commands.size());
        round_trip(commands, how, [&](reply r) { results.push_back(std::move(r)); });
        return results;
    }

    // Hands each reply, in order, to on_reply. A call given a deadline or a stop token ends,
    // from waiting for a free context to its last reply, by how.deadline and the command
    // timeout; an untimed call waits for a context as the pool allows (connect plus command
    // timeout) and then has the command timeout for its replies.
    template <class OnReply>
    void round_trip(std::span<const command> commands, const call_context& how, OnReply on_reply) {
        using clock = std::chrono::steady_clock;
        const bool timed = bounded(how);
        // An untimed call reads the clock only once its command is sent.
        const auto limit =
            timed ? std::min(how.deadline, clock::now() + this_pool().config.command_timeout)
                  : how.deadline;
        check_stop(how);
        reconnect_notice notice{*this};
        auto ctx = take(notice, limit, how.stop);
        // An untimed call is bounded by the command timeout from the moment its context is in
        // hand: sending, then the replies.
        const auto deadline = timed ? limit : clock::now() + this_pool().config.command_timeout;
        send(ctx, commands, deadline, how);
        for (std::size_t read = 0; read < commands.size();) {
            void* raw_reply = nullptr;
            if (redisGetReplyFromReader(ctx.get(), &raw_reply) != REDIS_OK) {
                fail(std::move(ctx));
            }
            if (raw_reply != nullptr) {
                detail::hiredis_reply_ptr raw{raw_reply};
                try {
                    on_reply(detail::convert_reply(*static_cast<redisReply*>(raw.get())));
                } catch (...) {
                    drop(std::move(ctx), false);  // out of memory: replies may be left unread
                    throw;
                }
                ++read;
                continue;
            }
            receive(ctx, deadline, how);
        }
        this_pool().release(std::move(ctx));
        this_pool().round_trips.fetch_add(1, std::memory_order_relaxed);
    }

    // Reads the socket's next bytes into the context's reader. A plain socket that nothing can
    // stop, with the whole command timeout left, is read blocking: one system call, ended by the
    // socket's receive timeout, which even when it fires late comes before the deadline (see
    // detail::socket_timeout). Otherwise, and once that read timed out, poll(2) keeps the
    // deadline and stop requests to the millisecond.
    void receive(detail::context_ptr& ctx, std::chrono::steady_clock::time_point deadline,
                 const call_context& how) {
        const bool stoppable = how.stop != nullptr && how.stop->stop_possible();
        if (!stoppable && !detail::hiredis_is_tls(*ctx) &&
            deadline - std::chrono::steady_clock::now() >= this_pool().blocking_read_floor) {
            char buffer[16 * 1024];
            const ssize_t got = ::recv(ctx->fd, buffer, sizeof buffer, 0);
            if (got > 0) {
                if (redisReaderFeed(ctx->reader, buffer, static_cast<std::size_t>(got)) !=
                    REDIS_OK) {
                    detail::set_context_error(*ctx, REDIS_ERR_OOM, "out of memory");
                    fail(std::move(ctx));
                }
                return;
            }
            if (got == 0) {
                detail::set_context_error(*ctx, REDIS_ERR_EOF, "Server closed the connection");
                fail(std::move(ctx));
            }
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                detail::set_context_error(*ctx, REDIS_ERR_IO, std::strerror(errno));
                fail(std::move(ctx));
            }
            // Timed out (or interrupted) with time left: wait the rest precisely.
        }
        wait_readable(ctx, deadline, how);
        if (redisBufferRead(ctx.get()) != REDIS_OK) {
            fail(std::move(ctx));
        }
    }

    void check_stop(const call_context& how) const {
        if (how.stop != nullptr && how.stop->stop_requested()) {
            throw_stopped();
        }
    }

    [[noreturn]] void throw_stopped() const {
        throw cancelled_error{"redislock: a stop was requested during a call to " +
                              this_pool().config.describe()};
    }

    // Waits until the context's socket has bytes to read; closes the context and throws when
    // the deadline passes or a stop is requested first.
    void wait_readable(detail::context_ptr& ctx, std::chrono::steady_clock::time_point deadline,
                       const call_context& how) {
        if (tls_pending(*ctx)) {
            return;  // already decrypted inside OpenSSL: the socket may stay silent
        }
        switch (detail::wait_socket(ctx->fd, POLLIN, deadline, how.stop)) {
            case detail::socket_wait::ready:
                return;
            case detail::socket_wait::timed_out:
                drop(std::move(ctx), true);
                throw timeout_error{"redislock: " + this_pool().config.describe() +
                                    " did not answer in time"};
            case detail::socket_wait::stopped:
                drop(std::move(ctx), false);
                throw_stopped();
            case detail::socket_wait::failed:
                detail::set_context_error(*ctx, REDIS_ERR_IO, std::strerror(errno));
                fail(std::move(ctx));
        }
    }

    // Sends `commands` on `ctx` by `deadline`; closes the context and throws when the deadline
    // passes, a stop is requested or the connection fails first.
    void send(detail::context_ptr& ctx, std::span<const command> commands,
              std::chrono::steady_clock::time_point deadline, const call_context& how) {
        switch (detail::send_commands(*ctx, commands, deadline, how.stop)) {
            case detail::send_outcome::sent:
                return;
            case detail::send_outcome::timed_out:
                drop(std::move(ctx), true);
                throw timeout_error{"redislock: " + this_pool().config.describe() +
                                    " took no command in time (it reads nothing)"};
            case detail::send_outcome::stopped:
                drop(std::move(ctx), false);
                throw_stopped();
            case detail::send_outcome::failed:
                fail(std::move(ctx));
        }
    }

    // Closes a context given up mid-reply: `broken` when the server failed to answer in time.
    void drop(detail::context_ptr ctx, bool broken) noexcept {
        ctx.reset();
        this_pool().discard(broken);
    }

    static bool tls_pending(const redisContext& ctx) noexcept {
        return detail::hiredis_tls_pending(ctx);
    }

    static bool is_timeout(const redisContext& ctx) noexcept {
#ifdef REDIS_ERR_TIMEOUT
        if (ctx.err == REDIS_ERR_TIMEOUT) {
            return true;
        }
#endif
        return ctx.err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK ||
                                           errno == ETIMEDOUT || errno == EINPROGRESS);
    }

    [[noreturn]] void fail(detail::context_ptr ctx) {
        const bool timed_out = is_timeout(*ctx);
        std::string why = ctx->errstr;
        ctx.reset();
        this_pool().discard(true);
        if (timed_out) {
            throw timeout_error{"redislock: " + this_pool().config.describe() +
                                " did not answer within " +
                                std::to_string(this_pool().config.command_timeout.count()) + " ms"};
        }
        throw connection_error{"redislock: connection to " + this_pool().config.describe() +
                               " failed: " + (why.empty() ? "connection closed" : why)};
    }

    // One pool per process: a forked child builds its own (fresh mutex, condition variable and
    // sockets) and never touches its parent's, whose mutex a parent thread may have held at the
    // fork, and whose sockets (and TLS sessions) belong to the parent.
    pool& this_pool() const {
        return pool_->get();
    }

    std::unique_ptr<detail::per_process<pool>> pool_;
    std::function<void(std::string_view)> on_reconnect_;
};

}  // namespace redislock::detail
