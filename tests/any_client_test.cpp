// redislock::client over redislock::any_connection (any_connection.hpp): a lock through it on
// each scheme, the URIs it refuses at construction, and a client made while its servers are down.

#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/redis_cluster.hpp"
#include "support/redis_sentinel.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::any_connection;
using redislock::topology;
using clock_type = std::chrono::steady_clock;

static_assert(redislock::contextual_connection<any_connection>);
static_assert(redislock::contextual_pipelining_connection<any_connection>);
static_assert(redislock::subscribing_connection<any_connection>);
static_assert(redislock::detail::check_connection<any_connection>());
static_assert(std::is_same_v<redislock::client, redislock::basic_client<any_connection>>);
static_assert(std::is_same_v<redislock::mutex, redislock::basic_mutex<any_connection>>);

// A lock on `name` through `c` is held once, refused to a second lock meanwhile, and free again
// after unlock().
void lock_once(redislock::client& c, const std::string& name) {
    auto held = c.mutex(name);
    auto rival = c.mutex(name);
    held.lock();
    EXPECT_FALSE(rival.try_lock());
    held.unlock();
    ASSERT_TRUE(rival.try_lock());
    rival.unlock();
}

// "redis://127.0.0.1:p1,..." of a cluster fixture as a redis-cluster:// URI.
std::string cluster_scheme_uri(const redislock::test::redis_cluster& cluster,
                               const std::string& query = {}) {
    const std::string seeds = cluster.uri(query);
    return "redis-cluster://" + seeds.substr(std::string_view{"redis://"}.size());
}

std::string message_of_construction(const std::string& uri) {
    try {
        redislock::client c{uri};
    } catch (const redislock::invalid_argument& e) {
        return e.what();
    }
    return {};
}

// How long a timed acquisition `f` took to end without the lock: a waiting call rides out
// connection errors until its deadline, then returns false, or throws the error (a
// connection_error, timeout_error included) when its last attempt failed at the deadline.
template <class F>
clock_type::duration time_to_fail(F&& f) {
    const auto start = clock_type::now();
    try {
        EXPECT_FALSE(f());
    } catch (const redislock::connection_error&) {
        // The connect's error, as the attempt at the deadline saw it.
    }
    return clock_type::now() - start;
}

TEST(AnyClient, LocksOnOneNode) {
    redislock::test::redis_server server;
    redislock::client c{server.uri()};
    EXPECT_EQ(c.connection().kind(), topology::node);
    lock_once(c, "any:node");
    ASSERT_NE(c.connection().get<redislock::hiredis_connection>(), nullptr);
    EXPECT_EQ(c.connection().get<redislock::hiredis_connection>()->config().port, server.port());
    EXPECT_EQ(c.connection().get<redislock::sentinel_connection>(), nullptr);
    EXPECT_EQ(c.connection().config().describe(), "127.0.0.1:" + std::to_string(server.port()));
}

TEST(AnyClient, EveryLockKindWorksThroughIt) {
    redislock::test::redis_server server;
    redislock::client c{server.uri(), {}};
    redislock::recursive_mutex r = c.recursive_mutex("any:recursive");
    r.lock();
    r.lock();
    r.unlock();
    r.unlock();
    redislock::shared_mutex s = c.shared_mutex("any:shared");
    s.lock_shared();
    s.unlock_shared();
    s.lock();
    s.unlock();
    redislock::mutex watched = c.mutex("any:watched", {.lease = 3s, .watchdog = true});
    watched.lock();
    EXPECT_TRUE(watched.verify());
    watched.unlock();
}

TEST(AnyClient, LocksOverAUnixSocket) {
    redislock::test::redis_server server{{.unix_socket = true}};
    redislock::client c{server.unix_uri()};
    EXPECT_EQ(c.connection().kind(), topology::node);
    lock_once(c, "any:unix");
}

TEST(AnyClient, LocksThroughSentinel) {
    redislock::test::redis_sentinel sentinel;
    redislock::client c{sentinel.uri()};
    EXPECT_EQ(c.connection().kind(), topology::sentinel);
    lock_once(c, "any:sentinel");
    auto* held = c.connection().get<redislock::sentinel_connection>();
    ASSERT_NE(held, nullptr);
    EXPECT_EQ(held->master().port, sentinel.master_port());

    // The typed Sentinel client and its lock aliases keep working beside it.
    redislock::sentinel_client typed{sentinel.uri()};
    redislock::sentinel_mutex m = typed.mutex("any:sentinel");
    redislock::sentinel_recursive_mutex r = typed.recursive_mutex("any:sentinel:r");
    redislock::sentinel_shared_mutex s = typed.shared_mutex("any:sentinel:s");
    m.lock();
    auto rival = c.mutex("any:sentinel");
    EXPECT_FALSE(rival.try_lock());
    m.unlock();
    r.lock();
    r.unlock();
    s.lock_shared();
    s.unlock_shared();
}

class AnyClientCluster : public ::testing::Test {
protected:
    static void SetUpTestSuite() { cluster_ = new redislock::test::redis_cluster{3, 0}; }
    static void TearDownTestSuite() {
        delete cluster_;
        cluster_ = nullptr;
    }
    static inline redislock::test::redis_cluster* cluster_ = nullptr;
};

TEST_F(AnyClientCluster, LocksOnACluster) {
    redislock::client c{cluster_scheme_uri(*cluster_)};
    EXPECT_EQ(c.connection().kind(), topology::cluster);
    for (const std::string name : {"any:cluster:a", "any:cluster:b", "any:cluster:c"}) {
        lock_once(c, name);
        EXPECT_EQ(c.connection().node_for_key(name),
                  "127.0.0.1:" + std::to_string(cluster_->master_for_key(name)));
    }
    // The typed Cluster client keeps its redis://h1,h2 seed form.
    redislock::cluster_client typed{cluster_->uri()};
    redislock::cluster_mutex m = typed.mutex("any:cluster:a");
    m.lock();
    auto rival = c.mutex("any:cluster:a");
    EXPECT_FALSE(rival.try_lock());
    m.unlock();
}

TEST_F(AnyClientCluster, AHeldLockFollowsItsSlotToAnotherMaster) {
    const std::string name = "any:cluster:moved";
    redislock::client c{cluster_scheme_uri(*cluster_, "command_timeout=5000")};
    auto held = c.mutex(name, {.lease = 30s});
    held.lock();
    const int slot = cluster_->key_slot(name);
    const int from = cluster_->master_for_slot(slot);
    const auto masters = cluster_->masters();
    const int to = masters.front() == from ? masters.back() : masters.front();
    cluster_->migrate_slot(slot, to);

    auto rival = c.mutex(name);
    EXPECT_FALSE(rival.try_lock());  // found held on its new master
    EXPECT_TRUE(held.verify());
    std::error_code ec;
    held.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(c.connection().node_for_key(name), "127.0.0.1:" + std::to_string(to));
    ASSERT_TRUE(rival.try_lock());
    rival.unlock();
}

TEST(AnyClient, ARedisUriWithSeveralHostsNamesTheClusterAndSentinelSchemes) {
    for (const std::string uri : {"redis://127.0.0.1:7000,127.0.0.1:7001",
                                  "redis://:pw@127.0.0.5,127.0.0.6/0?command_timeout=500",
                                  "rediss://127.0.0.5:6380,127.0.0.6:6380"}) {
        SCOPED_TRACE(uri);
        const std::string message = message_of_construction(uri);
        EXPECT_NE(message.find("redis-cluster://"), std::string::npos) << message;
        EXPECT_NE(message.find("redis-sentinel://"), std::string::npos) << message;
    }
}

TEST(AnyClient, MalformedUrisThrowAtConstruction) {
    const std::vector<std::string> bad{
        "",
        "127.0.0.1:6379",
        "http://127.0.0.1:6379",
        "redis://",
        "redis://127.0.0.1:99999",
        "redis://127.0.0.1?no_such_option=1",
        "redis://127.0.0.1?command_timeout=0",
        "redis://127.0.0.1?pool_size=0",
        "unix://relative/path",
        "redis-sentinel://127.0.0.1:26379",
        "redis-sentinel://127.0.0.1:26379,,127.0.0.1:26380#m",
        "redis-cluster://",
        "redis-cluster://127.0.0.1:7000,,127.0.0.1:7001",
        "redis-cluster://127.0.0.1:7000,",
        "redis-cluster://127.0.0.1:7000/1",
        "redis-cluster://127.0.0.1:7000?db=2",
        "redis-cluster://127.0.0.1:7000?tls_ca_file=/ca.pem",
        "redis-cluster://127.0.0.1:7000?bogus=1",
        "rediss-cluster://127.0.0.1:7000?tls_verify=sometimes",
        "rediss-cluster://127.0.0.1:7000?tls_cert_file=/cert.pem",
        "redis-clusters://127.0.0.1:7000",
    };
    for (const std::string& uri : bad) {
        SCOPED_TRACE(uri);
        EXPECT_THROW(redislock::client{uri}, redislock::invalid_argument);
    }
}

// Construction opens nothing, whichever the scheme: none of these servers exists.
TEST(AnyClient, ConstructionConnectsToNothing) {
    const std::string nowhere = std::to_string(redislock::test::detail::pick_free_port());
    for (const std::string& uri :
         std::vector<std::string>{"redis://127.0.0.1:" + nowhere, "unix:///nonexistent/redis.sock",
                                  "redis-sentinel://127.0.0.1:" + nowhere + "#mymaster",
                                  "redis-cluster://127.0.0.1:" + nowhere + ",127.0.0.1:" + nowhere,
                                  // database 0, the only one a Redis Cluster has, may be named
                                  "redis-cluster://127.0.0.1:" + nowhere + "/0",
                                  "redis-cluster://127.0.0.1:" + nowhere + "/"}) {
        SCOPED_TRACE(uri);
        EXPECT_NO_THROW(redislock::client{uri});
    }
}

// rediss-cluster:// needs a build with TLS; without one it is refused when the client is made.
TEST(AnyClient, ATlsClusterUriIsAcceptedExactlyWhereTlsIsBuiltIn) {
    const std::string uri =
        "rediss-cluster://127.0.0.1:" + std::to_string(redislock::test::detail::pick_free_port()) +
        "?tls_verify=none";
    if (redislock::detail::hiredis_has_tls) {
        redislock::client c{uri};
        EXPECT_EQ(c.connection().kind(), topology::cluster);
        EXPECT_TRUE(
            c.connection().get<redislock::hiredis_cluster_connection>()->config().tls.enabled);
    } else {
        EXPECT_THROW(redislock::client{uri}, redislock::invalid_argument);
    }
}

TEST(AnyClient, AClientMadeWhileItsServerIsDownConnectsOnItsFirstCallThatCanSucceed) {
    redislock::test::redis_server server;
    server.stop();
    redislock::client c{server.uri()};
    auto m = c.mutex("any:late");
    EXPECT_THROW((void)m.try_lock(), redislock::connection_error);
    EXPECT_THROW(m.lock(), redislock::connection_error);
    const auto took = time_to_fail([&] { return m.try_lock_for(200ms); });
    EXPECT_LE(took, 250ms);

    server.start();
    ASSERT_TRUE(m.try_lock_for(2s));
    m.unlock();
}

TEST(AnyClient, ASentinelClientMadeWhileItsSentinelsAreDownFailsItsCallWithinItsDeadline) {
    const std::string a = std::to_string(redislock::test::detail::pick_free_port());
    const std::string b = std::to_string(redislock::test::detail::pick_free_port());
    redislock::client c{"redis-sentinel://127.0.0.1:" + a + ",127.0.0.1:" + b + "#mymaster"};
    auto m = c.mutex("any:late:sentinel");
    EXPECT_THROW((void)m.try_lock(), redislock::connection_error);
    const auto took = time_to_fail([&] { return m.try_lock_for(200ms); });
    EXPECT_LE(took, 250ms);
}

TEST(AnyClient, ASentinelClientMadeWhileItsSentinelsHangConnectsOnceTheyAnswer) {
    redislock::test::redis_sentinel sentinel;
    for (std::size_t i = 0; i < 3; ++i) {
        sentinel.pause_sentinel(i);
    }
    redislock::client c{sentinel.uri()};
    auto m = c.mutex("any:late:sentinel");
    const auto took = time_to_fail([&] { return m.try_lock_for(200ms); });
    EXPECT_LE(took, 250ms);

    for (std::size_t i = 0; i < 3; ++i) {
        sentinel.resume_sentinel(i);
    }
    ASSERT_TRUE(m.try_lock_for(5s));
    m.unlock();
}

// The master is first looked for by a call with a short deadline: one sentinel that hangs must
// not spend that call's whole time, call after call, while the others answer at once.
TEST(AnyClient, ASentinelClientWithOneHungSentinelFindsTheMasterWithinShortDeadlines) {
    redislock::test::redis_sentinel sentinel;
    for (const std::size_t hung : {std::size_t{0}, std::size_t{2}}) {
        sentinel.pause_sentinel(hung);
        redislock::client c{sentinel.uri()};
        auto m = c.mutex("any:hung:sentinel");
        bool acquired = false;
        for (int call = 0; call < 3 && !acquired; ++call) {
            try {
                acquired = m.try_lock_for(500ms);
            } catch (const redislock::error&) {
                // this call's time ran out: the next one tries again
            }
        }
        sentinel.resume_sentinel(hung);
        ASSERT_TRUE(acquired) << "sentinel " << hung << " hung";
        m.unlock();
    }
}

TEST_F(AnyClientCluster, AClusterClientMadeBeforeItsSeedsAnswerFailsItsCallWithinItsDeadline) {
    const std::string nowhere = std::to_string(redislock::test::detail::pick_free_port());
    redislock::client c{"redis-cluster://127.0.0.1:" + nowhere};
    auto m = c.mutex("any:late:cluster");
    try {
        (void)m.try_lock();
        ADD_FAILURE() << "try_lock() with no seed answering did not throw";
    } catch (const redislock::connection_error& e) {
        // The cause, as the read of the seeds met it, not only "no node serves the slot".
        EXPECT_NE(std::string{e.what()}.find("127.0.0.1:" + nowhere), std::string::npos)
            << e.what();
    }
    const auto took = time_to_fail([&] { return m.try_lock_for(200ms); });
    EXPECT_LE(took, 250ms);
}

}  // namespace
