// The safety contract of DESIGN.md §5b, one numbered defect of the safety issue at a time, for
// every lock kind the defect concerns. Each test says in a comment what the library did before
// the fix, which the test fails on; the few that guard the other side of a rule say so. Faults come
// from the test fixtures: a TCP proxy that stalls, delays or loses replies (fault_proxy), a
// connection wrapper that breaks chosen commands (faulty_connection), and the server itself paused,
// flushed, restarted or out of memory (redis_server). Timings leave room for a loaded two-core
// machine; every wait is bounded.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/redislock.hpp>

#include "support/exclusion.hpp"
#include "support/fault_proxy.hpp"
#include "support/faulty_connection.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::errc;
using redislock::hiredis_connection;
using redislock::lock_options;
using redislock::test::eventually;
using redislock::test::fault_action;
using redislock::test::fault_proxy;
using redislock::test::fault_rule;
using redislock::test::lost_counter;
using redislock::test::monotonic_ns;
using redislock::test::redis_server;
using redislock::test::stopwatch;
using redislock::test::with_query;
using faulty = redislock::test::faulty_connection<hiredis_connection>;
using faulty_client = redislock::basic_client<faulty>;

constexpr std::int64_t ns_per_ms = 1'000'000;

bool key_exists(const redis_server& srv, const std::string& key) {
    return srv.cli({"EXISTS", key}) == "1";
}

// Keys named `names` all gone within `timeout`.
bool all_gone(const redis_server& srv, const std::vector<std::string>& names,
              std::chrono::milliseconds timeout) {
    return eventually(
        [&] {
            for (const auto& name : names) {
                if (key_exists(srv, name)) {
                    return false;
                }
            }
            return true;
        },
        timeout);
}

// Resumes a paused server when the test leaves its scope, also on a failed assertion, so the
// fixture's teardown never talks to a stopped server.
class resume_on_exit {
public:
    explicit resume_on_exit(redis_server& srv) : srv_{&srv} {}
    resume_on_exit(const resume_on_exit&) = delete;
    resume_on_exit& operator=(const resume_on_exit&) = delete;
    ~resume_on_exit() { srv_->resume(); }

private:
    redis_server* srv_;
};

// When a lock's loss was told: the on_lost call and the stop request of its lost_token(), on
// CLOCK_MONOTONIC; 0 while not told.
struct loss_times {
    std::atomic<std::int64_t> on_lost_ns{0};
    std::atomic<std::int64_t> stop_ns{0};
    std::atomic<int> on_lost_calls{0};

    std::function<void()> handler() {
        return [this] {
            on_lost_calls.fetch_add(1);
            std::int64_t unset = 0;
            on_lost_ns.compare_exchange_strong(unset, monotonic_ns());
        };
    }
    void stopped() {
        std::int64_t unset = 0;
        stop_ns.compare_exchange_strong(unset, monotonic_ns());
    }
};

// Defect 1, for one kind: `held` was acquired through `proxy` with the watchdog and a 1.5 s
// lease. The proxy stalls; `rival_try_lock` (a healthy direct path) is tried until it gets in.
// What the library promises apart from the scheduler: owned() (read from the clock) is false once
// the rival is inside, and the local deadline came before the rival got in. on_lost and
// lost_token() are told by the loss timer's thread, woken at the local deadline: they must come by
// the deadline + 100 ms and before the rival, on a machine that runs a woken thread soon enough.
// A probe thread woken for the same deadline measures that: when the probe itself woke late (a
// busy machine), the bounds move by its lateness, and the order against the rival is checked only
// when the probe woke within the first half of the time between the deadline and the rival's
// entry (docs/guarantees.md states the margin).
template <class Lock, class RivalTryLock>
void expect_loss_told_by_local_deadline(Lock& held, loss_times& loss, fault_proxy& proxy,
                                        RivalTryLock rival_try_lock) {
    // Renewals work before the fault: the lock outlives its first lease.
    std::this_thread::sleep_for(1800ms);
    ASSERT_TRUE(held.owned());
    ASSERT_EQ(loss.on_lost_calls.load(), 0);

    const std::stop_token lost = held.lost_token();
    ASSERT_FALSE(lost.stop_requested());
    std::stop_callback on_stop{lost, [&] { loss.stopped(); }};

    proxy.stall();
    const auto left = held.remaining();
    const std::int64_t local_deadline_ns = monotonic_ns() + left.count() * ns_per_ms;
    std::atomic<std::int64_t> probe_ns{0};
    std::jthread probe{[&, wake = std::chrono::steady_clock::now() + left] {
        std::this_thread::sleep_until(wake);
        probe_ns = monotonic_ns();
    }};

    std::int64_t rival_ns = 0;
    bool owned_when_rival_entered = true;
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (std::chrono::steady_clock::now() < give_up) {
        if (rival_try_lock()) {
            rival_ns = monotonic_ns();
            owned_when_rival_entered = held.owned();
            break;
        }
        std::this_thread::sleep_for(5ms);
    }
    probe.join();
    ASSERT_NE(rival_ns, 0) << "the rival never got the lock after the holder's path stalled";
    ASSERT_TRUE(eventually([&] { return loss.on_lost_ns.load() != 0; }, 5s))
        << "on_lost never came";

    EXPECT_FALSE(owned_when_rival_entered);
    EXPECT_LT(local_deadline_ns, rival_ns) << "the local deadline came after the rival was inside";
    EXPECT_TRUE(lost.stop_requested());
    EXPECT_NE(loss.stop_ns.load(), 0);
    const std::int64_t probe_late = std::max<std::int64_t>(probe_ns.load() - local_deadline_ns, 0);
    const std::int64_t told_by = local_deadline_ns + probe_late + 100 * ns_per_ms;
    EXPECT_LE(loss.on_lost_ns.load(), told_by)
        << "on_lost came " << (loss.on_lost_ns.load() - local_deadline_ns) / ns_per_ms
        << " ms after the local deadline (a thread woken for it: " << probe_late / ns_per_ms
        << " ms)";
    EXPECT_LE(loss.stop_ns.load(), told_by)
        << "lost_token() was stopped " << (loss.stop_ns.load() - local_deadline_ns) / ns_per_ms
        << " ms after the local deadline (a thread woken for it: " << probe_late / ns_per_ms
        << " ms)";
    if (probe_late < (rival_ns - local_deadline_ns) / 2) {
        EXPECT_LT(loss.on_lost_ns.load(), rival_ns) << "on_lost came after the rival was inside";
        EXPECT_LT(loss.stop_ns.load(), rival_ns)
            << "lost_token() stopped after the rival was inside";
    } else {
        std::printf(
            "[ note ] a thread woken for the local deadline ran %lld ms late, %lld ms "
            "before the rival got in: the order of on_lost and the rival is the "
            "scheduler's, not checked\n",
            static_cast<long long>(probe_late / ns_per_ms),
            static_cast<long long>((rival_ns - local_deadline_ns - probe_late) / ns_per_ms));
    }
    EXPECT_EQ(loss.on_lost_calls.load(), 1);
    proxy.resume();
}

lock_options watchdog_1500(loss_times& loss) {
    return lock_options{.lease = 1500ms, .watchdog = true, .on_lost = loss.handler()};
}

// ---------------------------------------------------------------------------------------------
// 1. on_lost after a rival is inside.

// Old: on_lost fired ~1 s after the rival got in, when the stalled renewal timed out.
TEST(Safety, StalledMutexHolderIsToldOfLossBeforeARivalIsInside) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::client holder_client{proxy.uri()};
    redislock::client rival_client{srv.uri()};
    loss_times loss;
    auto held = holder_client.mutex("safety:stall:mutex", watchdog_1500(loss));
    held.lock();
    auto rival = rival_client.mutex("safety:stall:mutex");
    expect_loss_told_by_local_deadline(held, loss, proxy, [&] { return rival.try_lock(); });
}

// Old: on_lost fired ~1 s after the rival got in, when the stalled renewal timed out.
TEST(Safety, StalledRecursiveMutexHolderIsToldOfLossBeforeARivalIsInside) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::client holder_client{proxy.uri()};
    redislock::client rival_client{srv.uri()};
    loss_times loss;
    auto held = holder_client.recursive_mutex("safety:stall:recursive", watchdog_1500(loss));
    held.lock();
    held.lock();
    auto rival = rival_client.recursive_mutex("safety:stall:recursive");
    expect_loss_told_by_local_deadline(held, loss, proxy, [&] { return rival.try_lock(); });
}

// Old: on_lost fired ~1 s after the rival got in, when the stalled renewal timed out.
TEST(Safety, StalledSharedMutexWriterIsToldOfLossBeforeARivalIsInside) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::client holder_client{proxy.uri()};
    redislock::client rival_client{srv.uri()};
    loss_times loss;
    auto held = holder_client.shared_mutex("safety:stall:shared-w", watchdog_1500(loss));
    held.lock();
    auto rival = rival_client.shared_mutex("safety:stall:shared-w");
    expect_loss_told_by_local_deadline(held, loss, proxy, [&] { return rival.try_lock(); });
}

// Old: on_lost fired ~1 s after the writer got in, when the stalled renewal timed out.
TEST(Safety, StalledSharedMutexReaderIsToldOfLossBeforeAWriterIsInside) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::client holder_client{proxy.uri()};
    redislock::client rival_client{srv.uri()};
    loss_times loss;
    auto held = holder_client.shared_mutex("safety:stall:shared-r", watchdog_1500(loss));
    held.lock_shared();
    auto rival = rival_client.shared_mutex("safety:stall:shared-r");
    expect_loss_told_by_local_deadline(held, loss, proxy, [&] { return rival.try_lock(); });
}

// ---------------------------------------------------------------------------------------------
// 2. Lost replies to releases and acquisitions of the reentrant kinds.

// The faults a lost release can meet: it ran and its reply was lost, or it never left.
const fault_action lost_release_faults[] = {fault_action::drop_reply,
                                            fault_action::throw_before_send};

// Old: later lock/unlock pairs re-entered the entry of a lost release and never freed the key.
TEST(Safety, RecursiveUnlockWhoseReplyIsLostNeverShutsOthersOut) {
    redis_server srv;
    for (const fault_action fault : lost_release_faults) {
        SCOPED_TRACE(std::string{redislock::test::to_string(fault)});
        const std::string name =
            "safety:lost-release:recursive:" + std::string{redislock::test::to_string(fault)};
        faulty conn{srv.uri()};
        faulty_client client{conn};
        redislock::client rival_client{srv.uri()};
        auto lock = client.recursive_mutex(name);
        auto rival = rival_client.recursive_mutex(name);

        lock.lock();
        conn.add(fault_rule{.command = "EVALSHA", .script = "recursive_release", .action = fault});
        std::error_code ec;
        lock.unlock(ec);
        EXPECT_TRUE(ec) << "a release whose outcome is unknown reported success";
        EXPECT_EQ(lock.depth(), 0u);

        for (int round = 0; round < 3; ++round) {
            SCOPED_TRACE("round " + std::to_string(round));
            ASSERT_TRUE(lock.try_lock_for(5s));
            ASSERT_TRUE(lock.try_lock_for(5s));  // a real re-entry of a real acquisition
            EXPECT_EQ(lock.depth(), 2u);
            EXPECT_TRUE(lock.verify());
            EXPECT_FALSE(rival.try_lock()) << "the owner believes it holds, but a rival got in";
            lock.unlock(ec);
            EXPECT_FALSE(ec) << ec.message();
            lock.unlock(ec);
            EXPECT_FALSE(ec) << ec.message();
            EXPECT_FALSE(lock.owned());
            // Lease 30 s: anything left behind would keep the rival out far longer than this.
            ASSERT_TRUE(eventually([&] { return rival.try_lock(); }, 2s))
                << "the final unlock left the lock held";
            rival.unlock();
        }
        EXPECT_TRUE(all_gone(srv, {name}, 2s));
    }
}

// Old: after a lost unlock_shared(), lock() by the same owner threw "would deadlock" for a lease.
TEST(Safety, SharedUnlockWhoseReplyIsLostNeverShutsOthersOut) {
    redis_server srv;
    for (const fault_action fault : lost_release_faults) {
        for (const bool reader : {true, false}) {
            const std::string label =
                std::string{redislock::test::to_string(fault)} + (reader ? ":read" : ":write");
            SCOPED_TRACE(label);
            const std::string name = "safety:lost-release:shared:" + label;
            faulty conn{srv.uri()};
            faulty_client client{conn};
            redislock::client rival_client{srv.uri()};
            auto lock = client.shared_mutex(name);
            auto rival = rival_client.shared_mutex(name);

            if (reader) {
                lock.lock_shared();
            } else {
                lock.lock();
            }
            conn.add(fault_rule{.command = "EVALSHA", .script = "shared_release", .action = fault});
            std::error_code ec;
            if (reader) {
                lock.unlock_shared(ec);
            } else {
                lock.unlock(ec);
            }
            EXPECT_TRUE(ec) << "a release whose outcome is unknown reported success";

            for (int round = 0; round < 3; ++round) {
                SCOPED_TRACE("round " + std::to_string(round));
                bool acquired = false;
                EXPECT_NO_THROW(acquired = lock.try_lock_for(5s));
                ASSERT_TRUE(acquired);
                EXPECT_TRUE(lock.verify());
                EXPECT_FALSE(rival.try_lock_shared()) << "a writer holds, yet a reader got in";
                lock.unlock(ec);
                EXPECT_FALSE(ec) << ec.message();
                EXPECT_FALSE(lock.owned());
                ASSERT_TRUE(eventually([&] { return rival.try_lock(); }, 2s))
                    << "the final unlock left the lock held";
                rival.unlock();

                ASSERT_TRUE(lock.try_lock_shared_for(5s));
                lock.unlock_shared(ec);
                EXPECT_FALSE(ec) << ec.message();
            }
            EXPECT_TRUE(all_gone(srv, {name}, 2s));
        }
    }
}

// One acquisition per kind whose reply gets lost: the command (and script) to break.
struct ghost_case {
    std::string label;
    std::string command;
    std::string script;
};

// An acquisition whose reply is lost ("ghost") leaves nothing that keeps others out beyond the
// background cleanup, whether the call gives up (no wait) or retries (a wait with time left).
template <class Make, class TryOnce, class TryFor, class Unlock, class RivalTry>
void expect_ghost_acquisition_leaves_nothing(redis_server& srv, const ghost_case& c, Make make,
                                             TryOnce try_once, TryFor try_for, Unlock unlock,
                                             RivalTry rival_try) {
    SCOPED_TRACE(c.label);
    const std::string name = "safety:ghost:" + c.label;
    faulty conn{srv.uri()};
    faulty_client client{conn};
    redislock::client rival_client{srv.uri()};
    auto lock = make(client, name);

    // A call without a wait throws; what it left must be cleaned up in the background.
    conn.add(fault_rule{.command = c.command, .script = c.script});
    EXPECT_THROW((void)try_once(lock), redislock::error);
    EXPECT_FALSE(lock.owned());
    EXPECT_TRUE(all_gone(srv, {name}, 3s)) << "the ghost entry outlived its cleanup (lease 30 s)";
    {
        auto rival = make(rival_client, name);
        EXPECT_TRUE(rival_try(rival)) << "the ghost entry shut another client out";
        std::error_code ec;
        unlock(rival, ec);
    }

    // A wait with time left retries; the retry takes its own ghost over, so one unlock frees it.
    conn.add(fault_rule{.command = c.command, .script = c.script});
    ASSERT_TRUE(try_for(lock));
    std::error_code ec;
    unlock(lock, ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(all_gone(srv, {name}, 3s)) << "a retried acquisition left an entry behind";
    auto rival = make(rival_client, name);
    EXPECT_TRUE(rival_try(rival));
    unlock(rival, ec);
}

// Old: the key of a SET whose reply was lost stayed for the whole lease.
TEST(Safety, MutexAcquisitionWhoseReplyIsLostLeavesNothingBehind) {
    redis_server srv;
    expect_ghost_acquisition_leaves_nothing(
        srv, {"mutex", "SET", ""},
        [](auto& client, const std::string& name) { return client.mutex(name); },
        [](auto& l) { return l.try_lock(); }, [](auto& l) { return l.try_lock_for(5s); },
        [](auto& l, std::error_code& ec) { l.unlock(ec); }, [](auto& l) { return l.try_lock(); });
}

// Old: the ghost entry stayed for the lease, and a retry re-entered it (one unlock left it).
TEST(Safety, RecursiveAcquisitionWhoseReplyIsLostLeavesNothingBehind) {
    redis_server srv;
    expect_ghost_acquisition_leaves_nothing(
        srv, {"recursive", "EVALSHA", "recursive_acquire"},
        [](auto& client, const std::string& name) { return client.recursive_mutex(name); },
        [](auto& l) { return l.try_lock(); }, [](auto& l) { return l.try_lock_for(5s); },
        [](auto& l, std::error_code& ec) { l.unlock(ec); }, [](auto& l) { return l.try_lock(); });
}

// Old: the ghost entry stayed for the lease, and a retry re-entered it (one unlock left it).
TEST(Safety, SharedAcquisitionWhoseReplyIsLostLeavesNothingBehind) {
    redis_server srv;
    const auto make = [](auto& client, const std::string& name) {
        return client.shared_mutex(name);
    };
    expect_ghost_acquisition_leaves_nothing(
        srv, {"shared-write", "EVALSHA", "shared_acquire"}, make,
        [](auto& l) { return l.try_lock(); }, [](auto& l) { return l.try_lock_for(5s); },
        [](auto& l, std::error_code& ec) { l.unlock(ec); }, [](auto& l) { return l.try_lock(); });
    expect_ghost_acquisition_leaves_nothing(
        srv, {"shared-read", "EVALSHA", "shared_acquire"}, make,
        [](auto& l) { return l.try_lock_shared(); },
        [](auto& l) { return l.try_lock_shared_for(5s); },
        [](auto& l, std::error_code& ec) { l.unlock_shared(ec); },
        [](auto& l) { return l.try_lock(); });
}

// Every release of a re-entered lock sent into a hang and cut off there: Redis still counts
// both entries, the object counts none. `leave` leaves one entry (unlock or unlock_shared).
template <class Lock, class Leave, class RivalTryLock>
void expect_releases_that_never_arrived_leave_nothing(redis_server& srv, fault_proxy& proxy,
                                                      Lock& lock, const std::string& name,
                                                      Leave leave, RivalTryLock rival_try_lock) {
    proxy.stall();
    std::error_code ec;
    leave(lock, ec);  // an inner entry: its count is unknown from now on
    EXPECT_EQ(ec, errc::connection_failed);
    leave(lock, ec);
    EXPECT_EQ(ec, errc::connection_failed);
    EXPECT_FALSE(lock.owned());
    proxy.cut();
    proxy.resume();
    // Lease 30 s: the background cleanup must free the name long before.
    EXPECT_TRUE(all_gone(srv, {name}, 5s)) << "the given-up acquisition outlived its cleanup";
    EXPECT_TRUE(rival_try_lock());
}

// Old: the entries of releases that never arrived stayed in Redis for the whole lease.
TEST(Safety, RecursiveReleasesThatNeverArrivedLeaveNothingBehind) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::client client{proxy.uri() + "?command_timeout=500"};
    redislock::client rival_client{srv.uri()};
    const std::string name = "safety:never-arrived:recursive";
    auto lock = client.recursive_mutex(name);
    auto rival = rival_client.recursive_mutex(name);
    lock.lock();
    lock.lock();
    expect_releases_that_never_arrived_leave_nothing(
        srv, proxy, lock, name, [](auto& l, std::error_code& ec) { l.unlock(ec); },
        [&] { return rival.try_lock(); });
}

// Old: the entries stayed for the lease; lock() by the same owner then threw "would deadlock".
TEST(Safety, SharedReleasesThatNeverArrivedLeaveNothingBehind) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::client client{proxy.uri() + "?command_timeout=500"};
    redislock::client rival_client{srv.uri()};
    for (const bool reader : {true, false}) {
        SCOPED_TRACE(reader ? "read" : "write");
        const std::string name =
            std::string{"safety:never-arrived:shared:"} + (reader ? "read" : "write");
        auto lock = client.shared_mutex(name);
        auto rival = rival_client.shared_mutex(name);
        if (reader) {
            lock.lock_shared();
            lock.lock_shared();
            expect_releases_that_never_arrived_leave_nothing(
                srv, proxy, lock, name, [](auto& l, std::error_code& ec) { l.unlock_shared(ec); },
                [&] { return rival.try_lock(); });
        } else {
            lock.lock();
            lock.lock();
            expect_releases_that_never_arrived_leave_nothing(
                srv, proxy, lock, name, [](auto& l, std::error_code& ec) { l.unlock(ec); },
                [&] { return rival.try_lock(); });
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 3. Acquisitions reported after their lease ran out.

// Old: try_lock() returned true with owned() already false; a rival got in 150 ms later.
TEST(Safety, AcquisitionWhoseReplyOutlivesTheLeaseIsAFailedAttempt) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::client client{proxy.uri() + "?command_timeout=5000"};
    redislock::client rival_client{srv.uri()};
    const lock_options short_lease{.lease = 200ms};

    auto m = client.mutex("safety:slow:mutex", short_lease);
    auto r = client.recursive_mutex("safety:slow:recursive", short_lease);
    auto s = client.shared_mutex("safety:slow:shared", short_lease);
    // The connection is set up while the path is fast.
    ASSERT_TRUE(m.try_lock());
    m.unlock();

    // Each way 150 ms: every reply comes 300 ms after its request, past the 200 ms lease.
    proxy.delay(150ms);
    EXPECT_FALSE(m.try_lock());
    EXPECT_FALSE(m.owned());
    EXPECT_TRUE(m.lost_token().stop_requested());
    EXPECT_FALSE(r.try_lock());
    EXPECT_FALSE(r.owned());
    EXPECT_EQ(r.depth(), 0u);
    EXPECT_FALSE(s.try_lock());
    EXPECT_FALSE(s.owned());
    EXPECT_FALSE(s.try_lock_shared());
    EXPECT_FALSE(s.owned());
    proxy.delay(0ms);

    // Nothing is left held: every rival gets in once the stale grants are gone.
    auto m2 = rival_client.mutex("safety:slow:mutex", short_lease);
    auto r2 = rival_client.recursive_mutex("safety:slow:recursive", short_lease);
    auto s2 = rival_client.shared_mutex("safety:slow:shared", short_lease);
    EXPECT_TRUE(eventually([&] { return m2.try_lock(); }, 3s));
    EXPECT_TRUE(eventually([&] { return r2.try_lock(); }, 3s));
    EXPECT_TRUE(eventually([&] { return s2.try_lock(); }, 3s));
    m2.unlock();
    r2.unlock();
    s2.unlock();
    EXPECT_TRUE(
        all_gone(srv, {"safety:slow:mutex", "safety:slow:recursive", "safety:slow:shared"}, 3s));
}

// A release that finds the lock already gone tells the loss the way every other discovery does:
// on_lost and the stop request of the lost_token() taken while it was held, for every kind, for
// an inner entry of a reentrant lock as for the last one.
TEST(Safety, LossFoundByAReleaseStopsTheLostToken) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::atomic<int> lost{0};
    const lock_options counted{.lease = 30s, .on_lost = [&] { ++lost; }};
    // Takes `lock` with `take`, deletes its key behind its back, and releases with `give`.
    const auto expect_told = [&](auto& lock, const char* key, auto take, auto give) {
        SCOPED_TRACE(key);
        take(lock);
        const std::stop_token token = lock.lost_token();
        ASSERT_EQ(srv.cli({"DEL", key}), "1");
        std::error_code ec;
        give(lock, ec);
        EXPECT_EQ(ec, errc::lock_lost);
        EXPECT_TRUE(token.stop_requested());
        EXPECT_EQ(lost.exchange(0), 1);
    };
    const auto lock = [](auto& l) { l.lock(); };
    const auto unlock = [](auto& l, std::error_code& ec) { l.unlock(ec); };

    auto m = client.mutex("safety:gone:mutex", counted);
    expect_told(m, "safety:gone:mutex", lock, unlock);
    auto r = client.recursive_mutex("safety:gone:recursive", counted);
    expect_told(r, "safety:gone:recursive", lock, unlock);
    expect_told(
        r, "safety:gone:recursive",
        [](auto& l) {
            l.lock();
            l.lock();
        },
        unlock);
    EXPECT_EQ(r.depth(), 0u);  // an inner entry found gone ends them all
    auto s = client.shared_mutex("safety:gone:shared", counted);
    expect_told(s, "safety:gone:shared", lock, unlock);
    expect_told(
        s, "safety:gone:shared", [](auto& l) { l.lock_shared(); },
        [](auto& l, std::error_code& ec) { l.unlock_shared(ec); });
}

// Old: 1 to 3 ms leases were accepted and "acquired" locks were already gone.
TEST(Safety, LeasesTooShortToMeanAnythingAreRejected) {
    redis_server srv;
    redislock::client client{srv.uri()};
    for (const auto lease : {1ms, 3ms, 9ms}) {
        SCOPED_TRACE(std::to_string(lease.count()) + " ms");
        const lock_options options{.lease = lease};
        EXPECT_THROW((void)client.mutex("safety:short", options), redislock::invalid_argument);
        EXPECT_THROW((void)client.recursive_mutex("safety:short", options),
                     redislock::invalid_argument);
        EXPECT_THROW((void)client.shared_mutex("safety:short", options),
                     redislock::invalid_argument);
    }
    const lock_options shortest{.lease = 10ms};
    EXPECT_NO_THROW((void)client.mutex("safety:short", shortest));
    EXPECT_NO_THROW((void)client.recursive_mutex("safety:short", shortest));
    EXPECT_NO_THROW((void)client.shared_mutex("safety:short", shortest));

    auto m = client.mutex("safety:short:m");
    auto r = client.recursive_mutex("safety:short:r");
    auto s = client.shared_mutex("safety:short:s");
    m.lock();
    r.lock();
    s.lock();
    EXPECT_THROW((void)m.extend(2ms), redislock::invalid_argument);
    EXPECT_THROW((void)r.extend(2ms), redislock::invalid_argument);
    EXPECT_THROW((void)s.extend(2ms), redislock::invalid_argument);
    m.unlock();
    r.unlock();
    s.unlock();
}

// ---------------------------------------------------------------------------------------------
// 4. Waits bounded on a hung server.

// Runs `call` and returns how long it took; a redislock::error it throws counts as returning.
template <class Call>
std::chrono::milliseconds time_of(Call call) {
    stopwatch watch;
    try {
        (void)call();
    } catch (const redislock::error&) {
    }
    return watch.elapsed();
}

// Old: try_lock_for(50ms) blocked 4 s on a stopped server (8 s with a busy pool).
TEST(Safety, TimedAcquisitionOnAHungServerReturnsByItsDeadline) {
    redis_server srv;
    redislock::client client{with_query(srv, "command_timeout=1000")};
    auto m = client.mutex("safety:hung:mutex");
    auto r = client.recursive_mutex("safety:hung:recursive");
    auto s = client.shared_mutex("safety:hung:shared");
    ASSERT_TRUE(m.try_lock());
    m.unlock();

    srv.pause();
    {
        resume_on_exit resume{srv};
        EXPECT_LE(time_of([&] { return m.try_lock_for(50ms); }), 200ms);
        EXPECT_LE(time_of([&] { return r.try_lock_for(50ms); }), 200ms);
        EXPECT_LE(time_of([&] { return s.try_lock_for(50ms); }), 200ms);
        EXPECT_LE(time_of([&] { return s.try_lock_shared_for(50ms); }), 200ms);
        EXPECT_FALSE(m.owned());
        EXPECT_FALSE(r.owned());
        EXPECT_FALSE(s.owned());
    }
    // The abandoned attempts reach the server once it runs again; their keys must not stay for
    // the 30 s lease.
    EXPECT_TRUE(
        all_gone(srv, {"safety:hung:mutex", "safety:hung:recursive", "safety:hung:shared"}, 5s));
}

// Old: lock(stop_token) went on blocking for seconds after the stop request.
TEST(Safety, StopRequestEndsAWaitOnAHungServerAtOnce) {
    redis_server srv;
    redislock::client client{with_query(srv, "command_timeout=2000")};
    auto m = client.mutex("safety:stop:mutex");
    auto r = client.recursive_mutex("safety:stop:recursive");
    auto s = client.shared_mutex("safety:stop:shared");
    ASSERT_TRUE(m.try_lock());
    m.unlock();

    const std::vector<std::pair<std::string, std::function<bool(std::stop_token)>>> waits{
        {"mutex", [&](std::stop_token stop) { return m.lock(stop); }},
        {"recursive", [&](std::stop_token stop) { return r.lock(stop); }},
        {"shared write", [&](std::stop_token stop) { return s.lock(stop); }},
        {"shared read", [&](std::stop_token stop) { return s.lock_shared(stop); }},
    };
    srv.pause();
    resume_on_exit resume{srv};
    for (const auto& entry : waits) {
        const auto& label = entry.first;
        const auto& wait = entry.second;  // a plain reference: lambdas may capture it
        SCOPED_TRACE(label);
        std::stop_source source;
        std::atomic<std::int64_t> returned_ns{0};
        std::optional<bool> result;
        std::string failure;
        std::thread waiter{[&] {
            try {
                result = wait(source.get_token());
            } catch (const std::exception& e) {
                failure = e.what();
            }
            returned_ns = monotonic_ns();
        }};
        std::this_thread::sleep_for(300ms);
        const std::int64_t stop_ns = monotonic_ns();
        source.request_stop();
        waiter.join();
        EXPECT_EQ(failure, "");
        EXPECT_EQ(result, std::optional<bool>{false});
        EXPECT_LE(returned_ns.load() - stop_ns, 100 * ns_per_ms)
            << "returned " << (returned_ns.load() - stop_ns) / ns_per_ms
            << " ms after the stop request";
    }
}

// Old: unlock() blocked up to 6 s with a 2 s command timeout.
TEST(Safety, UnlockOnAHungServerReturnsWithinTheCommandTimeoutAndIsFinishedLater) {
    redis_server srv;
    redislock::client client{with_query(srv, "command_timeout=1000")};
    auto m = client.mutex("safety:hung-unlock:mutex");
    auto r = client.recursive_mutex("safety:hung-unlock:recursive");
    auto s = client.shared_mutex("safety:hung-unlock:shared");
    m.lock();
    r.lock();
    s.lock();

    srv.pause();
    {
        resume_on_exit resume{srv};
        std::error_code ec;
        EXPECT_LE(time_of([&] { return (m.unlock(ec), 0); }), 1300ms);
        EXPECT_EQ(ec, errc::connection_failed);
        EXPECT_LE(time_of([&] { return (r.unlock(ec), 0); }), 1300ms);
        EXPECT_EQ(ec, errc::connection_failed);
        EXPECT_LE(time_of([&] { return (s.unlock(ec), 0); }), 1300ms);
        EXPECT_EQ(ec, errc::connection_failed);
        EXPECT_FALSE(m.owned());
        EXPECT_FALSE(r.owned());
        EXPECT_FALSE(s.owned());
    }
    // Lease 30 s: the client's reaper finishes the releases once the server answers.
    EXPECT_TRUE(all_gone(
        srv,
        {"safety:hung-unlock:mutex", "safety:hung-unlock:recursive", "safety:hung-unlock:shared"},
        5s));
}

// Old: the cleanup of an abandoned acquisition hit NOSCRIPT and gave up; the key stayed a lease.
// A stopped server cannot run SCRIPT FLUSH, so the hang is a stalled path here: the same to the
// client.
TEST(Safety, CleanupAfterAHangSurvivesAScriptFlush) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::client client{proxy.uri() + "?command_timeout=1000"};
    auto held_m = client.mutex("safety:noscript:held-mutex");
    auto held_r = client.recursive_mutex("safety:noscript:held-recursive");
    auto held_s = client.shared_mutex("safety:noscript:held-shared");
    auto m = client.mutex("safety:noscript:mutex");
    auto r = client.recursive_mutex("safety:noscript:recursive");
    auto s = client.shared_mutex("safety:noscript:shared");
    held_m.lock();
    held_r.lock();
    held_s.lock_shared();

    proxy.stall();
    EXPECT_LE(time_of([&] { return m.try_lock_for(50ms); }), 200ms);
    EXPECT_LE(time_of([&] { return r.try_lock_for(50ms); }), 200ms);
    EXPECT_LE(time_of([&] { return s.try_lock_for(50ms); }), 200ms);
    std::error_code ec;
    held_m.unlock(ec);
    EXPECT_EQ(ec, errc::connection_failed);
    held_r.unlock(ec);
    EXPECT_EQ(ec, errc::connection_failed);
    held_s.unlock_shared(ec);
    EXPECT_EQ(ec, errc::connection_failed);
    srv.script_flush();
    proxy.resume();

    EXPECT_TRUE(all_gone(srv,
                         {"safety:noscript:held-mutex", "safety:noscript:held-recursive",
                          "safety:noscript:held-shared", "safety:noscript:mutex",
                          "safety:noscript:recursive", "safety:noscript:shared"},
                         5s));
}

// Old: a release lost in a hang was never finished; the keys stayed for the whole lease.
// cut() discards the releases sent during the hang, so only the background cleanup can free
// the keys, and it meets a server without the scripts.
TEST(Safety, ReleasesCutOffByAHangAreFinishedAfterAScriptFlush) {
    redis_server srv;
    fault_proxy proxy{srv};
    redislock::client client{proxy.uri() + "?command_timeout=500"};
    auto m = client.mutex("safety:cut-noscript:mutex");
    auto r = client.recursive_mutex("safety:cut-noscript:recursive");
    auto s = client.shared_mutex("safety:cut-noscript:shared");
    m.lock();
    r.lock();
    s.lock();

    proxy.stall();
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::connection_failed);
    r.unlock(ec);
    EXPECT_EQ(ec, errc::connection_failed);
    s.unlock(ec);
    EXPECT_EQ(ec, errc::connection_failed);
    proxy.cut();
    srv.script_flush();
    proxy.resume();

    EXPECT_TRUE(all_gone(srv,
                         {"safety:cut-noscript:mutex", "safety:cut-noscript:recursive",
                          "safety:cut-noscript:shared"},
                         5s));
}

// ---------------------------------------------------------------------------------------------
// 5. Transient failures ride out while a wait has time left.

// Old: try_lock_for(10s) threw 1.4 s into a 1.5 s pause.
TEST(Safety, TimedWaitRidesOutAServerPause) {
    redis_server srv;
    redislock::client client{with_query(srv, "command_timeout=300")};
    auto m = client.mutex("safety:ride:mutex");
    auto r = client.recursive_mutex("safety:ride:recursive");
    auto s = client.shared_mutex("safety:ride:shared");
    const std::vector<std::pair<std::string, std::function<bool()>>> waits{
        {"mutex", [&] { return m.try_lock_for(10s); }},
        {"recursive", [&] { return r.try_lock_for(10s); }},
        {"shared write", [&] { return s.try_lock_for(10s); }},
    };
    ASSERT_TRUE(m.try_lock());
    m.unlock();
    for (const auto& [label, wait] : waits) {
        SCOPED_TRACE(label);
        srv.pause();
        resume_on_exit resume{srv};
        std::thread resumer{[&] {
            std::this_thread::sleep_for(1500ms);
            srv.resume();
        }};
        stopwatch watch;
        bool acquired = false;
        EXPECT_NO_THROW(acquired = wait());
        const auto took = watch.elapsed();
        resumer.join();
        EXPECT_TRUE(acquired);
        EXPECT_GE(took, 1400ms);
        EXPECT_LT(took, 9s);
    }
    EXPECT_TRUE(m.owned());
    EXPECT_TRUE(r.owned());
    EXPECT_TRUE(s.owned());
    m.unlock();
    r.unlock();
    s.unlock();

    srv.pause();
    {
        resume_on_exit resume{srv};
        std::thread resumer{[&] {
            std::this_thread::sleep_for(1500ms);
            srv.resume();
        }};
        bool acquired = false;
        EXPECT_NO_THROW(acquired = s.try_lock_shared_for(10s));
        resumer.join();
        EXPECT_TRUE(acquired);
    }
    s.unlock_shared();
    EXPECT_TRUE(
        all_gone(srv, {"safety:ride:mutex", "safety:ride:recursive", "safety:ride:shared"}, 5s));
}

// The other side of riding out failures: with no time left to wait, a call still reports the
// outage (the old library threw here too; a fix that retried every call would not).
TEST(Safety, CallWithoutAWaitThrowsDuringAServerPause) {
    redis_server srv;
    redislock::client client{with_query(srv, "command_timeout=300")};
    auto m = client.mutex("safety:nowait:mutex");
    auto r = client.recursive_mutex("safety:nowait:recursive");
    auto s = client.shared_mutex("safety:nowait:shared");
    ASSERT_TRUE(m.try_lock());
    m.unlock();
    srv.pause();
    resume_on_exit resume{srv};
    EXPECT_THROW((void)m.try_lock(), redislock::connection_error);
    EXPECT_THROW((void)r.try_lock(), redislock::connection_error);
    EXPECT_THROW((void)s.try_lock(), redislock::connection_error);
    EXPECT_THROW((void)s.try_lock_shared(), redislock::connection_error);
}

// ---------------------------------------------------------------------------------------------
// 6. Releases and renewals at OOM.

// Old: reentrant and read-write releases were refused under noeviction and the keys stayed.
TEST(Safety, ReleasesAndRenewalsWorkWhenRedisIsOutOfMemory) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("safety:oom:mutex");
    auto r = client.recursive_mutex("safety:oom:recursive");
    auto writer = client.shared_mutex("safety:oom:shared-w");
    auto reader_a = client.shared_mutex("safety:oom:shared-r", {.owner = "reader-a"});
    auto reader_b = client.shared_mutex("safety:oom:shared-r", {.owner = "reader-b"});
    m.lock();
    r.lock();
    r.lock();
    writer.lock();
    reader_a.lock_shared();
    reader_b.lock_shared();

    ASSERT_GT(srv.fill_memory_until_oom(), 0);

    EXPECT_TRUE(m.extend(30s));
    EXPECT_TRUE(r.extend(30s));
    EXPECT_TRUE(writer.extend(30s));
    EXPECT_TRUE(reader_a.extend(30s));

    std::error_code ec;
    r.unlock(ec);  // leaves the count at 1
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(r.depth(), 1u);
    EXPECT_TRUE(key_exists(srv, "safety:oom:recursive"));
    r.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(key_exists(srv, "safety:oom:recursive"));

    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(key_exists(srv, "safety:oom:mutex"));

    reader_a.unlock_shared(ec);  // reader b stays
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(key_exists(srv, "safety:oom:shared-r"));
    EXPECT_TRUE(reader_b.owned());
    reader_b.unlock_shared(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(key_exists(srv, "safety:oom:shared-r"));

    writer.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(key_exists(srv, "safety:oom:shared-w"));
}

// Old: a refused release reported a bare error code without the server's text.
TEST(Safety, RefusedReleaseCarriesTheServersText) {
    redis_server srv;
    faulty conn{srv.uri()};
    faulty_client client{conn};
    const std::string text = "OOM command not allowed when used memory > 'maxmemory'.";
    auto m = client.mutex("safety:refused:mutex");
    auto r = client.recursive_mutex("safety:refused:recursive");
    auto s = client.shared_mutex("safety:refused:shared");
    m.lock();
    r.lock();
    s.lock_shared();
    for (const std::string script : {"mutex_release", "recursive_release", "shared_release"}) {
        conn.add(fault_rule{.command = "EVALSHA",
                            .script = script,
                            .action = fault_action::error_reply,
                            .error_text = text});
    }
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::server_failed);
    EXPECT_NE(ec.message().find(text), std::string::npos) << ec.message();
    r.unlock(ec);
    EXPECT_EQ(ec, errc::server_failed);
    EXPECT_NE(ec.message().find(text), std::string::npos) << ec.message();
    s.unlock_shared(ec);
    EXPECT_EQ(ec, errc::server_failed);
    EXPECT_NE(ec.message().find(text), std::string::npos) << ec.message();
    // The refused releases are finished in the background once the server accepts them.
    EXPECT_TRUE(all_gone(
        srv, {"safety:refused:mutex", "safety:refused:recursive", "safety:refused:shared"}, 5s));
}

// ---------------------------------------------------------------------------------------------
// 7. Fencing: no partial write, tokens never go backwards.

// A fenced try_lock() of `lock` over a broken counter throws, and nothing is written at `name`.
template <class Lock>
void expect_failed_fenced_acquisition_writes_nothing(redis_server& srv, Lock& lock,
                                                     const std::string& name) {
    EXPECT_THROW((void)lock.try_lock(), redislock::server_error);
    EXPECT_FALSE(key_exists(srv, name)) << "the lock was left set by a failed acquisition";
    EXPECT_FALSE(lock.owned());
    EXPECT_EQ(lock.fencing_token(), 0);
}

std::string fence_key_of(const std::string& name) {
    return redislock::detail::derived_key(name, "fence");
}

// Old: the script SET the lock, then INCR failed on the counter: it threw with the lock set.
TEST(Safety, FencedMutexAcquisitionOverANonIntegerCounterThrowsAndWritesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string name = "safety:bad-fence:mutex";
    srv.cli({"SET", fence_key_of(name), "not-a-number"});
    auto lock = client.mutex(name, {.fencing = true});
    expect_failed_fenced_acquisition_writes_nothing(srv, lock, name);
}

// Old: INCR refused the counter before any write. A script that reads a non-integer counter as 0
// and overwrites it acquires over data it does not own; the simple lock refuses, so must this.
TEST(Safety, FencedRecursiveAcquisitionOverANonIntegerCounterThrowsAndWritesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string name = "safety:bad-fence:recursive";
    srv.cli({"SET", fence_key_of(name), "not-a-number"});
    auto lock = client.recursive_mutex(name, {.fencing = true});
    expect_failed_fenced_acquisition_writes_nothing(srv, lock, name);
}

// Old: INCR refused the counter before any write; as for the reentrant lock, it must still.
TEST(Safety, FencedSharedAcquisitionOverANonIntegerCounterThrowsAndWritesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string name = "safety:bad-fence:shared";
    srv.cli({"SET", fence_key_of(name), "not-a-number"});
    auto lock = client.shared_mutex(name, {.fencing = true});
    expect_failed_fenced_acquisition_writes_nothing(srv, lock, name);
}

// Old: a counter of the wrong type failed the simple lock's INCR after its SET had landed.
TEST(Safety, FencedAcquisitionOverACounterOfTheWrongTypeThrowsAndWritesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const lock_options fenced{.fencing = true};
    for (const std::string name : {"safety:typed-fence:mutex", "safety:typed-fence:recursive",
                                   "safety:typed-fence:shared"}) {
        srv.cli({"HSET", fence_key_of(name), "field", "1"});
    }
    auto m = client.mutex("safety:typed-fence:mutex", fenced);
    auto r = client.recursive_mutex("safety:typed-fence:recursive", fenced);
    auto s = client.shared_mutex("safety:typed-fence:shared", fenced);
    expect_failed_fenced_acquisition_writes_nothing(srv, m, "safety:typed-fence:mutex");
    expect_failed_fenced_acquisition_writes_nothing(srv, r, "safety:typed-fence:recursive");
    expect_failed_fenced_acquisition_writes_nothing(srv, s, "safety:typed-fence:shared");
}

// The fencing token of one fresh acquisition by `lock` (waiting out a reconnection).
template <class Lock>
std::int64_t next_fence(Lock& lock) {
    if (!lock.try_lock_for(10s)) {
        ADD_FAILURE() << "could not acquire " << lock.name();
        return 0;
    }
    const std::int64_t fence = lock.fencing_token();
    lock.unlock();
    return fence;
}

// Old: FLUSHALL or a restart without persistence reset the counter: 5 -> 1.
TEST(Safety, FencingTokensGrowAcrossFlushallAndEmptyRestarts) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const lock_options fenced{.fencing = true};
    auto m = client.mutex("safety:fence:mutex", fenced);
    auto r = client.recursive_mutex("safety:fence:recursive", fenced);
    auto s = client.shared_mutex("safety:fence:shared", fenced);

    std::int64_t last_m = 0;
    std::int64_t last_r = 0;
    std::int64_t last_s = 0;
    for (int i = 0; i < 3; ++i) {
        last_m = next_fence(m);
        last_r = next_fence(r);
        last_s = next_fence(s);
    }
    ASSERT_GT(last_m, 0);
    ASSERT_GT(last_r, 0);
    ASSERT_GT(last_s, 0);

    srv.flushall();
    std::int64_t now_m = next_fence(m);
    std::int64_t now_r = next_fence(r);
    std::int64_t now_s = next_fence(s);
    EXPECT_GT(now_m, last_m) << "after FLUSHALL";
    EXPECT_GT(now_r, last_r) << "after FLUSHALL";
    EXPECT_GT(now_s, last_s) << "after FLUSHALL";

    srv.kill_and_restart_empty();
    EXPECT_GT(next_fence(m), now_m) << "after a restart without persistence";
    EXPECT_GT(next_fence(r), now_r) << "after a restart without persistence";
    EXPECT_GT(next_fence(s), now_s) << "after a restart without persistence";
}

// ---------------------------------------------------------------------------------------------
// 8. fork().

// Old: the child re-entered its parent's locks, and its inherited watchdog hung for ever.
// The child uses the client and lock objects it inherited, forked at a quiet moment (no lock
// call in flight), as client.hpp allows; exclusion.hpp's fork-before-threads rule is for its
// load runs, where the child makes its own client.
TEST(Safety, ForkedChildNeverSharesItsParentsLocksAndRenewsItsOwn) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto r = client.recursive_mutex("safety:fork:recursive");
    auto s = client.shared_mutex("safety:fork:shared");
    auto warm = client.mutex("safety:fork:warm", {.lease = 1000ms, .watchdog = true});
    warm.lock();  // the parent's watchdog thread runs before the fork
    r.lock();
    s.lock();
    std::this_thread::sleep_for(50ms);

    redislock::test::child_process child{[&](redislock::test::line_channel& channel) {
        int failures = 0;
        const auto check = [&](bool ok, const std::string& what) {
            if (!ok) {
                ++failures;
                channel.send("failed: " + what);
            }
        };
        check(!r.try_lock(), "the inherited recursive_mutex re-entered the parent's lock");
        auto r2 = client.recursive_mutex("safety:fork:recursive");
        check(!r2.try_lock(), "a new recursive_mutex in the child entered the parent's lock");
        check(!s.try_lock(), "the inherited shared_mutex re-entered the parent's write lock");
        check(!s.try_lock_shared(), "the child read while the parent writes");
        auto own = client.mutex("safety:fork:child-own", {.lease = 1000ms, .watchdog = true});
        check(own.try_lock_for(5s), "the child could not take a lock of its own");
        std::this_thread::sleep_for(2500ms);
        check(own.owned(), "the child's own watchdog lock was not renewed past its lease");
        check(own.verify(), "the child's own lock is gone from Redis after 2.5 leases");
        std::error_code ec;
        own.unlock(ec);
        check(!ec, "the child's unlock failed: " + ec.message());
        channel.send("done");
        return failures == 0 ? 0 : 1;
    }};
    std::vector<std::string> report;
    while (auto line = child.channel().receive(20s)) {
        if (*line == "done") {
            break;
        }
        report.push_back(*line);
    }
    const std::optional<int> code = child.wait(20s);
    for (const auto& line : report) {
        ADD_FAILURE() << "child: " << line;
    }
    EXPECT_EQ(code, std::optional<int>{0});

    // The parent still holds both, and nothing of the child's stays.
    EXPECT_TRUE(r.verify());
    EXPECT_TRUE(s.verify());
    EXPECT_TRUE(warm.owned());
    EXPECT_FALSE(key_exists(srv, "safety:fork:child-own"));
    std::error_code ec;
    r.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    s.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    warm.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(
        all_gone(srv, {"safety:fork:recursive", "safety:fork:shared", "safety:fork:warm"}, 2s));
}

// ---------------------------------------------------------------------------------------------
// 9. Client destroyed while watchdog locks are held.

// Old: renewals stopped silently with the client; watchdog locks taken later were never renewed.
TEST(Safety, LocksOutliveTheirClientAndAreStillRenewed) {
    redis_server srv;
    auto client = std::make_unique<redislock::client>(srv.uri());
    lost_counter lost;
    const lock_options options{.lease = 1000ms, .watchdog = true, .on_lost = lost.handler()};
    auto m = client->mutex("safety:orphan:mutex", options);
    auto r = client->recursive_mutex("safety:orphan:recursive", options);
    auto s = client->shared_mutex("safety:orphan:shared", options);
    auto later = client->mutex("safety:orphan:later", options);
    m.lock();
    r.lock();
    s.lock();
    const std::stop_token m_lost = m.lost_token();
    const std::stop_token r_lost = r.lost_token();
    const std::stop_token s_lost = s.lost_token();

    client.reset();
    later.lock();  // taken after the client is gone
    const std::stop_token later_lost = later.lost_token();

    std::this_thread::sleep_for(3500ms);  // three and a half leases
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_FALSE(m_lost.stop_requested());
    EXPECT_FALSE(r_lost.stop_requested());
    EXPECT_FALSE(s_lost.stop_requested());
    EXPECT_FALSE(later_lost.stop_requested());
    EXPECT_TRUE(m.owned());
    EXPECT_TRUE(r.owned());
    EXPECT_TRUE(s.owned());
    EXPECT_TRUE(later.owned());
    EXPECT_TRUE(m.verify());
    EXPECT_TRUE(r.verify());
    EXPECT_TRUE(s.verify());
    EXPECT_TRUE(later.verify());

    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    r.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    s.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    later.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(all_gone(srv,
                         {"safety:orphan:mutex", "safety:orphan:recursive", "safety:orphan:shared",
                          "safety:orphan:later"},
                         2s));
}

// ---------------------------------------------------------------------------------------------
// 10. Smaller ones: moved-from locks, bad options, bad URIs, huge timeouts.

// Old: a moved-from lock's members dereferenced a null state.
TEST(Safety, MovedFromLocksBehaveAsNeverHeld) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::error_code ec;
    {
        auto a = client.mutex("safety:moved:mutex");
        a.lock();
        auto b = std::move(a);
        EXPECT_FALSE(a.owned());
        EXPECT_EQ(a.remaining(), 0ms);
        EXPECT_TRUE(a.lost_token().stop_requested());
        EXPECT_EQ(a.fencing_token(), 0);
        a.unlock(ec);
        EXPECT_EQ(ec, errc::not_held);
        EXPECT_THROW(a.lock(), redislock::invalid_argument);
        EXPECT_THROW((void)a.try_lock(), redislock::invalid_argument);
        EXPECT_THROW((void)a.try_lock_for(10ms), redislock::invalid_argument);
        EXPECT_TRUE(b.owned());
        b.unlock(ec);
        EXPECT_FALSE(ec) << ec.message();
    }
    {
        auto a = client.recursive_mutex("safety:moved:recursive");
        a.lock();
        auto b = std::move(a);
        EXPECT_FALSE(a.owned());
        EXPECT_EQ(a.remaining(), 0ms);
        EXPECT_EQ(a.depth(), 0u);
        EXPECT_TRUE(a.lost_token().stop_requested());
        a.unlock(ec);
        EXPECT_EQ(ec, errc::not_held);
        EXPECT_THROW(a.lock(), redislock::invalid_argument);
        EXPECT_THROW((void)a.try_lock(), redislock::invalid_argument);
        EXPECT_TRUE(b.owned());
        b.unlock(ec);
        EXPECT_FALSE(ec) << ec.message();
    }
    {
        auto a = client.shared_mutex("safety:moved:shared");
        a.lock();
        auto b = std::move(a);
        EXPECT_FALSE(a.owned());
        EXPECT_EQ(a.remaining(), 0ms);
        EXPECT_TRUE(a.lost_token().stop_requested());
        a.unlock(ec);
        EXPECT_EQ(ec, errc::not_held);
        a.unlock_shared(ec);
        EXPECT_EQ(ec, errc::not_held);
        EXPECT_THROW(a.lock(), redislock::invalid_argument);
        EXPECT_THROW(a.lock_shared(), redislock::invalid_argument);
        EXPECT_THROW((void)a.try_lock_shared(), redislock::invalid_argument);
        EXPECT_TRUE(b.owned());
        b.unlock(ec);
        EXPECT_FALSE(ec) << ec.message();
    }
    EXPECT_TRUE(
        all_gone(srv, {"safety:moved:mutex", "safety:moved:recursive", "safety:moved:shared"}, 2s));
}

// Old: a negative max_hold, or one below the lease, was accepted.
TEST(Safety, MaxHoldBelowTheLeaseIsRejected) {
    redis_server srv;
    redislock::client client{srv.uri()};
    for (const auto max_hold : {-1ms, 1ms, 999ms}) {
        SCOPED_TRACE(std::to_string(max_hold.count()) + " ms");
        const lock_options options{.lease = 1000ms, .watchdog = true, .max_hold = max_hold};
        EXPECT_THROW((void)client.mutex("safety:max-hold", options), redislock::invalid_argument);
        EXPECT_THROW((void)client.recursive_mutex("safety:max-hold", options),
                     redislock::invalid_argument);
        EXPECT_THROW((void)client.shared_mutex("safety:max-hold", options),
                     redislock::invalid_argument);
    }
    for (const auto max_hold : {0ms, 1000ms, 60'000ms}) {
        SCOPED_TRACE(std::to_string(max_hold.count()) + " ms");
        const lock_options options{.lease = 1000ms, .watchdog = true, .max_hold = max_hold};
        EXPECT_NO_THROW((void)client.mutex("safety:max-hold", options));
        EXPECT_NO_THROW((void)client.recursive_mutex("safety:max-hold", options));
        EXPECT_NO_THROW((void)client.shared_mutex("safety:max-hold", options));
    }
}

// Old: "redis://host:" silently meant port 6379.
TEST(Safety, UriWithAnEmptyPortIsRejected) {
    EXPECT_THROW((void)redislock::endpoint::from_uri("redis://127.0.0.1:"),
                 redislock::invalid_argument);
    EXPECT_THROW((void)redislock::endpoint::from_uri("redis://127.0.0.1:/0"),
                 redislock::invalid_argument);
    EXPECT_THROW((void)redislock::endpoint::from_uri("redis://[::1]:"),
                 redislock::invalid_argument);
    EXPECT_THROW(redislock::client{"redis://127.0.0.1:"}, redislock::invalid_argument);
}

// Old: a connect_timeout of hours overflowed the deadline (UBSan) and connecting failed at once.
TEST(Safety, HugeConnectTimeoutConnectsNormally) {
    redis_server srv;
    for (const long long hours : {2LL, 48LL, 24LL * 365}) {
        SCOPED_TRACE(std::to_string(hours) + " h");
        const long long ms = hours * 3600 * 1000;
        stopwatch watch;
        redislock::client client{with_query(srv, "connect_timeout=" + std::to_string(ms))};
        auto m = client.mutex("safety:huge-connect-timeout");
        bool acquired = false;
        EXPECT_NO_THROW(acquired = m.try_lock());
        EXPECT_TRUE(acquired);
        std::error_code ec;
        m.unlock(ec);
        EXPECT_FALSE(ec) << ec.message();
        EXPECT_LT(watch.elapsed(), 5s);
    }
}

}  // namespace
