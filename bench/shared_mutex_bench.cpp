// What redislock::shared_mutex costs on each side, uncontended, next to the two round trips of a
// simple lock sent by hand; and how many read lock+unlock pairs 4 concurrent readers complete.
//
// Every variant runs in one process against one private redis-server on TCP loopback, started
// here and stopped at exit:
//   raw_hiredis                     one redisContext: SET key token NX PX 30000, then EVALSHA of
//                                   a plain compare-and-delete script, as in mutex_bench; the
//                                   floor any lock over hiredis can reach
//   shared_mutex_read_lock_unlock   lock_shared() + unlock_shared(), no other holder
//   shared_mutex_write_lock_unlock  lock() + unlock(), no other holder
//   shared_mutex_4_readers          4 threads, each its own owner (the library's default: the
//                                   calling thread), share one shared_mutex object and so one
//                                   client, whose connection pool gives each thread its own
//                                   connection; each thread loops lock_shared() + unlock_shared()
//                                   while the others hold the lock too
//   shared_mutex_{read,write}_paired  the read / write lock + unlock and one raw pair in turn
//                                   within each iteration (see paired_with_raw)
//   shared_mutex_{read,write}_vs_own_scripts_paired
//                                   the same lock + unlock and, by hand over the raw connection,
//                                   the two EVALSHAs the library sends for it (same scripts, keys
//                                   and arguments) in turn: what the library's client side adds
// The single-thread variants each run over one persistent connection.
//
// Repetitions run in random interleaving (10 by default), so drift of the machine spreads over
// all variants alike. After Google Benchmark's table, one line per variant:
//   ratio <name>: <median real time of raw_hiredis / median real time of the variant>
//     1.00 is as fast as raw hiredis, 0.95 is 5% slower, above 1 faster
//   readers/s <median of shared_mutex_4_readers' items_per_second>
//     read lock+unlock pairs per second of wall time, summed over the 4 readers; one reader
//     alone manages about 1e9 / (the read variant's ns), so the quotient is what concurrency
//     gains on this machine. No ratio for it: its Time column is wall time over the pairs of all
//     threads, not what one pair costs a caller.
//
// Usage: shared_mutex_bench [--benchmark_* flags]; flags given override the defaults above.

#include <benchmark/benchmark.h>

#include <array>
#include <string>
#include <string_view>
#include <system_error>

#include <redislock/redislock.hpp>

#include "support/bench_support.hpp"

namespace {

constexpr int readers = 4;

void bench_read_lock_unlock(benchmark::State& state, redislock::shared_mutex& m) {
    std::error_code ec;
    for (auto _ : state) {
        m.lock_shared();
        m.unlock_shared(ec);
        if (ec) {
            state.SkipWithError(("unlock_shared failed: " + ec.message()).c_str());
            break;
        }
    }
}

// Runs on each reader thread at once, all on the same object; everything per thread (the owner,
// which is the thread itself, and the error code) is set up here, outside the timed loop.
void bench_readers(benchmark::State& state, redislock::shared_mutex& m) {
    bench_read_lock_unlock(state, m);
    redislock::bench::count_rate(state);
}

// A read or write acquisition and its release sent by hand: the library's shared_acquire and
// shared_release with the arguments it sends for an uncontended lock_shared() + unlock_shared()
// ("r") or lock() + unlock() ("w").
auto own_scripts(redislock::bench::raw_baseline& raw, std::string_view mode) {
    namespace scripts = redislock::detail::scripts;
    using lock = redislock::bench::library_arguments;
    return redislock::bench::own_scripts{
        raw,
        scripts::shared_acquire,
        scripts::shared_release,
        "bench:shared_raw_scripts_" + std::string{mode},
        [mode](std::string_view sha, const lock& a, std::string_view id) {
            return std::array<std::string_view, 17>{
                "EVALSHA", sha,  "3", a.name, a.queue, a.lapses, a.owner,   mode,   a.lease,
                "0",       mode, id,  "1",    "",      "0",      a.channel, a.grace};
        },
        [mode](std::string_view sha, const lock& a, std::string_view id) {
            return std::array<std::string_view, 12>{"EVALSHA", sha,       "3",     a.name,
                                                    a.queue,   a.lapses,  a.owner, mode,
                                                    "1",       a.channel, id,      a.grace};
        }};
}

void register_variants(redislock::bench::suite& suite) {
    redislock::client& client = suite.client();
    suite.add("shared_mutex_read_lock_unlock",
              [m = client.shared_mutex("bench:shared_read")](benchmark::State& state) mutable {
                  bench_read_lock_unlock(state, m);
              });
    suite.add("shared_mutex_write_lock_unlock",
              [m = client.shared_mutex("bench:shared_write")](benchmark::State& state) mutable {
                  redislock::bench::lock_unlock(state, m);
              });
    suite.add_paired("shared_mutex_read_paired",
                     [m = client.shared_mutex("bench:shared_paired_read")]() mutable {
                         return redislock::bench::lock_unlock_shared_once(m);
                     });
    suite.add_paired("shared_mutex_write_paired",
                     [m = client.shared_mutex("bench:shared_paired_write")]() mutable {
                         return redislock::bench::lock_unlock_once(m);
                     });
    suite.add_paired_against("shared_mutex_read_vs_own_scripts_paired",
                             own_scripts(suite.raw(), "r"),
                             [m = client.shared_mutex("bench:shared_vs_scripts_read")]() mutable {
                                 return redislock::bench::lock_unlock_shared_once(m);
                             });
    suite.add_paired_against("shared_mutex_write_vs_own_scripts_paired",
                             own_scripts(suite.raw(), "w"),
                             [m = client.shared_mutex("bench:shared_vs_scripts_write")]() mutable {
                                 return redislock::bench::lock_unlock_once(m);
                             });
    // Created once, before any run: Google Benchmark calls this one function object from all
    // reader threads.
    suite
        .add_rate("shared_mutex_4_readers", "readers/s",
                  [m = client.shared_mutex("bench:shared_readers")](
                      benchmark::State& state) mutable { bench_readers(state, m); })
        ->Threads(readers);
}

}  // namespace

int main(int argc, char** argv) {
    return redislock::bench::run_benchmarks(argc, argv, register_variants);
}
