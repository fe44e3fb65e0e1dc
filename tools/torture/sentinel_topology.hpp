// redislock-torture: a Sentinel deployment (tests/support/redis_sentinel.hpp: a master, two
// replicas, three sentinels with down-after 2 s) and its faults: planned failovers (SENTINEL
// FAILOVER), forced ones (kill -9 of the master, or a SIGSTOP long enough for the sentinels to
// give up on it), replicas stopped or killed (what min_replicas must notice), and the server
// faults of one node on the master. A demoted master is re-pointed at the new one soon after
// the switch, as the sentinels would do after their 10 s INFO period.
//
// The sentinels may also fail over on their own: on a loaded machine one that cannot reach a
// master just promoted for down-after takes it for down, and the others may agree. Between
// faults the tool asks them for the master; a new one is followed as a forced failover would
// be, and recorded as an unplanned fault, so that the checks allow what a failover allows and
// the report says it happened.
#pragma once

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/redis_sentinel.hpp"
#include "torture/faults.hpp"
#include "torture/topology.hpp"

namespace redislock::torture {

class sentinel_topology : public topology {
public:
    sentinel_topology() {
        master_ = fixture_.master_port();
        ports_.push_back(master_);
        const std::string info = fixture_.node(master_).cli({"INFO", "replication"});
        for (std::size_t at = 0; (at = info.find(",port=", at)) != std::string::npos; ++at) {
            ports_.push_back(std::stoi(info.substr(at + 6)));
        }
        if (ports_.size() != 3) {
            throw std::runtime_error{"sentinel: expected a master and two replicas, found " +
                                     std::to_string(ports_.size()) + " nodes"};
        }
    }

    std::string describe() const override {
        std::string sentinels;
        for (const int p : fixture_.sentinel_ports()) {
            sentinels += (sentinels.empty() ? "" : ",") + std::to_string(p);
        }
        return "Sentinel: master 127.0.0.1:" + std::to_string(master_) + ", replicas " +
               std::to_string(ports_[1]) + "," + std::to_string(ports_[2]) + ", sentinels " +
               sentinels;
    }

    endpoints where() const override {
        endpoints e;
        e.kind = topology_kind::sentinel;
        e.direct = fixture_.uri();
        return e;
    }

    /// Every data node that says it is a master (a stuck failover may leave more than one).
    std::vector<int> masters() override {
        std::vector<int> out;
        for (const int port : ports_) {
            if (info_field(port, "replication", "role") == "master") {
                out.push_back(port);
            }
        }
        return out.empty() ? std::vector<int>{master_} : out;
    }
    std::vector<int> all_ports() override { return ports_; }
    int port_for_key(const std::string&) override { return master_; }

    bool can(fault_kind kind, const fault_context&) const override {
        switch (kind) {
            case fault_kind::failover:
            case fault_kind::forced_failover:
            case fault_kind::sigstop:
            case fault_kind::replica_stop:
            case fault_kind::replica_kill:
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
        try {
            return apply_to_nodes(spec, ctx);
        } catch (const std::exception& e) {
            // The fixture gave up waiting: say what the first sentinel saw.
            throw std::runtime_error{std::string{e.what()} + "; sentinel-0 log: " + log_tail()};
        }
    }

    std::optional<fault_record> unplanned(fault_context& ctx) override {
        const std::int64_t now = monotonic_ns();
        bool moved = false;
        for (const int sentinel : fixture_.sentinel_ports()) {
            const node_reply r = node_command(
                sentinel,
                {"SENTINEL", "GET-MASTER-ADDR-BY-NAME", test::redis_sentinel::master_name},
                std::chrono::milliseconds{500});
            moved = moved || (r.elements.size() == 2 && r.elements[1] != std::to_string(master_));
        }
        if (!moved) {
            last_steady_ = now;
            return std::nullopt;
        }
        fault_record rec;
        rec.kind = fault_kind::forced_failover;
        rec.unplanned = true;
        // The failover started before the switch was seen: down-after, then an election and a
        // promotion while the old master still took writes.
        rec.start = std::min(last_steady_, now) - (down_after_ms + 1500) * std::int64_t{1'000'000};
        const int old = master_;
        switch_to(fixture_.wait_agreed_master([old](int p) { return p != old; },
                                              std::chrono::seconds{30}));
        // As the sentinels would once they reach it: no writes on the old master from now on.
        fixture_.repoint(old, master_);
        wait_replicas();
        rec.end = monotonic_ns();
        rec.what =
            "the sentinels failed over on their own (not planned: one took the master for "
            "down), 127.0.0.1:" +
            std::to_string(old) + " -> 127.0.0.1:" + std::to_string(master_) +
            ", the old master re-pointed once every sentinel named the new one";
        rec.loses = write_loss::any_holder;
        rec.error_slack_ns = 3'000'000'000;
        rec.block_slack_ns =
            ghost_slack_ns(fault_kind::forced_failover, 0, ctx.the_plan.max_lease_ms());
        last_failover_ = rec.end;
        last_steady_ = rec.end;
        return rec;
    }

    void heal_all() override {
        for (const int port : ports_) {
            auto& node = fixture_.node(port);
            if (node.pid() > 0 && test::detail::process_state(node.pid()) == 'T') {
                node.resume();
            }
        }
    }

private:
    fault_record apply_to_nodes(const fault_spec& spec, fault_context& ctx) {
        fault_record rec;
        rec.kind = spec.kind;
        rec.start = monotonic_ns();
        rec.block_slack_ns =
            ghost_slack_ns(spec.kind, spec.duration_ms, ctx.the_plan.max_lease_ms());
        const std::string m = "127.0.0.1:" + std::to_string(master_);
        const std::string ms = std::to_string(spec.duration_ms);
        // The sentinels take a master that does not answer PING for down_after_ms for down:
        // pauses and busy scripts that must not cause a failover stay well below that.
        const int short_ms = std::min(spec.duration_ms, 700);
        switch (spec.kind) {
            case fault_kind::failover: {
                const int old = master_;
                if (!ready_for_failover(ctx)) {
                    rec.applied = false;
                    rec.what = "SENTINEL FAILOVER: the sentinels did not see two good replicas";
                    break;
                }
                fixture_.failover();
                switch_to(fixture_.wait_agreed_master([old](int p) { return p != old; },
                                                      std::chrono::seconds{20}));
                // Every sentinel names the new master: clients must be on it now. The demoted
                // master stays writable a while, as until the sentinels' INFO period would
                // re-point it; that is not part of the fault.
                rec.end = monotonic_ns();
                pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                fixture_.repoint(old, master_);
                wait_replicas();
                rec.what = "SENTINEL FAILOVER: " + m + " -> 127.0.0.1:" + std::to_string(master_) +
                           " (the old master re-pointed " + ms + " ms after the switch)";
                rec.loses = write_loss::recent;
                rec.error_slack_ns = 3'000'000'000;
                rec.block_slack_ns = 1'000'000'000;
                last_failover_ = monotonic_ns();
                return rec;
            }
            case fault_kind::forced_failover: {
                const int old = master_;
                if (!ready_for_failover(ctx)) {
                    rec.applied = false;
                    rec.what = "kill -9 of the master: the sentinels did not see two good replicas";
                    break;
                }
                fixture_.kill_node(old);
                switch_to(fixture_.wait_agreed_master([old](int p) { return p != old; }));
                pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                fixture_.node(old).start();
                fixture_.repoint(old, master_);
                wait_replicas();
                rec.what = "kill -9 of the master " + m +
                           ", failover to 127.0.0.1:" + std::to_string(master_) +
                           ", old master restarted empty as a replica";
                rec.loses = write_loss::any_holder;
                rec.error_slack_ns = 3'000'000'000;
                break;
            }
            case fault_kind::sigstop: {
                const int old = master_;
                fixture_.node(old).pause();
                pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                fixture_.node(old).resume();
                rec.what = "SIGSTOP of the master " + m + " for " + ms + " ms";
                if (spec.duration_ms >= down_after_ms - 200) {
                    // The sentinels may have started a failover: let it end, then follow it.
                    pause_for(std::chrono::milliseconds{2500}, ctx.stop);
                    switch_to(fixture_.wait_agreed_master([](int) { return true; }));
                    if (master_ != old) {
                        fixture_.repoint(old, master_);
                        rec.what += ", failover to 127.0.0.1:" + std::to_string(master_);
                    }
                    wait_replicas();
                    rec.loses = write_loss::any_holder;
                    rec.error_slack_ns = 3'000'000'000;
                    rec.block_slack_ns =
                        ghost_slack_ns(fault_kind::forced_failover, 0, ctx.the_plan.max_lease_ms());
                }
                break;
            }
            case fault_kind::replica_stop:
            case fault_kind::replica_kill: {
                const int replica = replicas()[static_cast<std::size_t>(spec.target % 2)];
                auto& node = fixture_.node(replica);
                rec.replicas_only = true;
                rec.blocks = false;
                if (spec.kind == fault_kind::replica_stop && spec.variant == 2) {
                    // Every replica at once: no WAIT can be satisfied, so each renewal and
                    // acquisition with min_replicas is refused while the master works on.
                    const auto all = replicas();
                    for (const int r : all) {
                        fixture_.node(r).pause();
                    }
                    pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                    for (const int r : all) {
                        fixture_.node(r).resume();
                    }
                    rec.what = "SIGSTOP of both replicas for " + ms + " ms";
                } else if (spec.kind == fault_kind::replica_stop) {
                    node.pause();
                    pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                    node.resume();
                    rec.what = "SIGSTOP of the replica 127.0.0.1:" + std::to_string(replica) +
                               " for " + ms + " ms";
                } else {
                    node.stop();
                    pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                    node.start();
                    fixture_.repoint(replica, master_);
                    rec.what = "kill -9 of the replica 127.0.0.1:" + std::to_string(replica) +
                               ", restarted after " + ms + " ms";
                }
                wait_replicas();
                break;
            }
            case fault_kind::client_kill:
                (void)ask(master_, {"CLIENT", "KILL", "TYPE", "normal"});
                rec.what = "CLIENT KILL TYPE normal on the master " + m;
                break;
            case fault_kind::client_pause: {
                const bool write = spec.variant == 1;
                const int d = write ? spec.duration_ms : short_ms;
                (void)ask(master_, {"CLIENT", "PAUSE", std::to_string(d), write ? "WRITE" : "ALL"});
                pause_for(std::chrono::milliseconds{d}, ctx.stop);
                (void)ask(master_, {"CLIENT", "UNPAUSE"});
                rec.what = "CLIENT PAUSE " + std::to_string(d) + (write ? " WRITE" : " ALL") +
                           " on the master " + m;
                break;
            }
            case fault_kind::server_sleep: {
                (void)ask(master_, {"EVAL", busy_script, "0", std::to_string(short_ms)},
                          std::chrono::milliseconds{short_ms + 10'000});
                rec.what = "the master " + m + " busy for " + std::to_string(short_ms) +
                           " ms (a script, as DEBUG SLEEP)";
                break;
            }
            case fault_kind::oom:
                (void)ask(master_, {"CONFIG", "SET", "maxmemory-policy", "noeviction"});
                (void)ask(master_, {"CONFIG", "SET", "maxmemory", "1"});
                pause_for(std::chrono::milliseconds{spec.duration_ms}, ctx.stop);
                (void)ask(master_, {"CONFIG", "SET", "maxmemory", "0"});
                rec.what = "maxmemory 1 (noeviction) on the master " + m + " for " + ms + " ms";
                break;
            default:
                rec.applied = false;
                break;
        }
        rec.end = monotonic_ns();
        if (rec.loses != write_loss::none) {
            last_failover_ = rec.end;
        }
        return rec;
    }

    // The last lines of the first sentinel's log that tell a failover's progress.
    std::string log_tail() const {
        const std::string info =
            node_command(fixture_.sentinel_ports().front(), {"INFO", "server"}).text;
        const auto at = info.find("config_file:");
        if (at == std::string::npos) {
            return "(unknown)";
        }
        std::string conf = info.substr(at + 12, info.find_first_of("\r\n", at) - at - 12);
        std::ifstream in{conf.substr(0, conf.rfind('/')) + "/sentinel-0.log"};
        std::vector<std::string> lines;
        for (std::string line; std::getline(in, line);) {
            if (line.find(" # ") != std::string::npos || line.find(" * +") != std::string::npos) {
                lines.push_back(line.substr(std::min<std::size_t>(line.size(), 33)));
            }
        }
        std::string out;
        for (std::size_t i = lines.size() > 6 ? lines.size() - 6 : 0; i < lines.size(); ++i) {
            out += lines[i] + " | ";
        }
        return out;
    }

    std::vector<int> replicas() const {
        std::vector<int> out;
        for (const int p : ports_) {
            if (p != master_) {
                out.push_back(p);
            }
        }
        return out;
    }

    void switch_to(int master) { master_ = master; }

    // Whether every sentinel knows two replicas in good health, the last failover is far
    // enough behind for them to start another (twice their failover-timeout), and they agree on
    // the master: waits up to 15 s for it.
    bool ready_for_failover(const fault_context& ctx) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds{15};
        while (std::chrono::steady_clock::now() < until && !ctx.stop.load()) {
            bool ready = monotonic_ns() - last_failover_ >= 7'000'000'000;
            for (const int sentinel : fixture_.sentinel_ports()) {
                const node_reply r = node_command(
                    sentinel, {"SENTINEL", "REPLICAS", test::redis_sentinel::master_name});
                int good = 0;
                for (std::size_t i = 0; i + 1 < r.elements.size(); ++i) {
                    if (r.elements[i] == "flags" && r.elements[i + 1] == "slave") {
                        ++good;
                    }
                }
                const node_reply m = node_command(sentinel, {"SENTINEL", "GET-MASTER-ADDR-BY-NAME",
                                                             test::redis_sentinel::master_name});
                ready = ready && good >= 2 && m.elements.size() == 2 &&
                        m.elements[1] == std::to_string(master_);
            }
            if (ready) {
                return true;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds{100});
        }
        return false;
    }

    // Until the master has both replicas online again (at most 20 s).
    void wait_replicas() {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds{20};
        while (std::chrono::steady_clock::now() < until) {
            const std::string info = info_text(master_, "replication");
            std::size_t online = 0;
            for (std::size_t at = 0; (at = info.find("state=online", at)) != std::string::npos;
                 ++at) {
                ++online;
            }
            if (online >= 2) {
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds{50});
        }
    }

    std::string info_text(int port, const std::string& section) const {
        return ask(port, {"INFO", section}).text;
    }

    // Long enough that a loaded machine rarely makes the sentinels fail over on their own.
    static constexpr int down_after_ms = 2000;

    test::redis_sentinel fixture_{std::nullopt, down_after_ms};
    int master_ = 0;
    std::int64_t last_steady_ = 0;  // when every sentinel last named master_
    std::int64_t last_failover_ = 0;
    std::vector<int> ports_;
};

}  // namespace redislock::torture
