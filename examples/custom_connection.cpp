// A connection written by the user: the locks need nothing but execute(command) -> reply.
//
// counting_connection wraps the shipped hiredis_connection, counts the commands sent and logs
// each command's name; basic_client<counting_connection> then makes locks over it. The same
// shape adapts any other Redis client, or injects faults in tests.
//
// Usage: custom_connection [redis://127.0.0.1:6379]

#include <atomic>
#include <cstdint>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <redislock/redislock.hpp>

class counting_connection {
public:
    explicit counting_connection(std::string_view uri) : inner_{uri} {}

    // Called from every thread that uses a lock of the client, so it must be thread-safe:
    // hiredis_connection is, and the counter is atomic.
    redislock::reply execute(redislock::command argv) {
        commands_->fetch_add(1, std::memory_order_relaxed);
        std::clog << "  -> " << (argv.empty() ? std::string_view{"?"} : argv[0]) << '\n';
        return inner_.execute(argv);
    }

    std::uint64_t commands() const { return commands_->load(std::memory_order_relaxed); }

private:
    redislock::hiredis_connection inner_;
    // Behind a pointer so the connection stays movable, as hiredis_connection is.
    std::unique_ptr<std::atomic<std::uint64_t>> commands_ =
        std::make_unique<std::atomic<std::uint64_t>>(0);
};

static_assert(redislock::connection<counting_connection>);

int main(int argc, char** argv) {
    const std::string uri = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    try {
        redislock::basic_client<counting_connection> client{uri};
        auto m = client.mutex("example:custom-connection");
        {
            std::lock_guard guard{m};
            std::cout << "holding example:custom-connection\n";
        }
        std::cout << "commands sent: " << client.connection().commands() << '\n';
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
