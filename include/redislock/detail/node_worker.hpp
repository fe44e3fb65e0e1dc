// detail::node_worker<C>: one thread that owns the connection to one Redis node and runs the
// tasks posted for that node in order.
//
// A redlock client keeps one worker per master, so a command to every master is N tasks that
// run at the same time, with no thread made per call. Tasks for one node run first in, first
// out: a release posted after an acquisition always reaches that node after it, even when the
// acquisition's caller stopped waiting.
//
// The connection is made by the first task, and again by the next task after making it failed,
// so a node that is down when the client starts does not stop the client from working with the
// others. Tasks must bound their own calls (call_context deadlines). Destruction runs the tasks
// already posted, then joins the thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

namespace redislock::detail {

template <class C>
class node_worker {
public:
    using task = std::function<void(node_worker&)>;

    node_worker(std::function<C()> make_connection, std::string description)
        : make_connection_{std::move(make_connection)}, description_{std::move(description)} {
        thread_ = std::thread{[this] { run(); }};
    }

    node_worker(const node_worker&) = delete;
    node_worker& operator=(const node_worker&) = delete;

    ~node_worker() {
        {
            std::lock_guard guard{mutex_};
            stopping_ = true;
        }
        wake_.notify_one();
        thread_.join();
    }

    /// Runs `t` on the calling thread, now, if this node has nothing queued or running (so it
    /// keeps its place in the order); returns false, having run nothing, otherwise. Saves a
    /// thread hand-off on the caller's critical path.
    bool try_run_here(const task& t) {
        {
            std::lock_guard guard{mutex_};
            if (running_ || !queue_.empty() || stopping_) {
                return false;
            }
            running_ = true;
        }
        try {
            t(*this);
        } catch (...) {
            // Tasks report their own failures.
        }
        {
            std::lock_guard guard{mutex_};
            running_ = false;
        }
        wake_.notify_one();
        return true;
    }

    /// Queues `t` to run on this node's thread. Never blocks on I/O.
    void post(task t) {
        {
            std::lock_guard guard{mutex_};
            queue_.push_back(std::move(t));
        }
        wake_.notify_one();
    }

    /// The node's connection, made now if there is none. Only for tasks, which run one at a
    /// time (on the worker's thread, or on a caller's through try_run_here()).
    /// @throws whatever making a connection throws.
    C& connection() {
        if (!connection_) {
            connection_.emplace(make_connection_());
        }
        return *connection_;
    }

    /// "host:port" of the node, for messages.
    const std::string& description() const noexcept { return description_; }

    /// Whether the node's last call got a reply (tasks record it); a node that did not is not
    /// worth blocking a caller on.
    bool answering() const noexcept { return answering_.load(std::memory_order_relaxed); }
    void record_answer(bool answered) noexcept {
        answering_.store(answered, std::memory_order_relaxed);
    }

private:
    void run() {
        for (;;) {
            task next;
            {
                std::unique_lock lock{mutex_};
                wake_.wait(lock, [this] { return !running_ && (stopping_ || !queue_.empty()); });
                if (queue_.empty()) {
                    return;
                }
                next = std::move(queue_.front());
                queue_.pop_front();
                running_ = true;
            }
            try {
                next(*this);
            } catch (...) {
                // Tasks report their own failures; one that throws must not end the worker.
            }
            next = nullptr;
            std::lock_guard guard{mutex_};
            running_ = false;
        }
    }

    std::function<C()> make_connection_;
    std::string description_;
    std::optional<C> connection_;  // touched only by the task running
    std::atomic<bool> answering_{true};
    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<task> queue_;
    bool running_ = false;  // a task runs, here or on a caller's thread
    bool stopping_ = false;
    std::thread thread_;
};

}  // namespace redislock::detail
