// Compile-time benchmark (a): the umbrella header and one mutex locked through redislock::client
// made from a URI.
#include <redislock/redislock.hpp>

#include <chrono>
#include <mutex>

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    redislock::client client{argc > 1 ? argv[1] : "redis://127.0.0.1:6379"};
    auto orders = client.mutex("orders:42", {.lease = 10s});
    std::unique_lock guard{orders};
    return 0;
}
