// detail::sentinel_process_state: what one process of a sentinel_connection knows of the master,
// and the threads and connections it keeps to follow it.
#pragma once

#include <poll.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/engine/reconnect_relay.hpp>
#include <redislock/detail/topology/failover_fence.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>
#include <redislock/sentinel_endpoint.hpp>
#include <redislock/subscriber.hpp>

namespace redislock::detail {

// What one process knows of the master, and the threads and connections it keeps to follow
// it. A forked child makes its own (detail/engine/per_process.hpp): a thread of the parent may
// have held its mutexes at the fork, in the middle of a search for the master, and the parent's
// subscription threads do not exist in the child. The child takes the parent's master if the
// parent's mutex was free at the fork (the pool opens its own connections in the child), and
// starts its own subscription threads at its first call.
struct sentinel_process_state {
    using clock = std::chrono::steady_clock;
    using pool_ptr = std::shared_ptr<hiredis_connection>;

    sentinel_process_state(std::size_t sentinels, sentinel_process_state* parent)
        : sentinel_links(sentinels) {
        if (parent != nullptr && parent->mutex.try_lock()) {
            master = parent->master;
            generation = parent->generation;
            last_master = parent->last_master;
            departed = parent->departed;
            parent->mutex.unlock();
            published_generation.store(generation, std::memory_order_release);
        }
    }
    sentinel_process_state(const sentinel_process_state&) = delete;
    sentinel_process_state& operator=(const sentinel_process_state&) = delete;

    ~sentinel_process_state() { stop_watchers(); }

    // All asked to stop first, then joined, without the mutex they take: each ends within
    // the sentinels' connect and command timeouts. Only once no call can start them again.
    void stop_watchers() {
        for (std::jthread& w : watchers) {
            w.request_stop();
        }
        for (std::jthread& w : watchers) {
            if (w.joinable()) {
                w.join();
            }
        }
    }

    std::mutex mutex;  // guards master, generation, last_master, departed, watchers
    pool_ptr master;
    std::uint64_t generation = 0;  // bumped whenever `master` is replaced or dropped
    // `generation` as subscriber links read it, without the mutex.
    std::atomic<std::uint64_t> published_generation{0};
    std::string last_master;  // "host:port" of the last confirmed master
    // The masters this process followed before the last one, most recent last (a few):
    // announcements of their failovers come late, about a switch already followed.
    std::vector<std::string> departed;
    std::vector<std::jthread> watchers;  // one per sentinel, once started

    std::timed_mutex resolve_mutex;  // one resolution at a time; guards what follows
    std::vector<std::unique_ptr<hiredis_connection>> sentinel_links;

    // Needs `mutex`.
    void bump_generation_locked() noexcept {
        ++generation;
        published_generation.store(generation, std::memory_order_release);
    }
};

}  // namespace redislock::detail
