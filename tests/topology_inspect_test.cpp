// redislock-inspect (tools/inspect.hpp) through the URIs of the other topologies: the master a
// Sentinel names, and the Cluster node serving a name's slot, found from any seed (MOVED) and
// while the slot migrates (ASK).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/inspect_program.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_sentinel.hpp"

namespace {

using namespace std::chrono_literals;

using redislock::test::contains;
using redislock::test::run_inspect;

std::string cluster_uri(int seed_port) {
    return "redis-cluster://127.0.0.1:" + std::to_string(seed_port);
}

// A master of `cluster` other than `port`.
int other_master(const redislock::test::redis_cluster& cluster, int port) {
    for (int master : cluster.masters()) {
        if (master != port) {
            return master;
        }
    }
    return port;
}

// A cluster, a fenced mutex held on `name` through a seed on the master serving its slot, and
// another master to migrate that slot to.
struct lock_in_a_slot_to_move {
    explicit lock_in_a_slot_to_move(std::string lock_name)
        : name{std::move(lock_name)},
          slot{redislock::detail::key_slot(name)},
          from{cluster.master_for_key(name)},
          to{other_master(cluster, from)},
          uri{cluster_uri(from)},
          client{uri},
          m{client.mutex(name, {.lease = 30s, .fencing = true})} {
        m.lock();
    }
    redislock::test::redis_cluster cluster{3, 0};
    std::string name;
    int slot;
    int from;
    int to;
    std::string uri;
    redislock::client client;
    redislock::mutex m;
};

TEST(TopologyInspect, SentinelUriShowsAndFreesTheLockOnTheMaster) {
    redislock::test::redis_sentinel topo;
    redislock::client client{topo.uri()};
    auto m = client.mutex("jobs:7", {.lease = 20s, .fencing = true});
    m.lock();

    const auto shown = run_inspect({topo.uri(), "jobs:7"});
    ASSERT_EQ(shown.status, 0) << shown.err;
    EXPECT_TRUE(
        contains(shown.out, "server:          127.0.0.1:" + std::to_string(topo.master_port()) +
                                ", db 0 (the master of "))
        << shown.out;
    EXPECT_TRUE(contains(shown.out, "kind:            mutex")) << shown.out;
    EXPECT_TRUE(contains(shown.out, std::to_string(m.fencing_token()))) << shown.out;

    const auto freed = run_inspect({topo.uri(), "jobs:7", "--force-release", "--yes"});
    EXPECT_EQ(freed.status, 0) << freed.err;
    EXPECT_TRUE(contains(freed.out, "freed 'jobs:7': lock key deleted")) << freed.out;
    EXPECT_FALSE(m.verify());
    m.unlock();
}

TEST(TopologyInspect, ClusterUriShowsAndFreesTheLockOnTheNodeOfItsSlot) {
    redislock::test::redis_cluster cluster{3, 0};
    const std::string name = "orders:42";
    const int owner = cluster.master_for_key(name);
    const std::string uri = cluster_uri(other_master(cluster, owner));
    redislock::client client{uri};
    auto m = client.recursive_mutex(name, {.lease = 20s});
    m.lock();

    const auto shown = run_inspect({uri, name});
    ASSERT_EQ(shown.status, 0) << shown.err;
    EXPECT_TRUE(contains(shown.out, "server:          127.0.0.1:" + std::to_string(owner) +
                                        " (cluster slot " +
                                        std::to_string(redislock::detail::key_slot(name)) + ")\n"))
        << shown.out;
    EXPECT_TRUE(contains(shown.out, "kind:            recursive_mutex")) << shown.out;
    EXPECT_TRUE(contains(shown.out, "count 1")) << shown.out;

    const auto freed = run_inspect({uri, name, "--force-release", "--yes"});
    EXPECT_EQ(freed.status, 0) << freed.err;
    EXPECT_TRUE(contains(freed.out, "freed 'orders:42': lock key deleted")) << freed.out;
    EXPECT_FALSE(m.verify());
    m.unlock();
}

// A connection whose slot map is out of date (the slot moved since it was read) follows MOVED
// to the node that has the lock now.
TEST(TopologyInspect, ClusterConnectionFollowsMovedAfterTheSlotMoved) {
    redislock::test::redis_cluster cluster{3, 0};
    const std::string name = "orders:43";
    const int slot = redislock::detail::key_slot(name);
    const int from = cluster.master_for_key(name);
    const int to = other_master(cluster, from);
    redislock::client client{cluster_uri(from)};
    auto m = client.mutex(name, {.lease = 30s, .fencing = true});
    m.lock();
    redislock::any_connection conn{cluster_uri(from)};
    const auto before = redislock::inspect::inspect(conn, name);
    ASSERT_EQ(before.holders.size(), 1u);

    cluster.migrate_slot(slot, to);
    const auto* cluster_conn = conn.get<redislock::hiredis_cluster_connection>();
    ASSERT_NE(cluster_conn, nullptr);
    const std::uint64_t moved = cluster_conn->moved_redirections();
    const auto after = redislock::inspect::inspect(conn, name);
    EXPECT_GT(cluster_conn->moved_redirections(), moved);
    EXPECT_EQ(after.kind, redislock::inspect::lock_kind::mutex);
    ASSERT_EQ(after.holders.size(), 1u);
    EXPECT_EQ(after.holders.front().who, before.holders.front().who);
    EXPECT_EQ(after.fence, m.fencing_token());
    EXPECT_TRUE(contains(redislock::inspect::server_text(conn, name),
                         "127.0.0.1:" + std::to_string(to) + " (cluster slot "));
    m.unlock();
}

// The slot is marked for migration and no key has moved yet, then only the lock key has: each
// view reads the lock key by key (the absent queue keys make commands on several keys answer
// TRYAGAIN) and finds it where it is.
TEST(TopologyInspect, ClusterUriReadsALockWhoseSlotMigrationHasBegunOrMovedPartOfItsKeys) {
    lock_in_a_slot_to_move held{"jobs:11"};
    auto& [cluster, name, slot, from, to, uri, client, m] = held;
    const std::string token =
        redislock::inspect::inspect(client.connection(), name).holders.at(0).who;

    cluster.begin_migration(slot, from, to);
    const auto begun = run_inspect({uri, name});
    EXPECT_EQ(begun.status, 0) << begun.err;
    EXPECT_TRUE(contains(begun.out, token)) << begun.out;
    EXPECT_TRUE(contains(begun.out, std::to_string(m.fencing_token()))) << begun.out;

    cluster.command(from, {"MIGRATE", "127.0.0.1", std::to_string(to), name, "0", "5000"});
    const auto partly = run_inspect({uri, name});
    EXPECT_EQ(partly.status, 0) << partly.err;
    EXPECT_TRUE(contains(partly.out, token)) << partly.out;
    EXPECT_TRUE(contains(partly.out, std::to_string(m.fencing_token()))) << partly.out;
    EXPECT_TRUE(contains(partly.out, "read:            key by key, not one moment")) << partly.out;
    EXPECT_TRUE(contains(partly.out, "keys read through ASK on the node importing it"))
        << partly.out;

    cluster.move_keys(slot, from, to);
    cluster.finish_migration(slot, from, to);
    EXPECT_TRUE(m.verify());
    m.unlock();
}

// Every key of the name has moved to the importing node and the slot is not handed over yet:
// the source answers ASK, and commands on several keys, some of them absent (the queue keys),
// TRYAGAIN. The tool reads the lock key by key where it now is and says so; it frees nothing
// until the migration has ended.
TEST(TopologyInspect, ClusterUriReadsALockWhoseSlotIsMigratingKeyByKey) {
    lock_in_a_slot_to_move held{"jobs:9"};
    auto& [cluster, name, slot, from, to, uri, client, m] = held;

    cluster.begin_migration(slot, from, to);
    cluster.move_keys(slot, from, to);
    const auto shown = run_inspect({uri, name});
    EXPECT_EQ(shown.status, 0) << shown.err;
    EXPECT_TRUE(contains(shown.out, "kind:            mutex")) << shown.out;
    EXPECT_TRUE(contains(shown.out, "read:            key by key, not one moment: cluster slot " +
                                        std::to_string(slot) + " is being migrated"))
        << shown.out;
    EXPECT_TRUE(contains(shown.out, "keys read through ASK on the node importing it")) << shown.out;
    EXPECT_TRUE(contains(shown.out, std::to_string(m.fencing_token()))) << shown.out;
    const auto refused = run_inspect({uri, name, "--force-release", "--yes"});
    EXPECT_EQ(refused.status, 1) << refused.out;
    EXPECT_TRUE(contains(refused.err, "is being migrated")) << refused.err;
    EXPECT_TRUE(contains(refused.err, "nothing was freed")) << refused.err;
    cluster.finish_migration(slot, from, to);

    EXPECT_TRUE(m.verify());
    const auto after = run_inspect({uri, name});
    EXPECT_EQ(after.status, 0) << after.err;
    EXPECT_TRUE(contains(after.out, "server:          127.0.0.1:" + std::to_string(to)))
        << after.out;
    EXPECT_FALSE(contains(after.out, "read:")) << after.out;
    const auto freed = run_inspect({uri, name, "--force-release", "--yes"});
    EXPECT_EQ(freed.status, 0) << freed.err;
    EXPECT_TRUE(contains(freed.out, "freed 'jobs:9': lock key deleted")) << freed.out;
    EXPECT_FALSE(m.verify());
    m.unlock();
}

TEST(TopologyInspect, ClusterSeedsInARedisUriAreRefusedNamingTheClusterScheme) {
    const auto refused = run_inspect({"redis://127.0.0.1:7000,127.0.0.1:7001", "x"});
    EXPECT_EQ(refused.status, 2);
    EXPECT_TRUE(contains(refused.err, "redis-cluster://")) << refused.err;
}

}  // namespace
