#pragma once

// Checks of the promise every timed call makes: it returns (or throws) by its deadline plus
// deadline_slack, and a stop request ends it within deadline_slack, whatever the servers do.
//
//   const auto deadline = std::chrono::steady_clock::now() + 50ms;
//   const auto end = redislock::test::run_to_end([&] { (void)m.try_lock_until(deadline); });
//   EXPECT_LE(end.at, deadline + deadline_slack) << end.late_after(deadline) << end.how;

#include <chrono>
#include <exception>
#include <stop_token>
#include <string>
#include <thread>
#include <typeinfo>

#include <redislock/error.hpp>

namespace redislock::test {

/// How late a timed call may return past its deadline, or past the stop request that ended it:
/// the bound the library promises, which leaves room for a busy machine's scheduling.
inline constexpr std::chrono::milliseconds deadline_slack{50};

/// How a call ended and when.
struct call_end {
    std::chrono::steady_clock::time_point at;
    std::string how;  ///< "returned", or the type and message of the redislock::error thrown

    /// "N ms after the bound" (negative: before it), for failure messages.
    std::string late_after(std::chrono::steady_clock::time_point bound) const {
        return std::to_string(
                   std::chrono::duration_cast<std::chrono::milliseconds>(at - bound).count()) +
               " ms after the bound; ";
    }
};

/// Runs `call`, catching any redislock::error it throws, and says when and how it ended.
template <class Call>
call_end run_to_end(Call&& call) {
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
