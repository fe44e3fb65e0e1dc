// What one lock+unlock of redislock::mutex costs next to the same two round trips sent by hand.
//
// Every variant runs in one process against one private redis-server on TCP loopback, started
// here and stopped at exit, each over one persistent connection:
//   raw_hiredis               one redisContext: SET key token NX PX 30000, then EVALSHA of a plain
//                             compare-and-delete script (loaded once), a fresh random token per
//                             iteration; the floor any simple lock over hiredis can reach
//   mutex_lock_unlock         redislock::mutex lock() + unlock() through redislock::client; its
//                             release script also checks the waiting queue (one EXISTS), and
//                             publishes only when someone waits, which no one does here
//   mutex_try_lock_unlock     try_lock() + unlock()
//   mutex_fenced_lock_unlock  lock() + unlock() with lock_options::fencing (a script, not a SET)
//
// Repetitions run in random interleaving (10 by default), so drift of the machine spreads over
// all variants alike. After Google Benchmark's table, one line per variant:
//   ratio <name>: <median real time of raw_hiredis / median real time of the variant>
// 1.00 is as fast as raw hiredis, 0.95 is 5% slower, above 1 faster.
//
// Usage: mutex_bench [--benchmark_* flags]; flags given override the defaults above.

#include <benchmark/benchmark.h>

#include <string>
#include <system_error>

#include <redislock/redislock.hpp>

#include "support/bench_support.hpp"

namespace {

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

void register_variants(redislock::bench::suite& suite) {
    redislock::client& client = suite.client();
    suite.add("mutex_lock_unlock",
              [m = client.mutex("bench:lock")](benchmark::State& state) mutable {
                  redislock::bench::lock_unlock(state, m);
              });
    suite.add("mutex_try_lock_unlock",
              [m = client.mutex("bench:try_lock")](benchmark::State& state) mutable {
                  bench_try_lock_unlock(state, m);
              });
    suite.add("mutex_fenced_lock_unlock",
              [m = client.mutex("bench:fenced", {.fencing = true})](
                  benchmark::State& state) mutable { redislock::bench::lock_unlock(state, m); });
    suite.add_paired("mutex_lock_unlock_paired", [m = client.mutex("bench:paired")]() mutable {
        return redislock::bench::lock_unlock_once(m);
    });
}

}  // namespace

int main(int argc, char** argv) {
    return redislock::bench::run_benchmarks(argc, argv, register_variants);
}
