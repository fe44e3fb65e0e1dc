// Locks on a Redis Cluster: the same lock kinds, options and guards as on one server, through
// redislock::cluster_client. Each lock lives on the master of its name's hash slot; the client
// follows resharding (MOVED, ASK) and failovers on its own.
//
// Usage: cluster_example [redis://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002]

#include <chrono>
#include <exception>
#include <iostream>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

int main(int argc, char** argv) {
    // Seeds: any one node that answers is enough; the rest of the cluster is discovered.
    const std::string uri =
        argc > 1 ? argv[1] : "redis://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002";
    try {
        redislock::cluster_client cluster{uri};

        auto orders = cluster.mutex("example:orders:42", {.lease = 10s, .fencing = true});
        {
            std::unique_lock guard{orders};
            std::cout << "holding example:orders:42 on "
                      << cluster.connection().node_for_key("example:orders:42")
                      << " with fencing token " << orders.fencing_token() << '\n';
        }

        // Names that share a hash tag share a slot, and so a master.
        auto catalog = cluster.shared_mutex("example:{catalog}:books");
        {
            std::shared_lock reader{catalog};
            std::cout << "reading the catalog on "
                      << cluster.connection().node_for_key("example:{catalog}:books") << '\n';
        }

        // Renewals of every held lock go out as one pipeline per master per period. A watchdog
        // lease is at least 6 command timeouts (2 s by default; see docs/configuration.md).
        auto job = cluster.recursive_mutex("example:job", {.lease = 15s, .watchdog = true});
        {
            std::unique_lock guard{job};
            std::this_thread::sleep_for(100ms);
        }
        std::cout << cluster.connection().masters().size() << " masters, "
                  << cluster.connection().round_trips() << " round trips\n";
        return 0;
    } catch (const redislock::error& e) {
        std::cerr << "redislock: " << e.what() << '\n';
        return 1;
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
