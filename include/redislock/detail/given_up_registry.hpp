// detail::given_up_registry: the acquisitions of reentrant and read-write locks that an object of
// this client gave up with their outcome unknown (an attempt whose reply was lost or came after
// the caller's deadline, a release that could not be finished). Their entry may be in Redis, held
// by no object, until the reaper leaves it or its lease ends. Every object of the client names
// them in its next outermost acquisition of that name for that owner, which then takes such an
// entry over instead of joining it: joined, the reaper's leave of the given-up acquisition would
// take the new hold with it, and the new hold's release would leave the given-up entries behind.
//
// Owner ids are the client's own (instance id and thread, or lock_options::owner), so only this
// client's objects can meet these entries as their own. Each id is kept until the lease of its
// acquisition ends, after which no entry of it can be in Redis; a few per name and owner at most
// (the oldest go first: by then they are reaped or expired). Thread-safe; one per process (see
// per_process.hpp), so a child after fork() starts with none, and its owners are its own.
#pragma once

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <redislock/detail/wait.hpp>

namespace redislock::detail {

class given_up_registry {
public:
    /// Remembers `acquisition` of `owner` on `name` until `until`. Never throws: out of memory,
    /// the id is not remembered (the object that gave it up still names it).
    void remember(std::string_view name, std::string_view owner, std::string_view acquisition,
                  steady::time_point until) noexcept {
        try {
            std::lock_guard guard{mutex_};
            prune(steady::now());
            std::string key = key_of(name, owner);
            std::size_t same_key = 0;
            for (const given_up& g : ids_) {
                same_key += g.key == key ? 1 : 0;
            }
            if (same_key >= most_per_key) {
                ids_.erase(std::find_if(ids_.begin(), ids_.end(),
                                        [&](const given_up& g) { return g.key == key; }));
            }
            ids_.push_back({std::move(key), std::string{acquisition}, until});
        } catch (...) {
        }
    }

    /// Appends the ids remembered for `owner` on `name` to `out`, space-separated.
    void append_to(std::string_view name, std::string_view owner, std::string& out) {
        std::lock_guard guard{mutex_};
        if (ids_.empty()) {
            return;
        }
        prune(steady::now());
        const std::string key = key_of(name, owner);
        for (const given_up& g : ids_) {
            if (g.key == key) {
                out.append(out.empty() ? "" : " ").append(g.acquisition);
            }
        }
    }

private:
    static constexpr std::size_t most_per_key = 8;

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
    }

    std::mutex mutex_;
    std::vector<given_up> ids_;
};

}  // namespace redislock::detail
