// redislock-torture: the plan, every operation and fault of a run with its parameters, drawn
// from the seed before anything runs. The same seed, topology, length and process and thread
// counts draw the same plan (its size is the `operations:` line); only the interleaving of the
// threads and the servers' answers differ between two runs of it.
//
// What is drawn, and why it is drawn so:
// - names: a few per run, each used by one lock kind, so that threads contend;
// - objects: each thread has one to three lock objects per name, with leases, watchdog,
//   fencing, min_replicas, backoff and max_hold of their own, so one owner holds a name through
//   several objects with different leases (re-entry through a sibling object);
// - episodes: a thread's sequence of acquire / hold / release, with every call kind (lock,
//   try_lock, try_lock_for, try_lock_until, lock with a stop request, try_lock_for with one),
//   steps while holding (re-entry through the same or a sibling object, extend, verify), every
//   way to let go (unlock, unlock(ec), destruction, letting the lease run out), episodes on a
//   client made for them and destroyed while the lock lives, and fork() with the child locking
//   through the inherited client;
// - faults: a schedule of server, network and process faults of the topology, each with its
//   target and duration.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "torture/rng.hpp"

namespace redislock::torture {

enum class topology_kind { single, sentinel, cluster, redlock, given };

inline std::string_view to_string(topology_kind t) {
    switch (t) {
        case topology_kind::single:
            return "single";
        case topology_kind::sentinel:
            return "sentinel";
        case topology_kind::cluster:
            return "cluster";
        case topology_kind::redlock:
            return "redlock";
        case topology_kind::given:
            return "uri";
    }
    return "?";
}

enum class lock_type { mutex, recursive, shared, semaphore };

/// The permits of every semaphore name of a run.
inline constexpr int semaphore_permits = 2;

inline std::string_view to_string(lock_type t) {
    switch (t) {
        case lock_type::mutex:
            return "mutex";
        case lock_type::recursive:
            return "recursive_mutex";
        case lock_type::shared:
            return "shared_mutex";
        case lock_type::semaphore:
            return "counting_semaphore";
    }
    return "?";
}

/// One lock object a thread owns for the whole run (re-made after a destroying release).
struct object_spec {
    int name = 0;
    int client = 0;  ///< index into the process's clients
    int lease_ms = 1000;
    bool watchdog = false;
    bool fencing = false;
    int min_replicas = 0;
    int backoff_max_ms = 128;
    int max_hold_ms = 0;
    bool explicit_owner = false;  ///< lock_options::owner, the same for all of the thread's
                                  ///< objects of that name
};

enum class call_kind { lock, try_lock, try_lock_for, try_lock_until, lock_stop, try_lock_for_stop };

inline std::string_view to_string(call_kind c) {
    switch (c) {
        case call_kind::lock:
            return "lock()";
        case call_kind::try_lock:
            return "try_lock()";
        case call_kind::try_lock_for:
            return "try_lock_for()";
        case call_kind::try_lock_until:
            return "try_lock_until()";
        case call_kind::lock_stop:
            return "lock(stop)";
        case call_kind::try_lock_for_stop:
            return "try_lock_for(stop)";
    }
    return "?";
}

/// Something a holder does while it holds, `at_ms` into its hold.
struct inner_step {
    enum class kind { reenter, extend, verify } what = kind::verify;
    int at_ms = 0;
    int object = 0;       ///< reenter: the object it re-enters through (the holding one or a
                          ///< sibling of the same owner)
    bool shared = false;  ///< reenter: in read mode
    int hold_ms = 0;      ///< reenter: how long the inner entry is kept
    int timeout_ms = 50;  ///< reenter: try_lock_for timeout
    int lease_ms = 1000;  ///< extend: the new lease
};

enum class release_kind { unlock, unlock_ec, destroy, expire };

inline std::string_view to_string(release_kind r) {
    switch (r) {
        case release_kind::unlock:
            return "unlock()";
        case release_kind::unlock_ec:
            return "unlock(ec)";
        case release_kind::destroy:
            return "destruction";
        case release_kind::expire:
            return "lease running out";
    }
    return "?";
}

struct episode {
    /// hold: acquire, hold, release. fresh_client: the same through a client made for it and
    /// destroyed right after the acquisition. fork: fork(), and the child holds once through the
    /// inherited client while the process's other threads wait between their episodes.
    enum class kind { hold, fresh_client, fork } what = kind::hold;
    int object = 0;
    bool shared = false;
    call_kind call = call_kind::try_lock;
    int timeout_ms = 0;  ///< try_lock_for / try_lock_until
    int stop_ms = 0;     ///< when the stop is requested, for the calls that take one
    int hold_ms = 0;
    std::vector<inner_step> steps;
    release_kind release = release_kind::unlock_ec;
    int idle_ms = 0;  ///< after the episode
};

struct thread_plan {
    std::vector<object_spec> objects;
    std::vector<episode> episodes;
};

/// A client of a worker process; `path` -1 talks to the servers directly, k >= 0 through the
/// k-th proxy (single server: one of two proxies; Redlock: one proxy per master).
struct client_spec {
    int path = -1;
    int command_timeout_ms = 500;
    int connect_timeout_ms = 500;
    int node_timeout_ms = 60;  ///< Redlock
};

struct process_plan {
    std::vector<client_spec> clients;
    std::vector<thread_plan> threads;
};

enum class fault_kind {
    kill_restart,     ///< kill -9, then a new empty server on the port (after a delay)
    sigstop,          ///< SIGSTOP, SIGCONT after the duration
    client_kill,      ///< CLIENT KILL TYPE normal
    client_pause,     ///< CLIENT PAUSE ms ALL / WRITE
    server_sleep,     ///< DEBUG SLEEP, or a busy script where DEBUG is off
    oom,              ///< maxmemory 1 with noeviction for the duration
    evict_queue,      ///< DEL of a contended name's {name}:waiting and/or {name}:queue
    proxy_stall,      ///< a stalled network path: bytes held both ways
    proxy_cut,        ///< every connection through a proxy closed
    proxy_delay,      ///< latency on a path
    net_drop,         ///< every packet to a server's port dropped (iptables in a private netns)
    kill_waiter,      ///< kill -9 of a worker process that waits for a lock (it is restarted)
    failover,         ///< graceful: SENTINEL FAILOVER / CLUSTER FAILOVER
    forced_failover,  ///< Sentinel: kill -9 of the master; Cluster: CLUSTER FAILOVER FORCE
    replica_stop,     ///< SIGSTOP of a replica
    replica_kill,     ///< kill -9 of a replica, restarted after the duration
    migrate,          ///< a slot migration, step by step, with or without REPLACE
};

inline std::string_view to_string(fault_kind f) {
    switch (f) {
        case fault_kind::kill_restart:
            return "kill -9 + restart";
        case fault_kind::sigstop:
            return "SIGSTOP";
        case fault_kind::client_kill:
            return "CLIENT KILL";
        case fault_kind::client_pause:
            return "CLIENT PAUSE";
        case fault_kind::server_sleep:
            return "DEBUG SLEEP";
        case fault_kind::oom:
            return "OOM";
        case fault_kind::evict_queue:
            return "queue keys evicted";
        case fault_kind::proxy_stall:
            return "stalled path";
        case fault_kind::proxy_cut:
            return "connections cut";
        case fault_kind::proxy_delay:
            return "slow path";
        case fault_kind::net_drop:
            return "packets dropped";
        case fault_kind::kill_waiter:
            return "kill -9 of a waiting process";
        case fault_kind::failover:
            return "failover";
        case fault_kind::forced_failover:
            return "forced failover";
        case fault_kind::replica_stop:
            return "replica SIGSTOP";
        case fault_kind::replica_kill:
            return "replica kill -9";
        case fault_kind::migrate:
            return "slot migration";
    }
    return "?";
}

struct fault_spec {
    int at_ms = 0;
    fault_kind kind = fault_kind::client_kill;
    int duration_ms = 0;
    int target = 0;   ///< a name, master, replica or proxy index, taken modulo what exists
    int count = 1;    ///< Redlock: how many masters at once
    int variant = 0;  ///< migrate: 1 without REPLACE; client_pause: 1 WRITE; evict_queue: 0
                      ///< :waiting, 1 :queue, 2 both; failover: 1 TAKEOVER (Cluster)
    int pick = 0;     ///< which of the candidates found at run time (waiters, names)
};

struct run_shape {
    topology_kind topology = topology_kind::single;
    std::uint64_t seed = 0;
    int run_ms = 20'000;
    int processes = 3;
    int threads = 3;
    int names = 0;       ///< 0: five (Redlock: three)
    bool brisk = false;  ///< short holds, replayed episodes: many acquisitions, for a soak
};

struct plan {
    run_shape shape;
    std::vector<lock_type> names;
    std::vector<process_plan> processes;
    std::vector<fault_spec> faults;
    int proxies = 0;  ///< proxies the topology runs (their targets are the topology's)

    /// Episodes, steps and faults: the plan's size.
    std::size_t operations() const {
        std::size_t n = faults.size();
        for (const auto& p : processes) {
            for (const auto& t : p.threads) {
                for (const auto& e : t.episodes) {
                    n += 1 + e.steps.size();
                }
            }
        }
        return n;
    }

    std::size_t episodes() const {
        std::size_t n = 0;
        for (const auto& p : processes) {
            for (const auto& t : p.threads) {
                n += t.episodes.size();
            }
        }
        return n;
    }

    int max_lease_ms() const {
        int longest = 0;
        for (const auto& p : processes) {
            for (const auto& t : p.threads) {
                for (const auto& o : t.objects) {
                    longest = std::max(longest, o.lease_ms);
                }
                for (const auto& e : t.episodes) {
                    for (const auto& s : e.steps) {
                        if (s.what == inner_step::kind::extend) {
                            longest = std::max(longest, s.lease_ms);
                        }
                    }
                }
            }
        }
        return longest;
    }
};

namespace drawing {

inline int draw_lease(rng& r) {
    static constexpr int leases[] = {250, 400, 700, 1000, 1500, 2500, 4000};
    return leases[r.between(0, 6)];
}

inline client_spec draw_client(rng& r, const run_shape& shape, int proxies) {
    client_spec c;
    c.path = proxies > 0 && r.percent(50) ? r.between(0, proxies - 1) : -1;
    if (shape.topology == topology_kind::redlock) {
        c.path = r.percent(50) ? 0 : -1;  // through the masters' proxies, or straight
    }
    static constexpr int timeouts[] = {250, 400, 600};
    c.command_timeout_ms = timeouts[r.between(0, 2)];
    c.connect_timeout_ms = timeouts[r.between(0, 2)];
    static constexpr int node_timeouts[] = {40, 60, 100};
    c.node_timeout_ms = node_timeouts[r.between(0, 2)];
    return c;
}

inline object_spec draw_object(rng& r, const run_shape& shape, int name, lock_type type,
                               const std::vector<client_spec>& clients, bool explicit_owner) {
    object_spec o;
    o.name = name;
    o.client = r.between(0, static_cast<int>(clients.size()) - 1);
    o.lease_ms = draw_lease(r);
    o.watchdog = r.percent(35);
    const bool redlock = shape.topology == topology_kind::redlock;
    o.fencing = !redlock && r.percent(35);
    if (shape.topology == topology_kind::sentinel) {
        o.min_replicas = static_cast<int>(r.weighted({60, 30, 10}));
    } else if (shape.topology == topology_kind::cluster) {
        o.min_replicas = r.percent(20) ? 1 : 0;
    }
    static constexpr int backoffs[] = {16, 64, 128, 256};
    o.backoff_max_ms = backoffs[r.between(0, 3)];
    // The docs' rule for the watchdog: a lease of at least 6 command timeouts.
    const client_spec& c = clients[static_cast<std::size_t>(o.client)];
    const int round_trip = redlock ? c.node_timeout_ms : c.command_timeout_ms;
    if (o.watchdog && o.lease_ms < 6 * round_trip) {
        o.lease_ms = std::max(o.lease_ms, 6 * round_trip);
    }
    if (redlock) {
        // A Redlock lease must exceed node_timeout plus the drift allowance.
        o.lease_ms = std::max(o.lease_ms, 4 * c.node_timeout_ms);
    }
    o.max_hold_ms = o.watchdog && r.percent(15) ? o.lease_ms * r.between(15, 30) / 10 : 0;
    o.explicit_owner = explicit_owner;
    (void)type;
    return o;
}

inline call_kind draw_call(rng& r) {
    static constexpr call_kind calls[] = {call_kind::lock,         call_kind::try_lock,
                                          call_kind::try_lock_for, call_kind::try_lock_until,
                                          call_kind::lock_stop,    call_kind::try_lock_for_stop};
    return calls[r.weighted({12, 15, 35, 10, 15, 13})];
}

inline int draw_hold(rng& r) {
    switch (r.weighted({70, 25, 5})) {
        case 0:
            return r.log_between(1, 100);
        case 1:
            return r.between(100, 800);
        default:
            return r.between(800, 4000);
    }
}

// Indices of the thread's objects for `name`.
inline std::vector<int> objects_of(const thread_plan& t, int name) {
    std::vector<int> out;
    for (std::size_t i = 0; i < t.objects.size(); ++i) {
        if (t.objects[i].name == name) {
            out.push_back(static_cast<int>(i));
        }
    }
    return out;
}

inline episode draw_episode(rng& r, const run_shape& shape, const std::vector<lock_type>& names,
                            const thread_plan& t, bool may_fork) {
    episode e;
    const int name = r.between(0, static_cast<int>(names.size()) - 1);
    const lock_type type = names[static_cast<std::size_t>(name)];
    const auto mine = objects_of(t, name);
    e.object = mine[static_cast<std::size_t>(r.between(0, static_cast<int>(mine.size()) - 1))];
    e.shared = type == lock_type::shared && r.percent(50);
    e.call = draw_call(r);
    e.timeout_ms = r.log_between(5, 3000);
    e.stop_ms = r.log_between(5, 2000);
    e.hold_ms = shape.brisk ? r.between(0, 3) : draw_hold(r);
    e.idle_ms = shape.brisk || r.percent(30) ? 0 : r.log_between(1, 200);
    static constexpr release_kind releases[] = {release_kind::unlock_ec, release_kind::unlock,
                                                release_kind::destroy, release_kind::expire};
    e.release = releases[r.weighted({68, 15, 12, shape.brisk ? 0 : 5})];
    if (may_fork && r.percent(3)) {
        e.what = episode::kind::fork;
        e.call = call_kind::try_lock_for;
        e.hold_ms = r.log_between(1, 200);
        e.release = release_kind::unlock_ec;
        return e;
    }
    if (r.percent(5)) {
        e.what = episode::kind::fresh_client;
        return e;
    }
    const int steps = r.weighted({40, 30, 20, 10});
    for (int i = 0; i < steps; ++i) {
        inner_step s;
        s.at_ms = r.between(0, e.hold_ms);
        const bool reentrant = type == lock_type::recursive || type == lock_type::shared;
        switch (r.weighted({reentrant ? 60 : 0, 20, 20})) {
            case 0: {
                s.what = inner_step::kind::reenter;
                s.object =
                    mine[static_cast<std::size_t>(r.between(0, static_cast<int>(mine.size()) - 1))];
                // A reader cannot ask to write (it would throw for a deadlock).
                s.shared = type == lock_type::shared && (e.shared || r.percent(50));
                s.hold_ms = shape.brisk ? r.between(0, 2) : r.log_between(1, 300);
                s.timeout_ms = r.log_between(5, 300);
                break;
            }
            case 1:
                s.what = inner_step::kind::extend;
                s.lease_ms = draw_lease(r);
                break;
            default:
                s.what = inner_step::kind::verify;
                break;
        }
        e.steps.push_back(s);
    }
    std::sort(e.steps.begin(), e.steps.end(),
              [](const inner_step& a, const inner_step& b) { return a.at_ms < b.at_ms; });
    return e;
}

// What an episode costs, for sizing the plan to the run's length.
inline int nominal_ms(const episode& e) {
    int wait = 20;
    switch (e.call) {
        case call_kind::try_lock_for:
        case call_kind::try_lock_until:
            wait += e.timeout_ms / 3;
            break;
        case call_kind::lock_stop:
        case call_kind::try_lock_for_stop:
            wait += std::min(e.timeout_ms, e.stop_ms) / 3;
            break;
        default:
            break;
    }
    return wait + e.hold_ms + e.idle_ms;
}

inline std::vector<fault_spec> draw_faults(rng& r, const run_shape& shape, int names) {
    using f = fault_kind;
    struct weighted_kind {
        fault_kind kind;
        int weight;
    };
    std::vector<weighted_kind> kinds;
    switch (shape.topology) {
        case topology_kind::single:
            kinds = {{f::kill_restart, 1}, {f::sigstop, 2},      {f::client_kill, 2},
                     {f::client_pause, 2}, {f::server_sleep, 2}, {f::oom, 2},
                     {f::evict_queue, 3},  {f::proxy_stall, 3},  {f::proxy_cut, 1},
                     {f::proxy_delay, 1},  {f::net_drop, 2},     {f::kill_waiter, 4}};
            break;
        case topology_kind::given:
            kinds = {{f::evict_queue, 3},
                     {f::proxy_stall, 3},
                     {f::proxy_cut, 2},
                     {f::proxy_delay, 1},
                     {f::kill_waiter, 4}};
            break;
        case topology_kind::sentinel:
            kinds = {{f::failover, 3},     {f::forced_failover, 1}, {f::sigstop, 1},
                     {f::replica_stop, 2}, {f::replica_kill, 1},    {f::client_kill, 2},
                     {f::client_pause, 2}, {f::server_sleep, 1},    {f::oom, 1},
                     {f::evict_queue, 3},  {f::kill_waiter, 3}};
            break;
        case topology_kind::cluster:
            kinds = {{f::migrate, 7},      {f::failover, 2},     {f::forced_failover, 1},
                     {f::sigstop, 1},      {f::kill_restart, 1}, {f::client_kill, 2},
                     {f::client_pause, 2}, {f::server_sleep, 1}, {f::oom, 1},
                     {f::replica_stop, 1}, {f::evict_queue, 2},  {f::kill_waiter, 2}};
            break;
        case topology_kind::redlock:
            kinds = {{f::kill_restart, 2}, {f::sigstop, 3},      {f::client_kill, 2},
                     {f::client_pause, 2}, {f::server_sleep, 2}, {f::oom, 2},
                     {f::proxy_stall, 2},  {f::proxy_cut, 1},    {f::net_drop, 3},
                     {f::kill_waiter, 2}};
            break;
    }
    int total = 0;
    for (const auto& k : kinds) {
        total += k.weight;
    }
    std::vector<fault_spec> out;
    int at = r.between(700, 1500);
    const int last = shape.run_ms - 1500;
    while (at < last) {
        int draw = r.between(0, total - 1);
        fault_kind kind = kinds.front().kind;
        for (const auto& k : kinds) {
            if (draw < k.weight) {
                kind = k.kind;
                break;
            }
            draw -= k.weight;
        }
        fault_spec s;
        s.at_ms = at;
        s.kind = kind;
        s.target = r.between(0, 1 << 20);
        s.pick = r.between(0, 1 << 20);
        s.variant = r.between(0, 2);
        s.count = shape.topology == topology_kind::redlock
                      ? 1 + static_cast<int>(r.weighted({70, 20, 10}))
                      : 1;
        switch (kind) {
            case f::kill_restart:
            case f::replica_kill:
                s.duration_ms = r.between(300, 1500);  // plus the longest lease, at run time
                break;
            case f::sigstop:
            case f::replica_stop:
                s.duration_ms = r.log_between(100, 4000);
                break;
            case f::client_pause:
            case f::server_sleep:
                s.duration_ms = r.log_between(50, 1500);
                break;
            case f::oom:
            case f::proxy_stall:
            case f::net_drop:
            case f::proxy_delay:
                s.duration_ms = r.log_between(100, 3000);
                break;
            case f::migrate:
                s.duration_ms = r.log_between(100, 2500);  // spread over the migration's steps
                break;
            case f::failover:
                // Sentinel: the demoted master stays writable this long after the switch.
                s.duration_ms = shape.topology == topology_kind::sentinel ? r.log_between(50, 8000)
                                                                          : r.between(0, 1000);
                break;
            case f::forced_failover:
                s.duration_ms = r.between(0, 1000);  // the old master stays down this long
                break;
            default:
                s.duration_ms = 0;
                break;
        }
        out.push_back(s);
        // Faults take turns; the next one starts after a gap, whatever this one takes.
        at += s.duration_ms + r.between(1000, 4000);
    }
    (void)names;
    return out;
}

}  // namespace drawing

/// Draws the whole plan of a run from its shape.
inline plan draw_plan(const run_shape& shape) {
    plan p;
    p.shape = shape;
    const rng root{shape.seed ^ (static_cast<std::uint64_t>(shape.topology) << 56)};
    rng names = root.stream("names");
    const bool redlock = shape.topology == topology_kind::redlock;
    const int name_count = shape.names > 0 ? shape.names : redlock ? 3 : 5;
    for (int i = 0; i < name_count; ++i) {
        if (redlock) {
            p.names.push_back(lock_type::mutex);
        } else if (i < 4) {
            p.names.push_back(static_cast<lock_type>(i));  // every kind at least once
        } else {
            p.names.push_back(static_cast<lock_type>(names.between(0, 3)));
        }
    }
    if (shape.topology == topology_kind::single || shape.topology == topology_kind::given) {
        p.proxies = 2;
    } else if (redlock) {
        p.proxies = 5;  // one per master: a path of its own to each
    }
    const int client_paths = redlock ? 1 : p.proxies;
    for (int pi = 0; pi < shape.processes; ++pi) {
        process_plan proc;
        rng r = root.stream("process", static_cast<std::uint64_t>(pi));
        const int clients = r.percent(50) ? 2 : 1;
        for (int c = 0; c < clients; ++c) {
            proc.clients.push_back(drawing::draw_client(r, shape, client_paths));
        }
        for (int ti = 0; ti < shape.threads; ++ti) {
            thread_plan t;
            rng tr = root.stream("thread", static_cast<std::uint64_t>(pi * 1000 + ti));
            for (int n = 0; n < name_count; ++n) {
                const lock_type type = p.names[static_cast<std::size_t>(n)];
                const int count = type == lock_type::mutex || type == lock_type::semaphore
                                      ? tr.between(1, 2)
                                      : tr.between(2, 3);
                const bool explicit_owner = tr.percent(20);
                for (int k = 0; k < count; ++k) {
                    t.objects.push_back(
                        drawing::draw_object(tr, shape, n, type, proc.clients, explicit_owner));
                }
            }
            int budget = shape.run_ms * 6 / 5;
            const std::size_t most = static_cast<std::size_t>(shape.run_ms / 5) + 10;
            while (budget > 0 && t.episodes.size() < most) {
                episode e = drawing::draw_episode(tr, shape, p.names, t, ti == 0);
                budget -= drawing::nominal_ms(e);
                t.episodes.push_back(std::move(e));
            }
            proc.threads.push_back(std::move(t));
        }
        p.processes.push_back(std::move(proc));
    }
    rng faults = root.stream("faults");
    p.faults = drawing::draw_faults(faults, shape, name_count);
    return p;
}

}  // namespace redislock::torture
