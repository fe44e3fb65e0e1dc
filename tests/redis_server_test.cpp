#include "support/redis_server.hpp"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <optional>
#include <string>

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

}  // namespace
