#include "support/redis_server.hpp"

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using redislock::test::probe_tcp;
using redislock::test::probe_unix;
using redislock::test::redis_server;

std::optional<std::string> ping(const redis_server& server,
                                std::chrono::milliseconds timeout = 2s) {
    return probe_tcp(server.host(), server.port(), {"PING"}, timeout).line;
}

TEST(redis_server, starts_and_answers_ping) {
    redis_server server;
    EXPECT_GT(server.port(), 0);
    EXPECT_GT(server.pid(), 0);
    EXPECT_EQ(server.host(), "127.0.0.1");
    EXPECT_EQ(server.uri(), "redis://127.0.0.1:" + std::to_string(server.port()));
    EXPECT_TRUE(server.unix_path().empty());
    EXPECT_TRUE(server.unix_uri().empty());
    EXPECT_EQ(ping(server), "+PONG");
    EXPECT_EQ(server.cli({"PING"}), "PONG");
}

TEST(redis_server, cli_prints_nil_as_empty_string) {
    redis_server server;
    EXPECT_EQ(server.cli({"SET", "key", "value"}), "OK");
    EXPECT_EQ(server.cli({"GET", "key"}), "value");
    EXPECT_EQ(server.cli({"GET", "missing"}), "");
}

TEST(redis_server, unix_socket_answers) {
    redis_server server(redis_server::options{.unix_socket = true});
    ASSERT_FALSE(server.unix_path().empty());
    EXPECT_TRUE(std::filesystem::is_socket(server.unix_path()));
    EXPECT_EQ(server.unix_uri(), "unix://" + server.unix_path());
    EXPECT_EQ(server.unix_uri().rfind("unix:///", 0), 0U);
    EXPECT_EQ(probe_unix(server.unix_path(), {"PING"}, 2s).line, "+PONG");
    EXPECT_EQ(ping(server), "+PONG");
}

TEST(redis_server, pause_stops_replies_and_resume_restores_them) {
    redis_server server;
    server.pause();
    auto paused = probe_tcp(server.host(), server.port(), {"PING"}, 200ms);
    // The kernel still accepts connections for a stopped process; only the reply is missing.
    EXPECT_TRUE(paused.connected);
    EXPECT_FALSE(paused.line.has_value());
    server.resume();
    EXPECT_EQ(ping(server), "+PONG");
}

TEST(redis_server, restart_loses_data_and_keeps_port) {
    redis_server server(redis_server::options{.unix_socket = true});
    const int port = server.port();
    const pid_t old_pid = server.pid();
    ASSERT_EQ(server.cli({"SET", "key", "value"}), "OK");
    server.restart();
    EXPECT_EQ(server.port(), port);
    EXPECT_NE(server.pid(), old_pid);
    EXPECT_EQ(ping(server), "+PONG");
    EXPECT_EQ(probe_unix(server.unix_path(), {"PING"}, 2s).line, "+PONG");
    EXPECT_EQ(server.cli({"GET", "key"}), "");
}

TEST(redis_server, stopped_port_refuses_connections) {
    redis_server server;
    const pid_t pid = server.pid();
    server.stop();
    EXPECT_EQ(server.pid(), -1);
    EXPECT_FALSE(probe_tcp(server.host(), server.port(), {"PING"}, 500ms).connected);
    EXPECT_EQ(::kill(pid, 0), -1);
    EXPECT_EQ(errno, ESRCH);
    server.stop();
    server.start();
    EXPECT_EQ(ping(server), "+PONG");
}

TEST(redis_server, stop_works_on_a_paused_server) {
    redis_server server;
    server.pause();
    server.stop();
    EXPECT_FALSE(probe_tcp(server.host(), server.port(), {"PING"}, 500ms).connected);
}

TEST(redis_server, two_servers_get_different_ports) {
    redis_server first;
    redis_server second;
    EXPECT_NE(first.port(), second.port());
    ASSERT_EQ(first.cli({"SET", "key", "first"}), "OK");
    EXPECT_EQ(second.cli({"GET", "key"}), "");
    EXPECT_EQ(ping(first), "+PONG");
    EXPECT_EQ(ping(second), "+PONG");
}

TEST(redis_server, password_server_counts_as_up_and_cli_authenticates) {
    redis_server server(redis_server::options{.extra_args = {"--requirepass", "pw"}});
    auto reply = ping(server);
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->rfind("-NOAUTH", 0), 0U) << *reply;
    EXPECT_EQ(server.cli({"PING"}), "PONG");
}

TEST(redis_server, forked_child_does_not_stop_the_server) {
    redis_server server;
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        server.stop();
        server.~redis_server();
        ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    EXPECT_EQ(ping(server), "+PONG");
    EXPECT_TRUE(std::filesystem::exists(server.dir()));
}

TEST(redis_server, destructor_kills_server_and_removes_temp_dir) {
    pid_t pid = -1;
    std::string dir;
    int port = 0;
    {
        redis_server server(redis_server::options{.unix_socket = true});
        pid = server.pid();
        dir = server.dir();
        port = server.port();
        ASSERT_TRUE(std::filesystem::exists(dir));
    }
    EXPECT_EQ(::kill(pid, 0), -1);
    EXPECT_FALSE(std::filesystem::exists(dir));
    EXPECT_FALSE(probe_tcp("127.0.0.1", port, {"PING"}, 500ms).connected);
}

TEST(redis_server, startup_failure_reports_the_log) {
    try {
        redis_server server(redis_server::options{.extra_args = {"--no-such-option", "1"}});
        FAIL() << "expected startup to fail";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("no-such-option"), std::string::npos) << e.what();
    }
}

// A client connection kept open across a fault, apart from the fixture's one-shot probes.
class open_client {
public:
    explicit open_client(const redis_server& server)
        : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<std::uint16_t>(server.port()));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (!fd_ ||
            ::connect(fd_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
            throw std::runtime_error("open_client: cannot connect");
        }
    }

    // The first reply line to `command`, or nullopt when the server closed the connection or
    // did not answer within `timeout`.
    std::optional<std::string> send(const std::vector<std::string>& command,
                                    std::chrono::milliseconds timeout = 2s) {
        const std::string payload = redislock::test::detail::encode_command(command);
        if (::send(fd_.get(), payload.data(), payload.size(), MSG_NOSIGNAL) !=
            static_cast<ssize_t>(payload.size())) {
            return std::nullopt;
        }
        std::string received;
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (received.find("\r\n") == std::string::npos) {
            pollfd pfd{fd_.get(), POLLIN, 0};
            if (::poll(&pfd, 1, redislock::test::detail::remaining_ms(deadline)) != 1) {
                return std::nullopt;
            }
            char buf[256];
            const ssize_t n = ::recv(fd_.get(), buf, sizeof(buf), 0);
            if (n <= 0) {
                return std::nullopt;
            }
            received.append(buf, static_cast<std::size_t>(n));
        }
        return received.substr(0, received.find("\r\n"));
    }

private:
    redislock::test::detail::unique_fd fd_;
};

TEST(redis_server, kill_and_restart_empty_keeps_the_port_and_forgets_data_and_scripts) {
    redis_server server;
    const int port = server.port();
    const pid_t old_pid = server.pid();
    ASSERT_EQ(server.cli({"SET", "key", "value"}), "OK");
    const std::string sha1 = server.cli({"SCRIPT", "LOAD", "return 1"});
    open_client client(server);
    ASSERT_EQ(client.send({"PING"}), "+PONG");

    server.kill_and_restart_empty();
    EXPECT_EQ(server.port(), port);
    EXPECT_NE(server.pid(), old_pid);
    EXPECT_EQ(::kill(old_pid, 0), -1);
    EXPECT_EQ(server.cli({"DBSIZE"}), "0");
    EXPECT_EQ(server.cli({"SCRIPT", "EXISTS", sha1}), "0");
    EXPECT_EQ(client.send({"PING"}), std::nullopt);
}

TEST(redis_server, flushall_removes_every_key_of_every_db) {
    redis_server server;
    ASSERT_EQ(server.cli({"SET", "a", "1"}), "OK");
    ASSERT_EQ(server.cli({"-n", "3", "SET", "b", "2"}), "OK");
    server.flushall();
    EXPECT_EQ(server.cli({"DBSIZE"}), "0");
    EXPECT_EQ(server.cli({"-n", "3", "DBSIZE"}), "0");
}

TEST(redis_server, script_flush_makes_evalsha_answer_noscript) {
    redis_server server;
    const std::string sha1 = server.cli({"SCRIPT", "LOAD", "return 1"});
    ASSERT_EQ(server.cli({"SCRIPT", "EXISTS", sha1}), "1");
    server.script_flush();
    EXPECT_EQ(server.cli({"SCRIPT", "EXISTS", sha1}), "0");
    const auto reply = probe_tcp(server.host(), server.port(), {"EVALSHA", sha1, "0"}, 2s);
    ASSERT_TRUE(reply.line);
    EXPECT_EQ(reply.line->rfind("-NOSCRIPT", 0), 0U) << *reply.line;
}

TEST(redis_server, client_kill_all_closes_other_connections_and_the_server_stays_up) {
    redis_server server;
    open_client first(server);
    open_client second(server);
    ASSERT_EQ(first.send({"PING"}), "+PONG");
    ASSERT_EQ(second.send({"PING"}), "+PONG");
    EXPECT_EQ(server.client_kill_all(), 2);
    EXPECT_EQ(first.send({"PING"}), std::nullopt);
    EXPECT_EQ(second.send({"PING"}), std::nullopt);
    EXPECT_EQ(ping(server), "+PONG");
}

TEST(redis_server, client_pause_holds_commands_for_its_duration) {
    redis_server server;
    open_client client(server);
    ASSERT_EQ(client.send({"PING"}), "+PONG");
    server.client_pause(300ms);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(client.send({"SET", "k", "v"}), "+OK");
    const auto waited = std::chrono::steady_clock::now() - start;
    EXPECT_GE(waited, 200ms);
    EXPECT_LT(waited, 2s);
}

TEST(redis_server, maxmemory_noeviction_refuses_writes_once_full_and_allows_deletes) {
    redis_server server;
    const int written = server.fill_memory_until_oom();
    EXPECT_GT(written, 0);
    EXPECT_EQ(server.cli({"CONFIG", "GET", "maxmemory-policy"}), "maxmemory-policy\nnoeviction");
    const auto refused = probe_tcp(server.host(), server.port(), {"SET", "more", "x"}, 2s);
    ASSERT_TRUE(refused.line);
    EXPECT_EQ(refused.line->rfind("-OOM", 0), 0U) << *refused.line;
    // Every key written before the OOM is still there: nothing was evicted.
    EXPECT_EQ(server.cli({"DBSIZE"}), std::to_string(written));
    const auto deleted = probe_tcp(server.host(), server.port(), {"DEL", "oom-filler:0"}, 2s);
    EXPECT_EQ(deleted.line, ":1");
}

}  // namespace
