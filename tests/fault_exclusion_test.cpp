// Mutual exclusion of every lock kind under random network faults (see support/fault_checker.hpp
// for what is checked and how). Each run takes a few seconds; REDISLOCK_LONG_FAULTS=1 makes it
// 30 s of faults, REDISLOCK_FAULT_SEED=N replays another schedule, REDISLOCK_FAULT_VERBOSE=1
// prints the report of runs that pass too.

#include "support/fault_checker.hpp"

#include <gtest/gtest.h>

#include "support/redis_server.hpp"

namespace {

using redislock::test::fault_run_options;
using redislock::test::lock_kind;
using redislock::test::redis_server;
using redislock::test::run_fault_exclusion;
using redislock::test::with_environment;

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
