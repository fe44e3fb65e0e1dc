// basic_client: what it shares with its locks, and what a forked child may do with them.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/deadline.hpp"
#include "support/fault_proxy.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::test::redis_server;
using redislock::test::run_to_end;
using redislock::test::stop_after;
using redislock::test::wait_child;

TEST(Client, InstanceIdsAreRandomAndDistinct) {
    redis_server srv;
    redislock::client a{srv.uri()};
    redislock::client b{srv.uri()};
    EXPECT_EQ(a.instance_id().size(), 32U);
    EXPECT_NE(a.instance_id(), b.instance_id());
}

TEST(Client, WaitSpinOutsideZeroToOneHourIsRefusedBeforeConnecting) {
    // No server listens on port 1: the option is checked first, so the error names it.
    for (const auto spin :
         {std::chrono::microseconds{-1}, std::chrono::microseconds{std::chrono::hours{1}} + 1us,
          std::chrono::microseconds::max()}) {
        try {
            redislock::client c{"redis://127.0.0.1:1",
                                redislock::client_options{.wait_spin = spin}};
            ADD_FAILURE() << "wait_spin " << spin.count() << " us was accepted";
        } catch (const redislock::invalid_argument& e) {
            EXPECT_NE(std::string{e.what()}.find("wait_spin"), std::string::npos) << e.what();
        }
    }
}

// One timed acquisition of each kind, with a deadline 50 ms away, and one lock(stop) of each kind
// stopped after 100 ms, each run after `fault()` and followed by `heal()`: every one must end by
// its deadline (or the stop request) plus deadline_slack, whatever the server does (see
// support/deadline.hpp for what a busy machine adds).
template <class Client>
void expect_timed_calls_end_in_time(Client& client, const std::function<void()>& fault,
                                    const std::function<void()>& heal) {
    auto m = client.mutex("deadline:m", {.lease = 10s});
    auto rm = client.recursive_mutex("deadline:rm", {.lease = 10s});
    auto rw = client.shared_mutex("deadline:rw", {.lease = 10s});
    using timed = std::function<void(std::chrono::steady_clock::time_point)>;
    const std::vector<std::pair<std::string, timed>> timed_calls{
        {"mutex", [&](auto deadline) { (void)m.try_lock_until(deadline); }},
        {"recursive_mutex", [&](auto deadline) { (void)rm.try_lock_until(deadline); }},
        {"shared_mutex", [&](auto deadline) { (void)rw.try_lock_until(deadline); }},
        {"shared_mutex shared", [&](auto deadline) { (void)rw.try_lock_shared_until(deadline); }},
    };
    for (const auto& entry : timed_calls) {
        const std::string& kind = entry.first;
        const auto& call =
            entry.second;  // a lambda may not capture a structured binding (clang 14)
        SCOPED_TRACE(kind + ": try_lock_until(now + 50 ms)");
        fault();
        const auto deadline = std::chrono::steady_clock::now() + 50ms;
        const auto end = run_to_end([&] { call(deadline); });
        heal();
        EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
    }
    using stoppable = std::function<void(std::stop_token)>;
    const std::vector<std::pair<std::string, stoppable>> stoppable_calls{
        {"mutex", [&](std::stop_token stop) { (void)m.lock(stop); }},
        {"recursive_mutex", [&](std::stop_token stop) { (void)rm.lock(stop); }},
        {"shared_mutex", [&](std::stop_token stop) { (void)rw.lock(stop); }},
        {"shared_mutex shared", [&](std::stop_token stop) { (void)rw.lock_shared(stop); }},
    };
    for (const auto& entry : stoppable_calls) {
        const std::string& kind = entry.first;
        const auto& call =
            entry.second;  // a lambda may not capture a structured binding (clang 14)
        SCOPED_TRACE(kind + ": lock(stop), stopped after 100 ms");
        fault();
        stop_after stop{100ms};
        const auto end = run_to_end([&] { call(stop.token()); });
        const auto requested = stop.requested_at();
        heal();
        EXPECT_TRUE(end.by(requested)) << end.late_after(requested) << end.how;
    }
    // Nothing was acquired for good: every call above failed or was given up.
    EXPECT_FALSE(m.owned());
    EXPECT_FALSE(rm.owned());
}

// A lock call that has to open a connection, and whose server then accepts it but answers
// nothing (stopped), ends by its deadline: AUTH and SELECT get the time the call has left.
TEST(Client, TimedLockCallsEndInTimeWhileAConnectionIsOpenedWithAuthAndSelect) {
    redis_server srv{{.extra_args = {"--requirepass", "pw"}}};
    redislock::node_client client{"redis://:pw@127.0.0.1:" + std::to_string(srv.port()) + "/2"};
    expect_timed_calls_end_in_time(
        client,
        [&] {
            ASSERT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");  // reopen at next call
            srv.pause();
        },
        [&] { srv.resume(); });
}

// The same through a network path that stalls: connections stay open, new ones are accepted,
// and nothing comes back.
TEST(Client, TimedLockCallsEndInTimeThroughAStalledPath) {
    redis_server srv{{.extra_args = {"--requirepass", "pw"}}};
    redislock::test::fault_proxy proxy{srv};
    redislock::client client{"redis://:pw@127.0.0.1:" + std::to_string(proxy.port())};
    expect_timed_calls_end_in_time(
        client, [&] { proxy.stall(); }, [&] { proxy.resume(); });
    expect_timed_calls_end_in_time(
        client,
        [&] {
            proxy.cut();  // every connection is opened anew, and the path stalls then
            proxy.stall();
        },
        [&] { proxy.resume(); });
}

// A wait whose server hangs while it waits (a lock held by another, its lease longer than the
// wait) ends by its deadline: no attempt is sent past it, and none gets more than the time left.
TEST(Client, WaitsEndByTheirDeadlineWhenTheServerHangsMeanwhile) {
    redis_server srv;
    redislock::client holder{srv.uri()};
    redislock::client waiter{srv.uri()};
    auto held = holder.mutex("deadline:held:m", {.lease = 10s});
    auto held_r = holder.recursive_mutex("deadline:held:rm", {.lease = 10s});
    auto held_rw = holder.shared_mutex("deadline:held:rw", {.lease = 10s});
    ASSERT_TRUE(held.try_lock());
    ASSERT_TRUE(held_r.try_lock());
    ASSERT_TRUE(held_rw.try_lock());
    auto m = waiter.mutex("deadline:held:m", {.lease = 10s});
    auto rm = waiter.recursive_mutex("deadline:held:rm", {.lease = 10s});
    auto rw = waiter.shared_mutex("deadline:held:rw", {.lease = 10s});
    using timed = std::function<bool(std::chrono::steady_clock::time_point)>;
    const std::vector<std::pair<std::string, timed>> calls{
        {"mutex", [&](auto deadline) { return m.try_lock_until(deadline); }},
        {"recursive_mutex", [&](auto deadline) { return rm.try_lock_until(deadline); }},
        {"shared_mutex", [&](auto deadline) { return rw.try_lock_until(deadline); }},
        {"shared_mutex shared", [&](auto deadline) { return rw.try_lock_shared_until(deadline); }},
    };
    for (const auto& entry : calls) {
        const std::string& kind = entry.first;
        const auto& call =
            entry.second;  // a lambda may not capture a structured binding (clang 14)
        SCOPED_TRACE(kind);
        const auto deadline = std::chrono::steady_clock::now() + 300ms;
        std::thread hang_soon{[&] {
            std::this_thread::sleep_for(100ms);
            srv.pause();
        }};
        bool got = false;
        const auto end = run_to_end([&] { got = call(deadline); });
        hang_soon.join();
        srv.resume();
        EXPECT_FALSE(got);
        EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
    }
    held.unlock();
    held_r.unlock();
    held_rw.unlock();
}

// WAIT for replicas is given no more than the time the call has left (less the server's timer
// tick, by which a WAIT answers late), so a master whose replicas do not answer says so
// (replication_error) by the deadline, rather than the deadline cutting its WAIT short (a
// timeout, the connection closed). A later attempt may find the first one's key still there and
// end the call as contended: false, which is fine too.
TEST(Client, WaitForReplicasGetsNoMoreThanTheTimeLeft) {
    redis_server srv;  // no replica: WAIT 1 waits its whole timeout
    redislock::client client{srv.uri()};
    auto m = client.mutex("deadline:acknowledged",
                          {.lease = 10s, .min_replicas = 1, .replica_timeout = 2s});
    const auto deadline = std::chrono::steady_clock::now() + 400ms;
    const auto end = run_to_end([&] { (void)m.try_lock_until(deadline); });
    EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
    EXPECT_EQ(end.how.find("timeout_error"), std::string::npos) << end.how;
    EXPECT_FALSE(m.owned());
}

TEST(Client, LocksOutliveTheirClientAndStillRelease) {
    redis_server srv;
    auto client = std::make_unique<redislock::client>(srv.uri());
    auto m = client->mutex("outlives", {.lease = 10s});
    m.lock();
    client.reset();
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "outlives"}), "0");
}

// A child inherits copies of its parent's lock objects; unlocking or destroying them there must
// not release what the parent holds.
TEST(Client, ForkedChildNeverReleasesItsParentsLocks) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto simple = client.mutex("fork:simple", {.lease = 10s});
    auto reentrant = client.recursive_mutex("fork:reentrant", {.lease = 10s});
    auto rw = client.shared_mutex("fork:rw", {.lease = 10s});
    simple.lock();
    reentrant.lock();
    rw.lock_shared();

    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        std::error_code simple_ec;
        std::error_code reentrant_ec;
        std::error_code rw_ec;
        simple.unlock(simple_ec);
        reentrant.unlock(reentrant_ec);
        rw.unlock_shared(rw_ec);
        const bool refused = simple_ec == redislock::errc::not_holder &&
                             reentrant_ec == redislock::errc::not_holder &&
                             rw_ec == redislock::errc::not_holder;
        {
            // Destroying the copies must not release either.
            auto moved_simple = std::move(simple);
            auto moved_reentrant = std::move(reentrant);
            auto moved_rw = std::move(rw);
        }
        ::_exit(refused ? 0 : 1);
    }
    const auto status = wait_child(pid, 20s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "the child's unlock() calls did not all report not_holder";

    EXPECT_TRUE(simple.verify());
    EXPECT_TRUE(reentrant.verify());
    EXPECT_TRUE(rw.verify());
    simple.unlock();
    reentrant.unlock();
    rw.unlock_shared();
    EXPECT_EQ(srv.cli({"EXISTS", "fork:simple", "fork:reentrant", "fork:rw"}), "0");
}

// The child's own acquisitions are its own: it may lock and release through the inherited client.
TEST(Client, ForkedChildLocksAndReleasesThroughTheInheritedClient) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("fork:child-own", {.lease = 10s});

    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        bool ok = m.try_lock();
        std::error_code ec;
        m.unlock(ec);
        ok = ok && !ec;
        ::_exit(ok ? 0 : 1);
    }
    const auto status = wait_child(pid, 20s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    EXPECT_EQ(srv.cli({"EXISTS", "fork:child-own"}), "0");
    EXPECT_TRUE(m.try_lock());  // the parent's connection still works after the child's use
    m.unlock();
}

}  // namespace
