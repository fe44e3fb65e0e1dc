// detail::redlock_state: what a redlock lock object (basic_redlock_mutex) keeps about its
// acquisition and shares with its timer and watchdog callbacks: whether it is held, the
// acquisition (token and when its round was sent), holder thread and lease. Its books are kept
// under its own mutex, which is never held across a round; lease_tracker finds the lease through
// find_lease().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include <redislock/connection.hpp>
#include <redislock/detail/kinds/lease_tracker.hpp>
#include <redislock/detail/kinds/loss_handlers.hpp>
#include <redislock/detail/kinds/owner_id.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/topology/quorum_round.hpp>
#include <redislock/detail/topology/redlock_core.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/error.hpp>
#include <redislock/lock_options.hpp>

namespace redislock::detail {

// What a redlock lock object shares with its timer and watchdog callbacks.
template <connection C>
struct redlock_state {
    using connection_type = C;
    using lease_key = token;  // an acquisition is named by its token

    redlock_state(std::shared_ptr<redlock_core<C>> client, std::string_view lock_name,
                  lock_options opts)
        : core{std::move(client)},
          name{lock_name},
          options{std::move(opts)},
          lease_text{options.lease.count()} {
        check_options(name, options);
        const auto node_timeout = core->options().node_timeout;
        if (options.lease <= node_timeout + options.lease / 100 + std::chrono::milliseconds{2}) {
            throw invalid_argument{
                "redislock: a redlock lease must exceed redlock_options::node_timeout (" +
                std::to_string(node_timeout.count()) +
                " ms) plus the drift allowance, or no acquisition could ever be valid"};
        }
        if (options.fencing) {
            throw invalid_argument{
                "redislock: a redlock lock cannot offer fencing tokens: no single counter "
                "orders acquisitions made on independent masters, so the tokens would not "
                "reliably grow (use a single-master client for '" +
                name + "')"};
        }
        options.min_replicas = 0;  // independent masters have no replicas to wait for
        channel = derived_key(name, "released");
        lost_handlers = share_loss_handlers(options);
    }

    bool caller_is_holder() const { return !options.owner.empty() || holder == thread_number(); }
    // Held by the parent this process was forked from: only the parent may release it.
    bool inherited_by_fork() const { return generation != current_fork_generation(); }
    const tracked_lease<C>* held_lease() const { return held ? &lease : nullptr; }
    // The tracked lease of the acquisition holding `t`, if it is still held.
    static tracked_lease<C>* find_lease(redlock_state& st, const token& t) {
        return st.held && st.acq && st.acq->tok == t ? &st.lease : nullptr;
    }

    // After the loss of the acquisition named `t` by expiry: releases it on every master in the
    // background, should renewals or an extend without a quorum have kept its key on some masters
    // past the validity the holder was told of (see lease_tracker::take_back).
    static void clean_up_expired(const std::shared_ptr<redlock_state>& st,
                                 const token& t) noexcept {
        std::shared_ptr<redlock_acquisition> lost;
        {
            std::lock_guard guard{st->mutex};
            if (st->acq && st->acq->tok == t) {
                lost = st->acq;
            }
        }
        if (lost) {
            try {
                st->core->release_in_background(lost, steady::now());
            } catch (...) {
                // Out of memory: the keys expire with their last renewal.
            }
        }
    }

    // An acquisition given up by unlock() or the destructor, to be released.
    struct given_up {
        std::shared_ptr<redlock_acquisition> acq;
        tracked_lease<C> lease;
    };

    // Marks the current acquisition as no longer held. Needs `mutex`.
    given_up give_up() noexcept {
        held = false;
        return {std::move(acq), std::exchange(lease, {})};
    }

    std::shared_ptr<redlock_core<C>> core;
    std::string name;
    lock_options options;
    std::shared_ptr<const loss_handlers> lost_handlers;  // options' on_lost and on_lost_reason
    decimal lease_text;
    std::string channel;

    mutable std::mutex mutex;  // guards the members below; never held across a round
    bool held = false;
    std::shared_ptr<redlock_acquisition> acq;
    std::uint64_t holder = 0;       // thread_number() of the holder thread (see lock_identity)
    std::thread::id holder_thread;  // the same thread, as unlock_refused events name it
    std::uint64_t generation = 0;
    tracked_lease<C> lease;
    // The last acquisition's, kept after unlock(): see lost_token().
    std::stop_source lost_source;
};

}  // namespace redislock::detail
