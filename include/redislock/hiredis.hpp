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
#include <redislock/detail/wire/hiredis_io.hpp>
#include <redislock/detail/wire/hiredis_pool.hpp>
#include <redislock/detail/wire/hiredis_round_trips.hpp>
#include <redislock/detail/wire/hiredis_subscriber.hpp>
#include <redislock/detail/wire/resp_command.hpp>
#include <redislock/detail/wire/socket_io.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/subscriber.hpp>

namespace redislock {

/// Tag for the hiredis_connection constructor that opens no connection: the first call opens the
/// first one, bounded by that call's deadline.
struct defer_connect_t {
    explicit defer_connect_t() = default;
};
/// See defer_connect_t.
inline constexpr defer_connect_t defer_connect{};

/// A thread-safe pool of hiredis connections to one Redis server: what redislock::client talks
/// through. Reconnects after a broken connection; AUTH, SELECT, unix sockets and TLS.
class hiredis_connection : private detail::hiredis_round_trips {
    using pool = detail::hiredis_pool;

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
        : detail::hiredis_round_trips{std::make_unique<detail::per_process<pool>>(
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

    /// Connections opened so far, the first one included (a reconnect adds one).
    std::uint64_t connections_opened() const {
        return this_pool().opened.load(std::memory_order_relaxed);
    }

    /// Round trips completed: one per execute(), one per execute_pipeline() batch.
    std::uint64_t round_trips() const {
        return this_pool().round_trips.load(std::memory_order_relaxed);
    }

private:
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
};

static_assert(pipelining_connection<hiredis_connection>);
static_assert(contextual_connection<hiredis_connection>);
static_assert(contextual_pipelining_connection<hiredis_connection>);
static_assert(fanout_connection<hiredis_connection>);
static_assert(connected_fanout_connection<hiredis_connection>);

}  // namespace redislock
