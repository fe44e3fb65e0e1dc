// redislock::redlock_options: how a redlock_client talks to its masters.
#pragma once

#include <chrono>

#include <redislock/events.hpp>

namespace redislock {

/// Options of a redlock_client, shared by every lock it makes. An aggregate:
/// `redlock_options{.node_timeout = 20ms}`.
struct redlock_options {
    /// The longest one call to one master may take (connecting included), counted from when the
    /// round that sent it started. Far below the lease: a hung master costs every acquisition
    /// this long, and the time is taken off the lock's validity. Must be positive.
    std::chrono::milliseconds node_timeout{50};

    /// How many times a release that could not reach a master is sent again in the background
    /// (by the process's reaper, delays doubling from 10 ms up to 1 s), while the lease it
    /// releases may still run. A master that stays out of reach that long keeps the key until
    /// its lease runs out.
    int release_retries = 8;

    /// Called with what the client's locks do (see events.hpp; kind lock_kind::redlock_mutex),
    /// as client_options::on_event is, and with reconnected when a master's connection was
    /// replaced (naming the master, once the round that replaced it is over). Unset (the
    /// default), nothing is built or timed for it.
    event_hook on_event{};
};

}  // namespace redislock
