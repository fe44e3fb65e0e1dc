// redislock-torture: what the workers saw, kept outside Redis in memory shared by every process
// of the run (one anonymous shared mapping made before the first fork). Each worker process
// appends fixed-size records to a log of its own (its forked children to the same one); a
// record counts once its `ready` flag is set, so one cut short by kill -9 is never read. Beside
// the logs, each worker thread publishes what it is doing now (the episode, the name it waits
// for, the lock it holds and when it last saw it owned), which the fault injector reads to pick
// a waiting process to kill and the checkers read to close the holds of a killed one.
//
// Times are CLOCK_MONOTONIC nanoseconds: one clock for every process of the machine.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "support/test_util.hpp"

namespace redislock::torture {

using test::monotonic_ns;

inline constexpr int max_processes = 16;
inline constexpr int max_threads = 16;
inline constexpr int max_names = 64;

enum class record_type : std::uint8_t { call = 1, hold, late, note };

/// What a call record is about.
enum class call_op : std::uint8_t { acquire = 1, reenter, unlock, extend, verify, fork_child };

enum class outcome : std::uint8_t {
    acquired = 1,  ///< acquire: true
    refused,       ///< acquire: false
    threw,         ///< any: an exception (error says which)
    done,          ///< unlock / extend / verify: returned (value says what)
    hung,          ///< still running when the run ended; its process was killed
};

enum class error_class : std::uint8_t {
    none = 0,
    connection,
    timeout,
    cancelled,
    unavailable,
    server,
    replication,
    quorum,
    invalid_argument,
    system,
    other,
};

inline std::string_view to_string(error_class e) {
    switch (e) {
        case error_class::none:
            return "none";
        case error_class::connection:
            return "connection_error";
        case error_class::timeout:
            return "timeout_error";
        case error_class::cancelled:
            return "cancelled_error";
        case error_class::unavailable:
            return "unavailable_error";
        case error_class::server:
            return "server_error";
        case error_class::replication:
            return "replication_error";
        case error_class::quorum:
            return "quorum_error";
        case error_class::invalid_argument:
            return "invalid_argument";
        case error_class::system:
            return "std::system_error";
        case error_class::other:
            return "exception";
    }
    return "?";
}

/// How a hold ended.
enum class hold_end : std::uint8_t {
    released = 1,  ///< let go by the holder (unlock, unlock(ec), destruction)
    lost,          ///< found lost (owned() false, lost_token, on_lost) before letting go
    killed,        ///< its process was killed (closed by the checker)
    unfinished,    ///< the run ended while it was held (closed by the checker)
};

enum record_flag : std::uint8_t {
    flag_watchdog = 1,
    flag_fencing = 2,
    flag_fresh_client = 4,
    flag_fork_child = 8,
    flag_shared = 16,
    flag_explicit_owner = 32,
    flag_inner = 64,        ///< a re-entry's own release, inside an outer hold
    flag_after_loss = 128,  ///< a release after a release of the same hold said lock_lost
};

/// One line of a worker's log. The meaning of t0..t4 depends on the type:
///   call: t1 start, t2 end, t3 deadline (0: none), t4 stop requested (0: none)
///   hold: t0 the acquiring call's start, t1 acquired (that call returned), t2 last seen owned
///         (the time owned() was asked, and answered true), t3 let go (unlock called) or the
///         loss found, t4 free (unlock returned)
///   late: t1 when the process's scheduler probe meant to wake, t2 how late (ns)
struct record {
    std::atomic<std::uint32_t> ready{0};
    record_type type{};
    std::uint8_t op = 0;      ///< call_op; hold: hold_end
    std::uint8_t result = 0;  ///< outcome; hold: errc of the release (0 ok)
    std::uint8_t error = 0;   ///< error_class
    std::uint16_t name = 0;
    std::uint8_t process = 0;
    std::uint8_t thread = 0;
    std::uint8_t call = 0;   ///< call_kind
    std::uint8_t flags = 0;  ///< record_flag
    std::uint8_t min_replicas = 0;
    std::uint8_t object = 0;
    std::uint32_t actor = 0;  ///< who: one worker thread incarnation or forked child
    std::uint32_t episode = 0;
    std::int64_t t0 = 0, t1 = 0, t2 = 0, t3 = 0, t4 = 0;
    std::int64_t value = 0;  ///< hold: fencing token; unlock: errc; extend/verify: result
    std::int32_t lease_ms = 0;
    std::int32_t timeout_ms = 0;    ///< call: the try_lock_for timeout
    std::int32_t remaining_ms = 0;  ///< hold: remaining() at the last owned check; call made
                                    ///< while holding: remaining() just before it
    std::int32_t client = 0;        ///< index of the process's client (its path)
    char text[360] = {};
};
static_assert(sizeof(record) <= 448);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(std::atomic<std::int64_t>::is_always_lock_free);

/// What one worker thread does now.
struct thread_now {
    std::atomic<int> episode{-1};
    std::atomic<int> waiting_name{-1};  ///< an acquire call in flight
    std::atomic<std::int64_t> waiting_since{0};
    std::atomic<int> waiting_lease{0};
    std::atomic<int> hold_name{-1};  ///< the outermost hold, if any
    std::atomic<int> hold_flags{0};
    std::atomic<std::int64_t> hold_acquired{0};
    std::atomic<std::int64_t> hold_last_owned{0};
    std::atomic<std::int64_t> hold_fence{0};
    std::atomic<int> hold_lease{0};
    std::atomic<std::uint32_t> hold_actor{0};
    std::atomic<int> hold_object{0};
    std::atomic<int> hold_episode{0};
    std::atomic<int> hold_min_replicas{0};
};

struct process_now {
    std::atomic<int> pid{0};
    std::atomic<int> generation{0};
    std::atomic<int> finished{0};  ///< the worker ran to its end and reported its counts
    std::atomic<int> killed_by_fault{0};
    std::atomic<long> fds_before{-1}, fds_after{-1}, tasks_before{-1}, tasks_after{-1};
    std::atomic<std::uint64_t> used{0};  ///< records appended to this process's log
    std::atomic<std::uint64_t> overflow{0};
    std::uint64_t capacity = 0;
    std::uint64_t offset = 0;  ///< of the log, in records from the start of the log area
    thread_now threads[max_threads];
};

struct shared_header {
    std::atomic<int> go{0};    ///< workers start when set
    std::atomic<int> stop{0};  ///< workers start no new episode once set
    std::int64_t t0 = 0;       ///< when the run started
    std::int64_t t_end = 0;    ///< when workers stop starting episodes
    std::atomic<std::uint32_t> next_actor{1};
    /// The protected resource: per name, the highest fencing token a write carried, and by
    /// which acquisition (actor, acquired time).
    std::atomic<std::int64_t> resource_token[max_names];
    std::atomic<std::int64_t> resource_acquired[max_names];
    std::atomic<std::uint32_t> resource_actor[max_names];
    std::atomic<std::uint64_t> resource_refused{0};
    process_now processes[max_processes];
};

/// The shared mapping: the header, then every process's log.
class journal {
public:
    /// `capacities[p]`: records process p's log holds.
    explicit journal(const std::vector<std::uint64_t>& capacities) {
        std::uint64_t records = 0;
        for (const auto c : capacities) {
            records += c;
        }
        bytes_ = sizeof(shared_header) + 64 + records * sizeof(record);
        void* area = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE,
                            MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (area == MAP_FAILED) {
            throw std::runtime_error{"torture: cannot map " + std::to_string(bytes_) +
                                     " bytes of shared memory"};
        }
        area_ = area;
        header_ = new (area) shared_header{};
        auto base = reinterpret_cast<std::uintptr_t>(area) + sizeof(shared_header);
        base = (base + 63) & ~std::uintptr_t{63};
        logs_ = reinterpret_cast<record*>(base);
        std::uint64_t offset = 0;
        for (std::size_t p = 0; p < capacities.size() && p < max_processes; ++p) {
            header_->processes[p].capacity = capacities[p];
            header_->processes[p].offset = offset;
            offset += capacities[p];
        }
        for (int n = 0; n < max_names; ++n) {
            header_->resource_token[n] = 0;
            header_->resource_acquired[n] = 0;
            header_->resource_actor[n] = 0;
        }
    }

    journal(const journal&) = delete;
    journal& operator=(const journal&) = delete;
    ~journal() { ::munmap(area_, bytes_); }

    shared_header& header() { return *header_; }
    process_now& process(int p) { return header_->processes[p]; }

    /// A fresh actor id (a worker thread incarnation or a forked child).
    std::uint32_t new_actor() { return header_->next_actor.fetch_add(1); }

    /// Appends a record to process p's log: `fill` writes its fields, then it is published.
    /// A full log drops the record and counts it (reported as a tool error).
    template <class Fill>
    void append(int p, Fill&& fill) {
        process_now& pn = header_->processes[p];
        const std::uint64_t at = pn.used.fetch_add(1);
        if (at >= pn.capacity) {
            pn.overflow.fetch_add(1);
            return;
        }
        record& r = logs_[pn.offset + at];
        fill(r);
        r.ready.store(1, std::memory_order_release);
    }

    /// Every published record of process p.
    template <class Visit>
    void read(int p, Visit&& visit) const {
        const process_now& pn = header_->processes[p];
        const std::uint64_t used = std::min(pn.used.load(), pn.capacity);
        for (std::uint64_t i = 0; i < used; ++i) {
            const record& r = logs_[pn.offset + i];
            if (r.ready.load(std::memory_order_acquire) == 1) {
                visit(r);
            }
        }
    }

private:
    void* area_ = nullptr;
    std::size_t bytes_ = 0;
    shared_header* header_ = nullptr;
    record* logs_ = nullptr;
};

/// Copies `text` into a record's text field on one line, cut to fit.
inline void set_text(record& r, std::string_view text) {
    const std::size_t n = std::min(text.size(), sizeof(r.text) - 1);
    for (std::size_t i = 0; i < n; ++i) {
        r.text[i] = text[i] == '\n' || text[i] == '\r' ? ' ' : text[i];
    }
    r.text[n] = '\0';
}

}  // namespace redislock::torture
