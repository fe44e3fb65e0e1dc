// The socket steps of a call that a deadline and a stop token bound: waiting for a socket,
// connecting one, and sending bytes on it. None of them blocks past the deadline, whatever the
// peer does (a server that stopped answering, a path that stalls, packets dropped), and a stop
// request ends each within stop_poll_slice.
//
// Host names are resolved with getaddrinfo(3), which a deadline cannot bound: give addresses, or
// names the local resolver answers at once (/etc/hosts), where deadlines matter.
#pragma once

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>

namespace redislock::detail {

/// How often a wait with a stop token looks at it: poll(2) cannot be woken by one.
inline constexpr std::chrono::milliseconds stop_poll_slice{5};

/// How a wait_socket() ended.
enum class socket_wait { ready, timed_out, stopped, failed };

/// Whether a stop was requested on `stop` (null: none can be).
inline bool stop_requested(const std::stop_token* stop) noexcept {
    return stop != nullptr && stop->stop_requested();
}

/// Waits until `fd` is ready for `events` (POLLIN, POLLOUT; an error or hang-up counts as ready,
/// for the next read or write to report), `deadline` passes or *stop is requested.
inline socket_wait wait_socket(int fd, short events, std::chrono::steady_clock::time_point deadline,
                               const std::stop_token* stop) noexcept {
    using namespace std::chrono;
    const bool stoppable = stop != nullptr && stop->stop_possible();
    for (;;) {
        if (stop_requested(stop)) {
            return socket_wait::stopped;
        }
        const auto left = deadline - steady_clock::now();
        if (left <= steady_clock::duration::zero()) {
            return socket_wait::timed_out;
        }
        // Whole milliseconds, rounded up so a wait never ends before its deadline; at most a
        // second per poll(2), so the count always fits its int.
        auto slice = std::min(ceil<milliseconds>(left), milliseconds{1000});
        if (stoppable) {
            slice = std::min(slice, stop_poll_slice);
        }
        pollfd pfd{fd, events, 0};
        const int ready = ::poll(&pfd, 1, static_cast<int>(slice.count()));
        if (ready > 0) {
            return socket_wait::ready;
        }
        if (ready < 0 && errno != EINTR) {
            return socket_wait::failed;
        }
    }
}

/// A socket descriptor, closed on destruction unless released.
class socket_fd {
public:
    socket_fd() = default;
    explicit socket_fd(int fd) noexcept : fd_{fd} {}
    socket_fd(socket_fd&& other) noexcept : fd_{other.release()} {}
    socket_fd& operator=(socket_fd&& other) noexcept {
        if (this != &other) {
            reset();
            fd_ = other.release();
        }
        return *this;
    }
    socket_fd(const socket_fd&) = delete;
    socket_fd& operator=(const socket_fd&) = delete;
    ~socket_fd() { reset(); }

    int get() const noexcept { return fd_; }
    explicit operator bool() const noexcept { return fd_ >= 0; }
    int release() noexcept { return std::exchange(fd_, -1); }
    void reset() noexcept {
        if (fd_ >= 0) {
            ::close(fd_);
            fd_ = -1;
        }
    }

private:
    int fd_ = -1;
};

/// Sets or clears O_NONBLOCK on `fd`; false when fcntl(2) fails.
inline bool set_nonblocking(int fd, bool on) noexcept {
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0) {
        return false;
    }
    return ::fcntl(fd, F_SETFL, on ? flags | O_NONBLOCK : flags & ~O_NONBLOCK) == 0;
}

/// What connect_socket() reports a failure with: the endpoint, and how long it was given.
struct connect_attempt {
    const endpoint& ep;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds allowed;  // the connect timeout, or less: the call's time left
    const std::stop_token* stop = nullptr;
};

[[noreturn]] inline void throw_connect_timeout(const connect_attempt& a) {
    throw timeout_error{"redislock: connecting to " + a.ep.describe() + " timed out after " +
                        std::to_string(a.allowed.count()) + " ms"};
}

[[noreturn]] inline void throw_connect_stopped(const connect_attempt& a) {
    throw cancelled_error{"redislock: a stop was requested while connecting to " + a.ep.describe()};
}

// A new socket of `family`, non-blocking and closed on exec; throws when none can be made.
inline socket_fd new_socket(int family, const connect_attempt& a) {
    socket_fd fd{::socket(family, SOCK_STREAM, 0)};
    if (!fd || !set_nonblocking(fd.get(), true) || ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC) != 0) {
        throw connection_error{"redislock: cannot connect to " + a.ep.describe() + ": " +
                               std::strerror(errno)};
    }
    return fd;
}

// Connects the non-blocking `fd` to `addr`. Returns 0 when connected, else the errno that says
// why not (the caller tries the next address); throws on the deadline or a stop request.
inline int connect_one(int fd, const sockaddr* addr, socklen_t len, const connect_attempt& a) {
    if (::connect(fd, addr, len) == 0) {
        return 0;
    }
    if (errno != EINPROGRESS && errno != EINTR) {
        return errno;
    }
    switch (wait_socket(fd, POLLOUT, a.deadline, a.stop)) {
        case socket_wait::ready:
            break;
        case socket_wait::timed_out:
            throw_connect_timeout(a);
        case socket_wait::stopped:
            throw_connect_stopped(a);
        case socket_wait::failed:
            return errno;
    }
    int error = 0;
    socklen_t size = sizeof error;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) != 0) {
        return errno;
    }
    return error;
}

// A unix socket's connect() fails with EAGAIN while the server's backlog is full: retried until
// the deadline.
inline socket_fd connect_unix(const connect_attempt& a) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (a.ep.unix_socket.size() >= sizeof addr.sun_path) {
        throw connection_error{"redislock: cannot connect to " + a.ep.describe() +
                               ": the socket path is too long"};
    }
    std::memcpy(addr.sun_path, a.ep.unix_socket.c_str(), a.ep.unix_socket.size() + 1);
    for (;;) {
        socket_fd fd = new_socket(AF_UNIX, a);
        const int error =
            connect_one(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr, a);
        if (error == 0) {
            return fd;
        }
        if (error != EAGAIN) {
            throw connection_error{"redislock: cannot connect to " + a.ep.describe() + ": " +
                                   std::strerror(error)};
        }
        if (std::chrono::steady_clock::now() >= a.deadline) {
            throw_connect_timeout(a);
        }
        if (stop_requested(a.stop)) {
            throw_connect_stopped(a);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds{1});
    }
}

// Every address `host` resolves to, IPv4 first (as hiredis orders them).
inline std::vector<std::pair<sockaddr_storage, socklen_t>> resolve(const connect_attempt& a) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string port = std::to_string(a.ep.port);
    const int rv = ::getaddrinfo(a.ep.host.c_str(), port.c_str(), &hints, &found);
    if (rv != 0) {
        throw connection_error{"redislock: cannot connect to " + a.ep.describe() + ": " +
                               ::gai_strerror(rv)};
    }
    const std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned{found, ::freeaddrinfo};
    std::vector<std::pair<sockaddr_storage, socklen_t>> out;
    for (int family : {AF_INET, AF_INET6}) {
        for (const addrinfo* p = found; p != nullptr; p = p->ai_next) {
            if (p->ai_family == family && p->ai_addrlen <= sizeof(sockaddr_storage)) {
                sockaddr_storage addr{};
                std::memcpy(&addr, p->ai_addr, p->ai_addrlen);
                out.emplace_back(addr, p->ai_addrlen);
            }
        }
    }
    return out;
}

/// A connected, blocking socket to `a.ep` (its unix socket, or TCP with TCP_NODELAY, each
/// address of its host tried in turn), opened by `a.deadline`.
/// @throws redislock::timeout_error when the deadline passes first, redislock::cancelled_error on
///         a stop request, redislock::connection_error when the server refuses or cannot be
///         reached.
inline socket_fd connect_socket(const connect_attempt& a) {
    socket_fd fd;
    if (!a.ep.unix_socket.empty()) {
        fd = connect_unix(a);
    } else {
        std::string why = "no address";
        for (const auto& [addr, len] : resolve(a)) {
            socket_fd attempt = new_socket(addr.ss_family, a);
            const int error =
                connect_one(attempt.get(), reinterpret_cast<const sockaddr*>(&addr), len, a);
            if (error == 0) {
                fd = std::move(attempt);
                break;
            }
            why = std::strerror(error);
        }
        if (!fd) {
            throw connection_error{"redislock: cannot connect to " + a.ep.describe() + ": " + why};
        }
        const int on = 1;
        (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    }
    if (!set_nonblocking(fd.get(), false)) {
        throw connection_error{"redislock: cannot connect to " + a.ep.describe() + ": " +
                               std::strerror(errno)};
    }
    return fd;
}

/// How a send_all() ended.
enum class send_outcome { sent, timed_out, stopped, failed };

/// Sends every byte of `bytes` on `fd` (a plain socket, blocking or not) without ever blocking in
/// send(2): a peer that stops reading fills the socket's buffer, and the rest then waits for room
/// no longer than `deadline`. On `failed`, errno says why.
inline send_outcome send_all(int fd, std::string_view bytes,
                             std::chrono::steady_clock::time_point deadline,
                             const std::stop_token* stop) noexcept {
#ifdef MSG_NOSIGNAL
    constexpr int flags = MSG_DONTWAIT | MSG_NOSIGNAL;  // a closed peer is an error, not SIGPIPE
#else
    constexpr int flags = MSG_DONTWAIT;
#endif
    while (!bytes.empty()) {
        const ssize_t n = ::send(fd, bytes.data(), bytes.size(), flags);
        if (n > 0) {
            bytes.remove_prefix(static_cast<std::size_t>(n));
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
            return send_outcome::failed;
        }
        switch (wait_socket(fd, POLLOUT, deadline, stop)) {
            case socket_wait::ready:
                break;
            case socket_wait::timed_out:
                return send_outcome::timed_out;
            case socket_wait::stopped:
                return send_outcome::stopped;
            case socket_wait::failed:
                return send_outcome::failed;
        }
    }
    return send_outcome::sent;
}

}  // namespace redislock::detail
