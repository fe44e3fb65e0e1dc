// detail::local_gates: the threads of one process that wait for one name queue here, first come
// first served, and only the first of them waits in Redis. The rest never touch the server until
// their turn, so a process puts one waiter in the lock's queue however many threads it has.
// Each gate also remembers whether the name was contended lately: a lock() then joins the queue
// with its first attempt instead of trying a plain SET first. A thread that leaves the front
// wakes only the next one: the others sleep on, so a turn costs one wake-up however many wait.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>

#include <redislock/detail/waiting/backoff.hpp>

namespace redislock::detail {

class local_gates {
public:
    class place;

private:
    struct gate {
        std::deque<place*> line;  // first come first
        bool contended = false;
    };

public:
    /// A place in the gate of one name, given up on destruction. Not movable: the gate points
    /// at it while it waits.
    class place {
    public:
        place(local_gates& gates, std::string_view name) : gates_{&gates}, name_{name} {
            std::lock_guard guard{gates_->mutex_};
            auto it = gates_->gates_.try_emplace(name_).first;
            try {
                it->second.line.push_back(this);
            } catch (...) {
                if (it->second.line.empty() && !it->second.contended) {
                    gates_->gates_.erase(it);
                }
                throw;
            }
        }
        place(const place&) = delete;
        place& operator=(const place&) = delete;
        ~place() {
            std::lock_guard guard{gates_->mutex_};
            auto it = gates_->gates_.find(name_);
            std::deque<place*>& line = it->second.line;
            const bool was_first = line.front() == this;
            std::erase(line, this);
            if (line.empty()) {
                if (!it->second.contended) {
                    gates_->gates_.erase(it);
                }
            } else if (was_first) {
                // Under the mutex: the next place cannot be destroyed meanwhile.
                line.front()->turn_.notify_one();
            }
        }

        /// Waits until every thread before this one left the gate, `deadline` or a stop
        /// request; true when it is this thread's turn.
        bool wait_turn(steady::time_point deadline, const std::stop_token& stop) {
            std::unique_lock lock{gates_->mutex_};
            const auto first = [this] { return gates_->gates_[name_].line.front() == this; };
            return stop.stop_possible() ? turn_.wait_until(lock, stop, deadline, first)
                                        : turn_.wait_until(lock, deadline, first);
        }

    private:
        local_gates* gates_;
        std::string name_;
        std::condition_variable_any turn_;  // told when this place becomes the first
    };

    struct view {
        bool idle = true;        // no thread of this process waits for the name
        bool contended = false;  // its last wait or release met other waiters
    };

    view look(std::string_view name) noexcept {
        std::lock_guard guard{mutex_};
        auto it = gates_.find(name);
        if (it == gates_.end()) {
            return {};
        }
        return {it->second.line.empty(), it->second.contended};
    }

    /// Notes whether the last wait or release of `name` met other waiters. A hint: when it
    /// cannot be remembered (out of memory) it is dropped, as for a name past max_remembered.
    void note_contention(std::string_view name, bool contended) noexcept {
        std::lock_guard guard{mutex_};
        auto it = gates_.find(name);
        if (it == gates_.end()) {
            if (!contended || gates_.size() >= max_remembered) {
                return;
            }
            try {
                it = gates_.emplace(std::string{name}, gate{}).first;
            } catch (...) {
                return;
            }
        }
        it->second.contended = contended;
        if (!contended && it->second.line.empty()) {
            gates_.erase(it);
        }
    }

private:
    // Bounds the memory of contention hints for many names; a name forgotten only costs one
    // more command on its next contended lock().
    static constexpr std::size_t max_remembered = 4096;

    std::mutex mutex_;
    std::map<std::string, gate, std::less<>> gates_;
};

}  // namespace redislock::detail
