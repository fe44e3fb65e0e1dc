// A distributed mutex guarding a critical section shared by every process that uses the name.
//
// Usage: mutex_example [redis://127.0.0.1:6379]

#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <mutex>
#include <string>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

int main(int argc, char** argv) {
    const std::string uri = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    try {
        redislock::client client{uri};

        // Blocks until no other process holds "example:orders:42", then releases at scope exit.
        auto orders = client.mutex("example:orders:42", {.lease = 10s});
        {
            std::unique_lock guard{orders};
            std::cout << "holding example:orders:42\n";
        }

        // Fencing: each acquisition gets a larger number; storage that remembers the largest
        // number it has seen can refuse writes from a holder whose lease ran out meanwhile.
        const redislock::lock_options report_options{
            .lease = 5s,
            .fencing = true,
            // Called once if a round trip finds the lock expired or taken by someone else.
            .on_lost = [] { std::cerr << "lost example:report\n"; },
        };
        auto report = client.mutex("example:report", report_options);
        if (std::unique_lock guard{report, 2s}; guard.owns_lock()) {
            const std::int64_t fence = report.fencing_token();
            std::cout << "writing the report with fencing token " << fence << '\n';
            // A long job checks before it commits: the lease may have run out.
            if (!report.verify()) {
                std::cerr << "lock lost before commit; not writing\n";
                return 1;
            }
        } else {
            std::cout << "someone else is writing the report; try again later\n";
        }
        return 0;
    } catch (const redislock::error& e) {
        std::cerr << "redislock: " << e.what() << '\n';
        return 1;
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
