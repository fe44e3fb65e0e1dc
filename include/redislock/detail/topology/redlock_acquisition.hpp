// What one Redlock acquisition attempt is on each master (redlock_acquisition, node_hold), and
// the masters seen as one connection by the watchdog (quorum_connection).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/reply.hpp>

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

template <connection C>
class redlock_core;

/// The masters seen as one connection by the watchdog: each command goes to every master at
/// once, and its reply is the quorum's: 1 when a quorum answered 1, 0 when more than N - quorum
/// answered 0 (or hold another type at the key), else an error reply (the watchdog retries).
/// Only for the compare-and-PEXPIRE renewals the watchdog sends.
template <connection C>
class quorum_connection {
public:
    explicit quorum_connection(redlock_core<C>& core) : core_{&core} {}

    reply execute(command argv) { return execute(argv, call_context{}); }

    reply execute(command argv, const call_context& how) {
        return std::move(
            core_->quorum_replies(std::span<const command>{&argv, 1}, how.deadline).front());
    }

    std::vector<reply> execute_pipeline(std::span<const command> commands) {
        return core_->quorum_replies(commands, std::chrono::steady_clock::time_point::max());
    }

    std::vector<reply> execute_pipeline(std::span<const command> commands,
                                        std::span<const call_context> hows) {
        auto deadline = std::chrono::steady_clock::time_point::max();
        for (const call_context& how : hows) {
            deadline = std::min(deadline, how.deadline);
        }
        return core_->quorum_replies(commands, deadline);
    }

private:
    redlock_core<C>* core_;
};

}  // namespace redislock::detail
