// redislock-torture: one run of a plan on one topology. The main thread starts the topology,
// forks the workers, restarts any a fault killed, stops them when the time is up (killing the
// ones that do not finish, which is a finding), and then, with every fault healed, scans the
// masters for leftovers and runs the checks. A thread of its own plays the faults in turn; it
// lives until the end, since servers it restarts die with the thread that started them.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "torture/checks.hpp"
#include "torture/cluster_topology.hpp"
#include "torture/faults.hpp"
#include "torture/journal.hpp"
#include "torture/options.hpp"
#include "torture/plan.hpp"
#include "torture/report.hpp"
#include "torture/sentinel_topology.hpp"
#include "torture/server_probe.hpp"
#include "torture/servers.hpp"
#include "torture/topology.hpp"
#include "torture/worker.hpp"

namespace redislock::torture {

/// Set by SIGINT / SIGTERM: the run stops, heals, cleans up and says so.
inline volatile std::sig_atomic_t interrupted = 0;

struct run_outcome {
    std::size_t violations = 0;
    std::size_t tool_errors = 0;
    bool interrupted = false;
};

inline std::unique_ptr<topology> make_topology(topology_kind kind, const std::string& uri) {
    switch (kind) {
        case topology_kind::single:
            return std::make_unique<single_topology>();
        case topology_kind::sentinel:
            return std::make_unique<sentinel_topology>();
        case topology_kind::cluster:
            return std::make_unique<cluster_topology>();
        case topology_kind::redlock:
            return std::make_unique<redlock_topology>();
        case topology_kind::given:
            return std::make_unique<given_topology>(uri);
    }
    throw std::logic_error{"torture: unknown topology"};
}

/// Plays the plan's faults in turn, from a thread of its own.
class fault_player {
public:
    fault_player(const plan& p, topology& topo, const std::vector<std::string>& names, journal& log,
                 bool private_netns, std::ostream& out, bool verbose, bool enabled)
        : plan_{p},
          topo_{topo},
          names_{names},
          log_{log},
          filter_{private_netns},
          out_{out},
          verbose_{verbose},
          enabled_{enabled} {}

    fault_player(const fault_player&) = delete;
    fault_player& operator=(const fault_player&) = delete;
    ~fault_player() { finish(); }

    void start(std::int64_t t0, std::int64_t t_end) {
        thread_ = std::thread{[this, t0, t_end] { play(t0, t_end); }};
    }

    /// Stops playing, heals, and waits until that is done; the thread lives on until finish().
    void stop_and_heal() {
        stop_.store(true);
        std::unique_lock lock{mutex_};
        changed_.wait(lock, [&] { return healed_; });
    }

    /// Lets the thread end (after the servers it restarted are no longer needed).
    void finish() {
        {
            std::lock_guard guard{mutex_};
            released_ = true;
        }
        changed_.notify_all();
        stop_.store(true);
        if (thread_.joinable()) {
            thread_.join();
        }
    }

    std::vector<fault_record> records() const {
        std::lock_guard guard{mutex_};
        return records_;
    }
    std::vector<kill_event> kills() const {
        std::lock_guard guard{mutex_};
        return kills_;
    }
    bool packet_drops() const { return filter_.usable(); }

private:
    void play(std::int64_t t0, std::int64_t t_end) {
        std::vector<kill_event> kills;
        fault_context ctx{plan_, names_, log_, stop_, filter_, kills};
        bool broken = false;  // a fault did not complete: the topology may not be whole
        // What the topology did on its own, looked for every 250 ms between faults (with
        // --no-faults too) and after the last one until the workers are done.
        std::int64_t next_look = 0;
        const auto look_for_unplanned = [&] {
            if (broken) {
                return;
            }
            next_look = monotonic_ns() + 250'000'000;
            const std::int64_t looked = monotonic_ns();
            std::optional<fault_record> rec;
            try {
                rec = topo_.unplanned(ctx);
            } catch (const std::exception& e) {
                // It saw a change it could not follow: what the change allows is allowed, and
                // the run is suspect.
                rec.emplace();
                rec->kind = fault_kind::forced_failover;
                rec->unplanned = true;
                rec->loses = write_loss::any_holder;
                rec->tool_error = e.what();
                rec->what = "following a change the topology made on its own";
                rec->start = looked - 5'000'000'000;
                rec->end = monotonic_ns();
                broken = true;
            }
            if (rec) {
                note(*rec, t0, kills);
            }
        };
        for (const fault_spec& spec : plan_.faults) {
            const std::int64_t due = t0 + std::int64_t{spec.at_ms} * 1'000'000;
            while (!stop_.load() && monotonic_ns() < due) {
                if (monotonic_ns() >= next_look) {
                    look_for_unplanned();
                }
                std::this_thread::sleep_for(std::chrono::milliseconds{5});
            }
            if (stop_.load()) {
                break;
            }
            fault_record rec;
            rec.kind = spec.kind;
            rec.start = rec.end = monotonic_ns();
            if (monotonic_ns() > t_end - 500'000'000) {
                rec.applied = false;
                rec.what = std::string{to_string(spec.kind)} + ": the run ended first";
            } else if (broken) {
                rec.applied = false;
                rec.what =
                    std::string{to_string(spec.kind)} + ": an earlier fault did not complete";
            } else if (!enabled_) {
                rec.applied = false;
                rec.what = std::string{to_string(spec.kind)} + ": faults are off (--no-faults)";
            } else if (!topo_.can(spec.kind, ctx)) {
                rec.applied = false;
                rec.what = std::string{to_string(spec.kind)} + ": not possible here";
            } else {
                try {
                    rec = topo_.apply(spec, ctx);
                } catch (const std::exception& e) {
                    rec.tool_error = e.what();
                    rec.what = std::string{to_string(spec.kind)};
                    rec.end = monotonic_ns();
                }
                broken = broken || !rec.tool_error.empty();
            }
            note(rec, t0, kills);
            look_for_unplanned();
        }
        try {
            topo_.heal_all();
        } catch (const std::exception&) {
        }
        std::unique_lock lock{mutex_};
        kills_ = kills;
        healed_ = true;
        changed_.notify_all();
        while (
            !changed_.wait_for(lock, std::chrono::milliseconds{100}, [&] { return released_; })) {
            if (monotonic_ns() >= next_look) {
                lock.unlock();
                look_for_unplanned();
                lock.lock();
            }
        }
    }

    void note(const fault_record& rec, std::int64_t t0, const std::vector<kill_event>& kills) {
        std::lock_guard guard{mutex_};
        records_.push_back(rec);
        kills_ = kills;
        if (verbose_) {
            out_ << "  fault " << (rec.start - t0) / 1'000'000 << " ms .. "
                 << (rec.end - t0) / 1'000'000 << " ms: " << (rec.applied ? "" : "(not applied) ")
                 << rec.what << "\n"
                 << std::flush;
        }
    }

    const plan& plan_;
    topology& topo_;
    const std::vector<std::string>& names_;
    journal& log_;
    packet_filter filter_;
    std::ostream& out_;
    bool verbose_;
    bool enabled_;
    std::atomic<bool> stop_{false};
    mutable std::mutex mutex_;
    std::condition_variable changed_;
    bool healed_ = false;
    bool released_ = false;
    std::vector<fault_record> records_;
    std::vector<kill_event> kills_;
    std::thread thread_;
};

inline std::string describe_status(int status) {
    if (WIFSIGNALED(status)) {
        return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
               ::strsignal(WTERMSIG(status)) + ")";
    }
    if (WIFEXITED(status)) {
        return "exit code " + std::to_string(WEXITSTATUS(status));
    }
    return "status " + std::to_string(status);
}

inline std::string names_prefix(const run_shape& shape) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "tt:%08x", static_cast<unsigned>(shape.seed & 0xffffffffU));
    std::string prefix = buf;
    if (shape.topology == topology_kind::given) {
        prefix += "." + std::to_string(::getpid());
    }
    return prefix;
}

/// Runs one topology; prints its report to `out`.
inline run_outcome run_one(const options& o, topology_kind kind, std::uint64_t seed,
                           bool private_netns, std::ostream& out) {
    run_outcome result;
    run_shape shape;
    shape.topology = kind;
    shape.seed = seed;
    shape.run_ms = o.run_ms;
    shape.processes = o.processes;
    shape.threads = o.threads;
    shape.names = o.names;
    shape.brisk = o.brisk;
    const plan p = draw_plan(shape);
    if (o.print_plan) {
        print_header(out, p, "(the plan only)", o.uri);
        print_plan(out, p);
        return result;
    }

    std::unique_ptr<topology> topo;
    try {
        topo = make_topology(kind, o.uri);
    } catch (const std::exception& e) {
        print_header(out, p, "(could not be started)", o.uri);
        out << "TOOL ERROR: the topology did not start: " << e.what() << "\n";
        result.tool_errors = 1;
        return result;
    }
    print_header(out, p, topo->describe(), o.uri);

    const std::string prefix = names_prefix(shape);
    std::vector<std::string> names;
    static constexpr const char* kinds[] = {"mx", "rec", "rw", "sem"};
    for (std::size_t i = 0; i < p.names.size(); ++i) {
        names.push_back(prefix + ":" + kinds[static_cast<int>(p.names[i])] + ":" +
                        std::to_string(i));
    }
    std::vector<std::uint64_t> capacities;
    for (const auto& proc : p.processes) {
        std::uint64_t records = 8192 + static_cast<std::uint64_t>(shape.run_ms) / 4;
        for (const auto& t : proc.threads) {
            for (const auto& e : t.episodes) {
                records += 6 + 3 * e.steps.size();
            }
        }
        if (shape.brisk) {
            // Replayed episodes: room for a record per thread every 100 microseconds, more than
            // any server here answers (the mapping takes memory only as records are written).
            records += static_cast<std::uint64_t>(shape.run_ms) * 10 * proc.threads.size();
        }
        capacities.push_back(records * 2);
    }
    journal log{capacities};
    worker_setup setup{&p, topo->where(), names, &log};

    const int processes = shape.processes;
    std::vector<pid_t> pids(static_cast<std::size_t>(processes), -1);
    std::vector<bool> done(static_cast<std::size_t>(processes), false);
    std::vector<process_outcome> outcomes(static_cast<std::size_t>(processes));
    for (int i = 0; i < processes; ++i) {
        pids[static_cast<std::size_t>(i)] = fork_worker(i, setup);
        log.process(i).pid.store(pids[static_cast<std::size_t>(i)]);
    }

    fault_player faults{p, *topo, names, log, private_netns, out, o.verbose, o.faults};
    server_probe probe{topo->all_ports()};
    const std::int64_t t0 = monotonic_ns();
    const std::int64_t t_end = t0 + std::int64_t{shape.run_ms} * 1'000'000;
    log.header().t0 = t0;
    log.header().t_end = t_end;
    faults.start(t0, t_end);
    log.header().go.store(1);

    // Workers finish their episode under way once the time is up: the longest one takes a
    // hold, a timeout, and a lease running out.
    const std::int64_t grace =
        std::int64_t{2 * p.max_lease_ms() + 4000 + 3000 + 10'000} * 1'000'000;
    std::vector<kill_event> stragglers;
    for (;;) {
        const std::int64_t now = monotonic_ns();
        if (interrupted != 0) {
            result.interrupted = true;
            log.header().stop.store(1);
            break;
        }
        if (now >= t_end) {
            log.header().stop.store(1);
        }
        bool all_done = true;
        for (int i = 0; i < processes; ++i) {
            auto& pid = pids[static_cast<std::size_t>(i)];
            if (done[static_cast<std::size_t>(i)]) {
                continue;
            }
            all_done = false;
            process_now& pn = log.process(i);
            int status = 0;
            const pid_t r = pid > 0 ? ::waitpid(pid, &status, WNOHANG) : pid;
            if (r == 0) {
                continue;
            }
            if (pn.killed_by_fault.load() != 0) {
                if (pn.killed_by_fault.load() != 2) {
                    pid = -1;  // reaped; restart once the fault took its snapshot
                    continue;
                }
                pn.killed_by_fault.store(0);
                if (now < t_end) {
                    pn.generation.fetch_add(1);
                    pid = fork_worker(i, setup);
                    pn.pid.store(pid);
                } else {
                    done[static_cast<std::size_t>(i)] = true;
                }
                continue;
            }
            done[static_cast<std::size_t>(i)] = true;
            if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
                outcomes[static_cast<std::size_t>(i)].death = describe_status(status);
            }
        }
        if (all_done) {
            break;
        }
        if (now > t_end + grace) {
            // What each straggler was doing, then kill it.
            for (int i = 0; i < processes; ++i) {
                if (done[static_cast<std::size_t>(i)] || pids[static_cast<std::size_t>(i)] <= 0) {
                    continue;
                }
                process_now& pn = log.process(i);
                kill_event ev;
                ev.at = monotonic_ns();
                ev.process = i;
                std::string doing;
                for (int t = 0; t < shape.threads; ++t) {
                    const thread_now& tn = pn.threads[t];
                    if (const int n = tn.waiting_name.load(); n >= 0) {
                        doing += "thread " + std::to_string(t) + " in episode " +
                                 std::to_string(tn.episode.load()) + " waiting for '" +
                                 names[static_cast<std::size_t>(n)] + "' since " +
                                 std::to_string((tn.waiting_since.load() - t0) / 1'000'000) +
                                 " ms; ";
                    } else if (const int h = tn.hold_name.load(); h >= 0) {
                        doing += "thread " + std::to_string(t) + " in episode " +
                                 std::to_string(tn.episode.load()) + " holding '" +
                                 names[static_cast<std::size_t>(h)] + "'; ";
                    } else if (tn.episode.load() >= 0) {
                        doing += "thread " + std::to_string(t) + " in episode " +
                                 std::to_string(tn.episode.load()) + "; ";
                    }
                }
                ::kill(pids[static_cast<std::size_t>(i)], SIGKILL);
                test::detail::reap(pids[static_cast<std::size_t>(i)], true);
                for (int t = 0; t < shape.threads; ++t) {
                    const thread_now& tn = pn.threads[t];
                    if (const int n = tn.hold_name.load(); n >= 0) {
                        ev.holds.push_back({n, tn.hold_acquired.load(), tn.hold_last_owned.load(),
                                            tn.hold_fence.load(), tn.hold_lease.load(),
                                            tn.hold_actor.load(), tn.hold_flags.load(),
                                            tn.hold_object.load(), tn.hold_episode.load(), t,
                                            tn.hold_min_replicas.load()});
                    }
                }
                stragglers.push_back(ev);
                outcomes[static_cast<std::size_t>(i)].hang =
                    "still running " + std::to_string((monotonic_ns() - t_end) / 1'000'000) +
                    " ms after the run's end: " + doing;
                done[static_cast<std::size_t>(i)] = true;
            }
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds{20});
    }
    if (result.interrupted) {
        for (int i = 0; i < processes; ++i) {
            if (pids[static_cast<std::size_t>(i)] > 0 && !done[static_cast<std::size_t>(i)]) {
                ::kill(pids[static_cast<std::size_t>(i)], SIGKILL);
                test::detail::reap(pids[static_cast<std::size_t>(i)], true);
            }
        }
    }
    faults.stop_and_heal();
    probe.stop();

    run_data data;
    data.the_plan = &p;
    data.names = names;
    data.t0 = t0;
    data.t_end = t_end;
    data.faults = faults.records();
    data.kills = faults.kills();
    data.kills.insert(data.kills.end(), stragglers.begin(), stragglers.end());
    data.slow = probe.slow();
    if (!result.interrupted) {
        // Nothing may be left but fencing counters, once the leases of the killed are over.
        const std::int64_t until =
            monotonic_ns() + std::int64_t{p.max_lease_ms() + 3000} * 1'000'000;
        for (;;) {
            data.leftovers = topo->leftovers(prefix);
            if (data.leftovers.empty() || monotonic_ns() >= until || interrupted != 0) {
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds{250});
        }
    }
    for (int i = 0; i < processes; ++i) {
        process_now& pn = log.process(i);
        auto& o2 = outcomes[static_cast<std::size_t>(i)];
        o2.finished = pn.finished.load() != 0;
        o2.fds_before = pn.fds_before.load();
        o2.fds_after = pn.fds_after.load();
        o2.tasks_before = pn.tasks_before.load();
        o2.tasks_after = pn.tasks_after.load();
        data.overflow += pn.overflow.load();
        log.read(i, [&](const record& r) { data.entries.push_back(entry::of(r)); });
    }
    data.processes = outcomes;

    checker check{data};
    // An interrupted run killed its workers mid-call, with no record of what they held: its
    // data would accuse the library of what the interruption did.
    const findings found = result.interrupted ? findings{} : check.run();
    if (o.verbose) {
        for (const auto& f : data.faults) {
            print_fault(out, check, f);
        }
        for (std::size_t i = 0; i < outcomes.size(); ++i) {
            const auto& po = outcomes[i];
            out << "  process " << i << ": descriptors " << po.fds_before << " -> " << po.fds_after
                << ", threads " << po.tasks_before << " -> " << po.tasks_after
                << (po.finished ? "" : " (did not finish)") << "\n";
        }
    }
    print_findings(out, found, 200);
    if (o.trace >= 0 && o.trace < static_cast<int>(names.size())) {
        print_trace(out, check, data, o.trace);
    } else if (o.trace == trace_violations) {
        // Exclusion and error findings first: they are the rare ones, liveness the common.
        std::vector<bool> traced(names.size(), false);
        int count = 0;
        for (const bool rare : {true, false}) {
            for (std::size_t n = 0; n < names.size() && count < 3; ++n) {
                const std::string quoted = "'" + names[n] + "'";
                if (!traced[n] && std::any_of(found.violations.begin(), found.violations.end(),
                                              [&](const violation& v) {
                                                  return (!rare || v.check == "exclusion" ||
                                                          v.check == "error") &&
                                                         v.text.find(quoted) != v.text.npos;
                                              })) {
                    print_trace(out, check, data, static_cast<int>(n));
                    traced[n] = true;
                    ++count;
                }
            }
        }
    }
    summary s;
    for (const auto& e : data.entries) {
        if (e.type == record_type::hold) {
            ++s.acquisitions;
            if (static_cast<std::size_t>(e.name) < p.names.size()) {
                ++s.acquisitions_of[static_cast<int>(p.names[e.name])];
            }
        }
    }
    s.faults_planned = p.faults.size();
    for (const auto& f : data.faults) {
        s.faults_applied += f.applied && !f.unplanned ? 1 : 0;
        s.faults_unplanned += f.unplanned ? 1 : 0;
    }
    s.violations = found.violations.size();
    s.tool_errors = found.tool_errors.size();
    if (result.interrupted) {
        out << "interrupted: nothing was checked\n";
    }
    print_summary(out, p, s, found);
    faults.finish();
    result.violations = s.violations;
    result.tool_errors = s.tool_errors;
    return result;
}

}  // namespace redislock::torture
