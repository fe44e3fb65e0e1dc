// redislock-torture: the command line.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "torture/journal.hpp"
#include "torture/plan.hpp"

namespace redislock::torture {

inline constexpr const char* usage_text =
    R"(usage: redislock-torture [--topology single|sentinel|cluster|redlock|all[,...]] [--uri URI]
                         [--seed S] [--seconds N | --minutes M] [--processes P] [--threads T]
                         [--names N] [--brisk]
                         [--verbose] [--trace N|violations] [--no-faults] [--no-netns] [--print-plan]
                         [--help]

A seeded schedule explorer for redislock: P worker processes x T threads run a plan of lock
operations drawn from the seed (every lock kind and semaphores; several objects per owner with
different leases, re-entry, extend, verify, try_lock_for with random deadlines, stop requests,
watchdog and fencing on and off, fork(), a client destroyed while its lock lives) against a
topology the tool starts itself, while it injects the faults of that topology (slot migrations
with and without REPLACE, graceful and forced failovers, kill -9 and restart, SIGSTOP, CLIENT
KILL, CLIENT PAUSE, DEBUG SLEEP, OOM, eviction of queue keys, a stalled or slow network path
through a proxy, packets to a server dropped, kill -9 of a waiting process). From outside Redis
it checks: no two holders at once (no more than its 2 permits for a semaphore), fencing tokens
that strictly increase, timed calls that return by their deadline + 50 ms, waiters that get a
free lock in time, no error without a fault that allows it, nothing left in Redis but fencing
counters and semaphores' counts, no leaked descriptor or thread.

  --topology T    single (one server, default), sentinel (a master, two replicas, three
                  sentinels), cluster (three masters with a replica each), redlock (five
                  masters); a comma-separated list, or all, runs each in turn.
  --uri URI       run against the server at URI instead (redis://[user:password@]host:port[/db]);
                  only faults that need no control of its process: the tool's own proxies in
                  front of it, eviction of the tool's queue keys, kill -9 of its own workers.
  --seed S        the plan's seed, decimal or 0x-hex (default: random, printed; also taken from
                  the environment variable REDISLOCK_TORTURE_SEED).
  --seconds N     how long each topology runs (default 20).
  --minutes M     a soak: M minutes per topology.
  --processes P   worker processes (default 3, at most 16).
  --threads T     threads per worker process (default 3, at most 16).
  --names N       lock names (default 5, Redlock 3, at most 64): more names, more acquisitions
                  per second (for a soak), less contention on each.
  --brisk         a soak for volume: holds and pauses of a few milliseconds, no lock left to
                  expire, and each thread replays its episodes until the time is up.
  --verbose       also print each fault as it happened.
  --trace N       at the end, print everything logged about name N (0, 1, ...) in time order;
                  `--trace violations`: about each of the first three names a violation names
                  (exclusion and error findings first).
  --no-faults     draw the plan as usual but cause none of its faults (a finding without faults
                  is not theirs).
  --print-plan    print every episode and fault of the plan, then exit (nothing runs).
  --no-netns      do not move into a private network namespace (then no iptables packet drops:
                  dropped packets are played by stalled proxies where there are any).

Prints, per topology, the seed and the command line that draws the same plan again, an
`operations:` line (the plan's size: the same for the same seed, length and counts), one line
per violation, and a summary line. Exit status: 0 when every check held, 1 when one did not,
2 for a bad command line, 3 when the tool itself could not run (a topology that did not start).
)";

/// --trace violations: trace the names the violations are about.
inline constexpr int trace_violations = -2;

struct options {
    std::vector<topology_kind> topologies{topology_kind::single};
    std::string uri;
    std::optional<std::uint64_t> seed;
    int run_ms = 20'000;
    int processes = 3;
    int threads = 3;
    int names = 0;
    bool brisk = false;
    bool verbose = false;
    bool faults = true;
    bool netns = true;
    bool print_plan = false;
    int trace = -1;  ///< a name's index, -1 for none, or trace_violations
    bool help = false;
};

inline std::uint64_t parse_seed(std::string_view text) {
    std::size_t used = 0;
    const std::string s{text};
    const std::uint64_t v = std::stoull(s, &used, 0);
    if (used != s.size()) {
        throw std::invalid_argument{"bad seed '" + s + "'"};
    }
    return v;
}

inline int parse_count(std::string_view what, std::string_view text, int lo, int hi) {
    std::size_t used = 0;
    const std::string s{text};
    int v = 0;
    try {
        v = std::stoi(s, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != s.size() || s.empty() || v < lo || v > hi) {
        throw std::invalid_argument{std::string{what} + " takes a number from " +
                                    std::to_string(lo) + " to " + std::to_string(hi) + ", not '" +
                                    s + "'"};
    }
    return v;
}

/// Parses the command line. @throws std::invalid_argument with what is wrong.
inline options parse_options(const std::vector<std::string_view>& args) {
    options o;
    bool topology_given = false;
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string_view a = args[i];
        const auto value = [&]() -> std::string_view {
            if (i + 1 >= args.size()) {
                throw std::invalid_argument{std::string{a} + " needs a value"};
            }
            return args[++i];
        };
        if (a == "--help" || a == "-h") {
            o.help = true;
        } else if (a == "--topology") {
            topology_given = true;
            o.topologies.clear();
            std::string list{value()};
            std::size_t start = 0;
            while (start <= list.size()) {
                const std::size_t comma = std::min(list.find(',', start), list.size());
                const std::string t = list.substr(start, comma - start);
                if (t == "single") {
                    o.topologies.push_back(topology_kind::single);
                } else if (t == "sentinel") {
                    o.topologies.push_back(topology_kind::sentinel);
                } else if (t == "cluster") {
                    o.topologies.push_back(topology_kind::cluster);
                } else if (t == "redlock") {
                    o.topologies.push_back(topology_kind::redlock);
                } else if (t == "all") {
                    o.topologies.insert(o.topologies.end(),
                                        {topology_kind::single, topology_kind::sentinel,
                                         topology_kind::cluster, topology_kind::redlock});
                } else {
                    throw std::invalid_argument{"unknown topology '" + t +
                                                "' (single, sentinel, cluster, redlock, all)"};
                }
                start = comma + 1;
            }
        } else if (a == "--uri") {
            o.uri = std::string{value()};
        } else if (a == "--seed") {
            o.seed = parse_seed(value());
        } else if (a == "--seconds") {
            o.run_ms = parse_count("--seconds", value(), 5, 86'400) * 1000;
        } else if (a == "--minutes") {
            o.run_ms = parse_count("--minutes", value(), 1, 1440) * 60'000;
        } else if (a == "--processes") {
            o.processes = parse_count("--processes", value(), 1, max_processes);
        } else if (a == "--threads") {
            o.threads = parse_count("--threads", value(), 1, max_threads);
        } else if (a == "--names") {
            o.names = parse_count("--names", value(), 1, max_names);
        } else if (a == "--brisk") {
            o.brisk = true;
        } else if (a == "--verbose") {
            o.verbose = true;
        } else if (a == "--no-faults") {
            o.faults = false;
        } else if (a == "--trace") {
            const std::string_view v = value();
            o.trace =
                v == "violations" ? trace_violations : parse_count("--trace", v, 0, max_names - 1);
        } else if (a == "--print-plan") {
            o.print_plan = true;
        } else if (a == "--no-netns") {
            o.netns = false;
        } else {
            throw std::invalid_argument{"unknown argument '" + std::string{a} + "'"};
        }
    }
    if (!o.uri.empty()) {
        if (topology_given) {
            throw std::invalid_argument{"--uri and --topology exclude each other"};
        }
        o.topologies = {topology_kind::given};
    }
    if (!o.seed) {
        if (const char* env = std::getenv("REDISLOCK_TORTURE_SEED"); env != nullptr && *env) {
            o.seed = parse_seed(env);
        }
    }
    return o;
}

}  // namespace redislock::torture
