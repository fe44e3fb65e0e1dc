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
    line += shape.topology == topology_kind::given ? "--uri " + uri
                                                   : "--topology " + std::string{to_string(shape.topology)};
    line += " --seed " + seed_text(shape.seed);
    if (shape.run_ms % 60'000 == 0 && shape.run_ms >= 60'000) {
        line += " --minutes " + std::to_string(shape.run_ms / 60'000);
    } else {
        line += " --seconds " + std::to_string(shape.run_ms / 1000);
    }
    line += " --processes " + std::to_string(shape.processes) + " --threads " +
            std::to_string(shape.threads);
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

inline void print_fault(std::ostream& out, const checker& c, const fault_record& f) {
    out << "  fault " << c.at(f.start) << " .. " << c.at(f.end) << ": "
        << (f.applied ? "" : "(not applied) ") << f.what << "\n";
}

struct summary {
    std::size_t acquisitions = 0;
    std::size_t faults_applied = 0;
    std::size_t faults_planned = 0;
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
}

inline void print_summary(std::ostream& out, const plan& p, const summary& s, const findings& f) {
    out << "summary " << to_string(p.shape.topology) << ": acquisitions " << s.acquisitions
        << ", faults " << s.faults_applied << " of " << s.faults_planned << " applied, violations "
        << s.violations;
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
