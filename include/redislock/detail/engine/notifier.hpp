// detail::notifier: the subscriber side of notified waiting. One thread per client (per process)
// holds a subscriber link per node, subscribes (SSUBSCRIBE) to the client's own channel beside
// every lock someone waits for, and wakes the waiters a release names. A channel stays subscribed
// for a while after its last waiter left, so a busy lock does not pay a subscription per wait.
//
// The client's channel is the lock's release channel followed by ':<tag>', the tag being random
// per client and process, and each waiter id ends in '@<tag>'. A release publishes each id it
// names on its waiter's channel: the message reaches the one client it concerns, where one channel
// shared by all would be written to, and wake a reader in, every client waiting for the lock.
//
// A waiter is woken when a release names it, when a release names it as standby (it then checks
// once the grace of the waiters before it is over), and when its link is lost (a message may have
// been missed): it then tries again and re-enrolls, which subscribes anew.
//
// A hand-over usually comes within a few round trips. So a waiter first spins for a while
// (client_options::wait_spin), yielding the CPU to any other runnable thread and reading the
// links itself, while the notifier's thread leaves them alone: the message then reaches the
// waiter without waking a sleeping thread, let alone two, which on a busy machine costs more
// than the round trips. Links whose read may block (TLS) are read by the notifier's thread only.
#pragma once

#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <fcntl.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/detail/engine/notifier_records.hpp>
#include <redislock/detail/engine/wake_slot.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/subscriber.hpp>

namespace redislock::detail {

class notifier {
public:
    /// Opens a link to the node that serves `channel`; null when the connection cannot.
    using opener = std::function<std::unique_ptr<subscriber_link>(std::string_view channel)>;
    /// Names the node that serves `channel`: waiters of one node share its link.
    using node_namer = std::function<std::string(std::string_view channel)>;
    /// Told, on the notifier's thread with no lock held, that the channel of lock `name`'s
    /// waiters was refused (`why`): they poll until it is asked for again.
    using refusal_reporter = std::function<void(std::string_view name, std::string_view why)>;

    notifier(opener open, node_namer node_of, steady::duration spin = {},
             refusal_reporter report = {})
        : open_{std::move(open)},
          node_of_{std::move(node_of)},
          report_{std::move(report)},
          spin_{spin} {}
    notifier(const notifier&) = delete;
    notifier& operator=(const notifier&) = delete;
    ~notifier() {
        stop();
        if (thread_.joinable()) {
            thread_.join();
        }
        close_pipe();
    }

    /// False when this connection cannot subscribe: waiters poll.
    bool available() const noexcept { return static_cast<bool>(open_); }

    /// What ends the waiter ids of this client ('@<tag>'), so that releases tell them on
    /// listen_channel().
    std::string_view id_suffix() const noexcept { return id_suffix_; }

    /// The channel on which this client hears the releases of the lock whose release channel is
    /// `release_channel`: in its hash slot, this client's alone.
    std::string listen_channel(std::string_view release_channel) const {
        std::string channel{release_channel};
        channel.append(":").append(id_suffix_.substr(1));
        return channel;
    }

    /// Registers `slot` as waiter `id` of lock `name` on `channel` and subscribes the channel if
    /// it is not yet, waiting for the server's confirmation until `until` or a stop request. True
    /// when subscribed: a release that names `id` from now on wakes the slot. Left registered
    /// either way until withdraw().
    bool enroll(const std::string& channel, std::string_view name, const std::string& id,
                const std::shared_ptr<wake_slot>& slot, steady::time_point until,
                const std::stop_token& stop) {
        if (!available()) {
            return false;
        }
        std::unique_lock lock{mutex_};
        if (stopping_ || unsupported_ || !start_locked()) {
            return false;
        }
        channel_state& ch = channels_[channel];
        if (ch.name.empty()) {
            ch.name = name;
        }
        ch.waiters[id] = slot;
        if (ch.status == link_status::active) {
            slot->set_subscribed(true);
            return true;
        }
        if (steady::now() < ch.retry_after) {
            return false;  // refused lately (no rights to the channel, a slot on the move): poll
        }
        if (ch.status == link_status::idle) {
            ch.status = link_status::wanted;
            poke();
        }
        const auto since = steady::now();
        const auto settled = [&] {
            auto it = channels_.find(channel);
            return stopping_ || unsupported_ || it == channels_.end() ||
                   it->second.status == link_status::active || it->second.failed_at >= since;
        };
        const bool done = stop.stop_possible() ? settled_.wait_until(lock, stop, until, settled)
                                               : settled_.wait_until(lock, until, settled);
        auto it = channels_.find(channel);
        const bool on = done && it != channels_.end() && it->second.status == link_status::active;
        slot->set_subscribed(on);
        return on;
    }

    /// Waits on `slot` as wake_slot::sleep_until() does. A subscribed waiter first spins for up to
    /// the client's wait_spin, reading the links itself (see the top of this file).
    bool wait(wake_slot& slot, steady::time_point until, const std::stop_token& stop) {
        if (spin_ > steady::duration::zero() && slot.subscribed() && !slot.signalled()) {
            const struct spinning {
                explicit spinning(notifier& n) : n{n} {
                    if (n.spinners_.fetch_add(1, std::memory_order_acq_rel) == 0) {
                        n.poke();  // its thread may sleep in poll() on the links: not any more
                    }
                }
                ~spinning() { n.spinners_.fetch_sub(1, std::memory_order_acq_rel); }
                notifier& n;
            } spin{*this};
            const auto limit = std::min(until, steady::now() + spin_);
            while (!slot.signalled() && !stop.stop_requested() && steady::now() < limit) {
                if (std::unique_lock reading{links_mutex_, std::try_to_lock}) {
                    read_links_locked(true);
                }
                if (!slot.signalled()) {
                    ::sched_yield();
                }
            }
        }
        return slot.sleep_until(until, stop);
    }

    /// Unregisters waiter `id` of `channel`; the channel lingers subscribed for a while.
    void withdraw(const std::string& channel, const std::string& id) {
        std::lock_guard guard{mutex_};
        auto it = channels_.find(channel);
        if (it == channels_.end()) {
            return;
        }
        it->second.waiters.erase(id);
        if (it->second.waiters.empty()) {
            it->second.unused_since = steady::now();
        }
    }

    /// Ends the thread; later enrollments fail (waiters poll).
    void stop() noexcept {
        {
            std::lock_guard guard{mutex_};
            stopping_ = true;
        }
        settled_.notify_all();
        poke();
    }

    bool runs_on_this_thread() const noexcept {
        return thread_.get_id() == std::this_thread::get_id();
    }

    /// How long an unused channel stays subscribed.
    static constexpr std::chrono::seconds linger{5};

private:
    using link_status = notifier_link_status;
    using channel_state = notifier_channel;
    using link_state = notifier_link;
    using node_pause = notifier_node_pause;

    // Needs mutex_. Starts the thread on first use.
    bool start_locked() {
        if (thread_.joinable()) {
            return true;
        }
        if (::pipe(pipe_) != 0) {
            return false;
        }
        for (int fd : pipe_) {
            ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
            ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
        try {
            thread_ = std::thread{[this] { run(); }};
        } catch (...) {
            close_pipe();
            return false;
        }
        return true;
    }

    void poke() noexcept {
        poked_.store(true, std::memory_order_release);
        if (pipe_[1] >= 0) {
            const char byte = 1;
            [[maybe_unused]] const auto ignored = ::write(pipe_[1], &byte, 1);
        }
    }

    void close_pipe() noexcept {
        for (int& fd : pipe_) {
            if (fd >= 0) {
                ::close(fd);
                fd = -1;
            }
        }
    }

    // Whatever else a round throws (out of memory) would end the process on this thread:
    // instead every link is dropped, and waiters try again and poll a while.
    void run() {
        auto retry_at = steady::time_point{};
        for (;;) {
            try {
                if (!run_round(retry_at)) {
                    return;
                }
            } catch (...) {
                if (stopped()) {
                    return;  // the links' connection may be gone (see report_refusals)
                }
                retry_at = steady::now() + retry_pause;
                reset();
                pollfd pipe{pipe_[0], POLLIN, 0};
                if (::poll(&pipe, 1, static_cast<int>(retry_pause.count())) > 0) {
                    empty_pipe();
                }
            }
        }
    }

    // One round: plans, opens and sends, waits for input, reads it. False once stopping.
    bool run_round(steady::time_point retry_at) {
        std::vector<std::pair<std::string, std::string>> to_send;  // channel, command
        std::vector<std::string> to_open;
        {
            std::lock_guard reading{links_mutex_};
            std::lock_guard guard{mutex_};
            if (stopping_) {
                return false;
            }
            plan_locked(to_send, to_open, retry_at);
        }
        // With no lock held: opening may resolve a master and tell the event hook. An open that
        // failed slowly (a node that does not answer) ends the opening for this round: the links
        // already open are served first, and that node's pause lets the others go next.
        for (const std::string& channel : to_open) {
            const auto started = steady::now();
            const bool failed = !open_link(channel, retry_at);
            if (stopped()) {
                return false;  // see report_refusals
            }
            if (failed && steady::now() - started >= tick) {
                poke();  // the next round opens the others at once
                break;
            }
        }
        if (!report_refusals()) {
            return false;
        }
        // A spinner that starts after this pokes the pipe; a link it drops meanwhile only
        // ends the wait below early (its fd reports POLLNVAL).
        const bool spinning = spinners_.load(std::memory_order_acquire) > 0;
        std::vector<pollfd> fds{{pipe_[0], POLLIN, 0}};
        bool buffered = false;
        {
            std::lock_guard reading{links_mutex_};
            for (auto& [channel, verb] : to_send) {
                send(channel, verb);
            }
            for (const auto& [node, state] : links_) {
                if (!spinning || !state.link->reads_without_blocking()) {
                    fds.push_back({state.link->fd(), POLLIN, 0});
                    buffered = buffered || state.link->buffered();
                }
            }
        }
        if (spinning) {
            wait_while_spinning(fds, buffered);
        } else {
            wait_for_input(fds, buffered);
        }
        {
            std::lock_guard reading{links_mutex_};
            read_links_locked(false);
        }
        return report_refusals();
    }

    // Needs mutex_. Keeps a refusal of `channel` for report_refusals(), unless the same one was
    // told within retell_after and the channel was not subscribed since: a cause that lasts (a
    // server out of reach, a slot on the move) is told once, not at every try. Dropped when
    // memory runs out.
    void note_refusal_locked(const std::string& channel, const channel_state& ch,
                             std::string_view why) noexcept {
        if (!report_) {
            return;
        }
        const auto now = steady::now();
        if (auto told = told_.find(channel); told != told_.end() && told->second.why == why &&
                                             now - told->second.at < retell_after) {
            return;
        }
        try {
            refusals_.emplace_back(ch.name, why);
        } catch (...) {
            return;  // not told, so not remembered either
        }
        poke();  // refused on a spinner's thread: this thread tells it soon
        try {
            told_refusal& told = told_[channel];
            told.why.assign(why);
            told.at = now;
        } catch (...) {
            // Out of memory: the next refusal is told again.
        }
    }

    // In a catch block: what the exception says.
    static std::string_view message_of_current_exception() noexcept {
        try {
            throw;
        } catch (const std::exception& e) {
            return e.what();
        } catch (...) {
            return "an exception that is not a std::exception";
        }
    }

    bool stopped() {
        std::lock_guard guard{mutex_};
        return stopping_;
    }

    // Tells the refusals noted since the last call, with no lock held. False once stopping: a
    // hook (this one, or one a connection told while opening a link) may have dropped the last
    // reference to the client, whose event sink and connection are then gone, and this thread
    // must touch neither again.
    bool report_refusals() {
        std::vector<std::pair<std::string, std::string>> told;
        {
            std::lock_guard guard{mutex_};
            if (stopping_) {
                return false;
            }
            told.swap(refusals_);
        }
        for (const auto& [name, why] : told) {
            try {
                report_(name, why);
            } catch (...) {
            }
            std::lock_guard guard{mutex_};
            if (stopping_) {
                return false;
            }
        }
        return true;
    }

    // After a failed round: no link, and no channel subscribed again before retry_pause has
    // passed (a refused one keeps its longer pause); every waiter tries again (a message may be
    // missing) and polls meanwhile.
    void reset() noexcept {
        std::lock_guard reading{links_mutex_};
        links_.clear();
        std::lock_guard guard{mutex_};
        for (auto& [name, ch] : channels_) {
            refuse_locked(ch, retry_pause);
        }
        settled_.notify_all();
    }

    // While waiters spin they read the links they can: this thread watches the pipe and the
    // other links without sleeping (one that sleeps must be woken), until the last spinner
    // stops, input comes, or a tick has passed (planning runs at least that often).
    void wait_while_spinning(std::vector<pollfd>& fds, bool buffered) {
        const auto tick_over = steady::now() + tick;
        while (!buffered && spinners_.load(std::memory_order_acquire) > 0 &&
               steady::now() < tick_over) {
            // With no link of its own to watch, the pipe is polled only once poked.
            const bool look = fds.size() > 1 || poked_.load(std::memory_order_acquire);
            if (look && ::poll(fds.data(), fds.size(), 0) > 0) {
                if ((fds[0].revents & POLLIN) != 0) {
                    empty_pipe();
                }
                return;
            }
            ::sched_yield();
        }
    }

    // Needs links_mutex_. Reads the links (on a spinner's thread, only those whose read cannot
    // block); drops those that are lost.
    void read_links_locked(bool spinner) {
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

    // Decides, under both mutexes, which channels to subscribe or leave and which links to open.
    void plan_locked(std::vector<std::pair<std::string, std::string>>& to_send,
                     std::vector<std::string>& to_open, steady::time_point retry_at) {
        const auto now = steady::now();
        std::vector<std::string> retried;  // channels of nodes that failed lately: opened last
        if (now - last_pruned_ >= std::chrono::seconds{1}) {
            last_pruned_ = now;
            std::erase_if(told_, [&](const auto& t) { return now - t.second.at >= retell_after; });
            std::erase_if(paused_,
                          [&](const auto& p) { return now - p.second.until >= max_pause; });
        }
        for (auto it = channels_.begin(); it != channels_.end();) {
            channel_state& ch = it->second;
            if (ch.status == link_status::wanted && now >= ch.retry_after) {
                if (ch.node.empty() && node_of_) {
                    try {
                        ch.node = node_of_(it->first);
                        if (ch.node.empty() && !ch.waiters.empty()) {
                            note_refusal_locked(it->first, ch,
                                                "no node serves the channel's slot now");
                        }
                    } catch (...) {
                        if (!ch.waiters.empty()) {
                            note_refusal_locked(it->first, ch, message_of_current_exception());
                        }
                    }
                    if (ch.node.empty()) {
                        // The connection cannot name the node now: its waiters poll a while.
                        refuse_locked(ch, retry_pause);
                        settled_.notify_all();
                        ++it;
                        continue;
                    }
                }
                if (links_.count(ch.node) == 0) {
                    if (auto paused = paused_.find(ch.node);
                        paused != paused_.end() && now < paused->second.until) {
                        // Its node is paused: its waiters poll, and it is named again soon
                        // (see fail_node_locked).
                        if (!ch.waiters.empty()) {
                            note_refusal_locked(it->first, ch, paused->second.why);
                        }
                        refuse_locked(ch, std::min<steady::duration>(paused->second.until - now,
                                                                     retry_pause));
                        settled_.notify_all();
                    } else if (now >= retry_at) {
                        // A node that failed lately is tried after the others: its open may
                        // take long and end the round's opening (see run_round).
                        if (paused != paused_.end()) {
                            retried.push_back(it->first);
                        } else {
                            to_open.push_back(it->first);
                        }
                    }
                } else {
                    ch.status = link_status::sent;
                    to_send.emplace_back(it->first, "SSUBSCRIBE");
                }
            } else if (ch.status == link_status::active && ch.waiters.empty() &&
                       now - ch.unused_since >= linger) {
                ch.status = link_status::leaving;
                to_send.emplace_back(it->first, "SUNSUBSCRIBE");
            } else if (ch.status == link_status::idle && ch.waiters.empty() &&
                       now >= ch.retry_after) {
                it = channels_.erase(it);  // a refused one is kept until its pause is over
                continue;
            }
            ++it;
        }
        to_open.insert(to_open.end(), retried.begin(), retried.end());
    }

    // Called with no lock held. Skips a channel no longer wanted (a link of its node failed, or
    // its node was paused, since it was planned). False when an open was tried and failed.
    bool open_link(const std::string& channel, steady::time_point retry_at) {
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
    std::map<std::string, link_state>::iterator drop_link_locked(
        std::map<std::string, link_state>::iterator it) noexcept {
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
    void fail_node_locked(const std::string& node, std::string_view why,
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
                const bool asked =
                    ch.status == link_status::wanted || ch.status == link_status::sent;
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
    void send(const std::string& channel, const std::string& verb) {
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

    void wait_for_input(std::vector<pollfd>& fds, bool buffered) {
        const int timeout_ms = buffered ? 0 : static_cast<int>(tick.count());
        if (::poll(fds.data(), fds.size(), timeout_ms) > 0 && (fds[0].revents & POLLIN) != 0) {
            empty_pipe();
        }
    }

    void empty_pipe() noexcept {
        poked_.store(false, std::memory_order_release);  // before: a later poke sets it again
        char drain[64];
        while (::read(pipe_[0], drain, sizeof drain) > 0) {
        }
    }

    // Reads a link's input; false when the link is lost. A reply that cannot be handled (out
    // of memory) loses the link too: its waiters then try again and subscribe anew, instead of
    // waiting for a message that was read and dropped.
    bool drain(const std::string& node, link_state& state) noexcept {
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
    bool handle(const std::string& node, link_state& state, const reply& r) {
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
                told_.erase(channel);
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
    void deliver(const std::string& channel, std::string_view message) {
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
                message = space == std::string_view::npos ? std::string_view{}
                                                          : message.substr(space + 1);
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
    void refuse(const std::string& channel, steady::duration pause, std::string_view why) {
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
    void lose(const std::string& node) noexcept { fail_channels_of(node); }

    void fail_channels_of(const std::string& node) noexcept {
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

    static constexpr std::chrono::milliseconds tick{200};
    static constexpr std::chrono::milliseconds retry_pause{200};
    static constexpr std::chrono::seconds refused_pause{10};
    static constexpr std::chrono::minutes retell_after{1};
    static constexpr std::chrono::seconds max_pause{10};  // see fail_node_locked

    // 64 random bits: two clients that drew the same would only hear each other's messages.
    const std::string id_suffix_ = "@" + std::string{token::random().view().substr(0, 16)};
    opener open_;
    node_namer node_of_;
    refusal_reporter report_;
    steady::duration spin_;
    std::atomic<int> spinners_{0};    // waiters in wait()'s spin
    std::atomic<bool> poked_{false};  // the pipe may hold a byte (see wait_while_spinning)
    // The nodes whose links failed lately (see fail_node_locked). Needs links_mutex_.
    std::map<std::string, node_pause> paused_;
    // The links, read by this notifier's thread or by a spinning waiter. Taken before mutex_.
    std::mutex links_mutex_;
    std::map<std::string, link_state> links_;
    std::mutex mutex_;
    std::condition_variable_any settled_;
    std::map<std::string, channel_state> channels_;
    std::vector<std::pair<std::string, std::string>> refusals_;  // lock name, why; not yet told
    struct told_refusal {
        std::string why;
        steady::time_point at;
    };
    std::map<std::string, told_refusal> told_;  // per channel: the last refusal told
    steady::time_point last_pruned_{};          // of told_ and paused_, by plan_locked()
    bool stopping_ = false;
    bool unsupported_ = false;
    int pipe_[2]{-1, -1};
    std::thread thread_;
};

}  // namespace redislock::detail
