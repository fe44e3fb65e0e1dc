// A reentrant distributed lock: code that already holds it may take it again, here through a
// nested call, and a task that hops threads locks with an explicit owner id.
//
// Usage: recursive_mutex_example [redis://127.0.0.1:6379]

#include <chrono>
#include <exception>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

namespace {

// Called both on its own and from rebalance(): takes the lock either way.
void move_stock(redislock::client& client, int units) {
    auto inventory = client.recursive_mutex("example:inventory", {.lease = 10s});
    std::lock_guard guard{inventory};  // a re-entry when rebalance() already holds it
    std::cout << "moving " << units << " units (depth through this object: " << inventory.depth()
              << ")\n";
}

void rebalance(redislock::client& client) {
    auto inventory = client.recursive_mutex("example:inventory", {.lease = 10s});
    std::lock_guard guard{inventory};
    move_stock(client, 3);
    move_stock(client, 5);
}

}  // namespace

int main(int argc, char** argv) {
    const std::string uri = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    try {
        redislock::client client{uri};
        rebalance(client);

        // A job that starts on one thread and finishes on another names its owner itself.
        auto job_lock =
            client.recursive_mutex("example:job", {.lease = 10s, .owner = "job-2026-11-22"});
        job_lock.lock();
        std::thread finisher{[&job_lock] { job_lock.unlock(); }};
        finisher.join();
        std::cout << "job lock released from another thread: " << !job_lock.owned() << '\n';
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
