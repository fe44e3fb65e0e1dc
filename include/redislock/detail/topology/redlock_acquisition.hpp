// What one Redlock acquisition attempt is on each master (redlock_acquisition, node_hold), and
// what a round asks of them (node_op). The masters seen as one connection by the watchdog are in
// quorum_connection.hpp.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/detail/wire/lock_keys.hpp>

namespace redislock::detail {

/// Where one acquisition's SET stands on one master.
enum class node_hold : unsigned char {
    never_sent,   // nothing of ours there
    unconfirmed,  // sent, no answer: it may land later (a hung master runs it when it wakes)
    set,          // the master said OK
    not_set,      // the master refused (held by another, error reply)
};

/// One acquisition attempt: its token and what each master made of it.
struct redlock_acquisition {
    redlock_acquisition(std::string_view lock_name, std::chrono::milliseconds lease_ms,
                        std::size_t nodes)
        : name{lock_name},
          tok{token::random()},
          lease{lease_ms},
          lease_text{lease_ms.count()},
          holds(nodes) {}

    node_hold hold(std::size_t node) const noexcept {
        return holds[node].load(std::memory_order_acquire);
    }
    void set_hold(std::size_t node, node_hold h) noexcept {
        holds[node].store(h, std::memory_order_release);
    }
    /// Whether the key may be ours on `node`: a release or renewal must go there.
    bool may_hold(std::size_t node) const noexcept {
        const node_hold h = hold(node);
        return h == node_hold::set || h == node_hold::unconfirmed;
    }

    std::string name;
    token tok;
    std::chrono::milliseconds lease;
    decimal lease_text;
    steady::time_point sent{};
    // Written by rounds on any thread (an acquisition, a renewal, an unlock).
    std::vector<std::atomic<node_hold>> holds;
};

enum class node_op { acquire, release, extend, verify };

}  // namespace redislock::detail
