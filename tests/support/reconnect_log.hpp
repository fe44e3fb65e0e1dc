#pragma once

// The reconnected events a client's hook saw (client_options::on_event), or what a connection's
// reconnect handler was told: the servers they named, in order. Declare it before the client or
// connection, so it outlives the threads that call it.

#include <algorithm>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <redislock/events.hpp>

namespace redislock::test {

class reconnect_log {
public:
    /// For client_options::on_event: records reconnected events, ignores the others.
    event_hook hook() {
        return [this](const lock_event& e) {
            if (e.type != event_type::reconnected) {
                return;
            }
            std::lock_guard guard{mutex_};
            servers_.emplace_back(e.name);
            if (e.kind != lock_kind::none) {
                ++about_a_lock_;
            }
        };
    }

    /// For a connection's set_reconnect_handler.
    std::function<void(std::string_view)> handler() {
        return [this](std::string_view server) {
            std::lock_guard guard{mutex_};
            servers_.emplace_back(server);
        };
    }

    /// The servers named so far, in the order told.
    std::vector<std::string> servers() const {
        std::lock_guard guard{mutex_};
        return servers_;
    }

    std::size_t count() const {
        std::lock_guard guard{mutex_};
        return servers_.size();
    }

    /// How many times `server` was named.
    std::size_t count(std::string_view server) const {
        std::lock_guard guard{mutex_};
        return static_cast<std::size_t>(std::count(servers_.begin(), servers_.end(), server));
    }

    /// Reconnected events that named a lock kind (there should be none).
    std::size_t about_a_lock() const {
        std::lock_guard guard{mutex_};
        return about_a_lock_;
    }

private:
    mutable std::mutex mutex_;
    std::vector<std::string> servers_;
    std::size_t about_a_lock_ = 0;
};

}  // namespace redislock::test
