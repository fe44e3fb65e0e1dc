// What a client shares with the locks it made: the event sink, the connection, the instance id,
// the watchdog and the loss timer. Locks hold it by shared_ptr, so a lock that outlives its client
// still releases, is still renewed and is still told of its loss: the machinery stops when the
// last of them goes.
#pragma once

#include <chrono>
#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <redislock/client_options.hpp>
#include <redislock/connection.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/detail/engine/eviction_check.hpp>
#include <redislock/detail/engine/given_up_registry.hpp>
#include <redislock/detail/engine/loss_timer.hpp>
#include <redislock/detail/engine/notifier.hpp>
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/engine/reaper.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/local_gate.hpp>
#include <redislock/error.hpp>
#include <redislock/subscriber.hpp>
#include <redislock/watchdog.hpp>

namespace redislock::detail {

/// How long one untimed call may take: the connection's command timeout when it states one.
template <class C>
std::chrono::milliseconds command_budget(const C& conn) {
    if constexpr (requires { conn.config().command_timeout; }) {
        return std::chrono::duration_cast<std::chrono::milliseconds>(conn.config().command_timeout);
    } else if constexpr (requires { conn.config().node.command_timeout; }) {
        // Sentinel: the masters' command timeout.
        return std::chrono::duration_cast<std::chrono::milliseconds>(
            conn.config().node.command_timeout);
    } else {
        return std::chrono::milliseconds{2000};
    }
}

/// What a client's waiters share in one process: the local gates and the notifier.
struct waiting_room {
    waiting_room(notifier::opener open, notifier::node_namer node_of, steady::duration spin,
                 notifier::refusal_reporter report)
        : notify{std::move(open), std::move(node_of), spin, std::move(report)} {}

    local_gates gates;
    notifier notify;

    // For per_process: the notifier's thread is the only one here.
    bool runs_on_this_thread() const noexcept { return notify.runs_on_this_thread(); }
    void stop() noexcept { notify.stop(); }
};

/// The notifier's way to open subscriber links over `conn`, when its type has one.
template <connection C>
std::unique_ptr<waiting_room> make_waiting_room(C& conn, steady::duration spin,
                                                const event_sink& events) {
    notifier::opener open;
    notifier::node_namer node_of;
    notifier::refusal_reporter report;
    if constexpr (subscribing_connection<C>) {
        open = [&conn](std::string_view channel) { return conn.open_subscriber(channel); };
    }
    if constexpr (requires(std::string_view channel) {
                      { conn.subscriber_node(channel) } -> std::convertible_to<std::string>;
                  }) {
        node_of = [&conn](std::string_view channel) {
            return std::string{conn.subscriber_node(channel)};
        };
    }
    if (events.observed()) {
        report = [&events](std::string_view name, std::string_view why) {
            events.emit([&] {
                lock_event e;
                e.type = event_type::subscription_refused;
                e.name = name;
                e.detail = why;
                return e;
            });
        };
    }
    return std::make_unique<waiting_room>(std::move(open), std::move(node_of), spin,
                                          std::move(report));
}

/// True for a connection that can tell when it opened a new connection after one broke.
template <class C>
concept reconnect_reporting = requires(C& c, std::function<void(std::string_view)> handler) {
    c.set_reconnect_handler(std::move(handler));
};

inline steady::duration checked_wait_spin(std::chrono::microseconds spin) {
    if (spin < std::chrono::microseconds::zero() || spin > std::chrono::hours{1}) {
        throw invalid_argument{"redislock: client_options::wait_spin must be in [0, 1 h]"};
    }
    return spin;
}

template <connection C>
struct client_core {
    template <class... Args>
    explicit client_core(client_options options, Args&&... args)
        : wait_spin{checked_wait_spin(options.wait_spin)},
          events{std::move(options.on_event)},
          connection(std::forward<Args>(args)...) {
        if constexpr (reconnect_reporting<C>) {
            if (events.observed()) {
                // The connection is a member: it never calls the handler once this is gone.
                connection.set_reconnect_handler(
                    [this](std::string_view server) { events.reconnected(server); });
            }
        }
        report_eviction_policy(connection, events, command_budget(connection));
    }
    client_core(const client_core&) = delete;
    client_core& operator=(const client_core&) = delete;
    ~client_core() { watchdog.stop(); }

    /// A deadline for one untimed call made now.
    std::chrono::steady_clock::time_point untimed_deadline() const {
        return std::chrono::steady_clock::now() + command_budget(connection);
    }

    /// Whether the name was contended lately, for a release (see local_gates); false when this
    /// process's waiting room cannot be built (out of memory in a forked child's first use).
    bool contended_lately(std::string_view name) noexcept {
        try {
            return waiting->gates.look(name).contended;
        } catch (...) {
            return false;
        }
    }

    /// Notes for the local gates whether a release of `name` met waiters. A hint, dropped when
    /// this process's waiting room cannot be built: release paths must not throw.
    void note_contention(std::string_view name, bool contended) noexcept {
        try {
            waiting->gates.note_contention(name, contended);
        } catch (...) {
        }
    }

    steady::duration wait_spin;  // checked before the connection is made
    event_sink events;           // before the connection, which may report to it until its end
    C connection;
    std::string instance_id = token::random().str();
    per_process<loss_timer> timer{[] { return std::make_unique<loss_timer>(); }};
    per_process<given_up_registry> given_up{[] { return std::make_unique<given_up_registry>(); }};
    per_process<waiting_room> waiting{
        [this] { return make_waiting_room(connection, wait_spin, events); }};
    basic_watchdog<C> watchdog{connection, &events};
};

}  // namespace redislock::detail
