// lock_options::min_replicas: acquisitions and renewals acknowledged by replicas (WAIT).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <system_error>
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

// Renewals refused for too few replicas still ran on the master and pushed its key's expiry out;
// none of them counts, so the holder is told lost at its local deadline. What they left must not
// outlive that: a rival polling the master gets in soon after the loss is told, and never before.
TEST(Replication, RenewalsRefusedForTooFewReplicasLeaveNothingPastTheHoldersLoss) {
    using clock = std::chrono::steady_clock;
    replicated_pair servers;
    redislock::client holder_client{servers.master.uri()};
    redislock::client rival_client{servers.master.uri()};
    std::atomic<clock::rep> lost_at{0};
    auto held = holder_client.mutex(
        "refused-renewals", {.lease = 3s,
                             .watchdog = true,
                             .on_lost = [&] { lost_at = clock::now().time_since_epoch().count(); },
                             .min_replicas = 1,
                             .replica_timeout = 100ms});
    ASSERT_TRUE(held.try_lock_for(5s));
    servers.replica.pause();  // every WAIT from now on counts no replica
    auto rival = rival_client.mutex("refused-renewals", {.lease = 10s});
    redislock::test::stopwatch since_pause;
    clock::time_point rival_in{};
    while (since_pause.elapsed() < 15s) {
        if (rival.try_lock()) {
            rival_in = clock::now();
            break;
        }
        std::this_thread::sleep_for(5ms);
    }
    ASSERT_NE(rival_in, clock::time_point{}) << "the rival never got in";
    ASSERT_NE(lost_at.load(), 0) << "the holder was never told";
    const clock::time_point told{clock::duration{lost_at.load()}};
    EXPECT_GE(rival_in, told) << "a rival got in before the holder was told lost";
    EXPECT_LT(rival_in - told, 1s)
        << "the key outlived the holder's loss by "
        << std::chrono::duration_cast<std::chrono::milliseconds>(rival_in - told).count() << " ms";
    std::error_code ec;
    held.unlock(ec);
    EXPECT_EQ(ec, redislock::errc::lock_lost);
    EXPECT_TRUE(rival.owned());  // the holder's late unlock left the rival's key alone
    servers.replica.resume();
    rival.unlock();
}

// Once a loss by expiry is told, unlock(ec) reports lock_lost whether or not the background
// take-back of what the refused renewals left has run yet. Here it has not: the reaper's lane for
// this server is held by another cleanup, so the unlock finds the key still holding our token.
TEST(Replication, UnlockAfterALossByExpiryIsToldReportsLockLostBeforeTheTakeBackRuns) {
    using clock = std::chrono::steady_clock;
    replicated_pair servers;
    redislock::client holder_client{servers.master.uri()};
    lost_counter lost;
    auto held = holder_client.mutex("told-then-unlocked", {.lease = 3s,
                                                           .watchdog = true,
                                                           .on_lost = lost.handler(),
                                                           .min_replicas = 1,
                                                           .replica_timeout = 100ms});
    ASSERT_TRUE(held.try_lock_for(5s));
    std::atomic<bool> lane_held{false};
    std::atomic<bool> free_lane{false};
    const auto hold_until = clock::now() + 30s;
    redislock::detail::background_reaper().add(
        holder_client.connection().config().describe(),
        [&](clock::time_point) {
            lane_held = true;
            while (!free_lane && clock::now() < hold_until) {
                std::this_thread::sleep_for(1ms);
            }
            return true;
        },
        hold_until);
    ASSERT_TRUE(eventually([&] { return lane_held.load(); }, 5s));
    servers.replica.pause();  // every renewal from now on is refused, yet extends the key
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 10s));
    std::error_code ec;
    held.unlock(ec);
    EXPECT_EQ(ec, redislock::errc::lock_lost) << ec.message();
    free_lane = true;
    servers.replica.resume();
    EXPECT_TRUE(redislock::detail::background_reaper().wait_idle(10s));
    EXPECT_EQ(servers.master.cli({"EXISTS", "told-then-unlocked"}), "0");
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
