#pragma once

// A scripted stand-in for one Redis Cluster node (or a sentinel): a RESP server on 127.0.0.1
// whose every answer comes from a handler the test writes, and which pushes what the test gives
// it on a chosen connection (pub/sub messages). It lets a test produce each redirection and error a
// cluster can answer (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, NOSCRIPT) at a chosen moment, and see
// which commands arrived on which connection, without a cluster.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "support/redis_server.hpp"

namespace redislock::test {

/// RESP encoders for handler answers.
namespace resp {

inline std::string status(const std::string& text) {
    return "+" + text + "\r\n";
}
inline std::string error(const std::string& text) {
    return "-" + text + "\r\n";
}
inline std::string integer(long long value) {
    return ":" + std::to_string(value) + "\r\n";
}
inline std::string bulk(const std::string& text) {
    return "$" + std::to_string(text.size()) + "\r\n" + text + "\r\n";
}
inline std::string nil() {
    return "$-1\r\n";
}
inline std::string array(const std::vector<std::string>& encoded) {
    std::string out = "*" + std::to_string(encoded.size()) + "\r\n";
    for (const auto& e : encoded) {
        out += e;
    }
    return out;
}

/// A CLUSTER SLOTS answer: each range (first, last, port) served by 127.0.0.1:port.
inline std::string cluster_slots(const std::vector<std::tuple<int, int, int>>& ranges) {
    std::vector<std::string> out;
    for (const auto& [first, last, port] : ranges) {
        out.push_back(
            array({integer(first), integer(last),
                   array({bulk("127.0.0.1"), integer(port), bulk("id" + std::to_string(port))})}));
    }
    return array(out);
}

}  // namespace resp

/// One command as the fake node received it.
struct fake_command {
    int connection = 0;             ///< which accepted connection, numbered from 1
    bool asked = false;             ///< ASKING came just before it on the same connection
    std::vector<std::string> argv;  ///< name and arguments
};

class fake_redis_node {
public:
    /// Returns the raw RESP answer to one command.
    using handler = std::function<std::string(const fake_command&)>;

    fake_redis_node() {
        listen_fd_ = detail::unique_fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
        if (!listen_fd_) {
            throw detail::sys_error("socket");
        }
        const int one = 1;
        ::setsockopt(listen_fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof addr;
        if (::bind(listen_fd_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
            ::listen(listen_fd_.get(), 64) != 0 ||
            ::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
            throw detail::sys_error("fake node: listen on 127.0.0.1");
        }
        port_ = ntohs(addr.sin_port);
        acceptor_ = std::thread{[this] { accept_loop(); }};
    }

    ~fake_redis_node() {
        stopping_ = true;
        acceptor_.join();
        std::vector<std::thread> workers;
        {
            std::lock_guard lock{mutex_};
            workers = std::move(workers_);
        }
        for (auto& w : workers) {
            w.join();
        }
    }

    fake_redis_node(const fake_redis_node&) = delete;
    fake_redis_node& operator=(const fake_redis_node&) = delete;

    int port() const { return port_; }
    std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
    std::string uri() const { return "redis://" + address(); }

    /// Sets how every later command is answered.
    void on_command(handler h) {
        std::lock_guard lock{mutex_};
        handler_ = std::move(h);
    }

    /// Sends `raw` (RESP) on connection `connection` (numbered as fake_command::connection)
    /// within about 20 ms, as a server pushes a pub/sub message; dropped if it closed.
    void push(int connection, std::string raw) {
        std::lock_guard lock{mutex_};
        pushes_.emplace_back(connection, std::move(raw));
    }

    /// Every command received so far, in order.
    std::vector<fake_command> received() const {
        std::lock_guard lock{mutex_};
        return log_;
    }

    /// Commands received so far whose name is `name`.
    std::vector<fake_command> received(const std::string& name) const {
        std::vector<fake_command> out;
        for (auto& c : received()) {
            if (!c.argv.empty() && c.argv[0] == name) {
                out.push_back(c);
            }
        }
        return out;
    }

private:
    void accept_loop() {
        int next_id = 1;
        while (!stopping_) {
            pollfd pfd{listen_fd_.get(), POLLIN, 0};
            if (::poll(&pfd, 1, 20) <= 0) {
                continue;
            }
            const int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
            if (fd < 0) {
                continue;
            }
            std::lock_guard lock{mutex_};
            workers_.emplace_back([this, fd, id = next_id++] { serve(detail::unique_fd{fd}, id); });
        }
    }

    // Reads one RESP array of bulk strings from `buffer`; std::nullopt when incomplete.
    static std::optional<std::vector<std::string>> parse(std::string& buffer) {
        std::size_t at = 0;
        const auto line = [&]() -> std::optional<std::string> {
            const auto end = buffer.find("\r\n", at);
            if (end == std::string::npos) {
                return std::nullopt;
            }
            std::string text = buffer.substr(at, end - at);
            at = end + 2;
            return text;
        };
        const auto head = line();
        if (!head || head->empty() || (*head)[0] != '*') {
            return std::nullopt;
        }
        const int count = std::stoi(head->substr(1));
        std::vector<std::string> argv;
        for (int i = 0; i < count; ++i) {
            const auto size_line = line();
            if (!size_line) {
                return std::nullopt;
            }
            const auto size = static_cast<std::size_t>(std::stoll(size_line->substr(1)));
            if (buffer.size() < at + size + 2) {
                return std::nullopt;
            }
            argv.push_back(buffer.substr(at, size));
            at += size + 2;
        }
        buffer.erase(0, at);
        return argv;
    }

    void serve(detail::unique_fd fd, int id) {
        std::string buffer;
        bool asking = false;
        while (!stopping_) {
            while (auto argv = parse(buffer)) {
                fake_command cmd{id, asking, std::move(*argv)};
                asking = !cmd.argv.empty() && cmd.argv[0] == "ASKING";
                std::string answer;
                {
                    std::lock_guard lock{mutex_};
                    log_.push_back(cmd);
                }
                handler h;
                {
                    std::lock_guard lock{mutex_};
                    h = handler_;
                }
                if (asking) {
                    answer = resp::status("OK");
                } else if (h) {
                    answer = h(cmd);
                } else {
                    answer = resp::error("ERR no handler");
                }
                if (answer.empty() || !send_all(fd.get(), answer)) {
                    return;  // the handler asks to drop the connection, or it closed
                }
            }
            std::string pushed;
            {
                std::lock_guard lock{mutex_};
                for (auto it = pushes_.begin(); it != pushes_.end();) {
                    if (it->first == id) {
                        pushed += it->second;
                        it = pushes_.erase(it);
                    } else {
                        ++it;
                    }
                }
            }
            if (!send_all(fd.get(), pushed)) {
                return;
            }
            pollfd pfd{fd.get(), POLLIN, 0};
            if (::poll(&pfd, 1, 20) <= 0) {
                continue;
            }
            char chunk[4096];
            const ssize_t n = ::recv(fd.get(), chunk, sizeof chunk, 0);
            if (n <= 0) {
                return;
            }
            buffer.append(chunk, static_cast<std::size_t>(n));
        }
    }

    static bool send_all(int fd, const std::string& data) {
        std::size_t sent = 0;
        while (sent < data.size()) {
            const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
            if (n <= 0) {
                return false;
            }
            sent += static_cast<std::size_t>(n);
        }
        return true;
    }

    detail::unique_fd listen_fd_;
    int port_ = 0;
    std::atomic<bool> stopping_{false};
    std::thread acceptor_;
    mutable std::mutex mutex_;
    std::vector<std::thread> workers_;
    handler handler_;
    std::vector<fake_command> log_;
    std::vector<std::pair<int, std::string>> pushes_;
};

}  // namespace redislock::test
