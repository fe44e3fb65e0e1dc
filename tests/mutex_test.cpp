#include <redislock/mutex.hpp>

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/redislock.hpp>

#include "support/faulty_connection.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::errc;
using redislock::lock_options;
using redislock::reply;
using redislock::test::lost_counter;
using redislock::test::redis_server;
using redislock::test::stopwatch;
using redislock::test::subscriber;

static_assert(noexcept(std::declval<redislock::mutex&>().unlock()));
static_assert(noexcept(std::declval<redislock::mutex&>().unlock(std::declval<std::error_code&>())));
static_assert(!std::is_copy_constructible_v<redislock::mutex>);
static_assert(std::is_nothrow_move_constructible_v<redislock::mutex>);

reply run(redislock::client& client, std::initializer_list<std::string_view> words) {
    const std::vector<std::string_view> argv{words};
    return client.connection().execute(argv);
}

// ---------------------------------------------------------------------------------------------
// Basic locking

TEST(Mutex, LockWritesARandomTokenWithTheLeaseAndUnlockDeletesIt) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("orders:42", {.lease = 5s});

    m.lock();
    const std::string token = srv.cli({"GET", "orders:42"});
    EXPECT_EQ(token.size(), 32U);
    EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos) << token;
    const int pttl = std::stoi(srv.cli({"PTTL", "orders:42"}));
    EXPECT_GT(pttl, 0);
    EXPECT_LE(pttl, 5000);
    EXPECT_TRUE(m.owned());

    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(m.owned());
    EXPECT_EQ(srv.cli({"EXISTS", "orders:42"}), "0");
}

TEST(Mutex, EachAcquisitionGetsAFreshToken) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    m.lock();
    const std::string first = srv.cli({"GET", "k"});
    m.unlock();
    m.lock();
    const std::string second = srv.cli({"GET", "k"});
    m.unlock();
    EXPECT_NE(first, second);
}

TEST(Mutex, TryLockFailsWhileAnotherObjectHoldsAndSucceedsAfterRelease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto a = client.mutex("k");
    auto b = client.mutex("k");
    ASSERT_TRUE(a.try_lock());
    EXPECT_FALSE(b.try_lock());
    EXPECT_FALSE(b.owned());
    a.unlock();
    EXPECT_TRUE(b.try_lock());
    EXPECT_FALSE(a.try_lock());
    b.unlock();
}

TEST(Mutex, DifferentNamesDoNotExcludeEachOther) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto a = client.mutex("a");
    auto b = client.mutex("b");
    ASSERT_TRUE(a.try_lock());
    EXPECT_TRUE(b.try_lock());
    a.unlock();
    b.unlock();
}

TEST(Mutex, TwoClientsExcludeEachOther) {
    redis_server srv;
    redislock::client first{srv.uri()};
    redislock::client second{srv.uri()};
    auto a = first.mutex("k");
    auto b = second.mutex("k");
    ASSERT_TRUE(a.try_lock());
    EXPECT_FALSE(b.try_lock());
    a.unlock();
    EXPECT_TRUE(b.try_lock());
    b.unlock();
}

TEST(Mutex, TryLockForWaitsForTheHolderToLetGo) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "300"}), "OK");
    const stopwatch watch;
    EXPECT_TRUE(m.try_lock_for(5s));
    EXPECT_LT(watch.elapsed(), 5s);
    EXPECT_EQ(srv.cli({"STRLEN", "k"}), "32");
    m.unlock();
}

TEST(Mutex, TryLockForGivesUpAtItsDeadline) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "20000"}), "OK");
    const stopwatch watch;
    EXPECT_FALSE(m.try_lock_for(200ms));
    EXPECT_GE(watch.elapsed(), 200ms);
    EXPECT_LT(watch.elapsed(), 5s);
    EXPECT_FALSE(m.owned());
    EXPECT_EQ(srv.cli({"GET", "k"}), "other");
}

TEST(Mutex, TryLockForZeroOrNegativeTriesExactlyOnce) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    EXPECT_TRUE(m.try_lock_for(0ms));
    m.unlock();
    EXPECT_TRUE(m.try_lock_for(-5s));
    m.unlock();
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "20000"}), "OK");
    EXPECT_FALSE(m.try_lock_for(0ms));
    EXPECT_FALSE(m.try_lock_for(-5s));
}

TEST(Mutex, TryLockUntilAcceptsDeadlinesOnAnyClock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "20000"}), "OK");
    EXPECT_FALSE(m.try_lock_until(std::chrono::steady_clock::now() + 100ms));
    EXPECT_FALSE(m.try_lock_until(std::chrono::system_clock::now() + 100ms));
    EXPECT_FALSE(m.try_lock_until(std::chrono::system_clock::now() - 1h));

    ASSERT_EQ(srv.cli({"DEL", "k"}), "1");
    // A deadline already past still gets its one attempt.
    EXPECT_TRUE(m.try_lock_until(std::chrono::system_clock::now() - 1h));
    m.unlock();
    EXPECT_TRUE(m.try_lock_until(std::chrono::steady_clock::now() + 1s));
    m.unlock();
}

TEST(Mutex, LockBlocksUntilTheHolderLetsGo) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "300"}), "OK");
    const stopwatch watch;
    m.lock();
    EXPECT_LT(watch.elapsed(), 5s);
    EXPECT_TRUE(m.owned());
    EXPECT_NE(srv.cli({"GET", "k"}), "other");
    m.unlock();
}

// ---------------------------------------------------------------------------------------------
// Holder rules

TEST(Mutex, LockTwiceFromTheHolderThreadThrowsResourceDeadlock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    m.lock();
    try {
        m.lock();
        FAIL() << "a second lock() by the holder must throw";
    } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), std::errc::resource_deadlock_would_occur);
    }
    EXPECT_THROW((void)m.try_lock(), std::system_error);
    EXPECT_THROW((void)m.try_lock_for(10ms), std::system_error);
    // Still held, and by the first acquisition.
    EXPECT_TRUE(m.owned());
    EXPECT_TRUE(m.verify());
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
}

TEST(Mutex, UnlockFromAnotherThreadIsNotHolderAndTheLockStaysHeld) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    m.lock();
    const std::string token = srv.cli({"GET", "k"});

    std::error_code from_other;
    std::thread{[&] { m.unlock(from_other); }}.join();
    std::thread{[&] { m.unlock(); }}.join();  // the noexcept overload does nothing either

    EXPECT_EQ(from_other, errc::not_holder);
    EXPECT_TRUE(m.owned());
    EXPECT_EQ(srv.cli({"GET", "k"}), token);
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

// The holder is known by a number no later thread gets: a thread that may have been given an
// ended holder's std::thread::id neither unlocks the lock it left nor is refused a lock() as if
// it held it (each kind that keeps a holder thread).
TEST(Mutex, ThreadThatCameAfterAnEndedHolderIsNotTheHolder) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto simple = client.mutex("s", {.lease = 10s});
    auto reentrant = client.recursive_mutex("r", {.lease = 10s});
    std::thread{[&] {
        simple.lock();
        reentrant.lock();
    }}.join();  // ends holding both
    std::thread{[&] {
        std::error_code ec;
        simple.unlock(ec);
        EXPECT_EQ(ec, errc::not_holder);
        EXPECT_NO_THROW(EXPECT_FALSE(simple.try_lock()));
        reentrant.unlock(ec);
        EXPECT_EQ(ec, errc::not_holder);
    }}.join();
    EXPECT_EQ(srv.cli({"EXISTS", "s"}), "1");
    EXPECT_EQ(srv.cli({"EXISTS", "r"}), "1");
}

TEST(Mutex, UnlockWhenNotHeldIsNotHeld) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::not_held);
    m.unlock();

    m.lock();
    m.unlock(ec);
    ASSERT_FALSE(ec) << ec.message();
    m.unlock(ec);
    EXPECT_EQ(ec, errc::not_held);
}

TEST(Mutex, UnlockOfAnObjectThatNeverHeldLeavesAnotherHoldersKey) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto holder = client.mutex("k");
    auto bystander = client.mutex("k");
    holder.lock();
    std::error_code ec;
    bystander.unlock(ec);
    EXPECT_EQ(ec, errc::not_held);
    EXPECT_TRUE(holder.verify());
    holder.unlock();
}

TEST(Mutex, ExplicitOwnerLetsAnotherThreadUnlock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k", {.owner = "job-7"});
    m.lock();
    std::error_code ec;
    std::thread{[&] { m.unlock(ec); }}.join();
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

TEST(Mutex, ErrorCodesBelongToTheRedislockCategory) {
    const std::error_code codes[] = {errc::not_held, errc::not_holder, errc::lock_lost,
                                     errc::connection_failed, errc::server_failed};
    for (const auto& code : codes) {
        EXPECT_STREQ(code.category().name(), "redislock");
        EXPECT_NE(code.message(), "unknown redislock error");
    }
    for (std::size_t i = 0; i < std::size(codes); ++i) {
        for (std::size_t j = i + 1; j < std::size(codes); ++j) {
            EXPECT_NE(codes[i].message(), codes[j].message());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cancellation

TEST(Mutex, LockWithStopTokenReturnsFalseOnceStopIsRequested) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "20000"}), "OK");
    std::stop_source stop;
    std::jthread stopper{[&] {
        std::this_thread::sleep_for(100ms);
        stop.request_stop();
    }};
    const stopwatch watch;
    EXPECT_FALSE(m.lock(stop.get_token()));
    EXPECT_LT(watch.elapsed(), 5s);
    EXPECT_FALSE(m.owned());
    EXPECT_EQ(srv.cli({"GET", "k"}), "other");
}

TEST(Mutex, TryLockForWithStopTokenReturnsFalseOnceStopIsRequested) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "20000"}), "OK");
    std::stop_source stop;
    std::jthread stopper{[&] {
        std::this_thread::sleep_for(100ms);
        stop.request_stop();
    }};
    const stopwatch watch;
    EXPECT_FALSE(m.try_lock_for(15s, stop.get_token()));
    EXPECT_LT(watch.elapsed(), 5s);
}

TEST(Mutex, LockWithStopTokenTakesAFreeLock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    std::stop_source stop;
    EXPECT_TRUE(m.lock(stop.get_token()));
    EXPECT_TRUE(m.owned());
    m.unlock();
}

TEST(Mutex, StopRequestedBeforehandGivesUpAfterOneAttempt) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    std::stop_source stop;
    stop.request_stop();
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "20000"}), "OK");
    const stopwatch watch;
    EXPECT_FALSE(m.lock(stop.get_token()));
    EXPECT_FALSE(m.try_lock_until(std::chrono::steady_clock::now() + 15s, stop.get_token()));
    EXPECT_LT(watch.elapsed(), 5s);
}

// ---------------------------------------------------------------------------------------------
// Bad input

TEST(Mutex, EmptyNameIsInvalid) {
    redis_server srv;
    redislock::client client{srv.uri()};
    EXPECT_THROW((void)client.mutex(""), redislock::invalid_argument);
}

TEST(Mutex, NameUpTo64KiBWorksAndLongerIsInvalid) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string longest(64 * 1024, 'n');
    auto m = client.mutex(longest, {.fencing = true});
    ASSERT_TRUE(m.try_lock());
    EXPECT_GT(m.fencing_token(), 0);
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();

    EXPECT_THROW((void)client.mutex(longest + "n"), redislock::invalid_argument);
}

TEST(Mutex, LeaseOutOfRangeIsInvalid) {
    redis_server srv;
    redislock::client client{srv.uri()};
    for (const auto lease : {0ms, -1ms, redislock::max_lease + 1ms,
                             std::chrono::milliseconds::max(), std::chrono::milliseconds::min()}) {
        EXPECT_THROW((void)client.mutex("k", {.lease = lease}), redislock::invalid_argument)
            << lease.count();
    }
}

TEST(Mutex, LongestLeaseIsAccepted) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k", {.lease = redislock::max_lease});
    ASSERT_TRUE(m.try_lock());
    EXPECT_GT(std::stoll(srv.cli({"PTTL", "k"})), (redislock::max_lease - 1h).count());
    EXPECT_GT(m.remaining(), redislock::max_lease / 2);
    m.unlock();
}

TEST(Mutex, ExtendRejectsALeaseOutOfRangeAndKeepsTheLock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    m.lock();
    for (const auto lease : {0ms, -5ms, redislock::max_lease + 1ms}) {
        EXPECT_THROW((void)m.extend(lease), redislock::invalid_argument) << lease.count();
    }
    EXPECT_TRUE(m.verify());
    m.unlock();
}

TEST(Mutex, BackoffBoundsMustBeOrdered) {
    redis_server srv;
    redislock::client client{srv.uri()};
    EXPECT_THROW((void)client.mutex("k", {.backoff_min = -1ms}), redislock::invalid_argument);
    // Zero would turn waiting into a tight polling loop.
    EXPECT_THROW((void)client.mutex("k", {.backoff_min = 0ms}), redislock::invalid_argument);
    EXPECT_THROW((void)client.mutex("k", {.backoff_min = 10ms, .backoff_max = 5ms}),
                 redislock::invalid_argument);
    EXPECT_NO_THROW((void)client.mutex("k", {.backoff_min = 5ms, .backoff_max = 5ms}));
}

TEST(Mutex, NameHoldingAHashFailsWithWrongtypeNotAHang) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "k", "field", "value"}), "1");
    for (const bool fencing : {false, true}) {
        SCOPED_TRACE(fencing ? "fenced" : "plain");
        auto m = client.mutex("k", {.fencing = fencing});
        const std::vector<std::function<void()>> calls{
            [&] { (void)m.try_lock(); },
            [&] { m.lock(); },
            [&] { (void)m.try_lock_for(10s); },
        };
        for (const auto& call : calls) {
            const stopwatch watch;
            try {
                call();
                ADD_FAILURE() << "locking a name that holds a hash must throw";
            } catch (const redislock::server_error& e) {
                EXPECT_NE(std::string{e.what()}.find("WRONGTYPE"), std::string::npos) << e.what();
            }
            EXPECT_LT(watch.elapsed(), 5s);
            EXPECT_FALSE(m.owned());
        }
    }
    EXPECT_EQ(srv.cli({"HGET", "k", "field"}), "value");
}

TEST(Mutex, ClosedPortFailsWithConnectionError) {
    const redislock::test::refused_port closed;
    const stopwatch watch;
    EXPECT_THROW(redislock::node_client{closed.uri()}, redislock::connection_error);
    EXPECT_LT(watch.elapsed(), 5s);
}

TEST(Mutex, UnansweredConnectFailsWithConnectionErrorAfterTheConnectTimeout) {
    const redislock::test::unresponsive_listener silent;
    const stopwatch watch;
    EXPECT_THROW(redislock::node_client{silent.uri() + "?connect_timeout=300"},
                 redislock::connection_error);
    EXPECT_GE(watch.elapsed(), 250ms);
    EXPECT_LT(watch.elapsed(), 5s);
}

TEST(Mutex, PausedServerFailsWithConnectionErrorAfterTheTimeout) {
    redis_server srv;
    srv.pause();
    const stopwatch watch;
    EXPECT_THROW(
        [&] {
            redislock::client client{
                redislock::test::with_query(srv, "connect_timeout=300&command_timeout=300")};
            (void)client.mutex("k").try_lock();
        }(),
        redislock::connection_error);
    EXPECT_LT(watch.elapsed(), 5s);
    srv.resume();
}

TEST(Mutex, LockOnAServerPausedMidwayFailsWithConnectionError) {
    redis_server srv;
    redislock::client client{redislock::test::with_query(srv, "command_timeout=300")};
    auto m = client.mutex("k");
    m.lock();
    m.unlock();
    srv.pause();
    const stopwatch watch;
    EXPECT_THROW(m.lock(), redislock::connection_error);
    EXPECT_LT(watch.elapsed(), 5s);
    EXPECT_FALSE(m.owned());
    srv.resume();
}

TEST(Mutex, UnlockOnAPausedServerFailsWithoutThrowingAndTheNextLockFinishesIt) {
    redis_server srv;
    redislock::client client{redislock::test::with_query(srv, "command_timeout=300")};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    m.unlock();  // loads the release script, so the late release below can run
    m.lock();
    srv.pause();
    const stopwatch watch;
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::connection_failed);
    EXPECT_LT(watch.elapsed(), 5s);
    EXPECT_FALSE(m.owned());
    srv.resume();

    EXPECT_TRUE(m.try_lock());
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
    EXPECT_EQ(lost.calls.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Server faults

TEST(Mutex, ScriptFlushIsRecovered) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k", {.fencing = true});
    ASSERT_TRUE(m.try_lock());
    ASSERT_EQ(srv.cli({"SCRIPT", "FLUSH"}), "OK");
    EXPECT_TRUE(m.extend(10s));
    ASSERT_EQ(srv.cli({"SCRIPT", "FLUSH"}), "OK");
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
    ASSERT_EQ(srv.cli({"SCRIPT", "FLUSH"}), "OK");
    ASSERT_TRUE(m.try_lock());
    EXPECT_GT(m.fencing_token(), 1);
    m.unlock();
}

TEST(Mutex, ServerRestartIsRecovered) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k", {.fencing = true});
    ASSERT_TRUE(m.try_lock());
    m.unlock();

    srv.restart();

    ASSERT_TRUE(m.try_lock());
    EXPECT_GT(m.fencing_token(), 0);
    EXPECT_TRUE(m.extend(10s));
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

TEST(Mutex, LockHeldAcrossARestartIsReportedLost) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    srv.restart();  // no persistence: the key is gone
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);
}

TEST(Mutex, ClientKillIsRecoveredByTheNextCall) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    m.lock();
    EXPECT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");
    std::error_code ec;
    EXPECT_NO_THROW(m.unlock(ec));
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");

    EXPECT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");
    EXPECT_NO_THROW(m.lock());
    EXPECT_TRUE(m.owned());
    EXPECT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "normal"}), "0");
    EXPECT_NO_THROW(EXPECT_TRUE(m.verify()));
    m.unlock();
}

// ---------------------------------------------------------------------------------------------
// Lease, expiry and loss

TEST(Mutex, ExpiredLockIsReportedLostOnceAndNotDeletedOnUnlock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.lease = 200ms, .on_lost = lost.handler()});
    auto other = client.mutex("k");
    m.lock();
    std::this_thread::sleep_for(400ms);

    EXPECT_FALSE(m.owned());
    EXPECT_EQ(m.remaining(), 0ms);
    ASSERT_TRUE(other.try_lock());
    const std::string others_token = srv.cli({"GET", "k"});

    EXPECT_FALSE(m.verify());
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(m.verify());
    EXPECT_EQ(lost.calls.load(), 1);

    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(srv.cli({"GET", "k"}), others_token);
    EXPECT_TRUE(other.verify());
    other.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
}

TEST(Mutex, ExpiryFoundByUnlockCallsOnLostOnce) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.lease = 200ms, .on_lost = lost.handler()});
    m.lock();
    std::this_thread::sleep_for(400ms);
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);
    m.unlock(ec);
    EXPECT_EQ(ec, errc::not_held);
    EXPECT_EQ(lost.calls.load(), 1);
}

TEST(Mutex, ExpiryFoundByExtendCallsOnLostOnceAndDoesNotRecreateTheKey) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.lease = 200ms, .on_lost = lost.handler()});
    m.lock();
    std::this_thread::sleep_for(400ms);
    EXPECT_FALSE(m.extend(10s));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(m.extend(10s));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
    EXPECT_EQ(m.remaining(), 0ms);
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);
}

TEST(Mutex, KeyOverwrittenByAnotherClientIsLost) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    m.lock();
    ASSERT_EQ(srv.cli({"SET", "k", "usurper"}), "OK");
    EXPECT_FALSE(m.verify());
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(m.owned());
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(srv.cli({"GET", "k"}), "usurper");
    EXPECT_EQ(lost.calls.load(), 1);
}

TEST(Mutex, LossIsReportedOncePerAcquisition) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    for (int round = 1; round <= 3; ++round) {
        m.lock();
        ASSERT_EQ(srv.cli({"DEL", "k"}), "1");
        EXPECT_FALSE(m.verify());
        std::error_code ec;
        m.unlock(ec);
        EXPECT_EQ(ec, errc::lock_lost);
        EXPECT_EQ(lost.calls.load(), round);
    }
}

TEST(Mutex, RemainingCountsFromTheSuccessfulAttempt) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k", {.lease = 5s});
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "1000"}), "OK");
    const stopwatch watch;
    m.lock();
    const auto waited = watch.elapsed();
    const auto left = m.remaining();
    ASSERT_GE(waited, 400ms) << "the lock should have waited for the holder";
    // Counted from the call, it would be at most 5 s - 400 ms.
    EXPECT_GT(left, 4700ms);
    EXPECT_LE(left, 5s);
    m.unlock();
}

TEST(Mutex, RemainingIsZeroUnlessHeldAndNeverAboveTheLease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k", {.lease = 10s});
    EXPECT_EQ(m.remaining(), 0ms);
    EXPECT_FALSE(m.owned());
    m.lock();
    EXPECT_GT(m.remaining(), 9s);
    EXPECT_LT(m.remaining(), 10s);  // the drift allowance makes it conservative
    m.unlock();
    EXPECT_EQ(m.remaining(), 0ms);
    EXPECT_FALSE(m.owned());
}

TEST(Mutex, ExtendResetsTheLeaseOnTheServerAndLocally) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.lease = 1s, .on_lost = lost.handler()});
    EXPECT_FALSE(m.extend(60s));  // not held: nothing to extend, nothing lost
    m.lock();
    EXPECT_TRUE(m.extend(60s));
    EXPECT_GT(std::stoi(srv.cli({"PTTL", "k"})), 30000);
    EXPECT_GT(m.remaining(), 30s);
    EXPECT_TRUE(m.extend(2s));  // shortening is allowed too
    EXPECT_LE(std::stoi(srv.cli({"PTTL", "k"})), 2000);
    EXPECT_LE(m.remaining(), 2s);
    m.unlock();
    EXPECT_FALSE(m.extend(60s));
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
    EXPECT_EQ(lost.calls.load(), 0);
}

// A shorter lease may land although the extend() that sent it fails (its reply lost): the
// holder counts on the shorter one from the moment it was sent, never on time the server no
// longer gives it; a longer lease that may not have landed leaves the old deadline.
TEST(Mutex, AShorteningExtendWhoseReplyIsLostCutsTheLocalDeadlineToo) {
    redis_server srv;
    using faulty = redislock::test::faulty_connection<redislock::hiredis_connection>;
    faulty conn{srv.uri()};
    redislock::basic_client<faulty> client{conn};
    auto m = client.mutex("k", {.lease = 60s});
    m.lock();
    ASSERT_TRUE(m.extend(60s));  // the script is loaded: a dropped reply is then its answer's
    for (const auto action : {redislock::test::fault_action::drop_reply,
                              redislock::test::fault_action::throw_after_send}) {
        conn.add({.command = "EVALSHA", .script = "mutex_extend", .action = action});
        EXPECT_THROW((void)m.extend(120s), redislock::connection_error);
        EXPECT_GT(m.remaining(), 30s) << to_string(action);
        conn.add({.command = "EVALSHA", .script = "mutex_extend", .action = action});
        EXPECT_THROW((void)m.extend(2s), redislock::connection_error);
        EXPECT_LE(std::stoi(srv.cli({"PTTL", "k"})), 2000) << to_string(action);
        EXPECT_LE(m.remaining(), 2s) << to_string(action);
        ASSERT_TRUE(m.extend(60s));
    }
    m.unlock();
}

// A renewal sent before a shortening extend() runs before it on the server; its reply, coming
// after, must not give the holder back the longer lease the extend took away.
TEST(Mutex, ARenewalRepliedAfterAShorteningExtendNeverLengthensTheLocalDeadline) {
    redis_server srv;
    using faulty = redislock::test::faulty_connection<redislock::hiredis_connection>;
    faulty conn{srv.uri()};
    redislock::basic_client<faulty> client{conn};
    auto m = client.mutex("k", {.lease = 3s, .watchdog = true});
    m.lock();
    ASSERT_TRUE(m.extend(3s));  // the script is loaded: the renewal runs as it is sent
    // The next renewal runs on the server at once; its reply comes 600 ms later.
    conn.add({.command = "EVALSHA",
              .script = "mutex_extend",
              .action = redislock::test::fault_action::delay_after,
              .delay = 600ms});
    ASSERT_TRUE(redislock::test::eventually(
        [&] { return conn.pending_faults("EVALSHA", "mutex_extend") == 0; }, 20s));
    ASSERT_TRUE(m.extend(1s));
    const auto extended = std::chrono::steady_clock::now();
    // The renewals after it never reach the server.
    conn.add({.command = "EVALSHA",
              .script = "mutex_extend",
              .action = redislock::test::fault_action::error_reply,
              .times = redislock::test::fault_rule::forever});
    // Past the shorter lease: the server let go, so must the holder.
    std::this_thread::sleep_until(extended + 1300ms);
    const bool owned = m.owned();
    EXPECT_TRUE(!owned || srv.cli({"EXISTS", "k"}) == "1") << "owned() true, key gone";
    conn.clear_rules();
}

TEST(Mutex, VerifyAsksTheServer) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("k", {.on_lost = lost.handler()});
    EXPECT_FALSE(m.verify());
    m.lock();
    EXPECT_TRUE(m.verify());
    m.unlock();
    EXPECT_FALSE(m.verify());
    EXPECT_EQ(lost.calls.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// Queries: is_locked() and holder_ttl() ask the server about the name, whoever holds it

TEST(Mutex, QueriesSeeAFreeNameAsHeldByNoOne) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const auto m = client.mutex("k");
    EXPECT_FALSE(m.is_locked());
    EXPECT_EQ(m.holder_ttl(), 0ms);
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0") << "a query writes nothing";
}

TEST(Mutex, QueriesSeeTheHolderWhoeverItIs) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client elsewhere{srv.uri()};  // another process, as far as the server knows
    auto m = client.mutex("k", {.lease = 5s});
    const auto same_client = client.mutex("k");
    const auto other = elsewhere.mutex("k");
    m.lock();
    for (const redislock::mutex* q :
         std::array<const redislock::mutex*, 3>{&m, &same_client, &other}) {
        EXPECT_TRUE(q->is_locked());
        const auto ttl = q->holder_ttl();
        EXPECT_GT(ttl, 0ms);
        EXPECT_LE(ttl, 5s);
    }
    std::thread{[&] { EXPECT_TRUE(m.is_locked()) << "any thread may ask"; }}.join();
    m.unlock();
    EXPECT_FALSE(m.is_locked());
    EXPECT_FALSE(other.is_locked());
    EXPECT_EQ(other.holder_ttl(), 0ms);
}

TEST(Mutex, QueriesSeeAnotherProgramsKeyAsHeld) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const auto m = client.mutex("k");
    // redis-py's Lock speaks the same protocol: SET NX PX, or no expiry at all without a timeout.
    ASSERT_EQ(srv.cli({"SET", "k", "their-token", "PX", "3000"}), "OK");
    EXPECT_TRUE(m.is_locked());
    EXPECT_GT(m.holder_ttl(), 0ms);
    EXPECT_LE(m.holder_ttl(), 3s);
    ASSERT_EQ(srv.cli({"SET", "k", "their-token"}), "OK");
    EXPECT_TRUE(m.is_locked());
    EXPECT_EQ(m.holder_ttl(), std::chrono::milliseconds::max());
}

TEST(Mutex, QueriesSeeAnExpiredLockAsFree) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k", {.lease = 200ms});
    m.lock();
    EXPECT_TRUE(m.is_locked());
    std::this_thread::sleep_for(400ms);
    EXPECT_FALSE(m.is_locked());
    EXPECT_EQ(m.holder_ttl(), 0ms);
}

// A release that hands the lock on keeps the key as 'queued:<waiter id>' for a waiter told it
// may go (lua/_queue.lua): no one holds it meanwhile.
TEST(Mutex, QueriesSeeAKeyKeptFreeForAWaiterAsHeldByNoOne) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const auto m = client.mutex("k");
    ASSERT_EQ(srv.cli({"SET", "k", "queued:w1234", "PX", "5000"}), "OK");
    EXPECT_FALSE(m.is_locked());
    EXPECT_EQ(m.holder_ttl(), 0ms);
    EXPECT_EQ(srv.cli({"GET", "k"}), "queued:w1234");
}

TEST(Mutex, QueriesOnANameHoldingAHashThrowWrongtypeAndOnAMovedFromLockInvalidArgument) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "k", "field", "value"}), "1");
    auto m = client.mutex("k");
    try {
        (void)m.is_locked();
        ADD_FAILURE() << "a query on a name that holds a hash must throw";
    } catch (const redislock::server_error& e) {
        EXPECT_NE(std::string{e.what()}.find("WRONGTYPE"), std::string::npos) << e.what();
    }
    EXPECT_THROW((void)m.holder_ttl(), redislock::server_error);
    auto taken = std::move(m);
    EXPECT_THROW((void)m.is_locked(), redislock::invalid_argument);
    EXPECT_THROW((void)m.holder_ttl(), redislock::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Fencing

TEST(Mutex, FencingTokensStrictlyIncreaseAcrossAcquisitionsAndObjects) {
    redis_server srv;
    redislock::client first{srv.uri()};
    redislock::client second{srv.uri()};
    auto a = first.mutex("k", {.fencing = true});
    auto b = second.mutex("k", {.fencing = true});
    std::vector<std::int64_t> tokens;
    for (int i = 0; i < 10; ++i) {
        auto& m = i % 3 == 0 ? b : a;
        ASSERT_TRUE(m.try_lock());
        tokens.push_back(m.fencing_token());
        m.unlock();
    }
    for (std::size_t i = 1; i < tokens.size(); ++i) {
        EXPECT_GT(tokens[i], tokens[i - 1]);
    }
    EXPECT_GT(tokens.front(), 0);
}

TEST(Mutex, FencingCounterIsBesideTheNameAndExpiresADayAfterItsLastUse) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("orders:42", {.lease = 5s, .fencing = true});
    ASSERT_TRUE(m.try_lock());
    EXPECT_EQ(srv.cli({"GET", "{orders:42}:fence"}), std::to_string(m.fencing_token()));
    const long long ttl = std::stoll(srv.cli({"PTTL", "{orders:42}:fence"}));
    EXPECT_GT(ttl, 86'000'000);
    EXPECT_LE(ttl, 86'400'000);
    m.unlock();
    EXPECT_EQ(srv.cli({"EXISTS", "{orders:42}:fence"}), "1");
}

TEST(Mutex, FencingCounterReusesTheNamesHashTag) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("a{x}b", {.fencing = true});
    ASSERT_TRUE(m.try_lock());
    EXPECT_EQ(srv.cli({"GET", "a{x}b:fence"}), std::to_string(m.fencing_token()));
    EXPECT_EQ(srv.cli({"EXISTS", "{a{x}b}:fence"}), "0");
    m.unlock();
}

TEST(Mutex, FencingTokenIsZeroWithoutFencingOrWhenNotHeld) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto plain = client.mutex("plain");
    ASSERT_TRUE(plain.try_lock());
    EXPECT_EQ(plain.fencing_token(), 0);
    EXPECT_EQ(srv.cli({"EXISTS", "{plain}:fence"}), "0");
    plain.unlock();

    auto fenced = client.mutex("fenced", {.fencing = true});
    EXPECT_EQ(fenced.fencing_token(), 0);
    ASSERT_TRUE(fenced.try_lock());
    EXPECT_GT(fenced.fencing_token(), 0);
    fenced.unlock();
    EXPECT_EQ(fenced.fencing_token(), 0);
}

TEST(Mutex, FencedAttemptOnAHeldLockDrawsNoToken) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto holder = client.mutex("k", {.fencing = true});
    auto waiter = client.mutex("k", {.fencing = true});
    ASSERT_TRUE(holder.try_lock());
    EXPECT_FALSE(waiter.try_lock());
    EXPECT_FALSE(waiter.try_lock_for(50ms));
    EXPECT_EQ(srv.cli({"GET", "{k}:fence"}), std::to_string(holder.fencing_token()));
    const std::int64_t first = holder.fencing_token();
    holder.unlock();
    ASSERT_TRUE(waiter.try_lock());
    EXPECT_GT(waiter.fencing_token(), first);
    waiter.unlock();
}

// ---------------------------------------------------------------------------------------------
// Release notification

// Queues waiter `waiter` for the simple lock `name` at script level, as a lock() call that found
// it held would: mutex_acquire.lua with a waiter id and a keep above 0. Returns the reply's
// status (0: refused, and queued).
std::int64_t queue_waiter(redislock::client& client, std::string_view name,
                          std::string_view waiter) {
    const std::string queue = redislock::detail::derived_key(name, "queue");
    const std::string lapses = redislock::detail::derived_key(name, "waiting");
    const std::string channel = redislock::detail::derived_key(name, "released");
    const reply r = redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::mutex_acquire,
        std::array<std::string_view, 3>{name, queue, lapses},
        std::array<std::string_view, 7>{"script-token", "60000", "0", waiter, "5000", channel,
                                        "2000"});
    if (!r.is_array() || r.elements().size() != 2) {
        ADD_FAILURE() << "unexpected reply: " << r.text();
        return -1;
    }
    return r.elements()[0].as_integer();
}

// A release with nobody waiting publishes nothing; with a waiter in line it publishes that
// waiter's id on the channel beside the name (SPUBLISH). (That the lock is kept for the waiter
// meanwhile is checked in script_test: here its grace is too short to check it reliably.)
void expect_release_publishes_only_to_waiters(const redis_server& srv, redislock::client& client,
                                              const std::string& name, const std::string& channel) {
    SCOPED_TRACE(name);
    // next() also checks each message came on that channel.
    subscriber sub{srv, channel};
    auto m = client.mutex(name);
    m.lock();
    m.unlock();
    // Messages arrive in order: the marker comes first only if the release published nothing.
    ASSERT_EQ(srv.cli({"SPUBLISH", channel, "marker"}), "1");
    EXPECT_EQ(sub.next(), "marker");

    m.lock();
    ASSERT_EQ(queue_waiter(client, name, "wwaiting"), 0);
    m.unlock();
    EXPECT_EQ(sub.next(), "wwaiting");
}

TEST(Mutex, ReleasePublishesOnTheReleaseChannelOnlyWhenSomeoneWaits) {
    redis_server srv;
    redislock::client client{srv.uri()};
    expect_release_publishes_only_to_waiters(srv, client, "orders:42", "{orders:42}:released");
}

TEST(Mutex, ReleaseChannelReusesTheNamesHashTag) {
    redis_server srv;
    redislock::client client{srv.uri()};
    expect_release_publishes_only_to_waiters(srv, client, "a{x}b", "a{x}b:released");
}

// A waiter id ending in '@<tag>' is told on '<release channel>:<tag>', its client's channel,
// and nothing is published on the release channel itself; so is the standby after it, on its
// own client's channel, and a waiter the lock is handed to.
TEST(Mutex, ReleaseTellsATaggedWaiterOnItsClientsChannel) {
    redis_server srv;
    redislock::client client{srv.uri()};
    subscriber shared_channel{srv, "{t}:released"};
    subscriber own{srv, "{t}:released:00ff00ff00ff00ff"};
    subscriber second{srv, "{t}:released:1111222233334444"};
    auto m = client.mutex("t");
    m.lock();
    ASSERT_EQ(queue_waiter(client, "t", "wwaiting@00ff00ff00ff00ff"), 0);
    ASSERT_EQ(queue_waiter(client, "t", "wsecond@1111222233334444"), 0);
    m.unlock();
    EXPECT_EQ(own.next(), "wwaiting@00ff00ff00ff00ff");
    EXPECT_EQ(second.next(), "?wsecond@1111222233334444");
    ASSERT_EQ(srv.cli({"SPUBLISH", "{t}:released", "marker"}), "1");
    EXPECT_EQ(shared_channel.next(), "marker");

    // A 'g' waiter: the lock is kept for it under its own token, only for the grace (100 ms for
    // this lease; script_test checks what the key holds meanwhile), and it is told the same way.
    (void)srv.cli({"DEL", "t", "{t}:queue", "{t}:waiting"});  // the told waiter never came
    m.lock();
    const std::string handed = "g0123456789abcdef0123456789abcdef.5000@00ff00ff00ff00ff";
    ASSERT_EQ(queue_waiter(client, "t", handed), 0);
    m.unlock();
    EXPECT_EQ(own.next(), handed);
    EXPECT_LE(std::stoll(srv.cli({"PTTL", "t"})), 100);
    ASSERT_EQ(srv.cli({"SPUBLISH", "{t}:released", "marker"}), "1");
    EXPECT_EQ(shared_channel.next(), "marker");
}

// The premise of run_script_after_ping (script.hpp): Redis writes the clients it queued in one
// event-loop pass newest first. A script that publishes therefore has its caller's reply written
// before the message, unless a reply to a command just before it in the same read (a PING) has
// queued the caller first. The kernel's receive timestamps tell which reached its socket first.
TEST(Mutex, PingAheadOfAPublishingScriptPutsTheMessageOnTheWireFirst) {
    redis_server srv;
    const auto open = [&] {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in at{};
        at.sin_family = AF_INET;
        at.sin_port = htons(static_cast<std::uint16_t>(srv.port()));
        at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        const int on = 1;
        const timeval timeout{5, 0};
        if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&at), sizeof at) != 0 ||
            ::setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on) != 0 ||
            ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) != 0) {
            throw std::runtime_error{"cannot connect to the test server"};
        }
        return fd;
    };
    const auto send_all = [](int fd, std::string_view bytes) {
        ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    };
    // Reads what the socket holds; returns when its first bytes arrived, in ns, or -1 when the
    // kernel gave no timestamp (a failure unless `may_lack`).
    const auto arrival = [](int fd, bool may_lack = false) -> std::int64_t {
        char data[512];
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(timespec))];
        iovec io{data, sizeof data};
        msghdr msg{};
        msg.msg_iov = &io;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        if (::recvmsg(fd, &msg, 0) <= 0) {
            ADD_FAILURE() << "no reply";
            return -1;
        }
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                timespec at{};
                std::memcpy(&at, CMSG_DATA(c), sizeof at);
                return std::int64_t{at.tv_sec} * 1'000'000'000 + at.tv_nsec;
            }
        }
        if (!may_lack) {
            ADD_FAILURE() << "no receive timestamp";
        }
        return -1;
    };
    const int waiter = open();
    const int caller = open();
    send_all(waiter, "*2\r\n$10\r\nSSUBSCRIBE\r\n$2\r\nch\r\n");
    (void)arrival(waiter, true);
    // The kernel turns receive timestamps on for the whole system after the first socket asks,
    // in the background: until then a packet may come without one.
    bool stamped = false;
    for (int i = 0; i < 200 && !stamped; ++i) {
        send_all(caller, "*1\r\n$4\r\nPING\r\n");
        stamped = arrival(caller, true) >= 0;
    }
    ASSERT_TRUE(stamped) << "the kernel gives no receive timestamps";
    const std::string_view script = "redis.call('SPUBLISH', 'ch', 'm') return 1";
    const std::string eval = "*3\r\n$4\r\nEVAL\r\n$" + std::to_string(script.size()) + "\r\n" +
                             std::string{script} + "\r\n$1\r\n0\r\n";
    for (const bool ping : {false, true}) {
        SCOPED_TRACE(ping ? "behind a PING" : "alone");
        // One send: the server reads both commands in one pass.
        send_all(caller, (ping ? "*1\r\n$4\r\nPING\r\n" : "") + eval);
        const std::int64_t reply_at = arrival(caller);
        const std::int64_t message_at = arrival(waiter);
        if (ping) {
            EXPECT_LT(message_at, reply_at);
        } else {
            EXPECT_LT(reply_at, message_at);
        }
    }
    ::close(waiter);
    ::close(caller);
}

// A release sends its script behind a PING, in the same round trip, while the name was contended
// lately (the releaser's last release handed the lock on, or it waited for this acquisition);
// otherwise the script goes alone. A NOSCRIPT answer to the pipelined script is recovered.
TEST(Mutex, ReleaseGoesBehindAPingOnlyWhileTheNameIsContended) {
    redis_server srv;
    using faulty = redislock::test::faulty_connection<redislock::hiredis_connection>;
    faulty conn{srv.uri()};
    redislock::basic_client<faulty> client{conn};
    redislock::client other{srv.uri()};
    auto m = client.mutex("k", {.lease = 10s});
    auto rival = other.mutex("k", {.lease = 10s});
    // Uncontended, and the first release that hands the lock on: the script alone.
    m.lock();
    m.unlock();  // loads the script
    m.lock();
    std::atomic<bool> rival_holds{false};
    std::atomic<bool> rival_may_go{false};
    std::jthread rival_thread{[&] {
        if (rival.try_lock_for(10s)) {
            rival_holds = true;
            for (int i = 0; i < 10'000 && !rival_may_go; ++i) {
                std::this_thread::sleep_for(1ms);
            }
            rival.unlock();
        }
    }};
    // Should an assertion end the test early, the rival lets go before it is joined.
    const struct let_go_at_exit {
        std::atomic<bool>& flag;
        ~let_go_at_exit() { flag = true; }
    } rival_lets_go{rival_may_go};
    ASSERT_TRUE(redislock::test::eventually(
        [&] {
            return srv.cli({"ZCARD", "{k}:queue"}) == "1";
        },
        5s));
    auto trips = conn.inner().round_trips();
    m.unlock();
    EXPECT_EQ(conn.inner().round_trips() - trips, 1u);
    EXPECT_EQ(conn.count("PING"), 0u);
    ASSERT_TRUE(redislock::test::eventually([&] { return rival_holds.load(); }, 5s));

    // Now contended: waiting for the rival and then releasing sends PING and the script in one
    // round trip, and the lock is free after it.
    std::jthread let_go{[&] {
        std::this_thread::sleep_for(100ms);
        rival_may_go = true;
    }};
    ASSERT_TRUE(m.try_lock_for(5s));
    let_go.join();
    rival_thread.join();
    ASSERT_EQ(srv.cli({"SCRIPT", "FLUSH"}), "OK");  // the pipelined script meets NOSCRIPT
    conn.clear_log();
    trips = conn.inner().round_trips();
    m.unlock();
    EXPECT_EQ(conn.log_text(), (std::vector<std::string>{"PING", "EVALSHA mutex_release",
                                                         "SCRIPT LOAD", "EVALSHA mutex_release"}));
    EXPECT_EQ(conn.inner().round_trips() - trips, 3u);
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");

    // That release handed nothing on: the next one goes alone again.
    m.lock();
    conn.clear_log();
    m.unlock();
    EXPECT_EQ(conn.log_text(), (std::vector<std::string>{"EVALSHA mutex_release"}));
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

// ---------------------------------------------------------------------------------------------
// Waiting

TEST(Mutex, FailedAttemptWaitsNoLongerThanTheHoldersTtl) {
    redis_server srv;
    redislock::client client{srv.uri()};
    // Backoff alone would sleep up to a minute; the holder's 300 ms TTL must cap it.
    auto m = client.mutex("k", {.backoff_min = 60s, .backoff_max = 60s});
    ASSERT_EQ(srv.cli({"SET", "k", "other", "PX", "300"}), "OK");
    const stopwatch watch;
    EXPECT_TRUE(m.try_lock_for(10s));
    EXPECT_LT(watch.elapsed(), 3s);
    m.unlock();
}

TEST(Backoff, SleepsNeverExceedTheHoldersTtlPlusOneMillisecond) {
    const lock_options options{.backoff_min = 1ms, .backoff_max = 128ms};
    for (const auto ttl : {0ms, 1ms, 3ms, 17ms, 100ms}) {
        redislock::detail::backoff policy{options};
        const std::chrono::nanoseconds bound = std::min(128ms, ttl + 1ms);
        for (int round = 0; round < 300; ++round) {
            const auto sleep = policy.next(ttl);
            EXPECT_GE(sleep.count(), 0);
            EXPECT_LE(sleep, bound) << "ttl " << ttl.count() << " round " << round;
        }
    }
}

TEST(Backoff, CeilingDoublesFromTheMinimumToTheMaximum) {
    const lock_options options{.backoff_min = 1ms, .backoff_max = 128ms};
    redislock::detail::backoff policy{options};
    for (int round = 0; round < 40; ++round) {
        const std::chrono::nanoseconds ceiling =
            std::min(128ms, 1ms * (std::int64_t{1} << std::min(round, 20)));
        EXPECT_LE(policy.next(10s), ceiling) << "round " << round;
    }
}

TEST(Backoff, HolderWithoutLeaseIsBoundedByTheCap) {
    const lock_options options{.backoff_min = 2ms, .backoff_max = 20ms};
    redislock::detail::backoff policy{options};
    for (int round = 0; round < 100; ++round) {
        EXPECT_LE(policy.next(-1ms), 20ms);
    }
}

TEST(Backoff, KeyAlreadyGoneRetriesWithinAMillisecondWhateverTheMinimum) {
    // -2: the key expired between the failed SET NX and the probe. The holder has no lease left,
    // so no backoff bound, however large, may keep the waiter asleep.
    for (const auto bound : {3ms, 60'000ms}) {
        const lock_options options{.backoff_min = bound, .backoff_max = bound};
        redislock::detail::backoff policy{options};
        std::chrono::nanoseconds longest{0};
        for (int round = 0; round < 100; ++round) {
            longest = std::max<std::chrono::nanoseconds>(longest, policy.next(-2ms));
        }
        EXPECT_LE(longest, 1ms) << "backoff bounds " << bound.count() << " ms";
    }
}

TEST(Backoff, SleepsAreSpreadOverTheWholeRange) {
    const lock_options options{.backoff_min = 1ms, .backoff_max = 128ms};
    redislock::detail::backoff policy{options};
    for (int round = 0; round < 10; ++round) {
        (void)policy.next(10s);
    }
    std::chrono::nanoseconds lowest = 1h;
    std::chrono::nanoseconds highest{0};
    for (int round = 0; round < 300; ++round) {
        const std::chrono::nanoseconds sleep = policy.next(10s);
        lowest = std::min(lowest, sleep);
        highest = std::max(highest, sleep);
    }
    // Full jitter: uniform over [0, 128 ms], so both halves are reached.
    EXPECT_LT(lowest, 32ms);
    EXPECT_GT(highest, 96ms);
}

TEST(AcquireWithBackoff, FirstAttemptIsMadeEvenPastTheDeadline) {
    int attempts = 0;
    const lock_options options;
    const bool acquired = redislock::detail::acquire_with_backoff(
        [&]() -> std::optional<redislock::detail::holder_ttl> {
            ++attempts;
            return 1000ms;
        },
        std::chrono::steady_clock::now() - 1s, {}, options);
    EXPECT_FALSE(acquired);
    EXPECT_EQ(attempts, 1);
}

TEST(AcquireWithBackoff, RetriesUntilAnAttemptSucceeds) {
    int attempts = 0;
    const lock_options options;
    const stopwatch watch;
    const bool acquired = redislock::detail::acquire_with_backoff(
        [&]() -> std::optional<redislock::detail::holder_ttl> {
            return ++attempts < 6 ? std::optional{redislock::detail::holder_ttl{0}} : std::nullopt;
        },
        std::chrono::steady_clock::time_point::max(), {}, options);
    EXPECT_TRUE(acquired);
    EXPECT_EQ(attempts, 6);
    EXPECT_LT(watch.elapsed(), 5s);
}

TEST(AcquireWithBackoff, GivesUpAtTheDeadline) {
    int attempts = 0;
    const lock_options options;
    const stopwatch watch;
    const bool acquired = redislock::detail::acquire_with_backoff(
        [&]() -> std::optional<redislock::detail::holder_ttl> {
            ++attempts;
            return 10000ms;
        },
        std::chrono::steady_clock::now() + 150ms, {}, options);
    EXPECT_FALSE(acquired);
    EXPECT_GE(attempts, 2);
    EXPECT_GE(watch.elapsed(), 150ms);
    EXPECT_LT(watch.elapsed(), 5s);
}

TEST(AcquireWithBackoff, StopRequestEndsTheWait) {
    const lock_options options{.backoff_min = 10s, .backoff_max = 10s};
    std::stop_source stop;
    std::jthread stopper{[&] {
        std::this_thread::sleep_for(100ms);
        stop.request_stop();
    }};
    const stopwatch watch;
    int attempts = 0;
    bool attempted_after_stop = false;
    // Every attempt finds the lock held; sleeps are random in [0, 10 s], so a few may come before
    // the stop. The stop must end the sleep it falls in, with no attempt after it.
    const bool acquired = redislock::detail::acquire_with_backoff(
        [&]() -> std::optional<redislock::detail::holder_ttl> {
            ++attempts;
            attempted_after_stop = attempted_after_stop || stop.stop_requested();
            return -1ms;
        },
        std::chrono::steady_clock::time_point::max(), stop.get_token(), options);
    EXPECT_FALSE(acquired);
    EXPECT_GE(attempts, 1);
    EXPECT_FALSE(attempted_after_stop);
    EXPECT_LT(watch.elapsed(), 5s);
}

// ---------------------------------------------------------------------------------------------
// Mutual exclusion

constexpr std::string_view counter_key = "counter";
constexpr std::string_view intervals_key = "intervals";

// One worker: `iterations` times lock, read-modify-write the counter in Redis (GET then SET, so
// two holders at once would lose an increment), unlock, then log [enter, exit] in Redis.
bool increment_under_lock(redislock::client& client, int iterations) {
    auto m = client.mutex("counter-lock", {.lease = 10s, .backoff_max = 2ms});
    for (int i = 0; i < iterations; ++i) {
        m.lock();
        const std::int64_t enter = redislock::test::monotonic_ns();
        const reply value = run(client, {"GET", counter_key});
        const long long next = (value.is_nil() ? 0 : std::stoll(value.text())) + 1;
        const reply set = run(client, {"SET", counter_key, std::to_string(next)});
        const std::int64_t exit = redislock::test::monotonic_ns();
        std::error_code ec;
        m.unlock(ec);
        if (ec || !set.is_status()) {
            return false;
        }
        const std::string interval = std::to_string(enter) + " " + std::to_string(exit);
        if (!run(client, {"RPUSH", intervals_key, interval}).is_integer()) {
            return false;
        }
    }
    return true;
}

// Runs `threads` workers on one client of this process; true when all of them succeeded.
bool run_workers(const std::string& uri, int threads, int iterations) noexcept {
    try {
        redislock::client client{uri};
        std::atomic<bool> ok{true};
        {
            std::vector<std::jthread> workers;
            for (int t = 0; t < threads; ++t) {
                workers.emplace_back([&] {
                    try {
                        if (!increment_under_lock(client, iterations)) {
                            ok = false;
                        }
                    } catch (...) {
                        ok = false;
                    }
                });
            }
        }
        return ok.load();
    } catch (...) {
        return false;
    }
}

TEST(Mutex, ThreadsOfTwoProcessesIncrementAnExactCounter) {
    redis_server srv;
    constexpr int threads = 4;
    constexpr int iterations = 200;
    const std::string uri = srv.uri();

    // Fork before this process has any thread or connection, so the child starts clean.
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        ::_exit(run_workers(uri, threads, iterations) ? 0 : 1);
    }
    const bool parent_ok = run_workers(uri, threads, iterations);
    const std::optional<int> status = redislock::test::wait_child(child, 120s);

    EXPECT_TRUE(parent_ok);
    ASSERT_TRUE(status.has_value()) << "the child process did not finish in time";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "child status " << *status;

    constexpr int total = 2 * threads * iterations;
    EXPECT_EQ(srv.cli({"GET", std::string{counter_key}}), std::to_string(total));

    redislock::client client{uri};
    const reply logged = run(client, {"LRANGE", intervals_key, "0", "-1"});
    ASSERT_EQ(logged.elements().size(), static_cast<std::size_t>(total));
    std::vector<std::pair<std::int64_t, std::int64_t>> intervals;
    for (const auto& entry : logged.elements()) {
        std::istringstream in{entry.text()};
        std::int64_t enter = 0;
        std::int64_t exit = 0;
        in >> enter >> exit;
        ASSERT_LT(enter, exit) << entry.text();
        intervals.emplace_back(enter, exit);
    }
    std::sort(intervals.begin(), intervals.end());
    int overlaps = 0;
    for (std::size_t i = 1; i < intervals.size(); ++i) {
        if (intervals[i].first <= intervals[i - 1].second) {
            ++overlaps;
        }
    }
    EXPECT_EQ(overlaps, 0);
}

TEST(Mutex, ThreadsSharingOneObjectExcludeEachOther) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("shared", {.lease = 10s, .on_lost = lost.handler(), .backoff_max = 2ms});
    constexpr int threads = 4;
    constexpr int iterations = 50;
    std::atomic<bool> inside{false};
    std::atomic<int> overlaps{0};
    std::atomic<int> failures{0};
    {
        std::vector<std::jthread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&] {
                try {
                    for (int i = 0; i < iterations; ++i) {
                        std::unique_lock guard{m};
                        if (inside.exchange(true)) {
                            ++overlaps;
                        }
                        const reply value = run(client, {"GET", counter_key});
                        const long long next = (value.is_nil() ? 0 : std::stoll(value.text())) + 1;
                        (void)run(client, {"SET", counter_key, std::to_string(next)});
                        inside = false;
                    }
                } catch (...) {
                    ++failures;
                }
            });
        }
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(overlaps.load(), 0);
    EXPECT_EQ(srv.cli({"GET", std::string{counter_key}}), std::to_string(threads * iterations));
    EXPECT_EQ(lost.calls.load(), 0);
}

TEST(Mutex, ThreadsSharingOneObjectUnlockWithoutErrors) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("shared", {.lease = 10s, .on_lost = lost.handler(), .backoff_max = 2ms});
    constexpr int threads = 4;
    constexpr int iterations = 50;
    std::atomic<int> errors{0};
    std::atomic<int> failures{0};
    {
        std::vector<std::jthread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&] {
                try {
                    for (int i = 0; i < iterations; ++i) {
                        m.lock();
                        std::error_code ec;
                        m.unlock(ec);
                        if (ec) {
                            ++errors;
                        }
                    }
                } catch (...) {
                    ++failures;
                }
            });
        }
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_EQ(srv.cli({"EXISTS", "shared"}), "0");
}

TEST(Mutex, ScopedLockOverTwoNamesInOppositeOrdersDoesNotDeadlock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    constexpr int iterations = 20;
    std::atomic<bool> inside{false};
    std::atomic<int> overlaps{0};
    std::atomic<int> failures{0};
    auto worker = [&](bool reversed) {
        try {
            auto a = client.mutex("a", {.lease = 5s, .backoff_max = 4ms});
            auto b = client.mutex("b", {.lease = 5s, .backoff_max = 4ms});
            for (int i = 0; i < iterations; ++i) {
                auto body = [&] {
                    if (inside.exchange(true)) {
                        ++overlaps;
                    }
                    inside = false;
                };
                if (reversed) {
                    std::scoped_lock guard{b, a};
                    body();
                } else {
                    std::scoped_lock guard{a, b};
                    body();
                }
            }
        } catch (...) {
            ++failures;
        }
    };
    {
        std::jthread forward{worker, false};
        std::jthread backward{worker, true};
    }
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(overlaps.load(), 0);
    EXPECT_EQ(srv.cli({"EXISTS", "a", "b"}), "0");
}

// ---------------------------------------------------------------------------------------------
// Interoperability with other clients of the same key

TEST(Mutex, PlainSetNxHolderExcludesTryLock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    ASSERT_EQ(srv.cli({"SET", "k", "x", "NX", "PX", "5000"}), "OK");
    EXPECT_FALSE(m.try_lock());
    EXPECT_FALSE(m.try_lock_for(100ms));
    EXPECT_EQ(srv.cli({"GET", "k"}), "x");
}

TEST(Mutex, WhileHeldPlainSetNxGetsNil) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("k");
    m.lock();
    const std::string token = srv.cli({"GET", "k"});
    EXPECT_EQ(srv.cli({"SET", "k", "y", "NX", "PX", "5000"}), "");
    EXPECT_EQ(srv.cli({"GET", "k"}), token);
    m.unlock();
    EXPECT_EQ(srv.cli({"SET", "k", "y", "NX", "PX", "5000"}), "OK");
}

// ---------------------------------------------------------------------------------------------
// Standard guards and object lifetime

TEST(Mutex, StandardGuardsLockAndUnlock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto a = client.mutex("a");
    auto b = client.mutex("b");
    {
        std::unique_lock guard{a, 2s};
        EXPECT_TRUE(guard.owns_lock());
        EXPECT_EQ(srv.cli({"EXISTS", "a"}), "1");
    }
    EXPECT_EQ(srv.cli({"EXISTS", "a"}), "0");
    {
        std::scoped_lock guard{a, b};
        EXPECT_EQ(srv.cli({"EXISTS", "a", "b"}), "2");
    }
    EXPECT_EQ(srv.cli({"EXISTS", "a", "b"}), "0");
    {
        std::unique_lock guard{a, std::try_to_lock};
        EXPECT_TRUE(guard.owns_lock());
        auto other = client.mutex("a");
        std::unique_lock refused{other, std::try_to_lock};
        EXPECT_FALSE(refused.owns_lock());
    }
}

TEST(Mutex, DestructorReleasesTheLock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    {
        auto m = client.mutex("k");
        m.lock();
        ASSERT_EQ(srv.cli({"EXISTS", "k"}), "1");
    }
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

TEST(Mutex, MovedLockStaysHeld) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto first = client.mutex("k");
    first.lock();
    auto second = std::move(first);
    EXPECT_TRUE(second.owned());
    EXPECT_EQ(second.name(), "k");
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "1");
    std::error_code ec;
    second.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "k"}), "0");
}

TEST(Mutex, MoveAssignmentReleasesTheTargetsLock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto x = client.mutex("x");
    auto y = client.mutex("y");
    x.lock();
    y.lock();
    x = std::move(y);
    EXPECT_EQ(srv.cli({"EXISTS", "x"}), "0");
    EXPECT_EQ(srv.cli({"EXISTS", "y"}), "1");
    EXPECT_EQ(x.name(), "y");
    EXPECT_TRUE(x.owned());
    x.unlock();
    EXPECT_EQ(srv.cli({"EXISTS", "y"}), "0");
}

TEST(Mutex, LocksLiveInContainers) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::vector<redislock::mutex> locks;
    for (int i = 0; i < 5; ++i) {
        locks.push_back(client.mutex("k" + std::to_string(i)));
        locks.back().lock();  // the vector moves earlier locks while growing
    }
    EXPECT_EQ(srv.cli({"EXISTS", "k0", "k1", "k2", "k3", "k4"}), "5");
    locks.clear();
    EXPECT_EQ(srv.cli({"EXISTS", "k0", "k1", "k2", "k3", "k4"}), "0");
}

TEST(Mutex, KeepsItsNameAndOptions) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("orders:42", {.lease = 7s, .fencing = true, .owner = "o"});
    EXPECT_EQ(m.name(), "orders:42");
    EXPECT_EQ(m.options().lease, 7s);
    EXPECT_TRUE(m.options().fencing);
    EXPECT_EQ(m.options().owner, "o");
}

}  // namespace
