// detail::fork_local<T>: one T per process, made on first use, for objects that own threads.
//
// fork() copies only the calling thread, so a child must never touch an object whose threads
// stayed behind in its parent: their queues may be locked, and joining them would wait forever.
// get() in a child makes a fresh T for it and leaves the parent's copy alone (leaked: its
// memory and descriptors stay until the child exits, which is cheaper than any cleanup that
// could deadlock).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include <redislock/detail/token.hpp>

namespace redislock::detail {

template <class T>
class fork_local {
public:
    explicit fork_local(std::function<std::unique_ptr<T>()> make) : make_{std::move(make)} {
        (void)current_fork_generation();  // registers the fork handler before any fork()
    }

    fork_local(const fork_local&) = delete;
    fork_local& operator=(const fork_local&) = delete;

    ~fork_local() {
        holder* p = current_.load(std::memory_order_acquire);
        if (p != nullptr && p->generation == current_fork_generation()) {
            delete p;
        }
    }

    /// This process's T, made now if this process has none yet.
    /// @throws whatever making a T throws.
    T& get() {
        const std::uint64_t generation = current_fork_generation();
        holder* p = current_.load(std::memory_order_acquire);
        if (p != nullptr && p->generation == generation) {
            return *p->value;
        }
        auto fresh = std::make_unique<holder>(holder{generation, make_()});
        if (current_.compare_exchange_strong(p, fresh.get(), std::memory_order_acq_rel)) {
            return *fresh.release()->value;
        }
        return *p->value;  // another thread of this process made it first
    }

    /// This process's T if it has been made, else nullptr; never makes one.
    T* get_if_made() noexcept {
        holder* p = current_.load(std::memory_order_acquire);
        return p != nullptr && p->generation == current_fork_generation() ? p->value.get()
                                                                          : nullptr;
    }

private:
    struct holder {
        std::uint64_t generation;
        std::unique_ptr<T> value;
    };

    std::function<std::unique_ptr<T>()> make_;
    std::atomic<holder*> current_{nullptr};
};

}  // namespace redislock::detail
