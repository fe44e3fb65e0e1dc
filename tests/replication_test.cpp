// lock_options::min_replicas: acquisitions and renewals acknowledged by replicas (WAIT).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <iostream>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>

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

namespace {

using clock_type = std::chrono::steady_clock;

// When a rival polling with `try_rival()` got in, and when `told` (a time the holder's on_lost
// stored) was set; the clock's epoch when it never happened within `limit`.
template <class TryRival>
clock_type::time_point rival_in_within(TryRival try_rival, std::chrono::milliseconds limit) {
    redislock::test::stopwatch since;
    while (since.elapsed() < limit) {
        if (try_rival()) {
            return clock_type::now();
        }
        std::this_thread::sleep_for(5ms);
    }
    return {};
}

long long ms_between(clock_type::time_point from, clock_type::time_point to) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(to - from).count();
}

// Stores the time it is called at, once: an on_lost handler.
struct loss_clock {
    std::atomic<clock_type::rep> at{0};
    std::function<void()> handler() {
        return [this] { at = clock_type::now().time_since_epoch().count(); };
    }
    bool told() const { return at.load() != 0; }
    clock_type::time_point when() const { return clock_type::time_point{clock_type::duration{at}}; }
};

// The rival of a holder of `name`: a lock of the same kind (a writer for the read-write lock)
// of another client.
template <class Lock>
auto rival_of(redislock::client& c, const char* name) {
    if constexpr (std::is_same_v<Lock, redislock::recursive_mutex>) {
        return c.recursive_mutex(name, {.lease = 10s});
    } else {
        return c.shared_mutex(name, {.lease = 10s});
    }
}

// What the renewals refused to a holder of `name` leave: `hold(client, on_lost)` takes the lock
// with min_replicas 1 and the watchdog, and returns the object; a writer of another client then
// polls it while every WAIT counts no replica, and must get in soon after the holder is told
// lost, never before; the holder's late unlock (`let_go`) reports lock_lost and leaves the rival
// alone.
template <class Hold, class LetGo>
void expect_nothing_left_past_the_loss(const char* name, Hold hold, LetGo let_go) {
    replicated_pair servers;
    redislock::client holder_client{servers.master.uri()};
    redislock::client rival_client{servers.master.uri()};
    loss_clock lost;
    auto held = hold(holder_client, lost.handler());
    servers.replica.pause();  // every WAIT from now on counts no replica
    auto rival = rival_of<decltype(held)>(rival_client, name);
    const auto rival_in = rival_in_within([&] { return rival.try_lock(); }, 15s);
    ASSERT_NE(rival_in, clock_type::time_point{}) << name << ": the rival never got in";
    ASSERT_TRUE(lost.told()) << name << ": the holder was never told";
    std::cout << "[ measured ] " << name << ": rival in " << ms_between(lost.when(), rival_in)
              << " ms after the holder was told lost\n";
    EXPECT_GE(rival_in, lost.when()) << name << ": a rival got in before the holder was told lost";
    EXPECT_LT(rival_in - lost.when(), 1s) << name << ": the key outlived the holder's loss by "
                                          << ms_between(lost.when(), rival_in) << " ms";
    std::error_code ec;
    let_go(held, ec);
    EXPECT_EQ(ec, redislock::errc::lock_lost) << name << ": " << ec.message();
    EXPECT_TRUE(rival.owned()) << name;
    servers.replica.resume();
    rival.unlock();
}

redislock::lock_options refused_renewals(std::function<void()> on_lost) {
    return {.lease = 3s,
            .watchdog = true,
            .on_lost = std::move(on_lost),
            .min_replicas = 1,
            .replica_timeout = 100ms};
}

}  // namespace

// As RenewalsRefusedForTooFewReplicasLeaveNothingPastTheHoldersLoss, for the reentrant lock:
// the refused renewals extended the hash on the master; once the holder is told lost, what they
// left goes (its every entry: it had entered twice).
TEST(Replication, RefusedRenewalsOfAReentrantLockLeaveNothingPastTheHoldersLoss) {
    expect_nothing_left_past_the_loss(
        "refused:recursive",
        [](redislock::client& c, std::function<void()> on_lost) {
            auto m = c.recursive_mutex("refused:recursive", refused_renewals(std::move(on_lost)));
            EXPECT_TRUE(m.try_lock_for(5s));
            EXPECT_TRUE(m.try_lock_for(5s));
            return m;
        },
        [](redislock::recursive_mutex& m, std::error_code& ec) {
            m.unlock(ec);
            std::error_code again;
            m.unlock(again);  // the outer entry: nothing is held any more
            EXPECT_EQ(again, redislock::errc::not_held);
        });
}

// The same for the read-write lock, held for writing and, on another name, for reading: the
// refused renewals extended the entry and the key.
TEST(Replication, RefusedRenewalsOfAReadWriteLockLeaveNothingPastTheHoldersLoss) {
    expect_nothing_left_past_the_loss(
        "refused:write",
        [](redislock::client& c, std::function<void()> on_lost) {
            auto m = c.shared_mutex("refused:write", refused_renewals(std::move(on_lost)));
            EXPECT_TRUE(m.try_lock_for(5s));
            return m;
        },
        [](redislock::shared_mutex& m, std::error_code& ec) { m.unlock(ec); });
    expect_nothing_left_past_the_loss(
        "refused:read",
        [](redislock::client& c, std::function<void()> on_lost) {
            auto m = c.shared_mutex("refused:read", refused_renewals(std::move(on_lost)));
            EXPECT_TRUE(m.try_lock_shared_for(5s));
            EXPECT_TRUE(m.try_lock_shared_for(5s));
            return m;
        },
        [](redislock::shared_mutex& m, std::error_code& ec) {
            m.unlock_shared(ec);
            std::error_code again;
            m.unlock_shared(again);
            EXPECT_EQ(again, redislock::errc::not_held);
        });
}

namespace {

// Two objects of one owner share its entry: `a` (lease 3 s, renewed) and `b` (lease 4 s, not
// renewed) hold it; every renewal of `a` is then refused. What a's take-back removes must not
// cut what b was told it has (no rival before b is told lost), and once b is lost too nothing
// stays (the refused renewals pushed the expiry to about 6 s).
template <class Make, class Take, class Give>
void expect_take_back_spares_the_owners_other_object(const char* name, Make make, Take take,
                                                     Give give) {
    replicated_pair servers;
    redislock::client holder_client{servers.master.uri()};
    redislock::client rival_client{servers.master.uri()};
    loss_clock a_lost;
    loss_clock b_lost;
    auto a = make(holder_client, refused_renewals(a_lost.handler()));
    auto b = make(
        holder_client,
        redislock::lock_options{
            .lease = 4s, .on_lost = b_lost.handler(), .min_replicas = 1, .replica_timeout = 100ms});
    ASSERT_TRUE(take(a));
    ASSERT_TRUE(take(b));  // a re-entry of the same owner
    servers.replica.pause();
    auto rival = rival_of<decltype(a)>(rival_client, name);
    const auto rival_in = rival_in_within([&] { return rival.try_lock(); }, 15s);
    ASSERT_NE(rival_in, clock_type::time_point{}) << name << ": the rival never got in";
    ASSERT_TRUE(a_lost.told()) << name;
    ASSERT_TRUE(b_lost.told()) << name << ": b was never told, yet a rival got in";
    EXPECT_LT(a_lost.when(), b_lost.when()) << name;
    std::cout << "[ measured ] " << name << ": a told lost, b "
              << ms_between(a_lost.when(), b_lost.when()) << " ms later, rival in "
              << ms_between(b_lost.when(), rival_in) << " ms after b\n";
    EXPECT_GE(rival_in, b_lost.when())
        << name << ": a rival got in " << ms_between(rival_in, b_lost.when())
        << " ms before b, an object of the same owner, was told lost";
    EXPECT_LT(rival_in - b_lost.when(), 1s)
        << name << ": the key outlived the last holder's loss by "
        << ms_between(b_lost.when(), rival_in) << " ms";
    std::error_code ec;
    give(a, ec);
    EXPECT_EQ(ec, redislock::errc::lock_lost) << name << ": a: " << ec.message();
    give(b, ec);
    EXPECT_EQ(ec, redislock::errc::lock_lost) << name << ": b: " << ec.message();
    EXPECT_TRUE(rival.owned()) << name;
    servers.replica.resume();
    rival.unlock();
}

}  // namespace

TEST(Replication, ATakeBackNeverCutsWhatAnotherObjectOfTheOwnerHolds) {
    expect_take_back_spares_the_owners_other_object(
        "spared:recursive",
        [](redislock::client& c, redislock::lock_options o) {
            return c.recursive_mutex("spared:recursive", std::move(o));
        },
        [](redislock::recursive_mutex& m) { return m.try_lock_for(5s); },
        [](redislock::recursive_mutex& m, std::error_code& ec) { m.unlock(ec); });
    expect_take_back_spares_the_owners_other_object(
        "spared:write",
        [](redislock::client& c, redislock::lock_options o) {
            return c.shared_mutex("spared:write", std::move(o));
        },
        [](redislock::shared_mutex& m) { return m.try_lock_for(5s); },
        [](redislock::shared_mutex& m, std::error_code& ec) { m.unlock(ec); });
    expect_take_back_spares_the_owners_other_object(
        "spared:read",
        [](redislock::client& c, redislock::lock_options o) {
            return c.shared_mutex("spared:read", std::move(o));
        },
        [](redislock::shared_mutex& m) { return m.try_lock_shared_for(5s); },
        [](redislock::shared_mutex& m, std::error_code& ec) { m.unlock_shared(ec); });
}

namespace {

// The take-back after a loss by expiry names the lost acquisition: it never touches a later one
// of the same owner. Here the reaper's lane is held, so the take-back of `a` waits while the
// hash goes (as if expired) and another object of the owner acquires anew; `a`'s unlock meanwhile
// sends nothing and reports lock_lost; once the lane is free the later acquisition still holds.
template <class Make, class Take, class Give>
void expect_take_back_spares_a_later_acquisition(const char* name, Make make, Take take,
                                                 Give give) {
    replicated_pair servers;
    redislock::client holder_client{servers.master.uri()};
    lost_counter lost;
    auto a = make(holder_client, refused_renewals(lost.handler()));
    auto later =
        make(holder_client,
             redislock::lock_options{.lease = 10s, .min_replicas = 1, .replica_timeout = 100ms});
    ASSERT_TRUE(take(a)) << name;
    std::atomic<bool> lane_held{false};
    std::atomic<bool> free_lane{false};
    const auto hold_until = clock_type::now() + 30s;
    redislock::detail::background_reaper().add(
        holder_client.connection().config().describe(),
        [&](clock_type::time_point) {
            lane_held = true;
            while (!free_lane && clock_type::now() < hold_until) {
                std::this_thread::sleep_for(1ms);
            }
            return true;
        },
        hold_until);
    ASSERT_TRUE(eventually([&] { return lane_held.load(); }, 5s)) << name;
    servers.replica.pause();
    ASSERT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 10s)) << name;
    std::error_code ec;
    give(a, ec);
    EXPECT_EQ(ec, redislock::errc::lock_lost) << name << ": " << ec.message();
    servers.replica.resume();
    servers.master.cli({"DEL", name});
    ASSERT_TRUE(take(later)) << name;
    free_lane = true;
    EXPECT_TRUE(redislock::detail::background_reaper().wait_idle(10s)) << name;
    EXPECT_TRUE(later.owned()) << name;
    EXPECT_EQ(servers.master.cli({"EXISTS", name}), "1")
        << name << ": the take-back of a lost acquisition removed a later one";
    give(later, ec);
    EXPECT_FALSE(ec) << name << ": " << ec.message();
    EXPECT_EQ(servers.master.cli({"EXISTS", name}), "0") << name;
}

}  // namespace

TEST(Replication, ATakeBackNeverTouchesALaterAcquisitionOfTheOwner) {
    expect_take_back_spares_a_later_acquisition(
        "later:recursive",
        [](redislock::client& c, redislock::lock_options o) {
            return c.recursive_mutex("later:recursive", std::move(o));
        },
        [](redislock::recursive_mutex& m) { return m.try_lock_for(5s); },
        [](redislock::recursive_mutex& m, std::error_code& ec) { m.unlock(ec); });
    expect_take_back_spares_a_later_acquisition(
        "later:read",
        [](redislock::client& c, redislock::lock_options o) {
            return c.shared_mutex("later:read", std::move(o));
        },
        [](redislock::shared_mutex& m) { return m.try_lock_shared_for(5s); },
        [](redislock::shared_mutex& m, std::error_code& ec) { m.unlock_shared(ec); });
}

// A re-entry whose WAIT saw too few replicas does not count, as an acquisition's would not: the
// call throws replication_error, the entry it made is left again, and the object keeps the
// deadline it had (the refresh was never acknowledged). The same for an object of the owner
// that enters for the first time, and for both modes of the read-write lock.
TEST(Replication, AReentryTooFewReplicasAcknowledgeIsRefusedAndLeftAgain) {
    replicated_pair servers;
    redislock::client client{servers.master.uri()};
    const redislock::lock_options acked{.lease = 10s, .min_replicas = 1, .replica_timeout = 100ms};
    auto rm = client.recursive_mutex("reentry:recursive", acked);
    auto same_owner = client.recursive_mutex("reentry:recursive", acked);
    auto writer = client.shared_mutex("reentry:write", acked);
    auto reader = client.shared_mutex("reentry:read", acked);
    ASSERT_TRUE(rm.try_lock_for(5s));
    ASSERT_TRUE(writer.try_lock_for(5s));
    ASSERT_TRUE(reader.try_lock_shared_for(5s));
    servers.replica.pause();
    std::this_thread::sleep_for(500ms);  // a refresh that counted would move the deadline later
    const auto before = rm.remaining();
    EXPECT_THROW((void)rm.try_lock(), redislock::replication_error);
    EXPECT_EQ(rm.depth(), 1u);
    EXPECT_LE(rm.remaining(), before);
    EXPECT_THROW((void)same_owner.try_lock(), redislock::replication_error);
    EXPECT_FALSE(same_owner.owned());
    EXPECT_THROW((void)writer.try_lock(), redislock::replication_error);
    EXPECT_THROW((void)reader.try_lock_shared(), redislock::replication_error);
    servers.replica.resume();
    // One entry each is left in Redis: one release frees each lock.
    std::error_code ec;
    rm.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    writer.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    reader.unlock_shared(ec);
    EXPECT_FALSE(ec) << ec.message();
    for (const char* key : {"reentry:recursive", "reentry:write", "reentry:read"}) {
        EXPECT_EQ(servers.master.cli({"EXISTS", key}), "0") << key << " is still held";
    }
}

// An acquisition refused for too few replicas, by a wait that tried again until its time was
// up, leaves nothing behind: the caller was told it does not hold, and a rival gets in at once.
TEST(Replication, RefusedAttemptsOfReentrantAndReadWriteLocksLeaveNothingBehind) {
    replicated_pair servers;
    redislock::client client{servers.master.uri()};
    redislock::client rival_client{servers.master.uri()};
    const redislock::lock_options acked{.lease = 10s, .min_replicas = 1, .replica_timeout = 100ms};
    auto rm = client.recursive_mutex("attempt:recursive", acked);
    auto rw = client.shared_mutex("attempt:shared", acked);
    auto rm_rival = rival_client.recursive_mutex("attempt:recursive", {.lease = 10s});
    auto rw_rival = rival_client.shared_mutex("attempt:shared", {.lease = 10s});
    servers.replica.pause();
    const auto rival_in_after_refusal = [](const auto& attempt, auto& rival) {
        EXPECT_THROW((void)attempt(), redislock::replication_error);
        const redislock::test::stopwatch since;
        const bool in = eventually([&] { return rival.try_lock(); }, 5s);
        std::cout << "[ measured ] rival in " << since.elapsed().count()
                  << " ms after the refusal\n";
        EXPECT_TRUE(in);
        EXPECT_LT(since.elapsed(), 1s) << "a refused attempt kept the lock";
        if (in) {
            rival.unlock();
        }
    };
    rival_in_after_refusal([&] { return rm.try_lock_for(600ms); }, rm_rival);
    rival_in_after_refusal([&] { return rw.try_lock_for(600ms); }, rw_rival);
    rival_in_after_refusal([&] { return rw.try_lock_shared_for(600ms); }, rw_rival);
    servers.replica.resume();
    EXPECT_FALSE(rm.owned());
    EXPECT_FALSE(rw.owned());
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

// An acquisition refused for too few replicas is undone before the call returns, and only its
// own entry: the same owner's next acquisition, through another object right after, may join
// what is still there, and must keep it. (The randomized checker found a write lock lost 67 ms
// after it was acquired this way on a Sentinel master with one replica killed: the refused
// entry was dropped whole in the background, the next object's entry with it.)
TEST(Replication, ARefusedAcquisitionNeverTakesTheOwnersNextHoldWithIt) {
    redis_server srv;  // no replica: every WAIT counts 0
    redislock::client client{srv.uri()};
    const redislock::lock_options acked{.lease = 10s, .min_replicas = 1, .replica_timeout = 10ms};
    const redislock::lock_options plain{.lease = 10s};
    const auto check = [&](const char* what, auto refuse, auto next_lock, auto& next) {
        for (int round = 0; round < 10; ++round) {
            EXPECT_THROW(refuse(), redislock::replication_error) << what;
            ASSERT_TRUE(next_lock()) << what;
            std::this_thread::sleep_for(50ms);  // the background work of the refusal, if any
            EXPECT_TRUE(next.verify()) << what << ": the next hold was taken, round " << round;
            std::error_code ec;
            next.unlock(ec);
            EXPECT_FALSE(ec) << what << ": " << ec.message() << ", round " << round;
            ASSERT_EQ(srv.cli({"DBSIZE"}), "0") << what << ", round " << round;
        }
    };
    auto rm_refused = client.recursive_mutex("next:recursive", acked);
    auto rm_next = client.recursive_mutex("next:recursive", plain);
    check(
        "reentrant", [&] { return rm_refused.try_lock(); }, [&] { return rm_next.try_lock(); },
        rm_next);
    auto rw_refused = client.shared_mutex("next:shared", acked);
    auto rw_next = client.shared_mutex("next:shared", plain);
    check(
        "write", [&] { return rw_refused.try_lock(); }, [&] { return rw_next.try_lock(); },
        rw_next);
}

// An acquisition given up with its outcome unknown (its WAIT outlived the call's deadline: the
// entry is in Redis, the caller was told false) is the reaper's to leave. The same owner's next
// acquisition, through another object, must not join that entry: the reaper's leave would take
// the new hold with it, or the new hold's release would leave the given-up entry behind.
TEST(Replication, AnAcquisitionGivenUpMidFlightIsNeverJoinedByTheOwnersNextOne) {
    redis_server srv;  // no replica: every WAIT waits its whole timeout
    redislock::client client{srv.uri()};
    const redislock::lock_options acked{.lease = 10s, .min_replicas = 1, .replica_timeout = 200ms};
    const redislock::lock_options plain{.lease = 10s};
    const auto check = [&](const char* what, auto give_up, auto next_lock, auto& next,
                           auto next_unlock) {
        for (int round = 0; round < 10; ++round) {
            bool acquired = true;
            try {
                acquired = give_up();
            } catch (const redislock::error&) {
                acquired = false;
            }
            EXPECT_FALSE(acquired) << what;
            ASSERT_TRUE(next_lock()) << what;
            std::this_thread::sleep_for(400ms);  // the reaper's leave of the given-up entry
            EXPECT_TRUE(next.verify()) << what << ": the next hold was taken, round " << round;
            std::error_code ec;
            next_unlock(ec);
            EXPECT_FALSE(ec) << what << ": " << ec.message() << ", round " << round;
            EXPECT_TRUE(eventually([&] { return srv.cli({"DBSIZE"}) == "0"; }, 2s))
                << what << ": left behind after the release, round " << round;
        }
    };
    auto rm_given_up = client.recursive_mutex("joined:recursive", acked);
    auto rm_next = client.recursive_mutex("joined:recursive", plain);
    check(
        "reentrant", [&] { return rm_given_up.try_lock_for(20ms); },
        [&] { return rm_next.try_lock(); }, rm_next,
        [&](std::error_code& ec) { rm_next.unlock(ec); });
    auto rw_given_up = client.shared_mutex("joined:shared", acked);
    auto rw_next = client.shared_mutex("joined:shared", plain);
    check(
        "write", [&] { return rw_given_up.try_lock_for(20ms); }, [&] { return rw_next.try_lock(); },
        rw_next, [&](std::error_code& ec) { rw_next.unlock(ec); });
    check(
        "read", [&] { return rw_given_up.try_lock_shared_for(20ms); },
        [&] { return rw_next.try_lock_shared(); }, rw_next,
        [&](std::error_code& ec) { rw_next.unlock_shared(ec); });
}
