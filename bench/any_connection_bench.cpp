// What the run-time topology of redislock::client costs: one lock+unlock of redislock::mutex
// (over any_connection) next to the same lock of redislock::node_mutex (over hiredis_connection
// itself), against one private redis-server on TCP loopback, each client with its own
// connection pool to it:
//   node_mutex_lock_unlock        lock() + unlock() through node_client
//   any_mutex_lock_unlock         lock() + unlock() through client (any_connection)
//   any_vs_node_paired            both in each iteration, alternating which goes first, so they
//                                 see the same moment of the machine; its line is
//                                   paired ratio any_vs_node_paired: <node time / any time>
//                                 1.00 means the erasure costs nothing measurable, 0.98 that
//                                 lock+unlock through it takes 2% longer
//
// Repetitions run in random interleaving (10 by default); the summary lines give each median
// (the unpaired variants as ratios to raw_hiredis, see bench_support.hpp).
//
// Usage: any_connection_bench [--benchmark_* flags]; flags given override the defaults above.

#include <benchmark/benchmark.h>

#include <stdexcept>

#include <redislock/redislock.hpp>

#include "support/bench_support.hpp"

namespace {

void register_variants(redislock::bench::suite& suite) {
    redislock::client& any = suite.client();
    const auto* node = any.connection().get<redislock::hiredis_connection>();
    if (node == nullptr) {
        throw std::logic_error{"the bench's client does not hold a hiredis_connection"};
    }
    // Owned by the registered functions, which live until the runs are over.
    auto typed = std::make_shared<redislock::node_client>(node->config());
    suite.add("node_mutex_lock_unlock",
              [typed, m = typed->mutex("bench:node")](benchmark::State& state) mutable {
                  redislock::bench::lock_unlock(state, m);
              });
    suite.add("any_mutex_lock_unlock",
              [m = any.mutex("bench:any")](benchmark::State& state) mutable {
                  redislock::bench::lock_unlock(state, m);
              });
    suite.add_paired_against(
        "any_vs_node_paired",
        [typed, m = typed->mutex("bench:paired:node")]() mutable {
            return redislock::bench::lock_unlock_once(m);
        },
        [m = any.mutex("bench:paired:any")]() mutable {
            return redislock::bench::lock_unlock_once(m);
        });
}

}  // namespace

int main(int argc, char** argv) {
    return redislock::bench::run_benchmarks(argc, argv, register_variants);
}
