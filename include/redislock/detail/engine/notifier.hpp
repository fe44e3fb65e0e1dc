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

#include <algorithm>
#include <atomic>
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
#include <redislock/detail/engine/notifier_refusals.hpp>
#include <redislock/detail/engine/wake_slot.hpp>
#include <redislock/detail/engine/wakeup_pipe.hpp>
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
        pipe_.close();
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
        if (!pipe_.open()) {
            return false;
        }
        try {
            thread_ = std::thread{[this] { run(); }};
        } catch (...) {
            pipe_.close();
            return false;
        }
        return true;
    }

    void poke() noexcept { pipe_.poke(); }

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
                pollfd pipe{pipe_.read_fd(), POLLIN, 0};
                if (::poll(&pipe, 1, static_cast<int>(retry_pause.count())) > 0) {
                    pipe_.empty();
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
        std::vector<pollfd> fds{{pipe_.read_fd(), POLLIN, 0}};
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
    // told within notifier_refusals::retell_after and the channel was not subscribed since: a cause
    // that lasts (a server out of reach, a slot on the move) is told once, not at every try.
    // Dropped when memory runs out.
    void note_refusal_locked(const std::string& channel, const channel_state& ch,
                             std::string_view why) noexcept {
        if (!report_) {
            return;
        }
        if (refusals_.note(channel, ch.name, why)) {
            poke();  // refused on a spinner's thread: this thread tells it soon
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
        notifier_refusals::list told;
        {
            std::lock_guard guard{mutex_};
            if (stopping_) {
                return false;
            }
            refusals_.take(told);
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
            const bool look = fds.size() > 1 || pipe_.poked();
            if (look && ::poll(fds.data(), fds.size(), 0) > 0) {
                if ((fds[0].revents & POLLIN) != 0) {
                    pipe_.empty();
                }
                return;
            }
            ::sched_yield();
        }
    }

    // Decides, under both mutexes, which channels to subscribe or leave and which links to open.
    void plan_locked(std::vector<std::pair<std::string, std::string>>& to_send,
                     std::vector<std::string>& to_open, steady::time_point retry_at) {
        const auto now = steady::now();
        std::vector<std::string> retried;  // channels of nodes that failed lately: opened last
        if (now - last_pruned_ >= std::chrono::seconds{1}) {
            last_pruned_ = now;
            refusals_.prune(now);
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

    void wait_for_input(std::vector<pollfd>& fds, bool buffered) {
        const int timeout_ms = buffered ? 0 : static_cast<int>(tick.count());
        if (::poll(fds.data(), fds.size(), timeout_ms) > 0 && (fds[0].revents & POLLIN) != 0) {
            pipe_.empty();
        }
    }

    // The subscriber links, opened, written, read and dropped by this notifier's thread (read by
    // a spinning waiter too), and what each reply does to the channels: notifier_links.hpp.
    void read_links_locked(bool spinner);
    bool open_link(const std::string& channel, steady::time_point retry_at);
    auto drop_link_locked(std::map<std::string, link_state>::iterator it) noexcept
        -> std::map<std::string, link_state>::iterator;
    void fail_node_locked(const std::string& node, std::string_view why,
                          steady::duration took) noexcept;
    void send(const std::string& channel, const std::string& verb);
    bool drain(const std::string& node, link_state& state) noexcept;
    bool handle(const std::string& node, link_state& state, const reply& r);
    void deliver(const std::string& channel, std::string_view message);
    void refuse(const std::string& channel, steady::duration pause, std::string_view why);
    void lose(const std::string& node) noexcept;
    void fail_channels_of(const std::string& node) noexcept;

    static constexpr std::chrono::milliseconds tick{200};
    static constexpr std::chrono::milliseconds retry_pause{200};
    static constexpr std::chrono::seconds refused_pause{10};
    static constexpr std::chrono::seconds max_pause{10};  // see fail_node_locked

    // 64 random bits: two clients that drew the same would only hear each other's messages.
    const std::string id_suffix_ = "@" + std::string{token::random().view().substr(0, 16)};
    opener open_;
    node_namer node_of_;
    refusal_reporter report_;
    steady::duration spin_;
    std::atomic<int> spinners_{0};  // waiters in wait()'s spin
    // The nodes whose links failed lately (see fail_node_locked). Needs links_mutex_.
    std::map<std::string, node_pause> paused_;
    // The links, read by this notifier's thread or by a spinning waiter. Taken before mutex_.
    std::mutex links_mutex_;
    std::map<std::string, link_state> links_;
    std::mutex mutex_;
    std::condition_variable_any settled_;
    std::map<std::string, channel_state> channels_;
    notifier_refusals refusals_;        // not yet told, and the last told of each channel
    steady::time_point last_pruned_{};  // of refusals_ and paused_, by plan_locked()
    bool stopping_ = false;
    bool unsupported_ = false;
    wakeup_pipe pipe_;
    std::thread thread_;
};

}  // namespace redislock::detail

#include <redislock/detail/engine/notifier_links.hpp>
