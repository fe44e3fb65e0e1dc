// The counting semaphore on Sentinel and Cluster, through redislock::client: permits follow a
// failover and a slot migration (MIGRATE without REPLACE, as redis-cli --cluster reshard sends
// it), and never more objects hold one than there are permits.
#include <redislock/redislock.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>

#include "support/redis_cluster.hpp"
#include "support/redis_sentinel.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::test::eventually;

std::string cluster_scheme_uri(const redislock::test::redis_cluster& cluster,
                               const std::string& query = {}) {
    const std::string seeds = cluster.uri(query);
    return "redis-cluster://" + seeds.substr(std::string_view{"redis://"}.size());
}

class TopologySemaphoreCluster : public ::testing::Test {
protected:
    static void SetUpTestSuite() { cluster_ = new redislock::test::redis_cluster{3, 0}; }
    static void TearDownTestSuite() {
        delete cluster_;
        cluster_ = nullptr;
    }
    static inline redislock::test::redis_cluster* cluster_ = nullptr;
};

TEST_F(TopologySemaphoreCluster, PermitsFollowTheirSlotThroughAMigrationWithAWaiterQueued) {
    redislock::test::redis_cluster& cluster = *cluster_;
    redislock::client c{cluster_scheme_uri(cluster, "command_timeout=5000")};
    const std::string name = "jobs:export";
    auto a = c.semaphore(name, {.permits = 2, .lease = 30s});
    auto b = c.semaphore(name, {.permits = 2, .lease = 30s});
    auto waiter = c.semaphore(name, {.permits = 2, .lease = 30s});
    ASSERT_TRUE(a.try_acquire());
    ASSERT_TRUE(b.try_acquire());
    std::atomic<bool> got{false};
    std::thread waiting{[&] { got = waiter.try_acquire_for(60s); }};
    const int slot = cluster.key_slot(name);
    const int from = cluster.master_for_slot(slot);
    ASSERT_TRUE(eventually([&] {
        return cluster.command(from, {"ZCARD", "{" + name + "}:queue"}) == "1";
    }));
    const auto masters = cluster.masters();
    const int to = masters.front() == from ? masters.back() : masters.front();

    cluster.begin_migration(slot, from, to);
    auto rival = c.semaphore(name, {.permits = 2, .lease = 30s});
    EXPECT_FALSE(rival.try_acquire()) << "the slot's state is no reason to grant a third";
    EXPECT_EQ(a.available_permits(), 0);
    cluster.move_keys(slot, from, to);  // without REPLACE
    EXPECT_FALSE(rival.try_acquire());
    cluster.finish_migration(slot, from, to);
    EXPECT_FALSE(got.load());
    EXPECT_TRUE(a.extend(30s)) << "a held permit moved with its slot";

    std::error_code ec;
    a.release(ec);
    EXPECT_FALSE(ec) << ec.message();
    waiting.join();
    EXPECT_TRUE(got.load()) << "the waiter queued before the move is told on the new master";
    EXPECT_FALSE(rival.try_acquire());
    b.release();
    waiter.release();
    EXPECT_TRUE(rival.try_acquire());
    rival.release();
    EXPECT_EQ(cluster.command(to, {"EXISTS", name}), "0");
    EXPECT_EQ(cluster.command(to, {"GET", "{" + name + "}:permits"}), "2");
}

// On a slot being migrated whose keys are all still on the source, an acquisition that finds
// only lapsed holders never removes the holders' key and then writes it: Redis would refuse
// that write ("non local key") after the writes before it.
TEST_F(TopologySemaphoreCluster, AGrantOnAMigratingSourceWithOnlyLapsedHoldersWritesNothingTwice) {
    redislock::test::redis_cluster& cluster = *cluster_;
    redislock::client c{cluster_scheme_uri(cluster, "command_timeout=5000")};
    const std::string name = "jobs:lapsed";
    const int slot = cluster.key_slot(name);
    const int from = cluster.master_for_slot(slot);
    const auto masters = cluster.masters();
    const int to = masters.front() == from ? masters.back() : masters.front();
    const std::string tag = "{" + name + "}";
    // Every key of the name on the source: a holder whose lease ended (the key kept alive by a
    // longer one that was given back), a waiter, the count and the fencing counter.
    cluster.command(from, {"ZADD", name, "1000", "lapsed-permit"});
    cluster.command(from, {"PEXPIRE", name, "60000"});
    cluster.command(from, {"ZADD", tag + ":queue", "1", "wother"});
    cluster.command(from, {"ZADD", tag + ":waiting", "99999999999999", "wother"});
    cluster.command(from, {"SET", tag + ":permits", "2"});
    cluster.command(from, {"SET", tag + ":fence", "5"});
    cluster.begin_migration(slot, from, to);
    auto s = c.semaphore(name, {.permits = 2, .lease = 30s, .fencing = true});
    EXPECT_TRUE(s.try_acquire_for(5s));
    EXPECT_GT(s.fencing_token(), 5);
    EXPECT_EQ(cluster.command(from, {"ZCARD", name}), "1") << "the lapsed holder went";
    s.release();
    cluster.move_keys(slot, from, to);
    cluster.finish_migration(slot, from, to);
    for (const std::string& key : {tag + ":queue", tag + ":waiting", tag + ":fence"}) {
        cluster.command(to, {"DEL", key});
    }
}

TEST(TopologySemaphore, APermitOutlivesAPlannedSentinelFailover) {
    redislock::test::redis_sentinel topo;
    redislock::client c{topo.uri()};
    const int old_master = topo.master_port();
    auto held = c.semaphore("s:permits", {.permits = 1, .lease = 20s, .min_replicas = 1});
    ASSERT_TRUE(held.try_acquire());
    topo.failover();
    const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });
    EXPECT_EQ(topo.node(new_master).cli({"ZCARD", "s:permits"}), "1");

    auto rival = c.semaphore("s:permits", {.permits = 1, .lease = 20s, .min_replicas = 1});
    EXPECT_FALSE(rival.try_acquire_for(3s)) << "the one permit is held across the failover";
    EXPECT_TRUE(held.extend(20s));
    std::error_code ec;
    held.release(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(rival.try_acquire_for(10s));
    rival.release();
    EXPECT_EQ(topo.node(new_master).cli({"EXISTS", "s:permits"}), "0");
}

}  // namespace
