// Turns a client's lock events into counters and a wait-time histogram, the way a service would
// feed them to its metrics library: workers contend for one lock and one lock outlives its
// lease; then the counters are printed.
//
// Usage: metrics [redis://127.0.0.1:6379]

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

// Counters and histograms fed by the event hook. Events come from several threads (callers, the
// watchdog, the loss timer), so everything is atomic; record() takes no lock and never blocks.
class lock_metrics {
public:
    void record(const redislock::lock_event& e) noexcept {
        counts_[static_cast<std::size_t>(e.type)].fetch_add(1, std::memory_order_relaxed);
        switch (e.type) {
            case redislock::event_type::acquired:
                waits_[bucket(e.wait)].fetch_add(1, std::memory_order_relaxed);
                wait_total_us_.fetch_add(e.wait.count(), std::memory_order_relaxed);
                attempts_.fetch_add(e.attempts, std::memory_order_relaxed);
                break;
            case redislock::event_type::released:
                hold_total_us_.fetch_add(e.held.count(), std::memory_order_relaxed);
                break;
            case redislock::event_type::lost:
                losses_[static_cast<std::size_t>(e.reason)].fetch_add(1, std::memory_order_relaxed);
                break;
            default:
                break;
        }
    }

    void print(std::ostream& out) const {
        out << "events:\n";
        for (std::size_t i = 0; i < counts_.size(); ++i) {
            out << "  " << std::left << std::setw(21)
                << redislock::to_string(static_cast<redislock::event_type>(i)) << std::right
                << std::setw(6) << counts_[i].load() << '\n';
        }
        const auto acquired =
            counts_[static_cast<std::size_t>(redislock::event_type::acquired)].load();
        const auto released =
            counts_[static_cast<std::size_t>(redislock::event_type::released)].load();
        if (acquired > 0) {
            out << "mean wait " << wait_total_us_.load() / acquired << " us, mean attempts "
                << std::fixed << std::setprecision(2)
                << static_cast<double>(attempts_.load()) / static_cast<double>(acquired) << '\n';
        }
        if (released > 0) {
            out << "mean hold " << hold_total_us_.load() / released << " us\n";
        }
        out << "wait histogram (acquisitions per bucket):\n";
        for (std::size_t i = 0; i < waits_.size(); ++i) {
            const std::string label = i < bounds_ms.size()
                                          ? "< " + std::to_string(bounds_ms[i]) + " ms"
                                          : ">= " + std::to_string(bounds_ms.back()) + " ms";
            const auto n = waits_[i].load();
            out << "  " << std::left << std::setw(12) << label << std::right << std::setw(6) << n
                << (n > 0 ? " " + std::string(n, '#') : std::string{}) << '\n';
        }
        out << "losses by reason:\n";
        for (std::size_t i = 0; i < losses_.size(); ++i) {
            out << "  " << std::left << std::setw(21)
                << redislock::to_string(static_cast<redislock::loss_reason>(i)) << std::right
                << std::setw(6) << losses_[i].load() << '\n';
        }
    }

private:
    static constexpr std::array<std::int64_t, 6> bounds_ms{1, 5, 10, 50, 100, 500};

    static std::size_t bucket(std::chrono::microseconds wait) {
        std::size_t i = 0;
        while (i < bounds_ms.size() && wait >= std::chrono::milliseconds{bounds_ms[i]}) {
            ++i;
        }
        return i;
    }

    static constexpr std::size_t event_types =
        static_cast<std::size_t>(redislock::event_type::permits_differ) + 1;
    static constexpr std::size_t loss_reasons =
        static_cast<std::size_t>(redislock::loss_reason::client_shutdown) + 1;

    std::array<std::atomic<std::uint64_t>, event_types> counts_{};
    std::array<std::atomic<std::uint64_t>, loss_reasons> losses_{};
    std::array<std::atomic<std::uint64_t>, bounds_ms.size() + 1> waits_{};
    std::atomic<std::int64_t> wait_total_us_{0};
    std::atomic<std::int64_t> hold_total_us_{0};
    std::atomic<std::uint64_t> attempts_{0};
};

int main(int argc, char** argv) {
    const std::string uri = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    try {
        lock_metrics metrics;  // outlives the client and its locks, which report to it
        redislock::client client{
            uri, {.on_event = [&metrics](const redislock::lock_event& e) { metrics.record(e); }}};

        // Four workers take turns on one lock, holding it a few milliseconds each time.
        std::vector<std::thread> workers;
        for (int w = 0; w < 4; ++w) {
            workers.emplace_back([&client, w] {
                auto m = client.mutex("example:metrics", {.lease = 2s});
                std::minstd_rand random{static_cast<std::minstd_rand::result_type>(w + 1)};
                for (int round = 0; round < 10; ++round) {
                    std::unique_lock guard{m};
                    std::this_thread::sleep_for(std::chrono::milliseconds{2 + random() % 10});
                }
            });
        }
        for (auto& worker : workers) {
            worker.join();
        }

        // A lock held past its lease without the watchdog: lost, expired.
        auto careless = client.mutex("example:metrics:careless", {.lease = 200ms});
        careless.lock();
        std::this_thread::sleep_for(300ms);
        careless.unlock();

        metrics.print(std::cout);
        return 0;
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
