// One lock code for every topology: redislock::client takes one node, Sentinel or Cluster from
// the URI's scheme at run time, so the service below runs unchanged against a single server in
// development and Sentinel or a Cluster in production. The client may be made before Redis is
// up: nothing is connected until the first lock call, which fails (or waits, within its
// timeout) while the servers are down.
//
// Usage: any_topology [URI...]
//   any_topology redis://127.0.0.1:6379
//   any_topology "redis-sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381#mymaster"
//   any_topology redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
// Without arguments it tries the Sentinel and the Cluster URIs above.

#include <chrono>
#include <exception>
#include <iostream>
#include <mutex>
#include <string>
#include <vector>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

namespace {

const char* topology_name(redislock::topology t) {
    switch (t) {
        case redislock::topology::node:
            return "one node";
        case redislock::topology::sentinel:
            return "Sentinel";
        case redislock::topology::cluster:
            return "Cluster";
    }
    return "?";
}

// The service's lock code: the same whatever the URI named.
void ship_order(redislock::client& client, const std::string& order) {
    redislock::mutex lock = client.mutex("example:orders:" + order, {.lease = 10s});
    if (!lock.try_lock_for(2s)) {
        // A waiting call rides out an unreachable server until its timeout, as a held lock.
        std::cout << "  order " << order
                  << " not locked within 2 s: shipped elsewhere, or Redis is unreachable\n";
        return;
    }
    std::lock_guard guard{lock, std::adopt_lock};
    std::cout << "  shipping order " << order << " under its lock\n";
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> uris{argv + 1, argv + argc};
    if (uris.empty()) {
        uris = {"redis-sentinel://127.0.0.1:26379,127.0.0.1:26380,127.0.0.1:26381#mymaster",
                "redis-cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"};
    }
    int failures = 0;
    for (const std::string& uri : uris) {
        std::cout << uri << '\n';
        try {
            // Throws only for a malformed URI: connecting waits for the first call.
            redislock::client client{uri};
            std::cout << "  topology: " << topology_name(client.connection().kind()) << '\n';
            ship_order(client, "42");
            if (auto* cluster = client.connection().get<redislock::hiredis_cluster_connection>()) {
                std::cout << "  " << cluster->masters().size() << " masters\n";
            } else if (auto* sentinel = client.connection().get<redislock::sentinel_connection>()) {
                std::cout << "  master " << sentinel->master().describe() << '\n';
            }
        } catch (const redislock::invalid_argument& e) {
            std::cerr << "  bad URI: " << e.what() << '\n';
            ++failures;
        } catch (const redislock::error& e) {
            std::cerr << "  redislock: " << e.what() << '\n';
            ++failures;
        } catch (const std::exception& e) {
            std::cerr << "  " << e.what() << '\n';
            ++failures;
        }
    }
    return failures == 0 ? 0 : 1;
}
