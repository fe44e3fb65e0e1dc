#pragma once

// A Sentinel topology for one test: 1 master + 2 replicas + 3 sentinels (quorum 2,
// down-after-milliseconds 1000 unless given, failover-timeout 3000), all on loopback. The sentinels
// start only once both replicas are linked (otherwise discovery may wait for the sentinels' 10 s
// INFO period), each with its own writable configuration file, as `redis-server FILE --sentinel`.
//
// Helpers drive failovers (SENTINEL FAILOVER, kill -9 of the master), re-point a demoted node
// with REPLICAOF as the sentinels would after their 10 s INFO period, and wait until every
// sentinel names the same master. Everything goes through redis-cli, never the library.
//
// With tls_files, every node and sentinel also listens for TLS, replication and the sentinels'
// own links use it, and the sentinels name the nodes by their TLS ports: uri() is then a
// rediss-sentinel:// URI. The plain ports stay open for the fixture's probes and redis-cli.
//
// Not thread-safe. Create it on a thread that outlives it (see redis_server).

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "support/redis_server.hpp"

namespace redislock::test {

class redis_sentinel {
public:
    static constexpr const char* master_name = "mymaster";

    struct tls_files {
        std::string cert;
        std::string key;
        std::string ca;
    };

    /// `down_after_ms`: how long the sentinels wait for a master's PING reply before they take
    /// it for down (a loaded machine can keep a sentinel from hearing a healthy one for 1 s).
    explicit redis_sentinel(std::optional<tls_files> tls = std::nullopt, int down_after_ms = 1000)
        : owner_pid_{::getpid()},
          dir_{detail::make_temp_dir()},
          tls_{std::move(tls)},
          down_after_ms_{down_after_ms} {
        try {
            add_node({});
            const std::string master_port = std::to_string(public_port(0));
            for (int i = 0; i < 2; ++i) {
                add_node({"--replicaof", "127.0.0.1", master_port});
            }
            wait_for("both replicas to be linked", std::chrono::seconds{20},
                     [&] { return online_replicas(*nodes_[0]) == 2; });
            for (int i = 0; i < 3; ++i) {
                start_sentinel(i);
            }
            wait_for("the sentinels to know each other and both replicas", std::chrono::seconds{30},
                     [&] { return sentinels_fully_aware(); });
        } catch (...) {
            shutdown();
            throw;
        }
    }

    ~redis_sentinel() { shutdown(); }
    redis_sentinel(const redis_sentinel&) = delete;
    redis_sentinel& operator=(const redis_sentinel&) = delete;

    /// redis-sentinel://127.0.0.1:S1,127.0.0.1:S2,127.0.0.1:S3#mymaster (+ ?query); with TLS
    /// rediss-sentinel:// to the TLS ports, trusting the fixture's CA.
    std::string uri(std::string query = {}) const {
        std::string text = tls_ ? "rediss-sentinel://" : "redis-sentinel://";
        for (std::size_t i = 0; i < sentinels_.size(); ++i) {
            text += (i == 0 ? "" : ",") + std::string{"127.0.0.1:"} +
                    std::to_string(tls_ ? sentinels_[i].tls_port : sentinels_[i].port);
        }
        if (tls_) {
            query = "tls_ca_file=" + tls_->ca + (query.empty() ? "" : "&" + query);
        }
        return text + (query.empty() ? "" : "?" + query) + "#" + master_name;
    }

    std::vector<int> sentinel_ports() const {
        std::vector<int> ports;
        for (const auto& s : sentinels_) {
            ports.push_back(s.port);
        }
        return ports;
    }

    /// The data node listening on `port` (its plain port, or its TLS port).
    redis_server& node(int port) {
        for (std::size_t i = 0; i < nodes_.size(); ++i) {
            if (nodes_[i]->port() == port || public_port(i) == port) {
                return *nodes_[i];
            }
        }
        throw std::logic_error{"no data node on port " + std::to_string(port)};
    }

    /// What each sentinel answers to GET-MASTER-ADDR-BY-NAME (nullopt: no answer).
    std::vector<std::optional<int>> master_ports_seen() const {
        std::vector<std::optional<int>> seen;
        for (const auto& s : sentinels_) {
            try {
                std::istringstream lines{
                    cli(s.port, {"SENTINEL", "GET-MASTER-ADDR-BY-NAME", master_name})};
                std::string host;
                std::string port;
                if (std::getline(lines, host) && std::getline(lines, port) && !port.empty()) {
                    seen.push_back(std::stoi(port));
                    continue;
                }
            } catch (const std::exception&) {
            }
            seen.push_back(std::nullopt);
        }
        return seen;
    }

    /// Waits until every sentinel names the same master, one that `accept` takes; returns it.
    int wait_agreed_master(const std::function<bool(int)>& accept,
                           std::chrono::milliseconds timeout = std::chrono::seconds{30}) const {
        int agreed = 0;
        wait_for("the sentinels to agree on a master", timeout, [&] {
            const auto seen = master_ports_seen();
            if (seen.empty() || !seen[0] || !accept(*seen[0])) {
                return false;
            }
            for (const auto& port : seen) {
                if (port != seen[0]) {
                    return false;
                }
            }
            agreed = *seen[0];
            return true;
        });
        return agreed;
    }

    int master_port() const {
        return wait_agreed_master([](int) { return true; });
    }

    /// SENTINEL FAILOVER, retried while a previous one is still in progress.
    void failover() const {
        wait_for("SENTINEL FAILOVER to be accepted", std::chrono::seconds{30}, [&] {
            try {
                return cli(sentinels_[0].port, {"SENTINEL", "FAILOVER", master_name}) == "OK";
            } catch (const std::exception&) {
                return false;
            }
        });
    }

    /// REPLICAOF 127.0.0.1 `master` on the node at `port`, and waits until it is linked.
    /// Ports as the sentinels name them.
    void repoint(int port, int master) {
        node(port).cli({"REPLICAOF", "127.0.0.1", std::to_string(master)});
        wait_for("the re-pointed node to link to its master", std::chrono::seconds{20}, [&] {
            return node(port).cli({"INFO", "replication"}).find("master_link_status:up") !=
                   std::string::npos;
        });
    }

    /// kill -9 of the data node at `port`.
    void kill_node(int port) { node(port).stop(); }

    /// SIGSTOP of sentinel number `index` (in uri() order): it hangs, its port still accepting
    /// connections. While one hangs, master_ports_seen() waits 10 s for it and names no master.
    void pause_sentinel(std::size_t index) { signal_sentinel(index, SIGSTOP, 'T'); }

    /// SIGCONT of sentinel number `index`.
    void resume_sentinel(std::size_t index) { signal_sentinel(index, SIGCONT, 0); }

    /// Runs `check` every 20 ms until it returns true; throws after `timeout`.
    template <class Check>
    static void wait_for(const std::string& what, std::chrono::milliseconds timeout,
                         Check&& check) {
        const auto deadline = detail::clock::now() + timeout;
        while (!check()) {
            if (detail::clock::now() >= deadline) {
                throw std::runtime_error{"timed out waiting for " + what};
            }
            std::this_thread::sleep_for(std::chrono::milliseconds{20});
        }
    }

    /// One redis-cli command against the server (data node or sentinel) on `port`.
    static std::string cli(int port, const std::vector<std::string>& args) {
        std::vector<std::string> argv{detail::find_executable("redis-cli"), "-h", "127.0.0.1", "-p",
                                      std::to_string(port)};
        argv.insert(argv.end(), args.begin(), args.end());
        auto result = detail::run_capture(argv, std::chrono::seconds{10});
        if (!WIFEXITED(result.status) || WEXITSTATUS(result.status) != 0) {
            throw std::runtime_error{"redis-cli failed: " + result.err + result.out};
        }
        while (!result.out.empty() && result.out.back() == '\n') {
            result.out.pop_back();
        }
        return result.out;
    }

private:
    struct sentinel_process {
        int port = 0;
        int tls_port = 0;
        pid_t pid = -1;
    };

    void add_node(std::vector<std::string> extra) {
        extra.insert(extra.end(), {"--repl-diskless-sync-delay", "0"});
        int tls_port = 0;
        if (tls_) {
            tls_port = detail::pick_free_port();
            extra.insert(extra.end(),
                         {"--tls-port", std::to_string(tls_port), "--tls-cert-file", tls_->cert,
                          "--tls-key-file", tls_->key, "--tls-ca-cert-file", tls_->ca,
                          "--tls-auth-clients", "no", "--tls-replication", "yes"});
        }
        nodes_.push_back(
            std::make_unique<redis_server>(redis_server::options{.extra_args = std::move(extra)}));
        tls_ports_.push_back(tls_port);
    }

    // The port the sentinels and the clients use for node `i`.
    int public_port(std::size_t i) const { return tls_ ? tls_ports_[i] : nodes_[i]->port(); }

    static int online_replicas(redis_server& master) {
        const std::string info = master.cli({"INFO", "replication"});
        int online = 0;
        for (std::size_t pos = 0; (pos = info.find("state=online", pos)) != std::string::npos;
             ++pos) {
            ++online;
        }
        return online;
    }

    void start_sentinel(int index) {
        sentinel_process s;
        s.port = detail::pick_free_port();
        s.tls_port = tls_ ? detail::pick_free_port() : 0;
        const std::string name = "sentinel-" + std::to_string(index);
        const std::string conf = dir_ + "/" + name + ".conf";
        std::ofstream{conf} << "port " << s.port << "\nbind 127.0.0.1\ndaemonize no\n"
                            << "dir " << dir_ << "\nlogfile " << dir_ << "/" << name << ".log\n"
                            << "sentinel monitor " << master_name << " 127.0.0.1 " << public_port(0)
                            << " 2\n"
                            << "sentinel down-after-milliseconds " << master_name << " "
                            << down_after_ms_ << "\n"
                            << "sentinel failover-timeout " << master_name << " 3000\n"
                            << "sentinel parallel-syncs " << master_name << " 1\n";
        if (tls_) {
            std::ofstream{conf, std::ios::app} << "tls-port " << s.tls_port << "\ntls-cert-file "
                                               << tls_->cert << "\ntls-key-file " << tls_->key
                                               << "\ntls-ca-cert-file " << tls_->ca
                                               << "\ntls-auth-clients no\ntls-replication yes\n";
        }
        detail::unique_fd out{::open((dir_ + "/" + name + ".stdout").c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)};
        s.pid = detail::spawn({detail::find_executable("redis-server"), conf, "--sentinel"},
                              out.get(), out.get());
        sentinels_.push_back(s);
        wait_for(name + " to answer PING", std::chrono::seconds{10}, [&] {
            const auto r = probe_tcp("127.0.0.1", s.port, {"PING"}, std::chrono::milliseconds{500});
            return r.line && *r.line == "+PONG";
        });
    }

    // Sends `sig` and waits until the process state is `state` (0: anything but stopped).
    void signal_sentinel(std::size_t index, int sig, char state) {
        const pid_t pid = sentinels_.at(index).pid;
        if (::kill(pid, sig) != 0) {
            throw detail::sys_error("kill");
        }
        wait_for("the sentinel to take the signal", std::chrono::seconds{2}, [&] {
            const char now = detail::process_state(pid);
            return state == 0 ? now != 'T' : now == state;
        });
    }

    bool sentinels_fully_aware() const {
        for (const auto& s : sentinels_) {
            std::istringstream lines{cli(s.port, {"SENTINEL", "MASTER", master_name})};
            std::string key;
            std::string value;
            int others = -1;
            int replicas = -1;
            while (std::getline(lines, key) && std::getline(lines, value)) {
                if (key == "num-other-sentinels") {
                    others = std::stoi(value);
                } else if (key == "num-slaves") {
                    replicas = std::stoi(value);
                }
            }
            if (others != 2 || replicas != 2) {
                return false;
            }
        }
        return true;
    }

    void shutdown() noexcept {
        if (::getpid() != owner_pid_) {
            return;
        }
        for (auto& s : sentinels_) {
            if (s.pid > 0) {
                ::kill(s.pid, SIGKILL);
                detail::reap(s.pid, true);
                s.pid = -1;
            }
        }
        nodes_.clear();
        std::error_code ec;
        std::filesystem::remove_all(dir_, ec);
    }

    pid_t owner_pid_;
    std::string dir_;
    std::optional<tls_files> tls_;
    int down_after_ms_;
    std::vector<std::unique_ptr<redis_server>> nodes_;
    std::vector<int> tls_ports_;  // per node; 0 without TLS
    std::vector<sentinel_process> sentinels_;
};

}  // namespace redislock::test
