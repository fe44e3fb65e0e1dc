// Several processes increment one counter in Redis: first without a lock, then under one
// redislock::mutex.
//
// Each worker process reads the counter with GET and writes it back plus one with SET: two
// commands, not atomic, so two workers inside at once lose an update. The first round runs them
// bare and counts the increments lost to that race; the second runs the same workers under the
// lock "demo:counter-lock", the only thing that keeps the total exact there. The parent shows
// live progress, then compares the counter with the number of increments made.
//
// Usage: demo [redis://127.0.0.1:6379] [workers (4)] [increments per worker (5000)]
// Exit status: 0 when the locked total is exact, 1 on lost updates under the lock or a failed
// worker, 2 on bad usage. Updates lost without the lock are what the first round shows.

#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

namespace {

constexpr std::string_view counter_key = "demo:counter";
constexpr std::string_view lock_name = "demo:counter-lock";
constexpr int max_workers = 16;
constexpr auto run_limit = 60s;

// Lives in memory shared with the workers, so the parent can show their progress live.
struct progress {
    std::array<std::atomic<std::uint64_t>, max_workers> done{};
};
static_assert(std::atomic<std::uint64_t>::is_always_lock_free,
              "counters shared between processes must be lock-free");

struct mapping_deleter {
    void operator()(void* memory) const noexcept { ::munmap(memory, sizeof(progress)); }
};

std::int64_t parse_count(std::string_view text) {
    std::int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    return ec == std::errc{} && end == text.data() + text.size() ? value : -1;
}

std::int64_t read_counter(redislock::client& client) {
    const std::array<std::string_view, 2> get{"GET", counter_key};
    const redislock::reply r = client.connection().execute(get);
    r.throw_if_error();
    return r.is_nil() ? 0 : parse_count(r.text());
}

// One GET then one SET of value+1: the read-modify-write that loses updates when two run at once.
// Returns false when the counter holds something that is not a number.
bool increment(redislock::client& client) {
    const std::int64_t value = read_counter(client);
    if (value < 0) {
        return false;
    }
    const std::string next = std::to_string(value + 1);
    const std::array<std::string_view, 3> set{"SET", counter_key, next};
    client.connection().execute(set).throw_if_error();
    return true;
}

int run_worker(const std::string& uri, int index, std::int64_t increments, bool locked,
               progress& shared) {
    // A child makes its own client: connections are not shared across fork().
    redislock::client client{uri};
    // Short backoff: the holder keeps the lock for a few round trips only.
    auto lock = client.mutex(lock_name, {.lease = 5s, .backoff_max = 4ms});
    for (std::int64_t i = 0; i < increments; ++i) {
        std::unique_lock guard{lock, std::defer_lock};
        if (locked && !guard.try_lock_for(10s)) {
            std::cerr << "\nworker " << index + 1 << ": no turn at the lock within 10 s\n";
            return 1;
        }
        if (!increment(client)) {
            std::cerr << "\nworker " << index + 1 << ": the counter is not a number\n";
            return 1;
        }
        shared.done[static_cast<std::size_t>(index)].fetch_add(1, std::memory_order_relaxed);
    }
    return 0;
}

void show_progress(const progress& shared, int workers, std::int64_t expected, double rate,
                   bool live) {
    std::string line = live ? "\r" : "";
    std::uint64_t total = 0;
    for (int i = 0; i < workers; ++i) {
        const auto done = shared.done[static_cast<std::size_t>(i)].load(std::memory_order_relaxed);
        total += done;
        char part[48];
        std::snprintf(part, sizeof part, "w%d %llu  ", i + 1,
                      static_cast<unsigned long long>(done));
        line += part;
    }
    char tail[96];
    std::snprintf(tail, sizeof tail, "| total %llu/%lld | %6.0f increments/s ",
                  static_cast<unsigned long long>(total), static_cast<long long>(expected), rate);
    line += tail;
    std::cout << line << (live ? "" : "\n") << std::flush;
}

std::uint64_t total_done(const progress& shared, int workers) {
    std::uint64_t total = 0;
    for (int i = 0; i < workers; ++i) {
        total += shared.done[static_cast<std::size_t>(i)].load(std::memory_order_relaxed);
    }
    return total;
}

// What one round ended with.
struct round_result {
    std::int64_t expected = 0;
    std::int64_t actual = 0;
    bool workers_ok = false;
};

round_result run_round(const std::string& uri, int workers, std::int64_t increments, bool locked) {
    {
        redislock::client client{uri};
        const std::array<std::string_view, 3> reset{"SET", counter_key, "0"};
        client.connection().execute(reset).throw_if_error();
    }

    void* memory = ::mmap(nullptr, sizeof(progress), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        std::perror("mmap");
        return {};
    }
    auto* shared = new (memory) progress{};
    // Unmapped however the round ends.
    const std::unique_ptr<void, mapping_deleter> mapping{memory};

    const std::int64_t expected = workers * increments;
    std::cout << workers << " processes x " << increments << " increments of " << counter_key
              << " (GET, then SET value+1) "
              << (locked ? "under " + std::string{lock_name} : std::string{"without a lock"})
              << '\n';
    // Flushed before fork(), or each child would print the parent's buffered text again.
    std::cout.flush();
    std::vector<pid_t> children;
    for (int i = 0; i < workers; ++i) {
        const pid_t pid = ::fork();
        if (pid < 0) {
            std::perror("fork");
            for (pid_t child : children) {
                ::kill(child, SIGKILL);
                ::waitpid(child, nullptr, 0);
            }
            return {};
        }
        if (pid == 0) {
            int status = 1;
            try {
                status = run_worker(uri, i, increments, locked, *shared);
            } catch (const std::exception& e) {
                std::cerr << "\nworker " << i + 1 << ": " << e.what() << '\n';
            }
            std::cout.flush();
            std::cerr.flush();
            ::_exit(status);
        }
        children.push_back(pid);
    }

    const bool live = ::isatty(STDOUT_FILENO) == 1;
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + run_limit;
    auto last_tick = start;
    auto last_print = start;
    std::uint64_t last_total = 0;
    double rate = 0;
    bool workers_ok = true;
    std::size_t running = children.size();
    while (running > 0) {
        for (pid_t& child : children) {
            int status = 0;
            if (child > 0 && ::waitpid(child, &status, WNOHANG) == child) {
                workers_ok = workers_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
                child = -1;
                --running;
            }
        }
        const auto now = std::chrono::steady_clock::now();
        if (now >= deadline) {
            std::cerr << "\nworkers still running after " << run_limit.count() << " s; stopping\n";
            for (pid_t child : children) {
                if (child > 0) {
                    ::kill(child, SIGKILL);
                    ::waitpid(child, nullptr, 0);
                }
            }
            return {};
        }
        // The rate over the last second, or since the start until a second has passed.
        const std::uint64_t total = total_done(*shared, workers);
        const double since_tick = std::chrono::duration<double>(now - last_tick).count();
        if (since_tick >= 1.0) {
            rate = static_cast<double>(total - last_total) / since_tick;
            last_total = total;
            last_tick = now;
        } else if (last_tick == start && since_tick > 0) {
            rate = static_cast<double>(total) / since_tick;
        }
        if (live || now - last_print >= 1s) {
            show_progress(*shared, workers, expected, rate, live);
            last_print = now;
        }
        std::this_thread::sleep_for(50ms);
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::uint64_t done = total_done(*shared, workers);
    show_progress(*shared, workers, expected, seconds > 0 ? static_cast<double>(done) / seconds : 0,
                  live);
    std::cout << (live ? "\n" : "");

    redislock::client client{uri};
    const std::int64_t actual = read_counter(client);
    std::printf("%.1f s, %.0f increments/s on average\n", seconds,
                seconds > 0 ? static_cast<double>(done) / seconds : 0);
    if (!workers_ok) {
        std::printf("a worker failed\n");
    }
    return {expected, actual, workers_ok};
}

int run(const std::string& uri, int workers, std::int64_t increments) {
    std::cout << "1. Without a lock\n";
    const round_result bare = run_round(uri, workers, increments, false);
    if (!bare.workers_ok) {
        return 1;
    }
    if (bare.actual < bare.expected) {
        std::printf("expected %lld, actual %lld: %lld increments LOST to the race\n\n",
                    static_cast<long long>(bare.expected), static_cast<long long>(bare.actual),
                    static_cast<long long>(bare.expected - bare.actual));
    } else {
        std::printf(
            "expected %lld, actual %lld: no increment lost this time (the race depends "
            "on timing; try more workers)\n\n",
            static_cast<long long>(bare.expected), static_cast<long long>(bare.actual));
    }

    std::cout << "2. Under redislock::mutex\n";
    const round_result locked = run_round(uri, workers, increments, true);
    std::printf("expected %lld, actual %lld: %s\n", static_cast<long long>(locked.expected),
                static_cast<long long>(locked.actual),
                locked.actual == locked.expected ? "exact, no increment lost" : "LOST UPDATES");
    return locked.actual == locked.expected && locked.workers_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    const std::string uri = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    const std::int64_t workers = argc > 2 ? parse_count(argv[2]) : 4;
    const std::int64_t increments = argc > 3 ? parse_count(argv[3]) : 5000;
    if (workers < 1 || workers > max_workers || increments < 0 || increments > 10'000'000) {
        std::cerr << "usage: demo [uri] [workers 1.." << max_workers
                  << "] [increments per worker]\n";
        return 2;
    }
    try {
        return run(uri, static_cast<int>(workers), increments);
    } catch (const std::exception& e) {
        std::cerr << "demo: " << e.what() << '\n';
        return 1;
    }
}
