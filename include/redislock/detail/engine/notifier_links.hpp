// The subscriber-link side of detail::notifier: how its thread (or a spinning waiter, for the
// links whose read cannot block) opens, writes, reads and drops the links, one per node, pauses a
// node whose link failed, and what each reply does to the channels it subscribes: a release's
// message wakes the waiters it names, a refusal or a lost link makes them poll or try again.
// Apart from notifier.hpp, which holds the class, its waiters' side and the thread's rounds,
// because the links' invariants are their own: links_ and paused_ are guarded by links_mutex_,
// taken before the notifier's mutex. Included at the end of notifier.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/detail/engine/notifier.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/reply.hpp>
#include <redislock/subscriber.hpp>

namespace redislock::detail {

// Needs links_mutex_. Reads the links (on a spinner's thread, only those whose read cannot
// block); drops those that are lost.
inline void notifier::read_links_locked(bool spinner) {
    for (auto it = links_.begin(); it != links_.end();) {
        if (spinner && !it->second.link->reads_without_blocking()) {
            ++it;
        } else if (!drain(it->first, it->second)) {
            it = drop_link_locked(it);
        } else {
            ++it;
        }
    }
}

// Called with no lock held. Skips a channel no longer wanted (a link of its node failed, or
// its node was paused, since it was planned). False when an open was tried and failed.
inline bool notifier::open_link(const std::string& channel, steady::time_point retry_at) {
    if (steady::now() < retry_at) {
        return true;
    }
    std::string node;
    {
        std::lock_guard guard{mutex_};
        auto it = channels_.find(channel);
        if (it == channels_.end() || it->second.status != link_status::wanted) {
            return true;
        }
        node = it->second.node;
    }
    {
        // Only this thread adds links: one missing now is still missing below.
        std::lock_guard reading{links_mutex_};
        if (links_.count(node) != 0) {
            return true;
        }
    }
    const auto started = steady::now();
    std::string why = "could not open a subscriber link: ";
    try {
        std::unique_ptr<subscriber_link> link = open_(channel);
        if (link) {
            {
                std::lock_guard reading{links_mutex_};
                links_[node].link = std::move(link);
            }
            poke();  // the next round subscribes the node's channels at once, not a tick later
            return true;
        }
        why += "the connection opened none";
    } catch (...) {
        try {
            why += message_of_current_exception();
        } catch (...) {
            // Out of memory: told without the reason.
        }
    }
    std::lock_guard reading{links_mutex_};
    fail_node_locked(node, why, steady::now() - started);
    return false;
}

// Needs links_mutex_. Drops link `it`, whose drain failed or whose send threw; one on which
// the server never answered a subscription counts as a failed open (a server at maxclients
// accepts, answers with an error and closes). Returns the next link.
inline auto notifier::drop_link_locked(std::map<std::string, link_state>::iterator it) noexcept
    -> std::map<std::string, link_state>::iterator {
    bool unsupported = false;  // told already; every waiter polls from now on
    {
        std::lock_guard guard{mutex_};
        unsupported = unsupported_;
    }
    if (it->second.answered || unsupported) {
        lose(it->first);
    } else {
        constexpr std::string_view failed = "the subscriber link failed before subscribing";
        std::string why;
        try {
            why.append(failed);
            if (!it->second.lost_why.empty()) {
                why.append(": ").append(it->second.lost_why);
            }
        } catch (...) {
            why.clear();  // out of memory: told without the reason
        }
        fail_node_locked(it->first, why.empty() ? failed : why, steady::duration::zero());
    }
    return links_.erase(it);
}

// Needs links_mutex_. A link to `node` could not be opened, or failed before the server
// answered a subscription on it (`why`, after `took`): no link to it is opened again before
// retry_pause, or as long as the failed open took (up to max_pause), so that a node whose
// opens time out holds this thread up at most half the time. Meanwhile its channels' waiters
// poll, and those of each channel someone waits for are told.
inline void notifier::fail_node_locked(const std::string& node, std::string_view why,
                                       steady::duration took) noexcept {
    const auto now = steady::now();
    const auto until = now + std::clamp<steady::duration>(took, retry_pause, max_pause);
    try {
        node_pause& paused = paused_[node];
        paused.why.assign(why);
        paused.until = until;
    } catch (...) {
        // Out of memory: paused as briefly as can be.
    }
    {
        std::lock_guard guard{mutex_};
        for (auto& [channel, ch] : channels_) {
            if (ch.node != node) {
                continue;
            }
            const bool asked = ch.status == link_status::wanted || ch.status == link_status::sent;
            if (asked && !ch.waiters.empty()) {
                note_refusal_locked(channel, ch, why);
            }
            // Named again after retry_pause at most: its slot may have moved to another
            // node meanwhile (a failover); the node's pause keeps this one from reopening.
            refuse_locked(ch, std::min<steady::duration>(until - now, retry_pause));
        }
    }
    settled_.notify_all();
}

// Needs links_mutex_. Skips a channel whose link failed since it was planned.
inline void notifier::send(const std::string& channel, const std::string& verb) {
    std::string node;
    {
        std::lock_guard guard{mutex_};
        auto it = channels_.find(channel);
        const auto planned = verb == "SSUBSCRIBE" ? link_status::sent : link_status::leaving;
        if (it == channels_.end() || it->second.status != planned) {
            return;
        }
        node = it->second.node;
    }
    auto link = links_.find(node);
    if (link == links_.end()) {
        return;
    }
    try {
        const std::array<std::string_view, 2> argv{verb, channel};
        link->second.link->send(argv);
        if (verb == "SSUBSCRIBE") {
            link->second.awaiting.push_back(channel);
        }
    } catch (...) {
        try {
            link->second.lost_why = message_of_current_exception();
        } catch (...) {
        }
        (void)drop_link_locked(link);
    }
}

// Reads a link's input; false when the link is lost. A reply that cannot be handled (out
// of memory) loses the link too: its waiters then try again and subscribe anew, instead of
// waiting for a message that was read and dropped.
inline bool notifier::drain(const std::string& node, link_state& state) noexcept {
    try {
        std::vector<reply> replies;
        state.link->read(replies);
        for (const reply& r : replies) {
            if (!handle(node, state, r)) {
                if (r.is_error()) {
                    state.lost_why = r.text();
                }
                return false;
            }
        }
    } catch (...) {
        try {
            state.lost_why = message_of_current_exception();
        } catch (...) {
        }
        return false;
    }
    return true;
}

// One reply on a link; false when the link must be dropped.
inline bool notifier::handle(const std::string& node, link_state& state, const reply& r) {
    if (r.is_error()) {
        // Replies to SSUBSCRIBE come in the order sent: this one refuses the oldest. A server
        // without sharded pub/sub refuses every channel: poll from now on. A channel refused
        // otherwise (NOPERM under an ACL, MOVED while its slot moves) is left alone for a
        // while; its waiters poll meanwhile.
        if (r.text().find("unknown command") != std::string::npos) {
            std::lock_guard guard{mutex_};
            if (!state.awaiting.empty()) {
                if (auto it = channels_.find(state.awaiting.front());
                    it != channels_.end() && !it->second.waiters.empty()) {
                    note_refusal_locked(it->first, it->second, r.text());
                }
            }
            unsupported_ = true;
            settled_.notify_all();
            return false;
        }
        // An error that is not about the channel, on a link that has had no answer yet (a
        // server at maxclients answers so and closes), is the link's failure: an open that
        // failed.
        static constexpr std::array<std::string_view, 6> about_the_channel{
            "NOPERM", "MOVED", "ASK", "TRYAGAIN", "CROSSSLOT", "CLUSTERDOWN"};
        const bool about_channel =
            std::any_of(about_the_channel.begin(), about_the_channel.end(),
                        [&](std::string_view code) { return r.is_error_code(code); });
        if (state.awaiting.empty() || (!state.answered && !about_channel)) {
            return false;
        }
        state.answered = true;
        const std::string channel = state.awaiting.front();
        state.awaiting.erase(state.awaiting.begin());
        refuse(channel, r.is_error_code("NOPERM") ? refused_pause : retry_pause, r.text());
        return true;
    }
    if (!r.is_array() || r.elements().size() < 3) {
        return true;
    }
    const std::string kind = r.elements()[0].text();
    const std::string channel = r.elements()[1].text();
    if (kind == "smessage") {
        deliver(channel, r.elements()[2].text());
    } else if (kind == "ssubscribe") {
        // The oldest one sent: a channel may await two answers (sent again after a drop).
        if (auto sent = std::find(state.awaiting.begin(), state.awaiting.end(), channel);
            sent != state.awaiting.end()) {
            state.awaiting.erase(sent);
        }
        state.answered = true;
        paused_.erase(node);  // needs links_mutex_, held by whoever drains the link
        std::lock_guard guard{mutex_};
        if (auto it = channels_.find(channel); it != channels_.end()) {
            it->second.status = link_status::active;
            it->second.node = node;
            refusals_.forget(channel);
            for (auto& [id, slot] : it->second.waiters) {
                slot->set_subscribed(true);
            }
        }
        settled_.notify_all();
    } else if (kind == "sunsubscribe") {
        {
            std::lock_guard guard{mutex_};
            auto it = channels_.find(channel);
            if (it == channels_.end()) {
                return true;
            }
            channel_state& ch = it->second;
            if (ch.status == link_status::leaving) {
                // Someone enrolled while it was leaving: subscribe again (this may run on a
                // spinner's thread, so the notifier's thread is told).
                ch.status = ch.waiters.empty() ? link_status::idle : link_status::wanted;
                if (ch.status == link_status::wanted) {
                    poke();
                }
                return true;
            }
            // The server dropped it (its slot moved to another node): waiters may have
            // missed a message; they try again and subscribe where the slot is now. One
            // still waiting in enroll() for its confirmation is let go too.
            fail_locked(ch, steady::now());
        }
        settled_.notify_all();
    }
    return true;
}

// A release's message: waiter ids that may go, and '?'-prefixed standbys.
inline void notifier::deliver(const std::string& channel, std::string_view message) {
    std::vector<std::pair<std::shared_ptr<wake_slot>, bool>> woken;
    {
        std::lock_guard guard{mutex_};
        auto it = channels_.find(channel);
        if (it == channels_.end()) {
            return;
        }
        while (!message.empty()) {
            const auto space = message.find(' ');
            std::string_view word = message.substr(0, space);
            message =
                space == std::string_view::npos ? std::string_view{} : message.substr(space + 1);
            const bool standby = !word.empty() && word.front() == '?';
            if (standby) {
                word.remove_prefix(1);
            }
            if (auto w = it->second.waiters.find(word); w != it->second.waiters.end()) {
                woken.emplace_back(w->second, standby);
            }
        }
    }
    for (auto& [slot, standby] : woken) {
        if (standby) {
            slot->standby();
        } else {
            slot->wake();
        }
    }
}

// The server refused to subscribe `channel` (`why`): its waiters poll until `pause` has
// passed.
inline void notifier::refuse(const std::string& channel, steady::duration pause,
                             std::string_view why) {
    {
        std::lock_guard guard{mutex_};
        auto it = channels_.find(channel);
        if (it == channels_.end()) {
            return;
        }
        if (!it->second.waiters.empty()) {
            note_refusal_locked(channel, it->second, why);
        }
        refuse_locked(it->second, pause);
    }
    settled_.notify_all();
}

// A link is gone: its channels are no longer subscribed and their waiters, who may have
// missed a message, try again.
inline void notifier::lose(const std::string& node) noexcept {
    fail_channels_of(node);
}

inline void notifier::fail_channels_of(const std::string& node) noexcept {
    {
        std::lock_guard guard{mutex_};
        const auto now = steady::now();
        for (auto& [name, ch] : channels_) {
            if (ch.node != node) {
                continue;
            }
            fail_locked(ch, now);
        }
    }
    settled_.notify_all();
}
}  // namespace redislock::detail
