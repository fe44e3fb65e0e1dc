// detail::reconnect_relay: the handler a Cluster's or a Sentinel's pools report to. Deferrals
// hold a thread's reports back until its locks are released; a forked child never waits for a
// mutex a parent's thread held at the fork.

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <redislock/detail/engine/reconnect_relay.hpp>

#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::detail::reconnect_relay;
using redislock::test::wait_child;

TEST(ReconnectRelay, DeferralHoldsThisThreadsReportsUntilTheOutermostEnds) {
    reconnect_relay relay;
    std::vector<std::string> told;
    relay.set([&](std::string_view server) { told.emplace_back(server); });
    {
        const auto outer = relay.defer();
        relay.report("a:1");
        {
            const auto inner = relay.defer();
            relay.report("b:2");
        }
        EXPECT_TRUE(told.empty()) << "the inner deferral ended inside the outer one";
        const auto forward = relay.forward();
        forward("c:3");
        EXPECT_TRUE(told.empty());
    }
    EXPECT_EQ(told, (std::vector<std::string>{"a:1", "b:2", "c:3"}));
    relay.report("d:4");
    EXPECT_EQ(told.size(), 4U) << "no deferral open: told at once";
}

TEST(ReconnectRelay, DeferralHoldsBackNeitherOtherThreadsNorOtherRelays) {
    reconnect_relay relay;
    reconnect_relay other;
    std::atomic<int> told{0};
    relay.set([&](std::string_view) { ++told; });
    other.set([&](std::string_view) { ++told; });
    const auto deferred = relay.defer();
    std::thread{[&] { relay.report("a:1"); }}.join();
    EXPECT_EQ(told.load(), 1);
    other.report("b:2");
    EXPECT_EQ(told.load(), 2);
    relay.report("c:3");
    EXPECT_EQ(told.load(), 2);
}

TEST(ReconnectRelay, HandlerMayReportAndReplaceItselfWhileItRuns) {
    reconnect_relay relay;
    int calls = 0;
    relay.set([&](std::string_view server) {
        ++calls;
        if (server == "first") {
            relay.report("second");
        } else {
            relay.set(nullptr);
        }
    });
    relay.report("first");
    EXPECT_EQ(calls, 2);
    relay.report("third");
    EXPECT_EQ(calls, 2) << "the handler cleared itself";
}

// A parent's thread keeps replacing the handler while the parent forks: a child that reports
// and sets a handler of its own never blocks on the parent's copy of the relay's mutex (locked
// in the child when the fork came during a replacement).
TEST(ReconnectRelay, ForkedChildNeverWaitsForAMutexAParentThreadHeld) {
    reconnect_relay relay;
    std::atomic<bool> stop{false};
    std::thread replacing{[&] {
        for (int i = 0; !stop.load(std::memory_order_relaxed); ++i) {
            relay.set([i](std::string_view) { (void)i; });
        }
    }};
    int hung = 0;
    for (int round = 0; round < 200 && hung == 0; ++round) {
        const pid_t pid = ::fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            relay.report("child:1");
            bool told = false;
            relay.set([&](std::string_view) { told = true; });
            relay.report("child:2");
            ::_exit(told ? 0 : 1);
        }
        const std::optional<int> status = wait_child(pid, 5s);
        if (!status) {
            ++hung;
            continue;
        }
        EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "round " << round;
    }
    stop = true;
    replacing.join();
    EXPECT_EQ(hung, 0) << "a child waited for the parent's mutex";
}

// Forked from a quiet moment, the child keeps the parent's handler.
TEST(ReconnectRelay, ForkedChildKeepsTheParentsHandler) {
    reconnect_relay relay;
    bool told = false;
    relay.set([&](std::string_view server) { told = server == "child:1"; });
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        relay.report("child:1");
        ::_exit(told ? 0 : 1);
    }
    const std::optional<int> status = wait_child(pid, 10s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    EXPECT_FALSE(told) << "the parent was not told of the child's report";
}

}  // namespace
