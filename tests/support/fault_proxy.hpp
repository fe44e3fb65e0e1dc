#pragma once

// redislock::test::fault_proxy: a TCP forwarder on 127.0.0.1, owned by a test, that sits between
// a client and a redis-server and breaks the path on command: latency, a stalled path whose
// connections stay open, cut connections, refused connections and lost replies. Network faults
// without root, namespaces or helper processes; one thread and poll(2).
//
//   redis_server srv;
//   fault_proxy proxy{srv.host(), srv.port()};
//   redislock::client client{proxy.uri() + "?command_timeout=200"};
//   proxy.stall();   // the next command times out, the connection stays open
//   proxy.resume();  // bytes buffered meanwhile are delivered
//
// Every control call is thread-safe and synchronous: when it returns, the forwarding thread has
// applied it (no byte moves against a stall after stall() returns, every connection that was
// live when cut() was called is closed).

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "support/redis_server.hpp"

namespace redislock::test {

class fault_proxy {
public:
    /// Listens on a free port of 127.0.0.1 and forwards every connection to target_host:
    /// target_port (an IPv4 address).
    /// @throws std::runtime_error when the socket cannot be set up.
    fault_proxy(std::string target_host, int target_port)
        : target_host_{std::move(target_host)}, target_port_{target_port} {
        target_.sin_family = AF_INET;
        target_.sin_port = htons(static_cast<std::uint16_t>(target_port_));
        if (::inet_pton(AF_INET, target_host_.c_str(), &target_.sin_addr) != 1) {
            throw std::invalid_argument{"fault_proxy: not an IPv4 address: " + target_host_};
        }
        listener_ =
            detail::unique_fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
        if (!listener_) {
            throw detail::sys_error("fault_proxy: socket");
        }
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof(addr);
        if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0 ||
            ::listen(listener_.get(), 64) != 0 ||
            ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
            throw detail::sys_error("fault_proxy: listen on 127.0.0.1");
        }
        port_ = ntohs(addr.sin_port);
        wake_ = detail::unique_fd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
        if (!wake_) {
            throw detail::sys_error("fault_proxy: eventfd");
        }
        thread_ = std::thread{[this] { run(); }};
    }

    /// Forwards to `server`.
    explicit fault_proxy(const redis_server& server) : fault_proxy{server.host(), server.port()} {}

    fault_proxy(const fault_proxy&) = delete;
    fault_proxy& operator=(const fault_proxy&) = delete;

    /// Closes every connection and the listener, and joins the forwarding thread.
    ~fault_proxy() {
        {
            std::lock_guard guard{mutex_};
            stopping_ = true;
        }
        wake();
        thread_.join();
    }

    int port() const { return port_; }
    std::string host() const { return "127.0.0.1"; }
    /// redis://127.0.0.1:PORT, for a client that should go through the proxy.
    std::string uri() const { return "redis://127.0.0.1:" + std::to_string(port_); }

    /// Holds every chunk of bytes for `ms` before passing it on, in each direction, so a round
    /// trip takes 2 x ms longer. Zero turns the delay off (bytes already held keep their time).
    void delay(std::chrono::milliseconds ms) {
        apply([&](settings& s) { s.delay = std::max(ms, std::chrono::milliseconds::zero()); });
    }

    /// Stops bytes in both directions; connections stay open, and new ones are accepted and
    /// connected to the target but carry nothing. Bytes sent meanwhile wait in the proxy's and the
    /// kernel's buffers and are delivered after resume(), unless their connection is cut first.
    void stall() {
        apply([](settings& s) { s.stalled = true; });
    }

    /// Lets bytes flow again after stall().
    void resume() {
        apply([](settings& s) { s.stalled = false; });
    }

    /// Closes both ends of every live connection (bytes held for them are discarded), so the
    /// client sees its connection closed by the server. Later connections work as configured.
    void cut() {
        apply([](settings& s) { ++s.cut_generation; });
    }

    /// true: each new connection is accepted and closed at once, before anything is read from it,
    /// with a reset (SO_LINGER 0): the client's connect succeeds and its first command fails with
    /// "connection reset". (Closing the listener instead would free the port for anyone to take.)
    /// Connections already live are left alone. false: accept and forward again.
    void refuse(bool on) {
        apply([&](settings& s) { s.refusing = on; });
    }

    /// true: bytes from the server are read and thrown away, so every command still reaches and
    /// runs on the server but its reply is lost (the client times out).
    void drop_replies(bool on) {
        apply([&](settings& s) { s.dropping_replies = on; });
    }

    /// true: the path drops off the network. Live connections carry nothing, as after stall(),
    /// and a new connect neither succeeds nor is refused until the client gives up: the listen
    /// backlog is cut to nothing and filled, so the kernel drops the SYNs. false: connects are
    /// accepted again and bytes held meanwhile are delivered.
    void unreachable(bool on) {
        apply([&](settings& s) { s.unreachable = on; });
    }

    /// Turns every fault off: no delay, no stall, no refusal, replies delivered, reachable.
    void heal() {
        apply([](settings& s) {
            s.delay = std::chrono::milliseconds::zero();
            s.stalled = false;
            s.refusing = false;
            s.dropping_replies = false;
            s.unreachable = false;
        });
    }

    /// Connections accepted and forwarded, since construction.
    std::size_t accepted() const { return accepted_.load(); }
    /// Connections accepted and closed at once because of refuse(true).
    std::size_t refused() const { return refused_.load(); }
    /// Forwarded connections open right now.
    std::size_t live() const { return live_.load(); }
    /// Connections closed by cut().
    std::size_t cut_count() const { return cut_.load(); }
    /// Server bytes discarded by drop_replies(true).
    std::size_t dropped_reply_bytes() const { return dropped_bytes_.load(); }

private:
    using clock = std::chrono::steady_clock;

    struct settings {
        std::chrono::milliseconds delay{0};
        bool stalled = false;
        bool refusing = false;
        bool dropping_replies = false;
        bool unreachable = false;
        std::uint64_t cut_generation = 0;
    };

    // Bytes read from one side, waiting to be written to the other once `due`.
    struct chunk {
        clock::time_point due;
        std::string bytes;
    };

    // One end of a forwarded connection and what waits to be written to it.
    struct side {
        detail::unique_fd fd;
        std::deque<chunk> outgoing;
        std::size_t outgoing_bytes = 0;
        bool eof = false;  // the peer closed its sending side; nothing more to read
    };

    struct link {
        side client;
        side server;
        bool broken = false;
    };

    // Reading stops while this much waits for the other side, so a delayed fast sender cannot
    // make the proxy buffer without bound.
    static constexpr std::size_t max_buffered = std::size_t{4} << 20;

    template <class Change>
    void apply(Change change) {
        std::unique_lock guard{mutex_};
        change(wanted_);
        const std::uint64_t epoch = ++wanted_epoch_;
        guard.unlock();
        wake();
        guard.lock();
        // The thread applies a change within one poll round; the bound only guards against a
        // forwarding thread that died.
        applied_cv_.wait_for(guard, std::chrono::seconds{5},
                             [&] { return applied_epoch_ >= epoch || stopping_; });
    }

    void wake() {
        const std::uint64_t one = 1;
        (void)!::write(wake_.get(), &one, sizeof(one));
    }

    void run() {
        settings current;
        std::uint64_t cuts_done = 0;
        std::list<link> links;
        std::vector<pollfd> fds;
        // For each pollfd past the first two: its link, and whether it is the client's end.
        std::vector<std::pair<link*, bool>> owners;
        bool unreachable = false;
        std::vector<detail::unique_fd> backlog_fillers;  // while unreachable
        for (;;) {
            std::uint64_t epoch = 0;
            {
                std::lock_guard guard{mutex_};
                if (stopping_) {
                    break;
                }
                current = wanted_;
                epoch = wanted_epoch_;
            }

            if (current.unreachable != unreachable) {
                unreachable = current.unreachable;
                set_reachable(!unreachable, backlog_fillers);
            }

            if (current.cut_generation != cuts_done) {
                cuts_done = current.cut_generation;
                cut_.fetch_add(links.size());
                live_.fetch_sub(links.size());
                links.clear();
            }

            // Published only once the change has taken effect (a cut's connections are closed),
            // and before any byte moves under the new settings.
            {
                std::lock_guard guard{mutex_};
                applied_epoch_ = epoch;
            }
            applied_cv_.notify_all();

            const auto now = clock::now();
            fds.clear();
            owners.clear();
            fds.push_back({wake_.get(), POLLIN, 0});
            fds.push_back({listener_.get(), current.unreachable ? short{0} : short{POLLIN}, 0});
            auto next_due = clock::time_point::max();
            for (auto& l : links) {
                for (const bool is_client : {true, false}) {
                    side& from = is_client ? l.client : l.server;
                    side& to = is_client ? l.server : l.client;
                    short events = 0;
                    if (!current.stalled && !current.unreachable) {
                        if (!from.eof && to.outgoing_bytes < max_buffered) {
                            events |= POLLIN;
                        }
                        if (!from.outgoing.empty()) {
                            if (from.outgoing.front().due <= now) {
                                events |= POLLOUT;
                            } else {
                                next_due = std::min(next_due, from.outgoing.front().due);
                            }
                        }
                    }
                    fds.push_back({from.fd.get(), events, 0});
                    owners.emplace_back(&l, is_client);
                }
            }

            int timeout_ms = 100;  // also a heartbeat, so a lost wake-up costs at most this
            if (next_due != clock::time_point::max()) {
                const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next_due - now);
                timeout_ms = static_cast<int>(std::clamp<std::int64_t>(wait.count(), 0, 100));
            }
            const int ready = ::poll(fds.data(), fds.size(), timeout_ms);
            if (ready < 0 && errno != EINTR) {
                break;
            }
            if (ready <= 0) {
                continue;
            }
            if (fds[0].revents != 0) {
                std::uint64_t count = 0;
                (void)!::read(wake_.get(), &count, sizeof(count));
            }
            if ((fds[1].revents & POLLIN) != 0) {
                accept_all(current, links);
            }
            for (std::size_t i = 2; i < fds.size(); ++i) {
                auto [l, is_client] = owners[i - 2];
                if (fds[i].revents != 0 && !l->broken) {
                    service(*l, is_client, fds[i].revents, current);
                }
            }
            links.remove_if([this](const link& l) {
                const bool done = l.broken || finished(l);
                if (done) {
                    live_.fetch_sub(1);
                }
                return done;
            });
        }
        live_.store(0);
        {
            std::lock_guard guard{mutex_};
            applied_epoch_ = wanted_epoch_;
        }
        applied_cv_.notify_all();
    }

    // A link is done once a side closed and everything it sent has been delivered.
    static bool finished(const link& l) {
        return (l.client.eof && l.server.outgoing.empty()) ||
               (l.server.eof && l.client.outgoing.empty());
    }

    void accept_all(const settings& current, std::list<link>& links) {
        for (int i = 0; i < 64; ++i) {
            detail::unique_fd client{
                ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)};
            if (!client) {
                return;
            }
            if (current.refusing) {
                const linger reset{1, 0};
                (void)::setsockopt(client.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
                refused_.fetch_add(1);
                continue;
            }
            detail::unique_fd server = connect_target();
            if (!server) {
                // The target is down: the client sees its connection closed, as it would see a
                // server that died right after accepting.
                continue;
            }
            set_nodelay(client.get());
            set_nodelay(server.get());
            link& l = links.emplace_back();
            l.client.fd = std::move(client);
            l.server.fd = std::move(server);
            accepted_.fetch_add(1);
            live_.fetch_add(1);
        }
    }

    // Unreachable: a backlog of 0 still queues one connection, so a few made here fill the
    // queue and the kernel drops every later SYN. Reachable: the usual backlog; the fillers are
    // closed, and accepted and dropped like any connection that closes at once.
    void set_reachable(bool reachable, std::vector<detail::unique_fd>& fillers) {
        if (reachable) {
            (void)::listen(listener_.get(), 64);
            fillers.clear();
            return;
        }
        (void)::listen(listener_.get(), 0);
        sockaddr_in self{};
        self.sin_family = AF_INET;
        self.sin_port = htons(static_cast<std::uint16_t>(port_));
        self.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        for (int i = 0; i < 3; ++i) {
            detail::unique_fd filler{
                ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
            if (!filler) {
                break;
            }
            (void)::connect(filler.get(), reinterpret_cast<const sockaddr*>(&self), sizeof(self));
            fillers.push_back(std::move(filler));
        }
    }

    detail::unique_fd connect_target() const {
        detail::unique_fd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)};
        if (!fd) {
            return fd;
        }
        if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&target_), sizeof(target_)) ==
            0) {
            return fd;
        }
        if (errno != EINPROGRESS) {
            return {};
        }
        // Loopback: the handshake completes at once unless the target's backlog is full.
        pollfd pfd{fd.get(), POLLOUT, 0};
        int err = 0;
        socklen_t len = sizeof(err);
        if (::poll(&pfd, 1, 1000) != 1 ||
            ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
            return {};
        }
        return fd;
    }

    static void set_nodelay(int fd) {
        const int on = 1;
        (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    }

    void service(link& l, bool is_client, short revents, const settings& current) {
        side& from = is_client ? l.client : l.server;
        side& to = is_client ? l.server : l.client;
        if ((revents & POLLOUT) != 0) {
            flush(from, l);
        }
        if ((revents & POLLIN) != 0 && !l.broken) {
            read_from(from, to, !is_client && current.dropping_replies, current.delay, l);
        }
        if ((revents & (POLLERR | POLLHUP | POLLNVAL)) != 0 && (revents & POLLIN) == 0) {
            l.broken = true;
        }
    }

    void flush(side& s, link& l) {
        const auto now = clock::now();
        while (!s.outgoing.empty() && s.outgoing.front().due <= now) {
            chunk& front = s.outgoing.front();
            const ssize_t n =
                ::send(s.fd.get(), front.bytes.data(), front.bytes.size(), MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n < 0 && errno == EAGAIN) {
                return;
            }
            if (n <= 0) {
                l.broken = true;
                return;
            }
            s.outgoing_bytes -= static_cast<std::size_t>(n);
            if (static_cast<std::size_t>(n) < front.bytes.size()) {
                front.bytes.erase(0, static_cast<std::size_t>(n));
                return;
            }
            s.outgoing.pop_front();
        }
    }

    void read_from(side& from, side& to, bool discard, std::chrono::milliseconds delay, link& l) {
        std::array<char, 16384> buf{};
        const ssize_t n = ::recv(from.fd.get(), buf.data(), buf.size(), 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) {
            return;
        }
        if (n < 0) {
            l.broken = true;
            return;
        }
        if (n == 0) {
            from.eof = true;
            return;
        }
        if (discard) {
            dropped_bytes_.fetch_add(static_cast<std::size_t>(n));
            return;
        }
        to.outgoing.push_back(
            {clock::now() + delay, std::string{buf.data(), static_cast<std::size_t>(n)}});
        to.outgoing_bytes += static_cast<std::size_t>(n);
        if (delay == std::chrono::milliseconds::zero()) {
            flush(to, l);
        }
    }

    std::string target_host_;
    int target_port_;
    sockaddr_in target_{};
    int port_ = 0;
    detail::unique_fd listener_;
    detail::unique_fd wake_;

    std::mutex mutex_;
    std::condition_variable applied_cv_;
    settings wanted_;
    std::uint64_t wanted_epoch_ = 0;
    std::uint64_t applied_epoch_ = 0;
    bool stopping_ = false;

    std::atomic<std::size_t> accepted_{0};
    std::atomic<std::size_t> refused_{0};
    std::atomic<std::size_t> live_{0};
    std::atomic<std::size_t> cut_{0};
    std::atomic<std::size_t> dropped_bytes_{0};

    std::thread thread_;
};

}  // namespace redislock::test
