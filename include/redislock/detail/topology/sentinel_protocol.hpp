// What a Sentinel connection reads from the servers: which commands are safe to repeat, a
// READONLY reply, a node's ROLE, a sentinel's view of the master, the failover announcements
// sentinels publish (sentinel_channels, parse_sentinel_event), and the subscriber link to the
// master.
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
    // Not SET, even with NX: a repeat after a first one that landed late answers nil, "taken",
    // where the key is the caller's own.
    constexpr std::array<std::string_view, 14> repeatable{
        "EVALSHA", "EVAL", "EVALSHA_RO", "EVAL_RO", "SCRIPT", "GET",     "PTTL",
        "EXISTS",  "PING", "TIME",       "ROLE",    "WAIT",   "PUBLISH", "SPUBLISH"};
    return std::any_of(repeatable.begin(), repeatable.end(),
                       [&](std::string_view name) { return equals_ignoring_case(argv[0], name); });
}

/// Called by every sentinel_connection call once it found no failover of the master under way,
/// right before it sends, with the connection's failover_fence: null (nothing is called) unless
/// a test sets it, to announce a failover at that very moment.
inline std::atomic<void (*)(failover_fence&)> sentinel_call_admitted{nullptr};

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

/// Whether the node `pool` reaches answers ROLE as a master, asked within `bound`.
inline bool answers_as_master(hiredis_connection& pool, const call_context& bound) {
    const std::array<std::string_view, 1> role{"ROLE"};
    const reply r = pool.execute(role, bound);
    return r.is_array() && !r.elements().empty() && r.elements()[0].is_string() &&
           r.elements()[0].text() == "master";
}

/// The sentinels' channels a connection listens to: +switch-master, the steps of a failover
/// (only the sentinel that leads it announces them), and the ends of one that was aborted.
inline constexpr std::array<std::string_view, 13> sentinel_channels{
    "+switch-master",
    "+elected-leader",
    "+failover-state-select-slave",
    "+selected-slave",
    "+failover-state-send-slaveof-noone",
    "+failover-state-wait-promotion",
    "+promoted-slave",
    "+failover-state-reconf-slaves",
    "+failover-end",
    "+failover-end-for-timeout",
    "-failover-abort-not-elected",
    "-failover-abort-no-good-slave",
    "-failover-abort-slave-timeout"};

/// What one sentinel announcement says about a master.
struct sentinel_event {
    enum class kind {
        other,     ///< nothing the connection acts on
        switched,  ///< +switch-master
        step,      ///< a step of a failover: the master is being replaced
        aborted,   ///< the failover ended without a switch
    };
    kind what = kind::other;
    std::string master_name;
    /// The master it is about ("ip:port"; for a switch, the old one).
    std::string master_address;
    /// For a switch, the new master ("ip:port").
    std::string new_address;
};

/// Parses a message on one of sentinel_channels: "+switch-master" carries
/// "<name> <old-ip> <old-port> <new-ip> <new-port>"; the others "master <name> <ip> <port> ..."
/// or, for a replica, "slave <id> <ip> <port> @ <name> <master-ip> <master-port>".
inline sentinel_event parse_sentinel_event(std::string_view channel, std::string_view payload) {
    std::vector<std::string_view> words;
    while (!payload.empty()) {
        const auto space = payload.find(' ');
        if (space != 0) {
            words.push_back(payload.substr(0, space));
        }
        payload = space == std::string_view::npos ? std::string_view{} : payload.substr(space + 1);
    }
    const auto named = [&](std::size_t at) {
        sentinel_event e;
        if (at + 2 < words.size()) {
            e.master_name = words[at];
            e.master_address = std::string{words[at + 1]} + ":" + std::string{words[at + 2]};
        }
        return e;
    };
    if (channel == "+switch-master") {
        sentinel_event e = named(0);
        e.what = sentinel_event::kind::switched;
        if (words.size() >= 5) {
            e.new_address = std::string{words[3]} + ":" + std::string{words[4]};
        }
        return e;
    }
    sentinel_event e;
    if (!words.empty() && words[0] == "master") {
        e = named(1);
    } else if (auto at = std::find(words.begin(), words.end(), "@"); at != words.end()) {
        e = named(static_cast<std::size_t>(at - words.begin()) + 1);
    }
    if (channel.starts_with("-failover-abort")) {
        e.what = sentinel_event::kind::aborted;
    } else if (std::find(sentinel_channels.begin() + 1, sentinel_channels.end(), channel) !=
               sentinel_channels.end()) {
        e.what = sentinel_event::kind::step;
    }
    return e;
}

/// A subscriber link to the master of one generation of a sentinel_connection. A demoted master
/// stays up, and may stay a writable master for a while, so a link to it does not break by
/// itself while releases publish on the new master: once the connection has moved on (its
/// generation changed), the link says it is broken, and the notifier wakes its waiters, who try
/// again and subscribe on the master in use then.
class master_subscriber_link final : public subscriber_link {
public:
    master_subscriber_link(std::unique_ptr<subscriber_link> link,
                           std::shared_ptr<hiredis_connection> pool,
                           const std::atomic<std::uint64_t>& current, std::uint64_t generation)
        : link_{std::move(link)},
          pool_{std::move(pool)},
          current_{current},
          generation_{generation} {}

    int fd() const noexcept override { return link_->fd(); }

    void send(command argv) override {
        check();
        link_->send(argv);
    }

    void read(std::vector<reply>& out) override {
        check();
        link_->read(out);
    }

    bool buffered() const noexcept override { return link_->buffered(); }
    bool reads_without_blocking() const noexcept override {
        return link_->reads_without_blocking();
    }

private:
    void check() const {
        if (current_.load(std::memory_order_acquire) != generation_) {
            throw connection_error{
                "redislock: " + pool_->config().describe() +
                " is no longer the master in use: its subscriber link is closed"};
        }
    }

    std::unique_ptr<subscriber_link> link_;
    std::shared_ptr<hiredis_connection> pool_;  // the link may share its TLS context
    const std::atomic<std::uint64_t>& current_;
    std::uint64_t generation_;
};

}  // namespace redislock::detail
