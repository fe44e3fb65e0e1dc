// redislock::sentinel_connection: the master that Redis Sentinel names, followed across failovers.
//
//   redislock::sentinel_client client{"redis-sentinel://10.0.0.1:26379,10.0.0.2:26379/0#mymaster"};
//
// The URI and its options are described in sentinel_endpoint.hpp.
//
// How the master is found: every reachable sentinel is asked for its view of the master
// (SENTINEL MASTER, or SENTINEL GET-MASTER-ADDR-BY-NAME where ACLs allow only that), the view
// with the highest config epoch wins (a sentinel that has not yet heard of a failover reports an
// older epoch), and the node it names must answer ROLE with "master". A pool of
// hiredis_connection contexts is then kept to that node. Done for a call with a deadline or a
// stop token, every step of this (connecting to a sentinel or to the node included: those pools
// open on first use) gets no more than the time the call has left, and a stop request ends it.
//
// When the master changes: a background thread keeps a subscription to +switch-master on one
// reachable sentinel (moving to the next one when it fails or stops answering its PINGs) and
// re-resolves as soon as a switch is announced; a call that gets a READONLY reply or a
// connection error re-resolves too. A demoted master is never used again: on a switch the old
// pool is dropped (calls already in flight on it finish there), and when no sentinel confirms a
// master the pool is dropped as well, so calls fail until one does.
//
// Retries: a call that fails that way re-resolves and is retried once, within its deadline,
// when that is safe: after READONLY always (the node did not run the command); after a
// connection error or timeout (the command may have run) only for commands whose repetition
// cannot do harm: reads (GET, PTTL, EXISTS, PING, TIME, ROLE), SCRIPT, PUBLISH, WAIT, SET with NX
// (a repeat can only fail), and scripts (EVAL/EVALSHA). The library's lock scripts are all
// compare-and-act on the caller's token: running one twice acts at most once, so retrying them
// is safe. A pipeline is retried only when each of its commands is. Scripts of your own sent
// through this connection are retried too: they must be safe to run twice.
//
// Reconnections: the reconnect handler (set_reconnect_handler), which a sentinel_client turns
// into a reconnected event, is told the master's address ("host:port") when
// - the master's pool opens a connection to replace one that broke (as hiredis_connection does),
//   while that pool is still the master's: a caller that took the pool before a switch and
//   reconnects to the old, demoted master afterwards is not reported;
// - the connection opens a pool to the master in place of an earlier one: a switch to a new
//   master (one per address change, as counted by switches()), or the same master confirmed
//   again after no sentinel could confirm it and its pool was dropped. Finding the first master,
//   in the constructor, is not a reconnection.
// The handler runs with no internal lock held (a report made while the master is being resolved
// waits until the resolution ends), on the thread whose call opened the connection or the pool:
// a caller's, or the subscription thread when a check it makes after +switch-master (or after
// resubscribing) opens a pool to a new master or reopens a connection of the master's pool.
// Connections to the sentinels themselves (the queries and the +switch-master subscription,
// which is reopened on another sentinel whenever it fails) are never reported: a sentinel that
// restarts or hangs would flood the handler with events that say nothing about the master.
//
// What this does not do: a failover loses writes the old master had not yet replicated, and
// clients of other processes learn of a switch at slightly different times, so for a moment
// two masters may both accept a lock. Only replica acknowledgement narrows that.
//
// Thread safety: every member may be called from any number of threads.
// Lifetime: movable, not copyable. The destructor stops and joins the subscription thread
// (within the sentinels' connect and command timeouts).
// fork(): a child never uses its parent's sockets or thread: the pools drop inherited contexts,
// and the child starts its own subscription thread on its first call. As with any library that
// uses threads, fork from a quiet moment (not during a failover the parent is following).
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
#include <redislock/detail/reconnect_relay.hpp>
#include <redislock/detail/token.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>
#include <redislock/sentinel_endpoint.hpp>

namespace redislock {

namespace detail {

inline bool equals_ignoring_case(std::string_view a, std::string_view b) noexcept {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::toupper(static_cast<unsigned char>(x)) ==
                      std::toupper(static_cast<unsigned char>(y));
           });
}

/// Whether sending `argv` a second time, after a first attempt whose outcome is unknown, can do
/// no harm (see "Retries" at the top of this header).
inline bool safe_to_repeat(command argv) noexcept {
    if (argv.empty()) {
        return false;
    }
    constexpr std::array<std::string_view, 14> repeatable{
        "EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "SCRIPT", "GET",     "PTTL",
        "EXISTS",  "PING", "TIME",       "ROLE",    "WAIT",   "PUBLISH", "SPUBLISH"};
    for (std::string_view name : repeatable) {
        if (equals_ignoring_case(argv[0], name)) {
            return true;
        }
    }
    if (equals_ignoring_case(argv[0], "SET")) {
        return std::any_of(argv.begin() + 1, argv.end(),
                           [](std::string_view arg) { return equals_ignoring_case(arg, "NX"); });
    }
    return false;
}

inline bool is_readonly(const reply& r) {
    return r.is_error() && r.text().starts_with("READONLY");
}

/// One sentinel's view of the master.
struct master_view {
    std::string host;
    int port = 0;
    long long epoch = -1;  ///< -1: not known (GET-MASTER-ADDR-BY-NAME)
    /// The sentinel leads a failover of this master: until it ends, it may show the new config
    /// epoch with the old master's address while the others already name the new master.
    bool failover_in_progress = false;
};

}  // namespace detail

/// A connection to the master that Redis Sentinel names: asks the sentinels, follows failovers,
/// never keeps using a demoted master. Thread-safe.
class sentinel_connection {
public:
    /// Finds the master at once, so unreachable sentinels or an unknown master name fail here,
    /// and starts the subscription thread.
    /// @throws redislock::connection_error when no sentinel names a master that answers ROLE
    ///         with "master"; redislock::invalid_argument for a bad URI or settings, or
    ///         rediss-sentinel:// in a build without TLS.
    explicit sentinel_connection(sentinel_endpoint config)
        : state_{std::make_unique<state>(std::move(config))} {
        if (state_->config.sentinels.empty()) {
            throw invalid_argument{"redislock: a sentinel_endpoint needs at least one sentinel"};
        }
        if (state_->config.master_name.empty()) {
            throw invalid_argument{"redislock: a sentinel_endpoint needs a master name"};
        }
        detail::check_connection_settings(state_->config.node);
        state_->config.node.check_tls();
        detail::require_tls_support(state_->config.node);
        (void)state_->current();
        state_->start_watcher();
    }

    /// @throws redislock::invalid_argument for a malformed URI; else as the other constructor.
    explicit sentinel_connection(std::string_view uri)
        : sentinel_connection{sentinel_endpoint::from_uri(uri)} {}

    /// Takes over another connection's sentinels and master.
    sentinel_connection(sentinel_connection&&) noexcept = default;
    /// Takes over another connection's sentinels and master.
    sentinel_connection& operator=(sentinel_connection&&) noexcept = default;
    ~sentinel_connection() = default;

    /// Sends one command to the current master (see "Retries" above).
    /// @throws redislock::connection_error, redislock::timeout_error
    reply execute(command argv) {
        return call(detail::safe_to_repeat(argv), no_deadline(), nullptr,
                    [&](hiredis_connection& c) { return c.execute(argv); });
    }

    /// As execute(argv), ending by how.deadline or when *how.stop is requested; a retry happens
    /// only while the deadline has not passed.
    /// @throws redislock::connection_error, redislock::timeout_error, redislock::cancelled_error
    reply execute(command argv, const call_context& how) {
        return call(how.repeatable && detail::safe_to_repeat(argv), how.deadline, how.stop,
                    [&](hiredis_connection& c) { return c.execute(argv, how); });
    }

    /// Sends every command to the current master in one round trip.
    std::vector<reply> execute_pipeline(std::span<const command> commands) {
        return call(all_safe(commands), no_deadline(), nullptr,
                    [&](hiredis_connection& c) { return c.execute_pipeline(commands); });
    }

    /// As execute_pipeline(commands), bounded by the earliest deadline of `hows`.
    std::vector<reply> execute_pipeline(std::span<const command> commands,
                                        std::span<const call_context> hows) {
        auto deadline = no_deadline();
        const std::stop_token* stop = nullptr;
        for (const call_context& how : hows) {
            deadline = std::min(deadline, how.deadline);
            if (stop == nullptr) {
                stop = how.stop;
            }
        }
        const bool repeatable = std::all_of(hows.begin(), hows.end(),
                                            [](const call_context& how) { return how.repeatable; });
        return call(repeatable && all_safe(commands), deadline, stop,
                    [&](hiredis_connection& c) { return c.execute_pipeline(commands, hows); });
    }

    /// A subscriber link to the master in use now (see subscriber.hpp); after a failover the
    /// notifier finds its link broken and opens one to the new master.
    /// @throws redislock::connection_error when no master can be found
    std::unique_ptr<subscriber_link> open_subscriber(std::string_view channel) {
        return state_->current().first->open_subscriber(channel);
    }

    /// The master in use now, resolving it first if there is none.
    /// @throws redislock::connection_error when no master can be found
    endpoint master() { return state_->current().first->config(); }

    /// How many times this connection moved to another master (a master confirmed at another
    /// address than the one before it).
    std::uint64_t switches() const noexcept {
        return state_->switches.load(std::memory_order_relaxed);
    }

    /// The settings the connection was made with.
    const sentinel_endpoint& config() const noexcept { return state_->config; }

    /// Calls `handler` with the master's address ("host:port") each time the connection
    /// reconnects to the master: its pool replaced a connection that broke, or a pool was opened
    /// to a new master (or to the same one, after it had been dropped) in place of the earlier
    /// one; see "Reconnections" at the top of this header. Called with no internal lock held, so
    /// it may call back into the connection, on the thread whose call opened the connection or
    /// the pool: a caller's, or the subscription thread when one of its checks did. Connections
    /// to the sentinels are not reported. May be called at any time, from any thread; an empty
    /// handler stops the reports, but a report already under way when set() returns may still
    /// run the handler it replaced. What it throws is dropped.
    void set_reconnect_handler(std::function<void(std::string_view server)> handler) {
        state_->reconnect.set(std::move(handler));
    }

private:
    using clock = std::chrono::steady_clock;
    using pool_ptr = std::shared_ptr<hiredis_connection>;

    static clock::time_point no_deadline() noexcept { return clock::time_point::max(); }

    static bool all_safe(std::span<const command> commands) noexcept {
        return std::all_of(commands.begin(), commands.end(), detail::safe_to_repeat);
    }

    static bool readonly_reply(const reply& r) { return detail::is_readonly(r); }
    static bool readonly_reply(const std::vector<reply>& rs) {
        return std::any_of(rs.begin(), rs.end(), detail::is_readonly);
    }

    // Runs `f` on the current master's pool; on READONLY or a connection error re-resolves, and
    // retries once if that is safe and the deadline allows. Finding the master ends by `deadline`
    // too, and at once when *stop is requested.
    template <class F>
    std::invoke_result_t<F&, hiredis_connection&> call(bool repeatable, clock::time_point deadline,
                                                       const std::stop_token* stop, F&& f) {
        auto [pool, generation] = state_->current(deadline, stop);
        try {
            auto result = f(*pool);
            if (!readonly_reply(result)) {
                return result;
            }
            // The node was demoted. A command refused with READONLY did not run, so a single one
            // may always be sent again; in a pipeline the others may have run.
            state_->re_resolve(generation, deadline, stop);
            if (!(repeatable || single(result)) || clock::now() >= deadline) {
                return result;
            }
        } catch (const cancelled_error&) {
            throw;
        } catch (const connection_error&) {
            state_->re_resolve(generation, deadline, stop);
            if (!repeatable || clock::now() >= deadline) {
                throw;
            }
        }
        return f(*state_->current(deadline, stop).first);
    }

    static bool single(const reply&) noexcept { return true; }
    static bool single(const std::vector<reply>& rs) noexcept { return rs.size() == 1; }

    struct state {
        explicit state(sentinel_endpoint c) : config{std::move(c)} {
            sentinel_links.resize(config.sentinels.size());
        }

        ~state() { stop_watcher(); }

        sentinel_endpoint config;

        // Before the master's pool, which reports to it until it closes.
        detail::reconnect_relay reconnect;

        std::mutex mutex;  // guards master, generation, watcher, fork_seen
        pool_ptr master;
        std::uint64_t generation = 0;  // bumped whenever `master` is replaced or dropped
        std::atomic<std::uint64_t> switches{0};
        std::string last_master;  // "host:port" of the last confirmed master
        std::jthread watcher;
        std::uint64_t fork_seen = detail::current_fork_generation();

        std::timed_mutex resolve_mutex;  // one resolution at a time; guards what follows
        std::vector<std::unique_ptr<hiredis_connection>> sentinel_links;

        // The master's pool and the generation it belongs to; resolves when there is none.
        std::pair<pool_ptr, std::uint64_t> current(
            clock::time_point deadline = clock::time_point::max(),
            const std::stop_token* stop = nullptr) {
            std::uint64_t seen = 0;
            {
                std::lock_guard lock{mutex};
                restart_watcher_after_fork();
                if (master) {
                    return {master, generation};
                }
                seen = generation;
            }
            resolve(seen, deadline, stop);
            std::lock_guard lock{mutex};
            if (!master) {
                throw connection_error{"redislock: no master for '" + config.master_name +
                                       "' through the sentinels " + config.describe()};
            }
            return {master, generation};
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
        std::function<void(std::string_view)> forward_while_current(
            const hiredis_connection* pool) {
            return [this, pool](std::string_view server) {
                {
                    std::lock_guard lock{mutex};
                    if (master.get() != pool) {
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
            std::unique_lock serial{resolve_mutex, std::defer_lock};
            if (deadline == clock::time_point::max() &&
                (stop == nullptr || !stop->stop_possible())) {
                serial.lock();
            } else {
                constexpr std::chrono::milliseconds stop_check{5};
                while (!serial.try_lock_until(std::min(deadline, clock::now() + stop_check))) {
                    if (clock::now() >= deadline || (stop != nullptr && stop->stop_requested())) {
                        return {};
                    }
                }
            }
            const call_context bound{.deadline = deadline, .stop = stop};
            pool_ptr kept;
            {
                std::lock_guard lock{mutex};
                if (generation != seen) {
                    return {};
                }
                kept = master;
            }
            std::string why;
            std::vector<std::string> tried;
            for (const detail::master_view& view : ask_sentinels(why, bound)) {
                const std::string address = view.host + ":" + std::to_string(view.port);
                if (std::find(tried.begin(), tried.end(), address) != tried.end()) {
                    continue;  // several sentinels name the same node: one check is enough
                }
                tried.push_back(address);
                try {
                    pool_ptr pool;
                    if (kept && kept->config().host == view.host &&
                        kept->config().port == view.port) {
                        pool = kept;
                    } else {
                        endpoint ep = config.node;
                        ep.host = view.host;
                        ep.port = view.port;
                        ep.unix_socket.clear();
                        pool = std::make_shared<hiredis_connection>(std::move(ep), defer_connect);
                        // Before the pool is published: no other thread can be using it yet.
                        pool->set_reconnect_handler(forward_while_current(pool.get()));
                    }
                    const std::array<std::string_view, 1> role{"ROLE"};
                    const reply r = pool->execute(role, bound);
                    if (!r.is_array() || r.elements().empty() || !r.elements()[0].is_string() ||
                        r.elements()[0].text() != "master") {
                        why += " " + address + " is not a master;";
                        continue;
                    }
                    std::lock_guard lock{mutex};
                    const bool first = last_master.empty();
                    if (!first && last_master != address) {
                        switches.fetch_add(1, std::memory_order_relaxed);
                    }
                    last_master = address;
                    if (master == pool) {
                        return {};
                    }
                    master = std::move(pool);
                    ++generation;
                    return first ? std::string{} : master->config().describe();
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
                std::lock_guard lock{mutex};
                if (master) {
                    master.reset();
                    ++generation;
                }
            }
            throw connection_error{"redislock: no sentinel of " + config.describe() +
                                   " named a reachable master '" + config.master_name + "':" + why};
        }

        // Every reachable sentinel's view, the newest config epoch first; on a tie, views of a
        // sentinel that is not leading a failover come first (a leader shows the new epoch with
        // the old address until its failover ends, while the others already name the new master
        // it announced, and a forced failover's old master still answers ROLE as a master).
        std::vector<detail::master_view> ask_sentinels(std::string& why,
                                                       const call_context& bound) {
            std::vector<detail::master_view> views;
            for (std::size_t i = 0; i < config.sentinels.size(); ++i) {
                const auto& where = config.sentinels[i];
                const std::string name = where.host + ":" + std::to_string(where.port);
                try {
                    if (!sentinel_links[i]) {
                        sentinel_links[i] = std::make_unique<hiredis_connection>(
                            config.sentinel(where), defer_connect);
                    }
                    if (auto view = ask(*sentinel_links[i], name, why, bound)) {
                        views.push_back(std::move(*view));
                    }
                } catch (const cancelled_error&) {
                    throw;
                } catch (const error& e) {
                    sentinel_links[i].reset();
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

        std::optional<detail::master_view> ask(hiredis_connection& sentinel,
                                               const std::string& name, std::string& why,
                                               const call_context& bound) {
            const std::array<std::string_view, 3> master_cmd{"SENTINEL", "MASTER",
                                                             config.master_name};
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
                const std::array<std::string_view, 3> addr_cmd{
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", config.master_name};
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

        void start_watcher() {
            std::lock_guard lock{mutex};
            watcher = std::jthread{[this](std::stop_token stop) { watch(stop); }};
        }

        void stop_watcher() {
            std::jthread finished;
            {
                std::lock_guard lock{mutex};
                if (fork_seen != detail::current_fork_generation()) {
                    if (watcher.joinable()) {
                        watcher.detach();  // the parent's thread, absent in this process
                    }
                    return;
                }
                finished = std::move(watcher);
            }
            // jthread's destructor requests the stop and joins, outside the mutex the thread
            // takes while resolving.
        }

        // In a forked child the parent's thread does not exist: forget it, start our own.
        void restart_watcher_after_fork() {
            const auto now = detail::current_fork_generation();
            if (now == fork_seen) {
                return;
            }
            fork_seen = now;
            if (watcher.joinable()) {
                watcher.detach();
                watcher = std::jthread{[this](std::stop_token stop) { watch(stop); }};
            }
        }

        // The subscription thread: +switch-master on one sentinel at a time.
        void watch(std::stop_token stop) {
            using namespace std::chrono;
            std::size_t next = 0;
            bool subscribed_before = false;
            while (!stop.stop_requested()) {
                const auto& where = config.sentinels[next++ % config.sentinels.size()];
                try {
                    hiredis_connection link{config.sentinel(where)};
                    detail::context_ptr ctx = link.open_dedicated();
                    if (!follow(*ctx, stop, subscribed_before)) {
                        return;
                    }
                } catch (const std::exception&) {
                    // Unreachable or failed sentinel: the next one, after a pause.
                }
                std::mutex pause_mutex;
                std::condition_variable_any pause;
                std::unique_lock pause_lock{pause_mutex};
                pause.wait_for(pause_lock, stop, milliseconds{200}, [] { return false; });
            }
        }

        // Reads one subscription until it fails (returns true: try another sentinel) or a stop
        // is requested (returns false). PINGs the sentinel so a hung one is noticed.
        bool follow(redisContext& ctx, std::stop_token& stop, bool& subscribed_before) {
            using namespace std::chrono;
            constexpr milliseconds slice{50};
            constexpr milliseconds ping_every{1000};
            const milliseconds silence_limit =
                std::max(milliseconds{3000}, config.node.command_timeout);
            if (redisAppendCommand(&ctx, "SUBSCRIBE +switch-master") != REDIS_OK) {
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
            while (!stop.stop_requested()) {
                void* raw = nullptr;
                if (redisGetReplyFromReader(&ctx, &raw) != REDIS_OK) {
                    return true;
                }
                if (raw != nullptr) {
                    detail::hiredis_reply_ptr owned{raw};
                    last_heard = clock::now();
                    handle(detail::convert_reply(*static_cast<redisReply*>(raw)),
                           subscribed_before);
                    continue;
                }
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

        void handle(const reply& r, bool& subscribed_before) {
            if (!r.is_array() || r.elements().size() < 3 || !r.elements()[0].is_string()) {
                return;  // a pong, or a reply we do not act on
            }
            const std::string& kind = r.elements()[0].text();
            if (kind == "subscribe") {
                // Switches announced while no subscription was up were missed: check now.
                if (subscribed_before) {
                    check_now();
                }
                subscribed_before = true;
                return;
            }
            if (kind != "message" || !r.elements()[2].is_string()) {
                return;
            }
            // "<master-name> <old-ip> <old-port> <new-ip> <new-port>"
            const std::string& text = r.elements()[2].text();
            if (text.starts_with(config.master_name + " ")) {
                check_now();
            }
        }

        void check_now() {
            std::uint64_t seen = 0;
            {
                std::lock_guard lock{mutex};
                seen = generation;
            }
            re_resolve(seen);  // a failure shows in the callers' next call
        }
    };

    std::unique_ptr<state> state_;
};

static_assert(pipelining_connection<sentinel_connection>);
static_assert(contextual_connection<sentinel_connection>);
static_assert(contextual_pipelining_connection<sentinel_connection>);

}  // namespace redislock
