// Mutual exclusion of every lock kind under random network faults (see support/fault_checker.hpp
// for what is checked and how). Each run takes about 6 s. Environment: REDISLOCK_LONG_FAULTS=1
// makes it 30 s of faults; REDISLOCK_FAULT_SEED=N runs another schedule;
// REDISLOCK_FAULT_PERCENT=0 is a control run without faults; REDISLOCK_FAULT_LOST_REPLIES=1 adds
// lost replies (ghost writes) to the faults; REDISLOCK_FAULT_VERBOSE=1 prints the report of runs
// that pass too.

#include "support/fault_checker.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "support/redis_server.hpp"

namespace {

using redislock::test::fault_run_options;
using redislock::test::lock_kind;
using redislock::test::redis_server;
using redislock::test::run_fault_exclusion;
using redislock::test::with_environment;
using redislock::test::detail::find_exclusion_violation;

// The interval logic on made-up holds, so a run that passes is known to be able to fail.
redislock::test::fault_hold hold(std::int64_t enter_ms, std::int64_t exit_ms, bool write,
                                 int name = 0) {
    redislock::test::fault_hold h;
    h.enter_ns = enter_ms * 1'000'000;
    h.exit_ns = exit_ms * 1'000'000;
    h.write = write ? 1 : 0;
    h.name = name;
    return h;
}

TEST(FaultChecker, OverlappingWritersAreAViolation) {
    const std::vector holds{hold(0, 10, true), hold(20, 30, true), hold(29, 40, true)};
    const auto violation = find_exclusion_violation(holds, 0, 0);
    ASSERT_TRUE(violation);
    EXPECT_NE(violation->find("[20.0 ms, 30.0 ms]"), std::string::npos) << *violation;
    EXPECT_NE(violation->find("[29.0 ms, 40.0 ms]"), std::string::npos) << *violation;
}

TEST(FaultChecker, OneLongWriterSpanningLaterOnesIsCaughtAndEveryOverlapCounted) {
    const std::vector holds{hold(0, 100, true), hold(10, 20, true), hold(50, 60, true)};
    const auto violation = find_exclusion_violation(holds, 0, 0);
    ASSERT_TRUE(violation);
    EXPECT_NE(violation->find("(2 hold(s) of this name began inside another)"), std::string::npos)
        << *violation;
}

TEST(FaultChecker, ReadersMayOverlapEachOtherButNotAWriter) {
    const std::vector readers{hold(0, 50, false), hold(10, 60, false), hold(55, 70, false),
                              hold(80, 90, true)};
    EXPECT_FALSE(find_exclusion_violation(readers, 0, 0));
    auto with_writer = readers;
    with_writer.push_back(hold(65, 75, true));  // inside the third reader's hold
    const auto violation = find_exclusion_violation(with_writer, 0, 0);
    ASSERT_TRUE(violation);
    EXPECT_NE(violation->find("read (looks at remaining()) [55.0 ms, 70.0 ms]"), std::string::npos)
        << *violation;
    EXPECT_NE(violation->find("write (looks at remaining()) [65.0 ms, 75.0 ms]"), std::string::npos)
        << *violation;
}

TEST(FaultChecker, HoldsOfDifferentNamesDoNotExcludeEachOther) {
    const std::vector holds{hold(0, 10, true, 0), hold(5, 15, true, 1)};
    EXPECT_FALSE(find_exclusion_violation(holds, 0, 0));
    EXPECT_FALSE(find_exclusion_violation(holds, 1, 0));
}

TEST(FaultChecker, TouchingHoldsDoNotOverlap) {
    const std::vector holds{hold(0, 10, true), hold(10, 20, true)};
    EXPECT_FALSE(find_exclusion_violation(holds, 0, 0));
}

TEST(FaultExclusion, MutexHoldersNeverOverlapUnderNetworkFaults) {
    redis_server srv;
    const auto report =
        run_fault_exclusion(srv, with_environment({.kind = lock_kind::mutex, .seed = 11}));
    redislock::test::print_if_verbose(report);
    EXPECT_TRUE(report.passed()) << report.describe();
}

TEST(FaultExclusion, RecursiveMutexHoldersNeverOverlapUnderNetworkFaults) {
    redis_server srv;
    const auto report = run_fault_exclusion(
        srv, with_environment({.kind = lock_kind::recursive_mutex, .seed = 12}));
    redislock::test::print_if_verbose(report);
    EXPECT_TRUE(report.passed()) << report.describe();
}

TEST(FaultExclusion, SharedMutexWritersExcludeEveryoneUnderNetworkFaults) {
    redis_server srv;
    const auto report =
        run_fault_exclusion(srv, with_environment({.kind = lock_kind::shared_mutex, .seed = 13}));
    redislock::test::print_if_verbose(report);
    EXPECT_TRUE(report.passed()) << report.describe();
}

}  // namespace
