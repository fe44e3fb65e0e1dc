// Compiles against redislock::core alone, with a connection of its own and no hiredis anywhere on
// the include or link path, and checks without a server that a lock talks to Redis only through
// that connection.
#include <redislock/client.hpp>
#include <redislock/connection.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/version.hpp>

#ifdef HIREDIS_MAJOR
#error "the core headers must not include hiredis"
#endif

#include <atomic>
#include <cstdio>

namespace {

std::atomic<int> calls{0};

// Answers every command as an unreachable server would.
class unreachable_connection {
public:
    redislock::reply execute(redislock::command) {
        calls.fetch_add(1);
        throw redislock::connection_error{"unreachable"};
    }
};

}  // namespace

int main() {
    static_assert(redislock::connection<unreachable_connection>);
    redislock::basic_client<unreachable_connection> client{unreachable_connection{}};
    auto lock = client.mutex("core-consumer");
    try {
        (void)lock.try_lock();
        std::puts("try_lock succeeded without a server");
        return 1;
    } catch (const redislock::connection_error&) {
    }
    if (calls.load() == 0) {
        std::puts("the lock never used the connection");
        return 1;
    }
    std::printf("core consumer ok (redislock %s)\n", REDISLOCK_VERSION_STRING);
    return 0;
}
