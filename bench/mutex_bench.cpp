// What one lock+unlock of redislock::mutex costs next to the same two round trips sent by hand.
//
// Every variant runs in one process against one private redis-server on TCP loopback, started
// here and stopped at exit, each over one persistent connection:
//   raw_hiredis               one redisContext: SET key token NX PX 30000, then EVALSHA of a plain
//                             compare-and-delete script (loaded once), a fresh random token per
//                             iteration; the floor any simple lock over hiredis can reach
//   mutex_lock_unlock         redislock::mutex lock() + unlock() through redislock::client; its
//                             release script also PUBLISHes for waiters, the raw one does not
//   mutex_try_lock_unlock     try_lock() + unlock()
//   mutex_fenced_lock_unlock  lock() + unlock() with lock_options::fencing (a script, not a SET)
//
// Repetitions run in random interleaving (10 by default), so drift of the machine spreads over
// all variants alike. After Google Benchmark's table, one line per variant:
//   ratio <name>: <median real time of raw_hiredis / median real time of the variant>
// 1.00 is as fast as raw hiredis, 0.95 is 5% slower, above 1 faster.
//
// Usage: mutex_bench [--benchmark_* flags]; flags given override the defaults above.

#include <hiredis/hiredis.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"

namespace {

constexpr std::string_view raw_name = "raw_hiredis";
constexpr std::string_view compare_and_delete =
    "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) end return 0";

struct context_deleter {
    void operator()(redisContext* ctx) const noexcept { redisFree(ctx); }
};
using context_ptr = std::unique_ptr<redisContext, context_deleter>;

struct reply_deleter {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

template <std::size_t N>
reply_ptr command(redisContext* ctx, const std::array<std::string_view, N>& argv) {
    std::array<const char*, N> pointers{};
    std::array<std::size_t, N> lengths{};
    for (std::size_t i = 0; i < N; ++i) {
        pointers[i] = argv[i].data();
        lengths[i] = argv[i].size();
    }
    return reply_ptr{static_cast<redisReply*>(
        redisCommandArgv(ctx, static_cast<int>(N), pointers.data(), lengths.data()))};
}

// splitmix64 into a stack buffer: about the least a random 128-bit hex token can cost.
class raw_token {
public:
    std::string_view next() {
        constexpr char digits[] = "0123456789abcdef";
        for (std::size_t half = 0; half < 2; ++half) {
            std::uint64_t bits = mix();
            for (std::size_t i = 0; i < 16; ++i, bits >>= 4) {
                text_[half * 16 + i] = digits[bits & 0xf];
            }
        }
        return {text_.data(), text_.size()};
    }

private:
    std::uint64_t mix() {
        std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }

    std::uint64_t state_ = static_cast<std::uint64_t>(::getpid()) * 0x2545f4914f6cdd1dULL;
    std::array<char, 32> text_{};
};

struct raw_baseline {
    context_ptr ctx;
    std::string sha;
};

raw_baseline connect_raw(int port) {
    raw_baseline raw{context_ptr{redisConnect("127.0.0.1", port)}, {}};
    if (!raw.ctx || raw.ctx->err) {
        throw std::runtime_error{"raw hiredis cannot connect to 127.0.0.1:" + std::to_string(port)};
    }
    const reply_ptr loaded = command(
        raw.ctx.get(), std::array<std::string_view, 3>{"SCRIPT", "LOAD", compare_and_delete});
    if (!loaded || loaded->type != REDIS_REPLY_STRING) {
        throw std::runtime_error{"SCRIPT LOAD of the compare-and-delete script failed"};
    }
    raw.sha.assign(loaded->str, loaded->len);
    return raw;
}

void bench_raw(benchmark::State& state, raw_baseline& raw) {
    constexpr std::string_view key = "bench:raw";
    raw_token tokens;
    for (auto _ : state) {
        const std::string_view token = tokens.next();
        const reply_ptr set = command(
            raw.ctx.get(), std::array<std::string_view, 6>{"SET", key, token, "NX", "PX", "30000"});
        const reply_ptr del = command(
            raw.ctx.get(), std::array<std::string_view, 5>{"EVALSHA", raw.sha, "1", key, token});
        if (!set || set->type != REDIS_REPLY_STATUS || !del || del->type != REDIS_REPLY_INTEGER ||
            del->integer != 1) {
            state.SkipWithError("raw SET NX / compare-and-delete did not succeed");
            break;
        }
    }
}

void bench_lock_unlock(benchmark::State& state, redislock::mutex& m) {
    std::error_code ec;
    for (auto _ : state) {
        m.lock();
        m.unlock(ec);
        if (ec) {
            state.SkipWithError(("unlock failed: " + ec.message()).c_str());
            break;
        }
    }
}

void bench_try_lock_unlock(benchmark::State& state, redislock::mutex& m) {
    std::error_code ec;
    for (auto _ : state) {
        if (!m.try_lock()) {
            state.SkipWithError("try_lock found the lock taken");
            break;
        }
        m.unlock(ec);
        if (ec) {
            state.SkipWithError(("unlock failed: " + ec.message()).c_str());
            break;
        }
    }
}

// Prints Google Benchmark's table as usual, then the ratio of each variant to raw_hiredis.
class ratio_reporter : public benchmark::ConsoleReporter {
public:
    using benchmark::ConsoleReporter::ConsoleReporter;

    void ReportRuns(const std::vector<Run>& reports) override {
        for (const Run& run : reports) {
            const std::string& name = run.run_name.function_name;
            if (run.error_occurred) {
                continue;
            }
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
        if (medians_.empty() && samples_.empty()) {
            return;  // nothing ran, e.g. --benchmark_list_tests
        }
        std::ostream& out = GetOutputStream();
        const double raw = median_of(std::string{raw_name});
        for (const std::string& name : order_) {
            if (name == raw_name) {
                continue;
            }
            const double variant = median_of(name);
            char line[160];
            if (raw > 0 && variant > 0) {
                std::snprintf(line, sizeof line, "ratio %s: %.2f", name.c_str(), raw / variant);
            } else {
                std::snprintf(line, sizeof line, "ratio %s: n/a (no successful run)", name.c_str());
            }
            out << line << '\n';
        }
        out.flush();
    }

    void expect(std::string name) { order_.push_back(std::move(name)); }

private:
    // Google Benchmark computes no aggregates for a single repetition: fall back to the runs.
    double median_of(const std::string& name) const {
        if (auto it = medians_.find(name); it != medians_.end()) {
            return it->second;
        }
        auto it = samples_.find(name);
        if (it == samples_.end() || it->second.empty()) {
            return 0;
        }
        std::vector<double> times = it->second;
        std::sort(times.begin(), times.end());
        const std::size_t mid = times.size() / 2;
        return times.size() % 2 == 1 ? times[mid] : (times[mid - 1] + times[mid]) / 2;
    }

    std::vector<std::string> order_;
    std::map<std::string, double> medians_;
    std::map<std::string, std::vector<double>> samples_;
};

bool has_flag(const std::vector<char*>& args, std::string_view flag) {
    return std::any_of(args.begin() + 1, args.end(),
                       [flag](const char* arg) { return std::string_view{arg}.starts_with(flag); });
}

int run(int argc, char** argv) {
    std::vector<char*> args{argv, argv + argc};
    std::string interleave = "--benchmark_enable_random_interleaving=true";
    std::string repetitions = "--benchmark_repetitions=10";
    if (!has_flag(args, "--benchmark_enable_random_interleaving")) {
        args.insert(args.begin() + 1, interleave.data());
    }
    if (!has_flag(args, "--benchmark_repetitions")) {
        args.insert(args.begin() + 1, repetitions.data());
    }
    int count = static_cast<int>(args.size());
    args.push_back(nullptr);
    benchmark::Initialize(&count, args.data());
    if (benchmark::ReportUnrecognizedArguments(count, args.data())) {
        return 2;
    }

    redislock::test::redis_server server;
    raw_baseline raw = connect_raw(server.port());
    redislock::client client{server.uri()};
    redislock::mutex plain = client.mutex("bench:lock");
    redislock::mutex tried = client.mutex("bench:try_lock");
    redislock::mutex fenced = client.mutex("bench:fenced", {.fencing = true});

    const bool color = ::isatty(STDOUT_FILENO) == 1;
    ratio_reporter reporter{color ? benchmark::ConsoleReporter::OO_ColorTabular
                                  : benchmark::ConsoleReporter::OO_Tabular};
    const auto add = [&reporter](std::string_view name, auto fn) {
        const std::string text{name};
        benchmark::RegisterBenchmark(text.c_str(), fn)->UseRealTime();
        reporter.expect(text);
    };
    add(raw_name, [&raw](benchmark::State& state) { bench_raw(state, raw); });
    add("mutex_lock_unlock",
        [&plain](benchmark::State& state) { bench_lock_unlock(state, plain); });
    add("mutex_try_lock_unlock",
        [&tried](benchmark::State& state) { bench_try_lock_unlock(state, tried); });
    add("mutex_fenced_lock_unlock",
        [&fenced](benchmark::State& state) { bench_lock_unlock(state, fenced); });

    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    // Caught here so the server fixture's destructor stops redis-server on every exit path.
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::cerr << "mutex_bench: " << e.what() << '\n';
        return 1;
    }
}
