#include <redislock/events.hpp>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/client_options.hpp>
#include <redislock/redislock.hpp>

#include "support/fault_proxy.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::errc;
using redislock::event_type;
using redislock::lock_event;
using redislock::lock_kind;
using redislock::lock_options;
using redislock::loss_reason;
using redislock::test::eventually;
using redislock::test::fault;
using redislock::test::fault_connection;
using redislock::test::redis_server;
using redislock::test::with_query;

// One event as the hook saw it, kept past the call (the event's string_views are not).
struct seen {
    event_type type{};
    lock_kind kind{};
    std::string name;
    std::chrono::microseconds wait{};
    std::uint32_t attempts = 0;
    std::chrono::microseconds held{};
    std::chrono::milliseconds holder_ttl{};
    loss_reason reason{};
    std::string detail;
    std::thread::id thread;
    std::thread::id holder_thread;
    std::thread::id caller_thread;
    std::chrono::microseconds round_trip{};
};

// Records every event of a client: client{uri, {.on_event = events.hook()}}. The hook shares
// what it records: the process's reaper may still call it after the test (a take-back or a
// release finished in the background), as events.hpp allows.
class recorder {
public:
    redislock::event_hook hook() {
        return [log = log_](const lock_event& e) {
            std::lock_guard guard{log->mutex};
            log->events.push_back(seen{e.type, e.kind, std::string{e.name}, e.wait, e.attempts,
                                       e.held, e.holder_ttl, e.reason, std::string{e.detail},
                                       std::this_thread::get_id(), e.holder_thread, e.caller_thread,
                                       e.round_trip});
        };
    }

    std::vector<seen> of(event_type type) const {
        std::lock_guard guard{log_->mutex};
        std::vector<seen> out;
        for (const seen& s : log_->events) {
            if (s.type == type) {
                out.push_back(s);
            }
        }
        return out;
    }

    std::size_t count(event_type type) const { return of(type).size(); }

    std::vector<seen> all() const {
        std::lock_guard guard{log_->mutex};
        return log_->events;
    }

    // The first event of `type`, waiting up to `timeout` for it.
    std::optional<seen> first(event_type type, std::chrono::milliseconds timeout = 5s) const {
        if (!eventually([&] { return count(type) > 0; }, timeout)) {
            return std::nullopt;
        }
        return of(type).front();
    }

    std::size_t total() const {
        std::lock_guard guard{log_->mutex};
        return log_->events.size();
    }

private:
    struct event_log {
        std::mutex mutex;
        std::vector<seen> events;
    };
    std::shared_ptr<event_log> log_ = std::make_shared<event_log>();
};

// ---------------------------------------------------------------------------------------------
// Acquisition and release

TEST(Events, UncontendedLockReportsAcquiredAfterOneAttemptAndReleasedWithItsHoldTime) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto m = client.mutex("orders:1", {.lease = 5s});

    m.lock();
    const auto acquired = events.first(event_type::acquired);
    ASSERT_TRUE(acquired);
    EXPECT_EQ(acquired->kind, lock_kind::mutex);
    EXPECT_EQ(acquired->name, "orders:1");
    EXPECT_EQ(acquired->attempts, 1U);
    EXPECT_EQ(acquired->thread, std::this_thread::get_id());
    EXPECT_EQ(events.count(event_type::contended), 0U);

    std::this_thread::sleep_for(120ms);
    m.unlock();
    const auto released = events.first(event_type::released);
    ASSERT_TRUE(released);
    EXPECT_EQ(released->kind, lock_kind::mutex);
    EXPECT_EQ(released->name, "orders:1");
    EXPECT_GE(released->held, 120ms);
    EXPECT_LT(released->held, 5s);
    EXPECT_TRUE(released->detail.empty()) << released->detail;
    EXPECT_EQ(released->thread, std::this_thread::get_id());
    EXPECT_EQ(events.count(event_type::lost), 0U);
}

TEST(Events, AcquisitionAfterContentionCountsItsAttemptsAndWait) {
    redis_server srv;
    recorder events;
    redislock::client observed{srv.uri(), {.on_event = events.hook()}};
    redislock::client other{srv.uri()};
    auto holder = other.mutex("orders:2", {.lease = 5s});
    auto waiter = observed.mutex("orders:2", {.lease = 5s});

    std::atomic<bool> held{false};
    std::thread releaser{[&] {
        holder.lock();
        held = true;
        std::this_thread::sleep_for(300ms);
        holder.unlock();
    }};
    ASSERT_TRUE(eventually([&] { return held.load(); }));
    const bool got = waiter.try_lock_for(4s);
    releaser.join();
    ASSERT_TRUE(got);

    const auto contended = events.of(event_type::contended);
    ASSERT_FALSE(contended.empty());
    EXPECT_EQ(contended.front().kind, lock_kind::mutex);
    EXPECT_EQ(contended.front().name, "orders:2");
    EXPECT_EQ(contended.front().attempts, 1U);
    EXPECT_EQ(contended.front().thread, std::this_thread::get_id());
    for (std::size_t i = 1; i < contended.size(); ++i) {
        EXPECT_EQ(contended[i].attempts, i + 1);
    }
    const auto acquired = events.first(event_type::acquired);
    ASSERT_TRUE(acquired);
    EXPECT_GT(acquired->attempts, 1U);
    EXPECT_EQ(acquired->attempts, contended.size() + 1);
    EXPECT_GE(acquired->wait, 200ms);
    EXPECT_LT(acquired->wait, 3s);  // woken by the release, not by the lease running out
    waiter.unlock();
    // The lock was handed over on release: its hold time starts then, not when the wait began.
    const auto released = events.first(event_type::released);
    ASSERT_TRUE(released);
    EXPECT_LT(released->held * 2, acquired->wait);
}

TEST(Events, ContendedTryLockTellsTheHoldersRemainingLease) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto holder = client.mutex("orders:3", {.lease = 5s});
    auto other = client.mutex("orders:3", {.lease = 5s});

    holder.lock();
    EXPECT_FALSE(other.try_lock());
    const auto contended = events.first(event_type::contended);
    ASSERT_TRUE(contended);
    EXPECT_EQ(contended->attempts, 1U);
    EXPECT_GT(contended->holder_ttl, 0ms);
    EXPECT_LE(contended->holder_ttl, 5s);
    EXPECT_EQ(events.count(event_type::acquired), 1U);  // the holder's only
    holder.unlock();
}

TEST(Events, RecursiveMutexReportsTheFirstEntryAndTheLastReleaseOnly) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto m = client.recursive_mutex("tree", {.lease = 5s});

    m.lock();
    m.lock();
    m.unlock();
    EXPECT_EQ(events.count(event_type::acquired), 1U);
    EXPECT_EQ(events.count(event_type::released), 0U);
    m.unlock();
    ASSERT_EQ(events.count(event_type::released), 1U);
    const auto acquired = events.first(event_type::acquired);
    ASSERT_TRUE(acquired);
    EXPECT_EQ(acquired->kind, lock_kind::recursive_mutex);
    EXPECT_EQ(events.of(event_type::released).front().kind, lock_kind::recursive_mutex);
}

TEST(Events, SharedMutexTellsTheReadAndWriteSidesApart) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto rw = client.shared_mutex("catalog", {.lease = 5s});

    rw.lock_shared();
    rw.unlock_shared();
    rw.lock();
    rw.unlock();
    const auto acquired = events.of(event_type::acquired);
    const auto released = events.of(event_type::released);
    ASSERT_EQ(acquired.size(), 2U);
    ASSERT_EQ(released.size(), 2U);
    EXPECT_EQ(acquired[0].kind, lock_kind::shared_mutex_read);
    EXPECT_EQ(released[0].kind, lock_kind::shared_mutex_read);
    EXPECT_EQ(acquired[1].kind, lock_kind::shared_mutex_write);
    EXPECT_EQ(released[1].kind, lock_kind::shared_mutex_write);
}

// ---------------------------------------------------------------------------------------------
// Loss

TEST(Events, LeaseRunningOutWithoutWatchdogIsLostAsExpiredOnTheLossTimerThread) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    std::atomic<int> plain_calls{0};
    std::atomic<int> reason_calls{0};
    std::atomic<loss_reason> told{loss_reason::taken};
    auto m = client.mutex("short", {.lease = 200ms,
                                    .on_lost = [&] { plain_calls.fetch_add(1); },
                                    .on_lost_reason =
                                        [&](loss_reason why) {
                                            told = why;
                                            reason_calls.fetch_add(1);
                                        }});

    m.lock();
    const auto lost = events.first(event_type::lost);
    ASSERT_TRUE(lost);
    EXPECT_EQ(lost->reason, loss_reason::expired);
    EXPECT_EQ(lost->kind, lock_kind::mutex);
    EXPECT_EQ(lost->name, "short");
    EXPECT_GE(lost->held, 150ms);
    EXPECT_NE(lost->thread, std::this_thread::get_id());
    ASSERT_TRUE(eventually([&] { return reason_calls.load() == 1; }));
    EXPECT_EQ(plain_calls.load(), 1);
    EXPECT_EQ(told.load(), loss_reason::expired);
    EXPECT_EQ(events.count(event_type::renewal_failed), 0U);  // nothing was renewing it

    std::error_code ec;
    m.unlock(ec);
    std::this_thread::sleep_for(50ms);
    EXPECT_EQ(events.count(event_type::lost), 1U);
    EXPECT_EQ(events.count(event_type::released), 0U);
    EXPECT_EQ(reason_calls.load(), 1);
}

TEST(Events, WatchdogStoppingAtMaxHoldIsToldAsSuchThenLostAsExpired) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto m = client.mutex("capped", {.lease = 200ms, .watchdog = true, .max_hold = 400ms});
    m.lock();
    const auto lost = events.first(event_type::lost, 5s);
    ASSERT_TRUE(lost);
    EXPECT_EQ(lost->reason, loss_reason::expired);
    EXPECT_GE(lost->held, 400ms);
    const auto failed = events.of(event_type::renewal_failed);
    ASSERT_EQ(failed.size(), 1U);
    EXPECT_EQ(failed.front().detail, "max_hold reached");
    EXPECT_EQ(failed.front().reason, loss_reason::expired);
}

TEST(Events, AcquiredComesBeforeTheLossEvenWhenTheHookIsSlowerThanTheLease) {
    redis_server srv;
    recorder events;
    const redislock::event_hook record = events.hook();
    // The hook takes longer than the lease over each acquired event: the loss must still be
    // told after it.
    redislock::client client{srv.uri(), {.on_event = [record](const lock_event& e) {
                                 if (e.type == event_type::acquired) {
                                     std::this_thread::sleep_for(20ms);
                                 }
                                 record(e);
                             }}};
    auto m = client.mutex("tiny", {.lease = 10ms});
    auto rw = client.shared_mutex("tiny-rw", {.lease = 10ms});
    auto re = client.recursive_mutex("tiny-re", {.lease = 10ms});
    for (int i = 0; i < 3; ++i) {
        m.lock();
        rw.lock_shared();
        re.lock();
        ASSERT_TRUE(eventually([&] { return events.count(event_type::lost) == 3U * (i + 1); }));
        std::error_code ignored;
        m.unlock(ignored);
        rw.unlock_shared(ignored);
        re.unlock(ignored);
    }
    // Per lock: acquired, lost, acquired, lost, ...
    for (const char* name : {"tiny", "tiny-rw", "tiny-re"}) {
        std::vector<event_type> order;
        std::string told;
        for (const seen& e : events.all()) {
            if (e.name == name && (e.type == event_type::acquired || e.type == event_type::lost ||
                                   e.type == event_type::released)) {
                order.push_back(e.type);
                told += std::string{redislock::to_string(e.type)} + " ";
            }
        }
        ASSERT_EQ(order.size(), 6U) << name << ": " << told;
        for (std::size_t i = 0; i < order.size(); ++i) {
            EXPECT_EQ(order[i], i % 2 == 0 ? event_type::acquired : event_type::lost)
                << name << ": " << told;
        }
    }
}

TEST(Events, RenewalsStuckBeforeMaxHoldAreAFailureNotTheCap) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    // Renewals every 100 ms; the one due at 300 ms would be the last (its successor falls past
    // max_hold). The server hangs after the first renewal, so the lease runs out past max_hold
    // while renewals were still due: a failure, not the cap.
    auto m = client.mutex("stuck", {.lease = 300ms, .watchdog = true, .max_hold = 350ms});
    const auto start = std::chrono::steady_clock::now();
    m.lock();
    const auto initial = m.remaining();
    ASSERT_TRUE(eventually(
        [&] {
            const auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
                std::chrono::steady_clock::now() - start);
            return m.remaining() > initial - elapsed + 30ms;  // the deadline moved: renewed
        },
        1s));
    srv.pause();
    const auto lost = events.first(event_type::lost, 5s);
    srv.resume();
    ASSERT_TRUE(lost);
    EXPECT_GE(lost->held, 350ms);
    const auto failed = events.of(event_type::renewal_failed);
    ASSERT_FALSE(failed.empty());
    EXPECT_NE(failed.back().detail, "max_hold reached");
}

TEST(Events, KeyTakenByAnotherHolderIsLostAsTakenWhenUnlockFindsOut) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    std::atomic<loss_reason> told{loss_reason::expired};
    auto m = client.mutex("stolen",
                          {.lease = 5s, .on_lost_reason = [&](loss_reason why) { told = why; }});

    m.lock();
    srv.cli({"SET", "stolen", "someone-else"});
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    const auto lost = events.first(event_type::lost);
    ASSERT_TRUE(lost);
    EXPECT_EQ(lost->reason, loss_reason::taken);
    EXPECT_EQ(lost->thread, std::this_thread::get_id());
    EXPECT_EQ(told.load(), loss_reason::taken);
    EXPECT_EQ(events.count(event_type::released), 0U);
}

TEST(Events, VerifyTellsTakenFromServerLost) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto taken = client.mutex("v:taken", {.lease = 5s});
    auto gone = client.mutex("v:gone", {.lease = 5s});
    auto retyped = client.recursive_mutex("v:retyped", {.lease = 5s});

    taken.lock();
    gone.lock();
    retyped.lock();
    srv.cli({"SET", "v:taken", "someone-else"});
    srv.cli({"DEL", "v:gone"});
    srv.cli({"DEL", "v:retyped"});
    srv.cli({"SET", "v:retyped", "a string"});
    EXPECT_FALSE(taken.verify());
    EXPECT_FALSE(gone.verify());
    EXPECT_FALSE(retyped.verify());

    const auto lost = events.of(event_type::lost);
    ASSERT_EQ(lost.size(), 3U);
    EXPECT_EQ(lost[0].name, "v:taken");
    EXPECT_EQ(lost[0].reason, loss_reason::taken);
    EXPECT_EQ(lost[1].name, "v:gone");
    EXPECT_EQ(lost[1].reason, loss_reason::server_lost);
    EXPECT_EQ(lost[2].name, "v:retyped");
    EXPECT_EQ(lost[2].kind, lock_kind::recursive_mutex);
    EXPECT_EQ(lost[2].reason, loss_reason::server_lost);
}

TEST(Events, KeyDeletedUnderTheWatchdogIsARenewalFailureThenALossOnTheWatchdogThread) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    std::atomic<loss_reason> told{loss_reason::expired};
    auto m = client.mutex(
        "renewed",
        {.lease = 600ms, .watchdog = true, .on_lost_reason = [&](loss_reason why) { told = why; }});

    m.lock();
    srv.cli({"DEL", "renewed"});
    const auto failed = events.first(event_type::renewal_failed);
    ASSERT_TRUE(failed);
    EXPECT_EQ(failed->reason, loss_reason::taken);
    EXPECT_EQ(failed->name, "renewed");
    EXPECT_EQ(failed->kind, lock_kind::mutex);
    EXPECT_FALSE(failed->detail.empty());
    EXPECT_NE(failed->thread, std::this_thread::get_id());
    const auto lost = events.first(event_type::lost);
    ASSERT_TRUE(lost);
    EXPECT_EQ(lost->reason, loss_reason::taken);
    EXPECT_EQ(lost->thread, failed->thread);
    EXPECT_TRUE(eventually([&] { return told.load() == loss_reason::taken; }));
    EXPECT_EQ(events.count(event_type::lost), 1U);
}

TEST(Events, RenewalsStuckOnAPausedServerEndInRenewalFailedThenLostExpired) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    std::atomic<loss_reason> told{loss_reason::taken};
    auto m = client.shared_mutex(
        "stalled",
        {.lease = 600ms, .watchdog = true, .on_lost_reason = [&](loss_reason why) { told = why; }});

    m.lock();
    srv.pause();
    const auto lost = events.first(event_type::lost, 3s);
    srv.resume();
    ASSERT_TRUE(lost);
    EXPECT_EQ(lost->reason, loss_reason::expired);
    EXPECT_EQ(lost->kind, lock_kind::shared_mutex_write);
    EXPECT_GE(lost->held, 500ms);
    EXPECT_NE(lost->thread, std::this_thread::get_id());
    const auto failed = events.first(event_type::renewal_failed);
    ASSERT_TRUE(failed);
    EXPECT_EQ(failed->reason, loss_reason::expired);
    EXPECT_EQ(failed->thread, lost->thread);  // the loss timer's, not the stuck watchdog's
    EXPECT_TRUE(eventually([&] { return told.load() == loss_reason::expired; }));
    EXPECT_FALSE(m.owned());
}

TEST(Events, TransientRenewalFailuresAreReportedAsRetriedAndTheLockIsKept) {
    redis_server srv;
    recorder events;
    redislock::basic_client<fault_connection> client{srv.uri(), {.on_event = events.hook()}};
    auto m = client.mutex("flaky", {.lease = 600ms, .watchdog = true});

    m.lock();
    client.connection().inject(fault::answer_error, "EVALSHA", 2,
                               redislock::detail::scripts::mutex_extend,
                               "LOADING Redis is loading the dataset in memory");
    ASSERT_TRUE(eventually([&] { return client.connection().pending_faults() == 0; }, 3s));
    ASSERT_TRUE(eventually([&] { return events.count(event_type::renewal_retried) == 2; }));
    const auto retried = events.of(event_type::renewal_retried);
    EXPECT_EQ(retried.front().name, "flaky");
    EXPECT_EQ(retried.front().kind, lock_kind::mutex);
    EXPECT_NE(retried.front().detail.find("LOADING"), std::string::npos) << retried.front().detail;
    EXPECT_NE(retried.front().thread, std::this_thread::get_id());
    std::this_thread::sleep_for(300ms);
    EXPECT_TRUE(m.owned());
    EXPECT_EQ(events.count(event_type::renewal_failed), 0U);
    EXPECT_EQ(events.count(event_type::lost), 0U);
    m.unlock();
}

TEST(Events, WatchdogStoppedWhileHeldIsLostAsClientShutdown) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    std::atomic<loss_reason> told{loss_reason::taken};
    auto m = client.mutex(
        "orphan",
        {.lease = 300ms, .watchdog = true, .on_lost_reason = [&](loss_reason why) { told = why; }});

    m.lock();
    client.watchdog().stop();
    const auto lost = events.first(event_type::lost);
    ASSERT_TRUE(lost);
    EXPECT_EQ(lost->reason, loss_reason::client_shutdown);
    EXPECT_TRUE(eventually([&] { return told.load() == loss_reason::client_shutdown; }));
    EXPECT_EQ(events.count(event_type::renewal_failed), 0U);
}

// ---------------------------------------------------------------------------------------------
// The connection

TEST(Events, ScriptFlushIsHealedAndReportedAsScriptReloaded) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto m = client.mutex("reload", {.lease = 5s});

    m.lock();
    m.unlock();  // the first release on this server loads its script: that counts too
    const std::size_t before = events.count(event_type::script_reloaded);
    m.lock();
    m.unlock();
    EXPECT_EQ(events.count(event_type::script_reloaded), before);  // loaded now
    srv.script_flush();
    m.lock();
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    ASSERT_EQ(events.count(event_type::script_reloaded), before + 1);
    const auto reloaded = events.of(event_type::script_reloaded).back();
    EXPECT_EQ(reloaded.name, "reload");
    EXPECT_EQ(reloaded.detail, "mutex_release");
    EXPECT_EQ(reloaded.kind, lock_kind::none);
    EXPECT_EQ(reloaded.thread, std::this_thread::get_id());
}

TEST(Events, ClientKillIsHealedByANewConnectionAndReportedAsReconnected) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto m = client.mutex("reconnect", {.lease = 5s});

    m.lock();
    m.unlock();
    EXPECT_EQ(events.count(event_type::reconnected), 0U);
    EXPECT_GE(srv.client_kill_all(), 1);
    std::this_thread::sleep_for(20ms);  // past the idle check's millisecond
    m.lock();
    m.unlock();
    const auto reconnected = events.first(event_type::reconnected);
    ASSERT_TRUE(reconnected);
    EXPECT_NE(reconnected->name.find(std::to_string(srv.port())), std::string::npos)
        << reconnected->name;
    EXPECT_EQ(reconnected->kind, lock_kind::none);
    EXPECT_EQ(events.count(event_type::reconnected), 1U);
}

// ---------------------------------------------------------------------------------------------
// The hook's rules

TEST(Events, HookMayCallBackIntoTheLockOnEveryThreadWithoutDeadlock) {
    redis_server srv;
    std::atomic<redislock::mutex*> target{nullptr};
    std::atomic<int> calls{0};
    std::atomic<bool> owned_when_acquired{false};
    std::atomic<bool> owned_when_lost{true};
    const auto hook = [&](const lock_event& e) {
        redislock::mutex* m = target.load();
        if (m == nullptr) {
            return;
        }
        calls.fetch_add(1);
        switch (e.type) {
            case event_type::acquired:
                owned_when_acquired = m->owned();
                (void)m->remaining();
                (void)m->lost_token();
                break;
            case event_type::lost:
                // On the loss timer's thread, about the lock's own lease: a query and a round
                // trip through the lock.
                owned_when_lost = m->owned();
                try {
                    (void)m->verify();
                } catch (const redislock::error&) {
                }
                break;
            default:
                (void)m->owned();
                (void)m->fencing_token();
                break;
        }
    };
    redislock::client client{srv.uri(), {.on_event = hook}};
    auto m = client.mutex("reentrant-hook", {.lease = 250ms, .fencing = true});
    target = &m;

    m.lock();
    EXPECT_TRUE(owned_when_acquired.load());
    m.unlock();
    m.lock();  // this time the lease runs out: the loss timer's thread calls the hook
    ASSERT_TRUE(eventually([&] { return !owned_when_lost.load(); }, 5s));
    EXPECT_FALSE(m.owned());
    std::error_code ec;
    m.unlock(ec);  // released or found gone, depending on the server's own expiry
    EXPECT_TRUE(m.try_lock_for(2s));
    m.unlock();
    target = nullptr;
    EXPECT_GE(calls.load(), 5);
}

TEST(Events, HookOnTheWatchdogThreadMayCallBackIntoTheLock) {
    redis_server srv;
    std::atomic<redislock::mutex*> target{nullptr};
    std::atomic<int> told{0};
    const auto hook = [&](const lock_event& e) {
        if (redislock::mutex* m = target.load();
            m != nullptr && (e.type == event_type::renewal_failed || e.type == event_type::lost)) {
            (void)m->owned();
            std::error_code ec;
            m->unlock(ec);
            told.fetch_add(1);
        }
    };
    redislock::client client{srv.uri(), {.on_event = hook}};
    auto m = client.mutex("watched-hook", {.lease = 600ms, .watchdog = true});
    target = &m;

    m.lock();
    srv.cli({"DEL", "watched-hook"});
    ASSERT_TRUE(eventually([&] { return told.load() == 2; }, 5s));
    EXPECT_FALSE(m.owned());
    target = nullptr;
}

TEST(Events, AThrowingHookChangesNothing) {
    redis_server srv;
    std::atomic<int> calls{0};
    redislock::client client{srv.uri(), {.on_event = [&](const lock_event&) {
                                 calls.fetch_add(1);
                                 throw std::runtime_error{"hook failed"};
                             }}};
    std::atomic<int> lost{0};
    auto m = client.mutex("throwing", {.lease = 200ms, .on_lost = [&] { lost.fetch_add(1); }});
    auto other = client.mutex("throwing", {.lease = 200ms});

    m.lock();
    EXPECT_FALSE(other.try_lock());
    EXPECT_TRUE(m.owned());
    ASSERT_TRUE(eventually([&] { return lost.load() == 1; }, 5s));  // expired, told anyway
    EXPECT_TRUE(other.try_lock_for(2s));
    other.unlock();
    EXPECT_GE(calls.load(), 4);  // acquired, contended, lost, acquired, released
}

TEST(Events, WithoutAHookLocksBehaveAsBefore) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::atomic<int> plain{0};
    std::atomic<loss_reason> told{loss_reason::taken};
    auto m = client.mutex("plain", {.lease = 200ms,
                                    .on_lost = [&] { plain.fetch_add(1); },
                                    .on_lost_reason = [&](loss_reason why) { told = why; }});
    auto other = client.mutex("plain", {.lease = 5s});

    m.lock();
    EXPECT_FALSE(other.try_lock());
    ASSERT_TRUE(eventually([&] { return plain.load() == 1; }, 5s));
    EXPECT_TRUE(eventually([&] { return told.load() == loss_reason::expired; }));
    EXPECT_TRUE(other.try_lock_for(2s));
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(plain.load(), 1);  // told once
    other.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    srv.script_flush();
    EXPECT_TRUE(m.try_lock());
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
}

TEST(Events, OnLostAloneStillWorksAsAPlainCallback) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::atomic<int> calls{0};
    redislock::lock_options options{.lease = 200ms};
    options.on_lost = [&] { calls.fetch_add(1); };
    auto m = client.mutex("compat", options);
    m.lock();
    EXPECT_TRUE(eventually([&] { return calls.load() == 1; }, 5s));
}

// A server that may evict keys (any maxmemory-policy but noeviction) can drop a lock, or the
// queue beside it: the client says so once, as it is made; a server with noeviction, and a
// client without a hook, hear nothing of it.
TEST(Events, ServerThatMayEvictKeysIsReportedWhenTheClientConnects) {
    for (const std::string policy : {"allkeys-lru", "volatile-ttl"}) {
        SCOPED_TRACE(policy);
        redis_server srv{{.extra_args = {"--maxmemory", "100mb", "--maxmemory-policy", policy}}};
        recorder events;
        redislock::client client{srv.uri(), {.on_event = events.hook()}};
        const auto told = events.of(event_type::evicting_server);
        ASSERT_EQ(told.size(), 1U);
        EXPECT_EQ(told.front().name, "127.0.0.1:" + std::to_string(srv.port()));
        EXPECT_EQ(told.front().kind, lock_kind::none);
        EXPECT_NE(told.front().detail.find("maxmemory-policy " + policy), std::string::npos)
            << told.front().detail;
        EXPECT_NE(told.front().detail.find("noeviction"), std::string::npos) << told.front().detail;
        // Locks work as before: the event is a warning, not a refusal.
        auto m = client.mutex("x");
        EXPECT_TRUE(m.try_lock());
        m.unlock();
        EXPECT_EQ(events.count(event_type::evicting_server), 1U);
    }
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto m = client.mutex("x");
    EXPECT_TRUE(m.try_lock());
    m.unlock();
    EXPECT_EQ(events.count(event_type::evicting_server), 0U);
}

TEST(Events, NamesOfEveryEnumeratorAreSpelledOut) {
    EXPECT_EQ(redislock::to_string(event_type::acquired), "acquired");
    EXPECT_EQ(redislock::to_string(event_type::script_reloaded), "script_reloaded");
    EXPECT_EQ(redislock::to_string(event_type::subscription_refused), "subscription_refused");
    EXPECT_EQ(redislock::to_string(event_type::unlock_refused), "unlock_refused");
    EXPECT_EQ(redislock::to_string(event_type::lease_too_short), "lease_too_short");
    EXPECT_EQ(redislock::to_string(event_type::late_grant), "late_grant");
    EXPECT_EQ(redislock::to_string(event_type::evicting_server), "evicting_server");
    EXPECT_EQ(redislock::to_string(lock_kind::shared_mutex_read), "shared_mutex_read");
    EXPECT_EQ(redislock::to_string(loss_reason::client_shutdown), "client_shutdown");
    EXPECT_EQ(redislock::to_string(loss_reason::server_lost), "server_lost");
}

// A client whose ACL user may not listen on a lock's channels (NOPERM) is told so once per
// refusal, naming the lock; its waiter still gets the lock, by polling.
TEST(Events, RefusedSubscriptionIsReportedAndTheWaiterPolls) {
    redis_server srv;
    ASSERT_EQ(
        srv.cli({"ACL", "SETUSER", "nochannels", "on", ">pw", "~*", "+@all", "resetchannels"}),
        "OK");
    std::mutex mutex;
    std::vector<std::string> refusals;
    redislock::client holder_client{srv.uri()};
    redislock::client client{
        "redis://nochannels:pw@127.0.0.1:" + std::to_string(srv.port()),
        {.on_event = [&](const lock_event& e) {
            if (e.type == event_type::subscription_refused) {
                std::lock_guard guard{mutex};
                refusals.push_back(std::string{e.name} + " " + std::string{e.detail});
                EXPECT_EQ(e.kind, lock_kind::none);
            }
        }}};
    const auto refused = [&] {
        std::lock_guard guard{mutex};
        return refusals;
    };
    auto holder = holder_client.mutex("acl", {.lease = 30s});
    auto waiter = client.mutex("acl", {.lease = 30s});
    ASSERT_TRUE(holder.try_lock());
    redislock::test::waiting_thread t{waiter, 20s};
    ASSERT_TRUE(eventually([&] { return !refused().empty(); }));
    holder.unlock();
    EXPECT_TRUE(eventually([&] { return t.got(); }, 5s));
    t.join();
    ASSERT_EQ(refused().size(), 1u);
    EXPECT_EQ(refused().front().rfind("acl NOPERM", 0), 0u) << refused().front();
}

// ---------------------------------------------------------------------------------------------
// Misuse, and settings that cannot work

// On f377ae8 each of these went untold: the not_holder of a guard released on another thread
// was swallowed by unlock() while the watchdog kept renewing the lock; a watchdog lease below
// 6 x command_timeout was accepted silently; an untimed lock() whose replies all came after the
// lease spun without an event (still spinning after 20 s).

// The events of `type` about `name`.
std::vector<seen> about(const recorder& events, event_type type, const std::string& name) {
    std::vector<seen> out;
    for (const seen& s : events.of(type)) {
        if (s.name == name) {
            out.push_back(s);
        }
    }
    return out;
}

// A guard taken on this thread and released on another (a coroutine resumed elsewhere): the
// unlock is refused and told with both threads; the holder keeps the lock, renewed.
template <bool Shared = false, class Lock>
void expect_foreign_unlock_told(const recorder& events, Lock& lock, const std::string& name,
                                lock_kind kind) {
    std::thread::id releaser;
    if constexpr (Shared) {
        std::shared_lock guard{lock};
        std::thread{[&] {
            releaser = std::this_thread::get_id();
            guard.unlock();
        }}.join();
    } else {
        std::unique_lock guard{lock};
        std::thread{[&] {
            releaser = std::this_thread::get_id();
            guard.unlock();
        }}.join();
    }
    // The guards ended without owning: the lock is still held by this thread.
    EXPECT_TRUE(lock.owned());
    const auto told = about(events, event_type::unlock_refused, name);
    ASSERT_EQ(told.size(), 1U) << "the refused unlock of '" << name << "' was not told once";
    EXPECT_EQ(told.front().kind, kind);
    EXPECT_EQ(told.front().holder_thread, std::this_thread::get_id());
    EXPECT_EQ(told.front().caller_thread, releaser);
    EXPECT_EQ(told.front().thread, releaser);
    EXPECT_NE(told.front().detail.find("nothing was sent"), std::string::npos);
    std::error_code ec;
    if constexpr (Shared) {
        lock.unlock_shared(ec);
    } else {
        lock.unlock(ec);
    }
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(about(events, event_type::unlock_refused, name).size(), 1U);
}

TEST(Events, UnlockFromAnotherThreadIsReportedWithBothThreads) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    const lock_options renewed{.lease = 30s, .watchdog = true};
    auto m = client.mutex("misuse:mutex", renewed);
    auto r = client.recursive_mutex("misuse:recursive", renewed);
    auto s = client.shared_mutex("misuse:shared:write", renewed);
    auto reader = client.shared_mutex("misuse:shared:read", renewed);
    expect_foreign_unlock_told(events, m, "misuse:mutex", lock_kind::mutex);
    expect_foreign_unlock_told(events, r, "misuse:recursive", lock_kind::recursive_mutex);
    expect_foreign_unlock_told(events, s, "misuse:shared:write", lock_kind::shared_mutex_write);
    expect_foreign_unlock_told<true>(events, reader, "misuse:shared:read",
                                     lock_kind::shared_mutex_read);
    // An unlock of a lock nobody holds is not this misuse: it reports not_held, told as before
    // (not at all).
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::not_held);
    EXPECT_EQ(events.count(event_type::unlock_refused), 4U);
}

// The docs' rule (docs/configuration.md, "Rules of thumb"): with the watchdog, lease >= 6 x
// command_timeout. The README's first watchdog example (5 s under the default 2 s) breaks it.
TEST(Events, WatchdogLeaseBelowSixCommandTimeoutsIsReportedAtCreation) {
    redis_server srv;
    recorder events;
    redislock::client client{srv.uri(), {.on_event = events.hook()}};
    auto job = client.mutex("nightly", {.lease = 5s, .watchdog = true});
    auto entries = client.recursive_mutex("entries", {.lease = 11999ms, .watchdog = true});
    auto catalog = client.shared_mutex("catalog", {.lease = 1500ms, .watchdog = true});
    const auto told = events.of(event_type::lease_too_short);
    ASSERT_EQ(told.size(), 3U);
    EXPECT_EQ(told[0].name, "nightly");
    EXPECT_EQ(told[0].kind, lock_kind::mutex);
    EXPECT_EQ(told[0].thread, std::this_thread::get_id());
    EXPECT_NE(told[0].detail.find("5000 ms"), std::string::npos) << told[0].detail;
    EXPECT_NE(told[0].detail.find("2000 ms"), std::string::npos) << told[0].detail;
    EXPECT_EQ(told[1].name, "entries");
    EXPECT_EQ(told[1].kind, lock_kind::recursive_mutex);
    EXPECT_EQ(told[2].name, "catalog");
    EXPECT_EQ(told[2].kind, lock_kind::shared_mutex_write);

    // The rule met, or no watchdog: nothing told.
    auto long_enough = client.mutex("nightly", {.lease = 12s, .watchdog = true});
    auto unrenewed = client.mutex("nightly", {.lease = 5s});
    redislock::client quick{with_query(srv, "command_timeout=500"), {.on_event = events.hook()}};
    auto fixed = quick.mutex("nightly", {.lease = 3s, .watchdog = true});
    EXPECT_EQ(events.count(event_type::lease_too_short), 3U);
}

// Each way 150 ms: every reply comes 300 ms after its request, past the 200 ms lease, and no
// grant can stand. Every lock call throws lease_error after three such attempts in a row
// (docs/guarantees.md, "Attempts that can never succeed"), each refused grant told as
// late_grant; an untimed lock() spun for ever on f377ae8.
TEST(Events, LockCallsWhoseRepliesAllOutliveTheLeaseThrowAndTellEachRefusedGrant) {
    redis_server srv;
    redislock::test::fault_proxy proxy{srv};
    recorder events;
    redislock::client client{proxy.uri(), {.on_event = events.hook()}};
    const lock_options short_lease{.lease = 200ms};
    auto m = client.mutex("hopeless:mutex", short_lease);
    auto r = client.recursive_mutex("hopeless:recursive", short_lease);
    auto s = client.shared_mutex("hopeless:shared", short_lease);
    // The connection is set up, and the scripts loaded, while the path is fast.
    ASSERT_TRUE(m.try_lock_for(5s));
    m.unlock();
    ASSERT_TRUE(r.try_lock_for(5s));
    r.unlock();
    ASSERT_TRUE(s.try_lock_for(5s));
    s.unlock();
    ASSERT_TRUE(s.try_lock_shared_for(5s));
    s.unlock_shared();
    proxy.delay(150ms);

    std::atomic<int> ended{0};
    std::atomic<int> refused{0};
    const auto expect_refused = [&](auto call) {
        try {
            call();
        } catch (const redislock::lease_error& e) {
            ++refused;
            EXPECT_NE(std::string{e.what()}.find("3 attempts in a row"), std::string::npos)
                << e.what();
        } catch (const std::exception& e) {
            ADD_FAILURE() << "not lease_error: " << e.what();
        }
        ++ended;
    };
    std::jthread calls{[&] {
        expect_refused([&] { m.lock(); });
        expect_refused([&] { (void)r.try_lock_for(60s); });
        expect_refused([&] { s.lock(); });
        expect_refused([&] {
            std::stop_source never;
            (void)s.lock_shared(never.get_token());
        });
    }};
    // Three attempts of 300 ms each, and a waiter's pauses between them, per call.
    const bool all_ended = eventually([&] { return ended.load() == 4; }, 40s);
    proxy.delay(0ms);  // lets a call still spinning end
    calls.join();
    ASSERT_TRUE(all_ended) << ended.load() << " of 4 lock calls ended";
    EXPECT_EQ(refused.load(), 4);
    EXPECT_FALSE(m.owned());
    EXPECT_FALSE(r.owned());
    EXPECT_FALSE(s.owned());

    // Each call told at least one refused grant, with its round trip: at least the proxy's delay
    // both ways.
    for (const std::string_view name :
         {"hopeless:mutex", "hopeless:recursive", "hopeless:shared"}) {
        const auto late = about(events, event_type::late_grant, std::string{name});
        ASSERT_FALSE(late.empty()) << name;
        EXPECT_GE(late.front().attempts, 1U);
        EXPECT_GE(late.front().round_trip, 300ms) << name;
    }
    EXPECT_EQ(about(events, event_type::late_grant, "hopeless:mutex").front().kind,
              lock_kind::mutex);

    // A single late reply is a failed attempt, not an error: a try_lock() says false.
    proxy.delay(150ms);
    EXPECT_FALSE(m.try_lock());
    proxy.delay(0ms);
    // Nothing is left held once the path is fast again.
    redislock::client rival_client{srv.uri()};
    auto rival = rival_client.mutex("hopeless:mutex", {.lease = 5s});
    EXPECT_TRUE(eventually([&] { return rival.try_lock(); }, 5s));
    rival.unlock();
}

}  // namespace
