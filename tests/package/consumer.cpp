// Compiles against the package and checks, without a server, that its pieces are there.
#include <redislock/redislock.hpp>

#include <cstdio>
#include <mutex>

#ifdef REDISLOCK_EXPECT_TLS
static_assert(redislock::detail::hiredis_has_tls == (REDISLOCK_EXPECT_TLS != 0),
              "redislock_TLS_FOUND and the compiled headers disagree");
#endif

int main() {
    static_assert(redislock::connection<redislock::hiredis_connection>);
    static_assert(redislock::connection<redislock::sentinel_connection>);
    static_assert(
        std::is_same_v<redislock::node_client::connection_type, redislock::hiredis_connection>);
    static_assert(std::is_same_v<redislock::client::connection_type, redislock::any_connection>);
    auto ep = redislock::endpoint::from_uri("redis://user:pw@127.0.0.1:6390/2");
    if (ep.port != 6390 || ep.db != 2 || ep.user != "user") {
        std::puts("endpoint parsing is wrong");
        return 1;
    }
    std::puts("consumer ok");
    return 0;
}
