// redislock::subscriber_link: what a connection offers so that waiters are woken by releases
// instead of polling. A connection type that has a member
//
//   std::unique_ptr<redislock::subscriber_link> open_subscriber(std::string_view channel);
//
// (hiredis_connection, cluster and Sentinel connections do) gets notified waiting; one without
// it waits by polling with backoff, bounded by the holder's lease.
//
// Thread safety: a link is used by one thread at a time, not always the same one: the client's
// notifier thread, or a waiting thread that spins (client_options::wait_spin) when the link's
// reads_without_blocking() says its read() never waits.
// Lifetime: a link must not outlive the connection that opened it.
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/reply.hpp>

namespace redislock {

/// One connection in subscriber mode (SSUBSCRIBE), read without blocking.
class subscriber_link {
public:
    virtual ~subscriber_link() = default;

    /// The socket to poll for input.
    virtual int fd() const noexcept = 0;

    /// Sends `argv` (SSUBSCRIBE, SUNSUBSCRIBE). @throws redislock::connection_error
    virtual void send(command argv) = 0;

    /// Reads what has arrived and appends every complete reply to `out`.
    /// @throws redislock::connection_error when the connection is closed or broken
    virtual void read(std::vector<reply>& out) = 0;

    /// True when input was read from the socket but not yet returned by read() (TLS buffers):
    /// read() must be called without waiting for the socket.
    virtual bool buffered() const noexcept { return false; }

    /// True when read() never waits for the socket (it reads only what poll() says is there):
    /// a spinning waiter may then read the link itself. False (the default) leaves the link to
    /// the client's notifier thread, as a TLS link whose record may arrive in parts needs.
    virtual bool reads_without_blocking() const noexcept { return false; }
};

/// A connection that can open subscriber links.
template <class C>
concept subscribing_connection = requires(C& c, std::string_view channel) {
    { c.open_subscriber(channel) } -> std::same_as<std::unique_ptr<subscriber_link>>;
};

}  // namespace redislock
