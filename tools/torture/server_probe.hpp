// redislock-torture: how quickly the servers themselves answered. A thread of the run opens a
// connection to each data node every 50 ms and times a PING; answers slower than 10 ms are kept.
// A server that a loaded machine did not schedule for a while makes a client's timeouts and
// quorum errors its due: the checks excuse an error (never a late return) when the server was
// that slow then.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "support/redis_server.hpp"
#include "torture/journal.hpp"

namespace redislock::torture {

/// One slow answer: to which port, when the PING went out, how long it took (ns).
struct slow_answer {
    int port = 0;
    std::int64_t at = 0;
    std::int64_t took = 0;
};

class server_probe {
public:
    explicit server_probe(std::vector<int> ports) : ports_{std::move(ports)} {
        if (!ports_.empty()) {
            thread_ = std::thread{[this] { run(); }};
        }
    }
    server_probe(const server_probe&) = delete;
    server_probe& operator=(const server_probe&) = delete;
    ~server_probe() { stop(); }

    void stop() {
        done_.store(true);
        if (thread_.joinable()) {
            thread_.join();
        }
    }

    std::vector<slow_answer> slow() const {
        std::lock_guard guard{mutex_};
        return slow_;
    }

private:
    void run() {
        while (!done_.load()) {
            for (const int port : ports_) {
                const std::int64_t at = monotonic_ns();
                const auto reply =
                    test::probe_tcp("127.0.0.1", port, {"PING"}, std::chrono::milliseconds{2000});
                const std::int64_t took = monotonic_ns() - at;
                if (took > 10'000'000 || !reply.line) {
                    std::lock_guard guard{mutex_};
                    slow_.push_back({port, at, took});
                }
            }
            std::this_thread::sleep_for(std::chrono::milliseconds{50});
        }
    }

    std::vector<int> ports_;
    std::atomic<bool> done_{false};
    mutable std::mutex mutex_;
    std::vector<slow_answer> slow_;
    std::thread thread_;
};

}  // namespace redislock::torture
