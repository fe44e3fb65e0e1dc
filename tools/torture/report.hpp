// redislock-torture: what a run prints. Per topology: a header with the seed and the command line
// that draws the same plan again, the `operations:` line (the plan's size, the same for the same
// seed), the faults as they happened (--verbose), one line per violation (the check, the time
// into the run, the operation, the name, the holders and their times, the faults around), and a
// one-line summary.
#pragma once

#include <cinttypes>
#include <cstdio>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "torture/checks.hpp"
#include "torture/plan.hpp"

namespace redislock::torture {

inline std::string seed_text(std::uint64_t seed) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%016" PRIx64, seed);
    return buf;
}

/// The command line that draws the same plan.
inline std::string reproduce_line(const run_shape& shape, const std::string& uri) {
    std::string line = "redislock-torture ";
    line += shape.topology == topology_kind::given
                ? "--uri " + uri
                : "--topology " + std::string{to_string(shape.topology)};
    line += " --seed " + seed_text(shape.seed);
    if (shape.run_ms % 60'000 == 0 && shape.run_ms >= 60'000) {
        line += " --minutes " + std::to_string(shape.run_ms / 60'000);
    } else {
        line += " --seconds " + std::to_string(shape.run_ms / 1000);
    }
    line += " --processes " + std::to_string(shape.processes) + " --threads " +
            std::to_string(shape.threads);
    if (shape.names > 0) {
        line += " --names " + std::to_string(shape.names);
    }
    if (shape.brisk) {
        line += " --brisk";
    }
    return line;
}

inline void print_header(std::ostream& out, const plan& p, const std::string& where,
                         const std::string& uri) {
    out << "== " << to_string(p.shape.topology) << ": " << where << "\n"
        << "seed " << seed_text(p.shape.seed) << " (the same plan: " << reproduce_line(p.shape, uri)
        << ")\n";
    const std::size_t ops = p.operations();
    out << "operations: " << ops << " (" << (ops - p.faults.size()) << " lock operations in "
        << p.episodes() << " episodes of " << p.shape.processes << " processes x "
        << p.shape.threads << " threads, " << p.faults.size() << " faults)\n"
        << std::flush;
}

inline std::string describe_episode(const thread_plan& t, const episode& e) {
    const auto& o = t.objects[static_cast<std::size_t>(e.object)];
    std::string s = e.what == episode::kind::fork           ? "fork, the child: "
                    : e.what == episode::kind::fresh_client ? "on a fresh client: "
                                                            : "";
    s += "name " + std::to_string(o.name) + " object #" + std::to_string(e.object) + " (lease " +
         std::to_string(o.lease_ms) + " ms" + (o.watchdog ? ", watchdog" : "") +
         (o.fencing ? ", fencing" : "") +
         (o.min_replicas > 0 ? ", min_replicas " + std::to_string(o.min_replicas) : "") +
         (o.explicit_owner ? ", explicit owner" : "") + ", client " + std::to_string(o.client) +
         "): " + std::string{to_string(e.call)};
    if (e.call == call_kind::try_lock_for || e.call == call_kind::try_lock_until ||
        e.call == call_kind::try_lock_for_stop) {
        s += " " + std::to_string(e.timeout_ms) + " ms";
    }
    if (e.call == call_kind::lock_stop || e.call == call_kind::try_lock_for_stop) {
        s += ", stop after " + std::to_string(e.stop_ms) + " ms";
    }
    s += std::string{e.shared ? ", read" : ""} + ", hold " + std::to_string(e.hold_ms) + " ms";
    for (const auto& st : e.steps) {
        s += ", @" + std::to_string(st.at_ms) + " ms ";
        switch (st.what) {
            case inner_step::kind::reenter: {
                const auto& so = t.objects[static_cast<std::size_t>(st.object)];
                s += "re-enter through object #" + std::to_string(st.object) + " (lease " +
                     std::to_string(so.lease_ms) + " ms" + (so.watchdog ? ", watchdog" : "") + ")" +
                     (st.shared ? " to read" : "") + " for " + std::to_string(st.hold_ms) + " ms";
                break;
            }
            case inner_step::kind::extend:
                s += "extend(" + std::to_string(st.lease_ms) + " ms)";
                break;
            case inner_step::kind::verify:
                s += "verify()";
                break;
        }
    }
    return s + ", then " + std::string{to_string(e.release)} + ", idle " +
           std::to_string(e.idle_ms) + " ms";
}

/// Every episode and fault of the plan.
inline void print_plan(std::ostream& out, const plan& p) {
    for (std::size_t pi = 0; pi < p.processes.size(); ++pi) {
        const auto& proc = p.processes[pi];
        for (std::size_t c = 0; c < proc.clients.size(); ++c) {
            const auto& cl = proc.clients[c];
            out << "p" << pi << " client " << c << ": path " << cl.path << ", command_timeout "
                << cl.command_timeout_ms << " ms, connect_timeout " << cl.connect_timeout_ms
                << " ms, node_timeout " << cl.node_timeout_ms << " ms\n";
        }
        for (std::size_t ti = 0; ti < proc.threads.size(); ++ti) {
            const auto& t = proc.threads[ti];
            for (std::size_t e = 0; e < t.episodes.size(); ++e) {
                out << "p" << pi << "t" << ti << " episode " << e << ": "
                    << describe_episode(t, t.episodes[e]) << "\n";
            }
        }
    }
    for (const auto& f : p.faults) {
        out << "fault at " << f.at_ms << " ms: " << to_string(f.kind) << ", " << f.duration_ms
            << " ms, target " << f.target << ", count " << f.count << ", variant " << f.variant
            << ", pick " << f.pick << "\n";
    }
}

/// Everything logged about one name, in time order (--trace).
inline void print_trace(std::ostream& out, const checker& c, const run_data& d, int name) {
    struct line {
        std::int64_t at;
        std::string text;
    };
    std::vector<line> lines;
    for (const auto& e : d.entries) {
        if (e.name != name || (e.type != record_type::call && e.type != record_type::hold)) {
            continue;
        }
        const std::string who = "p" + std::to_string(e.process) + "t" + std::to_string(e.thread) +
                                " ep " + std::to_string(e.episode) +
                                ((e.flags & flag_shared) ? " read" : "") +
                                ((e.flags & flag_fork_child) ? " (child)" : "") +
                                ((e.flags & flag_inner) ? " (inner)" : "");
        if (e.type == record_type::hold) {
            lines.push_back({e.t1, "hold " + who + " acquired " + c.at(e.t1) + ", owned " +
                                       c.at(e.t2) + ", let go " + c.at(e.t3) + ", free " +
                                       c.at(e.t4) + (e.op == 2 ? " (lost)" : "") + ", lease " +
                                       std::to_string(e.lease_ms) + ", token " +
                                       std::to_string(e.value)});
            continue;
        }
        static constexpr const char* ops[] = {"?",      "acquire", "reenter", "unlock",
                                              "extend", "verify",  "fork"};
        static constexpr const char* results[] = {"?",     "acquired", "refused",
                                                  "threw", "done",     "hung"};
        lines.push_back({e.t1, std::string{"call "} + who + " " + ops[e.op % 7] + " " + c.at(e.t1) +
                                   " .. " + c.at(e.t2) + " " + results[e.result % 6] + " value " +
                                   std::to_string(e.value) +
                                   (e.text.empty() ? "" : ": " + e.text)});
    }
    for (const auto& k : d.kills) {
        for (const auto& w : k.waits) {
            if (w.name == name) {
                lines.push_back({k.at, "kill of p" + std::to_string(k.process) + ", its t" +
                                           std::to_string(w.thread) + " waiting since " +
                                           c.at(w.since)});
            }
        }
        for (const auto& h : k.holds) {
            if (h.name == name) {
                lines.push_back({k.at, "kill of p" + std::to_string(k.process) + ", its t" +
                                           std::to_string(h.thread) + " holding since " +
                                           c.at(h.acquired)});
            }
        }
    }
    for (const auto& f : d.faults) {
        if (f.touches(name)) {
            lines.push_back({f.start, "fault " + f.what + " until " + c.at(f.end)});
        }
    }
    std::stable_sort(lines.begin(), lines.end(),
                     [](const line& a, const line& b) { return a.at < b.at; });
    out << "trace of '" << d.names[static_cast<std::size_t>(name)] << "':\n";
    for (const auto& l : lines) {
        out << "  " << c.at(l.at) << " " << l.text << "\n";
    }
}

inline void print_fault(std::ostream& out, const checker& c, const fault_record& f) {
    out << "  fault " << c.at(f.start) << " .. " << c.at(f.end) << ": "
        << (f.applied ? "" : "(not applied) ") << f.what << "\n";
}

struct summary {
    std::size_t acquisitions = 0;
    /// By kind: mutex, recursive_mutex, shared_mutex, counting_semaphore.
    std::size_t acquisitions_of[4] = {};
    std::size_t faults_applied = 0;
    std::size_t faults_planned = 0;
    std::size_t faults_unplanned = 0;  ///< changes the topology made on its own
    std::size_t violations = 0;
    std::size_t tool_errors = 0;
};

inline void print_findings(std::ostream& out, const findings& f, std::size_t most) {
    std::size_t shown = 0;
    for (const auto& v : f.violations) {
        if (shown++ == most) {
            out << "... and " << (f.violations.size() - most) << " more violations\n";
            break;
        }
        out << "VIOLATION " << v.check << ": " << v.text << "\n";
    }
    for (const auto& e : f.tool_errors) {
        out << "TOOL ERROR: " << e << "\n";
    }
    for (const auto& n : f.notes) {
        out << "NOTE: " << n << "\n";
    }
}

inline void print_summary(std::ostream& out, const plan& p, const summary& s, const findings& f) {
    out << "summary " << to_string(p.shape.topology) << ": acquisitions " << s.acquisitions
        << " (mutex " << s.acquisitions_of[0] << ", recursive_mutex " << s.acquisitions_of[1]
        << ", shared_mutex " << s.acquisitions_of[2] << ", counting_semaphore "
        << s.acquisitions_of[3] << ")"
        << ", faults " << s.faults_applied << " of " << s.faults_planned << " applied";
    if (s.faults_unplanned > 0) {
        out << " (and " << s.faults_unplanned << " unplanned)";
    }
    out << ", violations " << s.violations;
    if (!f.violations.empty()) {
        std::map<std::string, int> by_check;
        for (const auto& v : f.violations) {
            ++by_check[v.check];
        }
        out << " (";
        bool first = true;
        for (const auto& [check, n] : by_check) {
            out << (first ? "" : ", ") << check << " " << n;
            first = false;
        }
        out << ")";
    }
    int excused = 0;
    for (const auto& [check, n] : f.excused) {
        excused += n;
    }
    out << ", excused " << excused;
    if (excused > 0) {
        out << " (";
        bool first = true;
        for (const auto& [check, n] : f.excused) {
            out << (first ? "" : ", ") << check << " " << n;
            first = false;
        }
        out << ")";
    }
    if (s.tool_errors > 0) {
        out << ", tool errors " << s.tool_errors;
    }
    out << ", seed " << seed_text(p.shape.seed) << "\n" << std::flush;
}

}  // namespace redislock::torture
