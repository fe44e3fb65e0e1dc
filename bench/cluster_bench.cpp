// What the cluster connection costs: lock+unlock through redislock::cluster_client next to the
// same two round trips sent by hand to the right node, and the watchdog over three masters.
//
// One private Redis Cluster (3 masters + 3 replicas, loopback) is started here and stopped at
// exit. Variants, each over persistent connections:
//   raw_hiredis                 one redisContext to the master that serves "bench:raw" (found
//                               with redis-cli): SET key token NX PX 30000, then EVALSHA of a plain
//                               compare-and-delete script, a fresh random token per iteration;
//                               the floor of any simple lock that already knows the slot map
//   cluster_connection_set_evalsha  raw_hiredis's two commands through
//                               hiredis_cluster_connection::execute(): the routing layer alone
//   hiredis_connection_set_evalsha  the same through the single-node hiredis_connection to that
//                               master: the adapter's share of the difference
//   raw_hiredis_publish         raw_hiredis whose compare-and-delete also PUBLISHes on a channel;
//                               a cluster broadcasts every PUBLISH to every node, which is why
//                               the locks' release scripts use SPUBLISH, and only for waiters
//   raw_hiredis_spublish        the same with SPUBLISH, which stays on the slot's shard
//   cluster_mutex_lock_unlock   redislock::cluster_mutex lock() + unlock() through
//                               redislock::cluster_client, on a name in the same slot (its
//                               release script publishes, with SPUBLISH, only when someone
//                               waits, which no one does here)
//   cluster_mutex_fenced_lock_unlock  the same with lock_options::fencing
//   cluster_mutex_lock_unlock_paired  cluster_mutex_lock_unlock and raw_hiredis in turn within each
//                               iteration (see paired_with_raw in support/bench_support.hpp)
// Repetitions run in random interleaving (10 by default). After Google Benchmark's table:
//   ratio <name>: <median real time of raw_hiredis / median real time of the variant>
// Then the watchdog: --locks locks (default 10,000) spread over the masters, held with
// lock_options::watchdog and a --lease_ms lease (default 3000, a renewal period of 1 s); over
// three periods after a warm-up it prints the watchdog's batches per period and each master's
// round trips per period. Every batch is one pipeline per master; leases taken over more than a
// quarter of a period (10,000 acquisitions take seconds) fall due in more than one batch.
//
// Usage: cluster_bench [--locks=N] [--lease_ms=MS] [--benchmark_* flags]; --locks=0 skips the
// watchdog part.

#include <benchmark/benchmark.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/bench_support.hpp"
#include "support/redis_cluster.hpp"

namespace {

using namespace std::chrono_literals;

void report_watchdog(redislock::cluster_client& cc, std::size_t count,
                     std::chrono::milliseconds lease) {
    const auto period = lease / 3;
    constexpr int periods = 3;
    std::vector<redislock::cluster_mutex> locks;
    locks.reserve(count);
    const auto start = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < count; ++i) {
        locks.push_back(
            cc.mutex("bench:watchdog:" + std::to_string(i), {.lease = lease, .watchdog = true}));
        locks.back().lock();
    }
    const auto taking = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    auto& wd = cc.watchdog();
    // Warm-up: a full round of renewals, so that leases taken over the loop fall due together.
    const auto warm_from = wd.stats().renewals;
    const auto warm_deadline = std::chrono::steady_clock::now() + 3 * period;
    while (wd.stats().renewals - warm_from < 2 * count &&
           std::chrono::steady_clock::now() < warm_deadline) {
        std::this_thread::sleep_for(10ms);
    }
    const auto before = wd.stats();
    const auto trips_before = cc.connection().round_trips_per_node();
    std::this_thread::sleep_for(periods * period);
    const auto after = wd.stats();
    const auto trips_after = cc.connection().round_trips_per_node();
    std::printf(
        "watchdog over %zu masters, %zu locks taken in %lld ms, lease %lld ms: %.2f batches "
        "per period, %.0f renewals per period, %llu losses\n",
        cc.connection().masters().size(), count, static_cast<long long>(taking.count()),
        static_cast<long long>(lease.count()),
        static_cast<double>(after.round_trips - before.round_trips) / periods,
        static_cast<double>(after.renewals - before.renewals) / periods,
        static_cast<unsigned long long>(after.losses));
    for (const auto& [node, trips] : trips_after) {
        const auto it = trips_before.find(node);
        const auto was = it == trips_before.end() ? 0 : it->second;
        std::printf("  %s: %.2f round trips per period\n", node.c_str(),
                    static_cast<double>(trips - was) / periods);
    }
    for (auto& m : locks) {
        m.unlock();
    }
}

// raw_hiredis's two commands sent through a connection of the library instead of a bare
// context: what the adapter (and, for the cluster, routing) costs without the lock classes.
template <class Connection>
void bench_connection_pair(benchmark::State& state, Connection& conn, const std::string& sha) {
    constexpr std::string_view key = "bench:raw";
    redislock::bench::raw_token tokens;
    for (auto _ : state) {
        const std::string_view token = tokens.next();
        const std::array<std::string_view, 6> set{"SET", key, token, "NX", "PX", "30000"};
        const std::array<std::string_view, 5> del{"EVALSHA", sha, "1", key, token};
        if (!conn.execute(set).is_status() || conn.execute(del) != redislock::reply::integer(1)) {
            state.SkipWithError("SET NX / compare-and-delete through the cluster failed");
            break;
        }
    }
}

// raw_hiredis with the release notification the locks send: the compare-and-delete script also
// publishes on a channel of the name's slot, with PUBLISH (a cluster broadcasts it to every node)
// or SPUBLISH (it stays on the slot's shard).
void bench_raw_notifying(benchmark::State& state, redislock::bench::raw_baseline& raw,
                         std::string_view publish) {
    constexpr std::string_view key = "bench:raw";
    const std::string source =
        "if redis.call('GET',KEYS[1])==ARGV[1] then redis.call('DEL',KEYS[1]) "
        "redis.call('" +
        std::string{publish} + "',ARGV[2],KEYS[1]) return 1 end return 0";
    const redislock::bench::reply_ptr loaded = redislock::bench::command(
        raw.ctx.get(), std::array<std::string_view, 3>{"SCRIPT", "LOAD", source});
    if (!loaded || loaded->type != REDIS_REPLY_STRING) {
        state.SkipWithError("SCRIPT LOAD of the notifying script failed");
        return;
    }
    const std::string sha{loaded->str, loaded->len};
    redislock::bench::raw_token tokens;
    for (auto _ : state) {
        const std::string_view token = tokens.next();
        const redislock::bench::reply_ptr set = redislock::bench::command(
            raw.ctx.get(), std::array<std::string_view, 6>{"SET", key, token, "NX", "PX", "30000"});
        const redislock::bench::reply_ptr del = redislock::bench::command(
            raw.ctx.get(), std::array<std::string_view, 6>{"EVALSHA", sha, "1", key, token,
                                                           "{bench:raw}:released"});
        if (!set || set->type != REDIS_REPLY_STATUS || !del || del->type != REDIS_REPLY_INTEGER ||
            del->integer != 1) {
            state.SkipWithError("raw SET NX / notifying compare-and-delete did not succeed");
            break;
        }
    }
}

int run(int argc, char** argv) {
    std::vector<char*> args{argv, argv + argc};
    std::size_t locks = 10'000;
    std::chrono::milliseconds lease{3000};
    for (auto it = args.begin() + 1; it != args.end();) {
        const std::string_view arg{*it};
        if (arg.starts_with("--locks=")) {
            locks = std::stoul(std::string{arg.substr(8)});
            it = args.erase(it);
        } else if (arg.starts_with("--lease_ms=")) {
            lease = std::chrono::milliseconds{std::stol(std::string{arg.substr(11)})};
            if (lease < 300ms) {
                throw std::invalid_argument{"--lease_ms must be at least 300"};
            }
            it = args.erase(it);
        } else {
            ++it;
        }
    }
    std::string interleave = "--benchmark_enable_random_interleaving=true";
    std::string repetitions = "--benchmark_repetitions=10";
    if (!redislock::bench::detail::has_flag(args, "--benchmark_enable_random_interleaving")) {
        args.insert(args.begin() + 1, interleave.data());
    }
    if (!redislock::bench::detail::has_flag(args, "--benchmark_repetitions")) {
        args.insert(args.begin() + 1, repetitions.data());
    }
    int count = static_cast<int>(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&count, args.data());
    if (benchmark::ReportUnrecognizedArguments(count, args.data())) {
        return 2;
    }

    redislock::test::redis_cluster cluster{3, 1};
    std::printf("cluster of 3 masters + 3 replicas ready in %lld ms\n",
                static_cast<long long>(cluster.bring_up_time().count()));
    redislock::bench::raw_baseline raw =
        redislock::bench::connect_raw(cluster.master_for_key("bench:raw"));
    redislock::cluster_client cc{cluster.uri()};

    redislock::bench::ratio_reporter reporter{benchmark::ConsoleReporter::OO_Tabular};
    const redislock::bench::detail::clear_registered clear;
    const std::string raw_name{redislock::bench::raw_name};
    reporter.expect(raw_name);
    benchmark::RegisterBenchmark(raw_name.c_str(), [&raw](benchmark::State& state) {
        redislock::bench::bench_raw(state, raw);
    })->UseRealTime();
    const std::string pair_name{"cluster_connection_set_evalsha"};
    reporter.expect(pair_name);
    benchmark::RegisterBenchmark(pair_name.c_str(), [&](benchmark::State& state) {
        bench_connection_pair(state, cc.connection(), raw.sha);
    })->UseRealTime();
    redislock::hiredis_connection single{cluster.uri_of(cluster.master_for_key("bench:raw"))};
    const std::string single_name{"hiredis_connection_set_evalsha"};
    reporter.expect(single_name);
    benchmark::RegisterBenchmark(single_name.c_str(), [&](benchmark::State& state) {
        bench_connection_pair(state, single, raw.sha);
    })->UseRealTime();
    for (const std::string_view publish : {"PUBLISH", "SPUBLISH"}) {
        const std::string name =
            "raw_hiredis_" + std::string{publish == "PUBLISH" ? "publish" : "spublish"};
        reporter.expect(name);
        benchmark::RegisterBenchmark(name.c_str(), [&raw, publish](benchmark::State& state) {
            bench_raw_notifying(state, raw, publish);
        })->UseRealTime();
    }
    // Lock names in the slot of "bench:raw", so every variant talks to the same master.
    for (const bool fenced : {false, true}) {
        const std::string name =
            fenced ? "cluster_mutex_fenced_lock_unlock" : "cluster_mutex_lock_unlock";
        reporter.expect(name);
        benchmark::RegisterBenchmark(name.c_str(), [m = cc.mutex(fenced ? "{bench:raw}:fenced"
                                                                        : "{bench:raw}:lock",
                                                                 {.fencing = fenced})](
                                                       benchmark::State& state) mutable {
            redislock::bench::lock_unlock(state, m);
        })->UseRealTime();
    }
    // The same lock timed against raw_hiredis within each iteration (see paired_with_raw).
    const std::string paired_name{"cluster_mutex_lock_unlock_paired"};
    reporter.expect_paired(paired_name);
    benchmark::RegisterBenchmark(paired_name.c_str(), [&raw, m = cc.mutex("{bench:raw}:paired")](
                                                          benchmark::State& state) mutable {
        redislock::bench::paired_with_raw(state, raw,
                                          [&m] { return redislock::bench::lock_unlock_once(m); });
    })->UseRealTime();
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    if (locks > 0) {
        report_watchdog(cc, locks, lease);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    // Caught here so the cluster fixture's destructor stops every node on every exit path.
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::cerr << "cluster_bench: " << e.what() << '\n';
        return 1;
    }
}
