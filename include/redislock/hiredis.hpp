// redislock::hiredis_connection: the default connection, a thread-safe pool of hiredis contexts.
//
// Builds against hiredis 0.14 (Debian 12) and 1.x. Each context is opened on demand, up to
// endpoint::pool_size at once, with the endpoint's connect and command timeouts; each new
// context runs AUTH and SELECT as configured. A context whose connection broke (server restart,
// CLIENT KILL, timeout) is dropped and the next call opens a fresh one; a context idle for a
// millisecond or more is checked before it is reused (one poll(2)), so a client the server killed
// while it sat idle does not fail the next call. Contexts reused sooner skip the check: a busy
// loop pays no extra system call, and a kill that lands within that millisecond fails one call.
// A context opened to replace one that broke (or that the server closed while idle) is told to
// the reconnect handler (set_reconnect_handler), which a client turns into a reconnected event.
//
// Deadlines: a call given a deadline or a stop token (call_context) ends by that deadline, or
// within a few milliseconds of the stop request, whatever the server or the network does, and
// no step of it gets more than the call has left: waiting for a free context, connecting (the
// connect timeout, cut to the time left), the TLS handshake, AUTH and SELECT on a new context
// (each the command timeout, cut likewise), sending (never blocked in send(2) by a peer that
// stopped reading) and reading the replies. A call that ends that way closes the context it was
// using. See detail/wire/socket_io.hpp for the socket steps; host names are resolved with
// getaddrinfo(3), which no deadline bounds.
//
// Every call, timed or not, reads its replies through one loop that ends by the call's deadline
// and the command timeout, to the millisecond. A call that nothing can stop and that has the whole
// command timeout left reads blocking (one recv(2) per reply, as a plain hiredis call): the
// socket's receive timeout is set short enough that it ends within the command timeout even when
// the kernel fires it late (rounded up to ticks, 8/63 late, plus a tick); the rest is waited for
// with poll(2).
// Other calls poll(2) before each read.
//
// Timeouts: connect_timeout and command_timeout must lie within [1 ms, 365 days]
// (detail::min_timeout, detail::max_timeout); the constructor refuses others with
// redislock::invalid_argument.
//
// TLS (rediss://): available when the program is built with REDISLOCK_HAVE_TLS, which the CMake
// package defines when it finds hiredis >= 1.0 with hiredis_ssl and OpenSSL (redislock_TLS_FOUND).
// The pool then owns one OpenSSL client context, made from endpoint::tls when the connection is
// built, and every context it opens runs the TLS handshake (bounded by the connect timeout) and
// one PING before it is used. Built without TLS, a rediss:// endpoint is refused by the
// constructor with redislock::invalid_argument saying what to install. A TLS context works
// non-blocking (see detail/wire/tls_context.hpp), so a record that arrives in parts waits for the
// rest with poll(2), by the call's deadline; a call checks OpenSSL's buffer before it polls.
//
// Thread safety: execute() and execute_pipeline() may be called from any number of threads.
// Lifetime: movable, not copyable; contexts are closed on destruction.
// fork(): a child never uses its parent's pool: its first call builds its own (new mutex,
// condition variable and sockets) and leaves the parent's copy untouched.
// SIGPIPE: commands are sent with MSG_NOSIGNAL where the system has it, but hiredis's own writes
// (a subscriber's) use write(2), so a write to a connection the server closed may raise SIGPIPE.
// If the process still has the default action (terminate), the constructor sets it to SIG_IGN;
// an application that installed its own handler keeps it.
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

namespace redislock {

namespace detail {

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

/// A dedicated context in subscriber mode, read without blocking (see subscriber.hpp). A command
/// it sends waits for room in the socket no longer than `send_timeout`.
class hiredis_subscriber_link final : public subscriber_link {
public:
    hiredis_subscriber_link(context_ptr ctx, std::string describe,
                            std::chrono::milliseconds send_timeout)
        : ctx_{std::move(ctx)}, describe_{std::move(describe)}, send_timeout_{send_timeout} {}

    int fd() const noexcept override { return ctx_->fd; }

    void send(command argv) override {
        const auto deadline = std::chrono::steady_clock::now() + send_timeout_;
        switch (send_commands(*ctx_, std::span<const command>{&argv, 1}, deadline, nullptr)) {
            case send_outcome::sent:
                return;
            case send_outcome::failed:
                fail();
            case send_outcome::timed_out:
            case send_outcome::stopped:
                throw timeout_error{"redislock: subscriber connection to " + describe_ +
                                    " took no command within " +
                                    std::to_string(send_timeout_.count()) + " ms"};
        }
    }

    void read(std::vector<reply>& out) override {
        pollfd pfd{ctx_->fd, POLLIN, 0};
        if (buffered() || ::poll(&pfd, 1, 0) > 0) {
            if (redisBufferRead(ctx_.get()) != REDIS_OK) {
                fail();
            }
        }
        for (;;) {
            void* raw = nullptr;
            if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) {
                fail();
            }
            if (raw == nullptr) {
                return;
            }
            hiredis_reply_ptr owned{raw};
            out.push_back(convert_reply(*static_cast<redisReply*>(owned.get())));
        }
    }

    bool buffered() const noexcept override { return hiredis_tls_pending(*ctx_); }

    // A plain socket is read only after poll() found input; a TLS record may need more.
    bool reads_without_blocking() const noexcept override { return !hiredis_is_tls(*ctx_); }

private:
    [[noreturn]] void fail() {
        throw connection_error{"redislock: subscriber connection to " + describe_ + " failed: " +
                               (ctx_->errstr[0] != '\0' ? ctx_->errstr : "connection closed")};
    }

    context_ptr ctx_;
    std::string describe_;
    std::chrono::milliseconds send_timeout_;
};

}  // namespace detail

/// Tag for the hiredis_connection constructor that opens no connection: the first call opens the
/// first one, bounded by that call's deadline.
struct defer_connect_t {
    explicit defer_connect_t() = default;
};
/// See defer_connect_t.
inline constexpr defer_connect_t defer_connect{};

/// A thread-safe pool of hiredis connections to one Redis server: what redislock::client talks
/// through. Reconnects after a broken connection; AUTH, SELECT, unix sockets and TLS.
class hiredis_connection {
    struct pool;

public:
    /// Opens one connection at once, so a wrong address, password or certificate fails here.
    /// @throws redislock::connection_error (timeout_error) when the server cannot be reached
    ///         within endpoint::connect_timeout or the TLS handshake fails (an untrusted server
    ///         certificate, a client certificate the server wants and did not get);
    ///         redislock::server_error when AUTH or SELECT is refused;
    ///         redislock::invalid_argument for a pool size of 0, a timeout outside [1 ms, 365 d],
    ///         contradictory or unreadable TLS settings, or rediss:// in a build without TLS.
    explicit hiredis_connection(endpoint ep) : hiredis_connection{std::move(ep), defer_connect} {
        // Through acquire(), so the first connection counts against pool_size like the others.
        this_pool().release(this_pool().acquire());
    }

    /// Checks the settings and opens nothing: the first call opens the first connection, within
    /// that call's deadline, and a wrong address or password shows there. For connections made
    /// on a caller's behalf mid-call (a Cluster node met through a redirection, a Sentinel's new
    /// master).
    /// @throws redislock::invalid_argument as the other constructor.
    hiredis_connection(endpoint ep, defer_connect_t)
        : pool_{std::make_unique<detail::per_process<pool>>(
              [config = checked(std::move(ep))] { return std::make_unique<pool>(config); })} {
        ignore_default_sigpipe();
    }

    /// @throws redislock::invalid_argument for a malformed URI; else as the endpoint overload.
    explicit hiredis_connection(std::string_view uri)
        : hiredis_connection{endpoint::from_uri(uri)} {}

    /// Takes over another connection's pool.
    hiredis_connection(hiredis_connection&&) noexcept = default;
    /// Takes over another connection's pool.
    hiredis_connection& operator=(hiredis_connection&&) noexcept = default;

    /// Sends one command and returns its reply (error replies included).
    /// @throws redislock::connection_error, redislock::timeout_error
    reply execute(command argv) { return execute(argv, call_context{}); }

    /// As execute(argv), ending by how.deadline (timeout_error) or as soon as *how.stop is
    /// requested (cancelled_error), whichever comes first; the command timeout still bounds it.
    /// how.key is not used: one server.
    /// @throws redislock::connection_error, redislock::timeout_error, redislock::cancelled_error
    reply execute(command argv, const call_context& how) {
        reply result;
        round_trip(std::span<const command>{&argv, 1}, how,
                   [&](reply r) { result = std::move(r); });
        return result;
    }

    /// As execute_pipeline(commands), bounded by the earliest deadline of `hows` and by the first
    /// stop token among them.
    std::vector<reply> execute_pipeline(std::span<const command> commands,
                                        std::span<const call_context> hows) {
        call_context bound;
        for (const call_context& how : hows) {
            bound.deadline = std::min(bound.deadline, how.deadline);
            if ((bound.stop == nullptr || !bound.stop->stop_possible()) && how.stop != nullptr) {
                bound.stop = how.stop;
            }
        }
        return exchange_all(commands, bound);
    }

    /// Sends every command, then reads every reply: one round trip for the batch.
    /// @throws redislock::connection_error, redislock::timeout_error
    std::vector<reply> execute_pipeline(std::span<const command> commands) {
        return exchange_all(commands, call_context{});
    }

    /// A batch sent by start(): see fanout_connection in connection.hpp. It holds one context
    /// of the pool until its last reply is read (the context then goes back to the pool), it
    /// fails, or it is destroyed (the context is then closed: its late replies are never read).
    /// When that context replaced a broken one, the reconnect handler is told as the call ends
    /// in one of these ways, once the context is back or closed. Must not outlive the
    /// connection that started it.
    class call {
    public:
        /// Moves the batch; the moved-from call owns nothing.
        call(call&& other) noexcept
            : pool_{other.pool_},
              ctx_{std::move(other.ctx_)},
              expected_{other.expected_},
              replies_{std::move(other.replies_)},
              error_{std::move(other.error_)},
              reopened_by_{std::exchange(other.reopened_by_, nullptr)} {}
        call& operator=(call&&) = delete;
        ~call() {
            if (ctx_) {
                ctx_.reset();
                pool_->discard(true);  // unanswered: its late replies must never be read
            }
            report_reopened();
        }

        /// The socket to poll(2) for readability; -1 once the call has ended.
        int fd() const noexcept { return ctx_ ? ctx_->fd : -1; }
        /// True when bytes already read from the socket (TLS records) wait to be parsed.
        bool buffered() const noexcept { return ctx_ && tls_pending(*ctx_); }

        /// Reads what the socket holds (one read(2): call it when poll(2) says readable or
        /// buffered() is true, or it blocks up to the socket's timeout, detail::socket_timeout,
        /// and then fails the call). True once ended.
        bool read() {
            if (!ctx_) {
                return true;
            }
            if (redisBufferRead(ctx_.get()) != REDIS_OK) {
                end_failed();
                return true;
            }
            for (;;) {
                void* raw_reply = nullptr;
                if (redisGetReplyFromReader(ctx_.get(), &raw_reply) != REDIS_OK) {
                    end_failed();
                    return true;
                }
                if (raw_reply == nullptr) {
                    return false;
                }
                detail::hiredis_reply_ptr raw{raw_reply};
                replies_.push_back(detail::convert_reply(*static_cast<redisReply*>(raw.get())));
                if (replies_.size() == expected_) {
                    pool_->release(std::move(ctx_));
                    pool_->round_trips.fetch_add(1, std::memory_order_relaxed);
                    report_reopened();
                    return true;
                }
            }
        }

        /// The replies, once read() returned true.
        /// @throws redislock::connection_error when the connection failed or the call has not
        ///         ended.
        std::vector<reply> take() {
            if (!error_.empty()) {
                throw connection_error{error_};
            }
            if (ctx_ || replies_.size() != expected_) {
                throw connection_error{"redislock: the replies of " + pool_->config.describe() +
                                       " were taken before they arrived"};
            }
            return std::move(replies_);
        }

    private:
        friend class hiredis_connection;

        // `reopened_by`: the connection to tell when the context replaced a broken one.
        call(pool& p, detail::context_ptr ctx, std::size_t expected,
             const hiredis_connection* reopened_by)
            : pool_{&p}, ctx_{std::move(ctx)}, expected_{expected}, reopened_by_{reopened_by} {
            replies_.reserve(expected);
        }

        void end_failed() {
            const std::string why = ctx_->errstr;
            ctx_.reset();
            pool_->discard(true);
            error_ = "redislock: connection to " + pool_->config.describe() +
                     " failed: " + (why.empty() ? "connection closed" : why);
            report_reopened();
        }

        // Tells the reconnect handler, once, that the call's context replaced a broken one.
        // Called when the context is no longer held.
        void report_reopened() noexcept {
            const hiredis_connection* owner = std::exchange(reopened_by_, nullptr);
            if (owner == nullptr || !owner->on_reconnect_) {
                return;
            }
            try {
                owner->on_reconnect_(pool_->config.describe());
            } catch (...) {
            }
        }

        pool* pool_;
        detail::context_ptr ctx_;  // null once ended
        std::size_t expected_;
        std::vector<reply> replies_;
        std::string error_;
        const hiredis_connection* reopened_by_;  // null once told, or when nothing to tell
    };

    /// Sends every command on one context of the pool and returns without waiting for a reply
    /// (fanout_connection). Waiting for a free context, connecting and writing end by
    /// how.deadline, or when *how.stop is requested. A context opened to replace a broken one
    /// is reported when the returned call ends (see call), or as start() throws.
    /// @throws redislock::connection_error, redislock::timeout_error, redislock::cancelled_error
    call start(std::span<const command> commands, const call_context& how) {
        using clock = std::chrono::steady_clock;
        if (commands.empty()) {
            throw invalid_argument{"redislock: start() needs at least one command"};
        }
        const auto deadline =
            std::min(how.deadline, clock::now() + this_pool().config.command_timeout);
        check_stop(how);
        reconnect_notice notice{*this};  // reports only when start() throws
        auto ctx = take(notice, deadline, how.stop);
        send(ctx, commands, deadline, how);
        // From here the call reports, when its context is no longer held.
        const hiredis_connection* reopened_by =
            std::exchange(notice.reopened, false) ? this : nullptr;
        return call{this_pool(), std::move(ctx), commands.size(), reopened_by};
    }

    /// Has a context of the pool open and free, opening one when there is none (bounded by
    /// how.deadline and the connect timeout), so that the next start_if_connected() finds it.
    /// A context opened to replace a broken one is reported as connect() returns.
    /// @throws redislock::connection_error, redislock::timeout_error, redislock::cancelled_error
    void connect(const call_context& how) {
        check_stop(how);
        reconnect_notice notice{*this};
        this_pool().release(take(notice, how.deadline, how.stop));
    }

    /// As start(), on a context of the pool that is open and free now; std::nullopt, with
    /// nothing sent, when start() would first have to open one or wait for one to be freed
    /// (see fanout_connection in connection.hpp: a caller that must not wait for a connect
    /// calls connect() on another thread). The commands must fit in the socket's send buffer at
    /// once: a server that leaves no room is given up (timeout_error), never waited for.
    /// @throws redislock::connection_error, redislock::timeout_error, redislock::cancelled_error
    std::optional<call> start_if_connected(std::span<const command> commands,
                                           const call_context& how) {
        if (commands.empty()) {
            throw invalid_argument{"redislock: start() needs at least one command"};
        }
        check_stop(how);
        auto ctx = this_pool().take_idle();
        if (!ctx) {
            return std::nullopt;
        }
        // Never waits for room to write: a fan-out sends to one server after another, and a
        // server that reads nothing must not hold back the sends to the others.
        send(ctx, commands, std::chrono::steady_clock::now(), how);
        return call{this_pool(), std::move(ctx), commands.size(), nullptr};
    }

    /// The endpoint the connection was made for.
    const endpoint& config() const { return this_pool().config; }

    /// Opens a context of its own, outside the pool and not counted in pool_size, with the same
    /// connect, TLS, AUTH and SELECT steps: for a subscriber, which keeps its connection. The
    /// caller owns it; it must not outlive this connection (it may share its TLS context).
    /// @throws as the constructor
    detail::context_ptr open_dedicated() { return this_pool().open(); }

    /// A subscriber link to this server, for notified waiting (see subscriber.hpp).
    /// @throws as the constructor
    std::unique_ptr<subscriber_link> open_subscriber(std::string_view /*channel*/) {
        return std::make_unique<detail::hiredis_subscriber_link>(
            open_dedicated(), config().describe(), config().command_timeout);
    }

    /// Calls `handler` with the server's description each time the pool opens a context to
    /// replace one that broke (a failed or timed-out call, or one the server closed while idle),
    /// on the thread whose call opened it, as that call ends (returns or throws; for start(),
    /// as the returned call ends: its last reply read, its failure, or its destruction): with
    /// no internal lock held and the call's connection given back, so the handler may call into
    /// this connection, even with pool_size 1. Set it before the connection is shared between
    /// threads. What it throws is dropped.
    void set_reconnect_handler(std::function<void(std::string_view server)> handler) {
        on_reconnect_ = std::move(handler);
    }

private:
    // Tells the reconnect handler, when the call's context replaced a broken one, as the call
    // ends: declared before the context, it reports after the context went back to the pool (or
    // was closed), so a handler that calls into this connection finds a free slot even with
    // pool_size 1.
    class reconnect_notice {
    public:
        explicit reconnect_notice(const hiredis_connection& owner) noexcept : owner_{owner} {}
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
        const hiredis_connection& owner_;
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

public:
    /// Connections opened so far, the first one included (a reconnect adds one).
    std::uint64_t connections_opened() const {
        return this_pool().opened.load(std::memory_order_relaxed);
    }

    /// Round trips completed: one per execute(), one per execute_pipeline() batch.
    std::uint64_t round_trips() const {
        return this_pool().round_trips.load(std::memory_order_relaxed);
    }

private:
    struct pool {
        explicit pool(endpoint ep) : config{std::move(ep)} {
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
                const auto slot_free = [&] {
                    return !idle.empty() || open_count < config.pool_size;
                };
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
                       std::chrono::steady_clock::time_point deadline,
                       const std::stop_token* stop) {
            using namespace std::chrono;
            const auto by = std::min(deadline, steady_clock::now() + config.command_timeout);
            const auto allowed = ceil<milliseconds>(by - steady_clock::now()).count();
            const auto timed_out = [&] {
                return timeout_error{"redislock: " + std::string{what} + " on " +
                                     config.describe() + " got no answer within " +
                                     std::to_string(std::max<long long>(allowed, 0)) + " ms"};
            };
            const auto stopped = [&] {
                return cancelled_error{"redislock: a stop was requested during " +
                                       std::string{what} + " on " + config.describe()};
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

    // `ep`, once its settings were found sound: before any arithmetic is done with them.
    static endpoint checked(endpoint ep) {
        detail::check_connection_settings(ep);
        return ep;
    }

    static void ignore_default_sigpipe() noexcept {
        struct sigaction current {};
        if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL &&
            !(current.sa_flags & SA_SIGINFO)) {
            ::signal(SIGPIPE, SIG_IGN);
        }
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

static_assert(pipelining_connection<hiredis_connection>);
static_assert(contextual_connection<hiredis_connection>);
static_assert(contextual_pipelining_connection<hiredis_connection>);
static_assert(fanout_connection<hiredis_connection>);
static_assert(connected_fanout_connection<hiredis_connection>);

}  // namespace redislock
