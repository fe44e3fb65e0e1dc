// redislock-torture: what a fault did and what it excuses, and the means the topologies use to
// cause faults: signals, raw commands to a node, packet drops with iptables in the private
// network namespace the tool runs in, and the choice of a waiting process to kill.
//
// A fault_record tells the checkers, for the time it lasted (and a short while after it
// healed), which names it touched, which client paths, and what it excuses:
// - blocks: the names need not be acquirable (the liveness bound is not applied);
// - errors_ok: lock calls on them may throw (connection, timeout, unavailable, server errors);
// - loses: a failover or a restart may lose acknowledged writes (asynchronous replication, as
//   docs/guarantees.md says), so two holders at once are excused when the first held across it
//   (any_holder) or acquired just before it (recent).
// Nothing excuses fencing tokens that fail to increase, leftovers, leaks, or a timed call that
// overruns its deadline.
#pragma once

#include <signal.h>
#include <sys/time.h>
#include <sys/types.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/redis_server.hpp"
#include "torture/journal.hpp"
#include "torture/plan.hpp"

namespace redislock::torture {

enum class write_loss { none, recent, any_holder };

struct fault_record {
    fault_kind kind{};
    std::string what;             ///< the fault and its targets, for reports
    std::int64_t start = 0;       ///< ns
    std::int64_t end = 0;         ///< healed, ns
    std::uint64_t names = ~0ULL;  ///< bit per name it touched
    int path = -2;  ///< -2: every client path; -3: every path through a proxy; k: only proxy k
    bool blocks = true;
    bool errors_ok = true;
    bool replicas_only = false;     ///< only replicas: matters to min_replicas > 0 only
    int masters = 1;                ///< Redlock: how many masters it touched
    std::vector<int> master_ports;  ///< Redlock: the masters it touched
    write_loss loses = write_loss::none;
    std::int64_t error_slack_ns = 1'000'000'000;  ///< after `end`, errors still excused
    std::int64_t block_slack_ns = 0;              ///< after `end`, liveness still excused
    bool applied = true;
    bool unplanned = false;  ///< the topology did it on its own (see topology::unplanned)
    std::string problem;     ///< what the fault itself found wrong in the library (a violation)
    std::string tool_error;  ///< the fault could not be caused or healed (the run is suspect)

    bool touches(int name) const { return name >= 0 && name < 64 && ((names >> name) & 1U) != 0; }
};

/// How long after a fault healed a name may still be kept from waiters. A fault that holds
/// commands back (a stopped, paused or busy server, a stalled or slow path, dropped packets)
/// lets them land late: an acquisition abandoned meanwhile is removed by the client's reaper
/// within its backoff (at most 1 s) once the server answers, unless the fault outlasted the
/// entry's lease, when the reaper has given up and the entry lives its lease from landing (as
/// docs/operations.md says). Dropped packets come back with TCP's retransmission, up to a
/// second later. Connections closed under a call (CLIENT KILL, a cut path) lose the replies of
/// what was under way: an acquisition that landed is abandoned and a release left to the reaper,
/// which finishes them after its pause, behind the other cleanups of that server's lane (1.24 s
/// after a CLIENT KILL was seen on a loaded machine). Other faults leave nothing late.
inline std::int64_t ghost_slack_ns(fault_kind kind, int duration_ms, int max_lease_ms) {
    constexpr std::int64_t ms = 1'000'000;
    switch (kind) {
        case fault_kind::client_kill:
        case fault_kind::proxy_cut:
            return 1500 * ms;
        case fault_kind::sigstop:
        case fault_kind::client_pause:
        case fault_kind::server_sleep:
        case fault_kind::proxy_stall:
        case fault_kind::proxy_delay:
            return (std::max(1500, std::min(max_lease_ms, duration_ms)) + 500) * ms;
        case fault_kind::net_drop:
            return (std::max(1500, std::min(max_lease_ms, duration_ms + 1000)) + 1500) * ms;
        case fault_kind::failover:
        case fault_kind::forced_failover:
            return std::int64_t{max_lease_ms + 1000} * ms;
        case fault_kind::migrate:
            return 500 * ms;
        default:
            return 1000 * ms;
    }
}

/// A waiting worker killed by kill_waiter, as it was when it died.
struct kill_event {
    std::int64_t at = 0;
    int process = 0;
    struct held {
        int name;
        std::int64_t acquired;
        std::int64_t last_owned;
        std::int64_t fence;
        int lease_ms;
        std::uint32_t actor;
        int flags;
        int object;
        int episode;
        int thread;
        int min_replicas;
    };
    struct waited {
        int name;
        std::int64_t since;
        int lease_ms;
        int thread;
    };
    std::vector<held> holds;
    std::vector<waited> waits;
};

/// Sleeps `d`, in steps, returning early (false) once `stop` is set.
inline bool pause_for(std::chrono::milliseconds d, const std::atomic<bool>& stop) {
    const auto until = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < until) {
        if (stop.load()) {
            return false;
        }
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            until - std::chrono::steady_clock::now(), std::chrono::milliseconds{10}));
    }
    return true;
}

/// One command to 127.0.0.1:port over a connection of its own, apart from the library.
struct node_reply {
    bool ok = false;                    ///< an answer that is not an error
    std::string text;                   ///< string, status, error or integer
    std::vector<std::string> elements;  ///< an array's elements (nested arrays flattened)
};

inline node_reply node_command(int port, const std::vector<std::string>& args,
                               std::chrono::milliseconds timeout = std::chrono::seconds{5},
                               const std::string& host = "127.0.0.1",
                               const std::string& password = {}, int db = 0) {
    node_reply out;
    const timeval tv{static_cast<time_t>(timeout.count() / 1000),
                     static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    const std::unique_ptr<redisContext, decltype(&redisFree)> ctx{
        redisConnectWithTimeout(host.c_str(), port, tv), &redisFree};
    if (!ctx || ctx->err != 0 || redisSetTimeout(ctx.get(), tv) != REDIS_OK) {
        out.text = "cannot connect to " + host + ":" + std::to_string(port);
        return out;
    }
    const auto run = [&](const std::vector<std::string>& argv_strings) {
        std::vector<const char*> argv;
        std::vector<std::size_t> lengths;
        for (const auto& a : argv_strings) {
            argv.push_back(a.data());
            lengths.push_back(a.size());
        }
        return std::unique_ptr<redisReply, decltype(&freeReplyObject)>{
            static_cast<redisReply*>(redisCommandArgv(ctx.get(), static_cast<int>(argv.size()),
                                                      argv.data(), lengths.data())),
            &freeReplyObject};
    };
    if (!password.empty()) {
        (void)run({"AUTH", password});
    }
    if (db != 0) {
        (void)run({"SELECT", std::to_string(db)});
    }
    const auto r = run(args);
    if (!r) {
        out.text = "no answer from " + host + ":" + std::to_string(port);
        return out;
    }
    const auto text_of = [](const redisReply& e) -> std::string {
        switch (e.type) {
            case REDIS_REPLY_STRING:
            case REDIS_REPLY_STATUS:
            case REDIS_REPLY_ERROR:
                return std::string{e.str, e.len};
            case REDIS_REPLY_INTEGER:
                return std::to_string(e.integer);
            default:
                return {};
        }
    };
    out.ok = r->type != REDIS_REPLY_ERROR;
    out.text = text_of(*r);
    if (r->type == REDIS_REPLY_ARRAY) {
        for (std::size_t i = 0; i < r->elements; ++i) {
            const redisReply& e = *r->element[i];
            if (e.type == REDIS_REPLY_ARRAY) {
                for (std::size_t j = 0; j < e.elements; ++j) {
                    out.elements.push_back(text_of(*e.element[j]));
                }
            } else {
                out.elements.push_back(text_of(e));
            }
        }
    }
    return out;
}

/// A field of INFO (e.g. "process_id"), empty when absent.
inline std::string info_field(int port, const std::string& section, const std::string& field) {
    const node_reply r = node_command(port, {"INFO", section});
    const std::string key = field + ":";
    const auto at = r.text.find(key);
    if (at == std::string::npos) {
        return {};
    }
    const auto end = r.text.find_first_of("\r\n", at);
    return r.text.substr(at + key.size(), end - at - key.size());
}

/// The pid of the redis-server serving `port` (INFO server), or -1.
inline pid_t server_pid(int port) {
    const std::string pid = info_field(port, "server", "process_id");
    return pid.empty() ? -1 : static_cast<pid_t>(std::stol(pid));
}

/// Whether process `pid` is gone or a zombie (its state is frozen).
inline bool process_gone(pid_t pid) {
    const char state = test::detail::process_state(pid);
    return state == '\0' || state == 'Z' || state == 'X';
}

/// A script that keeps the server busy for ARGV[1] ms, as DEBUG SLEEP does, where DEBUG is off.
inline constexpr const char* busy_script =
    "local t = redis.call('TIME') "
    "local stop = t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1]) "
    "repeat t = redis.call('TIME') until t[1] * 1000 + math.floor(t[2] / 1000) >= stop "
    "return 1";

/// Packet drops with iptables, inside the private network namespace the tool made for itself
/// (never the host's). Usable when the namespace exists and iptables runs in it.
class packet_filter {
public:
    explicit packet_filter(bool in_private_namespace) {
        if (!in_private_namespace) {
            return;
        }
        try {
            binary_ = test::detail::find_executable("iptables");
        } catch (const std::exception&) {
            if (::access("/usr/sbin/iptables", X_OK) != 0) {
                return;
            }
            binary_ = "/usr/sbin/iptables";
        }
        usable_ = run({"-L", "INPUT", "-n"});
    }

    bool usable() const { return usable_; }

    /// Drops every packet to `port` (requests, and the SYNs of new connections).
    bool drop(int port) {
        return run({"-I", "INPUT", "-p", "tcp", "--dport", std::to_string(port), "-j", "DROP"});
    }
    bool undrop(int port) {
        return run({"-D", "INPUT", "-p", "tcp", "--dport", std::to_string(port), "-j", "DROP"});
    }

private:
    bool run(std::vector<std::string> args) {
        if (binary_.empty()) {
            return false;
        }
        args.insert(args.begin(), binary_);
        try {
            const auto result = test::detail::run_capture(args, std::chrono::seconds{10});
            return WIFEXITED(result.status) && WEXITSTATUS(result.status) == 0;
        } catch (const std::exception&) {
            return false;
        }
    }

    std::string binary_;
    bool usable_ = false;
};

/// The workers waiting for a lock now, oldest first: (process, thread, name, since).
struct waiting_worker {
    int process;
    int thread;
    int name;
    std::int64_t since;
};

inline std::vector<waiting_worker> waiting_workers(journal& j, int processes, int threads,
                                                   std::int64_t waited_at_least_ns) {
    std::vector<waiting_worker> out;
    const std::int64_t now = monotonic_ns();
    for (int p = 0; p < processes; ++p) {
        process_now& pn = j.process(p);
        if (pn.pid.load() <= 0 || pn.killed_by_fault.load() != 0 || pn.finished.load() != 0) {
            continue;
        }
        for (int t = 0; t < threads; ++t) {
            const thread_now& tn = pn.threads[t];
            const int name = tn.waiting_name.load();
            const std::int64_t since = tn.waiting_since.load();
            if (name >= 0 && since > 0 && now - since >= waited_at_least_ns) {
                out.push_back({p, t, name, since});
            }
        }
    }
    std::sort(out.begin(), out.end(),
              [](const waiting_worker& a, const waiting_worker& b) { return a.since < b.since; });
    return out;
}

}  // namespace redislock::torture
