// What every bench/*_bench.cpp shares: the raw hiredis baseline, the lock+unlock loop, the
// reporter that prints one summary line per variant, and run_benchmarks(), which starts the
// private redis-server, applies the default flags and runs what a bench registered. A bench's
// main is then `return redislock::bench::run_benchmarks(argc, argv, register_variants);`, where
// register_variants(suite&) adds its variants (see mutex_bench.cpp).
//
// The baseline, raw_hiredis, is registered by run_benchmarks() itself: one redisContext sends
// SET key token NX PX 30000, then EVALSHA of a plain compare-and-delete script (loaded once), a
// fresh random token per iteration; the floor any simple lock over hiredis can reach.
// Defaults: repetitions in random interleaving (10 of them), so drift of the machine spreads
// over all variants alike; flags given on the command line override them. Paired variants
// (suite::add_paired) go further and time the raw pair and the variant within each iteration.
#pragma once

#include <hiredis/hiredis.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

// The test fixture, from tests/ on the include path.
#include "support/redis_server.hpp"

namespace redislock::bench {

inline constexpr std::string_view raw_name = "raw_hiredis";
inline constexpr std::string_view compare_and_delete =
    "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) end return 0";

// The counter a throughput variant reports; Google Benchmark prints it as items_per_second.
inline constexpr std::string_view rate_counter = "items_per_second";

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

inline raw_baseline connect_raw(int port) {
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

// One raw SET NX PX + compare-and-delete; false if either did not succeed.
inline bool raw_pair(raw_baseline& raw, raw_token& tokens) {
    constexpr std::string_view key = "bench:raw";
    const std::string_view token = tokens.next();
    const reply_ptr set = command(
        raw.ctx.get(), std::array<std::string_view, 6>{"SET", key, token, "NX", "PX", "30000"});
    const reply_ptr del = command(
        raw.ctx.get(), std::array<std::string_view, 5>{"EVALSHA", raw.sha, "1", key, token});
    return set && set->type == REDIS_REPLY_STATUS && del && del->type == REDIS_REPLY_INTEGER &&
           del->integer == 1;
}

inline void bench_raw(benchmark::State& state, raw_baseline& raw) {
    raw_token tokens;
    for (auto _ : state) {
        if (!raw_pair(raw, tokens)) {
            state.SkipWithError("raw SET NX / compare-and-delete did not succeed");
            break;
        }
    }
}

// The counter a paired variant reports: raw time / variant time over the run.
inline constexpr std::string_view paired_counter = "paired_ratio";

// Each iteration runs one `baseline()` and one `op()` back to back, alternating which goes
// first, and times each: both see the same moment of the machine, so its drift (which moves
// separate runs by more than the difference measured) cancels out. The run's time is that of
// both; paired_counter is baseline time / op time. Each returns false when it did not succeed.
template <class Baseline, class Op>
void paired(benchmark::State& state, Baseline&& baseline, Op&& op) {
    using clock = std::chrono::steady_clock;
    clock::duration baseline_time{};
    clock::duration op_time{};
    bool baseline_first = false;
    for (auto _ : state) {
        baseline_first = !baseline_first;
        const auto t0 = clock::now();
        const bool first_ok = baseline_first ? baseline() : op();
        const auto t1 = clock::now();
        const bool second_ok = baseline_first ? op() : baseline();
        const auto t2 = clock::now();
        if (!first_ok || !second_ok) {
            state.SkipWithError("a paired baseline or variant operation did not succeed");
            break;
        }
        baseline_time += baseline_first ? t1 - t0 : t2 - t1;
        op_time += baseline_first ? t2 - t1 : t1 - t0;
    }
    if (op_time.count() > 0) {
        state.counters[std::string{paired_counter}] =
            static_cast<double>(baseline_time.count()) / static_cast<double>(op_time.count());
    }
}

// paired() against one raw pair (raw_pair()).
template <class Op>
void paired_with_raw(benchmark::State& state, raw_baseline& raw, Op&& op) {
    raw_token tokens;
    paired(
        state, [&] { return raw_pair(raw, tokens); }, op);
}

// SCRIPT LOAD of one of the library's scripts on the raw connection, for a baseline that sends
// the library's own script calls by hand.
inline std::string load_script(raw_baseline& raw, const redislock::script& s) {
    const reply_ptr loaded =
        command(raw.ctx.get(), std::array<std::string_view, 3>{"SCRIPT", "LOAD", s.source});
    if (!loaded || loaded->type != REDIS_REPLY_STRING) {
        throw std::runtime_error{"SCRIPT LOAD of " + std::string{s.name} + " failed"};
    }
    return std::string{loaded->str, loaded->len};
}

// The keys and arguments the library sends for a lock named `name` with default options, taken
// by a thread of a fresh owner, for baselines that send its scripts by hand.
struct library_arguments {
    explicit library_arguments(std::string_view lock_name)
        : name{lock_name},
          fence{redislock::detail::derived_key(name, "fence")},
          channel{redislock::detail::derived_key(name, "released")},
          queue{redislock::detail::derived_key(name, "queue")},
          lapses{redislock::detail::derived_key(name, "waiting")},
          permits{redislock::detail::derived_key(name, "permits")},
          lease{std::to_string(redislock::lock_options{}.lease.count())},
          grace{std::to_string(
              redislock::detail::handoff_grace(redislock::lock_options{}.lease).count())},
          owner{redislock::detail::owner_id(redislock::detail::token::random().str(), "")} {}

    std::string name, fence, channel, queue, lapses, permits, lease, grace, owner;
};

// One uncontended acquisition and its release of a lock kind with entry scripts, sent by hand
// over the raw connection with the library's own scripts: `acquire_argv(sha, lock, id)` and
// `release_argv(sha, lock, id)` return the EVALSHA arguments the library sends for acquisition
// `id` of `lock` (a library_arguments). A baseline for add_paired_against().
template <class AcquireArgv, class ReleaseArgv>
class own_scripts {
public:
    own_scripts(raw_baseline& raw, const redislock::script& acquire,
                const redislock::script& release, std::string_view lock_name,
                AcquireArgv acquire_argv, ReleaseArgv release_argv)
        : raw_{&raw},
          acquire_{load_script(raw, acquire)},
          release_{load_script(raw, release)},
          lock_{lock_name},
          acquire_argv_{std::move(acquire_argv)},
          release_argv_{std::move(release_argv)} {}

    // True when the script entered (`{1, fence, id}`) and the release freed the lock (1).
    bool operator()() {
        const std::string id{tokens_.next()};
        const reply_ptr in = command(raw_->ctx.get(), acquire_argv_(acquire_, lock_, id));
        const reply_ptr out = command(raw_->ctx.get(), release_argv_(release_, lock_, id));
        return in && in->type == REDIS_REPLY_ARRAY && in->elements == 3 &&
               in->element[0]->type == REDIS_REPLY_INTEGER && in->element[0]->integer == 1 && out &&
               out->type == REDIS_REPLY_INTEGER && out->integer == 1;
    }

private:
    raw_baseline* raw_;
    std::string acquire_;
    std::string release_;
    library_arguments lock_;
    AcquireArgv acquire_argv_;
    ReleaseArgv release_argv_;
    raw_token tokens_;
};

// One lock() + unlock() of any of the library's locks; false if the release failed.
template <class Lock>
bool lock_unlock_once(Lock& lock) {
    std::error_code ec;
    lock.lock();
    lock.unlock(ec);
    return !ec;
}

// One lock_shared() + unlock_shared(); false if the release failed.
template <class Lock>
bool lock_unlock_shared_once(Lock& lock) {
    std::error_code ec;
    lock.lock_shared();
    lock.unlock_shared(ec);
    return !ec;
}

// lock() + unlock() per iteration, for any of the library's locks.
template <class Lock>
void lock_unlock(benchmark::State& state, Lock& lock) {
    std::error_code ec;
    for (auto _ : state) {
        lock.lock();
        lock.unlock(ec);
        if (ec) {
            state.SkipWithError(("unlock failed: " + ec.message()).c_str());
            break;
        }
    }
}

// Reports this thread's iterations as rate_counter. Google Benchmark sums counters over the
// threads of a run and, with real time (which suite sets for every variant), divides a rate by
// the run's wall time: pairs per second of all threads together.
inline void count_rate(benchmark::State& state) {
    state.counters[std::string{rate_counter}] =
        benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

// Prints Google Benchmark's table as usual, then one line per expected variant, in the order
// they were expected: `ratio <name>: <raw median / variant median>` for a ratio variant,
// `<label> <median of rate_counter>` for a throughput one, `paired ratio <name>: <median of
// paired_counter>` for a paired one.
class ratio_reporter : public benchmark::ConsoleReporter {
public:
    using benchmark::ConsoleReporter::ConsoleReporter;

    void ReportRuns(const std::vector<Run>& reports) override {
        for (const Run& run : reports) {
            const std::string& name = run.run_name.function_name;
            if (run.error_occurred) {
                continue;
            }
            const auto rate = run.counters.find(std::string{rate_counter});
            const auto paired = run.counters.find(std::string{paired_counter});
            if (run.run_type == Run::RT_Aggregate && run.aggregate_name == "median") {
                times_[name].median = run.GetAdjustedRealTime();
                if (rate != run.counters.end()) {
                    rates_[name].median = rate->second.value;
                }
                if (paired != run.counters.end()) {
                    paired_[name].median = paired->second.value;
                }
            } else if (run.run_type == Run::RT_Iteration) {
                times_[name].samples.push_back(run.GetAdjustedRealTime());
                if (rate != run.counters.end()) {
                    rates_[name].samples.push_back(rate->second.value);
                }
                if (paired != run.counters.end()) {
                    paired_[name].samples.push_back(paired->second.value);
                }
            }
        }
        ConsoleReporter::ReportRuns(reports);
    }

    void Finalize() override {
        ConsoleReporter::Finalize();
        if (times_.empty()) {
            return;  // nothing ran, e.g. --benchmark_list_tests
        }
        std::ostream& out = GetOutputStream();
        const double raw = median_of(times_, std::string{raw_name});
        for (const expected& e : expected_) {
            if (e.name == raw_name) {
                continue;
            }
            char line[160];
            if (e.paired) {
                const double ratio = median_of(paired_, e.name);
                if (ratio > 0) {
                    std::snprintf(line, sizeof line, "paired ratio %s: %.3f", e.name.c_str(),
                                  ratio);
                } else {
                    std::snprintf(line, sizeof line, "paired ratio %s: n/a (no successful run)",
                                  e.name.c_str());
                }
            } else if (!e.label.empty()) {
                const double rate = median_of(rates_, e.name);
                if (rate > 0) {
                    std::snprintf(line, sizeof line, "%s %.0f", e.label.c_str(), rate);
                } else {
                    std::snprintf(line, sizeof line, "%s n/a (no successful run)", e.label.c_str());
                }
            } else {
                const double variant = median_of(times_, e.name);
                if (raw > 0 && variant > 0) {
                    std::snprintf(line, sizeof line, "ratio %s: %.2f", e.name.c_str(),
                                  raw / variant);
                } else {
                    std::snprintf(line, sizeof line, "ratio %s: n/a (no successful run)",
                                  e.name.c_str());
                }
            }
            out << line << '\n';
        }
        out.flush();
    }

    void expect(std::string name) { expected_.push_back({std::move(name), {}, false}); }
    void expect_rate(std::string name, std::string label) {
        expected_.push_back({std::move(name), std::move(label), false});
    }
    void expect_paired(std::string name) { expected_.push_back({std::move(name), {}, true}); }

private:
    struct expected {
        std::string name;
        std::string label;  // empty: a ratio line
        bool paired;        // a `paired ratio` line, from paired_with_raw()
    };

    struct metric {
        std::optional<double> median;
        std::vector<double> samples;
    };

    // Google Benchmark computes no aggregates for a single repetition: fall back to the runs.
    static double median_of(const std::map<std::string, metric>& metrics, const std::string& name) {
        const auto it = metrics.find(name);
        if (it == metrics.end()) {
            return 0;
        }
        if (it->second.median) {
            return *it->second.median;
        }
        std::vector<double> values = it->second.samples;
        if (values.empty()) {
            return 0;
        }
        std::sort(values.begin(), values.end());
        const std::size_t mid = values.size() / 2;
        return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
    }

    std::vector<expected> expected_;
    std::map<std::string, metric> times_;
    std::map<std::string, metric> rates_;
    std::map<std::string, metric> paired_;
};

// What a bench's register function gets: a client on the private server, and a way to add
// variants next to the raw baseline, which is already registered. Every variant uses real time.
// Registered functions (and whatever locks they captured) live until the runs are over.
class suite {
public:
    suite(redislock::client& client, ratio_reporter& reporter, raw_baseline& raw)
        : client_{client}, reporter_{reporter}, raw_{raw} {}

    redislock::client& client() noexcept { return client_; }

    // A variant compared with raw_hiredis: one `ratio <name>: ...` line.
    template <class Fn>
    benchmark::internal::Benchmark* add(std::string_view name, Fn&& fn) {
        const std::string text{name};
        reporter_.expect(text);
        return benchmark::RegisterBenchmark(text.c_str(), std::forward<Fn>(fn))->UseRealTime();
    }

    // A throughput variant, which calls count_rate(): one `<label> <value>` line instead, as the
    // per-operation time of several threads is not comparable with one thread's round trips.
    template <class Fn>
    benchmark::internal::Benchmark* add_rate(std::string_view name, std::string_view label,
                                             Fn&& fn) {
        const std::string text{name};
        reporter_.expect_rate(text, std::string{label});
        return benchmark::RegisterBenchmark(text.c_str(), std::forward<Fn>(fn))->UseRealTime();
    }

    // A variant timed against raw_hiredis within each iteration (paired_with_raw()): one
    // `paired ratio <name>: ...` line. `op` does one operation and returns false if it failed.
    template <class Op>
    benchmark::internal::Benchmark* add_paired(std::string_view name, Op op) {
        return add_paired_against(name, nullptr, std::move(op));
    }

    // The same against another baseline, `baseline()`, with the same contract as `op`; nullptr
    // stands for raw_hiredis.
    template <class Baseline, class Op>
    benchmark::internal::Benchmark* add_paired_against(std::string_view name, Baseline baseline,
                                                       Op op) {
        const std::string text{name};
        reporter_.expect_paired(text);
        return benchmark::RegisterBenchmark(text.c_str(),
                                            [this, baseline = std::move(baseline),
                                             op = std::move(op)](benchmark::State& state) mutable {
                                                if constexpr (std::is_null_pointer_v<Baseline>) {
                                                    paired_with_raw(state, raw_, op);
                                                } else {
                                                    paired(state, baseline, op);
                                                }
                                            })
            ->UseRealTime();
    }

    // The raw baseline's connection, for baselines that send other commands by hand.
    raw_baseline& raw() noexcept { return raw_; }

private:
    redislock::client& client_;
    ratio_reporter& reporter_;
    raw_baseline& raw_;
};

namespace detail {

inline bool has_flag(const std::vector<char*>& args, std::string_view flag) {
    return std::any_of(args.begin() + 1, args.end(),
                       [flag](const char* arg) { return std::string_view{arg}.starts_with(flag); });
}

// Registered functions own the locks they captured: they go before the client and the server.
struct clear_registered {
    clear_registered() = default;
    clear_registered(const clear_registered&) = delete;
    clear_registered& operator=(const clear_registered&) = delete;
    ~clear_registered() { benchmark::ClearRegisteredBenchmarks(); }
};

template <class Register>
int run(int argc, char** argv, Register& register_fn) {
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

    const bool color = ::isatty(STDOUT_FILENO) == 1;
    ratio_reporter reporter{color ? benchmark::ConsoleReporter::OO_ColorTabular
                                  : benchmark::ConsoleReporter::OO_Tabular};
    const clear_registered clear;
    reporter.expect(std::string{raw_name});
    benchmark::RegisterBenchmark(std::string{raw_name}.c_str(), [&raw](benchmark::State& state) {
        bench_raw(state, raw);
    })->UseRealTime();
    suite s{client, reporter, raw};
    register_fn(s);

    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
    return 0;
}

}  // namespace detail

// Parses the flags (with the defaults above), starts a private redis-server on 127.0.0.1,
// registers raw_hiredis, lets register_fn(suite&) add the bench's variants, runs them all and
// prints the summary lines. Returns main's exit status; errors are printed, not thrown.
template <class Register>
int run_benchmarks(int argc, char** argv, Register register_fn) {
    const std::string program =
        argc > 0 ? std::filesystem::path{argv[0]}.filename().string() : "bench";
    // Caught here so the server fixture's destructor stops redis-server on every exit path.
    try {
        return detail::run(argc, argv, register_fn);
    } catch (const std::exception& e) {
        std::cerr << program << ": " << e.what() << '\n';
        return 1;
    }
}

}  // namespace redislock::bench
