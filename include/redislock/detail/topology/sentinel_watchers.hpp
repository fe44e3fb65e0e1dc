// The subscription threads of detail::sentinel_follower, one per sentinel and process: each
// subscribes to its sentinel's failover announcements, raises the failover fence at a step of a
// failover of the master, follows a switch at once, lifts the fence at an abort, and, while a
// failover it announced is raised, asks its sentinel whether it is over, in case the end was
// missed. Apart from sentinel_follower.hpp, which holds the shared state and the search for the
// master, because these threads keep state of their own (watcher_state) and only reach the rest
// through the follower's members. Included at the end of sentinel_follower.hpp.
#pragma once

#include <poll.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>

#include <redislock/detail/topology/failover_fence.hpp>
#include <redislock/detail/topology/sentinel_follower.hpp>
#include <redislock/detail/topology/sentinel_process_state.hpp>
#include <redislock/detail/topology/sentinel_protocol.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

// Starts this process's subscription threads (the constructor, once it found the
// master; a forked child at its first call).
inline void sentinel_follower::start_watcher() {
    watching = true;
    sentinel_process_state& l = this_process();
    std::lock_guard lock{l.mutex};
    start_watchers_locked(l);
}

// Needs `l.mutex`. One subscription thread per sentinel: only the sentinel that leads a
// failover announces its steps, and a hung sentinel must not hold up the others.
inline void sentinel_follower::start_watchers_locked(sentinel_process_state& l) {
    if (!watching || !l.watchers.empty()) {
        return;
    }
    for (std::size_t i = 0; i < config.sentinels.size(); ++i) {
        l.watchers.emplace_back([this, i](std::stop_token stop) { watch(stop, i); });
    }
}

/// What one subscription thread keeps across its links.
struct sentinel_follower::watcher_state {
    std::size_t index = 0;  ///< its sentinel
    /// A link of this thread subscribed before: a new one may have missed announcements.
    bool subscribed_before = false;
    /// Its own link for the queries about a failover its sentinel announced (no
    /// resolve_mutex, so that a resolution held up by another sentinel delays nothing).
    std::unique_ptr<hiredis_connection> query;
    clock::time_point next_check{};  ///< of the failover its sentinel announced
};

// The subscription thread of sentinel `index`: its announcements about the master,
// reconnecting after a pause whenever the link fails.
inline void sentinel_follower::watch(std::stop_token stop, std::size_t index) {
    using namespace std::chrono;
    const auto& where = config.sentinels[index];
    watcher_state w;
    w.index = index;
    while (!stop.stop_requested()) {
        try {
            hiredis_connection link{config.sentinel(where)};
            detail::context_ptr ctx = link.open_dedicated();
            if (!follow(*ctx, stop, w)) {
                return;
            }
        } catch (const std::exception&) {
            // Unreachable or failed sentinel: again after a pause.
        }
        std::mutex pause_mutex;
        std::condition_variable_any pause;
        std::unique_lock pause_lock{pause_mutex};
        for (int slice = 0; slice < 4 && !stop.stop_requested(); ++slice) {
            check_fence_if_due(w);
            pause.wait_for(pause_lock, stop, milliseconds{50}, [] { return false; });
        }
    }
}

// Reads one subscription until it fails (returns true: open it again) or a stop is
// requested (returns false). PINGs the sentinel so a hung one is noticed.
inline bool sentinel_follower::follow(redisContext& ctx, std::stop_token& stop, watcher_state& w) {
    using namespace std::chrono;
    constexpr milliseconds slice{50};
    constexpr milliseconds ping_every{1000};
    const milliseconds silence_limit = std::max(milliseconds{3000}, config.node.command_timeout);
    std::array<const char*, detail::sentinel_channels.size() + 1> argv{"SUBSCRIBE"};
    std::array<std::size_t, detail::sentinel_channels.size() + 1> lengths{9};
    for (std::size_t i = 0; i < detail::sentinel_channels.size(); ++i) {
        argv[i + 1] = detail::sentinel_channels[i].data();
        lengths[i + 1] = detail::sentinel_channels[i].size();
    }
    if (redisAppendCommandArgv(&ctx, static_cast<int>(argv.size()), argv.data(), lengths.data()) !=
        REDIS_OK) {
        return true;
    }
    auto last_heard = clock::now();
    auto last_ping = clock::now();
    for (int done = 0;;) {
        if (redisBufferWrite(&ctx, &done) != REDIS_OK) {
            return true;
        }
        if (done != 0) {
            break;
        }
    }
    bool confirmed = false;  // this link's first subscription was confirmed
    while (!stop.stop_requested()) {
        void* raw = nullptr;
        if (redisGetReplyFromReader(&ctx, &raw) != REDIS_OK) {
            return true;
        }
        if (raw != nullptr) {
            detail::hiredis_reply_ptr owned{raw};
            last_heard = clock::now();
            handle(detail::convert_reply(*static_cast<redisReply*>(raw)), w, confirmed);
            continue;
        }
        check_fence_if_due(w);
        const auto now = clock::now();
        if (now - last_heard > silence_limit) {
            return true;  // no pong: the sentinel hangs
        }
        if (now - last_ping >= ping_every) {
            last_ping = now;
            int done = 0;
            if (redisAppendCommand(&ctx, "PING") != REDIS_OK ||
                redisBufferWrite(&ctx, &done) != REDIS_OK) {
                return true;
            }
        }
        if (!detail::hiredis_tls_pending(ctx)) {
            pollfd pfd{ctx.fd, POLLIN, 0};
            const int ready = ::poll(&pfd, 1, static_cast<int>(slice.count()));
            if (ready <= 0) {
                continue;
            }
        }
        if (redisBufferRead(&ctx) != REDIS_OK) {
            return true;
        }
    }
    return false;
}

inline void sentinel_follower::handle(const reply& r, watcher_state& w, bool& confirmed) {
    if (!r.is_array() || r.elements().size() < 3 || !r.elements()[0].is_string()) {
        return;  // a pong, or a reply we do not act on
    }
    const std::string& kind = r.elements()[0].text();
    if (kind == "subscribe") {
        // Announcements made while this link was down may have been missed: check now.
        if (!confirmed && w.subscribed_before) {
            check_now();
        }
        confirmed = true;
        w.subscribed_before = true;
        return;
    }
    if (kind != "message" || !r.elements()[1].is_string() || !r.elements()[2].is_string()) {
        return;
    }
    const detail::sentinel_event e =
        detail::parse_sentinel_event(r.elements()[1].text(), r.elements()[2].text());
    if (e.master_name != config.master_name) {
        return;
    }
    switch (e.what) {
        case detail::sentinel_event::kind::switched:
            // The new master lifts the failover raised for the old one. (A sentinel
            // announces the switch to a master before any step about that master.)
            forget_departed(e.new_address);
            follow_switch(e.master_address, e.new_address);
            break;
        case detail::sentinel_event::kind::step:
            raise_fence(e.master_address, w);
            break;
        case detail::sentinel_event::kind::aborted:
            // The sentinel that leads a failover ended it without a switch: the master
            // stays. (A sentinel that was not elected to lead one says so too: that
            // says nothing of the failover its rival leads.)
            fence.lift(e.master_address, w.index);
            break;
        case detail::sentinel_event::kind::other:
            break;
    }
}

// Sentinel `w.index` announced a step of a failover of the master at `failing`: nothing
// more is sent to the master until the connection follows the next one or the failover
// ends. That holds for a master not followed yet too: a sentinel may take one just
// promoted for down before another announced the switch to it, and a connection that
// then followed it would send to a master whose writes the second failover loses.
inline void sentinel_follower::raise_fence(const std::string& failing, watcher_state& w) {
    // Under the mutex, so that no switch away from `failing` comes between the check
    // and the raise (it would leave the raise behind).
    sentinel_process_state& l = this_process();
    std::lock_guard lock{l.mutex};
    if (std::find(l.departed.begin(), l.departed.end(), failing) != l.departed.end()) {
        return;  // a master left already (a late announcement of a past failover)
    }
    // No failover lasts longer than the sentinels' failover-timeout for its promotion and
    // again for the replicas' reconfiguration: should every sentinel fall silent, calls
    // go on after that.
    const auto bound =
        2 * std::chrono::milliseconds{failover_timeout_ms.load()} + std::chrono::seconds{1};
    if (fence.raise(failing, w.index, bound)) {
        w.next_check = clock::now() + fence_check_every;
    }
}

// While a failover is raised, the subscription thread of the sentinel that announced it
// asks that sentinel, every fence_check_every, whether it is over, in case its
// announcement of the end was missed: it then names the next master, which is followed
// at once, or the same one with no failover in progress (aborted), and calls go on
// there. Only that sentinel is asked, and only on its own thread: no other sentinel,
// hung or slow, holds up the others' announcements.
inline void sentinel_follower::check_fence_if_due(watcher_state& w) {
    if (!fence.up() || clock::now() < w.next_check) {
        return;
    }
    const auto raised = fence.raised_by(w.index);
    if (raised.empty()) {
        return;
    }
    w.next_check = clock::now() + fence_check_every;
    const auto& where = config.sentinels[w.index];
    std::optional<detail::master_view> view;
    try {
        if (!w.query) {
            w.query = std::make_unique<hiredis_connection>(config.sentinel(where));
        }
        std::string why;
        const call_context bound{.deadline = clock::now() + config.node.command_timeout};
        view = ask(*w.query, where.host + ":" + std::to_string(where.port), why, bound);
    } catch (const error&) {
        w.query.reset();
        return;
    }
    if (!view) {
        return;
    }
    const std::string named = view->host + ":" + std::to_string(view->port);
    forget_departed(named);
    for (const auto& one : raised) {
        if (named != one.master) {
            // Switched: followed if it is the master in use, else simply over.
            follow_switch(one.master, named);
        } else if (view->epoch >= 0 && !view->failover_in_progress) {
            // Aborted: the master stays. (Only SENTINEL MASTER tells the flags: a view
            // from GET-MASTER-ADDR-BY-NAME, where ACLs allow only that, says nothing of
            // them.)
            fence.lift(one);
        }
    }
}

inline void sentinel_follower::check_now() {
    sentinel_process_state& l = this_process();
    std::uint64_t seen = 0;
    {
        std::lock_guard lock{l.mutex};
        seen = l.generation;
    }
    re_resolve(seen);  // a failure shows in the callers' next call
}
}  // namespace redislock::detail
