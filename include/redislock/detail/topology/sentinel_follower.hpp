// detail::sentinel_follower: what a sentinel_connection shares between its copies and processes,
// and how it follows the master: finding it through the sentinels, confirming it with ROLE, the
// subscription threads that hear of failovers, and the failover fence that holds calls back
// while one is under way. The subscription threads' members are defined in
// sentinel_watchers.hpp, included at the end.
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
#include <numeric>
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
#include <redislock/detail/topology/sentinel_process_state.hpp>
#include <redislock/detail/topology/sentinel_protocol.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>
#include <redislock/sentinel_endpoint.hpp>
#include <redislock/subscriber.hpp>

namespace redislock::detail {

struct sentinel_follower {
    using clock = std::chrono::steady_clock;
    using pool_ptr = std::shared_ptr<hiredis_connection>;

    explicit sentinel_follower(sentinel_endpoint c)
        : config{std::move(c)},
          processes{std::make_unique<detail::per_process<sentinel_process_state>>(
              std::function<std::unique_ptr<sentinel_process_state>(sentinel_process_state*)>{
                  [sentinels = config.sentinels.size()](sentinel_process_state* parent) {
                      return std::make_unique<sentinel_process_state>(sentinels, parent);
                  }})} {}

    // The subscription threads are joined while everything they use is whole.
    ~sentinel_follower() { this_process().stop_watchers(); }
    sentinel_follower(const sentinel_follower&) = delete;
    sentinel_follower& operator=(const sentinel_follower&) = delete;

    sentinel_endpoint config;

    // Before the master's pool, which reports to it until it closes.
    detail::reconnect_relay reconnect;

    std::atomic<std::uint64_t> switches{0};

    // A failover of the master announced and not yet followed (see "Failovers under way").
    // Fork-safe by itself: a child forked during a failover still holds its calls back.
    detail::failover_fence fence;
    // The sentinels' failover-timeout, as SENTINEL MASTER last said (ms).
    std::atomic<long long> failover_timeout_ms{180'000};
    // Set by the constructor (an eager one once it found the master): every process then runs
    // subscription threads. Written before the connection is shared.
    bool watching = false;

    // This process's master, subscription threads and sentinel links (see sentinel_process_state).
    std::unique_ptr<detail::per_process<sentinel_process_state>> processes;

    // This process's.
    sentinel_process_state& this_process() { return processes->get(); }

    // Returns once no failover of the master is under way, with the count of disturbances
    // read before that was checked: raise() marks a failover up before it counts it, so one
    // raised after the check is counted after this value, and the reply it disturbs is not
    // returned. A call that cannot wait that long (its deadline, or for an untimed one the
    // command timeout) throws timeout_error, and one stopped meanwhile cancelled_error.
    // `again`: the command was sent once before.
    std::uint64_t await_settled(clock::time_point deadline, const std::stop_token* stop,
                                bool again) {
        for (;;) {
            const std::uint64_t disturbances = fence.disturbances();
            if (!fence.up() || !fence.raised()) {
                return disturbances;  // (up, but past its bound: not raised)
            }
            wait_lifted(deadline, stop, again);
        }
    }

    void wait_lifted(clock::time_point deadline, const std::stop_token* stop, bool again) {
        {
            // A child forked during a failover inherits it raised: its own subscription
            // threads, started here rather than on its first use of the master, lift it.
            sentinel_process_state& l = this_process();
            std::lock_guard lock{l.mutex};
            start_watchers_locked(l);
        }
        const auto until = deadline != clock::time_point::max()
                               ? deadline
                               : clock::now() + config.node.command_timeout;
        if (fence.wait_lifted(until, stop)) {
            return;
        }
        const auto raised = fence.raised();
        const std::string what = "a failover of '" + config.master_name + "'" +
                                 (raised ? " (" + raised->master + ")" : std::string{}) +
                                 " is under way";
        const std::string sent =
            again ? "; the command, sent before it was announced, was not sent again: its "
                    "outcome is unknown"
                  : ": nothing is sent to the master until the sentinels name the next one";
        if (stop != nullptr && stop->stop_requested()) {
            throw cancelled_error{"redislock: stopped while " + what + sent};
        }
        throw timeout_error{"redislock: " + what + sent};
    }

    // The master's pool and the generation it belongs to; resolves when there is none.
    std::pair<pool_ptr, std::uint64_t> current(
        clock::time_point deadline = clock::time_point::max(),
        const std::stop_token* stop = nullptr) {
        sentinel_process_state& l = this_process();
        std::uint64_t seen = 0;
        {
            std::lock_guard lock{l.mutex};
            start_watchers_locked(l);
            if (l.master) {
                return {l.master, l.generation};
            }
            seen = l.generation;
        }
        resolve(seen, deadline, stop);
        std::lock_guard lock{l.mutex};
        if (!l.master) {
            throw connection_error{"redislock: no master for '" + config.master_name +
                                   "' through the sentinels " + config.describe()};
        }
        return {l.master, l.generation};
    }

    // The pool of generation `seen` failed: find the master again, unless another thread did
    // since. A failure here is left to the next current(), which reports it.
    void re_resolve(std::uint64_t seen, clock::time_point deadline = clock::time_point::max(),
                    const std::stop_token* stop = nullptr) noexcept {
        try {
            resolve(seen, deadline, stop);
        } catch (...) {
        }
    }

    // Finds the master again; a new pool in place of an earlier master's is reported as a
    // reconnection, and so is a connection the kept pool reopened while confirming it, once
    // resolve_mutex is released (the deferral ends after it).
    void resolve(std::uint64_t seen, clock::time_point deadline, const std::stop_token* stop) {
        const auto deferred = reconnect.defer();
        const std::string reopened = resolve_serially(seen, deadline, stop);
        if (!reopened.empty()) {
            reconnect.report(reopened);
        }
    }

    // The reconnect handler of a master's pool: reports only while the pool is the master's.
    // A caller that took a pool before a switch may reopen a connection to the old, demoted
    // master afterwards; that is not a reconnection to the master.
    std::function<void(std::string_view)> forward_while_current(const hiredis_connection* pool) {
        return [this, pool](std::string_view server) {
            {
                sentinel_process_state& l = this_process();
                std::lock_guard lock{l.mutex};
                if (l.master.get() != pool) {
                    return;
                }
            }
            reconnect.report(server);
        };
    }

    // Each round trip (connecting included: pools open on first use) is bounded by
    // `deadline` and ends at once when *stop is requested; a caller whose deadline passes
    // (or whose stop is requested) while another thread resolves stops waiting for it.
    // Returns the master's address when a new pool replaced an earlier master's (not for the
    // first master found), else "".
    std::string resolve_serially(std::uint64_t seen, clock::time_point deadline,
                                 const std::stop_token* stop) {
        sentinel_process_state& l = this_process();
        std::unique_lock serial{l.resolve_mutex, std::defer_lock};
        if (deadline == clock::time_point::max() && (stop == nullptr || !stop->stop_possible())) {
            serial.lock();
        } else {
            constexpr std::chrono::milliseconds stop_check{5};
            while (!serial.try_lock_until(std::min(deadline, clock::now() + stop_check))) {
                // The search under way has not concluded: say why this call did not wait
                // for it (with no master, "no master" would be a guess).
                if (stop != nullptr && stop->stop_requested()) {
                    throw cancelled_error{
                        "redislock: stopped while waiting for a search for "
                        "the master '" +
                        config.master_name + "' under way"};
                }
                if (clock::now() >= deadline) {
                    throw timeout_error{"redislock: a search for the master '" +
                                        config.master_name + "' under way did not end in time"};
                }
            }
        }
        const call_context bound{.deadline = deadline, .stop = stop};
        pool_ptr kept;
        {
            std::lock_guard lock{l.mutex};
            if (l.generation != seen) {
                return {};
            }
            kept = l.master;
        }
        std::string why;
        std::vector<std::string> tried;
        for (const detail::master_view& view : ask_sentinels(l, why, bound)) {
            const std::string address = view.host + ":" + std::to_string(view.port);
            if (std::find(tried.begin(), tried.end(), address) != tried.end()) {
                continue;  // several sentinels name the same node: one check is enough
            }
            tried.push_back(address);
            try {
                const bool same =
                    kept && kept->config().host == view.host && kept->config().port == view.port;
                pool_ptr pool = same ? kept : open_pool(view.host, view.port);
                if (!answers_as_master(*pool, bound)) {
                    why += " " + address + " is not a master;";
                    continue;
                }
                std::lock_guard lock{l.mutex};
                if (l.generation != seen) {
                    return {};  // a switch announced meanwhile was followed: it is newer
                }
                return publish_locked(l, address, std::move(pool));
            } catch (const cancelled_error&) {
                throw;  // says nothing about the master: keep it
            } catch (const error& e) {
                why += std::string{" "} + e.what() + ";";
            }
        }
        if (clock::now() >= deadline) {
            // The caller ran out of time, which says nothing about the master: keep it.
            throw timeout_error{"redislock: finding the master '" + config.master_name +
                                "' through the sentinels did not finish in time:" + why};
        }
        {
            std::lock_guard lock{l.mutex};
            if (l.master && l.generation == seen) {
                l.master.reset();
                l.bump_generation_locked();
            }
        }
        throw connection_error{"redislock: no sentinel of " + config.describe() +
                               " named a reachable master '" + config.master_name + "':" + why};
    }

    // A pool to the node at `address` ("host:port", as the sentinels name it), reporting to
    // the reconnect handler while it is the master's.
    pool_ptr open_pool(const std::string& host, int port) {
        endpoint ep = config.node;
        ep.host = host;
        ep.port = port;
        ep.unix_socket.clear();
        // Not connected yet: the caller's first command connects, within its deadline.
        auto pool = std::make_shared<hiredis_connection>(std::move(ep), defer_connect);
        // Before the pool is published: no other thread can be using it yet.
        pool->set_reconnect_handler(forward_while_current(pool.get()));
        return pool;
    }

    // Needs `l.mutex`. Makes `pool`, confirmed a master at `address`, the master in use;
    // returns its address when it replaced an earlier master's pool (a reconnection to
    // report), else "".
    std::string publish_locked(sentinel_process_state& l, const std::string& address,
                               pool_ptr pool) {
        // Everything that may throw comes before the first change.
        constexpr std::size_t remembered = 8;
        const bool first = l.last_master.empty();
        const bool moved = !first && l.last_master != address;
        std::string next = address;
        std::string reopened =
            !first && l.master != pool ? pool->config().describe() : std::string{};
        l.departed.reserve(remembered + 1);
        if (moved) {
            switches.fetch_add(1, std::memory_order_relaxed);
            fence.note_switch();  // what is under way on the old master is disturbed
            if (l.departed.size() >= remembered) {
                l.departed.erase(l.departed.begin());
            }
            l.departed.push_back(std::move(l.last_master));
        }
        std::erase(l.departed, address);
        l.last_master = std::move(next);
        if (l.master != pool) {
            l.master = std::move(pool);
            l.bump_generation_locked();
        }
        if (moved) {
            // The failover of the master left is followed: calls go on here, unless this
            // master's own failover was announced already (lifted when it is over). Should
            // this throw (out of memory in a forked child), the record stays to its bound.
            fence.lift_master(l.departed.back());
        }
        return reopened;
    }

    // A sentinel names `address` as the master (a switch to it, or its view): steps about it
    // from now on are news, even if this process followed it once before.
    void forget_departed(const std::string& address) {
        sentinel_process_state& l = this_process();
        std::lock_guard lock{l.mutex};
        std::erase(l.departed, address);
    }

    // A sentinel announced that the master in use was replaced by the one at `to`: check
    // that one (ROLE) and follow it at once, without asking the sentinels first, where a
    // sentinel that hangs would hold the switch back for its command timeout. When it does
    // not answer as a master, the sentinels are asked as after any failure.
    void follow_switch(const std::string& from, const std::string& to) {
        sentinel_process_state& l = this_process();
        std::uint64_t seen = 0;
        bool ours = false;  // the switch replaces the master in use
        bool followed = false;
        {
            std::lock_guard lock{l.mutex};
            followed = l.last_master == to;
            seen = l.generation;
            ours = l.last_master == from;
        }
        if (!ours) {
            fence.lift_master(from);  // its failover is over, and nothing goes there
        }
        if (followed) {
            return;
        }
        if (const auto colon = to.rfind(':'); ours && colon != std::string::npos) {
            try {
                pool_ptr pool = open_pool(to.substr(0, colon), std::atoi(to.c_str() + colon + 1));
                const call_context bound{.deadline = clock::now() + config.node.command_timeout};
                if (answers_as_master(*pool, bound)) {
                    const auto deferred = reconnect.defer();
                    std::string reopened;
                    {
                        std::lock_guard lock{l.mutex};
                        if (l.generation != seen) {
                            return;  // another check published a master meanwhile
                        }
                        reopened = publish_locked(l, to, std::move(pool));
                    }
                    if (!reopened.empty()) {
                        reconnect.report(reopened);
                    }
                    return;
                }
            } catch (const error&) {
                // Not reachable yet: the sentinels are asked.
            }
        }
        re_resolve(seen);
    }

    // Every reachable sentinel's view, the newest config epoch first; on a tie, views of a
    // sentinel that is not leading a failover come first (a leader shows the new epoch with
    // the old address until its failover ends, while the others already name the new master
    // it announced, and a forced failover's old master still answers ROLE as a master).
    // Needs `l.resolve_mutex`.
    // Those that answered last time are asked first (a failed one's link is dropped), and each
    // gets at most an equal share of the call's time left, one share kept for the master's
    // ROLE: a sentinel that hangs cannot spend the whole call, however often it is asked.
    std::vector<detail::master_view> ask_sentinels(sentinel_process_state& l, std::string& why,
                                                   const call_context& bound) {
        std::vector<std::size_t> order(config.sentinels.size());
        std::iota(order.begin(), order.end(), std::size_t{0});
        std::stable_partition(order.begin(), order.end(),
                              [&](std::size_t i) { return l.sentinel_links[i] != nullptr; });
        std::vector<detail::master_view> views;
        for (std::size_t k = 0; k < order.size(); ++k) {
            const std::size_t i = order[k];
            const auto& where = config.sentinels[i];
            const std::string name = where.host + ":" + std::to_string(where.port);
            call_context share = bound;
            if (bound.deadline != clock::time_point::max()) {
                const auto now = clock::now();
                const auto shares = static_cast<clock::rep>(order.size() - k + 1);
                share.deadline =
                    bound.deadline <= now ? bound.deadline : now + (bound.deadline - now) / shares;
            }
            try {
                if (!l.sentinel_links[i]) {
                    l.sentinel_links[i] =
                        std::make_unique<hiredis_connection>(config.sentinel(where), defer_connect);
                }
                if (auto view = ask(*l.sentinel_links[i], name, why, share)) {
                    views.push_back(std::move(*view));
                }
            } catch (const cancelled_error&) {
                throw;
            } catch (const error& e) {
                l.sentinel_links[i].reset();
                why += " sentinel " + name + ": " + e.what() + ";";
            }
        }
        std::stable_sort(views.begin(), views.end(), [](const auto& a, const auto& b) {
            if (a.epoch != b.epoch) {
                return a.epoch > b.epoch;
            }
            return !a.failover_in_progress && b.failover_in_progress;
        });
        return views;
    }

    std::optional<detail::master_view> ask(hiredis_connection& sentinel, const std::string& name,
                                           std::string& why, const call_context& bound) {
        const std::array<std::string_view, 3> master_cmd{"SENTINEL", "MASTER", config.master_name};
        const reply r = sentinel.execute(master_cmd, bound);
        if (r.is_array()) {
            detail::master_view view;
            const auto& fields = r.elements();
            for (std::size_t k = 0; k + 1 < fields.size(); k += 2) {
                if (!fields[k].is_string() || !fields[k + 1].is_string()) {
                    continue;
                }
                const std::string& key = fields[k].text();
                const std::string& value = fields[k + 1].text();
                if (key == "ip") {
                    view.host = value;
                } else if (key == "port") {
                    view.port = std::atoi(value.c_str());
                } else if (key == "config-epoch") {
                    view.epoch = std::atoll(value.c_str());
                } else if (key == "flags") {
                    view.failover_in_progress =
                        value.find("failover_in_progress") != std::string::npos;
                } else if (key == "failover-timeout") {
                    if (const long long ms = std::atoll(value.c_str()); ms > 0) {
                        failover_timeout_ms.store(ms, std::memory_order_relaxed);
                    }
                }
            }
            if (!view.host.empty() && view.port > 0) {
                return view;
            }
            why += " sentinel " + name + " gave no address;";
            return std::nullopt;
        }
        if (r.is_error() && r.text().find("No such master") == std::string::npos) {
            // An ACL may allow only the command the Sentinel client guidelines name.
            const std::array<std::string_view, 3> addr_cmd{"SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                                           config.master_name};
            const reply a = sentinel.execute(addr_cmd, bound);
            if (a.is_array() && a.elements().size() == 2 && a.elements()[0].is_string() &&
                a.elements()[1].is_string()) {
                return detail::master_view{a.elements()[0].text(),
                                           std::atoi(a.elements()[1].text().c_str()), -1};
            }
        }
        why += " sentinel " + name + " does not know '" + config.master_name + "'" +
               (r.is_error() ? " (" + r.text() + ")" : std::string{}) + ";";
        return std::nullopt;
    }

    // The subscription threads, one per sentinel, that hear of failovers and raise and lift the
    // fence: sentinel_watchers.hpp.
    void start_watcher();
    void start_watchers_locked(sentinel_process_state& l);
    struct watcher_state;
    void watch(std::stop_token stop, std::size_t index);
    bool follow(redisContext& ctx, std::stop_token& stop, watcher_state& w);
    void handle(const reply& r, watcher_state& w, bool& confirmed);
    void raise_fence(const std::string& failing, watcher_state& w);
    static constexpr std::chrono::milliseconds fence_check_every{250};
    void check_fence_if_due(watcher_state& w);
    void check_now();
};

}  // namespace redislock::detail

#include <redislock/detail/topology/sentinel_watchers.hpp>
