#pragma once

// Helpers shared by the test files: clocks, sockets that refuse or ignore connections, a
// connection double that injects faults in front of a real hiredis_connection, and child
// process handling.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/faulty_connection.hpp"
#include "support/redis_server.hpp"

namespace redislock::test {

using namespace std::chrono_literals;

/// What `make()` was refused with: the message of a redislock::invalid_argument, "not
/// invalid_argument: <message>" for another exception, "accepted" when it returned.
template <class Make>
std::string refusal_of(Make&& make) {
    try {
        (void)make();
    } catch (const redislock::invalid_argument& e) {
        return e.what();
    } catch (const std::exception& e) {
        return std::string{"not invalid_argument: "} + e.what();
    }
    return "accepted";
}

/// Measures the time since construction on the steady clock.
class stopwatch {
public:
    std::chrono::milliseconds elapsed() const {
        return std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start_);
    }

private:
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// A thread that waits up to `timeout` for `lock` and, once it has it, gives it back at once
/// (a lock belongs to the thread that took it). Joined by join() or on destruction, so an
/// assertion that ends a test does not leave it running.
template <class Lock>
class waiting_thread {
public:
    template <class Rep, class Period>
    waiting_thread(Lock& lock, std::chrono::duration<Rep, Period> timeout)
        : thread_{[this, &lock, timeout] {
              got_ = lock.try_lock_for(timeout);
              if (got_) {
                  lock.unlock();
              }
          }} {}

    /// True once the lock was taken.
    bool got() const { return got_.load(); }
    void join() { thread_.join(); }

private:
    std::atomic<bool> got_{false};
    std::jthread thread_;  // last: started once got_ exists
};

/// Counts the on_lost calls of one lock: lock_options{.on_lost = counter.handler()}.
struct lost_counter {
    std::atomic<int> calls{0};
    std::function<void()> handler() {
        return [this] { calls.fetch_add(1); };
    }
};

/// Has `srv` (started with `--enable-debug-command yes`) sleep for `length` (DEBUG SLEEP, from a
/// thread of its own) and returns once the server is seen asleep: a PING on a fresh connection
/// left unanswered for 100 ms, however late the sleep began on a busy machine. The destructor
/// waits for the sleep to end. `asleep()` is false when no sleep was seen within 10 s.
class server_asleep {
public:
    server_asleep(const redis_server& srv, std::chrono::milliseconds length)
        : sleeper_{[&srv, length] {
              (void)srv.cli({"DEBUG", "SLEEP", std::to_string(length.count() / 1000.0)});
          }} {
        const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds{10};
        while (!asleep_ && std::chrono::steady_clock::now() < give_up) {
            const reply_probe probe =
                probe_tcp(srv.host(), srv.port(), {"PING"}, std::chrono::milliseconds{100});
            asleep_ = probe.connected && !probe.line;
            if (!asleep_) {
                std::this_thread::sleep_for(std::chrono::milliseconds{5});
            }
        }
    }
    server_asleep(const server_asleep&) = delete;
    server_asleep& operator=(const server_asleep&) = delete;
    ~server_asleep() { sleeper_.join(); }

    bool asleep() const { return asleep_; }

private:
    std::thread sleeper_;
    bool asleep_ = false;
};

/// Polls `done()` every 2 ms until it holds or `timeout` has passed; returns whether it held.
template <class Predicate>
bool eventually(Predicate done, std::chrono::milliseconds timeout = std::chrono::seconds{10}) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done()) {
        if (std::chrono::steady_clock::now() >= deadline) {
            return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds{2});
    }
    return true;
}

/// A raw hiredis subscriber to one channel, apart from the library, so release messages are
/// observed without the code under test. Releases publish with SPUBLISH (sharded pub/sub), so
/// it subscribes with SSUBSCRIBE and expects 'smessage' replies; a marker published with
/// SPUBLISH on the same channel arrives in order with them.
class subscriber {
public:
    subscriber(const redis_server& srv, std::string channel) : channel_{std::move(channel)} {
        const timeval timeout{5, 0};
        ctx_.reset(redisConnectWithTimeout(srv.host().c_str(), srv.port(), timeout));
        if (!ctx_ || ctx_->err != 0 || redisSetTimeout(ctx_.get(), timeout) != REDIS_OK) {
            throw std::runtime_error{"subscriber: cannot connect"};
        }
        const char* argv[] = {"SSUBSCRIBE", channel_.c_str()};
        const std::size_t lengths[] = {10, channel_.size()};
        const reply_ptr confirmed{
            static_cast<redisReply*>(redisCommandArgv(ctx_.get(), 2, argv, lengths))};
        if (!confirmed) {
            throw std::runtime_error{"subscriber: SSUBSCRIBE got no reply"};
        }
        if (!is_push(*confirmed, "ssubscribe")) {
            throw std::runtime_error{"subscriber: SSUBSCRIBE " + channel_ + " was not confirmed" +
                                     (confirmed->type == REDIS_REPLY_ERROR
                                          ? ": " + std::string{confirmed->str, confirmed->len}
                                          : std::string{})};
        }
    }

    /// The payload of the next message; std::nullopt when none comes within `timeout` (the
    /// subscriber stays usable then), and a text saying so when something other than a message
    /// on this channel comes.
    std::optional<std::string> next(std::chrono::milliseconds timeout = std::chrono::seconds{5}) {
        void* raw = nullptr;
        // A reply already read off the socket comes first.
        if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) {
            return std::nullopt;
        }
        if (raw == nullptr) {
            pollfd wanted{ctx_->fd, POLLIN, 0};
            const int ready =
                ::poll(&wanted, 1, static_cast<int>(std::max<std::int64_t>(timeout.count(), 0)));
            if (ready <= 0) {
                return std::nullopt;
            }
            // Data is there: the rest of a message follows at once (bounded by the 5 s socket
            // timeout).
            if (redisGetReply(ctx_.get(), &raw) != REDIS_OK || raw == nullptr) {
                return std::nullopt;
            }
        }
        const reply_ptr message{static_cast<redisReply*>(raw)};
        if (!is_push(*message, "smessage")) {
            return "(not a message on " + channel_ + ")";
        }
        return std::string{message->element[2]->str, message->element[2]->len};
    }

private:
    struct free_context {
        void operator()(redisContext* c) const { redisFree(c); }
    };
    struct free_reply {
        void operator()(redisReply* r) const { freeReplyObject(r); }
    };
    using reply_ptr = std::unique_ptr<redisReply, free_reply>;

    // A three-element push of `kind` on this channel: ["smessage", channel, payload] or
    // ["ssubscribe", channel, count].
    bool is_push(const redisReply& r, std::string_view kind) const {
#ifdef REDIS_REPLY_PUSH
        const bool array = r.type == REDIS_REPLY_ARRAY || r.type == REDIS_REPLY_PUSH;
#else
        const bool array = r.type == REDIS_REPLY_ARRAY;
#endif
        return array && r.elements == 3 && r.element[0]->type == REDIS_REPLY_STRING &&
               std::string_view{r.element[0]->str, r.element[0]->len} == kind &&
               r.element[1]->type == REDIS_REPLY_STRING &&
               std::string_view{r.element[1]->str, r.element[1]->len} == channel_;
    }

    std::string channel_;
    std::unique_ptr<redisContext, free_context> ctx_;
};

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine, so times taken
/// in a forked child and in its parent can be compared.
inline std::int64_t monotonic_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

/// `srv`'s URI with query options appended, e.g. with_query(srv, "command_timeout=300").
inline std::string with_query(const redis_server& srv, std::string_view query) {
    return srv.uri() + "?" + std::string{query};
}

namespace detail {

inline int bound_loopback_socket(sockaddr_in& addr) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        throw sys_error("socket");
    }
    addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
        ::close(fd);
        throw sys_error("bind 127.0.0.1:0");
    }
    return fd;
}

}  // namespace detail

/// A port on 127.0.0.1 that refuses connections: bound but not listening, so no other process
/// can start listening on it while this object lives.
class refused_port {
public:
    refused_port() : fd_{detail::bound_loopback_socket(addr_)} {}
    int port() const { return ntohs(addr_.sin_port); }
    std::string uri() const { return "redis://127.0.0.1:" + std::to_string(port()); }

private:
    sockaddr_in addr_{};
    detail::unique_fd fd_;
};

/// A listener on 127.0.0.1 whose accept queue is full: the kernel drops further SYNs, so a
/// connect to it neither succeeds nor is refused until the client gives up.
class unresponsive_listener {
public:
    unresponsive_listener() : fd_{detail::bound_loopback_socket(addr_)} {
        if (::listen(fd_.get(), 0) != 0) {
            throw detail::sys_error("listen");
        }
        // A backlog of 0 still queues one connection; a few more fill the queue for sure.
        for (int i = 0; i < 3; ++i) {
            detail::unique_fd filler{
                ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
            if (!filler) {
                throw detail::sys_error("socket");
            }
            (void)::connect(filler.get(), reinterpret_cast<const sockaddr*>(&addr_), sizeof(addr_));
            fillers_.push_back(std::move(filler));
        }
    }
    std::string uri() const { return "redis://127.0.0.1:" + std::to_string(ntohs(addr_.sin_port)); }

private:
    sockaddr_in addr_{};
    detail::unique_fd fd_;
    std::vector<detail::unique_fd> fillers_;
};

/// What fault_connection does instead of (or besides) forwarding a command.
enum class fault {
    throw_before_send,  ///< throw connection_error; the server never sees the command
    throw_after_send,   ///< forward the command, then throw connection_error (lost reply)
    answer_noscript,    ///< answer NOSCRIPT without forwarding
    answer_error,       ///< answer the rule's error text without forwarding
};

/// A connection double with a smaller interface than faulty_connection<hiredis_connection>,
/// which it forwards to: rules are "the next `times` commands named `name` (running `script`)",
/// each taking the commands its earlier rules for the same commands leave; the log holds no
/// fault marks. It models only execute(argv) (neither contextual nor pipelining), so the
/// watchdog sends its renewals one by one and waiters poll. Thread-safe like the connection it
/// wraps.
class fault_connection {
public:
    explicit fault_connection(std::string_view uri) : faulty_{uri} {}

    /// The next `times` commands named `name` (and, when `script` is given, running it) that no
    /// earlier rule takes get `what` instead of their normal outcome.
    void inject(fault what, std::string_view name, int times = 1,
                std::optional<redislock::script> script = std::nullopt,
                std::string error_text = "ERR injected") {
        const std::string sha1 = script ? std::string{script->sha1} : std::string{};
        std::lock_guard guard{mutex_};  // one rule added at a time: each sees the ones before
        // After what the earlier rules for the same commands have still to take.
        const auto taken = static_cast<int>(faulty_.pending_faults(name, sha1));
        faulty_.add(
            fault_rule{.command = std::string{name},
                       .script = sha1,
                       .action = what == fault::throw_before_send  ? fault_action::throw_before_send
                                 : what == fault::throw_after_send ? fault_action::throw_after_send
                                                                   : fault_action::error_reply,
                       .first = 1 + taken,
                       .times = times,
                       .error_text = what == fault::answer_noscript
                                         ? "NOSCRIPT No matching script. Please use EVAL."
                                         : std::move(error_text)});
    }

    reply execute(command argv) { return faulty_.execute(argv); }

    /// Every command seen so far: its name, and for EVALSHA the script's name.
    std::vector<std::string> log() const {
        std::vector<std::string> out;
        for (const seen_command& c : faulty_.log()) {
            out.push_back(c.script.empty() ? c.name : c.name + " " + c.script);
        }
        return out;
    }

    void clear_log() { faulty_.clear_log(); }

    /// Rules not used up yet.
    int pending_faults() const { return static_cast<int>(faulty_.pending_faults()); }

    hiredis_connection& inner() { return faulty_.inner(); }

private:
    faulty_connection<hiredis_connection> faulty_;
    std::mutex mutex_;
};

/// Waits for child `pid` for at most `timeout`; kills it if it overruns. Returns its wait
/// status, or std::nullopt if it had to be killed.
inline std::optional<int> wait_child(pid_t pid, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        int status = 0;
        const pid_t r = ::waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            return status;
        }
        if (r < 0 && errno != EINTR) {
            return std::nullopt;
        }
        if (std::chrono::steady_clock::now() >= deadline) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &status, 0);
            return std::nullopt;
        }
        std::this_thread::sleep_for(5ms);
    }
}

}  // namespace redislock::test
