// What the notifier keeps of each channel (its waiters, whether and where it is subscribed, when
// it failed and may be asked for again) and of each subscriber link (the subscriptions it awaits
// answers to) and paused node; and how a channel's loss or refusal wakes its waiters. Each record
// is guarded by the notifier's mutex that guards the map holding it.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <redislock/detail/engine/wake_slot.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/subscriber.hpp>

namespace redislock::detail {

enum class notifier_link_status { idle, wanted, sent, active, leaving };

struct notifier_channel {
    std::string name;  // the lock's, for a refusal's report
    std::map<std::string, std::shared_ptr<wake_slot>, std::less<>> waiters;
    notifier_link_status status = notifier_link_status::idle;
    std::string node;  // the link it was sent on
    steady::time_point failed_at{};
    steady::time_point retry_after{};  // not subscribed again before then
    steady::time_point unused_since = steady::now();
};

struct notifier_link {
    std::unique_ptr<subscriber_link> link;
    std::vector<std::string> awaiting;  // channels sent, in order, not yet confirmed
    bool answered = false;              // the server answered a subscription on it (yes or no)
    std::string lost_why;               // why it was dropped, when it was
};

// A node whose link could not be opened, or failed before the server answered a
// subscription on it: no link to it is opened before `until`.
struct notifier_node_pause {
    steady::time_point until;
    std::string why;  // as its waiters are told
};

// Needs mutex_. Marks the channel's waiters unsubscribed and wakes them. Allocates nothing,
// so a link's loss is handled even out of memory. No thread takes mutex_ or links_mutex_
// while it holds a waiter's mutex, so waking under them cannot deadlock.
inline void wake_all_locked(notifier_channel& ch) noexcept {
    for (auto& [id, slot] : ch.waiters) {
        slot->set_subscribed(false);
        slot->wake();
    }
}

// Needs mutex_. `ch` is no longer subscribed (as of `now`): its waiters, who may have missed
// a message or still wait in enroll(), are woken to try again.
inline void fail_locked(notifier_channel& ch, steady::time_point now) noexcept {
    ch.status = notifier_link_status::idle;
    ch.node.clear();
    ch.failed_at = now;
    wake_all_locked(ch);
}

// Needs mutex_. Leaves `ch` unsubscribed until `pause` has passed; its waiters poll.
inline void refuse_locked(notifier_channel& ch, steady::duration pause) noexcept {
    const auto now = steady::now();
    fail_locked(ch, now);
    ch.retry_after = std::max(ch.retry_after, now + pause);
}

}  // namespace redislock::detail
