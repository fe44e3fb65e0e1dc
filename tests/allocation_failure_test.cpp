// Releases that cannot allocate: unlock() and the destructors of every lock kind are noexcept
// (destructors call unlock()), so an allocation that fails inside them must never reach
// std::terminate. This executable replaces the global operator new with one that fails on
// demand on the calling thread, and fails each allocation of a release in turn: the first, the
// second, ... until the release makes no more (and, in a second pass, every allocation from the
// n-th on, as a process out of memory would). Only what goes through operator new can fail this
// way: hiredis allocates with malloc and reports its own failures as errors. After each, the object
// no longer holds the lock, and a rival gets it within the lease: nothing is leaked past it, and no
// renewal outlives it.

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

// Allocations of the calling thread that succeed before one fails (-1: none fails), whether
// every later one fails too, and how many failed so far.
thread_local std::int64_t allocations_before_failure = -1;
thread_local bool keep_failing = false;
thread_local std::uint64_t failed_allocations = 0;
// Every allocation fails on every thread but the test's own while this is set.
std::atomic<bool> failing_on_other_threads{false};
thread_local bool test_thread = false;

// Out of line, so the compiler does not pair a new expression with free() and warn.
[[gnu::noinline]] void free_block(void* p) noexcept {
    std::free(p);
}

}  // namespace

void* operator new(std::size_t size) {
    if (failing_on_other_threads.load(std::memory_order_relaxed) && !test_thread) {
        throw std::bad_alloc{};
    }
    if (allocations_before_failure == 0) {
        if (!keep_failing) {
            allocations_before_failure = -1;
        }
        ++failed_allocations;
        throw std::bad_alloc{};
    }
    if (allocations_before_failure > 0) {
        --allocations_before_failure;
    }
    if (void* p = std::malloc(size == 0 ? 1 : size)) {
        return p;
    }
    throw std::bad_alloc{};
}

void operator delete(void* p) noexcept {
    free_block(p);
}

void operator delete(void* p, std::size_t) noexcept {
    free_block(p);
}

namespace {

using namespace std::chrono_literals;
using redislock::lock_options;
using redislock::test::eventually;
using redislock::test::redis_server;

/// Runs `call` with the allocation numbered `nth` from now (0: the next) on this thread failing,
/// and with `from_then_on` every later one too; true when an allocation failed.
template <class Call>
bool with_failing_allocation(std::int64_t nth, bool from_then_on, Call call) {
    const std::uint64_t before = failed_allocations;
    allocations_before_failure = nth;
    keep_failing = from_then_on;
    call();
    allocations_before_failure = -1;
    keep_failing = false;
    return failed_allocations != before;
}

constexpr auto lease = 1s;
// Releases left to the lease end within it; the rest is for a loaded machine.
constexpr auto freed_within = lease + 3s;
// Bounds the sweep: a release makes far fewer allocations than this.
constexpr std::int64_t most_allocations = 400;

lock_options renewed() {
    return {.lease = lease, .watchdog = true};
}

/// Fails each allocation of `release(lock)` in turn, on a lock `hold()` made and took, until
/// `release` makes no more; after each, `check(lock)` (the lock released locally) runs and a
/// rival must get the lock named `name` within the lease.
template <class Hold, class Release, class Check, class Rival>
void fail_each_allocation(const std::string& name, bool from_then_on, Hold hold, Release release,
                          Check check, Rival& rival) {
    for (std::int64_t nth = 0; nth < most_allocations; ++nth) {
        SCOPED_TRACE("allocation " + std::to_string(nth) + " of '" + name + "' fails" +
                     (from_then_on ? ", and every later one" : ""));
        auto held = hold();
        const bool failed =
            with_failing_allocation(nth, from_then_on, [&]() noexcept { release(held); });
        check(held);
        ASSERT_TRUE(rival.try_lock_for(freed_within)) << "the lock outlived its lease";
        rival.unlock();
        if (!failed) {
            return;  // every allocation of the release has failed once
        }
    }
    FAIL() << "the release made more than " << most_allocations << " allocations";
}

// The loss timer's thread cannot allocate when a lease runs out: the loss is still told (on_lost,
// on_lost_reason, lost_token()), where it used to end the process from that thread.
TEST(LossTimer, LossIsToldWhenTheTimerThreadCannotAllocate) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::atomic<int> lost{0};
    std::atomic<bool> expired{false};
    // Captures too large for std::function's inline buffer: a copy of them allocates.
    const std::string padding(64, 'x');
    auto m = client.mutex("alloc:expiring",
                          {.lease = 300ms,
                           .on_lost = [&lost, padding] { lost.fetch_add(padding.empty() ? 0 : 1); },
                           .on_lost_reason =
                               [&expired, padding](redislock::loss_reason why) {
                                   expired =
                                       !padding.empty() && why == redislock::loss_reason::expired;
                               }});
    ASSERT_TRUE(m.try_lock_for(5s));
    const std::stop_token token = m.lost_token();
    test_thread = true;
    failing_on_other_threads = true;
    const bool told = eventually([&] { return lost.load() == 1; }, 5s);
    failing_on_other_threads = false;
    test_thread = false;
    EXPECT_TRUE(told);
    EXPECT_TRUE(expired);
    EXPECT_TRUE(token.stop_requested());
    EXPECT_FALSE(m.owned());
    m.unlock();
}

// Every call gives its connection back to the pool (noexcept); the pool's first one grows its
// list of idle connections, which allocates. Each allocation of making a connection and its first
// call fails in turn: either may throw, the process must go on.
TEST(HiredisConnection, FirstCallOfAPoolSurvivesAFailedAllocationAnywhere) {
    redis_server srv;
    const std::array<std::string_view, 1> ping{"PING"};
    for (std::int64_t nth = 0; nth < most_allocations; ++nth) {
        SCOPED_TRACE("allocation " + std::to_string(nth) + " of the first call fails");
        std::optional<redislock::hiredis_connection> conn;
        const bool failed = with_failing_allocation(nth, false, [&]() noexcept {
            try {
                conn.emplace(srv.uri());
                (void)conn->execute(ping);
            } catch (...) {
            }
        });
        if (conn) {
            EXPECT_EQ(conn->execute(ping).text(), "PONG");
        }
        if (!failed) {
            return;
        }
    }
    FAIL() << "the call made more than " << most_allocations << " allocations";
}

class AllocationFailure : public ::testing::TestWithParam<bool> {
protected:
    bool from_then_on() const { return GetParam(); }

    redis_server srv_;
    redislock::client client_{srv_.uri()};
    redislock::client rival_client_{srv_.uri()};
};

INSTANTIATE_TEST_SUITE_P(OnceOrFromThenOn, AllocationFailure, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "FromThenOn" : "Once"; });

TEST_P(AllocationFailure, MutexUnlockNeverTerminatesAndFreesTheLock) {
    const std::string name = "alloc:mutex";
    auto rival = rival_client_.mutex(name, {.lease = lease});
    fail_each_allocation(
        name, from_then_on(),
        [&] {
            auto m = std::make_unique<redislock::mutex>(client_.mutex(name, renewed()));
            EXPECT_TRUE(m->try_lock_for(5s));
            return m;
        },
        [](auto& m) { m->unlock(); }, [](auto& m) { EXPECT_FALSE(m->owned()); }, rival);
}

TEST_P(AllocationFailure, MutexDestructionNeverTerminatesAndFreesTheLock) {
    const std::string name = "alloc:mutex:destroyed";
    auto rival = rival_client_.mutex(name, {.lease = lease});
    fail_each_allocation(
        name, from_then_on(),
        [&] {
            auto m = std::make_unique<redislock::mutex>(client_.mutex(name, renewed()));
            EXPECT_TRUE(m->try_lock_for(5s));
            return m;
        },
        [](auto& m) { m.reset(); }, [](auto&) {}, rival);
}

TEST_P(AllocationFailure, RecursiveMutexUnlockOfEachEntryNeverTerminatesAndFreesTheLock) {
    const std::string name = "alloc:recursive";
    auto rival = rival_client_.recursive_mutex(name, {.lease = lease});
    fail_each_allocation(
        name, from_then_on(),
        [&] {
            auto m = std::make_unique<redislock::recursive_mutex>(
                client_.recursive_mutex(name, renewed()));
            EXPECT_TRUE(m->try_lock_for(5s));
            EXPECT_TRUE(m->try_lock_for(5s));
            return m;
        },
        [](auto& m) {
            m->unlock();  // the inner entry
            m->unlock();  // the last one
        },
        [](auto& m) {
            EXPECT_EQ(m->depth(), 0U);
            EXPECT_FALSE(m->owned());
        },
        rival);
}

TEST_P(AllocationFailure, RecursiveMutexDestructionNeverTerminatesAndFreesTheLock) {
    const std::string name = "alloc:recursive:destroyed";
    auto rival = rival_client_.recursive_mutex(name, {.lease = lease});
    fail_each_allocation(
        name, from_then_on(),
        [&] {
            auto m = std::make_unique<redislock::recursive_mutex>(
                client_.recursive_mutex(name, renewed()));
            EXPECT_TRUE(m->try_lock_for(5s));
            EXPECT_TRUE(m->try_lock_for(5s));
            return m;
        },
        [](auto& m) { m.reset(); }, [](auto&) {}, rival);
}

TEST_P(AllocationFailure, SharedMutexUnlockOfEachHoldNeverTerminatesAndFreesTheLock) {
    const std::string name = "alloc:shared";
    auto rival = rival_client_.shared_mutex(name, {.lease = lease});
    fail_each_allocation(
        name, from_then_on(),
        [&] {
            auto m =
                std::make_unique<redislock::shared_mutex>(client_.shared_mutex(name, renewed()));
            EXPECT_TRUE(m->try_lock_for(5s));
            EXPECT_TRUE(m->try_lock_shared_for(5s));  // a downgrade: the writer also reads
            EXPECT_TRUE(m->try_lock_shared_for(5s));
            return m;
        },
        [](auto& m) {
            m->unlock_shared();  // an inner read entry
            m->unlock_shared();  // the read hold's last
            m->unlock();         // the write hold's last
        },
        [](auto& m) { EXPECT_FALSE(m->owned()); }, rival);
}

TEST_P(AllocationFailure, SharedMutexDestructionNeverTerminatesAndFreesTheLock) {
    const std::string name = "alloc:shared:destroyed";
    auto rival = rival_client_.shared_mutex(name, {.lease = lease});
    fail_each_allocation(
        name, from_then_on(),
        [&] {
            auto m =
                std::make_unique<redislock::shared_mutex>(client_.shared_mutex(name, renewed()));
            EXPECT_TRUE(m->try_lock_for(5s));
            EXPECT_TRUE(m->try_lock_shared_for(5s));
            return m;
        },
        [](auto& m) { m.reset(); }, [](auto&) {}, rival);
}

// A waiter that gives up leaves the lock's queue from a destructor (noexcept); the lock call
// itself may throw when it cannot allocate, but never ends the process.
TEST_P(AllocationFailure, WaiterGivingUpNeverTerminates) {
    const std::string name = "alloc:waiter";
    auto holder = rival_client_.mutex(name, {.lease = 30s});
    ASSERT_TRUE(holder.try_lock_for(5s));
    auto waiter = client_.mutex(name, {.lease = lease});
    for (std::int64_t nth = 0; nth < most_allocations; ++nth) {
        SCOPED_TRACE("allocation " + std::to_string(nth) + " of a wait fails");
        bool got = false;
        const bool failed = with_failing_allocation(nth, from_then_on(), [&]() noexcept {
            try {
                got = waiter.try_lock_for(100ms);
            } catch (...) {
            }
        });
        EXPECT_FALSE(got);
        if (!failed) {
            holder.unlock();
            return;
        }
    }
    FAIL() << "the wait made more than " << most_allocations << " allocations";
}

/// A release that hands the lock to a waiter of another client: the releasing client notes the
/// name as contended (its local gates), which allocates.
template <class Lock, class Make>
void fail_each_allocation_of_a_contended_release(const redis_server& srv, bool from_then_on,
                                                 const std::string& name, Make make,
                                                 redislock::client& waiter_client) {
    for (std::int64_t nth = 0; nth < most_allocations; ++nth) {
        SCOPED_TRACE("allocation " + std::to_string(nth) + " of a contended release fails");
        Lock holder = make();
        ASSERT_TRUE(holder.try_lock_for(5s));
        Lock rival = make(&waiter_client);
        std::atomic<bool> got{false};
        std::jthread waiting{[&] {
            got = rival.try_lock_for(20s);
            if (got) {
                rival.unlock();
            }
        }};
        // The waiter stands in the lock's queue in Redis.
        ASSERT_TRUE(eventually(
            [&] {
                return srv.cli({"EXISTS", "{" + name + "}:queue"}) == "1";
            },
            5s));
        const bool failed =
            with_failing_allocation(nth, from_then_on, [&]() noexcept { holder.unlock(); });
        EXPECT_FALSE(holder.owned());
        waiting.join();
        EXPECT_TRUE(got) << "the waiter never got the lock";
        if (!failed) {
            return;
        }
    }
    FAIL() << "the release made more than " << most_allocations << " allocations";
}

TEST_P(AllocationFailure, ContendedReleaseOfEveryKindNeverTerminates) {
    fail_each_allocation_of_a_contended_release<redislock::mutex>(
        srv_, from_then_on(), "alloc:contended:mutex",
        [&](redislock::client* other = nullptr) {
            return (other ? *other : client_).mutex("alloc:contended:mutex", renewed());
        },
        rival_client_);
    fail_each_allocation_of_a_contended_release<redislock::recursive_mutex>(
        srv_, from_then_on(), "alloc:contended:recursive",
        [&](redislock::client* other = nullptr) {
            return (other ? *other : client_)
                .recursive_mutex("alloc:contended:recursive", renewed());
        },
        rival_client_);
    fail_each_allocation_of_a_contended_release<redislock::shared_mutex>(
        srv_, from_then_on(), "alloc:contended:shared",
        [&](redislock::client* other = nullptr) {
            return (other ? *other : client_).shared_mutex("alloc:contended:shared", renewed());
        },
        rival_client_);
}

}  // namespace
