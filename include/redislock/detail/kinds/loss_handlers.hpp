// detail::loss_handlers: a lock's on_lost and on_lost_reason, shared so that a loss is told
// without copying a handler, and call_on_lost(), which tells them.
#pragma once

#include <functional>
#include <memory>

#include <redislock/events.hpp>
#include <redislock/lock_options.hpp>

namespace redislock::detail {

/// A lock's on_lost and on_lost_reason, made once with the lock and shared: a loss told on a
/// path that must not throw (unlock(), the loss timer) copies a pointer, never a handler, whose
/// copy could fail to allocate.
struct loss_handlers {
    std::function<void()> on_lost;
    std::function<void(loss_reason)> on_lost_reason;
};

/// The handlers of `options`; null when it has none.
inline std::shared_ptr<const loss_handlers> share_loss_handlers(const lock_options& options) {
    if (!options.on_lost && !options.on_lost_reason) {
        return nullptr;
    }
    return std::make_shared<const loss_handlers>(
        loss_handlers{options.on_lost, options.on_lost_reason});
}

/// Calls on_lost, then on_lost_reason with `reason`, through a reference taken before either
/// runs: a handler that destroys the lock, and with it its handlers, still runs to its end.
inline void call_on_lost(const std::shared_ptr<const loss_handlers>& handlers,
                         loss_reason reason) noexcept {
    if (!handlers) {
        return;
    }
    const std::shared_ptr<const loss_handlers> kept = handlers;
    if (kept->on_lost) {
        kept->on_lost();
    }
    if (kept->on_lost_reason) {
        kept->on_lost_reason(reason);
    }
}

}  // namespace redislock::detail
