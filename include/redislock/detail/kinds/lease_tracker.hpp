// lease_tracker: starts, renews, loses and ends a tracked_lease for one lock object, and tells
// its acquisition, its loss (the lost event, on_lost, on_lost_reason) and its renewals' troubles.
#pragma once

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/client_core.hpp>
#include <redislock/detail/engine/event_sink.hpp>
#include <redislock/detail/engine/loss_timer.hpp>
#include <redislock/detail/engine/reaper.hpp>
#include <redislock/detail/kinds/tracked_lease.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/error.hpp>
#include <redislock/events.hpp>
#include <redislock/watchdog.hpp>

namespace redislock::detail {

/// Starts, renews, loses and ends tracked leases for one lock object. Its State has a
/// `std::mutex mutex`, `connection_type` (the C of its tracked_lease<C>), `lease_key` (what names
/// one acquisition) and `static tracked_lease<C>* find_lease(State&, const lease_key&)`, which
/// maps a key to its lease, or nullptr when that acquisition is no longer held; it is called with
/// the mutex held. Timer and watchdog callbacks hold the state weakly: a lock destroyed while
/// one of them runs is never touched after it is gone. Losses and renewal troubles are told with
/// no lock held, on the thread that found them.
template <class State>
class lease_tracker {
public:
    using tracked = tracked_lease<typename State::connection_type>;
    using key_type = typename State::lease_key;

    explicit lease_tracker(const std::shared_ptr<State>& st) : st_{st.get()}, self_{st} {}

    /// Ends the tracking of `previous`, the lease a fresh acquisition replaced in the state, and
    /// tells its loss when `live` (still held here: the fresh grant proves its lease ran out).
    void replaced(tracked& previous, bool live) {
        end(previous);
        if (live) {
            previous.lost_source.request_stop();
            report_loss(*st_, previous.kind, loss_reason::taken, previous.acquired_at);
        }
    }

    /// Tells the lock call's `wait` (when there is one) as acquired, then start()s tracking the
    /// fresh acquisition `key` of `kind`: acquired is thus told before its lease can be found
    /// lost. When tracking cannot start, `give_back()` releases the acquisition before the
    /// failure propagates: an untracked lease is not safe to hand out. `renewal()` makes the
    /// renewal_spec, called only with lock_options::watchdog.
    template <class Renewal, class GiveBack>
    void begin(const key_type& key, steady::time_point sent, lock_kind kind, const wait_tally* wait,
               Renewal renewal, GiveBack give_back) {
        if (wait != nullptr) {
            report_acquired(*st_, kind, *wait);
        }
        try {
            start(key, sent, renewal);
        } catch (...) {
            give_back();
            throw;
        }
    }

    /// Registers a fresh acquisition whose grant was sent at `sent`: the loss timer and, with
    /// lock_options::watchdog, renewals as the renewal_spec `make_renewal()` returns says.
    template <class MakeRenewal>
    void start(const key_type& key, steady::time_point sent, MakeRenewal make_renewal) {
        const auto deadline = valid_until(sent, st_->options.lease);
        // The key is captured as a copy of its own: a captured const key would be copied, not
        // moved, as the timer's entry moves.
        const auto timer = core().timer->add(
            deadline, [self = self_, key = key_type{key}]() -> loss_timer::loss_notice {
                // On the timer thread: mark the loss at once; the stop and the report are run by
                // the timer after every due lease was marked.
                auto st = self.lock();
                loss_timer::loss_notice notice;
                if (st) {
                    if (auto m = lease_tracker{st}.mark_only(key)) {
                        try {
                            notice.handler = then_take_back(deferred_report(*st, *m), self, key);
                            notice.source = m->source;
                        } catch (...) {
                            // Out of memory: told at once on this thread, stop first, rather
                            // than after every due lease is marked.
                            m->source.request_stop();
                            report_marked(*st, *m);
                            take_back(self, key);
                        }
                    }
                }
                let_go(std::move(st));
                return notice;
            });
        if (!attach(key, [&](tracked& t) {
                t.timer = timer;
                // Moved on meanwhile (a re-entry or extend() from the acquired event's hook).
                if (t.valid_until != deadline) {
                    core().timer->move(timer, t.valid_until);
                }
            })) {
            core().timer->remove(timer);
            return;
        }
        if (!st_->options.watchdog) {
            return;
        }
        renewal_spec renewal = make_renewal();
        lease_renewal watched{renewal.renew_script,
                              std::move(renewal.keys),
                              std::move(renewal.args),
                              st_->options.lease,
                              st_->options.max_hold,
                              [self = self_, key](steady::time_point renewed_at) {
                                  if (auto st = self.lock()) {
                                      lease_tracker{st}.renewed(key, renewed_at);
                                      let_go(std::move(st));
                                  }
                              },
                              {},
                              st_->options.min_replicas,
                              st_->options.replica_timeout};
        watched.lost_because = [self = self_, key](loss_reason reason, std::string_view why) {
            if (auto st = self.lock()) {
                lease_tracker{st}.renewal_failed(key, reason, why);
                let_go(std::move(st));
            }
        };
        if (core().events.observed()) {
            watched.retried = [self = self_, key](std::string_view why) {
                if (auto st = self.lock()) {
                    lease_tracker{st}.renewal_retried(key, why);
                    let_go(std::move(st));
                }
            };
            // Only the detail of the renewal_failed event that follows depends on it.
            watched.capped = [self = self_, key] {
                if (auto st = self.lock()) {
                    lease_tracker{st}.renewal_capped(key);
                    let_go(std::move(st));
                }
            };
        }
        if (core().events.observed() || st_->options.on_lost_reason) {
            // Only the reason of the loss that follows depends on it.
            watched.dropped = [self = self_, key] {
                if (auto st = self.lock()) {
                    lease_tracker{st}.renewal_dropped(key);
                    let_go(std::move(st));
                }
            };
        }
        const auto id = core().watchdog.add(std::move(watched), sent);
        if (!attach(key, [&](tracked& t) {
                t.renewal = id;
                t.renewal_stopped = id == 0;  // the watchdog had stopped: nothing renews it
            })) {
            core().watchdog.cancel(id);
        }
    }

    /// A renewal sent at `renewed_at` was confirmed: the local deadline moves.
    void renewed(const key_type& key, steady::time_point renewed_at) {
        renewed_for(key, renewed_at, st_->options.lease);
    }

    /// An extend() of `lease` is about to be sent at `sent`. On the kinds whose scripts may
    /// shorten the server's expiry, a lease ending before the local deadline may land even when
    /// the call then fails (a lost or late reply, a quorum not reached), so the deadline is cut
    /// to it first: otherwise the holder would count on time the server no longer gives it.
    /// Returns true for a shortening one (shorter than the deadline held, or than the lease the
    /// renewals give): the caller then calls extend_returned() once the call is over.
    bool extend_sending(const key_type& key, steady::time_point sent,
                        std::chrono::milliseconds lease) {
        if constexpr (deadline_never_earlier<State>) {
            return false;
        } else {
            std::lock_guard guard{st_->mutex};
            tracked* t = State::find_lease(*st_, key);
            if (t == nullptr || t->lost) {
                return false;
            }
            const auto until = valid_until(sent, lease);
            if (until >= t->valid_until && lease >= st_->options.lease) {
                return false;
            }
            t->shortened_at = sent;
            if (until < t->valid_until) {
                t->valid_until = until;
                core().timer->move(t->timer, until);
            }
            return true;
        }
    }

    /// A shortening extend() (see extend_sending()) is over, whatever its outcome: a renewal
    /// sent while it was in flight may have run before it on the server, so its reply no longer
    /// moves the deadline either.
    void extend_returned(const key_type& key) noexcept {
        std::lock_guard guard{st_->mutex};
        if (tracked* t = State::find_lease(*st_, key); t != nullptr) {
            t->shortened_at = steady::now();
        }
    }

    /// An extend() of `lease` sent at `sent` succeeded.
    void extended(const key_type& key, steady::time_point sent, std::chrono::milliseconds lease) {
        renewed_for(key, sent, lease, true);
    }

    /// What an extend() (or, with a zero `lease`, a check) of `key` sent at `sent` learns from
    /// its script's reply `r` (1: still ours; 0 or WRONGTYPE: no longer): true when still ours,
    /// the local deadline moved for `lease`; false when not, the loss told.
    /// @throws what throw_reply_error() throws for another error reply to `what`, which says
    ///         nothing about ownership.
    bool extend_replied(const key_type& key, const reply& r, steady::time_point sent,
                        std::chrono::milliseconds lease, std::string_view what = "extend") {
        if (r.is_integer() && r.as_integer() == 1) {
            if (lease > std::chrono::milliseconds::zero()) {
                extended(key, sent, lease);
            }
            return true;
        }
        throw_unless_not_ours(r, what, st_->name);
        lose(key, r.is_error() ? loss_reason::server_lost : loss_reason::taken);
        return false;
    }

    /// Marks the acquisition lost and tells it (stop source, lost event, on_lost), once.
    void lose(const key_type& key, loss_reason reason) {
        if (auto m = mark_only(key)) {
            // Outside the mutex: stop callbacks run inside request_stop() and may call the lock.
            m->source.request_stop();
            report_loss(*st_, m->kind, reason, m->acquired_at);
        }
    }

    /// Marks and tells the loss by expiry of the acquisition `key` names when its local deadline
    /// has passed and the loss timer has not told it yet: a lock() that follows owned() == false
    /// must meet the hold as lost (a first entry, after the take-back), never re-enter it.
    void expire_if_due(const key_type& key) {
        if (auto m = mark_only(key, true)) {
            m->source.request_stop();
            report_marked(*st_, *m);
        }
    }

    /// What marking a loss found: the source to stop and what the report needs.
    struct marked {
        std::stop_source source;
        steady::time_point acquired_at;
        lock_kind kind;
        bool renewed;   // the watchdog was renewing it
        bool shutdown;  // the watchdog had stopped while renewing it
        bool capped;    // the watchdog had stopped at max_hold
    };

    /// Marks the acquisition lost and leaves the stop and the report to the caller, or returns
    /// nothing when it was already lost or gone (or, with `only_if_due`, has time left as
    /// remaining() counts it, which owned() reads). Its renewals
    /// stop: renewing a lost lease could only revive it behind a rival's back. Runs no user code
    /// and allocates nothing (a default-made std::stop_source would: it runs on the loss timer's
    /// thread and in unlock()).
    std::optional<marked> mark_only(const key_type& key, bool only_if_due = false) noexcept {
        decltype(tracked::renewal) renewal = 0;
        std::optional<marked> m;
        {
            std::lock_guard guard{st_->mutex};
            tracked* t = State::find_lease(*st_, key);
            if (t == nullptr || t->lost ||
                (only_if_due && t->remaining() > std::chrono::milliseconds::zero())) {
                return std::nullopt;
            }
            t->lost = true;
            renewal = std::exchange(t->renewal, 0);
            m.emplace(marked{t->lost_source, t->acquired_at, t->kind, renewal != 0,
                             t->renewal_stopped, t->renewal_capped});
        }
        if (renewal != 0) {
            core().watchdog.cancel(renewal);  // never waits: the timer thread must not block
        }
        return m;
    }

    /// Stops the timer and renewals of an acquisition that ended; `t` was taken out of the
    /// state with the mutex held (its ids are this acquisition's alone). Never waits for a
    /// renewal in flight: its callbacks find the acquisition gone. Allocates nothing: an id is
    /// only looked up in an engine of this process that made it.
    void end(tracked& t) noexcept {
        const auto renewal = std::exchange(t.renewal, 0);
        const auto timer = std::exchange(t.timer, 0);
        if (t.generation != current_fork_generation()) {
            return;  // the parent's ids: they mean other leases in this process's engines
        }
        if (renewal != 0) {
            core().watchdog.cancel(renewal);
        }
        if (timer != 0) {
            core().timer->remove(timer);
        }
    }

private:
    // A callback may hold the last reference to a lock whose owner just destroyed it; the state
    // then ends on the reaper's thread, since its end may end the client's core, which owns the
    // thread the callback runs on.
    static void let_go(std::shared_ptr<State>&& st) {
        if (st && st.use_count() == 1) {
            try {
                background_reaper().add(
                    reaper::no_server, [last = std::move(st)](steady::time_point) { return true; },
                    steady::now() + std::chrono::seconds{1});
            } catch (...) {
                // Out of memory: st ends here, as it would have without this step.
            }
        }
    }

    // After a loss by expiry, once it is told: has the kind take back, in the background, what
    // renewals or extends that were never confirmed (too few replicas acknowledged them, no
    // answer, no quorum) may have left in Redis past the lease the holder was told of
    // (State::clean_up_expired(st, key), for kinds that have it). Told first, taken back after,
    // so no rival gets in before the holder knows; a lost reply only delays it (the reaper tries
    // again), and a later acquisition is never touched (each is named by its own key).
    static void take_back(const std::weak_ptr<State>& self, const key_type& key) noexcept {
        if constexpr (requires(const std::shared_ptr<State>& st) {
                          State::clean_up_expired(st, key);
                      }) {
            if (auto st = self.lock()) {
                State::clean_up_expired(st, key);
                let_go(std::move(st));
            }
        }
    }

    // `report`, then take_back().
    static std::function<void()> then_take_back(std::function<void()> report,
                                                const std::weak_ptr<State>& self,
                                                const key_type& key) {
        if constexpr (requires(const std::shared_ptr<State>& st) {
                          State::clean_up_expired(st, key);
                      }) {
            return [report = std::move(report), self, key] {
                if (report) {
                    report();
                }
                take_back(self, key);
            };
        } else {
            return report;
        }
    }

    // What the loss timer runs once every due lease is marked: for a lease the watchdog renewed,
    // renewal_failed first (no renewal was confirmed in time); then the lost event, on_lost and
    // on_lost_reason. Empty when nobody listens.
    static std::function<void()> deferred_report(const State& st, const marked& m) {
        const event_hook& hook = st.core->events.hook();
        if (!hook && !st.lost_handlers) {
            return {};
        }
        const loss_reason reason = expiry_reason(m);
        const auto held = hook ? micros_since(m.acquired_at) : std::chrono::microseconds{};
        return [hook, handlers = st.lost_handlers, name = st.name, kind = m.kind, reason, held,
                capped = m.capped, failed = m.renewed && !m.shutdown] {
            if (failed) {
                emit_to(hook, [&] { return expiry_renewal_failed(name, kind, reason, capped); });
            }
            emit_to(hook, [&] {
                lock_event e;
                e.type = event_type::lost;
                e.kind = kind;
                e.name = name;
                e.reason = reason;
                e.held = held;
                return e;
            });
            call_on_lost(handlers, reason);
        };
    }

    // Why a lease marked lost at its deadline was lost.
    static loss_reason expiry_reason(const marked& m) noexcept {
        return m.shutdown ? loss_reason::client_shutdown : loss_reason::expired;
    }

    // The renewal_failed event told before the loss of a lease the watchdog renewed until its
    // deadline.
    static lock_event expiry_renewal_failed(std::string_view name, lock_kind kind,
                                            loss_reason reason, bool capped) noexcept {
        lock_event e;
        e.type = event_type::renewal_failed;
        e.kind = kind;
        e.name = name;
        e.reason = reason;
        e.detail =
            capped ? "max_hold reached" : "no renewal was confirmed before the local deadline";
        return e;
    }

    // What deferred_report() would tell, told at once (when it cannot be deferred).
    static void report_marked(const State& st, const marked& m) noexcept {
        const loss_reason reason = expiry_reason(m);
        if (m.renewed && !m.shutdown) {
            st.core->events.emit(
                [&] { return expiry_renewal_failed(st.name, m.kind, reason, m.capped); });
        }
        report_loss(st, m.kind, reason, m.acquired_at);
    }

    // On the watchdog thread: a renewal found the lease gone or gave it up.
    void renewal_failed(const key_type& key, loss_reason reason, std::string_view why) {
        auto m = mark_only(key);
        if (!m) {
            return;
        }
        m->source.request_stop();
        core().events.emit([&] {
            lock_event e;
            e.type = event_type::renewal_failed;
            e.kind = m->kind;
            e.name = st_->name;
            e.reason = reason;
            e.detail = why;
            return e;
        });
        report_loss(*st_, m->kind, reason, m->acquired_at);
        if (reason == loss_reason::expired) {
            take_back(self_, key);
        }
    }

    // On the watchdog thread: a renewal failed and will be sent again.
    void renewal_retried(const key_type& key, std::string_view why) {
        lock_kind kind = lock_kind::none;
        {
            std::lock_guard guard{st_->mutex};
            tracked* t = State::find_lease(*st_, key);
            if (t == nullptr || t->lost) {
                return;
            }
            kind = t->kind;
        }
        core().events.emit([&] {
            lock_event e;
            e.type = event_type::renewal_retried;
            e.kind = kind;
            e.name = st_->name;
            e.detail = why;
            return e;
        });
    }

    // On the watchdog thread: max_hold stopped the renewals; the loss that follows says so.
    void renewal_capped(const key_type& key) {
        std::lock_guard guard{st_->mutex};
        if (tracked* t = State::find_lease(*st_, key); t && !t->lost) {
            t->renewal_capped = true;
        }
    }

    // The watchdog stopped with the lease registered: its loss, when the lease runs out, is the
    // client's shutdown.
    void renewal_dropped(const key_type& key) {
        std::lock_guard guard{st_->mutex};
        if (tracked* t = State::find_lease(*st_, key); t && !t->lost) {
            t->renewal = 0;
            t->renewal_stopped = true;
        }
    }

    // `extend`: the reply of an extend() itself, which the gate for renewals does not hold back.
    void renewed_for(const key_type& key, steady::time_point sent, std::chrono::milliseconds lease,
                     bool extend = false) {
        std::lock_guard guard{st_->mutex};
        if (tracked* t = State::find_lease(*st_, key); t && !t->lost) {
            if (!extend && sent < t->shortened_at) {
                return;  // sent before a shorter lease was over, which may have landed after it
            }
            auto until = valid_until(sent, lease);
            if constexpr (deadline_never_earlier<State>) {
                until = std::max(until, t->valid_until);
            }
            t->valid_until = until;
            core().timer->move(t->timer, t->valid_until);
        }
    }

    // Stores an id in a live, not yet lost acquisition; false when it is gone or lost.
    template <class Set>
    bool attach(const key_type& key, Set set) {
        std::lock_guard guard{st_->mutex};
        tracked* t = State::find_lease(*st_, key);
        if (t == nullptr || t->lost) {
            return false;
        }
        set(*t);
        return true;
    }

    // The client's core (client_core<C>, or a Redlock client's): its loss timer and watchdog.
    auto& core() { return *st_->core; }

    State* st_;
    std::weak_ptr<State> self_;
};

}  // namespace redislock::detail
