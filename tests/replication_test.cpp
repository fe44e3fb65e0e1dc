// lock_options::min_replicas: acquisitions and renewals acknowledged by replicas (WAIT).
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"
#include "support/test_util.hpp"

using namespace std::chrono_literals;
using redislock::test::eventually;
using redislock::test::lost_counter;
using redislock::test::redis_server;

namespace {

// A master with one replica linked to it.
struct replicated_pair {
    redis_server master{redis_server::options{.extra_args = {"--repl-diskless-sync-delay", "0"}}};
    redis_server replica{redis_server::options{.extra_args = {"--replicaof", "127.0.0.1",
                                                              std::to_string(master.port()),
                                                              "--repl-diskless-sync-delay", "0"}}};

    replicated_pair() {
        // Linked on both sides, and acknowledging: the master counts a replica for WAIT only once
        // it has sent its first REPLCONF ACK.
        const bool linked = eventually(
            [&] {
                return replica.cli({"INFO", "replication"}).find("master_link_status:up") !=
                           std::string::npos &&
                       master.cli({"INFO", "replication"}).find("state=online") !=
                           std::string::npos &&
                       master.cli({"WAIT", "1", "1000"}) == "1";
            },
            20s);
        if (!linked) {
            throw std::runtime_error{"the replica did not link to its master"};
        }
    }
};

}  // namespace

TEST(Replication, AcquisitionsAcknowledgedByAReplicaSucceedForEveryKind) {
    replicated_pair servers;
    redislock::client client{servers.master.uri()};
    const redislock::lock_options acked{.lease = 5s, .min_replicas = 1, .replica_timeout = 1000ms};
    auto m = client.mutex("acked:mutex", acked);
    auto rm = client.recursive_mutex("acked:recursive", acked);
    auto rw = client.shared_mutex("acked:shared", acked);
    auto fenced =
        client.mutex("acked:fenced",
                     {.lease = 5s, .fencing = true, .min_replicas = 1, .replica_timeout = 1000ms});

    ASSERT_TRUE(m.try_lock());
    ASSERT_TRUE(rm.try_lock());
    ASSERT_TRUE(rw.try_lock_shared());
    ASSERT_TRUE(fenced.try_lock());
    // Acknowledged means the replica has it already.
    for (const char* key : {"acked:mutex", "acked:recursive", "acked:shared", "acked:fenced"}) {
        EXPECT_EQ(servers.replica.cli({"EXISTS", key}), "1") << key;
    }
    m.unlock();
    rm.unlock();
    rw.unlock_shared();
    fenced.unlock();
}

TEST(Replication, MoreReplicasThanExistIsAClearErrorAndNothingIsHeld) {
    replicated_pair servers;
    redislock::client client{servers.master.uri()};
    const redislock::lock_options too_many{
        .lease = 5s, .min_replicas = 2, .replica_timeout = 100ms};
    auto m = client.mutex("unacked:mutex", too_many);
    auto rm = client.recursive_mutex("unacked:recursive", too_many);
    auto rw = client.shared_mutex("unacked:shared", too_many);

    EXPECT_THROW((void)m.try_lock(), redislock::replication_error);
    EXPECT_THROW((void)rm.try_lock_for(1s), redislock::replication_error);
    EXPECT_THROW(rw.lock(), redislock::replication_error);
    try {
        (void)m.try_lock();
    } catch (const redislock::replication_error& e) {
        EXPECT_NE(std::string{e.what()}.find("of the 2 replicas asked for"), std::string::npos)
            << e.what();
    }
    EXPECT_FALSE(m.owned());
    EXPECT_FALSE(rm.owned());
    EXPECT_FALSE(rw.owned());
    // Undone in the background at once: nothing stays behind on the master.
    EXPECT_TRUE(eventually([&] { return servers.master.cli({"DBSIZE"}) == "0"; }, 2s));
}

TEST(Replication, ARenewalNoReplicaAcknowledgesEndsInALossAtTheLocalDeadline) {
    replicated_pair servers;
    redislock::client client{servers.master.uri()};
    lost_counter lost;
    auto m = client.mutex("renewed", {.lease = 1500ms,
                                      .watchdog = true,
                                      .on_lost = lost.handler(),
                                      .min_replicas = 1,
                                      .replica_timeout = 150ms});
    ASSERT_TRUE(m.try_lock_for(5s));      // a wait rides out a first WAIT the replica answers late
    std::this_thread::sleep_for(2000ms);  // renewed past its lease while the replica answers
    EXPECT_TRUE(m.owned());
    EXPECT_EQ(lost.calls.load(), 0);

    servers.replica.pause();
    const auto token = m.lost_token();
    EXPECT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 4s));
    EXPECT_TRUE(token.stop_requested());
    EXPECT_FALSE(m.owned());
    servers.replica.resume();
    m.unlock();
}

TEST(Replication, OptionsAreChecked) {
    redis_server srv;
    redislock::client client{srv.uri()};
    EXPECT_THROW((void)client.mutex("x", {.min_replicas = -1}), redislock::invalid_argument);
    EXPECT_THROW((void)client.mutex("x", {.min_replicas = 1, .replica_timeout = 0ms}),
                 redislock::invalid_argument);
    EXPECT_THROW(
        (void)client.mutex("x", {.lease = 100ms, .min_replicas = 1, .replica_timeout = 100ms}),
        redislock::invalid_argument);
}
