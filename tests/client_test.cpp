// basic_client: what it shares with its locks, and what a forked child may do with them.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <system_error>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::test::redis_server;
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
