#pragma once

// Mutual exclusion checked the hard way, for any lock kind: processes x threads increment a
// counter kept in Redis with a plain GET then SET while holding the lock, so an overlap loses an
// increment; every holder also logs when it entered and left its critical section on
// CLOCK_MONOTONIC (one clock for every process of the machine), so overlapping holders are caught
// even when no increment happens to be lost.
//
// Also child_process: a forked child that talks to its parent one line at a time, for tests that
// need "another process".
//
// fork() copies only the calling thread: fork before this process starts any thread or makes any
// client, and let the child make its own.

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace redislock::test {

/// One end of a line-based link between a parent and its forked child (a socket pair, so a
/// write to a peer that died fails with EPIPE instead of raising SIGPIPE).
class line_channel {
public:
    explicit line_channel(detail::unique_fd fd) : fd_{std::move(fd)} {}

    /// Sends `line` and a newline. Returns false if the other side is gone.
    bool send(std::string_view line) {
        std::string data{line};
        data += '\n';
        std::size_t sent = 0;
        while (sent < data.size()) {
            const ssize_t n =
                ::send(fd_.get(), data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
            if (n > 0) {
                sent += static_cast<std::size_t>(n);
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else {
                return false;
            }
        }
        return true;
    }

    /// The next line without its newline; std::nullopt at end of input or after `timeout`.
    std::optional<std::string> receive(std::chrono::milliseconds timeout) {
        const auto deadline = detail::clock::now() + timeout;
        for (;;) {
            if (const auto end = buffer_.find('\n'); end != std::string::npos) {
                std::string line = buffer_.substr(0, end);
                buffer_.erase(0, end + 1);
                return line;
            }
            if (closed_) {
                return std::nullopt;
            }
            pollfd pfd{fd_.get(), POLLIN, 0};
            const int ready = ::poll(&pfd, 1, detail::remaining_ms(deadline));
            if (ready < 0 && errno == EINTR) {
                continue;
            }
            if (ready <= 0) {
                return std::nullopt;
            }
            std::array<char, 4096> chunk{};
            const ssize_t n = ::recv(fd_.get(), chunk.data(), chunk.size(), 0);
            if (n < 0 && errno == EINTR) {
                continue;
            }
            if (n <= 0) {
                closed_ = true;
                continue;
            }
            buffer_.append(chunk.data(), static_cast<std::size_t>(n));
        }
    }

private:
    detail::unique_fd fd_;
    std::string buffer_;
    bool closed_ = false;
};

/// A forked child running `body(line_channel&) -> int`, whose result is the child's exit code
/// (125 when it throws: the exception's message is sent as a line "exception: ..."). The child
/// never returns into the test: it ends with _exit, so no test framework code runs in it. It is
/// killed if the thread that forked it exits, and by the destructor if still running.
class child_process {
public:
    template <class Body>
    explicit child_process(Body body) {
        std::array<int, 2> fds{};
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds.data()) != 0) {
            throw detail::sys_error("socketpair");
        }
        detail::unique_fd parent_end{fds[0]};
        detail::unique_fd child_end{fds[1]};
        const pid_t parent = ::getpid();
        pid_ = ::fork();
        if (pid_ < 0) {
            throw detail::sys_error("fork");
        }
        if (pid_ == 0) {
            ::prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (::getppid() != parent) {
                ::_exit(126);
            }
            parent_end.reset();
            int code = 125;
            {
                line_channel channel{std::move(child_end)};
                try {
                    code = body(channel);
                } catch (const std::exception& e) {
                    channel.send(std::string{"exception: "} + e.what());
                } catch (...) {
                    channel.send("exception: unknown");
                }
            }
            ::_exit(code);
        }
        channel_ = std::make_unique<line_channel>(std::move(parent_end));
    }

    child_process(const child_process&) = delete;
    child_process& operator=(const child_process&) = delete;

    ~child_process() {
        if (pid_ > 0) {
            ::kill(pid_, SIGKILL);
            (void)wait_child(pid_, std::chrono::seconds{10});
        }
    }

    pid_t pid() const { return pid_; }
    line_channel& channel() { return *channel_; }

    /// Waits at most `timeout` for the child to end. Returns its exit code; std::nullopt if it
    /// died from a signal or had to be killed.
    std::optional<int> wait(std::chrono::milliseconds timeout) {
        if (pid_ <= 0) {
            return std::nullopt;
        }
        const std::optional<int> status = wait_child(pid_, timeout);
        pid_ = -1;
        if (!status || !WIFEXITED(*status)) {
            return std::nullopt;
        }
        return WEXITSTATUS(*status);
    }

private:
    pid_t pid_ = -1;
    std::unique_ptr<line_channel> channel_;
};

/// When one critical section ran, as CLOCK_MONOTONIC nanoseconds.
struct hold_interval {
    std::int64_t enter_ns = 0;
    std::int64_t exit_ns = 0;
};

/// The first two intervals that overlap (in order of entry), if any.
inline std::optional<std::pair<hold_interval, hold_interval>> find_overlap(
    std::vector<hold_interval> intervals) {
    const auto by_entry = [](const hold_interval& a, const hold_interval& b) {
        return a.enter_ns < b.enter_ns;
    };
    std::sort(intervals.begin(), intervals.end(), by_entry);
    // Compare with the interval that leaves last so far, so one long holder that spans several
    // later ones is caught too.
    std::optional<hold_interval> latest;
    for (const auto& current : intervals) {
        if (latest && current.enter_ns < latest->exit_ns) {
            return std::pair{*latest, current};
        }
        if (!latest || current.exit_ns > latest->exit_ns) {
            latest = current;
        }
    }
    return std::nullopt;
}

struct exclusion_options {
    std::string uri;                                ///< the server under test
    std::string counter_key = "exclusion:counter";  ///< must not exist before the run
    int processes = 2;                              ///< this one and processes - 1 forked children
    int threads = 3;                                ///< per process
    int iterations = 150;                           ///< critical sections per thread
    std::chrono::milliseconds time_limit{60'000};   ///< threads still running then stop and fail
};

struct exclusion_report {
    std::int64_t planned = 0;              ///< processes x threads x iterations
    std::int64_t completed = 0;            ///< critical sections that ran to their end
    std::int64_t counter = 0;              ///< the counter's final value in Redis
    std::vector<hold_interval> intervals;  ///< every completed critical section
    std::vector<std::string> errors;       ///< exceptions, time limit, children that failed

    std::optional<std::pair<hold_interval, hold_interval>> overlap() const {
        return find_overlap(intervals);
    }

    /// A summary for assertion messages.
    std::string describe() const {
        std::ostringstream out;
        out << "planned " << planned << ", completed " << completed << ", counter " << counter
            << ", " << errors.size() << " error(s)";
        for (std::size_t i = 0; i < std::min<std::size_t>(errors.size(), 5); ++i) {
            out << "\n  " << errors[i];
        }
        if (const auto pair = overlap()) {
            out << "\n  overlap: [" << pair->first.enter_ns << ", " << pair->first.exit_ns
                << "] and [" << pair->second.enter_ns << ", " << pair->second.exit_ns << "]";
        }
        return out.str();
    }
};

namespace detail {

struct exclusion_outcome {
    std::vector<hold_interval> intervals;
    std::vector<std::string> errors;
};

inline std::int64_t read_counter(hiredis_connection& conn, std::string_view key) {
    const std::array<std::string_view, 2> get{"GET", key};
    const reply r = conn.execute(get);
    if (r.is_nil()) {
        return 0;
    }
    if (!r.is_string()) {
        throw std::runtime_error{"GET " + std::string{key} + " did not return a string"};
    }
    return std::stoll(r.text());
}

// One process's share: `threads` threads, each running `iterations` critical sections.
template <class MakeProcess>
exclusion_outcome run_exclusion_process(const exclusion_options& options, int process,
                                        clock::time_point deadline, MakeProcess& make_process) {
    exclusion_outcome outcome;
    try {
        hiredis_connection counter{options.uri};
        auto make_thread = make_process(process);
        std::vector<exclusion_outcome> per_thread(static_cast<std::size_t>(options.threads));
        std::vector<std::thread> workers;
        for (int t = 0; t < options.threads; ++t) {
            workers.emplace_back([&, t] {
                auto& mine = per_thread[static_cast<std::size_t>(t)];
                try {
                    auto hold = make_thread(t);
                    std::mt19937_64 rng{std::random_device{}() ^
                                        (static_cast<std::uint64_t>(process) << 32) ^
                                        static_cast<std::uint64_t>(t)};
                    const std::function<void()> critical = [&] {
                        const std::int64_t enter = monotonic_ns();
                        const std::int64_t value = read_counter(counter, options.counter_key);
                        const std::string next = std::to_string(value + 1);
                        const std::array<std::string_view, 3> set{"SET", options.counter_key, next};
                        if (!counter.execute(set).is_status()) {
                            throw std::runtime_error{"SET of the counter failed"};
                        }
                        mine.intervals.push_back({enter, monotonic_ns()});
                    };
                    for (int i = 0; i < options.iterations; ++i) {
                        if (clock::now() >= deadline) {
                            mine.errors.push_back("process " + std::to_string(process) +
                                                  " thread " + std::to_string(t) +
                                                  ": time limit reached after " +
                                                  std::to_string(i) + " iterations");
                            break;
                        }
                        hold(rng, critical);
                    }
                } catch (const std::exception& e) {
                    mine.errors.push_back("process " + std::to_string(process) + " thread " +
                                          std::to_string(t) + ": " + e.what());
                }
            });
        }
        for (auto& worker : workers) {
            worker.join();
        }
        for (auto& mine : per_thread) {
            outcome.intervals.insert(outcome.intervals.end(), mine.intervals.begin(),
                                     mine.intervals.end());
            outcome.errors.insert(outcome.errors.end(), mine.errors.begin(), mine.errors.end());
        }
    } catch (const std::exception& e) {
        outcome.errors.push_back("process " + std::to_string(process) + ": " + e.what());
    }
    return outcome;
}

inline std::string one_line(std::string text) {
    std::replace(text.begin(), text.end(), '\n', ' ');
    return text;
}

}  // namespace detail

/// Runs options.processes x options.threads workers that each run options.iterations critical
/// sections under the lock under test, and reports what happened.
///
/// `make_process(int process)` is called once in each process (after the fork, so it may make
/// the process's client) and returns `make_thread(int thread)`, called once on each worker
/// thread, which returns `hold(std::mt19937_64& rng, const std::function<void()>& critical)`:
/// it must take the lock, call critical() exactly once while holding it, and let go. Anything
/// they throw is reported as an error and ends that thread (or process).
///
/// Call it before this process starts any thread or makes any client (it forks).
template <class MakeProcess>
exclusion_report run_exclusion(const exclusion_options& options, MakeProcess make_process) {
    exclusion_report report;
    report.planned = std::int64_t{options.processes} * options.threads * options.iterations;
    const auto deadline = detail::clock::now() + options.time_limit;

    std::vector<std::unique_ptr<child_process>> children;
    for (int p = 1; p < options.processes; ++p) {
        children.push_back(std::make_unique<child_process>([&, p](line_channel& channel) {
            const auto outcome = detail::run_exclusion_process(options, p, deadline, make_process);
            for (const auto& interval : outcome.intervals) {
                channel.send("interval " + std::to_string(interval.enter_ns) + " " +
                             std::to_string(interval.exit_ns));
            }
            for (const auto& error : outcome.errors) {
                channel.send("error " + detail::one_line(error));
            }
            return channel.send("done") ? 0 : 1;
        }));
    }

    auto own = detail::run_exclusion_process(options, 0, deadline, make_process);
    report.intervals = std::move(own.intervals);
    report.errors = std::move(own.errors);

    // Children get the time limit plus a margin to finish, report and exit.
    const auto collect_until = deadline + std::chrono::seconds{30};
    for (std::size_t i = 0; i < children.size(); ++i) {
        const std::string who = "process " + std::to_string(i + 1);
        bool done = false;
        while (!done) {
            const auto left = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           collect_until - detail::clock::now()),
                                       std::chrono::milliseconds::zero());
            const auto line = children[i]->channel().receive(left);
            if (!line) {
                break;
            }
            std::istringstream words{*line};
            std::string kind;
            words >> kind;
            if (kind == "interval") {
                hold_interval interval;
                words >> interval.enter_ns >> interval.exit_ns;
                report.intervals.push_back(interval);
            } else if (kind == "done") {
                done = true;
            } else {
                report.errors.push_back(who + ": " + *line);
            }
        }
        if (!done) {
            report.errors.push_back(who + ": ended without a complete report");
        }
        const auto code = children[i]->wait(std::chrono::seconds{10});
        if (code != 0) {
            report.errors.push_back(who + ": exit code " +
                                    (code ? std::to_string(*code) : std::string{"(signal)"}));
        }
    }

    report.completed = static_cast<std::int64_t>(report.intervals.size());
    try {
        hiredis_connection conn{options.uri};
        report.counter = detail::read_counter(conn, options.counter_key);
    } catch (const std::exception& e) {
        report.errors.push_back(std::string{"reading the counter: "} + e.what());
    }
    return report;
}

}  // namespace redislock::test
