// detail::quorum_round: the answers of N nodes to one command sent to all of them at once, and
// a wait that ends as soon as the outcome is settled.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

namespace redislock::detail {

/// What one node answered. `yes`: it did what was asked (acquired, released, extended, still
/// ours); `no`: it refused because the key is not ours (held by another, expired); `failed`:
/// it could not say (down, hung, error reply).
enum class node_answer : unsigned char { pending, yes, no, failed };

struct node_outcome {
    node_answer answer = node_answer::pending;
    std::string error;          ///< for `failed`
    bool server_error = false;  ///< `failed` by an error reply, not by the network
};

struct quorum_tally {
    std::size_t yes = 0;
    std::size_t no = 0;
    std::size_t failed = 0;  ///< pending answers count as failed
};

inline quorum_tally tally(const std::vector<node_outcome>& outcomes) {
    quorum_tally t;
    for (const node_outcome& o : outcomes) {
        switch (o.answer) {
            case node_answer::yes:
                ++t.yes;
                break;
            case node_answer::no:
                ++t.no;
                break;
            case node_answer::pending:
            case node_answer::failed:
                ++t.failed;
                break;
        }
    }
    return t;
}

class quorum_round {
public:
    quorum_round(std::size_t nodes, std::size_t quorum) : outcomes_(nodes), quorum_{quorum} {}

    /// Records node `node`'s answer; later answers for the same node are ignored.
    void report(std::size_t node, node_answer answer, std::string error = {},
                bool server_error = false) {
        bool wake = false;
        {
            std::lock_guard guard{mutex_};
            node_outcome& o = outcomes_[node];
            if (o.answer != node_answer::pending) {
                return;
            }
            o = {answer, std::move(error), server_error};
            ++answered_;
            ++counts_[static_cast<std::size_t>(answer)];
            // A waiter's condition changes only when the outcome settles and when the last
            // answer comes: waking it for every answer would cost a context switch each.
            const bool now_settled = settled();
            wake = (now_settled && !woken_settled_) || answered_ == outcomes_.size();
            woken_settled_ = woken_settled_ || now_settled;
        }
        if (wake) {
            settled_.notify_all();
        }
    }

    /// Waits until the outcome cannot change any more (a quorum said yes, or more than N -
    /// quorum said no, or failed), every node answered, `until` passed or `stop` was requested.
    /// With `every_node`, waits for every node's answer (or `until`, or `stop`) even once the
    /// outcome is settled. Returns every node's outcome so far; nodes that have not answered are
    /// still pending.
    std::vector<node_outcome> wait(std::chrono::steady_clock::time_point until,
                                   const std::stop_token& stop, bool every_node = false) {
        std::unique_lock lock{mutex_};
        const auto done = [this, every_node] {
            return every_node ? answered_ == outcomes_.size() : settled();
        };
        if (stop.stop_possible()) {
            (void)settled_.wait_until(lock, stop, until, done);
        } else {
            (void)settled_.wait_until(lock, until, done);
        }
        return outcomes_;
    }

private:
    bool settled() const {
        const std::size_t n = outcomes_.size();
        const std::size_t minority = n - quorum_;
        return answered_ == n || counts_[static_cast<std::size_t>(node_answer::yes)] >= quorum_ ||
               counts_[static_cast<std::size_t>(node_answer::no)] > minority ||
               counts_[static_cast<std::size_t>(node_answer::failed)] > minority;
    }

    std::mutex mutex_;
    std::condition_variable_any settled_;
    std::vector<node_outcome> outcomes_;
    std::size_t quorum_;
    std::size_t answered_ = 0;
    bool woken_settled_ = false;
    std::size_t counts_[4]{};
};

}  // namespace redislock::detail
