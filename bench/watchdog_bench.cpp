// What keeping many leases alive costs the watchdog, next to the same renewals sent by hand.
//
// Both variants run in one process against one private redis-server on TCP loopback, started
// here and stopped at exit:
//   watchdog_renewals       10,000 redislock::node_mutex locks held with lock_options::watchdog on
//                           one client. After the first full round of renewals (which also
//                           loads the script), the watchdog's own counters are read over three
//                           renewal periods (lease/3 each): round trips per period, renewals per
//                           round trip, and the CPU time of the watchdog thread per renewal
//                           (watchdog_stats::cpu_time / renewals). The measured run uses a 3 s
//                           lease (a period of 1 s) to stay short; --lease_ms=30000 measures the
//                           default 30 s lease in about 45 s.
//   raw_pipelined_evalsha   the floor: one raw redisContext sends one pipelined batch of 10,000
//                           EVALSHA of a plain compare-and-PEXPIRE script (loaded once) over keys
//                           that hold the token, then reads the 10,000 replies; wall time and
//                           this thread's CPU time per renewal.
//
// After Google Benchmark's table, one line per variant with those figures.
//
// Usage: watchdog_bench [--locks=N] [--lease_ms=MS] [--benchmark_* flags]
//   --locks     locks held (and keys in the raw batch), 1..100000, default 10000
//   --lease_ms  the watchdog variant's lease, 300..30000, default 3000

#include <hiredis/hiredis.h>
#include <time.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <array>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/bench_support.hpp"
#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::bench::context_ptr;
using redislock::bench::raw_token;
using redislock::bench::reply_ptr;

constexpr std::string_view watchdog_name = "watchdog_renewals";
constexpr std::string_view raw_name = "raw_pipelined_evalsha";
constexpr std::string_view compare_and_pexpire =
    "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('PEXPIRE',KEYS[1],ARGV[2]) "
    "end return 0";
constexpr int measured_periods = 3;

struct settings {
    std::size_t locks = 10'000;
    std::chrono::milliseconds lease{3'000};
};

std::chrono::nanoseconds thread_cpu_time() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::chrono::seconds{ts.tv_sec} + std::chrono::nanoseconds{ts.tv_nsec};
}

// The watchdog's counters and the connection's round trips, read while no batch is between the
// connection counting it and the watchdog counting it.
std::pair<redislock::watchdog_stats, std::uint64_t> quiet_counts(redislock::node_client& client) {
    for (int attempt = 0;; ++attempt) {
        const auto stats = client.watchdog().stats();
        const auto trips = client.connection().round_trips();
        std::this_thread::sleep_for(5ms);
        if ((client.watchdog().stats().round_trips == stats.round_trips &&
             client.connection().round_trips() == trips) ||
            attempt == 100) {
            return {stats, trips};
        }
    }
}

void bench_watchdog(benchmark::State& state, redislock::node_client& client,
                    const settings& config) {
    const auto period = config.lease / 3;
    for (auto _ : state) {
        std::vector<redislock::node_mutex> locks;
        locks.reserve(config.locks);
        for (std::size_t i = 0; i < config.locks; ++i) {
            locks.push_back(client.mutex("bench:watchdog:" + std::to_string(i),
                                         {.lease = config.lease, .watchdog = true}));
            locks.back().lock();
        }

        // Warm-up: one full round, which also meets NOSCRIPT once and loads the script.
        const auto warm_from = client.watchdog().stats().renewals;
        const auto warm_deadline = std::chrono::steady_clock::now() + 2 * period + 10s;
        while (client.watchdog().stats().renewals - warm_from < config.locks &&
               std::chrono::steady_clock::now() < warm_deadline) {
            std::this_thread::sleep_for(10ms);
        }

        const auto [before, trips_before] = quiet_counts(client);
        const auto window_start = std::chrono::steady_clock::now();
        std::this_thread::sleep_for(measured_periods * period);
        const auto [after, trips_after] = quiet_counts(client);
        const std::chrono::duration<double> window =
            std::chrono::steady_clock::now() - window_start;

        const double renewals = static_cast<double>(after.renewals - before.renewals);
        const double trips = static_cast<double>(after.round_trips - before.round_trips);
        const double periods = window / period;
        const double cpu = std::chrono::duration<double>(after.cpu_time - before.cpu_time).count();
        const bool all_kept = after.losses == 0 && client.watchdog().size() == config.locks;
        for (auto& m : locks) {
            m.unlock();
        }
        if (renewals < static_cast<double>(config.locks) || trips == 0 || !all_kept) {
            state.SkipWithError("the watchdog did not renew every lock in the window");
            break;
        }
        state.SetIterationTime(window.count());
        state.counters["locks"] = static_cast<double>(config.locks);
        state.counters["lease_ms"] = static_cast<double>(config.lease.count());
        state.counters["connection_round_trips"] = static_cast<double>(trips_after - trips_before);
        state.counters["round_trips_per_period"] = trips / periods;
        state.counters["renewals_per_period"] = renewals / periods;
        state.counters["renewals_per_round_trip"] = renewals / trips;
        state.counters["cpu_per_renewal"] = cpu / renewals;
    }
}

// One raw context with the script loaded, and the keys and tokens of the batch.
struct raw_batch {
    context_ptr ctx;
    std::string sha;
    std::vector<std::string> keys;
    std::vector<std::string> tokens;
};

reply_ptr raw_command(redisContext* ctx, const std::vector<std::string_view>& argv) {
    std::vector<const char*> pointers;
    std::vector<std::size_t> lengths;
    for (const auto arg : argv) {
        pointers.push_back(arg.data());
        lengths.push_back(arg.size());
    }
    return reply_ptr{static_cast<redisReply*>(
        redisCommandArgv(ctx, static_cast<int>(argv.size()), pointers.data(), lengths.data()))};
}

raw_batch prepare_raw(int port, std::size_t count) {
    raw_batch raw{context_ptr{redisConnect("127.0.0.1", port)}, {}, {}, {}};
    if (!raw.ctx || raw.ctx->err) {
        throw std::runtime_error{"raw hiredis cannot connect to 127.0.0.1:" + std::to_string(port)};
    }
    const reply_ptr loaded = raw_command(raw.ctx.get(), {"SCRIPT", "LOAD", compare_and_pexpire});
    if (!loaded || loaded->type != REDIS_REPLY_STRING) {
        throw std::runtime_error{"SCRIPT LOAD of the compare-and-PEXPIRE script failed"};
    }
    raw.sha.assign(loaded->str, loaded->len);
    raw_token tokens;
    for (std::size_t i = 0; i < count; ++i) {
        raw.keys.push_back("bench:raw:" + std::to_string(i));
        raw.tokens.emplace_back(tokens.next());
    }
    return raw;
}

// Sends `argv_of(i)` (a std::array of arguments) for every key in one pipelined batch; true if
// every reply satisfies `ok`.
template <class ArgvOf, class Ok>
bool pipeline(raw_batch& raw, ArgvOf argv_of, Ok ok) {
    for (std::size_t i = 0; i < raw.keys.size(); ++i) {
        const auto argv = argv_of(i);
        constexpr std::size_t n = std::tuple_size_v<decltype(argv)>;
        std::array<const char*, n> pointers{};
        std::array<std::size_t, n> lengths{};
        for (std::size_t k = 0; k < n; ++k) {
            pointers[k] = argv[k].data();
            lengths[k] = argv[k].size();
        }
        if (redisAppendCommandArgv(raw.ctx.get(), static_cast<int>(n), pointers.data(),
                                   lengths.data()) != REDIS_OK) {
            return false;
        }
    }
    bool all_ok = true;
    for (std::size_t i = 0; i < raw.keys.size(); ++i) {
        void* r = nullptr;
        if (redisGetReply(raw.ctx.get(), &r) != REDIS_OK || r == nullptr) {
            return false;
        }
        const reply_ptr reply{static_cast<redisReply*>(r)};
        all_ok = all_ok && ok(*reply);
    }
    return all_ok;
}

// (Re)writes every key with its token, so each renewal finds it.
bool set_keys(raw_batch& raw) {
    return pipeline(
        raw,
        [&](std::size_t i) {
            return std::array<std::string_view, 5>{"SET", raw.keys[i], raw.tokens[i], "PX",
                                                   "60000"};
        },
        [](const redisReply& r) { return r.type == REDIS_REPLY_STATUS; });
}

// One pipelined batch of renewals; false if one did not renew.
bool renew_batch(raw_batch& raw) {
    return pipeline(
        raw,
        [&](std::size_t i) {
            return std::array<std::string_view, 6>{"EVALSHA",   raw.sha,       "1",
                                                   raw.keys[i], raw.tokens[i], "30000"};
        },
        [](const redisReply& r) { return r.type == REDIS_REPLY_INTEGER && r.integer == 1; });
}

void bench_raw(benchmark::State& state, raw_batch& raw) {
    if (!set_keys(raw)) {
        state.SkipWithError("writing the raw keys failed");
        return;
    }
    std::chrono::nanoseconds cpu{};
    for (auto _ : state) {
        const auto cpu_before = thread_cpu_time();
        const bool renewed = renew_batch(raw);
        cpu += thread_cpu_time() - cpu_before;
        if (!renewed) {
            state.SkipWithError("a raw renewal failed");
            break;
        }
    }
    const double renewals = static_cast<double>(state.iterations() * raw.keys.size());
    state.counters["locks"] = static_cast<double>(raw.keys.size());
    state.counters["per_renewal"] =
        benchmark::Counter(renewals, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
    state.counters["cpu_per_renewal"] = std::chrono::duration<double>(cpu).count() / renewals;
}

// Prints Google Benchmark's table as usual, then one line per variant from its counters.
class summary_reporter : public benchmark::ConsoleReporter {
public:
    using benchmark::ConsoleReporter::ConsoleReporter;

    void ReportRuns(const std::vector<Run>& reports) override {
        for (const Run& run : reports) {
            if (!run.error_occurred && run.run_type == Run::RT_Iteration) {
                std::map<std::string, double> values;
                for (const auto& [name, counter] : run.counters) {
                    values[name] = counter.value;
                }
                last_[run.run_name.function_name] = std::move(values);
            }
        }
        ConsoleReporter::ReportRuns(reports);
    }

    void Finalize() override {
        ConsoleReporter::Finalize();
        std::ostream& out = GetOutputStream();
        char line[400];
        if (const auto it = last_.find(std::string{watchdog_name}); it != last_.end()) {
            auto& v = it->second;
            std::snprintf(line, sizeof line,
                          "watchdog: %.0f locks, lease %.0f ms (renewed every %.0f ms): %.2f "
                          "round trips per period, %.0f renewals per round trip, %.3f us of "
                          "watchdog-thread CPU per renewal",
                          v["locks"], v["lease_ms"], v["lease_ms"] / 3, v["round_trips_per_period"],
                          v["renewals_per_round_trip"], v["cpu_per_renewal"] * 1e6);
            out << line << '\n';
        }
        if (const auto it = last_.find(std::string{raw_name}); it != last_.end()) {
            auto& v = it->second;
            std::snprintf(line, sizeof line,
                          "raw baseline: one pipelined batch of %.0f EVALSHA compare-and-PEXPIRE: "
                          "%.3f us wall (client and server) and %.3f us of client CPU per renewal",
                          v["locks"], v["per_renewal"] * 1e6, v["cpu_per_renewal"] * 1e6);
            out << line << '\n';
        }
        out.flush();
    }

private:
    std::map<std::string, std::map<std::string, double>> last_;
};

// Takes --locks=N and --lease_ms=MS out of `args`.
settings take_settings(std::vector<char*>& args) {
    settings config;
    const auto number = [](std::string_view text, std::string_view flag, long min, long max) {
        long value = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec != std::errc{} || end != text.data() + text.size() || value < min || value > max) {
            throw std::invalid_argument{std::string{flag} + " must be a number in [" +
                                        std::to_string(min) + ", " + std::to_string(max) + "]"};
        }
        return value;
    };
    for (auto it = args.begin() + 1; it != args.end();) {
        const std::string_view arg{*it};
        if (arg.starts_with("--locks=")) {
            config.locks = static_cast<std::size_t>(number(arg.substr(8), "--locks", 1, 100'000));
        } else if (arg.starts_with("--lease_ms=")) {
            config.lease =
                std::chrono::milliseconds{number(arg.substr(11), "--lease_ms", 300, 30'000)};
        } else {
            ++it;
            continue;
        }
        it = args.erase(it);
    }
    return config;
}

int run(int argc, char** argv) {
    std::vector<char*> args{argv, argv + argc};
    const settings config = take_settings(args);
    int count = static_cast<int>(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&count, args.data());
    if (benchmark::ReportUnrecognizedArguments(count, args.data())) {
        return 2;
    }

    redislock::test::redis_server server;
    raw_batch raw = prepare_raw(server.port(), config.locks);
    redislock::node_client client{server.uri()};

    benchmark::RegisterBenchmark(
        std::string{watchdog_name}.c_str(),
        [&](benchmark::State& state) { bench_watchdog(state, client, config); })
        ->Iterations(1)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(std::string{raw_name}.c_str(),
                                 [&](benchmark::State& state) { bench_raw(state, raw); })
        ->UseRealTime()
        ->MinTime(0.5)
        ->Unit(benchmark::kMillisecond);

    const bool color = ::isatty(STDOUT_FILENO) == 1;
    summary_reporter reporter{color ? benchmark::ConsoleReporter::OO_ColorTabular
                                    : benchmark::ConsoleReporter::OO_Tabular};
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    benchmark::ClearRegisteredBenchmarks();
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    // Caught here so the server fixture's destructor stops redis-server on every exit path.
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::cerr << "watchdog_bench: " << e.what() << '\n';
        return 1;
    }
}
