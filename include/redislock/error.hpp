// Exceptions and error codes of redislock.
//
// Failures are exceptions derived from redislock::error; contention never is (try_lock* return
// false). Calls that cannot throw (unlock, the watchdog thread) report through std::error_code
// values of redislock::errc, or through a lock's on_lost handler.
#pragma once

#include <stdexcept>
#include <string>
#include <system_error>

namespace redislock {

/// Base of every exception the library throws.
class error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// The server could not be reached, the connection broke, or a reply was malformed.
class connection_error : public error {
public:
    using error::error;
};

/// The server did not answer within the connect or command timeout.
class timeout_error : public connection_error {
public:
    using connection_error::connection_error;
};

/// A stop request ended a call while its command was in flight. The command may still reach
/// the server; the library cleans up after acquisitions it abandons this way.
class cancelled_error : public error {
public:
    using error::error;
};

/// The server answered with an error reply, e.g. WRONGTYPE when a lock's name holds a key of
/// another type.
class server_error : public error {
public:
    using error::error;
};

/// The server cannot serve the command right now (LOADING, READONLY, TRYAGAIN, CLUSTERDOWN,
/// MASTERDOWN, BUSY, or a script killed): a wait with time left tries again.
class unavailable_error : public server_error {
public:
    using server_error::server_error;
};

/// An acquisition was acknowledged by fewer replicas than lock_options::min_replicas within
/// replica_timeout; it was undone.
class replication_error : public error {
public:
    using error::error;
};

/// A caller passed a value the library cannot use: an empty name, a lease out of range, a
/// malformed URI.
class invalid_argument : public error {
public:
    using error::error;
};

/// A lock call whose grants can never stand: its attempts were answered only after their lease
/// had run out, three in a row (the round trips to the server outlast the lease). Not contention
/// and not transient: no wait rides it out (see "Attempts that can never succeed" in
/// docs/guarantees.md).
class lease_error : public error {
public:
    using error::error;
};

/// Errors reported through std::error_code where a call cannot throw.
enum class errc {
    not_held = 1,       ///< unlock() of a lock this object does not hold
    not_holder,         ///< unlock() from a thread (or owner) other than the one that locked
    lock_lost,          ///< the lock had expired or was taken by someone else
    connection_failed,  ///< the release could not reach the server; the lease will run out
    server_failed,      ///< the server answered with an error reply
};

namespace detail {

/// The text of the last error reply a release or renewal on this thread got, for
/// errc::server_failed's message.
inline std::string& last_server_failure() {
    thread_local std::string text;
    return text;
}

class error_category final : public std::error_category {
public:
    const char* name() const noexcept override { return "redislock"; }
    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
            case errc::not_held:
                return "the lock is not held by this object";
            case errc::not_holder:
                return "the lock is held by another thread or owner";
            case errc::lock_lost:
                return "the lock was lost (expired or taken by another holder)";
            case errc::connection_failed:
                return "the server could not be reached";
            case errc::server_failed:
                return last_server_failure().empty()
                           ? "the server answered with an error"
                           : "the server answered with an error: " + last_server_failure();
        }
        return "unknown redislock error";
    }
};
}  // namespace detail

/// The category of redislock::errc codes (name "redislock").
inline const std::error_category& error_category() noexcept {
    static const detail::error_category category;
    return category;
}

/// Makes std::error_code from redislock::errc, so the two compare equal.
inline std::error_code make_error_code(errc e) noexcept {
    return {static_cast<int>(e), error_category()};
}

}  // namespace redislock

template <>
struct std::is_error_code_enum<redislock::errc> : std::true_type {};
