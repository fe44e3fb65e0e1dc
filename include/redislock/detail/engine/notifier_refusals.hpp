// detail::notifier_refusals: the refusals of a channel (the server refused to subscribe it, no
// node serves it, its node failed) that the notifier has yet to tell its event hook, and the last
// one told of each channel, so that a cause that lasts (a server out of reach, a slot on the
// move) is told once, not at every try. Apart from the notifier because which refusals are told
// is a rule of its own; each member is called with the notifier's mutex held, which guards it.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/detail/waiting/backoff.hpp>

namespace redislock::detail {

class notifier_refusals {
public:
    /// Lock name, why.
    using list = std::vector<std::pair<std::string, std::string>>;

    /// Keeps a refusal of `channel`, of lock `name`, to be told, unless the same one was told
    /// within retell_after and the channel was not subscribed since. True when kept. Dropped
    /// when memory runs out.
    bool note(const std::string& channel, const std::string& name, std::string_view why) noexcept {
        const auto now = steady::now();
        if (auto told = told_.find(channel); told != told_.end() && told->second.why == why &&
                                             now - told->second.at < retell_after) {
            return false;
        }
        try {
            pending_.emplace_back(name, why);
        } catch (...) {
            return false;  // not told, so not remembered either
        }
        try {
            told_refusal& told = told_[channel];
            told.why.assign(why);
            told.at = now;
        } catch (...) {
            // Out of memory: the next refusal is told again.
        }
        return true;
    }

    /// `channel` was subscribed: its next refusal is told.
    void forget(const std::string& channel) { told_.erase(channel); }

    /// Forgets the refusals told longer than retell_after ago.
    void prune(steady::time_point now) {
        std::erase_if(told_, [&](const auto& t) { return now - t.second.at >= retell_after; });
    }

    /// Hands the refusals kept since the last call over to `out` (empty before).
    void take(list& out) noexcept { out.swap(pending_); }

    static constexpr std::chrono::minutes retell_after{1};

private:
    struct told_refusal {
        std::string why;
        steady::time_point at;
    };

    list pending_;                              // not yet told
    std::map<std::string, told_refusal> told_;  // per channel: the last refusal told
};

}  // namespace redislock::detail
