#pragma once

// redislock::test::run_fault_exclusion: mutual exclusion under network faults, for every lock
// kind, checked outside Redis.
//
// P forked processes x T threads take one (or a few) lock names through the public API for a
// bounded time. Each process reaches Redis through its own fault_proxy, and a controller thread
// in the parent breaks those paths at random (seeded): latency, stalls with the connection kept
// open, cut connections, and on request lost replies. So one holder can be partitioned while its
// rivals still reach the server, which is where a lock that reports its loss too late lets two
// holders in at once.
//
// Every hold is written to memory shared by all processes (MAP_SHARED) with CLOCK_MONOTONIC
// times, so the parent checks the result even if a child hangs or crashes:
//   * no two exclusive holds of one name overlap, and no write hold overlaps a read hold;
//   * every call that returned "acquired" returned a valid lock (remaining() > 0 right after);
//   * every process acquired the lock at least once;
//   * after the faults stop, the workers finish and the leases run out, Redis holds no key
//     (apart from fence counters, `name:fence` / `{name}:fence`, which never expire by design);
//   * no call failed with anything but a transient error (connection_error, timeout_error,
//     cancelled_error): e.g. a "would deadlock" from an object that believes it still holds;
//   * a hold whose remaining() reached zero (its local deadline, no renewal confirmed) heard
//     on_lost by then, give or take on_lost_slack for scheduling.
//
// When a hold ends matters as much as when it starts. A hold begins when lock() returned, and
// ends when the holder stops believing it holds: at the end of its work, or earlier when the
// loss is reported. Half of the threads trust on_lost alone (the hold ends when on_lost is
// called); the other half look at remaining() (owned() is remaining() > 0) every millisecond,
// and their hold ends at the first look that finds it zero, or at the end of the validity
// promised by the previous look, whichever is first (a late look is the test's fault, not the
// lock's). A rival found inside while a holder still believed it held is an overlap.
//
// The process plumbing (child_process, line_channel) and the overlap search (find_overlap) are
// those of support/exclusion.hpp.
//
// Forks: the children are forked before the parent starts any thread or opens any connection
// (the proxies start after the fork and their ports are sent to the children), so no child holds
// a copy of a proxied socket that would keep a cut connection open.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/exclusion.hpp"
#include "support/fault_proxy.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace redislock::test {

enum class lock_kind { mutex, recursive_mutex, shared_mutex };

inline std::string_view to_string(lock_kind kind) {
    switch (kind) {
        case lock_kind::mutex:
            return "mutex";
        case lock_kind::recursive_mutex:
            return "recursive_mutex";
        case lock_kind::shared_mutex:
            return "shared_mutex";
    }
    return "unknown";
}

struct fault_run_options {
    lock_kind kind = lock_kind::mutex;
    int processes = 3;
    int threads = 2;  ///< per process; even threads look at remaining(), odd ones trust on_lost
    int names = 2;    ///< lock names shared by all workers ("fault:0", "fault:1", ...)
    /// Faults are injected this long; then the paths are healed and the workers go on for
    /// quiet_tail before they stop.
    std::chrono::milliseconds fault_time{3000};
    std::chrono::milliseconds quiet_tail{1000};
    std::chrono::milliseconds lease{500};            ///< with the watchdog on
    std::chrono::milliseconds acquire_wait{500};     ///< try_lock_for per attempt
    std::chrono::milliseconds command_timeout{250};  ///< the hiredis adapter's, via the URI
    std::uint64_t seed = 1;
    /// Chance, per 25 ms tick, that the controller breaks one healthy path.
    int fault_percent = 20;
    /// Stalls last from 50 ms to this; longer than the lease so holders lose their locks.
    std::chrono::milliseconds longest_stall{1000};
    /// Holds: this share lasts [lease, 1.5 x lease] (kept only by the watchdog), this share
    /// [lease / 4, lease / 2], the rest 1-10 ms.
    int long_hold_percent = 10;
    int medium_hold_percent = 10;
    bool lost_replies = false;  ///< also drop server replies for short windows (ghost writes)
    /// How long after remaining() reached zero on_lost may come: the contract says at that
    /// deadline; this leaves room for scheduling the thread that reports it.
    std::chrono::milliseconds on_lost_slack{50};
    /// Besides the lease, how long Redis may keep a lock's keys after its last holder is gone: a
    /// waiter whose leaving the queue was lost to a fault keeps its place until the wait its last
    /// attempt was told (at most the lease) plus 2 s (queue_place::keep() in
    /// waiting/acquire_in_line.hpp).
    std::chrono::milliseconds longest_claim{2000};
    /// A child still running this long after the workers' stop time is killed and reported.
    std::chrono::milliseconds overrun_limit{20'000};
};

/// One hold, as recorded in shared memory. Times are CLOCK_MONOTONIC nanoseconds.
struct alignas(8) fault_hold {
    std::int32_t process = 0;
    std::int32_t thread = 0;
    std::int32_t name = 0;
    std::int32_t write = 1;           ///< 1: exclusive (or write) hold, 0: read hold
    std::int32_t trusts_on_lost = 0;  ///< the thread's style, see the header comment
    std::int32_t complete = 0;        ///< set last, with release order, once exit_ns is final
    std::int64_t enter_ns = 0;        ///< when lock() returned true
    std::int64_t exit_ns = 0;         ///< when the holder stopped believing it held
    std::int64_t remaining_ms = 0;    ///< remaining() right after lock() returned
    std::int64_t lost_ns = 0;  ///< when on_lost was called (in the hold, or up to on_lost_slack
                               ///< after remaining() reached zero); 0: not called
    std::int64_t seen_lost_ns = 0;    ///< first look that found remaining() zero; 0: none
    std::int64_t promise_end_ns = 0;  ///< last look's time + remaining(); 0: never looked
    /// From seen_lost_ns on, the longest the holding thread's 1 ms sleeps overslept: how late
    /// the machine was running this process's threads then (see deadline.hpp).
    std::int64_t stall_ns = 0;
};

/// Counters of one process, in shared memory.
struct alignas(8) fault_process_stats {
    std::int64_t attempts = 0;
    std::int64_t acquired = 0;
    std::int64_t contended = 0;          ///< try_lock_for returned false
    std::int64_t transient_errors = 0;   ///< connection_error, timeout_error, cancelled_error
    std::int64_t unexpected_errors = 0;  ///< anything else
    std::int64_t losses = 0;             ///< holds that saw on_lost or remaining() reach zero
    std::int64_t unlock_errors = 0;      ///< unlock(ec) with an error
    std::int64_t reentries = 0;          ///< recursive: successful re-entries
    std::int64_t holding = 0;            ///< threads inside a hold right now
};

struct fault_run_report {
    fault_run_options options;
    std::vector<fault_hold> holds;  ///< completed holds
    std::vector<fault_process_stats> processes;
    std::vector<std::string> violations;    ///< every broken promise; empty when all held
    std::vector<std::string> faults;        ///< the injected faults, in order
    std::vector<std::string> notes;         ///< what else happened (errors by kind, timings)
    std::int64_t max_on_lost_delay_ms = 0;  ///< on_lost after the promised validity, worst case
    std::int64_t expired_holds = 0;         ///< holds during which remaining() reached zero
    std::int64_t silent_expired_holds = 0;  ///< ... and on_lost had not come when they ended

    bool passed() const { return violations.empty(); }

    /// A summary for assertion messages.
    std::string describe() const {
        std::ostringstream out;
        out << to_string(options.kind) << ", seed " << options.seed << ": " << holds.size()
            << " holds, " << faults.size() << " faults, " << violations.size() << " violation(s)";
        for (std::size_t i = 0; i < std::min<std::size_t>(violations.size(), 12); ++i) {
            out << "\n  VIOLATION " << violations[i];
        }
        if (violations.size() > 12) {
            out << "\n  ... " << violations.size() - 12 << " more";
        }
        for (std::size_t p = 0; p < processes.size(); ++p) {
            const auto& s = processes[p];
            out << "\n  process " << p << ": attempts " << s.attempts << ", acquired " << s.acquired
                << ", contended " << s.contended << ", transient errors " << s.transient_errors
                << ", unexpected errors " << s.unexpected_errors << ", losses " << s.losses
                << ", unlock errors " << s.unlock_errors << ", re-entries " << s.reentries;
        }
        out << "\n  holds during which remaining() reached zero: " << expired_holds << ", of which "
            << silent_expired_holds << " ended without on_lost; on_lost later than the promised "
            << "validity by at most " << max_on_lost_delay_ms << " ms";
        for (const auto& note : notes) {
            out << "\n  " << note;
        }
        out << "\n  faults:";
        for (std::size_t i = 0; i < std::min<std::size_t>(faults.size(), 40); ++i) {
            out << "\n    " << faults[i];
        }
        if (faults.size() > 40) {
            out << "\n    ... " << faults.size() - 40 << " more";
        }
        return out.str();
    }
};

/// REDISLOCK_LONG_FAULTS=1 makes the fault time 30 s; REDISLOCK_FAULT_SEED=N replaces the seed;
/// REDISLOCK_FAULT_PERCENT=N the fault rate (0: a control run through healthy proxies);
/// REDISLOCK_FAULT_LOST_REPLIES=1 adds windows of lost replies to the faults.
inline fault_run_options with_environment(fault_run_options options) {
    if (const char* v = std::getenv("REDISLOCK_LONG_FAULTS");
        v != nullptr && std::string_view{v} == "1") {
        options.fault_time = std::chrono::seconds{30};
    }
    if (const char* v = std::getenv("REDISLOCK_FAULT_SEED"); v != nullptr && *v != '\0') {
        options.seed = std::stoull(v);
    }
    if (const char* v = std::getenv("REDISLOCK_FAULT_PERCENT"); v != nullptr && *v != '\0') {
        options.fault_percent = std::stoi(v);
    }
    if (const char* v = std::getenv("REDISLOCK_FAULT_LOST_REPLIES");
        v != nullptr && std::string_view{v} == "1") {
        options.lost_replies = true;
    }
    return options;
}

/// REDISLOCK_FAULT_VERBOSE=1 prints every report, also of runs that passed.
inline void print_if_verbose(const fault_run_report& report) {
    if (const char* v = std::getenv("REDISLOCK_FAULT_VERBOSE");
        v != nullptr && std::string_view{v} == "1") {
        std::printf("%s\n", report.describe().c_str());
    }
}

namespace detail {

// Memory shared by the parent and its forked children: a header, the per-process counters, then
// the hold records. Anonymous and MAP_SHARED, so children write where the parent reads.
class fault_shared_memory {
public:
    fault_shared_memory(int processes, std::size_t capacity)
        : processes_{static_cast<std::size_t>(processes)}, capacity_{capacity} {
        bytes_ = sizeof(header) + processes_ * sizeof(fault_process_stats) +
                 capacity_ * sizeof(fault_hold);
        base_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (base_ == MAP_FAILED) {
            throw sys_error("mmap");
        }
    }
    fault_shared_memory(const fault_shared_memory&) = delete;
    fault_shared_memory& operator=(const fault_shared_memory&) = delete;
    ~fault_shared_memory() { ::munmap(base_, bytes_); }

    fault_process_stats& stats(int process) {
        return reinterpret_cast<fault_process_stats*>(static_cast<char*>(base_) +
                                                      sizeof(header))[process];
    }

    /// A fresh record, or nullptr when the memory is full (counted as dropped).
    fault_hold* new_hold() {
        const std::uint64_t index = std::atomic_ref{head().next}.fetch_add(1);
        if (index >= capacity_) {
            return nullptr;
        }
        return &holds()[index];
    }

    std::uint64_t used() { return std::atomic_ref{head().next}.load(); }
    std::size_t capacity() const { return capacity_; }
    fault_hold* holds() {
        return reinterpret_cast<fault_hold*>(static_cast<char*>(base_) + sizeof(header) +
                                             processes_ * sizeof(fault_process_stats));
    }

private:
    struct alignas(8) header {
        std::uint64_t next;
    };
    header& head() { return *static_cast<header*>(base_); }

    std::size_t processes_;
    std::size_t capacity_;
    std::size_t bytes_ = 0;
    void* base_ = nullptr;
};

inline void add(std::int64_t& counter, std::int64_t n = 1) {
    std::atomic_ref{counter}.fetch_add(n, std::memory_order_relaxed);
}

// What one worker thread knows about its current hold, written by on_lost.
struct fault_loss_slot {
    std::atomic<std::int64_t> lost_ns{0};
};

// The operations the worker needs, for each lock kind, over its lock object.
template <class Lock>
struct fault_worker_lock {
    Lock lock;
    bool acquire(bool write, std::chrono::milliseconds wait) {
        if constexpr (requires { lock.try_lock_shared_for(wait); }) {
            return write ? lock.try_lock_for(wait) : lock.try_lock_shared_for(wait);
        } else {
            return lock.try_lock_for(wait);
        }
    }
    void release(bool write, std::error_code& ec) {
        if constexpr (requires { lock.unlock_shared(ec); }) {
            if (!write) {
                lock.unlock_shared(ec);
                return;
            }
        }
        lock.unlock(ec);
    }
};

struct fault_child_context {
    const fault_run_options* options;
    fault_shared_memory* memory;
    int process;
};

inline bool is_transient(const std::exception& e) {
    return dynamic_cast<const redislock::connection_error*>(&e) != nullptr ||
           dynamic_cast<const redislock::cancelled_error*>(&e) != nullptr;
}

// Holds for `length` (or until the loss is reported), filling in the record's end.
template <class Lock>
void fault_hold_for(fault_worker_lock<Lock>& lock, fault_hold& hold, fault_loss_slot& slot,
                    std::chrono::milliseconds length, std::chrono::milliseconds slack) {
    const std::int64_t planned_end = hold.enter_ns + length.count() * 1'000'000;
    std::int64_t now = monotonic_ns();
    for (int looks = 0; now < planned_end && looks < 1'000'000; ++looks) {
        if (const std::int64_t lost = slot.lost_ns.load(); lost != 0) {
            hold.lost_ns = lost;
            break;
        }
        // Both styles look, so the report can tell how late on_lost came; only the style that
        // relies on remaining() stops at what it sees.
        const auto left = lock.lock.remaining();
        if (left <= std::chrono::milliseconds::zero()) {
            if (hold.seen_lost_ns == 0) {
                hold.seen_lost_ns = now;
            }
            if (hold.trusts_on_lost == 0) {
                break;
            }
        } else {
            hold.promise_end_ns = std::max(hold.promise_end_ns, now + left.count() * 1'000'000);
        }
        const std::int64_t before = monotonic_ns();
        std::this_thread::sleep_for(std::chrono::milliseconds{1});
        now = monotonic_ns();
        if (hold.seen_lost_ns != 0) {
            hold.stall_ns = std::max(hold.stall_ns, now - before - 1'000'000);
        }
    }
    if (hold.lost_ns == 0) {
        hold.lost_ns = slot.lost_ns.load();
    }
    std::int64_t end = std::min(now, planned_end);
    if (hold.lost_ns != 0) {
        end = std::min(end, hold.lost_ns);
    }
    if (hold.trusts_on_lost == 0) {
        if (hold.seen_lost_ns != 0) {
            end = std::min(end, hold.seen_lost_ns);
        }
        if (hold.promise_end_ns != 0) {
            end = std::min(end, hold.promise_end_ns);
        }
    }
    hold.exit_ns = std::max(end, hold.enter_ns);

    // The hold is over; if the deadline passed without on_lost, give on_lost `slack` to come
    // (before the unlock, which would stop the lock from reporting anything), to tell a late
    // report from a missing one.
    if (hold.seen_lost_ns != 0 && hold.lost_ns == 0) {
        const std::int64_t wait_until = hold.seen_lost_ns + slack.count() * 1'000'000;
        for (int looks = 0;
             looks < 10'000 && slot.lost_ns.load() == 0 && monotonic_ns() < wait_until; ++looks) {
            const std::int64_t before = monotonic_ns();
            std::this_thread::sleep_for(std::chrono::milliseconds{1});
            hold.stall_ns = std::max(hold.stall_ns, monotonic_ns() - before - 1'000'000);
        }
        hold.lost_ns = slot.lost_ns.load();
    }
}

template <class Lock>
void fault_worker(const fault_child_context& ctx, int thread, fault_worker_lock<Lock>& lock,
                  fault_loss_slot& slot, std::int64_t stop_ns,
                  std::vector<std::string>& unexpected) {
    const fault_run_options& options = *ctx.options;
    fault_process_stats& stats = ctx.memory->stats(ctx.process);
    std::mt19937_64 rng{options.seed * 1'000'003 + static_cast<std::uint64_t>(ctx.process) * 101 +
                        static_cast<std::uint64_t>(thread)};
    const auto lease_ms = options.lease.count();
    const auto pick_length = [&] {
        const auto roll = rng() % 100;
        std::int64_t low = 1;
        std::int64_t high = 10;
        if (roll < static_cast<std::uint64_t>(options.long_hold_percent)) {
            low = lease_ms;
            high = lease_ms * 3 / 2;
        } else if (roll < static_cast<std::uint64_t>(options.long_hold_percent +
                                                     options.medium_hold_percent)) {
            low = lease_ms / 4;
            high = lease_ms / 2;
        }
        return std::chrono::milliseconds{
            low + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(high - low + 1))};
    };
    for (int round = 0; round < 1'000'000 && monotonic_ns() < stop_ns; ++round) {
        // A pause between holds, so a thread that just let go does not win every time against
        // waiters that back off: every process must get its turns.
        if (round > 0) {
            std::this_thread::sleep_for(
                std::chrono::milliseconds{1 + static_cast<int>(rng() % 10)});
        }
        const bool write = options.kind != lock_kind::shared_mutex || rng() % 10 < 3;
        slot.lost_ns.store(0);
        add(stats.attempts);
        bool acquired = false;
        try {
            acquired = lock.acquire(write, options.acquire_wait);
        } catch (const std::exception& e) {
            if (is_transient(e)) {
                add(stats.transient_errors);
            } else {
                add(stats.unexpected_errors);
                if (unexpected.size() < 5) {
                    unexpected.push_back(std::string{write ? "lock: " : "lock_shared: "} +
                                         e.what());
                }
                std::this_thread::sleep_for(std::chrono::milliseconds{5});
            }
            continue;
        }
        const std::int64_t returned = monotonic_ns();
        if (!acquired) {
            add(stats.contended);
            continue;
        }
        const auto left = lock.lock.remaining();
        add(stats.acquired);
        add(stats.holding);
        fault_hold* hold = ctx.memory->new_hold();
        fault_hold scratch;
        fault_hold& h = hold != nullptr ? *hold : scratch;
        h.process = ctx.process;
        h.thread = thread;
        h.name = (ctx.process + thread) % options.names;
        h.write = write ? 1 : 0;
        h.trusts_on_lost = thread % 2;
        h.enter_ns = returned;
        h.remaining_ms = left.count();

        int entries = 1;
        if constexpr (requires { lock.lock.depth(); }) {
            // Re-entries never wait; under faults they may fail, which is not a violation.
            const int extra = static_cast<int>(rng() % 3);
            for (int i = 0; i < extra; ++i) {
                try {
                    if (lock.lock.try_lock()) {
                        ++entries;
                        add(stats.reentries);
                    }
                } catch (const std::exception& e) {
                    if (is_transient(e)) {
                        add(stats.transient_errors);
                    } else {
                        add(stats.unexpected_errors);
                        if (unexpected.size() < 5) {
                            unexpected.push_back(std::string{"re-entry: "} + e.what());
                        }
                    }
                }
            }
        }

        fault_hold_for(lock, h, slot, pick_length(), options.on_lost_slack);
        if (h.lost_ns != 0 || h.seen_lost_ns != 0) {
            add(stats.losses);
        }
        std::atomic_ref{h.complete}.store(1, std::memory_order_release);
        add(stats.holding, -1);

        for (int i = 0; i < entries; ++i) {
            std::error_code ec;
            lock.release(write, ec);
            if (ec) {
                add(stats.unlock_errors);
            }
        }
    }
}

template <class Lock, class MakeLock>
int fault_child(const fault_child_context& ctx, line_channel& channel, MakeLock make_lock) {
    const auto go = channel.receive(std::chrono::seconds{30});
    if (!go) {
        return 3;
    }
    std::istringstream words{*go};
    std::string word;
    int port = 0;
    std::int64_t stop_ns = 0;
    words >> word >> port >> stop_ns;
    if (word != "go") {
        return 4;
    }
    const fault_run_options& options = *ctx.options;
    std::vector<fault_loss_slot> slots(static_cast<std::size_t>(options.threads));
    std::vector<std::vector<std::string>> unexpected(static_cast<std::size_t>(options.threads));
    {
        const std::string uri =
            "redis://127.0.0.1:" + std::to_string(port) +
            "?command_timeout=" + std::to_string(options.command_timeout.count()) +
            "&connect_timeout=" + std::to_string(options.command_timeout.count());
        // The first connection may meet a fault already: retry for a bounded time.
        std::unique_ptr<redislock::client> client;
        for (int attempt = 0; attempt < 100 && !client; ++attempt) {
            try {
                client = std::make_unique<redislock::client>(uri);
            } catch (const redislock::connection_error&) {
                std::this_thread::sleep_for(std::chrono::milliseconds{50});
            }
        }
        if (!client) {
            channel.send("error could not connect through the proxy");
            return 5;
        }
        std::vector<std::thread> workers;
        for (int t = 0; t < options.threads; ++t) {
            workers.emplace_back([&, t] {
                auto& slot = slots[static_cast<std::size_t>(t)];
                const std::string name =
                    "fault:" + std::to_string((ctx.process + t) % options.names);
                lock_options lock_opts{
                    .lease = options.lease, .watchdog = true, .on_lost = [&slot] {
                        std::int64_t expected = 0;
                        slot.lost_ns.compare_exchange_strong(expected, monotonic_ns());
                    }};
                try {
                    fault_worker_lock<Lock> lock{make_lock(*client, name, std::move(lock_opts))};
                    fault_worker(ctx, t, lock, slot, stop_ns,
                                 unexpected[static_cast<std::size_t>(t)]);
                } catch (const std::exception& e) {
                    unexpected[static_cast<std::size_t>(t)].push_back(
                        std::string{"worker ended: "} + e.what());
                }
            });
        }
        for (auto& worker : workers) {
            worker.join();
        }
    }
    for (const auto& list : unexpected) {
        for (const auto& text : list) {
            channel.send("error " + detail::one_line(text));
        }
    }
    return channel.send("done") ? 0 : 1;
}

// The fault schedule: each tick, heals the paths whose fault window ended and may break one
// healthy path. Bounded by `until` and by a tick count.
inline void fault_controller(const fault_run_options& options, fault_shared_memory& memory,
                             std::vector<std::unique_ptr<fault_proxy>>& proxies,
                             std::chrono::steady_clock::time_point until,
                             std::vector<std::string>& log) {
    using clock = std::chrono::steady_clock;
    std::mt19937_64 rng{options.seed};
    const auto start = clock::now();
    std::vector<clock::time_point> healthy_at(proxies.size(), start);
    const auto tick = std::chrono::milliseconds{25};
    const auto uniform = [&](std::int64_t low, std::int64_t high) {
        return low + static_cast<std::int64_t>(rng() % static_cast<std::uint64_t>(high - low + 1));
    };
    const auto at = [&] {
        return "+" +
               std::to_string(
                   std::chrono::duration_cast<std::chrono::milliseconds>(clock::now() - start)
                       .count()) +
               "ms";
    };
    for (int ticks = 0; ticks < 100'000 && clock::now() < until; ++ticks) {
        const auto now = clock::now();
        for (std::size_t p = 0; p < proxies.size(); ++p) {
            if (healthy_at[p] != clock::time_point{} && healthy_at[p] <= now) {
                proxies[p]->heal();
                healthy_at[p] = clock::time_point{};
            }
        }
        if (rng() % 100 < static_cast<std::uint64_t>(options.fault_percent)) {
            // Most faults hit a process that holds a lock right now, and then mostly stall it:
            // a holder cut off while its rivals still reach the server is the case that
            // matters most.
            std::size_t p = rng() % proxies.size();
            bool holder = false;
            if (rng() % 4 != 0) {
                for (std::size_t i = 0; i < proxies.size() && !holder; ++i) {
                    const std::size_t candidate = (p + i) % proxies.size();
                    if (std::atomic_ref{memory.stats(static_cast<int>(candidate)).holding}.load() >
                            0 &&
                        healthy_at[candidate] == clock::time_point{}) {
                        p = candidate;
                        holder = true;
                    }
                }
            }
            if (healthy_at[p] == clock::time_point{}) {
                // Rolls 40-74 stall; a holder gets a stall two times in three.
                const auto roll = holder && rng() % 3 != 0 ? 40 + rng() % 35 : rng() % 100;
                const std::string whose = holder ? " (holding)" : "";
                const std::string who = at() + " process " + std::to_string(p) + whose + ": ";
                if (options.lost_replies && roll >= 85) {
                    const auto window = std::chrono::milliseconds{uniform(30, 300)};
                    proxies[p]->drop_replies(true);
                    healthy_at[p] = now + window;
                    log.push_back(who + "lost replies for " + std::to_string(window.count()) +
                                  " ms");
                } else if (roll < 40) {
                    const auto one_way = std::chrono::milliseconds{uniform(5, 80)};
                    const auto window = std::chrono::milliseconds{uniform(100, 800)};
                    proxies[p]->delay(one_way);
                    healthy_at[p] = now + window;
                    log.push_back(who + "delay " + std::to_string(one_way.count()) +
                                  " ms each way for " + std::to_string(window.count()) + " ms");
                } else if (roll < 75) {
                    const auto window =
                        std::chrono::milliseconds{uniform(50, options.longest_stall.count())};
                    proxies[p]->stall();
                    healthy_at[p] = now + window;
                    log.push_back(who + "stall for " + std::to_string(window.count()) + " ms");
                } else {
                    proxies[p]->cut();
                    healthy_at[p] = clock::time_point{};
                    log.push_back(who + "cut");
                }
            }
        }
        std::this_thread::sleep_for(tick);
    }
    for (auto& proxy : proxies) {
        proxy->heal();
    }
}

inline std::string describe_hold(const fault_hold& h, std::int64_t origin) {
    const auto ms = [&](std::int64_t ns) {
        std::ostringstream out;
        out.setf(std::ios::fixed);
        out.precision(1);
        out << static_cast<double>(ns - origin) / 1e6;
        return out.str();
    };
    std::string text = "process " + std::to_string(h.process) + " thread " +
                       std::to_string(h.thread) + (h.write != 0 ? " write" : " read") +
                       (h.trusts_on_lost != 0 ? " (trusts on_lost)" : " (looks at remaining())") +
                       " [" + ms(h.enter_ns) + " ms, " + ms(h.exit_ns) + " ms], remaining() " +
                       std::to_string(h.remaining_ms) + " ms at entry";
    if (h.lost_ns != 0) {
        text += ", on_lost at " + ms(h.lost_ns) + " ms";
    }
    if (h.seen_lost_ns != 0) {
        text += ", remaining() zero at " + ms(h.seen_lost_ns) + " ms";
    }
    return text;
}

// Exclusive holds of one name must not overlap each other or any read hold. Read holds are
// merged into blocks first (they may overlap each other), so find_overlap sees each read block
// once. Returns the offending pair, described.
inline std::optional<std::string> find_exclusion_violation(const std::vector<fault_hold>& holds,
                                                           int name, std::int64_t origin) {
    std::vector<hold_interval> intervals;
    std::vector<hold_interval> reads;
    for (const auto& h : holds) {
        if (h.name != name) {
            continue;
        }
        (h.write != 0 ? intervals : reads).push_back({h.enter_ns, h.exit_ns});
    }
    std::sort(reads.begin(), reads.end(), [](const hold_interval& a, const hold_interval& b) {
        return a.enter_ns < b.enter_ns;
    });
    std::vector<hold_interval> blocks;
    for (const auto& r : reads) {
        if (!blocks.empty() && r.enter_ns < blocks.back().exit_ns) {
            blocks.back().exit_ns = std::max(blocks.back().exit_ns, r.exit_ns);
        } else {
            blocks.push_back(r);
        }
    }
    intervals.insert(intervals.end(), blocks.begin(), blocks.end());
    const auto pair = find_overlap(intervals);
    if (!pair) {
        return std::nullopt;
    }
    // Name the holds behind the two intervals (a read block by the read hold inside it that
    // overlaps the other interval).
    const auto explain = [&](const hold_interval& iv, const hold_interval& other) {
        for (const auto& h : holds) {
            if (h.name == name && h.write != 0 && h.enter_ns == iv.enter_ns &&
                h.exit_ns == iv.exit_ns) {
                return describe_hold(h, origin);
            }
        }
        for (const auto& h : holds) {
            if (h.name == name && h.write == 0 && h.enter_ns >= iv.enter_ns &&
                h.exit_ns <= iv.exit_ns && h.enter_ns < other.exit_ns &&
                other.enter_ns < h.exit_ns) {
                return describe_hold(h, origin);
            }
        }
        return std::string{"(unknown hold)"};
    };
    const std::int64_t overlap_ns =
        std::min(pair->first.exit_ns, pair->second.exit_ns) - pair->second.enter_ns;
    // How many intervals start inside an earlier one: the first overlap is described, the
    // count tells whether it was a one-off.
    std::sort(
        intervals.begin(), intervals.end(),
        [](const hold_interval& a, const hold_interval& b) { return a.enter_ns < b.enter_ns; });
    std::size_t overlaps = 0;
    std::int64_t latest_exit = 0;
    for (const auto& iv : intervals) {
        overlaps += iv.enter_ns < latest_exit ? 1 : 0;
        latest_exit = std::max(latest_exit, iv.exit_ns);
    }
    return "two holders inside \"fault:" + std::to_string(name) + "\" at once for " +
           std::to_string(overlap_ns / 1'000'000) + "." +
           std::to_string(overlap_ns / 100'000 % 10) +
           " ms: " + explain(pair->first, pair->second) + " / " +
           explain(pair->second, pair->first) + " (" + std::to_string(overlaps) +
           " hold(s) of this name began inside another)";
}

}  // namespace detail

/// Runs the fault schedule of `options` against `server` with the lock kind it names, and
/// returns what broke. Call it before this process starts any thread or opens any connection
/// (it forks). Takes about fault_time + quiet_tail + lease + 1 s.
inline fault_run_report run_fault_exclusion(redis_server& server, fault_run_options options) {
    using clock = std::chrono::steady_clock;
    fault_run_report report;
    report.options = options;
    detail::fault_shared_memory memory{options.processes, std::size_t{1} << 17};
    const std::int64_t origin = monotonic_ns();

    std::vector<std::unique_ptr<child_process>> children;
    for (int p = 0; p < options.processes; ++p) {
        const detail::fault_child_context ctx{&options, &memory, p};
        children.push_back(std::make_unique<child_process>([ctx, &options](line_channel& channel) {
            switch (options.kind) {
                case lock_kind::mutex:
                    return detail::fault_child<redislock::mutex>(
                        ctx, channel,
                        [](redislock::client& c, const std::string& n, lock_options o) {
                            return c.mutex(n, std::move(o));
                        });
                case lock_kind::recursive_mutex:
                    return detail::fault_child<redislock::recursive_mutex>(
                        ctx, channel,
                        [](redislock::client& c, const std::string& n, lock_options o) {
                            return c.recursive_mutex(n, std::move(o));
                        });
                case lock_kind::shared_mutex:
                    return detail::fault_child<redislock::shared_mutex>(
                        ctx, channel,
                        [](redislock::client& c, const std::string& n, lock_options o) {
                            return c.shared_mutex(n, std::move(o));
                        });
            }
            return 2;
        }));
    }

    // Only now threads and connections: the proxies, then the controller.
    std::vector<std::unique_ptr<fault_proxy>> proxies;
    for (int p = 0; p < options.processes; ++p) {
        proxies.push_back(std::make_unique<fault_proxy>(server));
    }
    const auto start = clock::now();
    const auto faults_until = start + options.fault_time;
    const auto stop_at = faults_until + options.quiet_tail;
    const std::int64_t stop_ns =
        monotonic_ns() +
        std::chrono::duration_cast<std::chrono::nanoseconds>(stop_at - start).count();
    for (int p = 0; p < options.processes; ++p) {
        children[static_cast<std::size_t>(p)]->channel().send(
            "go " + std::to_string(proxies[static_cast<std::size_t>(p)]->port()) + " " +
            std::to_string(stop_ns));
    }
    std::thread controller{
        [&] { detail::fault_controller(options, memory, proxies, faults_until, report.faults); }};
    controller.join();

    const auto collect_until = stop_at + options.overrun_limit;
    for (int p = 0; p < options.processes; ++p) {
        auto& child = *children[static_cast<std::size_t>(p)];
        const std::string who = "process " + std::to_string(p);
        bool done = false;
        for (int lines = 0; lines < 10'000 && !done; ++lines) {
            const auto left = std::max(
                std::chrono::duration_cast<std::chrono::milliseconds>(collect_until - clock::now()),
                std::chrono::milliseconds::zero());
            const auto line = child.channel().receive(left);
            if (!line) {
                break;
            }
            if (*line == "done") {
                done = true;
            } else if (line->rfind("error ", 0) == 0) {
                report.violations.push_back(who + ": unexpected error: " + line->substr(6));
            } else {
                report.violations.push_back(who + ": " + *line);
            }
        }
        if (!done) {
            report.violations.push_back(who + " did not finish within " +
                                        std::to_string(options.overrun_limit.count()) +
                                        " ms of the stop time (killed)");
        }
        const auto code = child.wait(std::chrono::seconds{5});
        if (code != 0) {
            report.violations.push_back(who + ": exit code " +
                                        (code ? std::to_string(*code) : std::string{"(signal)"}));
        }
    }
    const auto workers_done = clock::now();
    report.notes.push_back(
        "workers finished " +
        std::to_string(
            std::chrono::duration_cast<std::chrono::milliseconds>(workers_done - stop_at).count()) +
        " ms after their stop time");
    proxies.clear();

    // Collect the holds; an incomplete one belongs to a process that died mid-hold.
    const std::size_t used = std::min<std::size_t>(memory.used(), memory.capacity());
    if (memory.used() > memory.capacity()) {
        report.notes.push_back(std::to_string(memory.used() - memory.capacity()) +
                               " holds not recorded (shared memory full)");
    }
    for (std::size_t i = 0; i < used; ++i) {
        const fault_hold& h = memory.holds()[i];
        if (std::atomic_ref{const_cast<fault_hold&>(h).complete}.load(std::memory_order_acquire) ==
            0) {
            report.violations.push_back("a hold never ended: " + detail::describe_hold(h, origin));
            continue;
        }
        report.holds.push_back(h);
    }
    for (int p = 0; p < options.processes; ++p) {
        report.processes.push_back(memory.stats(p));
    }

    // Every acquisition valid when lock() returned.
    int invalid = 0;
    int untold = 0;
    for (const auto& h : report.holds) {
        if (h.remaining_ms <= 0 && invalid++ < 5) {
            report.violations.push_back(
                "acquired with remaining() = " + std::to_string(h.remaining_ms) +
                " ms: " + detail::describe_hold(h, origin));
        }
        if (h.seen_lost_ns != 0) {
            ++report.expired_holds;
            if (h.lost_ns == 0) {
                ++report.silent_expired_holds;
            }
            // Loss must be told by the local deadline, whatever a round trip is doing; a machine
            // that ran this process's threads late by as much (the holder's own sleeps overslept)
            // excuses that much lateness, as deadline.hpp does for timed calls.
            const std::int64_t slack_ns = options.on_lost_slack.count() * 1'000'000;
            const std::int64_t late_ns = h.lost_ns == 0 ? -1 : h.lost_ns - h.seen_lost_ns;
            const std::int64_t waited_ns =
                h.lost_ns != 0 ? late_ns : std::max(h.exit_ns - h.seen_lost_ns, slack_ns);
            const bool machine_late = h.stall_ns > 0 && waited_ns <= slack_ns + h.stall_ns;
            if (!machine_late && ((late_ns < 0 && h.lost_ns == 0) || late_ns > slack_ns)) {
                if (untold++ < 5) {
                    report.violations.push_back(
                        "remaining() reached zero but on_lost " +
                        (h.lost_ns == 0
                             ? std::string{"did not come within "} +
                                   std::to_string(options.on_lost_slack.count()) + " ms"
                             : "came " + std::to_string(late_ns / 1'000'000) + " ms later") +
                        ": " + detail::describe_hold(h, origin));
                }
            }
        }
        if (h.lost_ns != 0 && h.promise_end_ns != 0) {
            report.max_on_lost_delay_ms =
                std::max(report.max_on_lost_delay_ms, (h.lost_ns - h.promise_end_ns) / 1'000'000);
        }
    }
    if (untold > 5) {
        report.violations.push_back(std::to_string(untold - 5) +
                                    " more holds whose loss on_lost did not tell in time");
    }
    if (invalid > 5) {
        report.violations.push_back(std::to_string(invalid - 5) +
                                    " more acquisitions with remaining() <= 0");
    }
    // Mutual exclusion, name by name.
    for (int n = 0; n < options.names; ++n) {
        if (auto violation = detail::find_exclusion_violation(report.holds, n, origin)) {
            report.violations.push_back(*violation);
        }
    }
    // Progress.
    for (int p = 0; p < options.processes; ++p) {
        if (report.processes[static_cast<std::size_t>(p)].acquired == 0) {
            report.violations.push_back("process " + std::to_string(p) +
                                        " never acquired the lock");
        }
    }

    // Nothing left behind once every lease and queue claim has run out.
    std::this_thread::sleep_for(options.lease + options.longest_claim +
                                std::chrono::milliseconds{300});
    try {
        // SCAN (redis-cli --scan) deletes the expired keys it meets, so DBSIZE afterwards
        // counts only keys that are really left.
        const std::string keys = server.cli({"--scan"});
        std::istringstream lines{keys};
        std::vector<std::string> left;
        std::size_t fences = 0;
        for (std::string key; std::getline(lines, key);) {
            const bool fence = key.size() > 6 && key.compare(key.size() - 6, 6, ":fence") == 0;
            if (fence) {
                ++fences;
            } else if (!key.empty()) {
                left.push_back(key);
            }
        }
        for (const auto& key : left) {
            report.violations.push_back("key left in Redis after every lease ran out: " + key +
                                        " (type " + server.cli({"TYPE", key}) + ", pttl " +
                                        server.cli({"PTTL", key}) + ")");
        }
        const std::string dbsize = server.cli({"DBSIZE"});
        if (left.empty() && dbsize != std::to_string(fences)) {
            report.violations.push_back("DBSIZE is " + dbsize + " at the end, with " +
                                        std::to_string(fences) + " fence counter(s)");
        }
    } catch (const std::exception& e) {
        report.violations.push_back(std::string{"checking Redis at the end: "} + e.what());
    }
    return report;
}

}  // namespace redislock::test
