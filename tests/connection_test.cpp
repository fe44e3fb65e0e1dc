#include <redislock/connection.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
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
using redislock::errc;
using redislock::test::eventually;
using redislock::test::fault;
using redislock::test::fault_connection;
using redislock::test::lost_counter;
using redislock::test::redis_server;
using redislock::test::stopwatch;
namespace scripts = redislock::detail::scripts;

// Exactly what the concept asks for and nothing more: execute(), no pipelining, not copyable
// and not movable (a client builds it in place). It forwards to a real server.
class archetype {
public:
    explicit archetype(std::string_view uri) : inner_{uri} {}
    archetype(const archetype&) = delete;
    archetype& operator=(const archetype&) = delete;

    redislock::reply execute(redislock::command argv) {
        calls_.fetch_add(1, std::memory_order_relaxed);
        return inner_.execute(argv);
    }

    int calls() const { return calls_.load(std::memory_order_relaxed); }

private:
    redislock::hiredis_connection inner_;
    std::atomic<int> calls_{0};
};

struct no_execute {
    redislock::reply run(redislock::command);
};

struct execute_returns_int {
    int execute(redislock::command);
};

struct execute_takes_a_string {
    redislock::reply execute(const std::string&);
};

struct pipeline_returns_one_reply {
    redislock::reply execute(redislock::command);
    redislock::reply execute_pipeline(std::span<const redislock::command>);
};

static_assert(redislock::connection<archetype>);
static_assert(!redislock::pipelining_connection<archetype>);
static_assert(redislock::detail::check_connection<archetype>());
static_assert(!redislock::connection<no_execute>);
static_assert(!redislock::connection<execute_returns_int>);
static_assert(!redislock::connection<execute_takes_a_string>);
static_assert(!redislock::connection<int>);
static_assert(redislock::connection<pipeline_returns_one_reply>);
static_assert(!redislock::pipelining_connection<pipeline_returns_one_reply>);
static_assert(redislock::pipelining_connection<redislock::hiredis_connection>);
static_assert(redislock::connection<fault_connection>);

using fault_client = redislock::basic_client<fault_connection>;

long count(const std::vector<std::string>& log, std::string_view entry) {
    return std::count(log.begin(), log.end(), entry);
}

TEST(Connection, ArchetypeIsAllAClientAndAMutexNeed) {
    redis_server srv;
    redislock::basic_client<archetype> client{srv.uri()};
    redislock::basic_mutex<archetype> m = client.mutex("orders:42");
    auto other = client.mutex("orders:42");

    {
        std::unique_lock guard{m};
        EXPECT_EQ(srv.cli({"STRLEN", "orders:42"}), "32");
        EXPECT_TRUE(m.owned());
        EXPECT_TRUE(m.verify());
        EXPECT_FALSE(other.try_lock());
        EXPECT_TRUE(m.extend(60s));
    }
    EXPECT_EQ(srv.cli({"EXISTS", "orders:42"}), "0");
    EXPECT_GT(client.connection().calls(), 0);
}

TEST(Connection, ArchetypeRunsTheFencedScripts) {
    redis_server srv;
    redislock::basic_client<archetype> client{srv.uri()};
    auto m = client.mutex("fenced", {.fencing = true});
    ASSERT_TRUE(m.try_lock());
    EXPECT_GT(m.fencing_token(), 0);
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    ASSERT_TRUE(m.try_lock());
    EXPECT_GT(m.fencing_token(), 1);
    m.unlock();
}

TEST(Connection, ClientTakesAReadyConnection) {
    redis_server srv;
    redislock::node_client client{redislock::hiredis_connection{srv.uri()}};
    auto m = client.mutex("k");
    EXPECT_TRUE(m.try_lock());
    m.unlock();
    EXPECT_EQ(client.connection().config().port, srv.port());
}

// A release that could not be finished is retried by the process's reaper, in the background.
TEST(FaultConnection, ReleaseThatFailsOnceIsRetriedAndSucceeds) {
    redis_server srv;
    fault_client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    client.connection().inject(fault::throw_before_send, "EVALSHA", 1, scripts::mutex_release);

    std::error_code ec;
    m.unlock(ec);

    EXPECT_EQ(ec, errc::connection_failed);
    EXPECT_FALSE(m.owned());
    EXPECT_TRUE(eventually([&] { return srv.cli({"EXISTS", "k"}) == "0"; }));
    EXPECT_EQ(client.connection().pending_faults(), 0);
    EXPECT_GE(count(client.connection().log(), "EVALSHA mutex_release"), 2);
    EXPECT_EQ(lost.calls.load(), 0);
}

TEST(FaultConnection, ReleaseWhoseReplyIsLostIsNotReportedLost) {
    redis_server srv;
    fault_client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    // The first release deletes the key but its reply never arrives: unlock() cannot tell, and
    // the reaper's retry finds the key gone ("not ours") and stops there.
    ASSERT_EQ(srv.cli({"SCRIPT", "LOAD", std::string{scripts::mutex_release.source}}),
              scripts::mutex_release.sha1);
    client.connection().inject(fault::throw_after_send, "EVALSHA", 1, scripts::mutex_release);

    std::error_code ec;
    m.unlock(ec);

    EXPECT_EQ(ec, errc::connection_failed);
    EXPECT_FALSE(m.owned());
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");  // deleted by the first send
    EXPECT_TRUE(
        eventually([&] { return count(client.connection().log(), "EVALSHA mutex_release") >= 2; }));
    // One retry, no more: "not ours" ends it (a retry would follow within 10 ms), and is not
    // taken for a loss.
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(count(client.connection().log(), "EVALSHA mutex_release"), 2);
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

TEST(FaultConnection, ReleaseThatFailsTwiceIsFinishedInTheBackground) {
    redis_server srv;
    fault_client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    const std::string first_token = srv.cli({"GET", "k"});
    client.connection().inject(fault::throw_before_send, "EVALSHA", 2, scripts::mutex_release);

    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::connection_failed);
    EXPECT_FALSE(m.owned());
    EXPECT_EQ(m.remaining(), 0ms);

    // The lease is 30 s: only a release can free the key this soon, and nothing but the reaper
    // is left to send one.
    EXPECT_TRUE(eventually([&] { return srv.cli({"EXISTS", "k"}) == "0"; }, 5s));
    EXPECT_EQ(client.connection().pending_faults(), 0);
    EXPECT_GE(count(client.connection().log(), "EVALSHA mutex_release"), 3);

    // The next lock() has nothing to finish first: it only takes the lock.
    client.connection().clear_log();
    ASSERT_TRUE(m.try_lock());
    EXPECT_EQ(client.connection().log(), (std::vector<std::string>{"SET"}));
    const std::string second_token = srv.cli({"GET", "k"});
    EXPECT_NE(second_token, first_token);
    EXPECT_EQ(second_token.size(), 32U);

    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
    EXPECT_EQ(lost.calls.load(), 0);
}

// While the release keeps failing in the background, lock() is not affected by it: it neither
// throws nor waits for it, and finds the key still taken.
TEST(FaultConnection, ReleaseThatStillFailsInTheBackgroundDoesNotMakeLockThrow) {
    redis_server srv;
    fault_client client{srv.uri()};
    auto m = client.mutex("k");
    m.lock();
    const std::string first_token = srv.cli({"GET", "k"});
    // unlock()'s attempt and the reaper's first seven fail: its retries are 10, 20, 40 ... 640
    // ms apart, so the key stays for about 1.3 s.
    client.connection().inject(fault::throw_before_send, "EVALSHA", 8, scripts::mutex_release);
    std::error_code ec;
    const stopwatch watch;
    m.unlock(ec);
    ASSERT_EQ(ec, errc::connection_failed);
    EXPECT_LT(watch.elapsed(), 500ms);  // unlock() does not wait for the retries

    bool taken = true;
    EXPECT_NO_THROW(taken = m.try_lock());
    EXPECT_FALSE(taken);
    EXPECT_FALSE(m.owned());
    EXPECT_EQ(srv.cli({"GET", "k"}), first_token);
    EXPECT_GT(client.connection().pending_faults(), 0);

    // Once the network is back, the reaper's release goes through and the lock is free again.
    EXPECT_TRUE(eventually([&] { return srv.cli({"EXISTS", "k"}) == "0"; }, 10s));
    EXPECT_EQ(client.connection().pending_faults(), 0);
    EXPECT_TRUE(m.try_lock());
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

// A destructor whose release fails hands it to the reaper, which keeps the client's connection
// alive: the release is finished after the lock object and its client are gone.
TEST(FaultConnection, DestructorsFailedReleaseIsFinishedAfterTheLockAndItsClientAreGone) {
    redis_server srv;
    {
        fault_client client{srv.uri()};
        {
            auto m = client.mutex("k");
            m.lock();
            // The destructor's attempt and the reaper's first five fail: its retries are 10, 20
            // ... 160 ms apart, so the key stays for about 0.6 s, past both destructors.
            client.connection().inject(fault::throw_before_send, "EVALSHA", 7,
                                       scripts::mutex_release);
        }
        ASSERT_EQ(srv.cli({"EXISTS", "k"}), "1");
        EXPECT_GT(client.connection().pending_faults(), 0);
        EXPECT_GE(count(client.connection().log(), "EVALSHA mutex_release"), 1);
    }
    EXPECT_TRUE(eventually([&] { return srv.cli({"EXISTS", "k"}) == "0"; }, 5s));
}

TEST(FaultConnection, NoscriptOnReleaseIsRecovered) {
    redis_server srv;
    fault_client client{srv.uri()};
    auto m = client.mutex("k");
    m.lock();
    // Load the script first, so the NOSCRIPT below is the only one.
    ASSERT_EQ(srv.cli({"SCRIPT", "LOAD", std::string{scripts::mutex_release.source}}),
              scripts::mutex_release.sha1);
    client.connection().inject(fault::answer_noscript, "EVALSHA", 1, scripts::mutex_release);
    client.connection().clear_log();

    std::error_code ec;
    m.unlock(ec);

    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(client.connection().log(),
              (std::vector<std::string>{"EVALSHA mutex_release", "SCRIPT LOAD",
                                        "EVALSHA mutex_release"}));
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

TEST(FaultConnection, ErrorReplyToReleaseIsServerFailedNotLost) {
    redis_server srv;
    fault_client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    client.connection().inject(fault::answer_error, "EVALSHA", 1, scripts::mutex_release,
                               "READONLY You can't write against a read only replica.");

    std::error_code ec;
    m.unlock(ec);

    EXPECT_EQ(ec, errc::server_failed);
    EXPECT_NE(ec.message().find("READONLY You can't write against a read only replica."),
              std::string::npos)
        << ec.message();
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_FALSE(m.owned());
    // As with a network failure, the reaper finishes the release in the background.
    EXPECT_TRUE(eventually([&] { return srv.cli({"EXISTS", "k"}) == "0"; }));
    EXPECT_GE(count(client.connection().log(), "EVALSHA mutex_release"), 2);
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(m.try_lock());
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

TEST(FaultConnection, ErrorReplyToExtendThrowsAndKeepsTheLock) {
    redis_server srv;
    fault_client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    client.connection().inject(fault::answer_error, "EVALSHA", 1, scripts::mutex_extend,
                               "BUSY Redis is busy running a script.");

    EXPECT_THROW((void)m.extend(60s), redislock::server_error);
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(m.owned());
    EXPECT_TRUE(m.verify());
    EXPECT_TRUE(m.extend(60s));
    m.unlock();
}

TEST(FaultConnection, ErrorReplyToVerifyThrowsAndKeepsTheLock) {
    redis_server srv;
    fault_client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    client.connection().inject(fault::answer_error, "GET", 1, std::nullopt,
                               "LOADING Redis is loading the dataset in memory");

    EXPECT_THROW((void)m.verify(), redislock::server_error);
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(m.owned());
    EXPECT_TRUE(m.verify());
    m.unlock();
}

TEST(FaultConnection, ConnectionErrorOnExtendThrowsAndKeepsTheLock) {
    redis_server srv;
    fault_client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    client.connection().inject(fault::throw_before_send, "EVALSHA", 1, scripts::mutex_extend);
    EXPECT_THROW((void)m.extend(60s), redislock::connection_error);
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(m.owned());
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
}

TEST(FaultConnection, AcquisitionWhoseReplyIsLostTakesBackItsKey) {
    redis_server srv;
    fault_client client{srv.uri()};
    auto m = client.mutex("k");
    client.connection().inject(fault::throw_after_send, "SET");

    EXPECT_THROW((void)m.try_lock(), redislock::connection_error);

    EXPECT_FALSE(m.owned());
    // Taken back in the background, at once: otherwise it would block everyone for 30 s.
    EXPECT_TRUE(eventually([&] { return srv.cli({"EXISTS", "k"}) == "0"; }, 5s));
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

TEST(FaultConnection, FencedAcquisitionWhoseReplyIsLostTakesBackItsKey) {
    redis_server srv;
    fault_client client{srv.uri()};
    auto m = client.mutex("k", {.fencing = true});
    client.connection().inject(fault::throw_after_send, "EVALSHA", 1, scripts::mutex_acquire);

    EXPECT_THROW((void)m.try_lock(), redislock::connection_error);

    // Taken back in the background, at once.
    EXPECT_TRUE(eventually([&] { return srv.cli({"EXISTS", "k"}) == "0"; }, 5s));
    ASSERT_TRUE(m.try_lock());
    EXPECT_GT(m.fencing_token(), 0);
    m.unlock();
}

TEST(FaultConnection, ConnectionErrorBeforeTheAcquisitionIsSentLeavesNothingBehind) {
    redis_server srv;
    fault_client client{srv.uri()};
    auto m = client.mutex("k");
    client.connection().inject(fault::throw_before_send, "SET");
    EXPECT_THROW(m.lock(), redislock::connection_error);
    EXPECT_FALSE(m.owned());
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::not_held);
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

}  // namespace
