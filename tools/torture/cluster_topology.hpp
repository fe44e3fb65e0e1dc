// redislock-torture: a Redis Cluster (tests/support/redis_cluster.hpp: three masters with one
// replica each, node timeout 2 s) and its faults: slot migrations of a name's slot step by step
// (IMPORTING/MIGRATING, keys moved in batches with or without REPLACE, SETSLOT NODE), with pauses
// between the steps so clients meet ASK and TRYAGAIN; graceful (CLUSTER FAILOVER) and forced
// (FORCE, TAKEOVER) failovers; a master stopped long enough for its replica to take over; kill
// -9 of a master, restarted from its nodes.conf as a replica; and the server faults of one node
// on a name's master.
//
// A MIGRATE without REPLACE that the target refuses with BUSYKEY means a key of the slot was
// written on the target while the source still had it: the fault reports it (a second queue, or
// a second lock), then completes the migration with REPLACE.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "support/redis_cluster.hpp"
#include "torture/faults.hpp"
#include "torture/topology.hpp"

namespace redislock::torture {

class cluster_topology : public topology {
public:
    cluster_topology() : fixture_{3, 1} {}

    ~cluster_topology() override {
        for (const pid_t pid : respawned_) {
            ::kill(pid, SIGKILL);
            test::detail::reap(pid, true);
        }
    }

    std::string describe() const override {
        std::string ports;
        for (const int p : fixture_.ports()) {
            ports += (ports.empty() ? "" : ",") + std::to_string(p);
        }
        return "Cluster: 3 masters + 3 replicas on 127.0.0.1 ports " + ports;
    }

    endpoints where() const override {
        endpoints e;
        e.kind = topology_kind::cluster;
        e.direct = fixture_.uri();
        return e;
    }

    std::vector<int> masters() override {
        try {
            return fixture_.masters();
        } catch (const std::exception&) {
            return {};
        }
    }

    std::vector<int> all_ports() override { return fixture_.ports(); }
    int port_for_key(const std::string& key) override { return fixture_.master_for_key(key); }

    bool can(fault_kind kind, const fault_context&) const override {
        switch (kind) {
            case fault_kind::migrate:
            case fault_kind::failover:
            case fault_kind::forced_failover:
            case fault_kind::replica_stop:
            case fault_kind::sigstop:
            case fault_kind::kill_restart:
            case fault_kind::client_kill:
            case fault_kind::client_pause:
            case fault_kind::server_sleep:
            case fault_kind::oom:
            case fault_kind::evict_queue:
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
        rec.start = monotonic_ns();
        rec.block_slack_ns =
            ghost_slack_ns(spec.kind, spec.duration_ms, ctx.the_plan.max_lease_ms());
        int name = spec.target % static_cast<int>(ctx.names.size());
        if (spec.kind == fault_kind::migrate) {
            // The slot of a contended name, when anyone waits: the keys a migration splits
            // then include a queue that waiters keep writing.
            const auto& shape = ctx.the_plan.shape;
            const auto waiting = waiting_workers(ctx.log, shape.processes, shape.threads, 0);
            if (!waiting.empty()) {
                name = waiting[static_cast<std::size_t>(spec.target) % waiting.size()].name;
            }
        }
        const std::string& n = ctx.names[static_cast<std::size_t>(name)];
        try {
            const int master = fixture_.master_for_key(n);
            const std::string m = "127.0.0.1:" + std::to_string(master);
            rec.names = names_on(master, ctx);
            switch (spec.kind) {
                case fault_kind::migrate:
                    migrate(spec, ctx, name, rec);
                    break;
                case fault_kind::failover:
                case fault_kind::forced_failover: {
                    const auto replicas = fixture_.replicas_of(master);
                    if (replicas.empty()) {
                        rec.applied = false;
                        rec.what = "failover of " + m + ": it has no replica left";
                        break;
                    }
                    const int replica = replicas.front();
                    if (spec.kind == fault_kind::failover) {
                        fixture_.failover(replica);
                        rec.what =
                            "CLUSTER FAILOVER: " + m + " -> 127.0.0.1:" + std::to_string(replica);
                    } else {
                        const std::string how = spec.variant == 1 ? "TAKEOVER" : "FORCE";
                        fixture_.command(replica, {"CLUSTER", "FAILOVER", how});
                        wait_master(replica);
                        rec.what = "CLUSTER FAILOVER " + how + ": " + m +
                                   " -> 127.0.0.1:" + std::to_string(replica);
                        rec.loses = write_loss::any_holder;
                    }
                    fixture_.wait_healthy();
                    rec.error_slack_ns = 3'000'000'000;
                    break;
                }
                case fault_kind::replica_stop: {
                    const auto replicas = fixture_.replicas_of(master);
                    if (replicas.empty()) {
                        rec.applied = false;
                        rec.what = "SIGSTOP of a replica of " + m + ": it has none left";
                        break;
                    }
                    const int replica = replicas.front();
                    const pid_t pid = server_pid(replica);
                    rec.replicas_only = true;
                    rec.blocks = false;
                    ::kill(pid, SIGSTOP);
                    // Below the node timeout: a stopped replica must not be failed.
                    const int d = std::min(spec.duration_ms, 1500);
                    pause_for(std::chrono::milliseconds{d}, ctx.stop);
                    ::kill(pid, SIGCONT);
                    rec.what = "SIGSTOP of the replica 127.0.0.1:" + std::to_string(replica) +
                               " of " + m + " for " + std::to_string(d) + " ms";
                    break;
                }
                case fault_kind::sigstop: {
                    const pid_t pid = server_pid(master);
                    ::kill(pid, SIGSTOP);
                    pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                    ::kill(pid, SIGCONT);
                    rec.what = "SIGSTOP of the master " + m + " for " +
                               std::to_string(spec.duration_ms) + " ms";
                    if (spec.duration_ms >= 1500) {
                        // Its replica may have taken over: let the cluster settle. Until then
                        // the cluster refuses every slot (CLUSTERDOWN).
                        rec.names = ~0ULL;
                        pause_for(std::chrono::milliseconds{1000}, ctx.stop);
                        rec.loses = write_loss::any_holder;
                        rec.error_slack_ns = 3'000'000'000;
                        rec.block_slack_ns = ghost_slack_ns(fault_kind::forced_failover, 0,
                                                            ctx.the_plan.max_lease_ms());
                    }
                    fixture_.wait_healthy();
                    break;
                }
                case fault_kind::kill_restart: {
                    if (fixture_.replicas_of(master).empty()) {
                        rec.applied = false;
                        rec.what = "kill -9 of " + m + ": it has no replica left";
                        break;
                    }
                    const int replica = fixture_.replicas_of(master).front();
                    const auto args = command_line(master);
                    rec.names = ~0ULL;  // CLUSTERDOWN for every slot until its replica took over
                    fixture_.kill(master);
                    wait_master(replica);  // restarted sooner, it would come back an empty master
                    fixture_.wait_healthy();
                    pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                    respawn(args, master);
                    rec.what = "kill -9 of the master " + m +
                               ", failover to its replica, restarted as a replica after " +
                               std::to_string(spec.duration_ms) + " ms";
                    rec.loses = write_loss::any_holder;
                    rec.error_slack_ns = 3'000'000'000;
                    fixture_.wait_healthy();
                    break;
                }
                case fault_kind::client_kill:
                    (void)ask(master, {"CLIENT", "KILL", "TYPE", "normal"});
                    rec.what = "CLIENT KILL TYPE normal on the master " + m;
                    break;
                case fault_kind::client_pause: {
                    const int d = std::min(spec.duration_ms, 1500);
                    const bool write = spec.variant == 1;
                    (void)ask(master,
                              {"CLIENT", "PAUSE", std::to_string(d), write ? "WRITE" : "ALL"});
                    pause_for(std::chrono::milliseconds{d}, ctx.stop);
                    (void)ask(master, {"CLIENT", "UNPAUSE"});
                    rec.what = "CLIENT PAUSE " + std::to_string(d) + (write ? " WRITE" : " ALL") +
                               " on the master " + m;
                    break;
                }
                case fault_kind::server_sleep: {
                    // Below the node timeout: a busy node must not be failed over.
                    const int d = std::min(spec.duration_ms, 1200);
                    (void)ask(master, {"EVAL", busy_script, "0", std::to_string(d)},
                              std::chrono::milliseconds{d + 10'000});
                    rec.what = "the master " + m + " busy for " + std::to_string(d) +
                               " ms (a script, as DEBUG SLEEP)";
                    break;
                }
                case fault_kind::oom:
                    (void)ask(master, {"CONFIG", "SET", "maxmemory-policy", "noeviction"});
                    (void)ask(master, {"CONFIG", "SET", "maxmemory", "1"});
                    pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                    (void)ask(master, {"CONFIG", "SET", "maxmemory", "0"});
                    rec.what = "maxmemory 1 (noeviction) on the master " + m + " for " +
                               std::to_string(spec.duration_ms) + " ms";
                    break;
                default:
                    rec.applied = false;
                    break;
            }
        } catch (const std::exception& e) {
            rec.tool_error = e.what();
            if (rec.what.empty()) {
                rec.what = std::string{to_string(spec.kind)};
            }
        }
        rec.end = monotonic_ns();
        return rec;
    }

    void heal_all() override {
        for (const int port : fixture_.ports()) {
            if (fixture_.running(port)) {
                const pid_t pid = server_pid(port);
                if (pid > 0) {
                    ::kill(pid, SIGCONT);
                }
            }
        }
        try {
            fixture_.wait_healthy();
        } catch (const std::exception&) {
        }
    }

private:
    // Bit per name whose slot `master` serves.
    std::uint64_t names_on(int master, const fault_context& ctx) {
        std::uint64_t mask = 0;
        for (std::size_t i = 0; i < ctx.names.size(); ++i) {
            if (fixture_.master_for_key(ctx.names[i]) == master) {
                mask |= 1ULL << i;
            }
        }
        return mask;
    }

    void migrate(const fault_spec& spec, fault_context& ctx, int name, fault_record& rec) {
        const std::string& n = ctx.names[static_cast<std::size_t>(name)];
        const int slot = fixture_.key_slot(n);
        const int from = fixture_.master_for_slot(slot);
        std::vector<int> others;
        for (const int p : fixture_.masters()) {
            if (p != from) {
                others.push_back(p);
            }
        }
        const int to = others[static_cast<std::size_t>(spec.pick) % others.size()];
        const bool replace = spec.variant != 1;
        rec.names = 0;
        for (std::size_t i = 0; i < ctx.names.size(); ++i) {
            if (fixture_.key_slot(ctx.names[i]) == slot) {
                rec.names |= 1ULL << i;
            }
        }
        rec.errors_ok = false;  // a migration is no outage: ASK and TRYAGAIN are to be ridden out
        const auto step = std::chrono::milliseconds{std::max(spec.duration_ms / 3, 1)};
        // Keys move a few at a time, so that some of a lock's keys are on the target while
        // others are still on the source, as with redis-cli --cluster reshard's batches.
        static constexpr int batches[] = {1, 2, 10};
        const std::string batch = std::to_string(batches[spec.pick % 3]);
        rec.what = "migration of slot " + std::to_string(slot) + " ('" + n +
                   "') 127.0.0.1:" + std::to_string(from) + " -> 127.0.0.1:" + std::to_string(to) +
                   (replace ? " (MIGRATE REPLACE" : " (MIGRATE without REPLACE") + ", " + batch +
                   " key(s) at a time), steps " + std::to_string(step.count()) + " ms apart";
        fixture_.begin_migration(slot, from, to);
        pause_for(step, ctx.stop);
        const std::string s = std::to_string(slot);
        for (int round = 0; round < 1000; ++round) {
            const auto keys = test::detail::split_lines(
                fixture_.command(from, {"CLUSTER", "GETKEYSINSLOT", s, batch}));
            if (keys.empty()) {
                break;
            }
            std::vector<std::string> args{"MIGRATE", "127.0.0.1", std::to_string(to),
                                          "",        "0",         "5000"};
            if (replace) {
                args.push_back("REPLACE");
            }
            args.push_back("KEYS");
            args.insert(args.end(), keys.begin(), keys.end());
            try {
                (void)fixture_.command(from, args);
            } catch (const std::exception& e) {
                const std::string what = e.what();
                if (replace || what.find("BUSYKEY") == std::string::npos) {
                    throw;
                }
                std::string listed;
                for (const auto& k : keys) {
                    listed += (listed.empty() ? "" : " ") + k;
                }
                if (rec.problem.empty()) {
                    rec.problem = "MIGRATE of slot " + s +
                                  " without REPLACE, as redis-cli "
                                  "--cluster reshard sends it, was refused (" +
                                  what.substr(what.find("BUSYKEY")) +
                                  "): a key of the slot was written on the target while the "
                                  "source still had it; keys in the batch: " +
                                  listed;
                }
                // Heal: finish the move the way an operator's --cluster fix would.
                args.insert(args.begin() + 6, "REPLACE");
                (void)fixture_.command(from, args);
            }
            pause_for(step / 4, ctx.stop);
        }
        pause_for(step, ctx.stop);
        fixture_.finish_migration(slot, from, to);
    }

    // Until every running node names `replica` a master.
    void wait_master(int replica) {
        fixture_.wait_until("127.0.0.1:" + std::to_string(replica) + " promoted", [&] {
            for (const int port : fixture_.ports()) {
                if (fixture_.running(port)) {
                    const auto m = fixture_.masters(port);
                    if (std::find(m.begin(), m.end(), replica) == m.end()) {
                        return false;
                    }
                }
            }
            return true;
        });
    }

    // The node's command line as tests/support/redis_cluster.hpp starts it (the process
    // rewrites its own /proc/<pid>/cmdline, so it is rebuilt from the node's directory).
    std::vector<std::string> command_line(int port) const {
        const node_reply dir = ask(port, {"CONFIG", "GET", "dir"});
        if (dir.elements.size() != 2) {
            throw std::runtime_error{"cannot read the directory of node " + std::to_string(port)};
        }
        const std::string& d = dir.elements[1];
        return {test::detail::find_executable("redis-server"),
                "--port",
                std::to_string(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                d,
                "--logfile",
                d + "/log",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                d + "/nodes.conf",
                "--cluster-node-timeout",
                "2000",
                "--repl-diskless-sync-delay",
                "0",
                "--hz",
                "100"};
    }

    // The node on `port` again, from the same command line: it rejoins from its nodes.conf.
    void respawn(const std::vector<std::string>& args, int port) {
        const int out = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
        const pid_t pid = test::detail::spawn(args, out, out);
        ::close(out);
        respawned_.push_back(pid);
        fixture_.wait_until("the restarted node 127.0.0.1:" + std::to_string(port), [&] {
            const auto probe =
                test::probe_tcp("127.0.0.1", port, {"PING"}, std::chrono::milliseconds{500});
            return probe.line && *probe.line == "+PONG" &&
                   info_field(port, "replication", "master_link_status") == "up";
        });
    }

    test::redis_cluster fixture_;
    std::vector<pid_t> respawned_;
};

}  // namespace redislock::torture
