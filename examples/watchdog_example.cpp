// The watchdog renews a short lease while slow work runs, so a crashed holder frees the lock
// quickly while a live one keeps it; on_lost says when the lock could not be kept.
//
// Usage: watchdog_example [redis://127.0.0.1:6379]

#include <atomic>
#include <chrono>
#include <exception>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

int main(int argc, char** argv) {
    const std::string uri = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    try {
        redislock::client client{uri};
        std::atomic<bool> lost{false};
        auto job =
            client.mutex("example:nightly-job", {.lease = 2s,
                                                 .watchdog = true,
                                                 // Runs on the watchdog thread: keep it short.
                                                 .on_lost = [&lost] { lost = true; },
                                                 .max_hold = 1min});
        std::unique_lock guard{job};
        for (int step = 1; step <= 3 && !lost; ++step) {
            std::this_thread::sleep_for(1500ms);  // longer than the lease, in total
            std::cout << "step " << step << " done, lease left " << job.remaining().count()
                      << " ms\n";
        }
        if (lost) {
            std::cerr << "lock lost mid-job: stopping without committing\n";
            return 1;
        }
        std::cout << "job finished under the lock; renewals sent: "
                  << client.watchdog().stats().renewals << '\n';
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
