// redislock::client_options: how a client behaves as a whole (beside each lock's lock_options).
//
//   redislock::client client{"redis://127.0.0.1:6379",
//                            {.on_event = [](const redislock::lock_event& e) { ... }}};
#pragma once

#include <redislock/events.hpp>

namespace redislock {

/// Options of a client, given to its constructor after the connection's own arguments. An
/// aggregate: write `client_options{.on_event = hook}`.
struct client_options {
    /// Called for every lock event of the client's locks and connection (see events.hpp for the
    /// events, their fields and the thread each comes on). Empty (the default) costs nothing.
    /// Called with no internal lock held; must not throw (what it throws is dropped).
    event_hook on_event{};
};

}  // namespace redislock
