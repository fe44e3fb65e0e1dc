#include "support/fault_proxy.hpp"

#include <gtest/gtest.h>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::test::fault_proxy;
using redislock::test::redis_server;
using redislock::test::stopwatch;

// A raw hiredis context to the proxy, apart from the library's pool, so that a broken connection
// is seen as it is instead of being replaced by a fresh one.
struct raw_context {
    struct free_context {
        void operator()(redisContext* c) const { redisFree(c); }
    };
    struct free_reply {
        void operator()(redisReply* r) const { freeReplyObject(r); }
    };
    using reply_ptr = std::unique_ptr<redisReply, free_reply>;

    explicit raw_context(const fault_proxy& proxy, std::chrono::milliseconds timeout = 500ms) {
        const timeval tv{static_cast<time_t>(timeout.count() / 1000),
                         static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
        ctx.reset(redisConnectWithTimeout(proxy.host().c_str(), proxy.port(), tv));
        if (!ctx) {
            throw std::runtime_error{"raw_context: out of memory"};
        }
        if (ctx->err == 0) {
            (void)redisSetTimeout(ctx.get(), tv);
        }
    }

    // The reply, or null when the connection failed (at connect time or during the command).
    reply_ptr command(const char* text) {
        if (ctx->err != 0) {
            return nullptr;
        }
        return reply_ptr{static_cast<redisReply*>(redisCommand(ctx.get(), text))};
    }

    std::unique_ptr<redisContext, free_context> ctx;
};

std::string uri_with_timeout(const fault_proxy& proxy, int command_timeout_ms = 200) {
    return proxy.uri() + "?command_timeout=" + std::to_string(command_timeout_ms);
}

redislock::reply run(redislock::hiredis_connection& conn,
                     std::initializer_list<std::string_view> argv) {
    return conn.execute(redislock::command{argv.begin(), argv.size()});
}

// The fastest of `count` PINGs on `conn`. A delay the proxy adds is in every sample, while a
// scheduling pause of a loaded machine (the sanitizer stages run two tests at a time on two
// cores) lands in one sample at most: a single sample compared with a few tens of milliseconds
// can fail although no delay is left.
std::chrono::milliseconds fastest_ping(redislock::hiredis_connection& conn, int count = 5) {
    auto fastest = std::chrono::milliseconds::max();
    for (int i = 0; i < count; ++i) {
        const stopwatch watch;
        EXPECT_EQ(run(conn, {"PING"}).text(), "PONG");
        fastest = std::min(fastest, watch.elapsed());
    }
    return fastest;
}

TEST(FaultProxy, ForwardsCommandsBothWays) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::hiredis_connection conn{uri_with_timeout(proxy)};
    EXPECT_EQ(run(conn, {"SET", "k", "v"}).text(), "OK");
    EXPECT_EQ(run(conn, {"GET", "k"}).text(), "v");
    EXPECT_EQ(srv.cli({"GET", "k"}), "v");
    EXPECT_EQ(proxy.accepted(), 1U);
    EXPECT_EQ(proxy.live(), 1U);
}

TEST(FaultProxy, DelayAddsLatencyInEachDirection) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::hiredis_connection conn{uri_with_timeout(proxy, 2000)};
    ASSERT_EQ(run(conn, {"PING"}).text(), "PONG");
    proxy.delay(60ms);
    {
        const stopwatch watch;
        EXPECT_EQ(run(conn, {"PING"}).text(), "PONG");
        // 60 ms on the way in and 60 ms on the way back.
        EXPECT_GE(watch.elapsed(), 115ms);
        EXPECT_LT(watch.elapsed(), 1000ms);
    }
    proxy.delay(0ms);
    EXPECT_LT(fastest_ping(conn), 60ms);
}

TEST(FaultProxy, DelayLongerThanTheCommandTimeoutTimesOut) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::hiredis_connection conn{uri_with_timeout(proxy, 200)};
    ASSERT_EQ(run(conn, {"PING"}).text(), "PONG");
    proxy.delay(150ms);
    const stopwatch watch;
    EXPECT_THROW(run(conn, {"SET", "k", "v"}), redislock::timeout_error);
    EXPECT_LT(watch.elapsed(), 1000ms);
    // The command was only late, not lost: it reaches the server.
    EXPECT_TRUE(redislock::test::eventually([&] { return srv.cli({"GET", "k"}) == "v"; }, 2s));
}

TEST(FaultProxy, StallTimesOutACommandAndResumeLetsTheNextConnectionWork) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::hiredis_connection conn{uri_with_timeout(proxy)};
    ASSERT_EQ(run(conn, {"PING"}).text(), "PONG");
    proxy.stall();
    {
        const stopwatch watch;
        EXPECT_THROW(run(conn, {"SET", "stalled", "1"}), redislock::timeout_error);
        EXPECT_GE(watch.elapsed(), 190ms);
        EXPECT_LT(watch.elapsed(), 1000ms);
    }
    // Nothing reached the server while stalled, and the connection is still open.
    EXPECT_EQ(srv.cli({"GET", "stalled"}), "");
    EXPECT_GE(proxy.live(), 1U);
    proxy.resume();
    EXPECT_EQ(run(conn, {"SET", "after", "1"}).text(), "OK");
    EXPECT_EQ(srv.cli({"GET", "after"}), "1");
    EXPECT_GE(proxy.accepted(), 2U);
}

TEST(FaultProxy, StalledBytesAreDeliveredOnResume) {
    redis_server srv;
    fault_proxy proxy{srv};
    raw_context raw{proxy, 2000ms};
    ASSERT_EQ(std::string{raw.command("PING")->str}, "PONG");
    proxy.stall();
    ASSERT_EQ(redisAppendCommand(raw.ctx.get(), "SET buffered yes"), REDIS_OK);
    int done = 0;
    while (done == 0) {
        ASSERT_EQ(redisBufferWrite(raw.ctx.get(), &done), REDIS_OK);
    }
    std::this_thread::sleep_for(150ms);
    EXPECT_EQ(srv.cli({"GET", "buffered"}), "");
    proxy.resume();
    void* reply = nullptr;
    ASSERT_EQ(redisGetReply(raw.ctx.get(), &reply), REDIS_OK);
    const raw_context::reply_ptr owned{static_cast<redisReply*>(reply)};
    EXPECT_EQ(std::string{owned->str}, "OK");
    EXPECT_EQ(srv.cli({"GET", "buffered"}), "yes");
}

TEST(FaultProxy, CutClosesLiveConnections) {
    redis_server srv;
    fault_proxy proxy{srv};
    raw_context raw{proxy};
    ASSERT_EQ(std::string{raw.command("PING")->str}, "PONG");
    ASSERT_EQ(proxy.live(), 1U);
    proxy.cut();
    EXPECT_EQ(proxy.live(), 0U);
    EXPECT_EQ(proxy.cut_count(), 1U);
    EXPECT_EQ(raw.command("PING"), nullptr);
    EXPECT_NE(raw.ctx->err, 0);

    // A new connection through the same proxy works.
    raw_context fresh{proxy};
    auto pong = fresh.command("PING");
    ASSERT_NE(pong, nullptr);
    EXPECT_EQ(std::string{pong->str}, "PONG");
}

TEST(FaultProxy, CutMidCommandFailsItWithAConnectionError) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::hiredis_connection conn{uri_with_timeout(proxy, 2000)};
    ASSERT_EQ(run(conn, {"PING"}).text(), "PONG");
    proxy.stall();
    std::thread cutter{[&] {
        std::this_thread::sleep_for(100ms);
        proxy.cut();
    }};
    const stopwatch watch;
    try {
        (void)run(conn, {"PING"});
        ADD_FAILURE() << "PING succeeded across a cut";
    } catch (const redislock::timeout_error& e) {
        ADD_FAILURE() << "a cut should end the call before its timeout: " << e.what();
    } catch (const redislock::connection_error&) {
    }
    cutter.join();
    EXPECT_LT(watch.elapsed(), 1000ms);
    proxy.resume();
    EXPECT_EQ(run(conn, {"PING"}).text(), "PONG");
}

TEST(FaultProxy, RefuseClosesNewConnectionsAtOnceAndLeavesLiveOnesAlone) {
    redis_server srv;
    fault_proxy proxy{srv};
    raw_context live{proxy};
    ASSERT_EQ(std::string{live.command("PING")->str}, "PONG");

    proxy.refuse(true);
    raw_context refused{proxy};
    EXPECT_EQ(refused.command("PING"), nullptr);
    EXPECT_NE(refused.ctx->err, 0);
    EXPECT_EQ(proxy.refused(), 1U);
    auto still = live.command("PING");
    ASSERT_NE(still, nullptr);
    EXPECT_EQ(std::string{still->str}, "PONG");

    proxy.refuse(false);
    raw_context accepted{proxy};
    auto pong = accepted.command("PING");
    ASSERT_NE(pong, nullptr);
    EXPECT_EQ(std::string{pong->str}, "PONG");
}

TEST(FaultProxy, DroppedReplyTimesOutWhileTheCommandStillRunsOnTheServer) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::hiredis_connection conn{uri_with_timeout(proxy)};
    ASSERT_EQ(run(conn, {"PING"}).text(), "PONG");
    proxy.drop_replies(true);
    const stopwatch watch;
    EXPECT_THROW(run(conn, {"SET", "ghost", "written"}), redislock::timeout_error);
    EXPECT_LT(watch.elapsed(), 1000ms);
    // A ghost write: the client saw a failure, the server applied it.
    EXPECT_EQ(srv.cli({"GET", "ghost"}), "written");
    EXPECT_GT(proxy.dropped_reply_bytes(), 0U);
    proxy.drop_replies(false);
    EXPECT_EQ(run(conn, {"GET", "ghost"}).text(), "written");
}

TEST(FaultProxy, HealTurnsEveryFaultOff) {
    redis_server srv;
    fault_proxy proxy{srv};
    proxy.delay(500ms);
    proxy.stall();
    proxy.refuse(true);
    proxy.drop_replies(true);
    proxy.heal();
    redislock::hiredis_connection conn{uri_with_timeout(proxy)};
    // With the refusal, the stall, the lost replies or the 500 ms delay (longer than the 200 ms
    // command timeout) still on, the first PING would fail.
    EXPECT_EQ(run(conn, {"PING"}).text(), "PONG");
    EXPECT_LT(fastest_ping(conn), 100ms);
}

TEST(FaultProxy, TargetDownClosesTheClientConnection) {
    redis_server srv;
    fault_proxy proxy{srv};
    srv.stop();
    raw_context raw{proxy};
    EXPECT_EQ(raw.command("PING"), nullptr);
    EXPECT_EQ(proxy.accepted(), 0U);
}

TEST(FaultProxy, DestructorClosesConnectionsAndJoins) {
    redis_server srv;
    auto proxy = std::make_unique<fault_proxy>(srv);
    raw_context raw{*proxy};
    ASSERT_EQ(std::string{raw.command("PING")->str}, "PONG");
    proxy->stall();
    const stopwatch watch;
    proxy.reset();
    EXPECT_LT(watch.elapsed(), 1000ms);
    EXPECT_EQ(raw.command("PING"), nullptr);
}

}  // namespace
