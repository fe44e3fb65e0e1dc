#include <redislock/hiredis.hpp>

#include <gtest/gtest.h>

#include <poll.h>

#include <array>
#include <atomic>
#include <chrono>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/deadline.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::command;
using redislock::hiredis_connection;
using redislock::reply;
using redislock::test::redis_server;
using redislock::test::run_to_end;
using redislock::test::stop_after;
using redislock::test::stopwatch;
using redislock::test::with_query;

// Sends one command given as a list of words.
reply run(hiredis_connection& conn, std::initializer_list<std::string_view> words) {
    const std::vector<std::string_view> argv{words};
    return conn.execute(argv);
}

TEST(HiredisConnection, ConvertsEveryReplyKind) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};

    EXPECT_EQ(run(conn, {"SET", "k", "v"}), reply::status("OK"));
    EXPECT_EQ(run(conn, {"GET", "k"}), reply::string("v"));
    EXPECT_EQ(run(conn, {"GET", "missing"}), reply::nil());
    EXPECT_EQ(run(conn, {"INCR", "n"}), reply::integer(1));
    const reply err = run(conn, {"INCR", "k"});
    ASSERT_TRUE(err.is_error());
    EXPECT_TRUE(err.is_error_code("ERR")) << err.text();
    EXPECT_EQ(run(conn, {"EVAL", "return {1, 'a', {2, false}}", "0"}),
              reply::array({reply::integer(1), reply::string("a"),
                            reply::array({reply::integer(2), reply::nil()})}));
}

TEST(HiredisConnection, ArgumentsAndValuesAreBinarySafe) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    const std::string key{"k\0ey\r\n", 6};
    const std::string value{"a\0b\r\nc", 6};
    EXPECT_EQ(run(conn, {"SET", key, value}), reply::status("OK"));
    EXPECT_EQ(run(conn, {"GET", key}), reply::string(value));
    EXPECT_EQ(run(conn, {"STRLEN", key}), reply::integer(6));
}

TEST(HiredisConnection, CommandsWithManyArgumentsAreSentWhole) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    // More arguments than the on-stack argv buffer holds.
    std::vector<std::string> values;
    for (int i = 0; i < 40; ++i) {
        values.push_back("v" + std::to_string(i));
    }
    std::vector<std::string_view> argv{"RPUSH", "list"};
    argv.insert(argv.end(), values.begin(), values.end());
    EXPECT_EQ(conn.execute(argv), reply::integer(40));

    const reply all = run(conn, {"LRANGE", "list", "0", "-1"});
    ASSERT_EQ(all.elements().size(), 40U);
    for (std::size_t i = 0; i < values.size(); ++i) {
        EXPECT_EQ(all.elements()[i].text(), values[i]);
    }
}

TEST(HiredisConnection, PipelineReturnsOneReplyPerCommandInOrder) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};

    const std::array<std::string_view, 3> set{"SET", "p", "10"};
    const std::array<std::string_view, 2> incr{"INCR", "p"};
    const std::array<std::string_view, 2> get{"GET", "p"};
    const std::array<std::string_view, 2> bad{"NOSUCHCOMMAND", "x"};
    const std::array<std::string_view, 2> missing{"GET", "nothing"};
    const std::vector<command> batch{set, incr, get, bad, missing, incr};
    const std::vector<reply> replies = conn.execute_pipeline(batch);

    ASSERT_EQ(replies.size(), batch.size());
    EXPECT_EQ(replies[0], reply::status("OK"));
    EXPECT_EQ(replies[1], reply::integer(11));
    EXPECT_EQ(replies[2], reply::string("11"));
    EXPECT_TRUE(replies[3].is_error());
    EXPECT_TRUE(replies[4].is_nil());
    EXPECT_EQ(replies[5], reply::integer(12));
    // The connection is still in step afterwards.
    EXPECT_EQ(run(conn, {"GET", "p"}), reply::string("12"));
}

TEST(HiredisConnection, LongPipelineKeepsItsOrder) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    constexpr int count = 500;
    std::vector<std::array<std::string_view, 2>> words(count, {"INCR", "ordered"});
    std::vector<command> batch(words.begin(), words.end());
    const std::vector<reply> replies = conn.execute_pipeline(batch);
    ASSERT_EQ(replies.size(), static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) {
        EXPECT_EQ(replies[static_cast<std::size_t>(i)], reply::integer(i + 1));
    }
}

TEST(HiredisConnection, EmptyPipelineSendsNothing) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    const auto opened = conn.connections_opened();
    EXPECT_TRUE(conn.execute_pipeline({}).empty());
    EXPECT_EQ(conn.connections_opened(), opened);
}

TEST(HiredisConnection, PasswordIsSentWithAuth) {
    redis_server srv{{.extra_args = {"--requirepass", "s3cret"}}};
    hiredis_connection conn{"redis://:s3cret@127.0.0.1:" + std::to_string(srv.port())};
    EXPECT_EQ(run(conn, {"SET", "k", "v"}), reply::status("OK"));
    EXPECT_EQ(srv.cli({"GET", "k"}), "v");
}

TEST(HiredisConnection, PasswordInTheQueryIsSentWithAuth) {
    redis_server srv{{.extra_args = {"--requirepass", "p w"}}};
    hiredis_connection conn{with_query(srv, "password=p%20w")};
    EXPECT_EQ(run(conn, {"PING"}), reply::status("PONG"));
}

TEST(HiredisConnection, WrongPasswordFailsWithServerError) {
    redis_server srv{{.extra_args = {"--requirepass", "s3cret"}}};
    try {
        hiredis_connection conn{"redis://:wrong@127.0.0.1:" + std::to_string(srv.port())};
        FAIL() << "AUTH with a wrong password must fail";
    } catch (const redislock::server_error& e) {
        EXPECT_NE(std::string{e.what()}.find("AUTH"), std::string::npos) << e.what();
    }
}

TEST(HiredisConnection, MissingPasswordGivesNoauthErrorReplies) {
    redis_server srv{{.extra_args = {"--requirepass", "s3cret"}}};
    hiredis_connection conn{srv.uri()};
    EXPECT_TRUE(run(conn, {"GET", "k"}).is_error_code("NOAUTH"));
}

TEST(HiredisConnection, AclUserAndPasswordAreSentWithAuth) {
    redis_server srv;
    ASSERT_EQ(srv.cli({"ACL", "SETUSER", "alice", "on", ">p@ss:w/rd", "~*", "&*", "+@all"}), "OK");
    hiredis_connection conn{"redis://alice:p%40ss%3Aw%2Frd@127.0.0.1:" +
                            std::to_string(srv.port())};
    EXPECT_EQ(run(conn, {"ACL", "WHOAMI"}), reply::string("alice"));
}

TEST(HiredisConnection, AclUserWithWrongPasswordFailsWithServerError) {
    redis_server srv;
    ASSERT_EQ(srv.cli({"ACL", "SETUSER", "alice", "on", ">right", "~*", "+@all"}), "OK");
    try {
        hiredis_connection conn{"redis://alice:wrong@127.0.0.1:" + std::to_string(srv.port())};
        FAIL() << "AUTH with a wrong password must fail";
    } catch (const redislock::server_error& e) {
        EXPECT_NE(std::string{e.what()}.find("WRONGPASS"), std::string::npos) << e.what();
    }
}

TEST(HiredisConnection, DbInThePathIsSelected) {
    redis_server srv;
    hiredis_connection conn{srv.uri() + "/3"};
    EXPECT_EQ(run(conn, {"SET", "in3", "yes"}), reply::status("OK"));
    EXPECT_EQ(srv.cli({"-n", "3", "GET", "in3"}), "yes");
    EXPECT_EQ(srv.cli({"-n", "0", "GET", "in3"}), "");
}

TEST(HiredisConnection, DbIsSelectedOnEveryNewConnection) {
    redis_server srv;
    hiredis_connection conn{srv.uri() + "/3"};
    ASSERT_EQ(run(conn, {"SET", "before", "1"}), reply::status("OK"));
    ASSERT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");
    EXPECT_EQ(run(conn, {"SET", "after", "1"}), reply::status("OK"));
    EXPECT_EQ(srv.cli({"-n", "3", "EXISTS", "before", "after"}), "2");
}

TEST(HiredisConnection, DbOutOfRangeFailsWithServerError) {
    redis_server srv;
    try {
        hiredis_connection conn{srv.uri() + "/99"};
        FAIL() << "SELECT 99 must be refused with 16 databases";
    } catch (const redislock::server_error& e) {
        EXPECT_NE(std::string{e.what()}.find("SELECT"), std::string::npos) << e.what();
    }
}

TEST(HiredisConnection, UnixSocketUriWorks) {
    redis_server srv{{.unix_socket = true}};
    hiredis_connection conn{srv.unix_uri()};
    EXPECT_EQ(run(conn, {"SET", "via", "unix"}), reply::status("OK"));
    EXPECT_EQ(srv.cli({"GET", "via"}), "unix");
    EXPECT_EQ(conn.config().unix_socket, srv.unix_path());
}

TEST(HiredisConnection, MissingUnixSocketFailsWithConnectionError) {
    redis_server srv{{.unix_socket = true}};
    EXPECT_THROW(hiredis_connection{"unix://" + srv.dir() + "/absent.sock"},
                 redislock::connection_error);
}

TEST(HiredisConnection, PoolSizeBoundsTheOpenConnections) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "pool_size=2")};
    constexpr int threads = 8;
    constexpr int calls = 3;
    std::atomic<int> nil_replies{0};
    std::atomic<int> failures{0};
    {
        std::vector<std::jthread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&] {
                for (int i = 0; i < calls; ++i) {
                    try {
                        // Holds its connection for 50 ms on the server, so threads overlap.
                        if (run(conn, {"BLPOP", "empty", "0.05"}).is_nil()) {
                            ++nil_replies;
                        }
                    } catch (const redislock::error&) {
                        ++failures;
                    }
                }
            });
        }
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(nil_replies.load(), threads * calls);
    EXPECT_GE(conn.connections_opened(), 1U);
    EXPECT_LE(conn.connections_opened(), 2U);
}

TEST(HiredisConnection, PooledConnectionsAreReusedAcrossThreads) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "pool_size=4")};
    constexpr int threads = 8;
    constexpr int calls = 100;
    {
        std::vector<std::jthread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&] {
                for (int i = 0; i < calls; ++i) {
                    (void)run(conn, {"INCR", "shared"});
                }
            });
        }
    }
    EXPECT_EQ(srv.cli({"GET", "shared"}), std::to_string(threads * calls));
    EXPECT_LE(conn.connections_opened(), 4U);
}

TEST(HiredisConnection, CommandToPausedServerTimesOutThenRecoversAfterResume) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "command_timeout=300&connect_timeout=300")};
    ASSERT_EQ(run(conn, {"PING"}), reply::status("PONG"));

    srv.pause();
    const stopwatch watch;
    EXPECT_THROW(run(conn, {"PING"}), redislock::timeout_error);
    EXPECT_LT(watch.elapsed(), 5s);
    srv.resume();

    EXPECT_EQ(run(conn, {"PING"}), reply::status("PONG"));
}

TEST(HiredisConnection, TimedOutConnectionIsNotReusedForTheNextReply) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "command_timeout=300&pool_size=1")};
    ASSERT_EQ(run(conn, {"SET", "a", "value-of-a"}), reply::status("OK"));
    ASSERT_EQ(run(conn, {"SET", "b", "value-of-b"}), reply::status("OK"));

    srv.pause();
    EXPECT_THROW(run(conn, {"GET", "a"}), redislock::timeout_error);
    srv.resume();

    // A reused connection would read the late reply to GET a here.
    EXPECT_EQ(run(conn, {"GET", "b"}), reply::string("value-of-b"));
}

TEST(HiredisConnection, PipelineToPausedServerTimesOut) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "command_timeout=300")};
    const std::array<std::string_view, 1> ping{"PING"};
    const std::array<command, 2> batch{command{ping}, command{ping}};
    srv.pause();
    const stopwatch watch;
    EXPECT_THROW(conn.execute_pipeline(batch), redislock::timeout_error);
    EXPECT_LT(watch.elapsed(), 5s);
    srv.resume();
    EXPECT_EQ(conn.execute_pipeline(batch).size(), 2U);
}

// Polls a started call until it ended or `timeout` passed; true when it ended.
bool wait_for(hiredis_connection::call& c, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
        pollfd pfd{c.fd(), POLLIN, 0};
        if ((::poll(&pfd, 1, 10) > 0 || c.buffered()) && c.read()) {
            return true;
        }
    }
    return false;
}

TEST(HiredisConnection, StartedBatchIsReadAfterPollAndItsContextGoesBackToThePool) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "pool_size=1&command_timeout=300")};
    const std::array<std::string_view, 3> set{"SET", "a", "1"};
    const std::array<std::string_view, 2> get{"GET", "a"};
    const std::array<command, 2> batch{command{set}, command{get}};
    auto c = conn.start(batch, redislock::call_context{});
    ASSERT_GE(c.fd(), 0);
    ASSERT_TRUE(wait_for(c, 2s));
    EXPECT_EQ(c.take(), (std::vector<reply>{reply::status("OK"), reply::string("1")}));
    EXPECT_EQ(c.fd(), -1);
    // The one context of the pool is free again: the next call does not wait for a slot.
    EXPECT_EQ(run(conn, {"PING"}), reply::status("PONG"));
}

TEST(HiredisConnection, AbandonedCallClosesItsContextSoItsLateReplyIsNeverRead) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "pool_size=1&command_timeout=300")};
    ASSERT_EQ(run(conn, {"SET", "a", "value-of-a"}), reply::status("OK"));
    ASSERT_EQ(run(conn, {"SET", "b", "value-of-b"}), reply::status("OK"));
    const std::array<std::string_view, 2> get{"GET", "a"};
    const std::array<command, 1> batch{command{get}};
    srv.pause();
    {
        auto c = conn.start(batch, redislock::call_context{});
        EXPECT_FALSE(wait_for(c, 100ms));
    }
    srv.resume();
    // A reused context would read the late reply to GET a here.
    EXPECT_EQ(run(conn, {"GET", "b"}), reply::string("value-of-b"));
}

// start_if_connected() sends only on a connection already open and free, and never waits:
// with the pool's one connection in use, or closed by the server, it sends nothing; connect()
// opens one (reporting it as a reconnection when it replaces a broken one), which it then uses.
TEST(HiredisConnection, StartIfConnectedSendsOnlyOnAnOpenFreeConnection) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "pool_size=1&command_timeout=2000")};
    int reconnections = 0;
    conn.set_reconnect_handler([&](std::string_view) { ++reconnections; });
    const std::array<std::string_view, 2> incr{"INCR", "sent"};
    const std::array<command, 1> batch{command{incr}};
    const redislock::call_context how{.deadline = std::chrono::steady_clock::now() + 5s};
    {
        auto holding = conn.start(batch, how);  // the pool's only connection
        stopwatch watch;
        EXPECT_FALSE(conn.start_if_connected(batch, how).has_value());
        EXPECT_LT(watch.elapsed(), 100ms);
        ASSERT_TRUE(wait_for(holding, 2s));
        EXPECT_EQ(holding.take().at(0), reply::integer(1));
    }
    {
        auto started = conn.start_if_connected(batch, how);
        ASSERT_TRUE(started.has_value());
        ASSERT_TRUE(wait_for(*started, 2s));
        EXPECT_EQ(started->take().at(0), reply::integer(2));
    }
    EXPECT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");
    std::this_thread::sleep_for(20ms);  // past the idle check's millisecond
    const auto opened = conn.connections_opened();
    EXPECT_FALSE(conn.start_if_connected(batch, how).has_value());
    EXPECT_EQ(conn.connections_opened(), opened);
    conn.connect(how);
    EXPECT_EQ(conn.connections_opened(), opened + 1);
    EXPECT_EQ(reconnections, 1);
    auto started = conn.start_if_connected(batch, how);
    ASSERT_TRUE(started.has_value());
    ASSERT_TRUE(wait_for(*started, 2s));
    EXPECT_EQ(started->take().at(0), reply::integer(3));  // nothing was sent meanwhile
    EXPECT_EQ(reconnections, 1);
}

TEST(HiredisConnection, StartedCallToAServerThatGoesAwayFailsThroughTake) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "command_timeout=300")};
    const std::array<std::string_view, 3> block{"BLPOP", "nothing", "0"};
    const std::array<command, 1> batch{command{block}};
    auto c = conn.start(batch, redislock::call_context{});
    srv.stop();
    ASSERT_TRUE(wait_for(c, 2s));
    EXPECT_THROW((void)c.take(), redislock::connection_error);
}

TEST(HiredisConnection, ClosedPortFailsWithConnectionError) {
    const redislock::test::refused_port closed;
    const stopwatch watch;
    try {
        hiredis_connection conn{closed.uri()};
        FAIL() << "connecting to a closed port must fail";
    } catch (const redislock::timeout_error& e) {
        FAIL() << "a refused connection is not a timeout: " << e.what();
    } catch (const redislock::connection_error& e) {
        const std::string where = "127.0.0.1:" + std::to_string(closed.port());
        EXPECT_NE(std::string{e.what()}.find(where), std::string::npos) << e.what();
    }
    EXPECT_LT(watch.elapsed(), 5s);
}

TEST(HiredisConnection, TimeoutsBelowOneMillisecondAreRefused) {
    redislock::endpoint ep;
    ep.port = redislock::test::refused_port{}.port();  // never reached: refused before connecting
    ep.command_timeout = 0ms;
    EXPECT_THROW(hiredis_connection{ep}, redislock::invalid_argument);
    ep.command_timeout = 2000ms;
    ep.connect_timeout = 0ms;
    EXPECT_THROW(hiredis_connection{ep}, redislock::invalid_argument);
}

// A timeout beyond a year is a mistake (or a way to say "never"), and its arithmetic could
// overflow: refused by the constructor, naming the setting and the range.
TEST(HiredisConnection, TimeoutsAboveAYearAreRefused) {
    redislock::endpoint ep;
    ep.port = redislock::test::refused_port{}.port();  // never reached: refused before connecting
    const auto refusal = [&] {
        return redislock::test::refusal_of([&] { return hiredis_connection{ep}; });
    };
    ep.command_timeout = std::chrono::milliseconds::max();
    EXPECT_NE(refusal().find("command_timeout"), std::string::npos) << refusal();
    EXPECT_NE(refusal().find("31536000000 ms"), std::string::npos) << refusal();
    ep.command_timeout = 24h * 365 + 1ms;
    EXPECT_NE(refusal().find("command_timeout"), std::string::npos) << refusal();
    ep.command_timeout = 2s;
    ep.connect_timeout = std::chrono::milliseconds::max();
    EXPECT_NE(refusal().find("connect_timeout"), std::string::npos) << refusal();
    ep.connect_timeout = 24h * 365 + 1ms;
    EXPECT_NE(refusal().find("connect_timeout"), std::string::npos) << refusal();
    EXPECT_THROW(hiredis_connection{"redis://127.0.0.1:" + std::to_string(ep.port) +
                                    "?command_timeout=9223372036854775807"},
                 redislock::invalid_argument);
}

TEST(HiredisConnection, TimeoutsOfAYearWork) {
    redis_server srv;
    hiredis_connection conn{
        with_query(srv, "command_timeout=31536000000&connect_timeout=31536000000")};
    EXPECT_EQ(run(conn, {"PING"}), reply::status("PONG"));
    const std::array<std::string_view, 1> ping{"PING"};
    EXPECT_EQ(conn.execute(ping, {{}, std::chrono::steady_clock::now() + 1s}),
              reply::status("PONG"));
}

// Opens `srv`'s connection `conn` anew at its next call (the server closes the idle ones), and
// stops the server, so that the set-up commands of that connection (AUTH, SELECT) get no answer.
void next_connection_set_up_hangs(redis_server& srv) {
    ASSERT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");
    srv.pause();
}

// Opening a connection inside a timed call ends by the call's deadline: AUTH and SELECT to a
// server that stopped answering get the time the call has left, not the command timeout.
TEST(HiredisConnection, ConnectionSetUpEndsByTheCallsDeadline) {
    const std::array<std::string_view, 1> ping{"PING"};
    for (const std::string_view setup : {"AUTH", "SELECT"}) {
        SCOPED_TRACE(setup);
        redis_server srv{setup == "AUTH"
                             ? redis_server::options{.extra_args = {"--requirepass", "pw"}}
                             : redis_server::options{}};
        hiredis_connection conn{setup == "AUTH"
                                    ? "redis://:pw@127.0.0.1:" + std::to_string(srv.port())
                                    : srv.uri() + "/3"};
        ASSERT_EQ(conn.execute(ping), reply::status("PONG"));
        next_connection_set_up_hangs(srv);
        const auto deadline = std::chrono::steady_clock::now() + 50ms;
        const auto end = run_to_end([&] { (void)conn.execute(ping, {{}, deadline}); });
        srv.resume();
        EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
        EXPECT_NE(end.how.find("timeout_error"), std::string::npos) << end.how;
        EXPECT_EQ(conn.execute(ping), reply::status("PONG"));
    }
}

// A stop request ends the opening of a connection at once.
TEST(HiredisConnection, StopRequestEndsConnectionSetUpAtOnce) {
    const std::array<std::string_view, 1> ping{"PING"};
    redis_server srv{{.extra_args = {"--requirepass", "pw"}}};
    hiredis_connection conn{"redis://:pw@127.0.0.1:" + std::to_string(srv.port())};
    ASSERT_EQ(conn.execute(ping), reply::status("PONG"));
    next_connection_set_up_hangs(srv);
    stop_after stop{100ms};
    const auto end = run_to_end([&] { (void)conn.execute(ping, {.stop = &stop.token()}); });
    srv.resume();
    const auto requested = stop.requested_at();
    EXPECT_TRUE(end.by(requested)) << end.late_after(requested) << end.how;
    EXPECT_NE(end.how.find("cancelled_error"), std::string::npos) << end.how;
    EXPECT_EQ(conn.execute(ping), reply::status("PONG"));
}

// A call whose deadline is the command timeout is ended by it when the server does not answer,
// and the connection is not reused for the late reply.
TEST(HiredisConnection, CallBoundedByTheCommandTimeoutEndsOnAPausedServer) {
    redis_server srv;
    hiredis_connection conn{srv.uri() + "?command_timeout=300"};
    const std::array<std::string_view, 1> ping{"PING"};
    const redislock::call_context how{{}, std::chrono::steady_clock::now() + 300ms};
    EXPECT_EQ(conn.execute(ping, how), reply::status("PONG"));
    srv.pause();
    const stopwatch watch;
    EXPECT_THROW(conn.execute(ping, {{}, std::chrono::steady_clock::now() + 300ms}),
                 redislock::timeout_error);
    EXPECT_LT(watch.elapsed(), 2s);
    srv.resume();
    EXPECT_EQ(conn.execute(ping, {{}, std::chrono::steady_clock::now() + 300ms}),
              reply::status("PONG"));
}

// The socket's receive timeout, even fired late (rounded up to ticks, 8/63 late plus a tick),
// ends before the command timeout, and a call reads blocking only with more than that left.
TEST(HiredisConnection, SocketTimeoutEndsWithinTheCommandTimeout) {
    using redislock::detail::blocking_read_floor;
    using redislock::detail::socket_timeout;
    for (const auto timeout : {80ms, 81ms, 100ms, 300ms, 1000ms, 2000ms, 60000ms, 3600000ms}) {
        const auto st = socket_timeout(timeout);
        // At 100 ticks a second: rounded up to a tick, 8/63 late, one tick more.
        const auto ticks = (st.count() + 9) / 10;
        const auto latest = std::chrono::milliseconds{(ticks + (ticks * 8 + 62) / 63 + 1) * 10};
        EXPECT_LT(latest, timeout) << timeout.count();
        EXPECT_GE(blocking_read_floor(timeout), latest) << timeout.count();
        EXPECT_LT(blocking_read_floor(timeout), timeout) << timeout.count();
        EXPECT_GT(st, timeout / 3) << timeout.count();
    }
    for (const auto timeout : {1ms, 10ms, 79ms}) {
        EXPECT_EQ(socket_timeout(timeout), timeout);
        EXPECT_GT(blocking_read_floor(timeout), timeout);  // never reads blocking
    }
}

// A reply that comes after the socket's receive timeout but within the command timeout is read:
// the blocking read that timed out hands over to the polled wait for the rest.
TEST(HiredisConnection, ReplyAfterTheSocketTimeoutButWithinTheCommandTimeoutIsRead) {
    redis_server srv;
    hiredis_connection conn{srv.uri() + "?command_timeout=2000"};
    ASSERT_LT(redislock::detail::socket_timeout(2000ms), 1750ms);  // 1715 ms
    // Busy for 1.85 s inside the server, then answers.
    const std::string_view busy =
        "local t = redis.call('TIME') local from = t[1] * 1000000 + t[2] "
        "repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - from >= tonumber(ARGV[1]) "
        "return 1";
    const stopwatch watch;
    EXPECT_EQ(run(conn, {"EVAL", busy, "0", "1850000"}), reply::integer(1));
    EXPECT_GE(watch.elapsed(), 1850ms);
    EXPECT_EQ(run(conn, {"PING"}), reply::status("PONG"));
}

// A call that reads blocking is still ended by the command timeout, not by the earlier socket
// timeout, and reports a timeout.
TEST(HiredisConnection, BlockingReadEndsAtTheCommandTimeoutOnAPausedServer) {
    redis_server srv;
    hiredis_connection conn{srv.uri() + "?command_timeout=1000"};
    ASSERT_EQ(run(conn, {"PING"}), reply::status("PONG"));
    srv.pause();
    const stopwatch watch;
    EXPECT_THROW(run(conn, {"PING"}), redislock::timeout_error);
    const auto took = watch.elapsed();
    srv.resume();
    EXPECT_GE(took, 1000ms);
    EXPECT_LT(took, 3s);
    EXPECT_EQ(run(conn, {"PING"}), reply::status("PONG"));
}

// A call given a far deadline (or a stop token) is still bounded by the command timeout as a
// whole, its wait for a free connection included.
TEST(HiredisConnection, TimedCallWaitsForAFreeConnectionNoLongerThanTheCommandTimeout) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "pool_size=1&command_timeout=300&connect_timeout=300")};
    const std::array<std::string_view, 1> ping{"PING"};
    const std::array<command, 1> batch{command{ping}};
    auto holding = conn.start(batch, redislock::call_context{});  // the pool's only connection
    std::stop_source source;
    const std::stop_token stop = source.get_token();
    for (const redislock::call_context how :
         {redislock::call_context{{}, std::chrono::steady_clock::now() + 10s},
          redislock::call_context{{}, std::chrono::steady_clock::time_point::max(), &stop}}) {
        const stopwatch watch;
        EXPECT_THROW(conn.execute(ping, how), redislock::timeout_error);
        EXPECT_LT(watch.elapsed(), 550ms);  // 300 ms, where connect + command would be 600 ms
    }
}

TEST(HiredisConnection, ConnectThatGetsNoAnswerTimesOutAfterTheConnectTimeout) {
    const redislock::test::unresponsive_listener silent;
    const stopwatch watch;
    EXPECT_THROW(hiredis_connection{silent.uri() + "?connect_timeout=300"},
                 redislock::timeout_error);
    EXPECT_GE(watch.elapsed(), 250ms);
    EXPECT_LT(watch.elapsed(), 5s);
}

TEST(HiredisConnection, ReconnectsAfterClientKill) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(run(conn, {"SET", "k", "v"}), reply::status("OK"));
    const auto opened = conn.connections_opened();

    EXPECT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");

    EXPECT_EQ(run(conn, {"GET", "k"}), reply::string("v"));
    EXPECT_EQ(conn.connections_opened(), opened + 1);
}

// Sets a reconnect handler that sends PING through `conn` itself and keeps each answer (or the
// error it threw) in `answers`.
void ping_from_reconnect_handler(hiredis_connection& conn, std::vector<reply>& answers) {
    conn.set_reconnect_handler([&conn, &answers](std::string_view) {
        try {
            answers.push_back(run(conn, {"PING"}));
        } catch (const redislock::error& e) {
            answers.push_back(reply::error(e.what()));
        }
    });
}

// The reconnect handler is told as the call that reconnected ends, once its connection is back
// in the pool: with pool_size 1, a handler that sends a command of its own gets the connection
// at once (plain and bounded calls, and a pipeline) rather than waiting for the caller's.
TEST(HiredisConnection, ReconnectHandlerMayUseTheConnectionWithPoolSizeOne) {
    redis_server srv;
    hiredis_connection conn{
        with_query(srv, "pool_size=1&connect_timeout=2000&command_timeout=2000")};
    std::vector<reply> answers;
    ping_from_reconnect_handler(conn, answers);
    const auto kill_and_wait = [&] {
        EXPECT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");
        std::this_thread::sleep_for(20ms);  // past the idle check's millisecond
    };
    ASSERT_EQ(run(conn, {"SET", "k", "v"}), reply::status("OK"));

    kill_and_wait();
    stopwatch watch;
    EXPECT_EQ(run(conn, {"GET", "k"}), reply::string("v"));
    kill_and_wait();
    const std::array<std::string_view, 2> get{"GET", "k"};
    EXPECT_EQ(conn.execute(get, {.deadline = std::chrono::steady_clock::now() + 5s}),
              reply::string("v"));
    kill_and_wait();
    const std::array<command, 1> batch{command{get}};
    EXPECT_EQ(conn.execute_pipeline(batch).at(0), reply::string("v"));
    EXPECT_LT(watch.elapsed(), 1500ms) << "a handler waited for the caller's connection";
    ASSERT_EQ(answers.size(), 3U);
    for (const reply& answer : answers) {
        EXPECT_EQ(answer, reply::status("PONG"));
    }
}

// A call made by start() that reconnected tells the handler as it ends (here: its reply read),
// not while it still holds its connection: with pool_size 1 the handler's own command gets the
// connection at once.
TEST(HiredisConnection, ReconnectHandlerIsToldWhenAStartedCallEnds) {
    redis_server srv;
    hiredis_connection conn{
        with_query(srv, "pool_size=1&connect_timeout=2000&command_timeout=2000")};
    std::vector<reply> answers;
    ping_from_reconnect_handler(conn, answers);
    ASSERT_EQ(run(conn, {"SET", "k", "v"}), reply::status("OK"));
    EXPECT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");
    std::this_thread::sleep_for(20ms);  // past the idle check's millisecond

    const std::array<std::string_view, 2> get{"GET", "k"};
    const std::array<command, 1> batch{command{get}};
    auto started = conn.start(batch, {.deadline = std::chrono::steady_clock::now() + 5s});
    EXPECT_TRUE(answers.empty()) << "told while the call still held the connection";
    stopwatch watch;
    while (!started.read()) {
    }
    EXPECT_EQ(started.take().at(0), reply::string("v"));
    EXPECT_LT(watch.elapsed(), 1500ms) << "the handler waited for the call's connection";
    ASSERT_EQ(answers.size(), 1U);
    EXPECT_EQ(answers.front(), reply::status("PONG"));
}

TEST(HiredisConnection, ReconnectsAfterServerRestart) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(run(conn, {"SET", "k", "v"}), reply::status("OK"));
    srv.restart();
    EXPECT_EQ(run(conn, {"GET", "k"}), reply::nil());  // the restart dropped the data
    EXPECT_EQ(run(conn, {"SET", "k", "w"}), reply::status("OK"));
}

TEST(HiredisConnection, StoppedServerFailsFastThenWorksOnceStarted) {
    redis_server srv;
    hiredis_connection conn{with_query(srv, "connect_timeout=500")};
    ASSERT_EQ(run(conn, {"PING"}), reply::status("PONG"));
    srv.stop();
    const stopwatch watch;
    EXPECT_THROW(run(conn, {"PING"}), redislock::connection_error);
    EXPECT_LT(watch.elapsed(), 5s);
    srv.start();
    EXPECT_EQ(run(conn, {"PING"}), reply::status("PONG"));
}

TEST(HiredisConnection, MovedConnectionKeepsWorking) {
    redis_server srv;
    hiredis_connection first{srv.uri()};
    hiredis_connection second{std::move(first)};
    EXPECT_EQ(run(second, {"PING"}), reply::status("PONG"));
    hiredis_connection third{srv.uri()};
    third = std::move(second);
    EXPECT_EQ(run(third, {"PING"}), reply::status("PONG"));
}

}  // namespace
