// What every lock kind keeps about itself: its client, name and options, and the keys and
// channel derived from the name. Each kind's state extends it with what it tracks.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/detail/kinds/loss_handlers.hpp>
#include <redislock/detail/kinds/owner_id.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/lock_options.hpp>

namespace redislock::detail {

template <connection C>
struct lock_identity {
    using connection_type = C;

    /// @throws redislock::invalid_argument for a bad name or options.
    lock_identity(std::shared_ptr<client_core<C>> client, std::string_view lock_name,
                  lock_options opts)
        : core{std::move(client)},
          conn{&core->connection},
          name{lock_name},
          options{std::move(opts)},
          lease_text{options.lease.count()} {
        check_options(name, options);
        lost_handlers = share_loss_handlers(options);
        if constexpr (!pipelining_connection<C>) {
            if (options.min_replicas > 0) {
                throw invalid_argument{
                    "redislock: min_replicas needs a connection that pipelines (WAIT must follow "
                    "the write on the same connection)"};
            }
        }
        fence_key = derived_key(name, "fence");
        channel = derived_key(name, "released");
        queue_key = derived_key(name, "queue");
        lapse_key = derived_key(name, "waiting");
        grace_text = decimal{handoff_grace(options.lease).count()};
    }

    /// True when the calling thread is the one `holder` names (its thread_number(), which no
    /// later thread gets, where a std::thread::id is reused), or an explicit owner makes every
    /// caller the same owner.
    bool caller_is(std::uint64_t holder) const {
        return !options.owner.empty() || holder == thread_number();
    }

    /// The owner id of the calling thread, or of lock_options::owner (reentrant kinds).
    std::string caller_owner() const { return owner_id(core->instance_id, options.owner); }

    /// Calls `f` with the keys of an acquisition script (lua/*_acquire.lua), as a std::array: the
    /// lock, its queue and the queue's lapse times, then the fencing counter when the attempt
    /// may draw a token (`fenced`). A script declares every key it may touch and no other: on a
    /// slot being migrated a declared key that is missing makes the call wait (TRYAGAIN).
    template <class F>
    decltype(auto) with_acquisition_keys(bool fenced, F&& f) const {
        if (fenced) {
            return f(std::array<std::string_view, 4>{name, queue_key, lapse_key, fence_key});
        }
        return f(std::array<std::string_view, 3>{name, queue_key, lapse_key});
    }

    /// The keys of a release script and of lua/queue_leave.lua: the lock, its queue and the
    /// queue's lapse times.
    std::array<std::string_view, 3> queue_keys() const { return {name, queue_key, lapse_key}; }

    std::shared_ptr<client_core<C>> core;
    C* conn;
    std::string name;
    lock_options options;
    std::shared_ptr<const loss_handlers> lost_handlers;  // options' on_lost and on_lost_reason
    decimal lease_text;
    std::string fence_key;
    std::string channel;    // release messages: ids of the waiters that may go
    std::string queue_key;  // waiters in order (lua/_queue.lua)
    std::string lapse_key;  // when each waiter's entry lapses
    decimal grace_text{0};  // ms a waiter told to go has to come (waiting/acquire_in_line.hpp)
};

}  // namespace redislock::detail
