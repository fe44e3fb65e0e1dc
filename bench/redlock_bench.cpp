// What one lock+unlock of a Redlock lock over five masters costs next to the simple lock on one
// of them.
//
// Both variants run in one process against five private redis-servers on TCP loopback, started
// here and stopped at exit:
//   mutex_one_master        redislock::mutex lock() + unlock() through redislock::client on
//                           master 1: two round trips
//   redlock_five_masters    redislock::redlock_mutex lock() + unlock() through
//                           redislock::redlock_client over masters 1..5: two rounds, each
//                           written to the five masters' sockets at once from the calling
//                           thread, which then polls them all until every master answered
//
// Repetitions run in random interleaving (10 by default), so drift of the machine spreads over
// both alike. After Google Benchmark's table, one line:
//   ratio redlock/mutex: <median real time of redlock_five_masters / that of mutex_one_master>
// 1.00 is as fast as one master; the parallel fan-out aims at 1.3 or less.
//
// Usage: redlock_bench [--benchmark_* flags]; flags given override the defaults above.

#include <unistd.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/bench_support.hpp"
#include "support/redis_server.hpp"

namespace {

constexpr std::string_view single_name = "mutex_one_master";
constexpr std::string_view redlock_name = "redlock_five_masters";

// Prints the table as usual, then the ratio of the two variants' median real times.
class redlock_reporter : public benchmark::ConsoleReporter {
public:
    using benchmark::ConsoleReporter::ConsoleReporter;

    void ReportRuns(const std::vector<Run>& reports) override {
        for (const Run& run : reports) {
            if (run.error_occurred) {
                continue;
            }
            const std::string& name = run.run_name.function_name;
            if (run.run_type == Run::RT_Aggregate && run.aggregate_name == "median") {
                medians_[name] = run.GetAdjustedRealTime();
            } else if (run.run_type == Run::RT_Iteration) {
                samples_[name].push_back(run.GetAdjustedRealTime());
            }
        }
        ConsoleReporter::ReportRuns(reports);
    }

    void Finalize() override {
        ConsoleReporter::Finalize();
        const double single = median(std::string{single_name});
        const double redlock = median(std::string{redlock_name});
        if (single <= 0 && redlock <= 0) {
            return;  // nothing ran, e.g. --benchmark_list_tests
        }
        char line[120];
        if (single > 0 && redlock > 0) {
            std::snprintf(line, sizeof line, "ratio redlock/mutex: %.2f", redlock / single);
        } else {
            std::snprintf(line, sizeof line, "ratio redlock/mutex: n/a (no successful run)");
        }
        GetOutputStream() << line << '\n';
        GetOutputStream().flush();
    }

private:
    // Google Benchmark computes no aggregates for a single repetition: fall back to the runs.
    double median(const std::string& name) const {
        if (const auto it = medians_.find(name); it != medians_.end()) {
            return it->second;
        }
        const auto it = samples_.find(name);
        if (it == samples_.end() || it->second.empty()) {
            return 0;
        }
        std::vector<double> values = it->second;
        std::sort(values.begin(), values.end());
        const std::size_t mid = values.size() / 2;
        return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
    }

    std::map<std::string, double> medians_;
    std::map<std::string, std::vector<double>> samples_;
};

int run(int argc, char** argv) {
    std::vector<char*> args{argv, argv + argc};
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

    std::array<std::unique_ptr<redislock::test::redis_server>, 5> servers;
    std::vector<std::string> uris;
    for (auto& server : servers) {
        server = std::make_unique<redislock::test::redis_server>(
            redislock::test::redis_server::options{.extra_args = {"--hz", "100"}});
        uris.push_back(server->uri());
    }
    redislock::client single{servers[0]->uri()};
    // A generous node timeout: it bounds calls to a hung master and changes nothing on the
    // healthy path measured here, but the default 50 ms can run out on a loaded machine.
    redislock::redlock_client five{uris, {.node_timeout = std::chrono::seconds{1}}};

    const bool color = ::isatty(STDOUT_FILENO) == 1;
    redlock_reporter reporter{color ? benchmark::ConsoleReporter::OO_ColorTabular
                                    : benchmark::ConsoleReporter::OO_Tabular};
    const redislock::bench::detail::clear_registered clear;
    benchmark::RegisterBenchmark(
        std::string{single_name}.c_str(),
        [m = single.mutex("bench:single")](benchmark::State& state) mutable {
            redislock::bench::lock_unlock(state, m);
        })
        ->UseRealTime();
    benchmark::RegisterBenchmark(
        std::string{redlock_name}.c_str(),
        [m = five.mutex("bench:redlock")](benchmark::State& state) mutable {
            redislock::bench::lock_unlock(state, m);
        })
        ->UseRealTime();

    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    // Caught here so the servers' destructors stop redis-server on every exit path.
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::cerr << "redlock_bench: " << e.what() << '\n';
        return 1;
    }
}
