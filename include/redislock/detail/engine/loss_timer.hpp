// detail::loss_timer: tells a held lock it is lost at its local conservative deadline.
//
// A lock's lease is surely valid until a deadline computed from when its last grant was sent
// (valid_until in kinds/lease_time.hpp). If no renewal has moved that deadline by the time
// it comes, the lock must be reported lost then, before a rival can be inside, whatever a round
// trip blocked on a stalled connection is doing. So this thread does no I/O: it sleeps until the
// earliest deadline and runs that lock's callback in two steps: the callback itself only marks the
// loss (owned() false, lost_token() stopped) and returns what to tell the user; that runs once
// every due lease has been marked, so a slow on_lost handler never delays another lock's mark.
//
// Thread safety: every member may be called from any thread, callbacks included. remove() waits
// for the marking step of that entry if it is running on another thread, so once it returns the
// callback never runs again; the returned notification does not touch the lock. Callbacks run
// with no internal lock held.
// fork(): the owner keeps the timer in a detail::per_process, so a child builds its own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stop_token>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/detail/engine/owned_thread.hpp>
#include <redislock/detail/util/inplace_function.hpp>

namespace redislock::detail {

class loss_timer {
public:
    using clock = std::chrono::steady_clock;
    using entry_id = std::uint64_t;

    // The spare nodes' room is taken now, so that keeping a node never throws later.
    loss_timer() {
        spare_entries_.reserve(spare_limit);
        spare_slots_.reserve(spare_limit);
    }
    loss_timer(const loss_timer&) = delete;
    loss_timer& operator=(const loss_timer&) = delete;
    ~loss_timer() { stop(); }

    /// Stops the thread: joins it, or from the thread itself (a callback destroying the client)
    /// lets it end when the callback returns. Idempotent.
    void stop() {
        owned_thread thread;
        {
            std::lock_guard lock{mutex_};
            stopped_ = true;
            thread = std::move(thread_);
        }
        wake_.notify_all();
        thread.end();
    }

    /// What a loss marked at its deadline still has to tell: the stop source of lost_token() and
    /// the on_lost handler. Both run after every due loss is marked, stops before handlers.
    struct loss_notice {
        std::stop_source source{std::nostopstate};
        std::function<void()> handler{};
    };

    /// What runs at a deadline: marks the loss (no user code) and returns what to tell. Kept in
    /// place: large enough for a weak pointer to a lock's state and the key of its lease.
    using deadline_callback = inplace_function<loss_notice(), 128>;

    /// True on the timer's own thread.
    bool runs_on_this_thread() const {
        std::lock_guard lock{mutex_};
        return thread_id_ == std::this_thread::get_id();
    }

    /// Calls `on_deadline` at `deadline` unless moved or removed first. Returns the entry's id.
    entry_id add(clock::time_point deadline, deadline_callback on_deadline) {
        std::lock_guard lock{mutex_};
        const entry_id id = next_id_++;
        if (spare_entries_.empty()) {
            entries_.emplace(id, entry{deadline, std::move(on_deadline)});
        } else {
            auto node = take_spare(spare_entries_);
            node.key() = id;
            node.mapped() = entry{deadline, std::move(on_deadline)};
            entries_.insert(std::move(node));
        }
        enqueue(deadline, id);
        if (!thread_.running() && !stopped_) {
            thread_ = owned_thread{[this] { run(); }};
        } else if (deadline < planned_wake_) {
            wake_.notify_all();
        }
        return id;
    }

    /// Moves an entry's deadline (a renewal was confirmed). No effect on a removed or fired entry.
    void move(entry_id id, clock::time_point deadline) {
        std::lock_guard lock{mutex_};
        auto it = entries_.find(id);
        if (it == entries_.end() || it->second.fired) {
            return;
        }
        dequeue(it->second.deadline, id);
        it->second.deadline = deadline;
        enqueue(deadline, id);
        if (deadline < planned_wake_) {
            wake_.notify_all();
        }
    }

    /// Forgets an entry; waits for its callback if it is running on another thread.
    void remove(entry_id id) {
        if (id == 0) {
            return;
        }
        std::unique_lock lock{mutex_};
        if (running_ == id && std::this_thread::get_id() != thread_id_) {
            done_.wait(lock, [&] { return running_ != id; });
        }
        if (auto it = entries_.find(id); it != entries_.end()) {
            dequeue(it->second.deadline, id);
            forget(it);
        }
    }

    std::size_t size() const {
        std::lock_guard lock{mutex_};
        return entries_.size();
    }

private:
    struct entry {
        clock::time_point deadline;
        deadline_callback on_deadline;
        bool fired = false;
    };

    // With nothing queued the thread still wakes now and then, so add() rarely has to notify:
    // a deadline later than the planned wake-up is picked up then.
    static constexpr std::chrono::seconds idle_wake{1};

    using entry_map = std::map<entry_id, entry>;
    using deadline_queue = std::set<std::pair<clock::time_point, entry_id>>;

    // The nodes of both containers are kept for reuse, so that a lock+unlock allocates nothing
    // here once the timer has warmed up; at most spare_limit of each are kept.
    static constexpr std::size_t spare_limit = 64;

    template <class Node>
    static Node take_spare(std::vector<Node>& spares) {
        Node node = std::move(spares.back());
        spares.pop_back();
        return node;
    }

    void enqueue(clock::time_point deadline, entry_id id) {
        if (spare_slots_.empty()) {
            queue_.emplace(deadline, id);
            return;
        }
        auto node = take_spare(spare_slots_);
        node.value() = {deadline, id};
        queue_.insert(std::move(node));
    }

    // Keeps `node` for reuse when there is room; a node that cannot be kept (out of memory
    // growing the spares) is freed: remove() runs on release paths, which must not throw.
    template <class Node>
    static void keep_spare(std::vector<Node>& spares, Node&& node) noexcept {
        if (node.empty() || spares.size() >= spare_limit) {
            return;
        }
        try {
            spares.push_back(std::move(node));
        } catch (...) {
        }
    }

    void dequeue(clock::time_point deadline, entry_id id) noexcept {
        keep_spare(spare_slots_, queue_.extract({deadline, id}));
    }

    void forget(entry_map::iterator it) noexcept {
        if (it == entries_.end()) {
            return;
        }
        auto node = entries_.extract(it);
        node.mapped().on_deadline.reset();  // what it captured goes now, not on reuse
        keep_spare(spare_entries_, std::move(node));
    }

    // Marks every due loss first, then requests their stops, then runs their handlers one at a
    // time, marking again whatever fell due meanwhile: a slow handler delays other handlers, never
    // another lock's owned() or lost_token(). Out of memory, a stop or handler that cannot wait
    // for its turn is run at once: a loss is never dropped, and nothing thrown ends the thread.
    void run() {
        std::unique_lock lock{mutex_};
        thread_id_ = std::this_thread::get_id();
        std::vector<std::stop_source> stops;
        std::vector<std::function<void()>> handlers;  // run first come first (a deque allocates)
        while (!stopped_) {
            const auto now = clock::now();
            if (!queue_.empty() && queue_.begin()->first <= now) {
                const entry_id id = queue_.begin()->second;
                dequeue(queue_.begin()->first, id);
                entry& e = entries_.at(id);
                e.fired = true;
                auto mark = std::move(e.on_deadline);
                running_ = id;
                lock.unlock();
                loss_notice notice;
                if (mark) {
                    notice = mark();
                }
                lock.lock();
                running_ = 0;
                forget(entries_.find(id));
                done_.notify_all();
                queue_or_run(lock, stops, std::move(notice.source), handlers,
                             std::move(notice.handler));
                continue;
            }
            if (!stops.empty() || !handlers.empty()) {
                lock.unlock();
                for (auto& source : stops) {
                    source.request_stop();
                }
                stops.clear();
                if (!handlers.empty()) {
                    auto handler = std::move(handlers.front());
                    handlers.erase(handlers.begin());
                    handler();
                }
                lock.lock();
                continue;
            }
            planned_wake_ = queue_.empty() ? now + idle_wake : queue_.begin()->first;
            wake_.wait_until(lock, planned_wake_);
        }
        thread_id_ = {};
    }

    // Queues what a marked loss still has to tell; what cannot be queued (out of memory) is told
    // at once, with `lock` released, its stop before its handler.
    static void queue_or_run(std::unique_lock<std::mutex>& lock,
                             std::vector<std::stop_source>& stops, std::stop_source source,
                             std::vector<std::function<void()>>& handlers,
                             std::function<void()> handler) noexcept {
        bool stop_now = false;
        if (source.stop_possible()) {
            try {
                stops.push_back(source);
            } catch (...) {
                stop_now = true;
            }
        }
        bool run_now = false;
        if (handler) {
            try {
                handlers.push_back(std::move(handler));
            } catch (...) {
                run_now = true;  // push_back left it as it was
            }
        }
        if (stop_now || run_now) {
            lock.unlock();
            if (stop_now) {
                source.request_stop();
            }
            if (run_now) {
                handler();
            }
            lock.lock();
        }
    }

    mutable std::mutex mutex_;
    std::condition_variable wake_;
    std::condition_variable done_;
    entry_map entries_;
    deadline_queue queue_;
    std::vector<entry_map::node_type> spare_entries_;
    std::vector<deadline_queue::node_type> spare_slots_;
    entry_id next_id_ = 1;
    entry_id running_ = 0;
    clock::time_point planned_wake_ = clock::time_point::min();
    bool stopped_ = false;
    owned_thread thread_;
    std::thread::id thread_id_;
};

}  // namespace redislock::detail
