// A distributed read-write lock: many readers at once, one writer, and a writer waiting keeps
// new readers out so it is not starved.
//
// Usage: shared_mutex_example [redis://127.0.0.1:6379]

#include <chrono>
#include <exception>
#include <iostream>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

int main(int argc, char** argv) {
    const std::string uri = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    try {
        redislock::client client{uri};
        // One object may be shared by threads; each thread reads under its own owner id.
        auto catalog = client.shared_mutex("example:catalog", {.lease = 10s, .fencing = true});

        std::vector<std::thread> readers;
        for (int i = 0; i < 3; ++i) {
            readers.emplace_back([&catalog, i] {
                std::shared_lock guard{catalog};
                std::cout << "reader " << i << " reads the catalog\n";
                std::this_thread::sleep_for(50ms);
            });
        }
        for (auto& reader : readers) {
            reader.join();
        }

        {
            std::unique_lock writer{catalog};
            std::cout << "writer updates the catalog (fencing token " << catalog.fencing_token()
                      << ")\n";
            // Downgrade: keep reading after the write without letting another writer in between.
            catalog.lock_shared();
        }
        std::cout << "still reading after the write\n";
        catalog.unlock_shared();
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
