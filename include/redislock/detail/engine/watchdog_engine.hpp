// detail::watchdog_engine<C>: the watchdog of one process, its thread, the leases it renews and
// when each is due. See basic_watchdog in watchdog.hpp for what it promises. What it keeps of
// each lease is in watchdog_lease.hpp; what a batch sends and what its replies mean, in
// renewal_batch.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/detail/engine/owned_thread.hpp>
#include <redislock/detail/engine/per_process.hpp>
#include <redislock/detail/engine/renewal_batch.hpp>
#include <redislock/detail/engine/watchdog_lease.hpp>
#include <redislock/detail/util/token.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/lease_renewal.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

// The watchdog of one process: see basic_watchdog.
template <connection C>
class watchdog_engine {
public:
    using lease_id = std::uint64_t;

    explicit watchdog_engine(C& conn, const event_sink* events = nullptr)
        : conn_{&conn}, events_{events} {}
    watchdog_engine(const watchdog_engine&) = delete;
    watchdog_engine& operator=(const watchdog_engine&) = delete;
    ~watchdog_engine() { stop(); }

    lease_id add(lease_renewal renewal, detail::steady::time_point sent) {
        std::unique_lock lock{mutex_};
        if (stopped_) {
            return 0;  // the client is going away; the lock keeps its current lease
        }
        if (renewal.renew_script == nullptr || renewal.keys.size() > 9 ||
            renewal.lease <= std::chrono::milliseconds::zero()) {
            throw invalid_argument{
                "redislock: a lease renewal needs a script, at most 9 keys "
                "and a positive lease"};
        }
        const lease_id id = next_id_++;
        entry e{std::move(renewal)};
        e.registered = sent;
        e.interval = std::max(e.renewal.lease / 3, std::chrono::milliseconds{1});
        e.confirmed_at = detail::steady::now();
        e.due = sent + e.interval;
        widest_window_ = std::max(widest_window_, e.interval / 4);
        queue_.emplace(e.due, id);
        const bool earliest = queue_.begin()->second == id;
        entries_.emplace(id, std::move(e));
        if (!thread_.running()) {
            thread_ = owned_thread{[this] { run(); }};
        } else if (earliest) {
            wake_.notify_all();
        }
        return id;
    }

    /// Stops renewing a lease. Once it returns, none of the lease's callbacks runs again
    /// (a renewal already sent may still reach Redis; the scripts compare before they act).
    void remove(lease_id id) {
        if (id == 0) {
            return;
        }
        std::unique_lock lock{mutex_};
        // A renewal in flight reads the entry's strings: wait for it, unless this is the
        // watchdog thread itself (an on_lost handler), which is past sending by then and only
        // has to skip the lease's callbacks still queued in this batch.
        if (std::this_thread::get_id() == thread_id_) {
            in_flight_.erase(id);
        } else {
            // Without the mark a lease due again at once (a reply slower than lease/3) would
            // go straight back in flight and this wait could last forever.
            if (auto it = entries_.find(id); it != entries_.end()) {
                it->second.removed = true;
            }
            done_.wait(lock, [&] { return !in_flight_.contains(id); });
        }
        if (auto it = entries_.find(id); it != entries_.end()) {
            queue_.erase({it->second.due, id});
            entries_.erase(it);
        }
    }

    /// True on the watchdog's own thread.
    bool runs_on_this_thread() const {
        std::lock_guard lock{mutex_};
        return thread_id_ == std::this_thread::get_id();
    }

    /// Stops renewing a lease without waiting for a renewal in flight (whose callbacks are then
    /// skipped): for a lease already reported lost, from a thread that must not block.
    void cancel(lease_id id) {
        std::lock_guard lock{mutex_};
        auto it = entries_.find(id);
        if (it == entries_.end()) {
            return;
        }
        if (in_flight_.contains(id)) {
            it->second.removed = true;
            it->second.cancelled = true;
            return;
        }
        queue_.erase({it->second.due, id});
        entries_.erase(it);
    }

    /// Stops and joins the thread; drops every lease, telling each through its `dropped`
    /// callback. Idempotent.
    void stop() {
        owned_thread thread;
        std::vector<std::function<void()>> dropped;
        {
            std::unique_lock lock{mutex_};
            stopped_ = true;
            // A batch in flight reads the entries' strings: let it finish before dropping them.
            if (std::this_thread::get_id() != thread_id_) {
                done_.wait(lock, [&] { return in_flight_.empty(); });
            }
            for (auto& [id, e] : entries_) {
                if (e.renewal.dropped && !e.cancelled) {
                    dropped.push_back(std::move(e.renewal.dropped));
                }
            }
            entries_.clear();
            queue_.clear();
            thread = std::move(thread_);
        }
        wake_.notify_all();
        thread.end();  // from an on_lost handler: detached, the loop ends when it returns
        for (auto& told : dropped) {
            told();
        }
    }

    std::size_t size() const {
        std::lock_guard lock{mutex_};
        return entries_.size();
    }

    watchdog_stats stats() const {
        std::lock_guard lock{mutex_};
        return stats_;
    }

private:
    // Each lease's record and one batch's types, by short names.
    using entry = watchdog_lease;
    using job = renewal_job;
    using outcome = renewal_outcome;
    using result = renewal_result;

    void run() {
        std::unique_lock lock{mutex_};
        thread_id_ = std::this_thread::get_id();
        while (!stopped_) {
            if (queue_.empty()) {
                wake_.wait(lock);
                continue;
            }
            const auto now = detail::steady::now();
            // A copy: remove() may free the queue's node while this thread waits.
            if (const auto due = queue_.begin()->first; due > now) {
                wake_.wait_until(lock, due);
                continue;
            }
            std::vector<job> batch = take_due(now);
            lock.unlock();
            const auto cpu_before = thread_cpu_time();
            const auto sent = detail::steady::now();
            std::vector<result> results = send(batch);
            const auto replied = detail::steady::now();
            lock.lock();
            std::vector<callback> calls = settle(batch, results, sent, replied);
            stats_.cpu_time += thread_cpu_time() - cpu_before;
            for (auto& [id, call] : calls) {
                if (in_flight_.contains(id)) {  // else an earlier callback removed the lease
                    lock.unlock();
                    call();
                    lock.lock();
                }
            }
            for (const job& j : batch) {
                in_flight_.erase(j.id);
            }
            done_.notify_all();
        }
        thread_id_ = {};
    }

    // Takes every lease due now or within a quarter of its interval: renewing a little early
    // costs nothing and lets leases that fall due together share one round trip.
    std::vector<job> take_due(detail::steady::time_point now) {
        std::vector<job> batch;
        for (auto it = queue_.begin(); it != queue_.end();) {
            entry& e = entries_.at(it->second);
            if (it->first > now + e.interval / 4) {
                if (it->first > now + widest_window_) {
                    break;  // the queue is ordered; nothing further can be close enough
                }
                ++it;
                continue;
            }
            const lease_id id = it->second;
            it = queue_.erase(it);
            e.due = detail::steady::time_point::max();
            in_flight_.insert(id);
            batch.push_back(make_renewal_job(id, e));
            batch.back().how.deadline = surely_gone(e);
        }
        return batch;
    }

    std::vector<result> send(const std::vector<job>& batch) {
        std::vector<result> results(batch.size());
        std::vector<std::size_t> pending;
        for (std::size_t i = 0; i < batch.size(); ++i) {
            if (!batch[i].argv.empty()) {
                pending.push_back(i);
            }
        }
        std::vector<reply> replies = execute_all(batch, pending);
        std::vector<std::size_t> unloaded;
        for (std::size_t k = 0; k < pending.size(); ++k) {
            if (replies.size() == pending.size() && replies[k].is_error_code("NOSCRIPT")) {
                unloaded.push_back(pending[k]);
            } else if (replies.size() == pending.size()) {
                results[pending[k]] = classify_renewal(replies[k]);
            }
        }
        if (!unloaded.empty()) {
            load_scripts(batch, unloaded);
            replies = execute_all(batch, unloaded);
            for (std::size_t k = 0; k < unloaded.size() && replies.size() == unloaded.size(); ++k) {
                results[unloaded[k]] = classify_renewal(replies[k]);
            }
        }
        return results;
    }

    // Empty result when the connection failed.
    std::vector<reply> execute_all(const std::vector<job>& batch,
                                   const std::vector<std::size_t>& which) {
        if (which.empty()) {
            return {};
        }
        // Each renewal, followed by its WAIT when its lock asks for replica acknowledgements
        // (on a cluster the WAIT must reach the renewal's node, so it carries the same key).
        std::vector<command> commands;
        std::vector<call_context> hows;
        std::vector<std::array<std::string_view, 3>> waits;
        waits.reserve(which.size());
        for (std::size_t i : which) {
            commands.emplace_back(batch[i].argv);
            hows.push_back(batch[i].how);
            if (batch[i].min_replicas > 0) {
                waits.push_back({"WAIT", batch[i].wait_text[0], batch[i].wait_text[1]});
                commands.emplace_back(waits.back());
                hows.push_back(batch[i].how);
            }
        }
        std::vector<reply> replies;
        try {
            if constexpr (contextual_pipelining_connection<C>) {
                replies = conn_->execute_pipeline(commands, hows);
                count(which.size(), 1);
            } else if constexpr (pipelining_connection<C>) {
                replies = conn_->execute_pipeline(commands);
                count(which.size(), 1);
            } else {
                for (std::size_t k = 0; k < commands.size(); ++k) {
                    replies.push_back(detail::execute(*conn_, commands[k], hows[k]));
                }
                count(which.size(), which.size());
            }
        } catch (...) {
            return {};
        }
        if (replies.size() != commands.size()) {
            return {};
        }
        return one_reply_per_renewal(batch, which, std::move(replies));
    }

    void load_scripts(const std::vector<job>& batch, const std::vector<std::size_t>& which) {
        // Once per script, routed by the key of one lease that needs it (a cluster connection
        // loads it on any other node that answers NOSCRIPT itself).
        std::map<const script*, std::string_view> scripts;
        for (std::size_t i : which) {
            scripts.emplace(batch[i].renew_script, batch[i].how.key);
        }
        for (const auto& [s, key] : scripts) {
            try {
                const std::array<std::string_view, 3> load{"SCRIPT", "LOAD", s->source};
                const reply loaded = detail::execute(
                    *conn_, load,
                    call_context{key, detail::steady::now() + std::chrono::seconds{1}, nullptr});
                count(0, 1);  // a round trip like any other, so stats match the connection's
                if (events_ != nullptr && !loaded.is_error()) {
                    // Plain copies: clang 14 rejects lambdas that capture structured bindings.
                    const std::string_view reloaded_for = key;
                    const std::string_view script_name = s->name;
                    events_->emit([&] {
                        lock_event e;
                        e.type = event_type::script_reloaded;
                        e.name = reloaded_for;
                        e.detail = script_name;
                        return e;
                    });
                }
            } catch (...) {
            }
        }
    }

    void count(std::uint64_t renewals, std::uint64_t round_trips) {
        std::lock_guard lock{mutex_};
        stats_.renewals += renewals;
        stats_.round_trips += round_trips;
    }

    using callback = std::pair<lease_id, std::function<void()>>;

    // Applies a batch's outcomes; returns the callbacks to run once the mutex is released.
    std::vector<callback> settle(const std::vector<job>& batch, const std::vector<result>& results,
                                 detail::steady::time_point sent,
                                 detail::steady::time_point replied) {
        std::vector<callback> calls;
        for (std::size_t i = 0; i < batch.size(); ++i) {
            auto it = entries_.find(batch[i].id);
            if (it == entries_.end()) {
                continue;  // removed while in flight
            }
            entry& e = it->second;
            if (e.cancelled) {
                entries_.erase(it);
                continue;
            }
            if (e.removed) {
                continue;  // remove() drops it once this batch is done
            }
            const auto lease = e.renewal.lease;
            const bool expired = replied >= surely_gone(e);
            const outcome what = results[i].what;
            if (e.expiring || what == outcome::not_ours || what == outcome::server_lost ||
                (what == outcome::failed && expired)) {
                if (e.renewal.lost_because) {
                    calls.emplace_back(
                        batch[i].id,
                        [told = std::move(e.renewal.lost_because), reason = loss_reason_of(what),
                         why = why_lost(e, results[i])] { told(reason, why); });
                } else if (e.renewal.lost) {
                    calls.emplace_back(batch[i].id, std::move(e.renewal.lost));
                }
                ++stats_.losses;
                entries_.erase(it);
                continue;
            }
            if (what == outcome::failed) {
                // Transient: try again soon, while the lease is still running.
                const auto retry = std::clamp<detail::steady::duration>(
                    e.interval / 4, std::chrono::milliseconds{10}, std::chrono::seconds{1});
                reschedule(batch[i].id, e, std::min(replied + retry, surely_gone(e)));
                if (e.renewal.retried) {
                    calls.emplace_back(batch[i].id,
                                       [told = e.renewal.retried,
                                        why = std::string{results[i].told()}] { told(why); });
                }
                continue;
            }
            e.confirmed_at = replied;
            const auto next = sent + e.interval;
            const auto cap = e.renewal.max_hold;
            const bool capped =
                cap > std::chrono::milliseconds::zero() && next >= e.registered + cap;
            if (e.renewal.renewed) {
                calls.emplace_back(batch[i].id,
                                   [renewed = e.renewal.renewed, sent] { renewed(sent); });
            }
            if (capped && e.renewal.capped) {
                // After `renewed`: told before it, a loss at the deadline this grant replaces
                // (its confirmation came too late) would be taken for max_hold. The deadline it
                // sets is a lease away, long after this call.
                calls.emplace_back(batch[i].id, std::move(e.renewal.capped));
            }
            if (capped) {
                // Past max_hold: stop renewing; report the loss when this grant runs out.
                e.expiring = true;
                reschedule(batch[i].id, e,
                           replied + lease + lease / 100 + std::chrono::milliseconds{2});
                continue;
            }
            reschedule(batch[i].id, e, next);
        }
        return calls;
    }

    void reschedule(lease_id id, entry& e, detail::steady::time_point due) {
        e.due = due;
        queue_.emplace(due, id);
    }

    static std::chrono::nanoseconds thread_cpu_time() {
        timespec ts{};
        ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return std::chrono::seconds{ts.tv_sec} + std::chrono::nanoseconds{ts.tv_nsec};
    }

    C* conn_;
    const event_sink* events_;  // where script reloads are told; may be null
    mutable std::mutex mutex_;
    std::condition_variable wake_;  // the queue's head changed, or stop
    std::condition_variable done_;  // a batch finished its callbacks
    std::map<lease_id, entry> entries_;
    std::set<std::pair<detail::steady::time_point, lease_id>> queue_;
    std::set<lease_id> in_flight_;
    lease_id next_id_ = 1;
    detail::steady::duration widest_window_{};  // largest interval / 4 of any lease
    bool stopped_ = false;
    owned_thread thread_;
    std::thread::id thread_id_;
    watchdog_stats stats_;
};

}  // namespace redislock::detail
