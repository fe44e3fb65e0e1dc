// detail::quorum_connection: the Redlock masters seen as one connection by the watchdog, and what
// that takes without a socket: a watchdog batch as the commands of a round (quorum_batch), and the
// masters' replies counted into the quorum's (quorum_replies_of). redlock_core runs the round in
// between; apart from it, what the watchdog sends and what it is told read in one place.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/topology/quorum_round.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

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

/// A quorum_connection batch as a round sends it: an EVALSHA of a script the watchdog sends is
/// marked as that script's, so a master that answers NOSCRIPT gets SCRIPT LOAD and it again.
inline std::vector<fanout_command> quorum_batch(std::span<const command> commands) {
    std::vector<fanout_command> batch;
    batch.reserve(commands.size());
    for (command argv : commands) {
        const script* s = nullptr;
        if (argv.size() > 1 && argv[0] == "EVALSHA") {
            for (const script* known : {&scripts::mutex_extend, &scripts::compare_and_delete}) {
                if (argv[1] == known->sha1) {
                    s = known;
                }
            }
        }
        batch.push_back({argv, s});
    }
    return batch;
}

/// The quorum's reply to each of the `count` commands the `masters` answered in `replies`:
/// see quorum_connection.
inline std::vector<reply> quorum_replies_of(const std::vector<node_replies>& replies,
                                            std::size_t count, std::size_t masters,
                                            std::size_t quorum) {
    std::vector<reply> out;
    out.reserve(count);
    for (std::size_t k = 0; k < count; ++k) {
        std::size_t yes = 0;
        std::size_t no = 0;
        for (const node_replies& r : replies) {
            if (!r.answered) {
                continue;
            }
            const reply& one = r.replies[k];
            if (one.is_integer()) {
                ++(one.as_integer() == 1 ? yes : no);
            } else if (one.is_error_code("WRONGTYPE")) {
                ++no;
            }
        }
        if (yes >= quorum) {
            out.push_back(reply::integer(1));
        } else if (no > masters - quorum) {
            out.push_back(reply::integer(0));
        } else {
            out.push_back(reply::error("NOQUORUM too few masters answered"));
        }
    }
    return out;
}

}  // namespace redislock::detail
