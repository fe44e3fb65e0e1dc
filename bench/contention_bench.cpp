// Contention: several processes (and threads) take one name in turn, each acquisition doing one
// command inside (INCR), for redislock::mutex and for raw hiredis polling, in the same run.
//
// One private redis-server on TCP loopback, pinned to the first CPU; the clients run on the
// others (on this 2-core machine: the second). Each variant runs for --seconds (default 2) per
// shape, 4 processes x 1 thread and 2 processes x 4 threads:
//   redislock        redislock::mutex lock() + INCR + unlock(), one lock object per thread
//                    (or the kind --kind names)
//   raw_busy_poll    SET NX PX until it succeeds, no pause; INCR; compare-and-delete (EVALSHA)
//   raw_sleep_poll   the same with a 1 ms sleep after each failed SET
// Printed per variant and shape:
//   acq/s            acquisitions per second, all workers together
//   wait p50/p99/max from calling lock to holding it
//   cmds/acq         commands the clients sent per acquisition (counted in the clients; the
//                    library's subscriber commands included), the work's INCR included
//   srv/acq          calls in INFO commandstats per acquisition: also counts the commands that
//                    scripts run inside the server
//   rewin            share of acquisitions won by the worker that held the lock just before
//   overlap          critical sections found overlapping (checked in shared memory): must be 0
//
// Usage: contention_bench [--seconds=N] [--wait-spin-us=N] [--kind=K]
//   --wait-spin-us   the library's client_options::wait_spin (default: the library's default)
//   --kind           the library's lock: mutex (default), recursive_mutex, shared_mutex (its
//                    write lock), or semaphore (a counting_semaphore of 2 permits: up to 2
//                    inside at once, so overlap counts a third); the raw variants stay the same

#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr std::string_view lock_name = "contended";
constexpr std::size_t max_workers = 8;
constexpr std::size_t max_samples = 1 << 18;  // per worker

redislock::client_options library_options;
std::string_view library_kind = "mutex";

// Results of one worker, written by it into shared memory.
struct worker_result {
    std::uint64_t acquisitions;
    std::uint64_t rewins;
    std::uint64_t commands;
    std::uint64_t samples;
    std::int64_t wait_ns[max_samples];
};

struct shared_page {
    std::atomic<int> inside;
    std::atomic<std::uint64_t> overlaps;
    std::atomic<int> last_holder;
    std::atomic<std::int64_t> stop_at_ns;
    worker_result workers[max_workers];
};

std::int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               clock_type::now().time_since_epoch())
        .count();
}

// A hiredis connection that counts the commands sent through it.
class counting_connection {
public:
    counting_connection(std::string_view uri, std::atomic<std::uint64_t>* counter)
        : inner_{uri}, counter_{counter} {}

    redislock::reply execute(redislock::command argv) {
        counter_->fetch_add(1, std::memory_order_relaxed);
        return inner_.execute(argv);
    }
    redislock::reply execute(redislock::command argv, const redislock::call_context& how) {
        counter_->fetch_add(1, std::memory_order_relaxed);
        return inner_.execute(argv, how);
    }
    std::vector<redislock::reply> execute_pipeline(std::span<const redislock::command> commands) {
        counter_->fetch_add(commands.size(), std::memory_order_relaxed);
        return inner_.execute_pipeline(commands);
    }
    std::vector<redislock::reply> execute_pipeline(std::span<const redislock::command> commands,
                                                   std::span<const redislock::call_context> hows) {
        counter_->fetch_add(commands.size(), std::memory_order_relaxed);
        return inner_.execute_pipeline(commands, hows);
    }
    const redislock::endpoint& config() const { return inner_.config(); }
    std::unique_ptr<redislock::subscriber_link> open_subscriber(std::string_view channel) {
        return std::make_unique<counting_link>(inner_.open_subscriber(channel), counter_);
    }

private:
    // A subscriber link that counts the commands sent on it (SSUBSCRIBE, SUNSUBSCRIBE).
    class counting_link final : public redislock::subscriber_link {
    public:
        counting_link(std::unique_ptr<redislock::subscriber_link> inner,
                      std::atomic<std::uint64_t>* counter)
            : inner_{std::move(inner)}, counter_{counter} {}
        int fd() const noexcept override { return inner_->fd(); }
        void send(redislock::command argv) override {
            counter_->fetch_add(1, std::memory_order_relaxed);
            inner_->send(argv);
        }
        void read(std::vector<redislock::reply>& out) override { inner_->read(out); }
        bool buffered() const noexcept override { return inner_->buffered(); }
        bool reads_without_blocking() const noexcept override {
            return inner_->reads_without_blocking();
        }

    private:
        std::unique_ptr<redislock::subscriber_link> inner_;
        std::atomic<std::uint64_t>* counter_;
    };

    redislock::hiredis_connection inner_;
    std::atomic<std::uint64_t>* counter_;
};

// Inside the lock: notes re-wins and overlaps, then runs the work's one command.
template <class Work>
void critical_section(shared_page& page, int me, worker_result& out, Work&& work) {
    const int allowed = library_kind == "semaphore" ? 2 : 1;
    if (page.inside.fetch_add(1) >= allowed) {
        page.overlaps.fetch_add(1);
    }
    if (page.last_holder.exchange(me) == me) {
        ++out.rewins;
    }
    work();
    page.inside.fetch_sub(1);
}

void record_wait(worker_result& out, std::int64_t waited) {
    if (out.samples < max_samples) {
        out.wait_ns[out.samples++] = waited;
    }
    ++out.acquisitions;
}

using worker_fn = void (*)(const std::string& uri, shared_page& page, int me,
                           std::atomic<std::uint64_t>& commands);

void library_worker(const std::string& uri, shared_page& page, int me,
                    std::atomic<std::uint64_t>& commands) {
    // One client per process: the threads share its notifier and local gate.
    static redislock::basic_client<counting_connection>* client = nullptr;
    static std::once_flag once;
    std::call_once(once, [&] {
        client = new redislock::basic_client<counting_connection>{
            counting_connection{uri, &commands}, library_options};
    });
    const auto loop = [&](auto m) {
        worker_result& out = page.workers[me];
        const std::array<std::string_view, 2> incr{"INCR", "counter"};
        while (now_ns() < page.stop_at_ns.load()) {
            // A wait counts from the first call until the lock is held, across calls that time
            // out, so a starved worker shows in the longest wait. Like the raw workers, it goes
            // on past the end of the run until it holds (the others leave, so it soon does).
            const auto start = now_ns();
            const auto give_up_at = page.stop_at_ns.load() + 10'000'000'000;
            bool held = false;
            while (!(held = m.try_lock_for(1s)) && now_ns() < give_up_at) {
            }
            if (!held) {
                break;
            }
            record_wait(out, now_ns() - start);
            critical_section(page, me, out, [&] { (void)client->connection().execute(incr); });
            m.unlock();
        }
    };
    const redislock::lock_options options{.lease = 10s};
    if (library_kind == "recursive_mutex") {
        loop(client->recursive_mutex(lock_name, options));
    } else if (library_kind == "shared_mutex") {
        loop(client->shared_mutex(lock_name, options));
    } else if (library_kind == "semaphore") {
        loop(client->semaphore(lock_name, {.permits = 2, .lease = 10s}));
    } else {
        loop(client->mutex(lock_name, options));
    }
}

template <bool Sleep>
void raw_worker(const std::string& uri, shared_page& page, int me,
                std::atomic<std::uint64_t>& commands) {
    const auto colon = uri.rfind(':');
    std::unique_ptr<redisContext, decltype(&redisFree)> ctx{
        redisConnect("127.0.0.1", std::atoi(uri.c_str() + colon + 1)), &redisFree};
    const auto run = [&](std::initializer_list<std::string_view> args) {
        std::vector<const char*> argv;
        std::vector<std::size_t> lengths;
        for (std::string_view a : args) {
            argv.push_back(a.data());
            lengths.push_back(a.size());
        }
        commands.fetch_add(1, std::memory_order_relaxed);
        auto* r = static_cast<redisReply*>(redisCommandArgv(
            ctx.get(), static_cast<int>(argv.size()), argv.data(), lengths.data()));
        const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        return ok;
    };
    const std::string token = "token-" + std::to_string(me);
    const std::string_view release =
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end "
        "return 0";
    worker_result& out = page.workers[me];
    while (now_ns() < page.stop_at_ns.load()) {
        const auto start = now_ns();
        while (!run({"SET", lock_name, token, "NX", "PX", "10000"})) {
            if (Sleep) {
                std::this_thread::sleep_for(1ms);
            }
        }
        record_wait(out, now_ns() - start);
        critical_section(page, me, out, [&] { (void)run({"INCR", "counter"}); });
        (void)run({"EVAL", release, "1", lock_name, token});
    }
}

void pin_to_cpus(pid_t pid, int first, int last) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu = first; cpu <= last; ++cpu) {
        CPU_SET(cpu, &set);
    }
    (void)sched_setaffinity(pid, sizeof set, &set);
}

std::uint64_t server_calls(redislock::test::redis_server& srv) {
    const std::string stats = srv.cli({"INFO", "commandstats"});
    std::uint64_t total = 0;
    for (auto at = stats.find("calls="); at != std::string::npos;
         at = stats.find("calls=", at + 1)) {
        if (stats.compare(at - 1, 1, "_") == 0) {
            continue;  // rejected_calls=, failed_calls=
        }
        total += std::strtoull(stats.c_str() + at + 6, nullptr, 10);
    }
    return total;
}

void run_variant(const char* variant, worker_fn fn, int processes, int threads,
                 redislock::test::redis_server& srv, shared_page& page, double seconds,
                 int client_cpu_first, int client_cpu_last) {
    srv.flushall();
    std::memset(static_cast<void*>(&page), 0, sizeof page);
    page.last_holder = -1;
    (void)srv.cli({"CONFIG", "RESETSTAT"});
    const std::int64_t started = now_ns() + 300'000'000;  // time for every process to start
    page.stop_at_ns = started + static_cast<std::int64_t>(seconds * 1e9);
    std::vector<pid_t> children;
    for (int p = 0; p < processes; ++p) {
        const pid_t pid = ::fork();
        if (pid == 0) {
            pin_to_cpus(0, client_cpu_first, client_cpu_last);
            std::atomic<std::uint64_t> commands{0};
            while (now_ns() < started) {
                std::this_thread::sleep_for(1ms);
            }
            std::vector<std::thread> pool;
            for (int t = 0; t < threads; ++t) {
                pool.emplace_back(fn, srv.uri(), std::ref(page), p * threads + t,
                                  std::ref(commands));
            }
            for (auto& t : pool) {
                t.join();
            }
            page.workers[p * threads].commands = commands.load();
            std::_Exit(0);
        }
        children.push_back(pid);
    }
    for (pid_t pid : children) {
        int status = 0;
        ::waitpid(pid, &status, 0);
    }
    std::uint64_t acquisitions = 0, rewins = 0, commands = 0;
    std::vector<std::int64_t> waits;
    for (int w = 0; w < processes * threads; ++w) {
        const worker_result& r = page.workers[w];
        acquisitions += r.acquisitions;
        rewins += r.rewins;
        commands += r.commands;
        waits.insert(waits.end(), r.wait_ns, r.wait_ns + r.samples);
    }
    std::sort(waits.begin(), waits.end());
    const auto pct = [&](double q) {
        if (waits.empty()) {
            return 0.0;
        }
        return static_cast<double>(waits[static_cast<std::size_t>(q * (waits.size() - 1))]) / 1e6;
    };
    const double n = std::max<double>(1, static_cast<double>(acquisitions));
    std::printf("%-15s %dx%d %10.0f %9.3f %9.3f %9.2f %8.2f %8.2f %6.1f%% %7" PRIu64 "\n", variant,
                processes, threads, static_cast<double>(acquisitions) / seconds, pct(0.5),
                pct(0.99), waits.empty() ? 0.0 : static_cast<double>(waits.back()) / 1e6,
                static_cast<double>(commands) / n, static_cast<double>(server_calls(srv)) / n,
                100.0 * static_cast<double>(rewins) / n, page.overlaps.load());
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    double seconds = 2;
    for (int i = 1; i < argc; ++i) {
        if (std::strncmp(argv[i], "--seconds=", 10) == 0) {
            seconds = std::atof(argv[i] + 10);
        } else if (std::strncmp(argv[i], "--wait-spin-us=", 15) == 0) {
            library_options.wait_spin = std::chrono::microseconds{std::atol(argv[i] + 15)};
        } else if (std::strncmp(argv[i], "--kind=", 7) == 0 &&
                   (std::string_view{argv[i] + 7} == "mutex" ||
                    std::string_view{argv[i] + 7} == "recursive_mutex" ||
                    std::string_view{argv[i] + 7} == "shared_mutex" ||
                    std::string_view{argv[i] + 7} == "semaphore")) {
            library_kind = argv[i] + 7;
        } else {
            std::fprintf(stderr,
                         "usage: %s [--seconds=N] [--wait-spin-us=N] "
                         "[--kind=mutex|recursive_mutex|shared_mutex|semaphore]\n",
                         argv[0]);
            return 2;
        }
    }
    if (seconds <= 0 || seconds > 60) {
        std::fprintf(stderr, "--seconds must be in (0, 60]\n");
        return 2;
    }
    void* mem = ::mmap(nullptr, sizeof(shared_page), PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
        std::perror("mmap");
        return 1;
    }
    auto& page = *static_cast<shared_page*>(mem);
    try {
        redislock::test::redis_server srv;
        const int cpus = static_cast<int>(std::thread::hardware_concurrency());
        int client_first = 0;
        if (cpus >= 2) {
            pin_to_cpus(srv.pid(), 0, 0);
            client_first = 1;
        }
        const int client_last = std::max(0, cpus - 1);
        std::printf("%-15s %-3s %10s %9s %9s %9s %8s %8s %7s %7s\n", "variant", "shape", "acq/s",
                    "p50_ms", "p99_ms", "max_ms", "cmds/acq", "srv/acq", "rewin", "overlap");
        const std::array<std::pair<int, int>, 2> shapes{{{4, 1}, {2, 4}}};
        for (const auto& [processes, threads] : shapes) {
            run_variant("redislock", library_worker, processes, threads, srv, page, seconds,
                        client_first, client_last);
            run_variant("raw_busy_poll", raw_worker<false>, processes, threads, srv, page, seconds,
                        client_first, client_last);
            run_variant("raw_sleep_poll", raw_worker<true>, processes, threads, srv, page, seconds,
                        client_first, client_last);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "contention_bench: %s\n", e.what());
        return 1;
    }
    return 0;
}
