// redislock-torture: the topologies made of plain servers: one server (with two fault proxies in
// front, so some clients' path can stall while others' does not), five independent Redlock
// masters (each with a fault proxy), and a server given by URI (where only the tool's own
// proxies, its queue keys and its own processes are faulted).
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <redislock/endpoint.hpp>

#include "support/fault_proxy.hpp"
#include "support/redis_server.hpp"
#include "torture/faults.hpp"
#include "torture/topology.hpp"

namespace redislock::torture {

/// One of our redis-server processes, and the proxies in front of it.
struct server_node {
    explicit server_node(int proxies)
        : server{test::redis_server::options{
              .extra_args = {"--enable-debug-command", "yes", "--hz", "100"}}} {
        for (int i = 0; i < proxies; ++i) {
            this->proxies.push_back(std::make_unique<test::fault_proxy>(server));
        }
    }

    test::redis_server server;
    std::vector<std::unique_ptr<test::fault_proxy>> proxies;
};

/// Starts and ends the faults of kinds that act on one server of ours; several at once for
/// Redlock. begin() causes it, end() heals it; the caller waits in between.
class server_fault {
public:
    server_fault(fault_kind kind, int variant, int duration_ms, server_node& node, int proxy,
                 packet_filter& filter)
        : kind_{kind},
          variant_{variant},
          duration_ms_{duration_ms},
          node_{node},
          proxy_{proxy},
          filter_{filter} {}

    server_fault(const server_fault&) = delete;
    server_fault& operator=(const server_fault&) = delete;
    ~server_fault() {
        if (sleeper_.joinable()) {
            sleeper_.join();
        }
    }

    /// What it does, for the report.
    std::string begin() {
        const int port = node_.server.port();
        const std::string where = "127.0.0.1:" + std::to_string(port);
        const std::string ms = std::to_string(duration_ms_);
        switch (kind_) {
            case fault_kind::kill_restart:
                node_.server.stop();
                return "kill -9 of " + where + ", restarted empty after " + ms + " ms";
            case fault_kind::sigstop:
                node_.server.pause();
                return "SIGSTOP of " + where + " for " + ms + " ms";
            case fault_kind::client_kill:
                (void)node_command(port, {"CLIENT", "KILL", "TYPE", "normal"});
                return "CLIENT KILL TYPE normal on " + where;
            case fault_kind::client_pause:
                (void)node_command(port, {"CLIENT", "PAUSE", ms, variant_ == 1 ? "WRITE" : "ALL"});
                return "CLIENT PAUSE " + ms + (variant_ == 1 ? " WRITE" : " ALL") + " on " + where;
            case fault_kind::server_sleep:
                sleeper_ = std::thread{[port, d = duration_ms_] {
                    (void)node_command(port, {"DEBUG", "SLEEP", std::to_string(d / 1000.0)},
                                       std::chrono::milliseconds{d + 10'000});
                }};
                return "DEBUG SLEEP " + ms + " ms on " + where;
            case fault_kind::oom:
                (void)node_command(port, {"CONFIG", "SET", "maxmemory-policy", "noeviction"});
                (void)node_command(port, {"CONFIG", "SET", "maxmemory", "1"});
                return "maxmemory 1 (noeviction) on " + where + " for " + ms + " ms";
            case fault_kind::net_drop:
                if (filter_.usable() && filter_.drop(port)) {
                    dropped_ = true;
                    return "packets to " + where + " dropped (iptables) for " + ms + " ms";
                }
                for (auto& p : node_.proxies) {
                    p->stall();
                }
                return "paths to " + where + " stalled (no iptables: proxies only) for " + ms +
                       " ms";
            case fault_kind::proxy_stall:
                proxy().stall();
                return "path " + proxy().uri() + " -> " + where + " stalled for " + ms + " ms";
            case fault_kind::proxy_cut:
                proxy().cut();
                return "connections through " + proxy().uri() + " -> " + where + " cut";
            case fault_kind::proxy_delay: {
                const int latency = variant_ == 0 ? 20 : variant_ == 1 ? 60 : 150;
                proxy().delay(std::chrono::milliseconds{latency});
                return "path " + proxy().uri() + " -> " + where + " slowed by " +
                       std::to_string(latency) + " ms each way for " + ms + " ms";
            }
            default:
                return "?";
        }
    }

    void end() {
        const int port = node_.server.port();
        switch (kind_) {
            case fault_kind::kill_restart:
                node_.server.start();
                break;
            case fault_kind::sigstop:
                node_.server.resume();
                break;
            case fault_kind::client_pause:
                (void)node_command(port, {"CLIENT", "UNPAUSE"});
                break;
            case fault_kind::server_sleep:
                if (sleeper_.joinable()) {
                    sleeper_.join();
                }
                break;
            case fault_kind::oom:
                (void)node_command(port, {"CONFIG", "SET", "maxmemory", "0"});
                break;
            case fault_kind::net_drop:
                if (dropped_) {
                    filter_.undrop(port);
                } else {
                    for (auto& p : node_.proxies) {
                        p->resume();
                    }
                }
                break;
            case fault_kind::proxy_stall:
                proxy().resume();
                break;
            case fault_kind::proxy_delay:
                proxy().delay(std::chrono::milliseconds{0});
                break;
            default:
                break;
        }
    }

    /// The client paths it touches: -2 all, -3 every path through a proxy (packets cannot be
    /// dropped without iptables: every proxy stalls instead), else the proxy's.
    int path() const {
        switch (kind_) {
            case fault_kind::proxy_stall:
            case fault_kind::proxy_cut:
            case fault_kind::proxy_delay:
                return proxy_;
            case fault_kind::net_drop:
                return dropped_ ? -2 : -3;
            default:
                return -2;
        }
    }

private:
    test::fault_proxy& proxy() {
        return *node_.proxies[static_cast<std::size_t>(proxy_) % node_.proxies.size()];
    }

    fault_kind kind_;
    int variant_;
    int duration_ms_;
    server_node& node_;
    int proxy_;
    packet_filter& filter_;
    std::thread sleeper_;
    bool dropped_ = false;
};

/// How long a fault of `kind` lasts: kill -9 keeps the server down at least one lease, as the
/// docs require of a server restarted without persistence; others as drawn.
inline int fault_duration(fault_kind kind, int drawn_ms, int max_lease_ms) {
    switch (kind) {
        case fault_kind::kill_restart:
        case fault_kind::replica_kill:
            return drawn_ms + max_lease_ms;
        case fault_kind::client_kill:
        case fault_kind::proxy_cut:
            return 0;
        default:
            return drawn_ms;
    }
}

inline void describe_effects(fault_record& rec, fault_kind kind) {
    switch (kind) {
        case fault_kind::client_kill:
        case fault_kind::proxy_cut:
            rec.blocks = true;
            break;
        case fault_kind::kill_restart:
        case fault_kind::sigstop:
        case fault_kind::client_pause:
        case fault_kind::server_sleep:
        case fault_kind::oom:
        case fault_kind::net_drop:
        case fault_kind::proxy_stall:
        case fault_kind::proxy_delay:
            rec.blocks = true;
            break;
        default:
            break;
    }
}

/// One server, two proxies in front of it.
class single_topology : public topology {
public:
    single_topology() : node_{2} {}

    std::string describe() const override {
        return "one server 127.0.0.1:" + std::to_string(node_.server.port()) + ", proxies " +
               node_.proxies[0]->uri() + " and " + node_.proxies[1]->uri();
    }

    endpoints where() const override {
        endpoints e;
        e.kind = topology_kind::single;
        e.direct = node_.server.uri();
        for (const auto& p : node_.proxies) {
            e.proxied.push_back(p->uri());
        }
        return e;
    }

    std::vector<int> masters() override { return {node_.server.port()}; }
    std::vector<int> all_ports() override { return {node_.server.port()}; }
    int port_for_key(const std::string&) override { return node_.server.port(); }

    bool can(fault_kind kind, const fault_context&) const override {
        switch (kind) {
            case fault_kind::kill_restart:
            case fault_kind::sigstop:
            case fault_kind::client_kill:
            case fault_kind::client_pause:
            case fault_kind::server_sleep:
            case fault_kind::oom:
            case fault_kind::evict_queue:
            case fault_kind::proxy_stall:
            case fault_kind::proxy_cut:
            case fault_kind::proxy_delay:
            case fault_kind::net_drop:
            case fault_kind::kill_waiter:
                return true;
            default:
                return false;
        }
    }

    fault_record apply(const fault_spec& spec, fault_context& ctx) override {
        if (spec.kind == fault_kind::kill_waiter) {
            return kill_waiter(spec, ctx);
        }
        if (spec.kind == fault_kind::evict_queue) {
            return evict_queue(spec, ctx);
        }
        fault_record rec;
        rec.kind = spec.kind;
        rec.blocks = false;
        describe_effects(rec, spec.kind);
        const int duration =
            fault_duration(spec.kind, spec.duration_ms, ctx.the_plan.max_lease_ms());
        server_fault f{spec.kind, spec.variant, duration, node_, spec.target % 2, ctx.filter};
        rec.start = monotonic_ns();
        rec.what = f.begin();
        rec.path = f.path();
        pause_for(std::chrono::milliseconds{duration}, ctx.stop);
        f.end();
        rec.end = monotonic_ns();
        rec.block_slack_ns =
            rec.blocks ? ghost_slack_ns(spec.kind, duration, ctx.the_plan.max_lease_ms()) : 0;
        return rec;
    }

    void heal_all() override {
        for (auto& p : node_.proxies) {
            p->heal();
        }
    }

private:
    server_node node_;
};

/// A server the user gave: only the tool's own proxies, its keys and its processes are faulted.
class given_topology : public topology {
public:
    explicit given_topology(const std::string& uri) : ep_{endpoint::from_uri(uri)}, uri_{uri} {
        if (!ep_.unix_socket.empty()) {
            throw std::invalid_argument{"--uri: a unix socket cannot be proxied; give host:port"};
        }
        const std::string host = ep_.host == "localhost" ? "127.0.0.1" : ep_.host;
        for (int i = 0; i < 2; ++i) {
            proxies_.push_back(std::make_unique<test::fault_proxy>(host, ep_.port));
        }
    }

    std::string describe() const override {
        return "the server at " + ep_.describe() + ", proxies " + proxies_[0]->uri() + " and " +
               proxies_[1]->uri();
    }

    endpoints where() const override {
        endpoints e;
        e.kind = topology_kind::given;
        // The user's URI without its query: the workers add their own timeouts.
        e.direct = uri_.substr(0, uri_.find('?'));
        const std::string auth =
            ep_.password.empty() ? std::string{} : ep_.user + ":" + ep_.password + "@";
        const std::string db = ep_.db == 0 ? std::string{} : "/" + std::to_string(ep_.db);
        for (const auto& p : proxies_) {
            e.proxied.push_back("redis://" + auth + "127.0.0.1:" + std::to_string(p->port()) + db);
        }
        return e;
    }

    std::vector<int> masters() override { return {ep_.port}; }
    std::vector<int> all_ports() override { return {}; }  // not ours to probe
    int port_for_key(const std::string&) override { return ep_.port; }
    std::string password() const override { return ep_.password; }
    std::string host() const override { return ep_.host; }
    int db() const override { return ep_.db; }

    bool can(fault_kind kind, const fault_context&) const override {
        switch (kind) {
            case fault_kind::evict_queue:
            case fault_kind::proxy_stall:
            case fault_kind::proxy_cut:
            case fault_kind::proxy_delay:
            case fault_kind::kill_waiter:
                return true;
            default:
                return false;
        }
    }

    fault_record apply(const fault_spec& spec, fault_context& ctx) override {
        if (spec.kind == fault_kind::kill_waiter) {
            return kill_waiter(spec, ctx);
        }
        if (spec.kind == fault_kind::evict_queue) {
            return evict_queue(spec, ctx);
        }
        fault_record rec;
        rec.kind = spec.kind;
        rec.blocks = true;
        rec.path = spec.target % 2;
        test::fault_proxy& proxy = *proxies_[static_cast<std::size_t>(rec.path)];
        rec.start = monotonic_ns();
        const std::string ms = std::to_string(spec.duration_ms);
        if (spec.kind == fault_kind::proxy_stall) {
            proxy.stall();
            rec.what = "path " + proxy.uri() + " stalled for " + ms + " ms";
        } else if (spec.kind == fault_kind::proxy_cut) {
            proxy.cut();
            rec.what = "connections through " + proxy.uri() + " cut";
        } else {
            const int latency = spec.variant == 0 ? 20 : spec.variant == 1 ? 60 : 150;
            proxy.delay(std::chrono::milliseconds{latency});
            rec.what = "path " + proxy.uri() + " slowed by " + std::to_string(latency) +
                       " ms each way for " + ms + " ms";
        }
        if (spec.kind != fault_kind::proxy_cut) {
            pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
        }
        proxy.heal();
        rec.end = monotonic_ns();
        rec.block_slack_ns =
            ghost_slack_ns(spec.kind, spec.duration_ms, ctx.the_plan.max_lease_ms());
        return rec;
    }

    void heal_all() override {
        for (auto& p : proxies_) {
            p->heal();
        }
    }

private:
    endpoint ep_;
    std::string uri_;
    std::vector<std::unique_ptr<test::fault_proxy>> proxies_;
};

/// Five independent masters for Redlock, each with a proxy of its own.
class redlock_topology : public topology {
public:
    redlock_topology() {
        for (int i = 0; i < 5; ++i) {
            nodes_.push_back(std::make_unique<server_node>(1));
        }
    }

    std::string describe() const override {
        std::string ports;
        for (const auto& n : nodes_) {
            ports += (ports.empty() ? "" : ",") + std::to_string(n->server.port());
        }
        return "five Redlock masters on 127.0.0.1 ports " + ports + ", a proxy in front of each";
    }

    endpoints where() const override {
        endpoints e;
        e.kind = topology_kind::redlock;
        for (const auto& n : nodes_) {
            e.masters.push_back(n->server.uri());
            e.masters_proxied.push_back(n->proxies[0]->uri());
        }
        return e;
    }

    std::vector<int> masters() override {
        std::vector<int> ports;
        for (const auto& n : nodes_) {
            ports.push_back(n->server.port());
        }
        return ports;
    }
    std::vector<int> all_ports() override { return masters(); }
    int port_for_key(const std::string&) override { return nodes_[0]->server.port(); }

    bool can(fault_kind kind, const fault_context&) const override {
        switch (kind) {
            case fault_kind::kill_restart:
            case fault_kind::sigstop:
            case fault_kind::client_kill:
            case fault_kind::client_pause:
            case fault_kind::server_sleep:
            case fault_kind::oom:
            case fault_kind::proxy_stall:
            case fault_kind::proxy_cut:
            case fault_kind::net_drop:
            case fault_kind::kill_waiter:
                return true;
            default:
                return false;
        }
    }

    fault_record apply(const fault_spec& spec, fault_context& ctx) override {
        if (spec.kind == fault_kind::kill_waiter) {
            return kill_waiter(spec, ctx);
        }
        fault_record rec;
        rec.kind = spec.kind;
        rec.blocks = false;
        describe_effects(rec, spec.kind);
        rec.masters = std::clamp(spec.count, 1, 3);
        // With one or two of the five masters faulted a quorum is still in reach, but
        // contenders then split the votes of the masters left (two of four each, or any one of
        // three) and every round fails until randomized retries part them: Redlock promises no
        // bound on the wait then, so the fault holds waiters back as it would on one node.
        const int duration =
            fault_duration(spec.kind, spec.duration_ms, ctx.the_plan.max_lease_ms());
        std::vector<std::unique_ptr<server_fault>> faults;
        for (int i = 0; i < rec.masters; ++i) {
            server_node& node = *nodes_[static_cast<std::size_t>((spec.target + i) % 5)];
            rec.master_ports.push_back(node.server.port());
            faults.push_back(std::make_unique<server_fault>(spec.kind, spec.variant, duration, node,
                                                            0, ctx.filter));
        }
        rec.start = monotonic_ns();
        for (auto& f : faults) {
            rec.what += (rec.what.empty() ? "" : "; ") + f->begin();
        }
        // Redlock's clients take paths to every master: a proxy fault touches the proxied ones.
        rec.path = faults.front()->path() == -2 ? -2 : 0;
        pause_for(std::chrono::milliseconds{duration}, ctx.stop);
        for (auto& f : faults) {
            f->end();
        }
        rec.end = monotonic_ns();
        rec.block_slack_ns =
            rec.blocks ? ghost_slack_ns(spec.kind, duration, ctx.the_plan.max_lease_ms()) : 0;
        return rec;
    }

    void heal_all() override {
        for (auto& n : nodes_) {
            n->proxies[0]->heal();
        }
    }

private:
    std::vector<std::unique_ptr<server_node>> nodes_;
};

}  // namespace redislock::torture
