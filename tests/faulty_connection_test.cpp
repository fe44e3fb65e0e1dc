#include "support/faulty_connection.hpp"

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <initializer_list>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::call_context;
using redislock::hiredis_connection;
using redislock::reply;
using redislock::test::fault_action;
using redislock::test::fault_rule;
using redislock::test::redis_server;
using redislock::test::stopwatch;
using faulty = redislock::test::faulty_connection<hiredis_connection>;

// A connection with execute(argv) alone, to check that the wrapper offers no more than it wraps.
struct execute_only {
    explicit execute_only(std::string_view uri) : inner{uri} {}
    reply execute(redislock::command argv) { return inner.execute(argv); }
    hiredis_connection inner;
};

static_assert(redislock::connection<faulty>);
static_assert(redislock::contextual_connection<faulty>);
static_assert(redislock::pipelining_connection<faulty>);
static_assert(redislock::contextual_pipelining_connection<faulty>);
static_assert(std::copy_constructible<faulty>);
using faulty_execute_only = redislock::test::faulty_connection<execute_only>;
static_assert(redislock::connection<faulty_execute_only>);
static_assert(!redislock::contextual_connection<faulty_execute_only>);
static_assert(!redislock::pipelining_connection<faulty_execute_only>);
static_assert(!redislock::contextual_pipelining_connection<faulty_execute_only>);

reply run(faulty& conn, std::initializer_list<std::string_view> argv) {
    return conn.execute(redislock::command{argv.begin(), argv.size()});
}

reply run(faulty& conn, std::initializer_list<std::string_view> argv, const call_context& how) {
    return conn.execute(redislock::command{argv.begin(), argv.size()}, how);
}

call_context within(std::chrono::milliseconds timeout) {
    return call_context{.deadline = std::chrono::steady_clock::now() + timeout};
}

TEST(FaultyConnection, ForwardsCommandsAndLogsThem) {
    redis_server srv;
    faulty conn{srv.uri()};
    EXPECT_EQ(run(conn, {"SET", "k", "v"}).text(), "OK");
    EXPECT_EQ(run(conn, {"get", "k"}).text(), "v");
    EXPECT_EQ(conn.log_text(), (std::vector<std::string>{"SET", "GET"}));
    EXPECT_EQ(conn.count("get"), 1U);
    EXPECT_EQ(conn.faults_injected(), 0U);
    conn.clear_log();
    EXPECT_TRUE(conn.log().empty());
}

TEST(FaultyConnection, DropReplyRunsTheCommandAndThrowsTimeout) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "SET", .action = fault_action::drop_reply});
    EXPECT_THROW(run(conn, {"SET", "ghost", "1"}), redislock::timeout_error);
    EXPECT_EQ(srv.cli({"GET", "ghost"}), "1");
    EXPECT_EQ(conn.log_text(), (std::vector<std::string>{"SET [drop_reply]"}));
    // times = 1: the next SET goes through.
    EXPECT_EQ(run(conn, {"SET", "next", "2"}).text(), "OK");
}

TEST(FaultyConnection, ThrowAfterSendRunsTheCommandAndThrowsConnectionError) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "SET", .action = fault_action::throw_after_send});
    try {
        (void)run(conn, {"SET", "sent", "1"});
        ADD_FAILURE() << "no exception";
    } catch (const redislock::timeout_error&) {
        ADD_FAILURE() << "a broken connection is not a timeout";
    } catch (const redislock::connection_error&) {
    }
    EXPECT_EQ(srv.cli({"GET", "sent"}), "1");
}

TEST(FaultyConnection, ThrowBeforeSendNeverReachesTheServer) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "SET", .action = fault_action::throw_before_send});
    EXPECT_THROW(run(conn, {"SET", "unsent", "1"}), redislock::connection_error);
    EXPECT_EQ(srv.cli({"GET", "unsent"}), "");
}

TEST(FaultyConnection, ErrorReplyAnswersWithoutSending) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "SET", .action = fault_action::error_reply, .error_text = "OOM full"});
    const reply r = run(conn, {"SET", "refused", "1"});
    EXPECT_TRUE(r.is_error_code("OOM"));
    EXPECT_EQ(r.text(), "OOM full");
    EXPECT_EQ(srv.cli({"GET", "refused"}), "");
}

TEST(FaultyConnection, DelaysWaitBeforeOrAfterSending) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "SET", .action = fault_action::delay_before, .delay = 80ms});
    conn.add({.command = "GET", .action = fault_action::delay_after, .delay = 80ms});
    {
        const stopwatch watch;
        EXPECT_EQ(run(conn, {"SET", "k", "v"}).text(), "OK");
        EXPECT_GE(watch.elapsed(), 80ms);
    }
    const stopwatch watch;
    EXPECT_EQ(run(conn, {"GET", "k"}).text(), "v");
    EXPECT_GE(watch.elapsed(), 80ms);
}

TEST(FaultyConnection, DelayPastTheDeadlineEndsAtTheDeadlineWithTimeout) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "SET", .action = fault_action::delay_before, .delay = 2s});
    conn.add({.command = "INCR", .action = fault_action::delay_after, .delay = 2s});
    {
        const stopwatch watch;
        EXPECT_THROW(run(conn, {"SET", "late", "1"}, within(100ms)), redislock::timeout_error);
        EXPECT_LT(watch.elapsed(), 1s);
        EXPECT_EQ(srv.cli({"GET", "late"}), "");  // delayed before sending: never sent
    }
    const stopwatch watch;
    EXPECT_THROW(run(conn, {"INCR", "counted"}, within(100ms)), redislock::timeout_error);
    EXPECT_LT(watch.elapsed(), 1s);
    EXPECT_EQ(srv.cli({"GET", "counted"}), "1");  // delayed after sending: ran
}

TEST(FaultyConnection, StopRequestEndsADelayAtOnce) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "SET", .action = fault_action::delay_before, .delay = 5s});
    std::stop_source source;
    const std::stop_token token = source.get_token();
    std::jthread stopper{[&] {
        std::this_thread::sleep_for(50ms);
        source.request_stop();
    }};
    const stopwatch watch;
    EXPECT_THROW(run(conn, {"SET", "k", "v"}, call_context{.stop = &token}),
                 redislock::cancelled_error);
    EXPECT_LT(watch.elapsed(), 1s);
}

TEST(FaultyConnection, RuleFiresOnItsNthOccurrenceOnly) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "INCR", .action = fault_action::error_reply, .first = 2, .times = 2});
    EXPECT_EQ(run(conn, {"INCR", "n"}).as_integer(), 1);
    EXPECT_TRUE(run(conn, {"INCR", "n"}).is_error());
    EXPECT_TRUE(run(conn, {"INCR", "n"}).is_error());
    EXPECT_EQ(run(conn, {"INCR", "n"}).as_integer(), 2);
    EXPECT_EQ(run(conn, {"GET", "n"}).text(), "2");
    EXPECT_EQ(conn.faults_injected(), 2U);
}

TEST(FaultyConnection, ForeverRuleFiresUntilCleared) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "PING",
              .action = fault_action::throw_before_send,
              .times = fault_rule::forever});
    for (int i = 0; i < 5; ++i) {
        EXPECT_THROW(run(conn, {"PING"}), redislock::connection_error);
    }
    conn.clear_rules();
    EXPECT_EQ(run(conn, {"PING"}).text(), "PONG");
}

TEST(FaultyConnection, ScriptRuleMatchesOnlyThatScriptByNameOrSha1) {
    redis_server srv;
    faulty conn{srv.uri()};
    const auto& release = redislock::detail::scripts::mutex_release;
    const auto& extend = redislock::detail::scripts::mutex_extend;
    conn.add({.command = "EVALSHA",
              .script = "mutex_release",
              .action = fault_action::error_reply,
              .error_text = "ERR by name"});
    conn.add({.command = "EVALSHA",
              .script = std::string{extend.sha1},
              .action = fault_action::error_reply,
              .error_text = "ERR by sha1"});
    const std::array<std::string_view, 5> release_argv{"EVALSHA", release.sha1, "1", "k", "t"};
    EXPECT_EQ(conn.execute(release_argv).text(), "ERR by name");
    const std::array<std::string_view, 6> extend_argv{"EVALSHA", extend.sha1, "1", "k", "t", "100"};
    EXPECT_EQ(conn.execute(extend_argv).text(), "ERR by sha1");
    // Another script is not matched: the server answers NOSCRIPT, as nothing was loaded.
    const std::array<std::string_view, 4> other_argv{
        "EVALSHA", redislock::detail::scripts::compare_and_delete.sha1, "1", "k"};
    EXPECT_TRUE(conn.execute(other_argv).is_error_code("NOSCRIPT"));
    EXPECT_EQ(conn.log_text(), (std::vector<std::string>{"EVALSHA mutex_release [error_reply]",
                                                         "EVALSHA mutex_extend [error_reply]",
                                                         "EVALSHA compare_and_delete"}));
    EXPECT_EQ(conn.count("EVALSHA", "mutex_release"), 1U);
    EXPECT_EQ(conn.count("EVALSHA", release.sha1), 1U);
}

TEST(FaultyConnection, PipelineMatchesEachCommand) {
    redis_server srv;
    faulty conn{srv.uri()};
    conn.add({.command = "GET", .action = fault_action::error_reply, .error_text = "ERR no"});
    const std::array<std::string_view, 3> set{"SET", "k", "v"};
    const std::array<std::string_view, 2> get{"GET", "k"};
    const std::array<std::string_view, 2> incr{"INCR", "n"};
    const std::array<redislock::command, 3> batch{set, get, incr};
    const auto replies = conn.execute_pipeline(batch);
    ASSERT_EQ(replies.size(), 3U);
    EXPECT_EQ(replies[0].text(), "OK");
    EXPECT_EQ(replies[1].text(), "ERR no");
    EXPECT_EQ(replies[2].as_integer(), 1);

    conn.add({.command = "INCR", .action = fault_action::drop_reply});
    const std::array<call_context, 3> hows{within(1s), within(1s), within(1s)};
    EXPECT_THROW(conn.execute_pipeline(batch, hows), redislock::timeout_error);
    EXPECT_EQ(srv.cli({"GET", "n"}), "2");  // sent, reply lost

    conn.add({.command = "SET", .action = fault_action::throw_before_send});
    EXPECT_THROW(conn.execute_pipeline(batch), redislock::connection_error);
    EXPECT_EQ(srv.cli({"GET", "n"}), "2");  // nothing of the batch sent
}

TEST(FaultyConnection, ExecuteOnlyInnerGetsFaultsToo) {
    redis_server srv;
    faulty_execute_only conn{srv.uri()};
    conn.add({.command = "SET", .action = fault_action::drop_reply});
    const std::array<std::string_view, 3> set{"SET", "k", "v"};
    EXPECT_THROW(conn.execute(set), redislock::timeout_error);
    EXPECT_EQ(srv.cli({"GET", "k"}), "v");
}

TEST(FaultyConnection, ClientOwnsACopyWhileTheTestChangesRulesThroughItsHandle) {
    redis_server srv;
    faulty handle{srv.uri()};
    redislock::basic_client<faulty> client{handle};
    auto m = client.mutex("copied", {.lease = 5s});
    ASSERT_TRUE(m.try_lock());
    // Loaded first, so the release's EVALSHA runs (no NOSCRIPT and resend).
    ASSERT_EQ(
        srv.cli({"SCRIPT", "LOAD", std::string{redislock::detail::scripts::mutex_release.source}}),
        redislock::detail::scripts::mutex_release.sha1);
    // The release's reply is lost: the key is gone on the server all the same.
    handle.add(
        {.command = "EVALSHA", .script = "mutex_release", .action = fault_action::drop_reply});
    m.unlock();
    EXPECT_EQ(handle.faults_injected(), 1U);
    EXPECT_EQ(srv.cli({"EXISTS", "copied"}), "0");
    EXPECT_GE(handle.count("EVALSHA", "mutex_release"), 1U);
    EXPECT_EQ(&client.connection().inner(), &handle.inner());

    // An acquisition refused before it is sent.
    handle.add({.command = "SET", .action = fault_action::throw_before_send});
    EXPECT_THROW((void)m.try_lock(), redislock::connection_error);
    EXPECT_EQ(srv.cli({"EXISTS", "copied"}), "0");
}

}  // namespace
