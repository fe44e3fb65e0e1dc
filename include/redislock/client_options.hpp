// redislock::client_options: how a client behaves as a whole (beside each lock's lock_options).
//
//   redislock::client client{"redis://127.0.0.1:6379",
//                            {.on_event = [](const redislock::lock_event& e) { ... }}};
#pragma once

#include <chrono>

#include <redislock/events.hpp>

namespace redislock {

/// Options of a client, given to its constructor after the connection's own arguments. An
/// aggregate: write `client_options{.on_event = hook}`.
struct client_options {
    /// Called for every lock event of the client's locks and connection (see events.hpp for the
    /// events, their fields and the thread each comes on). Empty (the default) costs nothing.
    /// Called with no internal lock held; must not throw (what it throws is dropped).
    event_hook on_event{};

    /// How long a waiting lock call keeps its thread on the CPU before it sleeps, once it has
    /// been told the lock is held. A release hands the lock on within a few round trips, and a
    /// thread that is still on the CPU then sees it at once; one that sleeps must be woken,
    /// which on a loaded or virtual machine can cost more than the round trips. The thread
    /// yields the CPU to any other runnable thread while it spins, and so does the client's
    /// subscriber thread. Only a call whose lock's release will notify it spins (not a polling
    /// waiter), and only the one thread per process at the head of that lock's local line.
    /// Zero: sleep at once. Outside [0, 1 h]: invalid_argument from the client's constructor.
    std::chrono::microseconds wait_spin{1000};
};

}  // namespace redislock
