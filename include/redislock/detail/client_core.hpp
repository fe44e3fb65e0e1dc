// What a client shares with the locks it made: the connection, the instance id, the watchdog.
// Locks hold it by shared_ptr, so a lock that outlives its client can still release.
#pragma once

#include <string>
#include <utility>

#include <redislock/connection.hpp>
#include <redislock/detail/token.hpp>
#include <redislock/watchdog.hpp>

namespace redislock::detail {

template <connection C>
struct client_core {
    template <class... Args>
    explicit client_core(Args&&... args) : connection(std::forward<Args>(args)...) {}

    C connection;
    std::string instance_id = token::random().str();
    basic_watchdog<C> watchdog{connection};
};

}  // namespace redislock::detail
