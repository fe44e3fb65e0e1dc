// detail::node_connector: opens the connection to one node on a thread of its own, so that no
// round waits for a connect. A master dropped off the network (its SYNs lost), or hung with its
// accept queue full, then costs a round that master's answer only, never the other masters'.
//
// A round that finds no open connection to a node asks the node's connector (request()) and goes
// on with the other nodes. The connector runs one warm-up at a time, bounded by its own deadline
// (make the node's connection, or open a fresh one and check it with a PING), and when it ends
// wakes every round that asked for it through that round's round_signal. Such a round then sends
// its commands itself, from its own thread: the connector never sends a round's command, so a
// node still connecting when the round ends was surely sent nothing.
//
// Thread safety: every member may be called from any thread. Lifetime: the thread starts with
// the first request and ends once the connector has been idle a while, or at destruction, which
// waits for a warm-up under way (it ends by its own deadline). fork(): connectors belong to a
// per-process table (detail::per_process), so a child makes its own.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <redislock/detail/engine/owned_thread.hpp>

namespace redislock::detail {

/// How connectors wake one round: a pipe whose read end the round polls with its sockets.
class round_signal {
public:
    /// @throws std::system_error when no pipe can be made.
    round_signal() {
        int ends[2];
        if (::pipe(ends) != 0) {
            throw std::system_error{errno, std::generic_category(), "redislock: pipe"};
        }
        read_end_ = ends[0];
        write_end_ = ends[1];
        for (const int fd : ends) {
            (void)::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
            (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
    }
    round_signal(const round_signal&) = delete;
    round_signal& operator=(const round_signal&) = delete;
    ~round_signal() {
        ::close(read_end_);
        ::close(write_end_);
    }

    /// The end to poll for POLLIN.
    int fd() const noexcept { return read_end_; }

    void notify() const noexcept {
        const char one = 1;
        (void)!::write(write_end_, &one, 1);
    }

    /// Empties the pipe, once the round has looked at what woke it.
    void drain() const noexcept {
        char buffer[64];
        while (::read(read_end_, buffer, sizeof buffer) > 0) {
        }
    }

private:
    int read_end_ = -1;
    int write_end_ = -1;
};

class node_connector {
public:
    using clock = std::chrono::steady_clock;
    /// Makes the node's connection usable by the deadline: ready when it returns, which it does
    /// with the servers it saw reconnected, held back for the round that uses the connection to
    /// report. Throws what stopped it.
    using warm_up = std::function<std::vector<std::string>(clock::time_point deadline)>;
    /// Reports one reconnection (a reconnect_relay's report()).
    using reporter = std::function<void(std::string_view server)>;

    /// What a warm-up came to.
    struct outcome {
        bool ready = false;
        std::string error;  ///< why not, when not ready
    };

    /// `budget`: how long one warm-up may take.
    node_connector(warm_up warm, reporter report, std::chrono::milliseconds budget)
        : warm_{std::move(warm)}, report_{std::move(report)}, budget_{budget} {}
    node_connector(const node_connector&) = delete;
    node_connector& operator=(const node_connector&) = delete;
    ~node_connector() {
        owned_thread thread;
        {
            std::lock_guard lock{mutex_};
            stopping_ = true;
            thread = std::move(thread_);
        }
        wake_.notify_all();
        thread.end();
    }

    /// Has a warm-up run (or joins the one under way) and `signal` notified when it ends.
    /// Returns the warm-up's number, for result().
    /// @throws std::bad_alloc, std::system_error when the thread cannot be started.
    std::uint64_t request(const std::shared_ptr<const round_signal>& signal) {
        std::lock_guard lock{mutex_};
        if (std::find(waiting_.begin(), waiting_.end(), signal) == waiting_.end()) {
            waiting_.push_back(signal);
        }
        if (!wanted_) {
            if (!running_) {
                thread_ = owned_thread{[this] { run(); }};  // the ended one is joined first
                running_ = true;
            }
            wanted_ = true;
            ++started_;
            wake_.notify_all();
        }
        return started_;
    }

    /// What warm-up `number` (or a later one) came to once it ended, std::nullopt before. The
    /// first caller after a successful warm-up reports its reconnections, on its own thread.
    std::optional<outcome> result(std::uint64_t number) {
        std::vector<std::string> reconnected;
        outcome o;
        {
            std::lock_guard lock{mutex_};
            if (finished_ < number) {
                return std::nullopt;
            }
            o = last_;
            reconnected = std::move(unreported_);
            unreported_.clear();
        }
        for (const std::string& server : reconnected) {
            report_(server);
        }
        return o;
    }

    /// True until a first warm-up has ended: nothing is known yet of the node (a client just
    /// made, or a forked child, on a machine too busy to connect within a round).
    bool never_warmed_up() {
        std::lock_guard lock{mutex_};
        return finished_ == 0;
    }

    /// Stops notifying `signal`: its round is over.
    void forget(const round_signal* signal) noexcept {
        std::lock_guard lock{mutex_};
        std::erase_if(waiting_, [signal](const auto& s) { return s.get() == signal; });
    }

private:
    // How long the thread waits for another request before it ends.
    static constexpr std::chrono::seconds idle_linger{2};

    void run() {
        std::unique_lock lock{mutex_};
        while (!stopping_) {
            if (!wanted_) {
                if (!wake_.wait_for(lock, idle_linger, [&] { return stopping_ || wanted_; })) {
                    break;
                }
                continue;
            }
            // Reconnections no round took: told here, before this warm-up's replace them.
            std::vector<std::string> untold = std::move(unreported_);
            unreported_.clear();
            lock.unlock();
            for (const std::string& server : untold) {
                report_(server);
            }
            outcome o;
            std::vector<std::string> reconnected;
            try {
                reconnected = warm_(clock::now() + budget_);
                o.ready = true;
            } catch (const std::exception& e) {
                o.error = e.what();
            } catch (...) {
                o.error = "redislock: connecting failed";
            }
            lock.lock();
            last_ = std::move(o);
            unreported_ = std::move(reconnected);
            finished_ = started_;
            wanted_ = false;
            const std::vector<std::shared_ptr<const round_signal>> told = std::move(waiting_);
            waiting_.clear();
            lock.unlock();
            for (const auto& signal : told) {
                signal->notify();
            }
            lock.lock();
        }
        running_ = false;  // the last touch: request() may join this thread from here on
    }

    warm_up warm_;
    reporter report_;
    std::chrono::milliseconds budget_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::vector<std::shared_ptr<const round_signal>> waiting_;
    outcome last_;
    std::vector<std::string> unreported_;
    std::uint64_t started_ = 0;
    std::uint64_t finished_ = 0;
    bool wanted_ = false;   // a warm-up is asked for or under way
    bool running_ = false;  // the thread runs its loop
    bool stopping_ = false;
    owned_thread thread_;
};

}  // namespace redislock::detail
