// redislock-torture: a topology under test, as the rest of the tool sees it. Each kind (one
// server, Sentinel, Cluster, five Redlock masters, or a server given by URI) starts its servers
// with the fixtures of tests/support, says where clients connect (directly or through fault
// proxies), causes the faults of its kind (see faults.hpp) and heals them, and lists the masters
// to scan for leftovers at the end.
//
// Faults common to every kind live here: kill -9 of a waiting worker process, and eviction of a
// contended name's queue keys.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "torture/faults.hpp"
#include "torture/journal.hpp"
#include "torture/plan.hpp"

namespace redislock::torture {

/// Where the workers' clients connect. URIs carry no query; the worker adds its timeouts.
struct endpoints {
    topology_kind kind = topology_kind::single;
    std::string direct;                        ///< single, given, sentinel, cluster
    std::vector<std::string> proxied;          ///< single, given: one URI per proxy
    std::vector<std::string> masters;          ///< Redlock: each master directly
    std::vector<std::string> masters_proxied;  ///< Redlock: each master through its proxy
};

/// What a fault may look at and change besides the servers.
struct fault_context {
    const plan& the_plan;
    const std::vector<std::string>& names;
    journal& log;
    const std::atomic<bool>& stop;
    packet_filter& filter;
    std::vector<kill_event>& kills;
};

class topology {
public:
    virtual ~topology() = default;

    virtual std::string describe() const = 0;
    virtual endpoints where() const = 0;
    /// The masters to scan at the end (ports on 127.0.0.1), after every fault healed.
    virtual std::vector<int> masters() = 0;
    /// Every data node's port, for the responsiveness probe (fixed for the run).
    virtual std::vector<int> all_ports() = 0;
    /// Whether this topology can cause `kind` here (process control, DEBUG, iptables...).
    virtual bool can(fault_kind kind, const fault_context& ctx) const = 0;
    /// Causes the fault, waits its duration, heals it; returns what it did.
    virtual fault_record apply(const fault_spec& spec, fault_context& ctx) = 0;
    /// Makes sure everything is healthy again (the end of the run, or an interruption).
    virtual void heal_all() {}
    /// A change the topology made on its own since the last call (a failover its sentinels
    /// started), once it settled: recorded as a fault, for the checks to allow what it allows.
    /// Called between faults and after the last one, never while one is applied.
    virtual std::optional<fault_record> unplanned(fault_context&) { return std::nullopt; }
    /// The port and password to send a command about `key` to.
    virtual int port_for_key(const std::string& key) = 0;
    virtual std::string password() const { return {}; }
    virtual std::string host() const { return "127.0.0.1"; }
    virtual int db() const { return 0; }

    /// One command to a server of this topology, apart from the library.
    node_reply ask(int port, const std::vector<std::string>& args,
                   std::chrono::milliseconds timeout = std::chrono::seconds{5}) const {
        return node_command(port, args, timeout, host(), password(), db());
    }

    /// kill -9 of a worker process that waits for a lock; the run restarts it.
    fault_record kill_waiter(const fault_spec& spec, fault_context& ctx) {
        fault_record rec;
        rec.kind = fault_kind::kill_waiter;
        rec.blocks = false;
        rec.errors_ok = false;
        rec.names = 0;
        rec.start = rec.end = monotonic_ns();
        const auto& shape = ctx.the_plan.shape;
        const auto waiting = waiting_workers(ctx.log, shape.processes, shape.threads, 50'000'000);
        if (waiting.empty()) {
            rec.applied = false;
            rec.what = "kill -9 of a waiting process: none waited";
            return rec;
        }
        // The oldest waiters are the likeliest heads of their queues.
        const auto& victim =
            waiting[static_cast<std::size_t>(spec.pick) % std::min<std::size_t>(waiting.size(), 3)];
        process_now& pn = ctx.log.process(victim.process);
        const pid_t pid = pn.pid.load();
        pn.killed_by_fault.store(1);
        kill_event ev;
        ev.at = monotonic_ns();
        ev.process = victim.process;
        ::kill(pid, SIGKILL);
        for (int i = 0; i < 2000 && !process_gone(pid); ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds{1});
        }
        for (int t = 0; t < shape.threads; ++t) {
            const thread_now& tn = pn.threads[t];
            if (const int name = tn.hold_name.load(); name >= 0) {
                ev.holds.push_back({name, tn.hold_acquired.load(), tn.hold_last_owned.load(),
                                    tn.hold_fence.load(), tn.hold_lease.load(),
                                    tn.hold_actor.load(), tn.hold_flags.load(),
                                    tn.hold_object.load(), tn.hold_episode.load(), t,
                                    tn.hold_min_replicas.load()});
            }
            if (const int name = tn.waiting_name.load(); name >= 0) {
                ev.waits.push_back({name, tn.waiting_since.load(), tn.waiting_lease.load(), t});
            }
        }
        ctx.kills.push_back(ev);
        pn.killed_by_fault.store(2);  // the run may restart it now
        rec.what = "kill -9 of process " + std::to_string(victim.process) + " (thread " +
                   std::to_string(victim.thread) + " waiting for '" +
                   ctx.names[static_cast<std::size_t>(victim.name)] + "')";
        rec.names = 1ULL << victim.name;
        return rec;
    }

    /// DEL of a contended name's {name}:waiting and/or {name}:queue, as an evicting server
    /// would do.
    fault_record evict_queue(const fault_spec& spec, fault_context& ctx) {
        fault_record rec;
        rec.kind = fault_kind::evict_queue;
        rec.blocks = false;
        rec.errors_ok = false;
        rec.start = rec.end = monotonic_ns();
        const auto& shape = ctx.the_plan.shape;
        auto waiting = waiting_workers(ctx.log, shape.processes, shape.threads, 0);
        int name = spec.target % static_cast<int>(ctx.names.size());
        if (!waiting.empty()) {
            name = waiting[static_cast<std::size_t>(spec.pick) % waiting.size()].name;
        }
        const std::string& n = ctx.names[static_cast<std::size_t>(name)];
        std::vector<std::string> keys;
        if (spec.variant != 1) {
            keys.push_back("{" + n + "}:waiting");
        }
        if (spec.variant != 0) {
            keys.push_back("{" + n + "}:queue");
        }
        std::string deleted;
        for (const auto& key : keys) {
            const node_reply r = ask(port_for_key(key), {"DEL", key});
            deleted += (deleted.empty() ? "" : ", ") + key + (r.text == "1" ? "" : " (absent)");
        }
        rec.names = 1ULL << name;
        rec.what = "DEL " + deleted;
        return rec;
    }

    /// Every key of the run left on the masters but fencing counters and semaphores' counts of
    /// permits (configuration, kept without expiry): "key (type, pttl)".
    std::vector<std::string> leftovers(const std::string& prefix) {
        std::vector<std::string> found;
        for (const int port : masters()) {
            std::string cursor = "0";
            for (int round = 0; round < 10'000; ++round) {
                const node_reply r =
                    ask(port, {"SCAN", cursor, "MATCH", "*" + prefix + "*", "COUNT", "1000"});
                if (!r.ok || r.elements.empty()) {
                    found.push_back("(SCAN failed on " + host() + ":" + std::to_string(port) +
                                    ": " + r.text + ")");
                    break;
                }
                cursor = r.elements.front();
                for (std::size_t i = 1; i < r.elements.size(); ++i) {
                    const std::string& key = r.elements[i];
                    if (key.size() > 7 && key.front() == '{' &&
                        (key.ends_with("}:fence") ||
                         (key.ends_with("}:permits") && key.find(":sem:") != std::string::npos))) {
                        continue;
                    }
                    const node_reply type = ask(port, {"TYPE", key});
                    const node_reply ttl = ask(port, {"PTTL", key});
                    if (type.text == "none") {
                        continue;  // expired meanwhile
                    }
                    found.push_back(key + " (" + type.text + ", pttl " + ttl.text + " ms, on " +
                                    host() + ":" + std::to_string(port) + ")");
                }
                if (cursor == "0") {
                    break;
                }
            }
        }
        return found;
    }
};

}  // namespace redislock::torture
