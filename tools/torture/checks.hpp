// redislock-torture: the checks, made from outside Redis on what the workers logged, the faults
// did and the final scan found. Each finding is a violation unless a fault documented to allow
// it explains it (then it is counted as excused):
// - exclusion: no two holders of a name at once (readers may overlap readers), a hold counting
//   from the acquiring call's return to the last owned() that said yes;
// - fencing: a fenced acquisition granted before another one was asked for drew a smaller token;
// - deadlines: every timed call (try_lock_for, try_lock_until, a stop request) returns by its
//   deadline + 50 ms (Redlock: its first attempt may take node_timeout, as documented), every
//   unlock() within the connect and command timeouts + 50 ms; a late return is excused when the
//   process's own scheduler probe was as late then;
// - liveness: a waiter gets a free lock within the last holder's lease + 100 ms once it was
//   released (a loss by expiry with no fault around: within the drift allowance + the waiter's
//   backoff + 100 ms), a lock free when the call began within a connect and a command + 100 ms,
//   except while a fault blocks the name and for a while after it heals;
// - errors: no lock call throws and no release fails unless a fault allows it (a slot being
//   migrated allows none but a release still refused TRYAGAIN after its command timeout of
//   retries); no server answer says a lock is gone while its holder's local deadline is still
//   ahead;
// - leftovers, leaks, crashes, hangs, and what the faults themselves found (BUSYKEY).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "torture/faults.hpp"
#include "torture/journal.hpp"
#include "torture/plan.hpp"
#include "torture/server_probe.hpp"

namespace redislock::torture {

/// A record copied out of the journal.
struct entry {
    record_type type{};
    std::uint8_t op = 0, result = 0, error = 0;
    int name = 0, process = 0, thread = 0, call = 0, flags = 0, min_replicas = 0, client = 0;
    std::uint32_t actor = 0, episode = 0;
    std::int64_t t0 = 0, t1 = 0, t2 = 0, t3 = 0, t4 = 0, value = 0;
    int lease_ms = 0, timeout_ms = 0, remaining_ms = 0;
    std::string text;

    static entry of(const record& r) {
        entry e;
        e.type = r.type;
        e.op = r.op;
        e.result = r.result;
        e.error = r.error;
        e.name = r.name;
        e.process = r.process;
        e.thread = r.thread;
        e.call = r.call;
        e.flags = r.flags;
        e.min_replicas = r.min_replicas;
        e.client = r.client;
        e.actor = r.actor;
        e.episode = r.episode;
        e.t0 = r.t0;
        e.t1 = r.t1;
        e.t2 = r.t2;
        e.t3 = r.t3;
        e.t4 = r.t4;
        e.value = r.value;
        e.lease_ms = r.lease_ms;
        e.timeout_ms = r.timeout_ms;
        e.remaining_ms = r.remaining_ms;
        e.text = r.text;
        return e;
    }
};

struct violation {
    std::string check;
    std::string text;
    std::int64_t at = 0;
};

struct process_outcome {
    long fds_before = -1, fds_after = -1, tasks_before = -1, tasks_after = -1;
    bool finished = false;
    std::string death;  ///< how it died, when not by the run's hand
    std::string hang;   ///< what it was doing when the run had to kill it
};

/// Everything the checks look at.
struct run_data {
    const plan* the_plan = nullptr;
    std::vector<std::string> names;
    std::vector<entry> entries;
    std::vector<fault_record> faults;
    std::vector<kill_event> kills;
    std::vector<process_outcome> processes;
    std::vector<std::string> leftovers;
    std::vector<slow_answer> slow;  ///< servers that answered the run's probe slowly
    std::int64_t t0 = 0;
    std::int64_t t_end = 0;
    std::uint64_t overflow = 0;
};

struct findings {
    std::vector<violation> violations;
    std::map<std::string, int> excused;    ///< by check
    std::vector<std::string> tool_errors;  ///< the run could not be made (exit status 3)
    std::vector<std::string> notes;        ///< a fault that did not complete (its window excuses)
};

class checker {
public:
    explicit checker(const run_data& d) : d_{d}, p_{*d.the_plan} {
        // The lateness records of each process by start, for lateness(): a soak's journal holds
        // millions of entries and the checks ask about lateness for many of them.
        for (const auto& e : d_.entries) {
            if (e.type != record_type::late || e.process < 0) {
                continue;
            }
            const auto p = static_cast<std::size_t>(e.process);
            if (p >= late_by_process_.size()) {
                late_by_process_.resize(p + 1);
                longest_late_.resize(p + 1, 0);
            }
            late_by_process_[p].emplace_back(e.t1, e.t2);
            longest_late_[p] = std::max(longest_late_[p], e.t2);
        }
        for (auto& lates : late_by_process_) {
            std::sort(lates.begin(), lates.end());
        }
    }

    findings run() {
        exclusion();
        fencing();
        deadlines();
        liveness();
        errors();
        rest();
        std::sort(out_.violations.begin(), out_.violations.end(),
                  [](const violation& a, const violation& b) { return a.at < b.at; });
        return out_;
    }

    /// "+12.345s": a time of the run.
    std::string at(std::int64_t ns) const {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%+.3fs", static_cast<double>(ns - d_.t0) / 1e9);
        return buf;
    }

private:
    static constexpr std::int64_t ms = 1'000'000;

    struct hold_span {
        int name = 0, process = 0, thread = 0, flags = 0, lease_ms = 0, client = 0;
        std::uint32_t actor = 0, episode = 0;
        std::int64_t call_start = 0, acquired = 0, last_owned = 0, let_go = 0, free = 0;
        std::int64_t fence = 0;
        bool lost = false, killed = false;
        int min_replicas = 0;
        bool write() const { return (flags & flag_shared) == 0; }
        std::int64_t occupied_until() const { return lost ? let_go : free; }
    };

    // ---- helpers ---------------------------------------------------------------------------

    const std::string& name_of(int n) const { return d_.names[static_cast<std::size_t>(n)]; }

    // What the plan says of an episode, in short.
    std::string plan_of(int process, int thread, std::uint32_t episode) const {
        const auto& t = p_.processes[static_cast<std::size_t>(process)]
                            .threads[static_cast<std::size_t>(thread)];
        if (t.episodes.empty() || (episode >= t.episodes.size() && !p_.shape.brisk)) {
            return {};
        }
        const auto& e = t.episodes[episode % t.episodes.size()];  // --brisk replays them
        const auto& o = t.objects[static_cast<std::size_t>(e.object)];
        std::string s =
            " [object #" + std::to_string(e.object) + ": lease " + std::to_string(o.lease_ms) +
            " ms" + (o.watchdog ? ", watchdog" : "") + (o.fencing ? ", fencing" : "") +
            (o.min_replicas > 0 ? ", min_replicas " + std::to_string(o.min_replicas) : "") +
            (o.explicit_owner ? ", explicit owner" : "") + "; " + std::string{to_string(e.call)};
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
                         std::to_string(so.lease_ms) + " ms" + (so.watchdog ? ", watchdog" : "") +
                         ")" + (st.shared ? " to read" : "") + " for " +
                         std::to_string(st.hold_ms) + " ms";
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
        s += ", then " + std::string{to_string(e.release)} + "]";
        return s;
    }

    std::string who(int process, int thread, std::uint32_t episode, int flags) const {
        std::string s = "p" + std::to_string(process) + "t" + std::to_string(thread) + " episode " +
                        std::to_string(episode) + plan_of(process, thread, episode);
        if (flags & flag_fork_child) {
            s += " (forked child)";
        }
        if (flags & flag_fresh_client) {
            s += " (client destroyed while holding)";
        }
        return s;
    }

    std::string lock_desc(int name) const {
        return "'" + name_of(name) + "' (" +
               std::string{to_string(p_.names[static_cast<std::size_t>(name)])} + ")";
    }

    const client_spec& client_of(int process, int client) const {
        const auto& clients = p_.processes[static_cast<std::size_t>(process)].clients;
        return clients[static_cast<std::size_t>(client) % clients.size()];
    }

    int path_of(int process, int client) const { return client_of(process, client).path; }

    bool path_matches(const fault_record& f, int process, int client) const {
        const int path = path_of(process, client);
        return f.path == -2 || f.path == path || (f.path == -3 && path >= 0);
    }

    // Faults during [from, to] (each stretched by `slack(f)` after its end) that touch `name`
    // on the path of (process, client).
    template <class Slack, class Want>
    const fault_record* fault_during(int name, int process, int client, std::int64_t from,
                                     std::int64_t to, Slack slack, Want want) const {
        for (const auto& f : d_.faults) {
            if (!f.applied || !f.touches(name) || !want(f)) {
                continue;
            }
            if (process >= 0 && !path_matches(f, process, client)) {
                continue;
            }
            if (f.start <= to && f.end + slack(f) >= from) {
                return &f;
            }
        }
        return nullptr;
    }

    // How late the process's own scheduler was, at most, during [from, to].
    std::int64_t lateness(int process, std::int64_t from, std::int64_t to) const {
        if (process < 0 || static_cast<std::size_t>(process) >= late_by_process_.size()) {
            return 0;
        }
        const auto p = static_cast<std::size_t>(process);
        const auto& lates = late_by_process_[p];
        std::int64_t worst = 0;
        // Each record is (start, how late); none lasts longer than the process's longest.
        auto it = std::lower_bound(lates.begin(), lates.end(),
                                   std::pair{from - longest_late_[p], std::int64_t{0}});
        for (; it != lates.end() && it->first <= to; ++it) {
            if (it->first + it->second >= from) {
                worst = std::max(worst, it->second);
            }
        }
        return worst;
    }

    // The servers that took at least `took` to answer a probe sent during [from, to].
    std::set<int> slow_servers(std::int64_t from, std::int64_t to, std::int64_t took) const {
        std::set<int> ports;
        for (const auto& a : d_.slow) {
            if (a.at <= to && a.at + a.took >= from && a.took >= took) {
                ports.insert(a.port);
            }
        }
        return ports;
    }

    void report(const std::string& check, std::int64_t when, std::string text) {
        out_.violations.push_back({check, std::move(text), when});
    }

    std::vector<hold_span> holds() const {
        std::vector<hold_span> out;
        for (const auto& e : d_.entries) {
            if (e.type != record_type::hold) {
                continue;
            }
            hold_span h;
            h.name = e.name;
            h.process = e.process;
            h.thread = e.thread;
            h.flags = e.flags;
            h.lease_ms = e.lease_ms;
            h.client = e.client;
            h.actor = e.actor;
            h.episode = e.episode;
            h.call_start = e.t0;
            h.acquired = e.t1;
            h.last_owned = e.t2;
            h.let_go = e.t3;
            h.free = e.t4;
            h.fence = e.value;
            h.lost = e.op == static_cast<std::uint8_t>(torture::hold_end::lost);
            h.min_replicas = e.min_replicas;
            out.push_back(h);
        }
        for (const auto& k : d_.kills) {
            for (const auto& held : k.holds) {
                hold_span h;
                h.name = held.name;
                h.process = k.process;
                h.thread = held.thread;
                h.flags = held.flags;
                h.lease_ms = held.lease_ms;
                h.actor = held.actor;
                h.episode = static_cast<std::uint32_t>(held.episode);
                h.call_start = held.acquired;
                h.acquired = held.acquired;
                h.last_owned = held.last_owned;
                h.let_go = k.at;
                // A dead holder's key lives until its lease runs out.
                h.free = k.at + std::int64_t{held.lease_ms} * ms;
                h.fence = held.fence;
                h.killed = true;
                h.min_replicas = held.min_replicas;
                const auto& objects = p_.processes[static_cast<std::size_t>(k.process)]
                                          .threads[static_cast<std::size_t>(held.thread)]
                                          .objects;
                h.client = objects[static_cast<std::size_t>(held.object) % objects.size()].client;
                out.push_back(h);
            }
        }
        // A forked child dies with its parent (PR_SET_PDEATHSIG): one that had acquired when
        // its process was killed logged no hold, and published none for the kill to find. Its
        // lock lives until its lease runs out.
        std::uint32_t orphan = 0;
        for (const auto& e : d_.entries) {
            if (e.type != record_type::call || (e.flags & flag_fork_child) == 0 ||
                e.op != static_cast<std::uint8_t>(call_op::acquire) ||
                e.result != static_cast<std::uint8_t>(outcome::acquired)) {
                continue;
            }
            const auto logged = std::find_if(out.begin(), out.end(), [&](const hold_span& h) {
                return h.process == e.process && h.thread == e.thread && h.episode == e.episode &&
                       h.name == e.name && (h.flags & flag_fork_child) != 0;
            });
            if (logged != out.end()) {
                continue;
            }
            const kill_event* first = nullptr;  // the process's first kill after the grant
            for (const auto& k : d_.kills) {
                if (k.process == e.process && k.at >= e.t2 && (!first || k.at < first->at)) {
                    first = &k;
                }
            }
            if (first != nullptr) {
                const kill_event& k = *first;
                hold_span h;
                h.name = e.name;
                h.process = e.process;
                h.thread = e.thread;
                h.flags = e.flags;
                h.lease_ms = e.lease_ms;
                h.client = e.client;
                h.actor = 0xf0000000u + orphan++;  // no worker thread's
                h.episode = e.episode;
                h.call_start = e.t1;
                h.acquired = e.t2;
                h.last_owned = e.t2;
                h.let_go = k.at;
                h.free = k.at + std::int64_t{e.lease_ms} * ms;
                h.killed = true;
                h.min_replicas = e.min_replicas;
                out.push_back(h);
            }
        }
        return out;
    }

    std::string hold_desc(const hold_span& h) const {
        std::string s = who(h.process, h.thread, h.episode, h.flags) + " (" +
                        (h.write() ? "write" : "read") + ", lease " + std::to_string(h.lease_ms) +
                        " ms" + ((h.flags & flag_watchdog) ? ", watchdog" : "") +
                        (h.fence > 0 ? ", token " + std::to_string(h.fence) : "") + ") acquired " +
                        at(h.acquired) + ", owned() still true at " + at(h.last_owned);
        if (h.killed) {
            s += ", killed " + at(h.let_go);
        }
        return s;
    }

    // ---- exclusion -------------------------------------------------------------------------

    // Whether a failover or restart that may lose acknowledged writes explains `a` and `b`
    // holding at once (see docs/guarantees.md).
    const fault_record* write_loss_between(const hold_span& a, const hold_span& b) const {
        for (const auto& f : d_.faults) {
            if (!f.applied || !f.touches(a.name) || f.loses == write_loss::none) {
                continue;
            }
            if (f.loses == write_loss::any_holder) {
                if (a.acquired <= f.end + 1000 * ms && b.acquired >= f.start - 500 * ms) {
                    return &f;
                }
            } else if (a.acquired >= f.start - 100 * ms && a.acquired <= f.start + 300 * ms &&
                       b.acquired >= f.start) {
                return &f;
            }
        }
        return nullptr;
    }

    void exclusion() {
        auto all = holds();
        std::sort(all.begin(), all.end(),
                  [](const hold_span& a, const hold_span& b) { return a.acquired < b.acquired; });
        std::map<int, std::vector<hold_span>> active;  // by name
        std::map<std::pair<std::uint32_t, std::int64_t>, overlap> overlaps;
        for (const auto& b : all) {
            if (b.last_owned < b.acquired) {
                continue;  // never seen owned
            }
            auto& list = active[b.name];
            list.erase(
                std::remove_if(list.begin(), list.end(),
                               [&](const hold_span& a) { return a.last_owned <= b.acquired; }),
                list.end());
            if (p_.names[static_cast<std::size_t>(b.name)] == lock_type::semaphore) {
                // Up to semaphore_permits holders at once; each thread holds one permit at most.
                std::vector<const hold_span*> others;
                int excused = 0;
                for (const auto& a : list) {
                    if (a.actor == b.actor) {
                        continue;
                    }
                    if (write_loss_between(a, b) == nullptr) {
                        others.push_back(&a);
                    } else {
                        ++excused;
                    }
                }
                if (static_cast<int>(others.size()) < semaphore_permits &&
                    static_cast<int>(others.size()) + excused >= semaphore_permits) {
                    ++out_.excused["exclusion"];
                }
                if (static_cast<int>(others.size()) >= semaphore_permits) {
                    const hold_span& a = *others.front();
                    auto [it, fresh] =
                        overlaps.try_emplace(std::make_pair(a.actor, a.acquired), overlap{a, b, 0});
                    ++it->second.rivals;
                    (void)fresh;
                }
                list.push_back(b);
                continue;
            }
            for (const auto& a : list) {
                if (a.actor == b.actor || !(a.write() || b.write())) {
                    continue;
                }
                if (write_loss_between(a, b) != nullptr) {
                    ++out_.excused["exclusion"];
                    continue;
                }
                // One line per hold that others overlapped: the first of them, and how many.
                const auto key = std::make_pair(a.actor, a.acquired);
                auto [it, fresh] = overlaps.try_emplace(key, overlap{a, b, 0});
                ++it->second.rivals;
                (void)fresh;
            }
            list.push_back(b);
        }
        for (const auto& [key, o] : overlaps) {
            const bool semaphore =
                p_.names[static_cast<std::size_t>(o.held.name)] == lock_type::semaphore;
            report(
                "exclusion", o.first.acquired,
                (semaphore
                     ? "more holders than its " + std::to_string(semaphore_permits) + " permits of "
                     : std::string{"two holders of "}) +
                    lock_desc(o.held.name) + " at once for " +
                    std::to_string(
                        (std::min(o.held.last_owned, o.first.last_owned) - o.first.acquired) / ms) +
                    " ms: " + hold_desc(o.held) + "; and " + hold_desc(o.first) +
                    (o.rivals > 1 ? "; and " + std::to_string(o.rivals - 1) +
                                        " more holders during the first one's hold"
                                  : std::string{}) +
                    describe_faults(o.held.name, o.held.acquired, o.first.last_owned));
        }
    }

    struct overlap {
        hold_span held;   ///< the earlier hold
        hold_span first;  ///< the first other holder during it
        int rivals;
    };

    std::string describe_faults(int name, std::int64_t from, std::int64_t to) const {
        std::string s;
        for (const auto& f : d_.faults) {
            if (f.applied && f.touches(name) && f.start <= to && f.end >= from - 2000 * ms) {
                s += (s.empty() ? "" : "; ") + f.what + " [" + at(f.start) + ", " + at(f.end) + "]";
            }
        }
        return s.empty() ? " — no fault around" : " — faults around: " + s;
    }

    // ---- fencing ---------------------------------------------------------------------------

    void fencing() {
        auto all = holds();
        std::map<int, std::vector<hold_span>> by_name;
        for (const auto& h : all) {
            if (h.fence > 0 && h.write()) {
                by_name[h.name].push_back(h);
            }
        }
        for (auto& [name, list] : by_name) {
            // Granted before another was asked for: its token must be smaller.
            std::vector<hold_span> by_grant = list;
            std::sort(by_grant.begin(), by_grant.end(), [](const hold_span& a, const hold_span& b) {
                return a.acquired < b.acquired;
            });
            std::sort(list.begin(), list.end(), [](const hold_span& a, const hold_span& b) {
                return a.call_start < b.call_start;
            });
            // The two highest tokens granted so far, of different owners: a holder may meet
            // its own token again (a re-entry of an entry whose release failed).
            std::size_t next = 0;
            std::optional<hold_span> highest;
            std::optional<hold_span> second;
            for (const auto& b : list) {
                while (next < by_grant.size() && by_grant[next].acquired < b.call_start) {
                    const hold_span& g = by_grant[next];
                    if (!highest || g.fence > highest->fence) {
                        if (highest && highest->actor != g.actor) {
                            second = highest;
                        }
                        highest = g;
                    } else if (g.actor != highest->actor && (!second || g.fence > second->fence)) {
                        second = g;
                    }
                    ++next;
                }
                const std::optional<hold_span>& other =
                    highest && highest->actor == b.actor ? second : highest;
                if (other && b.fence <= other->fence) {
                    const hold_span& h = *other;
                    report("fencing", b.acquired,
                           "fencing token of " + lock_desc(name) + " did not increase: " +
                               hold_desc(h) + "; then " + hold_desc(b) + ", asked for at " +
                               at(b.call_start) + describe_faults(name, h.acquired, b.acquired));
                }
            }
        }
    }

    // ---- deadlines -------------------------------------------------------------------------

    void deadlines() {
        const bool redlock = p_.shape.topology == topology_kind::redlock;
        for (const auto& e : d_.entries) {
            if (e.type != record_type::call) {
                continue;
            }
            const auto op = static_cast<call_op>(e.op);
            const client_spec& c = client_of(e.process, e.client);
            std::int64_t bound = 0;
            std::string what;
            if (op == call_op::acquire || op == call_op::reenter) {
                if (e.t3 == 0 && e.t4 == 0) {
                    continue;
                }
                std::int64_t deadline = e.t3;
                if (deadline != 0 && redlock) {
                    // The first attempt always gets the full node_timeout (redlock_mutex.hpp).
                    deadline = std::max(deadline, e.t1 + std::int64_t{c.node_timeout_ms} * ms);
                }
                bound = deadline == 0 ? e.t4 : e.t4 == 0 ? deadline : std::min(deadline, e.t4);
                what =
                    std::string{to_string(static_cast<call_kind>(e.call))} +
                    (e.t3 != 0 ? " with a " + std::to_string(e.timeout_ms) + " ms timeout" : "") +
                    (e.t4 != 0 ? ", stop requested " + at(e.t4) : "");
            } else if (op == call_op::unlock) {
                const int allowed =
                    redlock ? c.node_timeout_ms : c.connect_timeout_ms + c.command_timeout_ms;
                bound = e.t1 + std::int64_t{allowed} * ms;
                what = "unlock (allowed " + std::to_string(allowed) + " ms)";
            } else {
                continue;
            }
            const std::int64_t over = e.t2 - (bound + 50 * ms);
            if (over <= 0) {
                continue;
            }
            if (lateness(e.process, bound - 100 * ms, e.t2) >= over) {
                ++out_.excused["deadline"];
                continue;
            }
            report("deadline", e.t2,
                   what + " on " + lock_desc(e.name) + " by " +
                       who(e.process, e.thread, e.episode, e.flags) + " started " + at(e.t1) +
                       ", was due by " + at(bound) + " + 50 ms, returned " + at(e.t2) + " (" +
                       std::to_string((e.t2 - bound) / ms) + " ms late)" +
                       (e.text.empty() ? "" : ": " + e.text) + describe_faults(e.name, e.t1, e.t2));
        }
    }

    // ---- liveness --------------------------------------------------------------------------

    // How a hold's span ended, for its description (not the journal's torture::hold_end).
    enum class span_end { killed, lost, lost_by_expiry, released, released_quietly };

    struct span {
        std::int64_t from, to;
        std::int64_t bound;  ///< after `to`, how long a waiter may still wait
        std::string why;     ///< what it is, unless `hold` says (built only for a report)
        const hold_span* hold = nullptr;
        span_end end = span_end::released;
    };

    std::string describe(const span& b) const {
        if (b.hold == nullptr) {
            return b.why;
        }
        std::string why = hold_desc(*b.hold);
        switch (b.end) {
            case span_end::killed:
                return why + ", its process killed";
            case span_end::lost:
                return why + ", found lost " + at(b.to);
            case span_end::lost_by_expiry:
                return why + ", found lost " + at(b.to) + " (by expiry, no fault around)";
            case span_end::released:
                return why + ", released " + at(b.to);
            case span_end::released_quietly:
                return why + ", released " + at(b.to) + " (no fault around)";
        }
        return why;
    }

    // Per name, the faults applied that touch it, by start: a soak's waiters look at these only,
    // and at those whose time can overlap theirs (none lasts longer than the name's longest).
    std::vector<std::vector<const fault_record*>> faults_by_name_;
    std::vector<std::int64_t> longest_fault_;

    // The holds of each name in order of acquisition, so that a waiter looks only at those near
    // its call: a soak's journal holds millions.
    struct hold_index {
        std::vector<std::vector<const hold_span*>> by_name;  // sorted by acquired
        std::vector<std::int64_t> longest;                   // per name: acquired to occupied
        // How long before a call a span can still matter to it: its allowance after it ends is
        // at most its lease + 100 ms, or a killed or lost hold's lease / 100 + 358 ms + 2.5 s.
        std::int64_t reach = 0;

        // Calls f on each hold of `name` acquired by `to` and occupied until `from` or later.
        template <class F>
        void each(int name, std::int64_t from, std::int64_t to, F&& f) const {
            if (name < 0 || static_cast<std::size_t>(name) >= by_name.size()) {
                return;
            }
            const auto& hs = by_name[static_cast<std::size_t>(name)];
            const std::int64_t earliest = from - longest[static_cast<std::size_t>(name)];
            auto it = std::lower_bound(
                hs.begin(), hs.end(), earliest,
                [](const hold_span* h, std::int64_t t) { return h->acquired < t; });
            for (; it != hs.end() && (*it)->acquired <= to; ++it) {
                if ((*it)->occupied_until() >= from) {
                    f(**it);
                }
            }
        }
    };

    static hold_index index_holds(const std::vector<hold_span>& all) {
        hold_index idx;
        std::int64_t longest_lease = 0;
        for (const auto& h : all) {
            if (h.name < 0) {
                continue;
            }
            const auto n = static_cast<std::size_t>(h.name);
            if (n >= idx.by_name.size()) {
                idx.by_name.resize(n + 1);
                idx.longest.resize(n + 1, 0);
            }
            idx.by_name[n].push_back(&h);
            idx.longest[n] = std::max(idx.longest[n], h.occupied_until() - h.acquired);
            longest_lease = std::max(longest_lease, std::int64_t{h.lease_ms} * ms);
        }
        for (auto& hs : idx.by_name) {
            std::sort(hs.begin(), hs.end(), [](const hold_span* a, const hold_span* b) {
                return a->acquired < b->acquired;
            });
        }
        idx.reach = longest_lease + 3000 * ms;
        return idx;
    }

    void liveness() {
        const auto all = holds();
        const hold_index idx = index_holds(all);
        faults_by_name_.assign(64, {});
        longest_fault_.assign(64, 0);
        for (const auto& f : d_.faults) {
            for (std::size_t n = 0; n < 64; ++n) {
                if (f.applied && f.touches(static_cast<int>(n))) {
                    faults_by_name_[n].push_back(&f);
                    longest_fault_[n] =
                        std::max(longest_fault_[n], f.end + f.block_slack_ns - f.start);
                }
            }
        }
        for (auto& faults : faults_by_name_) {
            std::sort(
                faults.begin(), faults.end(),
                [](const fault_record* a, const fault_record* b) { return a->start < b->start; });
        }
        for (const auto& w : d_.entries) {
            if (w.type != record_type::call ||
                w.op != static_cast<std::uint8_t>(call_op::acquire)) {
                continue;
            }
            const auto call = static_cast<call_kind>(w.call);
            if (call == call_kind::try_lock) {
                continue;
            }
            if (w.result == static_cast<std::uint8_t>(outcome::threw)) {
                continue;  // the errors check speaks for it
            }
            if (w.min_replicas > 0) {
                continue;  // slow replicas may hold it back (each grant waits for their WAIT)
            }
            if (p_.names[static_cast<std::size_t>(w.name)] == lock_type::semaphore) {
                continue;  // "free" is fewer holders than permits there: not modelled yet
            }
            check_waiter(w, idx);
        }
    }

    void check_waiter(const entry& w, const hold_index& idx) {
        const int n = w.name;
        const client_spec& c = client_of(w.process, w.client);
        static const std::vector<const fault_record*> none;
        const auto& name_faults =
            n >= 0 && n < 64 ? faults_by_name_[static_cast<std::size_t>(n)] : none;
        std::vector<span> busy;
        // A blocking fault on the name, on the holder's or the waiter's path, during [from, to].
        const std::int64_t longest_fault =
            n >= 0 && n < 64 ? longest_fault_[static_cast<std::size_t>(n)] : 0;
        const auto fault_near = [&](const hold_span& h, std::int64_t from, std::int64_t to) {
            auto it = std::lower_bound(
                name_faults.begin(), name_faults.end(), from - longest_fault,
                [](const fault_record* f, std::int64_t t) { return f->start < t; });
            for (; it != name_faults.end() && (*it)->start <= to; ++it) {
                const fault_record& f = **it;
                if (!f.blocks) {
                    continue;
                }
                if (!path_matches(f, h.process, h.client) &&
                    !path_matches(f, w.process, w.client)) {
                    continue;
                }
                if (f.start <= to && f.end + f.block_slack_ns >= from) {
                    return true;
                }
            }
            return false;
        };
        // A waiter of the name killed lately: its place in the queue lapses by itself 2 s after
        // the wait its last attempt asked for (docs/configuration.md), unless told to go.
        const auto waiter_killed = [&](std::int64_t from, std::int64_t to) {
            for (const auto& k : d_.kills) {
                for (const auto& wt : k.waits) {
                    if (wt.name == n && k.at >= from && k.at <= to) {
                        return true;
                    }
                }
            }
            return false;
        };
        // Only spans that can change the verdict: a span that ended `reach` before the call began
        // cannot make the waiter due any later than the call's own round trip.
        idx.each(n, w.t1 - idx.reach, w.t2, [&](const hold_span& h) {
            const std::int64_t until = h.occupied_until();
            // Every allowance below ends within its lease + 3 s: one that ended before the call
            // began cannot make the waiter due later than its own first answer.
            if (until + std::int64_t{h.lease_ms} * ms + 3000 * ms < w.t1) {
                return;
            }
            const std::int64_t loose = std::int64_t{h.lease_ms} * ms + 100 * ms;
            std::int64_t bound = loose;
            span_end end = span_end::released;
            if (h.killed) {
                // Its span already lasts its lease past the kill. No release tells the
                // waiters: they see the key gone within the drift allowance and their backoff,
                // and a dead waiter's place lapses only 2 s after the wait it asked for.
                bound = std::int64_t{h.lease_ms} * ms / 100 + 2 * ms + 100 * ms + 256 * ms;
                if (waiter_killed(until - std::int64_t{h.lease_ms} * ms - 2500 * ms, until)) {
                    bound += 2500 * ms;
                }
                end = span_end::killed;
            } else if (h.lost) {
                end = span_end::lost;
                const std::int64_t lease = std::int64_t{h.lease_ms} * ms;
                if (!fault_near(h, h.acquired - 1000 * ms, until + 2000 * ms) &&
                    lateness(h.process, until - lease / 3 - 50 * ms, until) < 20 * ms) {
                    // Lost by expiry with nothing going on: the server lets go within the drift
                    // allowance, and the waiter sees it within its backoff.
                    bound = lease / 100 + 2 * ms + 100 * ms + 256 * ms;
                    if (waiter_killed(until - lease - 2500 * ms, until)) {
                        bound += 2500 * ms;
                    }
                    end = span_end::lost_by_expiry;
                }
            } else if (!fault_near(h, until - 1000 * ms, until + 1000 * ms)) {
                // Released with nothing going on: the waiter is told at once (README,
                // "Waiting"); a second covers a busy machine and a waiter that polls.
                bound = std::min(loose, 1000 * ms);
                end = span_end::released_quietly;
            }
            busy.push_back({h.acquired, until, bound, {}, &h, end});
        });
        // Faults that keep the name from being taken, on the waiter's path.
        for (const fault_record* fp : name_faults) {
            const fault_record& f = *fp;
            if (f.start > w.t2) {
                continue;
            }
            const bool blocks = f.blocks || (f.replicas_only && w.min_replicas > 0);
            if (!blocks || !path_matches(f, w.process, w.client)) {
                continue;
            }
            busy.push_back({f.start, f.end + f.block_slack_ns, 100 * ms, f.what});
        }
        // A killed waiter's attempt may have taken a free lock as it died: held for its lease.
        for (const auto& k : d_.kills) {
            for (const auto& wt : k.waits) {
                if (wt.name != n || k.at > w.t2 ||
                    k.at + std::int64_t{wt.lease_ms} * ms + idx.reach < w.t1) {
                    continue;
                }
                bool held_by_other = false;
                idx.each(n, k.at, k.at, [&](const hold_span& h) {
                    held_by_other = held_by_other || h.process != k.process;
                });
                if (!held_by_other) {
                    const std::int64_t until = k.at + std::int64_t{wt.lease_ms} * ms;
                    // Had it not taken the lock, it may head the queue of the free lock, and the
                    // waiters behind it wait for its place to lapse: 2 s after the wait its last
                    // attempt asked for (docs/configuration.md). Had it taken it, a dead waiter
                    // behind it is told nothing when its lease ends.
                    const std::int64_t seen = std::int64_t{wt.lease_ms} * ms / 100 + 358 * ms;
                    busy.push_back({k.at, until, seen + 2500 * ms,
                                    "a waiter of p" + std::to_string(k.process) + " killed " +
                                        at(k.at) + " as the lock was free"});
                }
            }
        }
        // Walk the waiter's call: a free stretch starts where the busy spans covering it end,
        // lasts until the next busy span (every grant starts one: its hold), and must not
        // outlast the bound of what ended before it.
        std::int64_t s = w.t1;
        for (;;) {
            for (bool moved = true; moved;) {
                moved = false;
                for (const auto& b : busy) {
                    if (b.from <= s && b.to > s) {
                        s = b.to;
                        moved = true;
                    }
                }
            }
            if (s >= w.t2) {
                return;
            }
            std::int64_t next = w.t2;
            for (const auto& b : busy) {
                if (b.from > s) {
                    next = std::min(next, b.from);
                }
            }
            // By when the waiter should have it: the longest allowance of what ended by then,
            // or, when nothing did, what one attempt may take: a connect and a command (a
            // pooled connection may be new; the same allowance as an unlock's).
            const int attempt_ms = c.connect_timeout_ms + c.command_timeout_ms;
            const std::int64_t first_answer = w.t1 + 100 * ms + std::int64_t{attempt_ms} * ms;
            std::int64_t due = first_answer;
            // What the waiter waited after, described only for a report.
            const span* after_span = nullptr;
            bool after_nothing_for_a_while = false;
            std::int64_t latest = 0;
            for (const auto& b : busy) {
                if (b.to <= s && b.to + b.bound > due) {
                    due = b.to + b.bound;
                    after_span = &b;
                    after_nothing_for_a_while = false;
                }
                if (b.to <= s && b.to > latest && due == first_answer) {
                    latest = b.to;
                    after_span = &b;
                    after_nothing_for_a_while = true;
                }
            }
            if (next <= due) {
                s = next;
                continue;
            }
            const std::int64_t late = next - due;
            if (lateness(w.process, s, next) >= late || !slow_servers(s, next, late).empty()) {
                ++out_.excused["liveness"];
                return;
            }
            std::string after =
                after_span == nullptr ? std::string{"nothing (free when the call started)"}
                : after_nothing_for_a_while
                    ? "nothing for a while (free when the call started); the last: " +
                          describe(*after_span)
                    : describe(*after_span);
            std::string dead;
            for (const auto& k : d_.kills) {
                for (const auto& wt : k.waits) {
                    if (wt.name == n && k.at <= s && k.at >= s - 10'000 * ms) {
                        dead += " " + at(k.at) + " (p" + std::to_string(k.process) + "t" +
                                std::to_string(wt.thread) + ")";
                    }
                }
            }
            if (!dead.empty()) {
                after += "; waiters of it killed at" + dead;
            }
            report(
                "liveness", due,
                std::string{to_string(static_cast<call_kind>(w.call))} +
                    (w.flags & flag_shared ? " (read)" : "") + " of " + lock_desc(n) + " by " +
                    who(w.process, w.thread, w.episode, w.flags) + " (lease " +
                    std::to_string(w.lease_ms) + " ms, call " + at(w.t1) + " to " + at(w.t2) +
                    (w.result == static_cast<std::uint8_t>(outcome::acquired) ? ", acquired"
                                                                              : ", not acquired") +
                    "): free from " + at(s) + ", due by " + at(due) + ", still waiting " +
                    std::to_string(late / ms) + " ms later; last before it: " + after +
                    describe_faults(n, s - 3000 * ms, next));
            return;
        }
    }

    // ---- errors ----------------------------------------------------------------------------

    static bool transient(error_class e) {
        switch (e) {
            case error_class::connection:
            case error_class::timeout:
            case error_class::unavailable:
            case error_class::server:
            case error_class::replication:
                return true;
            default:
                return false;
        }
    }

    void errors() {
        for (const auto& e : d_.entries) {
            if (e.type != record_type::call) {
                continue;
            }
            const auto op = static_cast<call_op>(e.op);
            const bool threw = e.result == static_cast<std::uint8_t>(outcome::threw);
            if (threw) {
                judge_error(e, static_cast<error_class>(e.error),
                            std::string{to_string(static_cast<error_class>(e.error))});
            } else if (op == call_op::unlock && e.value > 0) {
                const auto ec = static_cast<int>(e.value);
                if (ec == 4 || ec == 5) {  // connection_failed, server_failed
                    judge_error(e, ec == 4 ? error_class::connection : error_class::server,
                                "unlock(ec) = " + e.text);
                } else if (ec == 3) {  // lock_lost
                    early_loss(e, "unlock(ec) reported the lock lost");
                } else if (ec == 1 && (e.flags & flag_after_loss)) {
                    // not_held: the entries went with the release that said lock_lost.
                } else {
                    report("error", e.t2,
                           std::string{(e.flags & flag_inner) ? "the re-entry's unlock(ec)"
                                                              : "unlock(ec)"} +
                               std::string{(e.flags & flag_shared) ? " (read)" : ""} + " of " +
                               lock_desc(e.name) + " by " +
                               who(e.process, e.thread, e.episode, e.flags) + " at " + at(e.t1) +
                               ": " + e.text);
                }
            } else if ((op == call_op::extend || op == call_op::verify) && e.value == 0 &&
                       e.result == static_cast<std::uint8_t>(outcome::done)) {
                early_loss(e, op == call_op::extend ? "extend() found the lock lost"
                                                    : "verify() found the lock lost");
            }
        }
    }

    void judge_error(const entry& e, error_class cls, const std::string& what) {
        const bool redlock = p_.shape.topology == topology_kind::redlock;
        const auto op = static_cast<call_op>(e.op);
        const std::string call = op == call_op::acquire || op == call_op::reenter
                                     ? std::string{to_string(static_cast<call_kind>(e.call))}
                                 : op == call_op::extend ? "extend()"
                                 : op == call_op::verify ? "verify()"
                                 : op == call_op::unlock ? "unlock(ec)"
                                                         : "a call";
        if (cls == error_class::replication && e.min_replicas > 0) {
            ++out_.excused["error"];
            return;
        }
        const bool timed_out = cls == error_class::timeout ||
                               (cls == error_class::connection &&
                                e.text.find("did not answer in time") != std::string::npos);
        if (timed_out && e.t3 != 0 && e.t2 >= e.t3 - 2 * ms) {
            // The server did not answer within the time the caller gave.
            ++out_.excused["error"];
            return;
        }
        const fault_record* f = nullptr;
        if (cls == error_class::quorum) {
            f = fault_during(
                e.name, e.process, e.client, e.t1, e.t2,
                [](const fault_record& x) { return x.error_slack_ns; },
                [](const fault_record& x) { return x.errors_ok && x.masters >= 3; });
        } else if (transient(cls) && !redlock) {
            f = fault_during(
                e.name, e.process, e.client, e.t1, e.t2,
                [](const fault_record& x) { return x.error_slack_ns; },
                [&](const fault_record& x) {
                    return x.errors_ok || (x.replicas_only && e.min_replicas > 0);
                });
        } else if (cls == error_class::system && !redlock) {
            // A read entry whose release failed stays until the reaper drops it: an upgrade
            // through another object of the owner is refused meanwhile (shared_mutex.hpp).
            f = fault_during(
                e.name, e.process, e.client, e.t1 - 10'000 * ms, e.t2,
                [](const fault_record& x) { return x.error_slack_ns; },
                [](const fault_record& x) { return x.errors_ok; });
        } else if (transient(cls) && redlock) {
            f = fault_during(
                e.name, e.process, e.client, e.t1, e.t2,
                [](const fault_record& x) { return x.error_slack_ns; },
                [](const fault_record& x) { return x.errors_ok; });
        }
        if (f != nullptr) {
            ++out_.excused["error"];
            return;
        }
        const client_spec& c = client_of(e.process, e.client);
        // A release meets TRYAGAIN while its slot is half migrated and sends it again for its
        // command timeout, then says so and leaves the release to the reaper (mutex.hpp): a
        // migration step that lasts longer allows that, and only that.
        if (op == call_op::unlock && e.text.find("TRYAGAIN") != std::string::npos &&
            e.t2 - e.t1 >= std::int64_t{c.command_timeout_ms} * ms * 8 / 10 &&
            fault_during(
                e.name, e.process, e.client, e.t1, e.t2, [](const fault_record&) { return 0; },
                [](const fault_record& x) { return x.kind == fault_kind::migrate; }) != nullptr) {
            ++out_.excused["error"];
            return;
        }
        // The servers themselves did not answer in time (a loaded machine): a timeout or an
        // outage is then theirs.
        if (cls == error_class::quorum) {
            const auto slow =
                slow_servers(e.t1 - 100 * ms, e.t2, std::int64_t{c.node_timeout_ms} * ms);
            std::set<int> out = masters_without_it(e);
            out.insert(slow.begin(), slow.end());  // a stopped master is slow too: counted once
            if (out.size() >= 3) {
                ++out_.excused["error"];
                return;
            }
            // An acquisition needs a quorum only: the lock may be on 3 of the 5 masters (a key
            // a failed release left on the others until the reaper removed it, a master that
            // did not answer in time). Then one faulted master is enough to keep a later call
            // on the held lock from a quorum, as its answer shows: fewer than 3 "ok", and
            // among the others, one that could not answer while a master was faulted.
            const auto [ok, unreachable] = quorum_answers(e.text);
            if (!out.empty() && unreachable > 0 && ok < 3 &&
                static_cast<call_op>(e.op) != call_op::acquire) {
                ++out_.excused["error"];
                return;
            }
        } else if (transient(cls) &&
                   !slow_servers(e.t1 - 100 * ms, e.t2, std::int64_t{c.command_timeout_ms} * ms / 2)
                        .empty()) {
            ++out_.excused["error"];
            return;
        }
        report("error", e.t2,
               call + " of " + lock_desc(e.name) + " by " +
                   who(e.process, e.thread, e.episode, e.flags) + " (" + at(e.t1) + " to " +
                   at(e.t2) + ") failed: " + what + (e.text.empty() ? "" : ": " + e.text) +
                   describe_faults(e.name, e.t1 - 3000 * ms, e.t2));
    }

    // How the masters answered, as a quorum_error's text lists them ("host:port: answer"):
    // {"ok" answers, answers that are neither "ok" nor "not ours" (errors, no answer)}.
    static std::pair<int, int> quorum_answers(const std::string& text) {
        int ok = 0;
        int unreachable = 0;
        for (std::size_t at = text.find("127.0.0.1:"); at != std::string::npos;
             at = text.find("127.0.0.1:", at + 1)) {
            const std::size_t colon = text.find(": ", at);
            if (colon == std::string::npos) {
                break;
            }
            const std::string_view answer = std::string_view{text}.substr(colon + 2);
            if (answer.starts_with("ok")) {
                ++ok;
            } else if (!answer.starts_with("not ours")) {
                ++unreachable;
                // An error's own text may name the master again ("connection to 127.0.0.1:p
                // failed"): skip to the next master's line.
                const std::size_t next = text.find("   127.0.0.1:", colon);
                if (next == std::string::npos) {
                    break;
                }
                at = next + 2;
                continue;
            }
            at = colon;
        }
        return {ok, unreachable};
    }

    // The Redlock masters (ports) that could not answer for the lock during a call: those faulted
    // then (within the fault's error slack), and, for a call on a held lock, those restarted
    // empty while it was held: they lost it, or never had it, and renewals do not put it back.
    // Faults follow one another, so two in a row can take three masters between them.
    std::set<int> masters_without_it(const entry& e) const {
        std::int64_t held_since = -1;
        if (static_cast<call_op>(e.op) != call_op::acquire) {
            for (const auto& a : d_.entries) {
                if (a.type == record_type::call && a.process == e.process && a.thread == e.thread &&
                    a.episode == e.episode && a.name == e.name &&
                    static_cast<call_op>(a.op) == call_op::acquire &&
                    a.result == static_cast<std::uint8_t>(outcome::acquired) && a.t1 <= e.t1) {
                    held_since = std::max(held_since, a.t1);
                }
            }
        }
        std::set<int> out;
        for (const auto& x : d_.faults) {
            if (!x.applied || !x.errors_ok || x.start > e.t2) {
                continue;
            }
            const bool during = x.end + x.error_slack_ns >= e.t1;
            const bool emptied =
                x.kind == fault_kind::kill_restart && held_since >= 0 && x.end >= held_since;
            if (during || emptied) {
                out.insert(x.master_ports.begin(), x.master_ports.end());
            }
        }
        return out;
    }

    // The server said the lock was gone while the holder's local deadline was still ahead.
    void early_loss(const entry& e, const std::string& what) {
        // remaining_ms was measured just before the call (unlock: at the last owned() check,
        // which may be a little earlier).
        const std::int64_t margin = 25 * ms + (e.t2 - e.t1);
        if (std::int64_t{e.remaining_ms} * ms <= margin) {
            return;
        }
        if (fault_during(
                e.name, e.process, e.client, e.t1 - std::int64_t{e.lease_ms} * ms, e.t2,
                [](const fault_record& x) { return x.error_slack_ns; },
                [](const fault_record&) { return true; })) {
            ++out_.excused["early loss"];
            return;
        }
        if (lateness(e.process, e.t1 - std::int64_t{e.remaining_ms} * ms, e.t2) >=
            std::int64_t{e.remaining_ms} * ms - margin) {
            ++out_.excused["early loss"];
            return;
        }
        report("early loss", e.t1,
               what + " for " + lock_desc(e.name) + " by " +
                   who(e.process, e.thread, e.episode, e.flags) + " at " + at(e.t1) +
                   " while its local deadline was " + std::to_string(e.remaining_ms) +
                   " ms ahead (the server let go before the holder was due to)" +
                   describe_faults(e.name, e.t1 - 3000 * ms, e.t2));
    }

    // ---- the rest --------------------------------------------------------------------------

    void rest() {
        for (const auto& f : d_.faults) {
            if (!f.problem.empty()) {
                report("migration", f.end, f.problem + " [" + f.what + "]");
            }
            if (!f.tool_error.empty()) {
                out_.notes.push_back("fault '" + f.what + "' at " + at(f.start) +
                                     " did not complete (" + f.tool_error +
                                     "); the faults after it were not caused");
            }
        }
        for (const auto& l : d_.leftovers) {
            report("leftover", d_.t_end, "left in Redis after the run: " + l);
        }
        for (std::size_t p = 0; p < d_.processes.size(); ++p) {
            const auto& o = d_.processes[p];
            const std::string who_p = "process " + std::to_string(p);
            if (!o.death.empty()) {
                report("crash", d_.t_end, who_p + " died: " + o.death);
            }
            if (!o.hang.empty()) {
                report("hang", d_.t_end, who_p + " did not finish: " + o.hang);
            }
            if (o.finished && o.fds_after > o.fds_before) {
                std::string which;
                for (const auto& e : d_.entries) {
                    if (e.type == record_type::note && e.process == static_cast<int>(p) &&
                        e.text.starts_with("descriptors still open")) {
                        which = ": " + e.text;
                    }
                }
                report("leak", d_.t_end,
                       who_p + " has " + std::to_string(o.fds_after - o.fds_before) +
                           " more descriptors open after its clients were destroyed (" +
                           std::to_string(o.fds_before) + " -> " + std::to_string(o.fds_after) +
                           ")" + which);
            }
            if (o.finished && o.tasks_after > o.tasks_before + 1) {
                report("leak", d_.t_end,
                       who_p + " has " + std::to_string(o.tasks_after - o.tasks_before - 1) +
                           " more threads after its clients were destroyed (" +
                           std::to_string(o.tasks_before) + " -> " + std::to_string(o.tasks_after) +
                           ", the process's reaper allowed)");
            }
        }
        for (const auto& e : d_.entries) {
            if (e.type == record_type::note) {
                if (e.text.starts_with("descriptors still open")) {
                    continue;  // the leak check tells
                }
                if (e.text.find("fork skipped") != std::string::npos) {
                    continue;
                }
                out_.tool_errors.push_back("p" + std::to_string(e.process) + "t" +
                                           std::to_string(e.thread) + " at " + at(e.t1) + ": " +
                                           e.text);
            } else if (e.type == record_type::call &&
                       e.op == static_cast<std::uint8_t>(call_op::fork_child)) {
                report("fork", e.t2,
                       who(e.process, e.thread, e.episode, e.flags) + " forked at " + at(e.t1) +
                           ": " + e.text);
            }
        }
        if (d_.overflow > 0) {
            out_.tool_errors.push_back(std::to_string(d_.overflow) +
                                       " records did not fit in the journal");
        }
    }

    const run_data& d_;
    const plan& p_;
    std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> late_by_process_;
    std::vector<std::int64_t> longest_late_;
    findings out_;
};

}  // namespace redislock::torture
