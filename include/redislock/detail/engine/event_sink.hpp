// detail::event_sink: where a client's events go (client_options::on_event), and the small
// helpers that fill them. Without a hook every report is one branch on an empty std::function:
// no clock is read and no event is built.
#pragma once

#include <chrono>
#include <cstdint>
#include <string_view>
#include <utility>

#include <redislock/events.hpp>

namespace redislock::detail {

/// Calls `hook`, when set, with `make()`; drops what the hook throws, since events are reported
/// from threads and paths that must not throw.
template <class Make>
void emit_to(const event_hook& hook, Make&& make) noexcept {
    if (!hook) {
        return;
    }
    try {
        hook(make());
    } catch (...) {
    }
}

class event_sink {
public:
    event_sink() = default;
    explicit event_sink(event_hook hook) : hook_{std::move(hook)} {}
    event_sink(const event_sink&) = delete;
    event_sink& operator=(const event_sink&) = delete;

    /// True when someone listens: callers read clocks only then.
    bool observed() const noexcept { return static_cast<bool>(hook_); }

    /// Calls the hook with `make()` when there is one (see emit_to).
    template <class Make>
    void emit(Make&& make) const noexcept {
        emit_to(hook_, std::forward<Make>(make));
    }

    /// Tells a reconnected event: `server` opened a connection in place of one that broke.
    void reconnected(std::string_view server) const noexcept {
        emit([&] {
            lock_event e;
            e.type = event_type::reconnected;
            e.name = server;
            return e;
        });
    }

    /// The hook itself, for a closure that outlives the call (the loss timer's report).
    const event_hook& hook() const noexcept { return hook_; }

private:
    event_hook hook_;
};

/// What one lock call's wait came to: when it started (read only when observed) and how many
/// attempts it made.
struct wait_tally {
    std::chrono::steady_clock::time_point started{};
    std::uint32_t attempts = 0;
};

/// Time from `since` to now, in whole microseconds.
inline std::chrono::microseconds micros_since(std::chrono::steady_clock::time_point since) {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() -
                                                                 since);
}

}  // namespace redislock::detail
