// Compile-time benchmark (b): every lock kind through redislock::client made from a URI.
#include <redislock/redislock.hpp>

#include <chrono>
#include <mutex>
#include <shared_mutex>

int main(int argc, char** argv) {
    using namespace std::chrono_literals;
    redislock::client client{argc > 1 ? argv[1] : "redis://127.0.0.1:6379"};
    auto plain = client.mutex("orders:42", {.lease = 10s});
    auto reentrant = client.recursive_mutex("orders:43", {.lease = 10s, .watchdog = true});
    auto catalog = client.shared_mutex("catalog", {.fencing = true});
    {
        std::unique_lock guard{plain, 2s};
        std::lock_guard inner{reentrant};
        std::lock_guard again{reentrant};
    }
    { std::shared_lock reader{catalog}; }
    std::unique_lock writer{catalog};
    return writer.mutex()->fencing_token() > 0 ? 0 : 1;
}
