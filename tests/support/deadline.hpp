#pragma once

// Checks of the promise every timed call makes: it returns (or throws) by its deadline plus
// deadline_slack, and a stop request ends it within deadline_slack, whatever the servers do.
//
//   const auto deadline = std::chrono::steady_clock::now() + 50ms;
//   const auto end = redislock::test::run_to_end([&] { (void)m.try_lock_until(deadline); });
//   EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
//
// A machine busy with other work may leave a runnable thread without a CPU for tens of
// milliseconds; no library can return in time then. So a call is also in time when it is late
// by no more than the machine was late, meanwhile, in waking a thread of this process that only
// sleeps 1 ms at a time (scheduling_probe): that much lateness is the scheduler's, not the
// library's. A library that gave a command more time than the caller had left is still caught,
// unless the machine happened to stall just as long at that very moment.

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <stop_token>
#include <string>
#include <thread>
#include <typeinfo>

#include <redislock/error.hpp>

namespace redislock::test {

/// How late a timed call may return past its deadline, or past the stop request that ended it,
/// on a machine that wakes its threads on time: the bound the library promises.
inline constexpr std::chrono::milliseconds deadline_slack{50};

/// Measures how late this machine wakes a sleeping thread: a thread of its own sleeps 1 ms at a
/// time and keeps, for the last minute, each wake-up that came more than 1 ms late.
class scheduling_probe {
public:
    using clock = std::chrono::steady_clock;

    scheduling_probe() : thread_{[this] { run(); }} {}
    scheduling_probe(const scheduling_probe&) = delete;
    scheduling_probe& operator=(const scheduling_probe&) = delete;
    ~scheduling_probe() {
        {
            std::lock_guard lock{mutex_};
            stopping_ = true;
        }
        thread_.join();
    }

    /// The process's probe, started by the first call.
    static scheduling_probe& machine() {
        static scheduling_probe probe;
        return probe;
    }

    /// The longest a wake-up came late, of those whose wait for the CPU overlapped [from, to].
    std::chrono::milliseconds stall_between(clock::time_point from, clock::time_point to) const {
        std::lock_guard lock{mutex_};
        clock::duration worst{};
        for (const stall& s : stalls_) {
            if (s.due <= to && s.woke >= from) {
                worst = std::max(worst, s.woke - s.due);
            }
        }
        return std::chrono::ceil<std::chrono::milliseconds>(worst);
    }

private:
    struct stall {
        clock::time_point due;
        clock::time_point woke;
    };

    void run() {
        for (;;) {
            const auto due = clock::now() + std::chrono::milliseconds{1};
            std::this_thread::sleep_until(due);
            const auto woke = clock::now();
            std::lock_guard lock{mutex_};
            if (stopping_) {
                return;
            }
            if (woke - due > std::chrono::milliseconds{1}) {
                stalls_.push_back({due, woke});
            }
            while (!stalls_.empty() && woke - stalls_.front().woke > std::chrono::minutes{1}) {
                stalls_.pop_front();
            }
        }
    }

    mutable std::mutex mutex_;
    bool stopping_ = false;
    std::deque<stall> stalls_;
    std::thread thread_;
};

/// How a call ended and when.
struct call_end {
    std::chrono::steady_clock::time_point at;
    std::string how;  ///< "returned", or the type and message of the redislock::error thrown

    /// Whether the call ended by `bound` plus deadline_slack, or later by no more than the machine
    /// stalled meanwhile (see the top of this file).
    bool by(std::chrono::steady_clock::time_point bound) const {
        return at <= bound + deadline_slack + stall_after(bound);
    }

    /// "N ms after the bound (the machine stalled M ms meanwhile); ", for failure messages.
    std::string late_after(std::chrono::steady_clock::time_point bound) const {
        return std::to_string(
                   std::chrono::duration_cast<std::chrono::milliseconds>(at - bound).count()) +
               " ms after the bound (the machine stalled " +
               std::to_string(stall_after(bound).count()) + " ms meanwhile); ";
    }

private:
    std::chrono::milliseconds stall_after(std::chrono::steady_clock::time_point bound) const {
        return scheduling_probe::machine().stall_between(bound, at);
    }
};

/// Runs `call`, catching any redislock::error it throws, and says when and how it ended.
template <class Call>
call_end run_to_end(Call&& call) {
    (void)scheduling_probe::machine();  // watching from before the call
    std::string how = "returned";
    try {
        call();
    } catch (const redislock::error& e) {
        how = std::string{typeid(e).name()} + ": " + e.what();
    }
    return {std::chrono::steady_clock::now(), how};
}

/// Requests a stop `delay` after construction, from a thread of its own; the time it actually
/// did (a busy machine may wake the thread late) is what a stopped call is measured against.
class stop_after {
public:
    explicit stop_after(std::chrono::milliseconds delay)
        : thread_{[this, delay] {
              std::this_thread::sleep_for(delay);
              requested_at_ = std::chrono::steady_clock::now();
              source_.request_stop();
          }} {}
    stop_after(const stop_after&) = delete;
    stop_after& operator=(const stop_after&) = delete;
    ~stop_after() {
        if (thread_.joinable()) {
            thread_.join();
        }
    }

    const std::stop_token& token() const { return token_; }

    /// When the stop was requested; waits until it was.
    std::chrono::steady_clock::time_point requested_at() {
        if (thread_.joinable()) {
            thread_.join();
        }
        return requested_at_;
    }

private:
    std::stop_source source_;
    std::stop_token token_ = source_.get_token();
    std::chrono::steady_clock::time_point requested_at_{};
    std::thread thread_;
};

}  // namespace redislock::test
