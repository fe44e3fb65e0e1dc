// redislock::quorum_error: a call to a redlock_client's masters that reached too few of them.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <redislock/error.hpp>

namespace redislock {

/// Thrown when fewer than a quorum of masters could answer: too many were down, hung past
/// redlock_options::node_timeout, or answered with an error. Contention is never a
/// quorum_error (try_lock* return false). what() names every master and what it answered;
/// failures() lists the masters that failed.
class quorum_error : public connection_error {
public:
    /// One master that did not count towards the quorum.
    struct node_failure {
        std::string node;  ///< "host:port"
        std::string what;  ///< why that master did not count
    };

    /// Made by the library: `message` for what(), `failures` for failures().
    quorum_error(std::string message, std::vector<node_failure> failures)
        : connection_error{std::move(message)}, failures_{std::move(failures)} {}

    /// The masters that failed, and why.
    const std::vector<node_failure>& failures() const noexcept { return failures_; }

private:
    std::vector<node_failure> failures_;
};

}  // namespace redislock
