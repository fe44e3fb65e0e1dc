// The watchdog renews a short lease while slow work runs, so a crashed holder frees the lock
// quickly while a live one keeps it; on_lost says when the lock could not be kept.
//
// Usage: watchdog_example [redis://127.0.0.1:6379]

#include <algorithm>
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
        // The watchdog needs a lease of at least 6 command timeouts (docs/configuration.md,
        // "Rules of thumb"), so a renewal that stalls can be retried twice before the lease runs
        // out: for the 2 s lease below, commands give up after 300 ms (the default, 2 s, would
        // need a lease of 12 s).
        redislock::endpoint server = redislock::endpoint::from_uri(uri);
        server.command_timeout = std::min<std::chrono::milliseconds>(server.command_timeout, 300ms);
        server.connect_timeout = std::min(server.connect_timeout, server.command_timeout);
        redislock::client client{server};
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
