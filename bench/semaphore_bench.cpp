// What one acquire+release of redislock::counting_semaphore costs, next to the same two scripts
// sent by hand.
//
// Every variant runs in one process against one private redis-server on TCP loopback, started
// here and stopped at exit, each over one persistent connection:
//   raw_hiredis                       one redisContext: SET key token NX PX 30000, then EVALSHA
//                                     of a plain compare-and-delete script, as in mutex_bench;
//                                     the floor any lock over hiredis can reach
//   semaphore_acquire_release         acquire() + release() of a semaphore of 2 permits
//   semaphore_paired                  acquire() + release() and one raw pair in turn within
//                                     each iteration (see paired_with_raw)
//   semaphore_vs_own_scripts_paired   acquire() + release() and, by hand over the raw
//                                     connection, the two EVALSHAs the library sends for them
//                                     (lua/semaphore_acquire.lua and semaphore_release.lua, same
//                                     keys and arguments) in turn: its ratio is what the
//                                     library's client side adds to the scripts
//
// Repetitions run in random interleaving (10 by default), so drift of the machine spreads over
// all variants alike. After Google Benchmark's table, one line per variant:
//   ratio <name>: <median real time of the baseline / median real time of the variant>
// 1.00 is as fast as the baseline, 0.95 is 5% slower, above 1 faster.
//
// Usage: semaphore_bench [--benchmark_* flags]; flags given override the defaults above.

#include <benchmark/benchmark.h>

#include <array>
#include <string_view>

#include <redislock/redislock.hpp>

#include "support/bench_support.hpp"

namespace {

redislock::semaphore_options bench_options() {
    return {.permits = 2};
}

// An uncontended acquisition and its release sent by hand: the library's semaphore_acquire and
// semaphore_release with the arguments it sends for acquire() + release() when no one waits.
auto own_scripts(redislock::bench::raw_baseline& raw) {
    namespace scripts = redislock::detail::scripts;
    using lock = redislock::bench::library_arguments;
    return redislock::bench::own_scripts{
        raw,
        scripts::semaphore_acquire,
        scripts::semaphore_release,
        "bench:semaphore_raw_scripts",
        [](std::string_view sha, const lock& a, std::string_view id) {
            return std::array<std::string_view, 15>{
                "EVALSHA", sha, "4", a.name, a.queue,   a.lapses, a.permits, id,
                a.lease,   "0", "w", "0",    a.channel, a.grace,  "2"};
        },
        [](std::string_view sha, const lock& a, std::string_view id) {
            return std::array<std::string_view, 10>{"EVALSHA", sha,       "4", a.name,    a.queue,
                                                    a.lapses,  a.permits, id,  a.channel, a.grace};
        }};
}

void register_variants(redislock::bench::suite& suite) {
    redislock::client& client = suite.client();
    suite.add("semaphore_acquire_release",
              [s = client.semaphore("bench:semaphore", bench_options())](
                  benchmark::State& state) mutable { redislock::bench::lock_unlock(state, s); });
    suite.add_paired("semaphore_paired",
                     [s = client.semaphore("bench:semaphore_paired", bench_options())]() mutable {
                         return redislock::bench::lock_unlock_once(s);
                     });
    suite.add_paired_against(
        "semaphore_vs_own_scripts_paired", own_scripts(suite.raw()),
        [s = client.semaphore("bench:semaphore_vs_scripts", bench_options())]() mutable {
            return redislock::bench::lock_unlock_once(s);
        });
}

}  // namespace

int main(int argc, char** argv) {
    return redislock::bench::run_benchmarks(argc, argv, register_variants);
}
