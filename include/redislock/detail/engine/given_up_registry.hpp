// detail::given_up_registry: the acquisitions of reentrant and read-write locks that an object of
// this client gave up with their outcome unknown (an attempt whose reply was lost or came after
// the caller's deadline, a release that could not be finished). Their entry may be in Redis, held
// by no object, until the reaper leaves it or its lease ends. Every object of the client names
// them in its next outermost acquisition of that name for that owner, which then takes such an
// entry over instead of joining it: joined, the reaper's leave of the given-up acquisition would
// take the new hold with it, and the new hold's release would leave the given-up entries behind.
//
// Owner ids are the client's own (instance id and thread, or lock_options::owner), so only this
// client's objects can meet these entries as their own. An owner shared by several threads
// (lock_options::owner) may have joined such an entry from another thread before it was given
// up: that hold is lost to the take-over as it would be to the reaper's leave (see
// recursive_mutex.hpp). Each id is kept until the lease of its acquisition ends, after which no
// entry of it can be in Redis; none is dropped before, however many an outage gives up (a
// dropped one could be joined again). Thread-safe; one per process (see per_process.hpp), so a
// child after fork() starts with none, and its owners are its own.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace redislock::detail {

class given_up_registry {
    using steady = std::chrono::steady_clock;

public:
    /// Remembers `acquisition` of `owner` on `name` until `until`. Never throws: out of memory,
    /// the id is not remembered (the object that gave it up still names it).
    void remember(std::string_view name, std::string_view owner, std::string_view acquisition,
                  steady::time_point until) noexcept {
        try {
            std::lock_guard guard{mutex_};
            prune(steady::now());
            ids_.push_back({key_of(name, owner), std::string{acquisition}, until});
            empty_.store(false, std::memory_order_release);
        } catch (...) {
        }
    }

    /// Appends the ids remembered for `owner` on `name` to `out`, space-separated.
    void append_to(std::string_view name, std::string_view owner, std::string& out) {
        if (empty_.load(std::memory_order_acquire)) {
            return;  // the common case: nothing given up, no lock taken
        }
        std::lock_guard guard{mutex_};
        prune(steady::now());
        const std::string key = key_of(name, owner);
        for (const given_up& g : ids_) {
            if (g.key == key) {
                out.append(out.empty() ? "" : " ").append(g.acquisition);
            }
        }
    }

private:
    struct given_up {
        std::string key;  // name and owner
        std::string acquisition;
        steady::time_point until;
    };

    static std::string key_of(std::string_view name, std::string_view owner) {
        std::string key;
        key.reserve(name.size() + owner.size() + 1);
        key.append(name).append(1, '\n').append(owner);
        return key;
    }

    void prune(steady::time_point now) noexcept {
        std::erase_if(ids_, [now](const given_up& g) { return g.until <= now; });
        empty_.store(ids_.empty(), std::memory_order_release);
    }

    std::mutex mutex_;
    std::vector<given_up> ids_;
    std::atomic<bool> empty_{true};
};

}  // namespace redislock::detail
