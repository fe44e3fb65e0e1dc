// detail::reconnect_relay: the reconnect handler of a connection made of several hiredis pools
// (a Cluster's nodes, a Sentinel's successive masters). Each pool is given forward() when it is
// made, before any other thread can reach it; the handler itself lives here, so it may be set
// before or after the pools exist, from any thread, and a pool made concurrently by another
// thread reports to whatever handler is set when its report comes.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>

namespace redislock::detail {

class reconnect_relay {
public:
    using handler = std::function<void(std::string_view server)>;

    /// Replaces the handler (an empty one stops the reports). A report already under way
    /// finishes with the handler it started with.
    void set(handler next) {
        std::shared_ptr<const handler> kept;
        if (next) {
            kept = std::make_shared<const handler>(std::move(next));
        }
        {
            std::lock_guard lock{mutex_};
            handler_.swap(kept);
        }
        // The old handler (now in `kept`) is destroyed here, outside the mutex.
    }

    /// Tells the handler, when there is one, that a connection to `server` was opened in place
    /// of one that broke; called with no lock held. What the handler throws is dropped.
    void report(std::string_view server) const noexcept {
        std::shared_ptr<const handler> current;
        {
            std::lock_guard lock{mutex_};
            current = handler_;
        }
        if (!current) {
            return;
        }
        try {
            (*current)(server);
        } catch (...) {
        }
    }

    /// A handler for one pool (hiredis_connection::set_reconnect_handler) that reports here.
    /// The relay must outlive the pool.
    handler forward() const {
        return [this](std::string_view server) { report(server); };
    }

private:
    mutable std::mutex mutex_;
    std::shared_ptr<const handler> handler_;
};

}  // namespace redislock::detail
