#pragma once

// A private Redis Cluster on loopback: masters and replicas started as redis-server processes,
// joined with `redis-cli --cluster create`, plus the operations the cluster tests need (which
// master serves a slot, moving a slot, failover, killing a master). Commands go through
// redis-cli, never through the code under test.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <hiredis/hiredis.h>

#include "support/redis_server.hpp"

namespace redislock::test {

namespace detail {

// True when nothing listens on 127.0.0.1:port and it can be bound.
inline bool port_is_free(int port) {
    unique_fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) {
        return false;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    return ::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
}

inline std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
        if (!line.empty() && line.back() == '\r') {
            line.pop_back();
        }
        if (!line.empty()) {
            lines.push_back(line);
        }
    }
    return lines;
}

inline std::vector<std::string> split_words(const std::string& line) {
    std::vector<std::string> words;
    std::istringstream in(line);
    for (std::string word; in >> word;) {
        words.push_back(word);
    }
    return words;
}

}  // namespace detail

/// One line of CLUSTER NODES, as seen by some node.
struct cluster_node_info {
    std::string id;
    int port = 0;
    bool master = false;
    bool failed = false;
    std::string master_id;  ///< for a replica
    std::uint64_t config_epoch = 0;
    std::vector<std::pair<int, int>> slot_ranges;  ///< for a master
};

/// A Redis Cluster of `masters` masters with `replicas` replicas each, on free loopback ports
/// below 22768 (so that each bus port, data port + 10000, stays out of the ephemeral range).
/// Not thread-safe; create it on a thread that outlives it (the servers die with that thread).
class redis_cluster {
public:
    explicit redis_cluster(int masters = 3, int replicas = 1) : owner_pid_(::getpid()) {
        dir_ = detail::make_temp_dir();
        const auto started = detail::clock::now();
        try {
            start(masters, replicas);
        } catch (...) {
            stop_all();
            remove_dir();
            throw;
        }
        bring_up_ =
            std::chrono::duration_cast<std::chrono::milliseconds>(detail::clock::now() - started);
    }

    ~redis_cluster() {
        if (::getpid() == owner_pid_) {
            stop_all();
            remove_dir();
        }
    }

    redis_cluster(const redis_cluster&) = delete;
    redis_cluster& operator=(const redis_cluster&) = delete;

    /// Time from the first process start to a cluster ready on every node.
    std::chrono::milliseconds bring_up_time() const { return bring_up_; }

    /// Every node's data port, in start order (masters first as created).
    const std::vector<int>& ports() const { return ports_; }

    /// redis://127.0.0.1:p1,127.0.0.1:p2,... over every node still running.
    std::string uri(const std::string& query = {}) const {
        std::string out = "redis://";
        bool first = true;
        for (int port : ports_) {
            if (!running(port)) {
                continue;
            }
            out += (first ? "" : ",") + std::string{"127.0.0.1:"} + std::to_string(port);
            first = false;
        }
        return query.empty() ? out : out + "?" + query;
    }

    std::string uri_of(int port) const { return "redis://127.0.0.1:" + std::to_string(port); }

    bool running(int port) const {
        const auto it = pids_.find(port);
        return it != pids_.end() && it->second > 0;
    }

    /// Runs redis-cli against one node; returns its output without the last newline.
    std::string cli(int port, const std::vector<std::string>& args) const {
        std::vector<std::string> argv{detail::find_executable("redis-cli"), "-h", "127.0.0.1", "-p",
                                      std::to_string(port)};
        argv.insert(argv.end(), args.begin(), args.end());
        auto result = detail::run_capture(argv, std::chrono::seconds(20));
        if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0) {
            throw std::runtime_error("redis-cli -p " + std::to_string(port) +
                                     " failed: " + result.err + result.out);
        }
        if (!result.out.empty() && result.out.back() == '\n') {
            result.out.pop_back();
        }
        return result.out;
    }

    /// Sends one command to one node over a connection of its own, as cli() does but without
    /// starting a process (a loaded machine takes a large share of a second to start one):
    /// returns a string or status as it is, an integer in decimal, nil as "", and an array of
    /// those one per line. @throws std::runtime_error when the node cannot be reached or
    /// answers with an error.
    std::string command(int port, const std::vector<std::string>& args) const {
        const timeval timeout{20, 0};
        const std::unique_ptr<redisContext, decltype(&redisFree)> ctx{
            redisConnectWithTimeout("127.0.0.1", port, timeout), &redisFree};
        if (!ctx || ctx->err != 0 || redisSetTimeout(ctx.get(), timeout) != REDIS_OK) {
            throw std::runtime_error("cannot connect to node " + std::to_string(port));
        }
        std::vector<const char*> argv;
        std::vector<std::size_t> lengths;
        for (const std::string& a : args) {
            argv.push_back(a.data());
            lengths.push_back(a.size());
        }
        const std::unique_ptr<redisReply, decltype(&freeReplyObject)> r{
            static_cast<redisReply*>(redisCommandArgv(ctx.get(), static_cast<int>(argv.size()),
                                                      argv.data(), lengths.data())),
            &freeReplyObject};
        if (!r) {
            throw std::runtime_error("node " + std::to_string(port) + " did not answer");
        }
        const auto text = [](const redisReply& e) -> std::string {
            switch (e.type) {
                case REDIS_REPLY_STRING:
                case REDIS_REPLY_STATUS:
                case REDIS_REPLY_ERROR:
                    return std::string{e.str, e.len};
                case REDIS_REPLY_INTEGER:
                    return std::to_string(e.integer);
                default:
                    return "";
            }
        };
        if (r->type == REDIS_REPLY_ERROR) {
            throw std::runtime_error("node " + std::to_string(port) + " answered " + text(*r));
        }
        if (r->type != REDIS_REPLY_ARRAY) {
            return text(*r);
        }
        std::string lines;
        for (std::size_t i = 0; i < r->elements; ++i) {
            lines += (i == 0 ? "" : "\n") + text(*r->element[i]);
        }
        return lines;
    }

    /// The node's id; a node keeps it for its life, so it is asked once.
    std::string node_id(int port) const {
        if (auto it = ids_.find(port); it != ids_.end()) {
            return it->second;
        }
        return ids_[port] = command(port, {"CLUSTER", "MYID"});
    }

    int key_slot(const std::string& key) const {
        return std::stoi(command(any_running(), {"CLUSTER", "KEYSLOT", key}));
    }

    /// CLUSTER NODES as `asked` sees it.
    std::vector<cluster_node_info> nodes(int asked) const {
        std::vector<cluster_node_info> out;
        for (const std::string& line : detail::split_lines(command(asked, {"CLUSTER", "NODES"}))) {
            const auto words = detail::split_words(line);
            if (words.size() < 8) {
                continue;
            }
            cluster_node_info info;
            info.id = words[0];
            const auto colon = words[1].find(':');
            const auto at = words[1].find('@');
            info.port = std::stoi(words[1].substr(colon + 1, at - colon - 1));
            info.master = words[2].find("master") != std::string::npos;
            info.failed = words[2].find("fail") != std::string::npos &&
                          words[2].find("fail?") == std::string::npos;
            info.master_id = words[3];
            info.config_epoch = std::stoull(words[6]);
            for (std::size_t i = 8; i < words.size(); ++i) {
                if (words[i].starts_with("[")) {
                    continue;  // a slot being imported or migrated
                }
                const auto dash = words[i].find('-');
                const int first = std::stoi(words[i].substr(0, dash));
                const int last =
                    dash == std::string::npos ? first : std::stoi(words[i].substr(dash + 1));
                info.slot_ranges.emplace_back(first, last);
            }
            out.push_back(info);
        }
        return out;
    }

    /// The ports of the masters that serve slots, as node `asked` (default: any) sees them.
    std::vector<int> masters(std::optional<int> asked = std::nullopt) const {
        std::vector<int> out;
        for (const auto& n : nodes(asked.value_or(any_running()))) {
            if (n.master && !n.failed && !n.slot_ranges.empty()) {
                out.push_back(n.port);
            }
        }
        std::sort(out.begin(), out.end());
        return out;
    }

    /// The master serving `slot`, as that master itself reports (its own view is the truth for
    /// where a command is executed).
    int master_for_slot(int slot) const {
        for (int port : masters()) {
            for (const auto& n : nodes(port)) {
                if (n.port != port) {
                    continue;
                }
                for (const auto& [first, last] : n.slot_ranges) {
                    if (slot >= first && slot <= last) {
                        return port;
                    }
                }
            }
        }
        throw std::runtime_error("no master serves slot " + std::to_string(slot));
    }

    int master_for_key(const std::string& key) const { return master_for_slot(key_slot(key)); }

    /// The running replicas of the master on `master_port`.
    std::vector<int> replicas_of(int master_port) const {
        const std::string id = node_id(master_port);
        std::vector<int> out;
        for (const auto& n : nodes(master_port)) {
            if (!n.master && n.master_id == id && running(n.port)) {
                out.push_back(n.port);
            }
        }
        return out;
    }

    /// How MIGRATE moves a key the target already has: `plain` refuses it (BUSYKEY), as
    /// `redis-cli --cluster reshard` sends it; `replace` overwrites the target's copy.
    enum class migrate_mode { plain, replace };

    /// Moves `slot` to the master on `to`, keys included, the way redis-cli --cluster reshard
    /// does: IMPORTING on the target, MIGRATING on the source, MIGRATE of the keys in batches,
    /// SETSLOT NODE on the target, the source, then every other master. `pause` is slept after
    /// each step, so clients see the ASK and TRYAGAIN states.
    void migrate_slot(int slot, int to, std::chrono::milliseconds pause = {},
                      migrate_mode mode = migrate_mode::plain) {
        const int from = master_for_slot(slot);
        if (from == to) {
            return;
        }
        begin_migration(slot, from, to);
        std::this_thread::sleep_for(pause);
        move_keys(slot, from, to, pause, mode);
        finish_migration(slot, from, to);
    }

    /// Whether the master on `port` knows every master's current config epoch (each master's
    /// own report). A target that takes a slot takes the epoch one above the highest it knows:
    /// while another master's latest epoch has not reached it by gossip, both can end with the
    /// same epoch, and a claim of the source's sent before it let go can then take the slot back
    /// from the target for good, each node sending clients to the other. Redis leaves pacing
    /// migrations to the operator; a test that moves slots many times a second must do it.
    bool knows_current_epochs(int port) const {
        const auto view = nodes(port);
        for (int master : masters(port)) {
            if (!running(master)) {
                continue;
            }
            std::uint64_t own = 0;
            for (const auto& n : nodes(master)) {
                if (n.port == master) {
                    own = n.config_epoch;
                }
            }
            const auto seen = std::find_if(view.begin(), view.end(),
                                           [&](const auto& n) { return n.port == master; });
            if (seen == view.end() || seen->config_epoch != own) {
                return false;
            }
        }
        return true;
    }

    /// Step 1 of a migration: IMPORTING on the target, then MIGRATING on the source. Waits
    /// first until the target knows every master's epoch (knows_current_epochs).
    void begin_migration(int slot, int from, int to) const {
        wait_until("node " + std::to_string(to) + " knows every master's epoch",
                   [&] { return knows_current_epochs(to); });
        const std::string s = std::to_string(slot);
        command(to, {"CLUSTER", "SETSLOT", s, "IMPORTING", node_id(from)});
        command(from, {"CLUSTER", "SETSLOT", s, "MIGRATING", node_id(to)});
    }

    /// Step 2: MIGRATE every key of the slot, 10 at a time, sleeping `pause` after each batch.
    /// @throws std::runtime_error when MIGRATE fails (BUSYKEY in `plain` mode: the target
    ///         already holds a key of that name).
    void move_keys(int slot, int from, int to, std::chrono::milliseconds pause = {},
                   migrate_mode mode = migrate_mode::plain) const {
        const std::string s = std::to_string(slot);
        for (int round = 0; round < 1000; ++round) {
            const auto keys =
                detail::split_lines(command(from, {"CLUSTER", "GETKEYSINSLOT", s, "10"}));
            if (keys.empty()) {
                break;
            }
            move_named_keys(from, to, keys, mode);
            std::this_thread::sleep_for(pause);
        }
    }

    /// Part of step 2: MIGRATE these keys alone (those that exist on `from`), leaving the rest
    /// of their slot where it is.
    /// @throws std::runtime_error when MIGRATE fails.
    void move_named_keys(int from, int to, const std::vector<std::string>& keys,
                         migrate_mode mode = migrate_mode::plain) const {
        std::vector<std::string> migrate{"MIGRATE", "127.0.0.1", std::to_string(to),
                                         "",        "0",         "5000"};
        if (mode == migrate_mode::replace) {
            migrate.push_back("REPLACE");
        }
        migrate.push_back("KEYS");
        migrate.insert(migrate.end(), keys.begin(), keys.end());
        std::string answer;
        try {
            answer = command(from, migrate);
        } catch (const std::runtime_error& e) {
            throw std::runtime_error("MIGRATE of " + std::to_string(keys.size()) + " key(s) from " +
                                     std::to_string(from) + " failed: " + e.what());
        }
        if (answer != "OK" && answer != "NOKEY") {
            throw std::runtime_error("MIGRATE from " + std::to_string(from) + " failed: " + answer);
        }
    }

    /// Step 3: SETSLOT NODE on the target, the source, then every other master.
    void finish_migration(int slot, int from, int to) const {
        const std::string s = std::to_string(slot);
        const std::string to_id = node_id(to);
        command(to, {"CLUSTER", "SETSLOT", s, "NODE", to_id});
        command(from, {"CLUSTER", "SETSLOT", s, "NODE", to_id});
        for (int port : masters(to)) {
            if (port != to && port != from) {
                command(port, {"CLUSTER", "SETSLOT", s, "NODE", to_id});
            }
        }
    }

    /// CLUSTER FAILOVER on `replica`; waits until it is a master and every running node agrees.
    void failover(int replica) {
        cli(replica, {"CLUSTER", "FAILOVER"});
        wait_until("replica " + std::to_string(replica) + " promoted", [&] {
            for (int port : ports_) {
                if (running(port)) {
                    const auto m = masters(port);
                    if (std::find(m.begin(), m.end(), replica) == m.end()) {
                        return false;
                    }
                }
            }
            return true;
        });
    }

    /// SIGKILLs the node on `port` (no shutdown, no last words to its replicas).
    void kill(int port) {
        auto it = pids_.find(port);
        if (it == pids_.end() || it->second <= 0) {
            return;
        }
        ::kill(it->second, SIGKILL);
        detail::reap(it->second, true);
        it->second = -1;
    }

    /// SIGSTOPs the node on `port`: a hung server. The kernel still completes connections to
    /// it and keeps those it has, but nothing is answered until resume(port).
    void pause(int port) { send_signal(port, SIGSTOP); }

    /// SIGCONTs the node on `port` after pause(port).
    void resume(int port) { send_signal(port, SIGCONT); }

    /// Waits until every running node reports cluster_state:ok and all slots served.
    void wait_healthy(std::chrono::milliseconds timeout = std::chrono::seconds(30)) const {
        wait_until(
            "cluster_state:ok on every node",
            [&] {
                for (int port : ports_) {
                    if (!running(port)) {
                        continue;
                    }
                    const std::string info = cli(port, {"CLUSTER", "INFO"});
                    if (info.find("cluster_state:ok") == std::string::npos ||
                        info.find("cluster_slots_ok:16384") == std::string::npos) {
                        return false;
                    }
                }
                return true;
            },
            timeout);
    }

    template <class Predicate>
    void wait_until(const std::string& what, Predicate done,
                    std::chrono::milliseconds timeout = std::chrono::seconds(30)) const {
        const auto deadline = detail::clock::now() + timeout;
        for (;;) {
            try {
                if (done()) {
                    return;
                }
            } catch (const std::runtime_error&) {
                // A node busy with a failover may refuse a probe; ask again.
            }
            if (detail::clock::now() >= deadline) {
                throw std::runtime_error("cluster: timed out waiting for " + what);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }

private:
    int any_running() const {
        for (int port : ports_) {
            if (running(port)) {
                return port;
            }
        }
        throw std::runtime_error("no cluster node is running");
    }

    // Ports p with p and p + 10000 free, below 22768, from a random start so that parallel
    // test processes rarely collide (a collision fails the bind and is retried).
    std::vector<int> pick_ports(int count) {
        std::mt19937 rng{std::random_device{}()};
        std::uniform_int_distribution<int> base_dist(12000, 22000);
        std::vector<int> out;
        int candidate = base_dist(rng);
        for (int tries = 0; static_cast<int>(out.size()) < count && tries < 5000; ++tries) {
            if (candidate >= 22768) {
                candidate = 12000;
            }
            if (detail::port_is_free(candidate) && detail::port_is_free(candidate + 10000)) {
                out.push_back(candidate);
            }
            ++candidate;
        }
        if (static_cast<int>(out.size()) < count) {
            throw std::runtime_error("cluster: not enough free ports below 22768");
        }
        return out;
    }

    void spawn_node(int port) {
        const std::string node_dir = dir_ + "/" + std::to_string(port);
        std::filesystem::create_directories(node_dir);
        const std::vector<std::string> args{detail::find_executable("redis-server"),
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
                                            node_dir,
                                            "--logfile",
                                            node_dir + "/log",
                                            "--cluster-enabled",
                                            "yes",
                                            "--cluster-config-file",
                                            node_dir + "/nodes.conf",
                                            "--cluster-node-timeout",
                                            "2000",
                                            "--repl-diskless-sync-delay",
                                            "0",
                                            "--hz",
                                            "100"};
        detail::unique_fd out(::open((node_dir + "/stdout").c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600));
        pids_[port] = detail::spawn(args, out.get(), out.get());
    }

    void start(int masters, int replicas) {
        const int count = masters * (1 + replicas);
        for (int attempt = 0;; ++attempt) {
            ports_ = pick_ports(count);
            for (int port : ports_) {
                spawn_node(port);
            }
            bool all_up = true;
            const auto deadline = detail::clock::now() + std::chrono::seconds(10);
            for (int port : ports_) {
                while (true) {
                    if (detail::reap(pids_[port], false)) {
                        pids_[port] = -1;
                        all_up = false;
                        break;
                    }
                    const auto probe =
                        probe_tcp("127.0.0.1", port, {"PING"}, std::chrono::milliseconds(500));
                    if (probe.line && *probe.line == "+PONG") {
                        break;
                    }
                    if (detail::clock::now() >= deadline) {
                        throw std::runtime_error("cluster node " + std::to_string(port) +
                                                 " did not answer PING");
                    }
                    std::this_thread::sleep_for(std::chrono::milliseconds(5));
                }
                if (!all_up) {
                    break;
                }
            }
            if (all_up) {
                break;
            }
            stop_all();  // a port was taken meanwhile: try others
            if (attempt == 3) {
                throw std::runtime_error("cluster: nodes kept failing to start");
            }
        }

        std::vector<std::string> create{detail::find_executable("redis-cli"), "--cluster",
                                        "create"};
        for (int port : ports_) {
            create.push_back("127.0.0.1:" + std::to_string(port));
        }
        create.insert(create.end(),
                      {"--cluster-replicas", std::to_string(replicas), "--cluster-yes"});
        const auto created = detail::run_capture(create, std::chrono::seconds(60));
        if (!WIFEXITED(created.status) || WEXITSTATUS(created.status) != 0) {
            throw std::runtime_error("redis-cli --cluster create failed: " + created.err +
                                     created.out);
        }
        wait_healthy();
        const int replica_count = masters * replicas;
        wait_until("every replica linked and known to every node", [&] {
            for (int port : ports_) {
                const auto seen = nodes(port);
                const auto replica_lines = std::count_if(seen.begin(), seen.end(),
                                                         [](const auto& n) { return !n.master; });
                if (replica_lines != replica_count) {
                    return false;
                }
                const std::string role = cli(port, {"INFO", "replication"});
                if (role.find("role:slave") != std::string::npos &&
                    role.find("master_link_status:up") == std::string::npos) {
                    return false;
                }
            }
            return true;
        });
    }

    void send_signal(int port, int number) const {
        const auto it = pids_.find(port);
        if (it != pids_.end() && it->second > 0) {
            ::kill(it->second, number);
        }
    }

    void stop_all() noexcept {
        for (auto& [port, pid] : pids_) {
            if (pid > 0) {
                ::kill(pid, SIGKILL);
            }
        }
        for (auto& [port, pid] : pids_) {
            if (pid > 0) {
                detail::reap(pid, true);
                pid = -1;
            }
        }
    }

    void remove_dir() noexcept {
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }

    pid_t owner_pid_;
    std::string dir_;
    std::vector<int> ports_;
    std::map<int, pid_t> pids_;
    mutable std::map<int, std::string> ids_;
    std::chrono::milliseconds bring_up_{};
};

}  // namespace redislock::test
