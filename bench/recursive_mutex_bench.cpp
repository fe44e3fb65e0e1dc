// What one lock+unlock of redislock::recursive_mutex costs, from depth 0 and as a re-entry, next
// to the two round trips of a simple lock sent by hand.
//
// Every variant runs in one process against one private redis-server on TCP loopback, started
// here and stopped at exit, each over one persistent connection:
//   raw_hiredis                           one redisContext: SET key token NX PX 30000, then
//                                         EVALSHA of a plain compare-and-delete script, as in
//                                         mutex_bench; the floor any lock over hiredis can reach
//   recursive_mutex_outermost_lock_unlock lock() + unlock() from depth 0: the acquire script
//                                         creates the hash, the release script deletes it and
//                                         checks the waiting queue (it publishes only when
//                                         someone waits, which no one does here)
//   recursive_mutex_reentry_lock_unlock   the lock is held once by this thread before the loop
//                                         (and left after it); each iteration lock() + unlock()
//                                         at depth 1: a re-entry and its leave, each a script
//                                         that changes the owner's count and sets the lease again
//   recursive_mutex_outermost_paired      outermost lock() + unlock() and one raw pair in turn
//                                         within each iteration (see paired_with_raw)
//   recursive_mutex_vs_own_scripts_paired outermost lock() + unlock() and, by hand over the raw
//                                         connection, the two EVALSHAs the library sends for
//                                         them (same scripts, keys and arguments) in turn
//
// A re-entry is counted in Redis, not locally, so it costs the same two round trips as the raw
// pair; the ratios show what the scripts and the library add on top of them. The last variant
// leaves the scripts out: its ratio is what the library's client side adds.
// Repetitions run in random interleaving (10 by default), so drift of the machine spreads over
// all variants alike. After Google Benchmark's table, one line per variant:
//   ratio <name>: <median real time of raw_hiredis / median real time of the variant>
// 1.00 is as fast as raw hiredis, 0.95 is 5% slower, above 1 faster.
//
// Usage: recursive_mutex_bench [--benchmark_* flags]; flags given override the defaults above.

#include <benchmark/benchmark.h>

#include <array>
#include <string>
#include <string_view>
#include <system_error>

#include <redislock/redislock.hpp>

#include "support/bench_support.hpp"

namespace {

void bench_reentry(benchmark::State& state, redislock::recursive_mutex& m) {
    // The outer entry: taken before the timed loop, so every iteration starts at depth 1.
    m.lock();
    redislock::bench::lock_unlock(state, m);
    std::error_code ec;
    m.unlock(ec);
    if (ec) {
        state.SkipWithError(("unlock of the outer entry failed: " + ec.message()).c_str());
    }
}

// An outermost acquisition and its release sent by hand: the library's recursive_acquire and
// recursive_release with the arguments it sends for an uncontended lock() + unlock().
auto own_scripts(redislock::bench::raw_baseline& raw) {
    namespace scripts = redislock::detail::scripts;
    using lock = redislock::bench::library_arguments;
    return redislock::bench::own_scripts{
        raw,
        scripts::recursive_acquire,
        scripts::recursive_release,
        "bench:recursive_raw_scripts",
        [](std::string_view sha, const lock& a, std::string_view id) {
            return std::array<std::string_view, 16>{
                "EVALSHA", sha, "3", a.name, a.queue, a.lapses, a.owner,   a.lease,
                "0",       id,  "1", "",     "w",     "0",      a.channel, a.grace};
        },
        [](std::string_view sha, const lock& a, std::string_view id) {
            return std::array<std::string_view, 12>{"EVALSHA", sha,       "3",     a.name,
                                                    a.queue,   a.lapses,  a.owner, "1",
                                                    a.lease,   a.channel, id,      a.grace};
        }};
}

void register_variants(redislock::bench::suite& suite) {
    redislock::client& client = suite.client();
    suite.add("recursive_mutex_outermost_lock_unlock",
              [m = client.recursive_mutex("bench:recursive_outermost")](
                  benchmark::State& state) mutable { redislock::bench::lock_unlock(state, m); });
    suite.add("recursive_mutex_reentry_lock_unlock",
              [m = client.recursive_mutex("bench:recursive_reentry")](
                  benchmark::State& state) mutable { bench_reentry(state, m); });
    suite.add_paired("recursive_mutex_outermost_paired",
                     [m = client.recursive_mutex("bench:recursive_paired")]() mutable {
                         return redislock::bench::lock_unlock_once(m);
                     });
    suite.add_paired_against("recursive_mutex_vs_own_scripts_paired", own_scripts(suite.raw()),
                             [m = client.recursive_mutex("bench:recursive_vs_scripts")]() mutable {
                                 return redislock::bench::lock_unlock_once(m);
                             });
}

}  // namespace

int main(int argc, char** argv) {
    return redislock::bench::run_benchmarks(argc, argv, register_variants);
}
