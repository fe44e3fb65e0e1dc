// What a client shares with the locks it made: the connection, the instance id, the watchdog
// and the loss timer. Locks hold it by shared_ptr, so a lock that outlives its client
// still releases, is still renewed and is still told of its loss: the machinery stops when the
// last of them goes.
#pragma once

#include <chrono>
#include <concepts>
#include <memory>
#include <string>
#include <utility>

#include <redislock/connection.hpp>
#include <redislock/detail/loss_timer.hpp>
#include <redislock/detail/per_process.hpp>
#include <redislock/detail/reaper.hpp>
#include <redislock/detail/token.hpp>
#include <redislock/watchdog.hpp>

namespace redislock::detail {

/// How long one untimed call may take: the connection's command timeout when it states one.
template <class C>
std::chrono::milliseconds command_budget(const C& conn) {
    if constexpr (requires { conn.config().command_timeout; }) {
        return std::chrono::duration_cast<std::chrono::milliseconds>(conn.config().command_timeout);
    } else {
        return std::chrono::milliseconds{2000};
    }
}

template <connection C>
struct client_core {
    template <class... Args>
    explicit client_core(Args&&... args) : connection(std::forward<Args>(args)...) {}
    client_core(const client_core&) = delete;
    client_core& operator=(const client_core&) = delete;
    ~client_core() { watchdog.stop(); }

    /// A deadline for one untimed call made now.
    std::chrono::steady_clock::time_point untimed_deadline() const {
        return std::chrono::steady_clock::now() + command_budget(connection);
    }

    C connection;
    std::string instance_id = token::random().str();
    per_process<loss_timer> timer{[] { return std::make_unique<loss_timer>(); }};
    basic_watchdog<C> watchdog{connection};
};

}  // namespace redislock::detail
