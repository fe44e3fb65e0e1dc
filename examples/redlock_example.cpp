// A lock held on a majority of independent Redis masters (Redlock): it survives any minority of
// them being down or hung.
//
// Usage: redlock_example [redis://host:port ...]   (default: five masters on 127.0.0.1:7001-7005)

#include <chrono>
#include <exception>
#include <iostream>
#include <mutex>
#include <stop_token>
#include <string>
#include <vector>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

int main(int argc, char** argv) {
    std::vector<std::string> masters{argv + 1, argv + argc};
    if (masters.empty()) {
        masters = {"redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003",
                   "redis://127.0.0.1:7004", "redis://127.0.0.1:7005"};
    }
    try {
        // Each master gets at most 50 ms per call: a hung one costs that, never the lease.
        redislock::redlock_client rl{masters, {.node_timeout = 50ms}};

        // The watchdog renews the lease on the masters while the job runs; a renewal only counts
        // when a majority confirms it.
        auto job = rl.mutex("example:nightly-job", {.lease = 10s, .watchdog = true});
        if (std::unique_lock guard{job, 2s}; guard.owns_lock()) {
            // Requested as soon as the lock is known lost, or when its validity runs out before
            // a majority confirmed a renewal: stop touching the shared resource then.
            const std::stop_token lost = job.lost_token();
            for (int step = 0; step < 3 && !lost.stop_requested(); ++step) {
                std::cout << "step " << step << ", lock valid for another "
                          << job.remaining().count() << " ms\n";
            }
        } else {
            std::cout << "another process runs the job; try again later\n";
        }
        return 0;
    } catch (const redislock::quorum_error& e) {
        // Too many masters down or hung to ever form a majority: an outage, not contention.
        std::cerr << e.what() << '\n';
        return 2;
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
