// detail::per_process<T>: an object that belongs to one process. After fork() the child's first
// use builds a fresh T and never touches the parent's copy: its mutexes may be locked by threads
// that do not exist in the child, and its condition variables may name their waiters, so even a
// notify on them can block forever. The parent's copy is leaked in the child on purpose. A T
// made by an inheriting factory is shown the parent's copy, to take what it can without waiting
// (try_lock only) and without touching anything else of it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include <redislock/detail/util/token.hpp>

namespace redislock::detail {

template <class T>
class per_process {
public:
    explicit per_process(std::function<std::unique_ptr<T>()> make)
        : per_process{std::function<std::unique_ptr<T>(T*)>{
              [make = std::move(make)](T*) { return make(); }}} {}

    /// `make` is given the parent's T when a child builds its own, null for the first T.
    explicit per_process(std::function<std::unique_ptr<T>(T* parent)> make)
        : make_{std::move(make)}, current_{new slot{make_(nullptr), current_fork_generation()}} {}
    per_process(const per_process&) = delete;
    per_process& operator=(const per_process&) = delete;
    ~per_process() {
        slot* s = current_.load(std::memory_order_acquire);
        if (s->generation != current_fork_generation()) {
            return;  // the parent's, never touched here
        }
        // A T that owns a thread may be destroyed from that very thread (a callback that drops
        // the last reference to its client): it is stopped and left allocated, since the thread
        // still runs its loop when the callback returns. What it holds (a notifier's subscriber
        // links, its pipe) stays open until the process exits: closing links after their
        // connection is gone is not safe.
        if constexpr (requires(T & t) {
                          t.runs_on_this_thread();
                          t.stop();
                      }) {
            if (s->value->runs_on_this_thread()) {
                s->value->stop();
                return;
            }
        }
        delete s;
    }

    /// The calling process's T, built on first use after a fork.
    T& get() {
        const std::uint64_t generation = current_fork_generation();
        slot* s = current_.load(std::memory_order_acquire);
        while (s->generation != generation) {
            auto* fresh = new slot{make_(s->value.get()), generation};
            if (current_.compare_exchange_strong(s, fresh, std::memory_order_acq_rel)) {
                return *fresh->value;  // the parent's slot stays allocated: see above
            }
            delete fresh;  // another thread of this child was first; s is its slot now
        }
        return *s->value;
    }

    T* operator->() { return &get(); }

private:
    struct slot {
        std::unique_ptr<T> value;
        std::uint64_t generation;
    };

    std::function<std::unique_ptr<T>(T*)> make_;
    std::atomic<slot*> current_;
};

}  // namespace redislock::detail
