// detail::given_up_registry: the attempts of reentrant and read-write locks that an object of
// this client gave up with their outcome unknown (a reply lost, or come after the caller's
// deadline). Each attempt's first entry may be in Redis, or land there later, held by no object,
// and another object of the owner may join it. The reaper sends its leave; until the attempt's
// lease ends every object of the client also names it, by the attempt's id, in its next
// outermost acquisition of that name for that owner, which leaves that one entry if it is still
// counted (the scripts keep the ids of the first entries an entry counts, and take an id out
// with its entry), then joins what remains: what other objects joined stays theirs. (Left
// whole, or taken over, the entry would take their holds with it.)
//
// Owner ids are the client's own (instance id and thread, or lock_options::owner), so only this
// client's objects can meet these entries as their own. Naming an attempt twice leaves nothing
// more, so each is kept until its lease ends, however many an outage gives up; one that lands
// after that joins the entries it finds and is left with them at the latest when their lease
// ends. Thread-safe; one per process (see per_process.hpp), so a child after fork() starts with
// none, and its owners are its own.
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
    /// Remembers the attempt `item` of `owner` on `name` until `until`. Never throws: out of
    /// memory, it is not remembered (the object that gave it up still names it).
    void remember(std::string_view name, std::string_view owner, std::string_view item,
                  steady::time_point until) noexcept {
        try {
            std::lock_guard guard{mutex_};
            prune(steady::now());
            items_.push_back({key_of(name, owner), std::string{item}, until});
            empty_.store(false, std::memory_order_release);
        } catch (...) {
        }
    }

    /// Appends the items remembered for `owner` on `name` to `out`, space-separated, but those
    /// `out` names already (the object's own).
    void append_to(std::string_view name, std::string_view owner, std::string& out) {
        if (empty_.load(std::memory_order_acquire)) {
            return;  // the common case: nothing given up, no lock taken
        }
        std::lock_guard guard{mutex_};
        prune(steady::now());
        const std::string key = key_of(name, owner);
        for (const given_up& g : items_) {
            if (g.key == key && out.find(g.item) == std::string::npos) {
                out.append(out.empty() ? "" : " ").append(g.item);
            }
        }
    }

private:
    struct given_up {
        std::string key;  // name and owner
        std::string item;
        steady::time_point until;
    };

    static std::string key_of(std::string_view name, std::string_view owner) {
        std::string key;
        key.reserve(name.size() + owner.size() + 1);
        key.append(name).append(1, '\n').append(owner);
        return key;
    }

    void prune(steady::time_point now) noexcept {
        std::erase_if(items_, [now](const given_up& g) { return g.until <= now; });
        empty_.store(items_.empty(), std::memory_order_release);
    }

    std::mutex mutex_;
    std::vector<given_up> items_;
    std::atomic<bool> empty_{true};
};

}  // namespace redislock::detail
