#include <redislock/watchdog.hpp>

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/exclusion.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::errc;
using redislock::reply;
using redislock::test::child_process;
using redislock::test::eventually;
using redislock::test::fault;
using redislock::test::fault_connection;
using redislock::test::line_channel;
using redislock::test::lost_counter;
using redislock::test::redis_server;
using redislock::test::stopwatch;
using steady = std::chrono::steady_clock;

template <redislock::connection C>
reply run(C& conn, std::initializer_list<std::string_view> words) {
    const std::vector<std::string_view> argv{words};
    return conn.execute(argv);
}

// PTTL of `key` in ms: -2 when it does not exist, -1 when it has no expiry.
template <redislock::connection C>
std::int64_t pttl(C& conn, std::string_view key) {
    const reply r = run(conn, {"PTTL", key});
    if (!r.is_integer()) {
        ADD_FAILURE() << "PTTL " << key << " answered " << r.text();
        return -3;
    }
    return r.as_integer();
}

template <redislock::connection C>
bool exists(C& conn, std::string_view key) {
    const reply r = run(conn, {"EXISTS", key});
    return r.is_integer() && r.as_integer() == 1;
}

// Samples every 50 ms for `duration` whether any of `keys` exists; true if one ever did.
template <redislock::connection C>
bool any_key_seen_within(C& conn, const std::vector<std::string>& keys,
                         std::chrono::milliseconds duration) {
    const auto end = steady::now() + duration;
    bool seen = false;
    while (steady::now() < end) {
        for (const auto& key : keys) {
            seen = seen || exists(conn, key);
        }
        std::this_thread::sleep_for(50ms);
    }
    return seen;
}

// Loads the simple lock's renewal and release scripts. At a latency near lease/3 a NOSCRIPT
// detour (EVALSHA, SCRIPT LOAD, EVALSHA again) would take as long as the lease itself.
void load_mutex_scripts(redislock::hiredis_connection& conn) {
    for (const auto& s :
         {redislock::detail::scripts::mutex_extend, redislock::detail::scripts::mutex_release}) {
        const reply r = run(conn, {"SCRIPT", "LOAD", s.source});
        EXPECT_EQ(r.text(), s.sha1);
    }
}

// Threads of this process. The first thread a process starts may also start helper threads of a
// sanitizer runtime: start (and join) one first, so they exist before any count is taken.
std::size_t thread_count() {
    static const bool warmed_up = [] {
        std::thread{[] {}}.join();
        return true;
    }();
    (void)warmed_up;
    std::size_t count = 0;
    for (const auto& task : std::filesystem::directory_iterator{"/proc/self/task"}) {
        (void)task;
        ++count;
    }
    return count;
}

// The watchdog's counters and the connection's round trips, read while no batch is between the
// connection counting it and the watchdog counting it.
std::pair<redislock::watchdog_stats, std::uint64_t> quiet_counts(redislock::node_client& client) {
    for (int attempt = 0;; ++attempt) {
        const auto stats = client.watchdog().stats();
        const auto trips = client.connection().round_trips();
        std::this_thread::sleep_for(5ms);
        const auto stats_again = client.watchdog().stats();
        if ((stats_again.round_trips == stats.round_trips &&
             client.connection().round_trips() == trips) ||
            attempt == 20) {
            return {stats, trips};
        }
    }
}

bool is_renewal_of_a_mutex(redislock::command argv) {
    return argv.size() > 1 && argv[0] == "EVALSHA" &&
           argv[1] == redislock::detail::scripts::mutex_extend.sha1;
}

// A connection with execute() only, so the watchdog sends one call per renewal. It waits `delay`
// before forwarding each command to a real hiredis_connection (a slow network), notes when each
// renewal of a simple lock was sent, and checks that the arguments are still intact after the
// delay: they are not if their owner freed them while the call was in flight.
class slow_connection {
public:
    slow_connection(std::string_view uri, std::chrono::milliseconds delay)
        : inner_{uri}, delay_{delay} {}

    reply execute(redislock::command argv) {
        if (failing_.load()) {
            throw redislock::connection_error{"failing on purpose"};
        }
        const std::vector<std::string> copy{argv.begin(), argv.end()};
        const bool renewal = is_renewal_of_a_mutex(argv);
        if (renewal) {
            std::lock_guard guard{mutex_};
            renewal_sends_.push_back(steady::now());
        }
        renewals_in_flight_.fetch_add(renewal ? 1 : 0);
        std::this_thread::sleep_for(delay_);
        const bool intact = std::equal(argv.begin(), argv.end(), copy.begin(), copy.end());
        renewals_in_flight_.fetch_sub(renewal ? 1 : 0);
        if (!intact) {
            arguments_changed_.store(true);
            throw redislock::connection_error{"arguments changed during the call"};
        }
        return inner_.execute(argv);
    }

    std::vector<steady::time_point> renewal_sends() const {
        std::lock_guard guard{mutex_};
        return renewal_sends_;
    }
    std::size_t renewals_sent() const { return renewal_sends().size(); }
    bool renewal_in_flight() const { return renewals_in_flight_.load() > 0; }
    bool arguments_changed() const { return arguments_changed_.load(); }
    /// From now on every call fails at once.
    void fail_every_call() { failing_.store(true); }

private:
    redislock::hiredis_connection inner_;
    std::chrono::milliseconds delay_;
    mutable std::mutex mutex_;
    std::vector<steady::time_point> renewal_sends_;
    std::atomic<int> renewals_in_flight_{0};
    std::atomic<bool> arguments_changed_{false};
    std::atomic<bool> failing_{false};
};

static_assert(redislock::connection<slow_connection>);
static_assert(!redislock::pipelining_connection<slow_connection>);
static_assert(!redislock::pipelining_connection<fault_connection>);

// ---------------------------------------------------------------------------------------------
// Keeping a lock alive

TEST(Watchdog, RenewsWhileHeldSoOthersNeverGetIn) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("held", {.lease = 300ms, .watchdog = true, .on_lost = lost.handler()});
    auto rival = other.mutex("held", {.lease = 300ms});

    m.lock();
    const stopwatch held;
    int samples = 0;
    int rival_wins = 0;
    std::int64_t lowest_pttl = 300;
    // 3 s is ten leases: without renewals the key would be gone after the first.
    while (held.elapsed() < 3s && samples < 200) {
        if (rival.try_lock()) {
            ++rival_wins;
            rival.unlock();
        }
        lowest_pttl = std::min(lowest_pttl, pttl(other.connection(), "held"));
        ++samples;
        std::this_thread::sleep_for(50ms);
    }

    EXPECT_GE(samples, 30);
    EXPECT_EQ(rival_wins, 0);
    EXPECT_GT(lowest_pttl, 0) << "the key ran out (or vanished) while held";
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(m.owned());
    EXPECT_TRUE(m.verify());
    // One renewal every lease/3 = 100 ms; allow for a slow machine.
    EXPECT_GE(client.watchdog().stats().renewals, 10U);
    EXPECT_EQ(client.watchdog().size(), 1U);

    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
    EXPECT_FALSE(exists(other.connection(), "held"));
    EXPECT_TRUE(rival.try_lock());
    rival.unlock();
}

TEST(Watchdog, WithoutItTheLeaseRunsOutAndTheLossIsReported) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("unwatched", {.lease = 300ms, .on_lost = lost.handler()});
    auto rival = other.mutex("unwatched", {.lease = 300ms});

    m.lock();
    EXPECT_TRUE(eventually([&] { return !exists(other.connection(), "unwatched"); }, 3s));
    EXPECT_FALSE(m.owned());
    EXPECT_TRUE(rival.try_lock());
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
    EXPECT_EQ(client.watchdog().stats().renewals, 0U);

    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_TRUE(rival.verify()) << "the lost holder's unlock must not free the new holder's lock";
    rival.unlock();
}

TEST(Watchdog, UnlockStopsTheRenewalsAtOnce) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("brief", {.lease = 300ms, .watchdog = true});

    m.lock();
    EXPECT_TRUE(eventually([&] { return client.watchdog().stats().renewals >= 2; }, 3s));
    m.unlock();
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
    const auto renewals = client.watchdog().stats().renewals;
    std::this_thread::sleep_for(500ms);
    EXPECT_EQ(client.watchdog().stats().renewals, renewals);
    EXPECT_FALSE(exists(client.connection(), "brief"));
}

TEST(Watchdog, RenewsEveryKindAndModeUntilItsLastEntryIsLeft) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    lost_counter lost;
    const redislock::lock_options watched{
        .lease = 300ms, .watchdog = true, .on_lost = lost.handler()};
    auto plain = client.mutex("kind:mutex", watched);
    auto reentrant = client.recursive_mutex("kind:recursive", watched);
    auto read = client.shared_mutex("kind:read", watched);
    auto both = client.shared_mutex("kind:both", watched);

    plain.lock();
    reentrant.lock();
    reentrant.lock();
    reentrant.unlock();  // one entry left: still renewed
    read.lock_shared();
    both.lock();
    both.lock_shared();  // downgrade: the write and the read entry are renewed each on their own
    EXPECT_EQ(client.watchdog().size(), 5U);

    std::this_thread::sleep_for(1200ms);  // four leases
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(plain.verify());
    EXPECT_TRUE(reentrant.verify());
    EXPECT_EQ(reentrant.depth(), 1U);
    EXPECT_TRUE(read.verify());
    EXPECT_TRUE(both.verify()) << "verify() checks both modes of the downgrade";
    for (const char* key : {"kind:mutex", "kind:recursive", "kind:read", "kind:both"}) {
        EXPECT_GT(pttl(other.connection(), key), 0) << key;
    }
    auto rival_plain = other.mutex("kind:mutex");
    auto rival_reentrant = other.recursive_mutex("kind:recursive");
    auto rival_read = other.shared_mutex("kind:read");
    auto rival_both = other.shared_mutex("kind:both");
    EXPECT_FALSE(rival_plain.try_lock());
    EXPECT_FALSE(rival_reentrant.try_lock());
    EXPECT_FALSE(rival_read.try_lock()) << "a reader keeps writers out";
    EXPECT_FALSE(rival_both.try_lock_shared()) << "a writer keeps readers out";

    // Leaving the write entry ends its renewal; the read entry is still renewed on its own.
    both.unlock();
    EXPECT_EQ(client.watchdog().size(), 4U);
    std::this_thread::sleep_for(700ms);
    EXPECT_TRUE(both.verify());
    EXPECT_FALSE(rival_both.try_lock());
    EXPECT_TRUE(rival_both.try_lock_shared());
    rival_both.unlock_shared();
    EXPECT_EQ(lost.calls.load(), 0);

    plain.unlock();
    reentrant.unlock();
    read.unlock_shared();
    both.unlock_shared();
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
    for (const char* key : {"kind:mutex", "kind:recursive", "kind:read", "kind:both"}) {
        EXPECT_FALSE(exists(other.connection(), key)) << key;
    }
}

TEST(Watchdog, RenewsAThousandLocksFromOneThreadInPipelinedBatches) {
    constexpr std::size_t lock_count = 1000;
    redis_server srv;
    const std::size_t threads_before = thread_count();
    redislock::node_client client{srv.uri()};
    lost_counter lost;
    std::vector<redislock::node_mutex> locks;
    std::vector<std::string> names;
    locks.reserve(lock_count);
    for (std::size_t i = 0; i < lock_count; ++i) {
        names.push_back("many:" + std::to_string(i));
        locks.push_back(
            client.mutex(names.back(), {.lease = 3s, .watchdog = true, .on_lost = lost.handler()}));
        locks.back().lock();
    }
    EXPECT_EQ(client.watchdog().size(), lock_count);
    EXPECT_EQ(thread_count(), threads_before + 2)
        << "one watchdog thread and one loss timer for every lock";

    // Longer than the lease, so every key still alive at the end was renewed.
    const auto [stats_before, trips_before] = quiet_counts(client);
    std::this_thread::sleep_for(3500ms);
    const auto [stats_after, trips_after] = quiet_counts(client);
    EXPECT_EQ(thread_count(), threads_before + 2);

    const auto renewals = stats_after.renewals - stats_before.renewals;
    const auto trips = trips_after - trips_before;
    // Every lease is renewed once a second; 3.5 s gives at least two rounds.
    EXPECT_GE(renewals, 2 * lock_count);
    ASSERT_GT(trips, 0U);
    EXPECT_EQ(stats_after.round_trips - stats_before.round_trips, trips)
        << "the watchdog's count agrees with the connection's own";
    EXPECT_GE(static_cast<double>(renewals) / static_cast<double>(trips), 100.0)
        << renewals << " renewals in " << trips << " round trips";

    std::vector<std::array<std::string_view, 2>> argvs;
    for (const auto& name : names) {
        argvs.push_back({"PTTL", name});
    }
    const std::vector<redislock::command> probes{argvs.begin(), argvs.end()};
    const auto replies = client.connection().execute_pipeline(probes);
    ASSERT_EQ(replies.size(), lock_count);
    const auto expired = std::count_if(replies.begin(), replies.end(), [](const reply& r) {
        return !r.is_integer() || r.as_integer() <= 0;
    });
    EXPECT_EQ(expired, 0);
    EXPECT_EQ(lost.calls.load(), 0);

    for (auto& m : locks) {
        m.unlock();
    }
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
    EXPECT_EQ(run(client.connection(), {"DBSIZE"}).as_integer(), 0);
}

TEST(Watchdog, ScriptFlushWhileHeldIsRecoveredWithoutALoss) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("flushed", {.lease = 300ms, .watchdog = true, .on_lost = lost.handler()});

    m.lock();
    ASSERT_TRUE(eventually([&] { return client.watchdog().stats().renewals >= 1; }, 3s));
    ASSERT_TRUE(run(client.connection(), {"SCRIPT", "FLUSH"}).is_status());
    std::this_thread::sleep_for(900ms);
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(m.verify());
    EXPECT_GT(pttl(client.connection(), "flushed"), 0);
    m.unlock();
}

TEST(Watchdog, KeyTakenOverIsReportedLostOnceAndTheNewValueIsLeftAlone) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("taken", {.lease = 300ms, .watchdog = true, .on_lost = lost.handler()});

    m.lock();
    ASSERT_TRUE(run(other.connection(), {"SET", "taken", "intruder"}).is_status());
    EXPECT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 3s));
    std::this_thread::sleep_for(400ms);
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(m.owned());
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
    EXPECT_EQ(run(other.connection(), {"GET", "taken"}).text(), "intruder");
    EXPECT_EQ(pttl(other.connection(), "taken"), -1) << "a renewal set an expiry on another's key";

    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(run(other.connection(), {"GET", "taken"}).text(), "intruder");
}

// ---------------------------------------------------------------------------------------------
// max_hold

TEST(Watchdog, MaxHoldKeepsTheLockPastOneLeaseThenLetsItRunOut) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    lost_counter lost;
    auto m = client.mutex(
        "capped", {.lease = 200ms, .watchdog = true, .on_lost = lost.handler(), .max_hold = 600ms});
    auto rival = other.mutex("capped", {.lease = 5s});

    m.lock();
    const stopwatch held;
    std::this_thread::sleep_for(450ms);  // more than two leases
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_GT(pttl(other.connection(), "capped"), 0);
    EXPECT_FALSE(rival.try_lock());

    ASSERT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 3s));
    const auto lost_after = held.elapsed();
    EXPECT_GE(lost_after, 600ms) << "reported lost before max_hold";
    EXPECT_LE(lost_after, 600ms + 200ms + 1000ms) << "kept far past max_hold + lease";
    EXPECT_FALSE(m.owned());
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
    EXPECT_TRUE(rival.try_lock_for(1s));

    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(lost.calls.load(), 1);
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_TRUE(rival.verify());
    rival.unlock();
}

// ---------------------------------------------------------------------------------------------
// Slow and failing connections

TEST(Watchdog, ConnectionWithoutPipeliningRenewsOneCallPerRenewalAndKeepsTheLock) {
    redis_server srv;
    redislock::basic_client<slow_connection> client{srv.uri(), 50ms};
    redislock::hiredis_connection probe{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("slow", {.lease = 300ms, .watchdog = true, .on_lost = lost.handler()});

    m.lock();
    const stopwatch held;
    std::int64_t lowest_pttl = 300;
    for (int i = 0; i < 100 && held.elapsed() < 2s; ++i) {
        lowest_pttl = std::min(lowest_pttl, pttl(probe, "slow"));
        std::this_thread::sleep_for(50ms);
    }
    EXPECT_GT(lowest_pttl, 0);
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(m.owned());

    EXPECT_TRUE(m.verify());
    m.unlock();  // waits for a renewal in flight, so the counts below are final

    const auto stats = client.watchdog().stats();
    EXPECT_GE(stats.renewals, 8U);
    // The first renewal meets NOSCRIPT, so SCRIPT LOAD adds one call that renews nothing.
    EXPECT_EQ(stats.round_trips, stats.renewals + 1);
    EXPECT_EQ(client.connection().renewals_sent(), stats.renewals);
    EXPECT_FALSE(client.connection().arguments_changed());
}

TEST(Watchdog, RenewalIntervalCountsFromWhenTheRenewalWasSent) {
    // lease/3 = 100 ms between sends; counting from the reply instead would add the 100 ms
    // delay to every interval.
    redis_server srv;
    redislock::basic_client<slow_connection> client{srv.uri(), 100ms};
    redislock::hiredis_connection probe{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("paced", {.lease = 300ms, .watchdog = true, .on_lost = lost.handler()});
    load_mutex_scripts(probe);

    m.lock();
    std::this_thread::sleep_for(1500ms);
    const auto sends = client.connection().renewal_sends();
    ASSERT_GE(sends.size(), 5U);
    const auto mean_gap = (sends.back() - sends.front()) / static_cast<int>(sends.size() - 1);
    EXPECT_LT(mean_gap, 150ms) << "mean gap between renewals: "
                               << std::chrono::duration<double, std::milli>(mean_gap).count()
                               << " ms";
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(m.verify());
    m.unlock();
}

TEST(Watchdog, UnlockReturnsWhileRenewalsRunBackToBack) {
    // Each reply takes longer than lease/3, so the lease is due again the moment its renewal
    // returns; unlock() must still get in between.
    redis_server srv;
    redislock::basic_client<slow_connection> client{srv.uri(), 250ms};
    redislock::hiredis_connection probe{srv.uri()};
    lost_counter lost;
    // An explicit owner, so another thread may unlock.
    auto m = client.mutex(
        "busy", {.lease = 600ms, .watchdog = true, .on_lost = lost.handler(), .owner = "task"});
    load_mutex_scripts(probe);

    m.lock();
    ASSERT_TRUE(eventually([&] { return client.connection().renewals_sent() >= 3; }, 3s));
    std::atomic<bool> unlocked{false};
    std::thread unlocker{[&] {
        m.unlock();
        unlocked.store(true);
    }};
    const bool returned = eventually([&] { return unlocked.load(); }, 3s);
    if (!returned) {
        client.connection().fail_every_call();  // frees a stuck unlock() so the test can end
    }
    unlocker.join();
    EXPECT_TRUE(returned) << "unlock() waited for ever-recurring renewals";
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_FALSE(exists(probe, "busy"));
}

TEST(Watchdog, TransientErrorsWithLeaseLeftAreRetriedNotReportedLost) {
    redis_server srv;
    redislock::basic_client<fault_connection> client{srv.uri()};
    redislock::hiredis_connection probe{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("flaky", {.lease = 600ms, .watchdog = true, .on_lost = lost.handler()});

    m.lock();
    // Two renewals never reach the server, two more reach it but their replies are lost.
    client.connection().inject(fault::throw_before_send, "EVALSHA", 2,
                               redislock::detail::scripts::mutex_extend);
    client.connection().inject(fault::throw_after_send, "EVALSHA", 2,
                               redislock::detail::scripts::mutex_extend);
    ASSERT_TRUE(eventually([&] { return client.connection().pending_faults() == 0; }, 3s));
    std::this_thread::sleep_for(800ms);  // more than a lease after the last failure

    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_EQ(client.watchdog().stats().losses, 0U);
    EXPECT_TRUE(m.owned());
    EXPECT_GT(pttl(probe, "flaky"), 0);
    EXPECT_TRUE(m.verify());
    m.unlock();
    EXPECT_FALSE(exists(probe, "flaky"));
}

// ---------------------------------------------------------------------------------------------
// Server faults

TEST(Watchdog, ServerPausedPastTheLeaseReportsTheLossOnceAndNothingIsRenewedAfterUnlock) {
    redis_server srv;
    redislock::client client{redislock::test::with_query(srv, "command_timeout=500")};
    redislock::client other{srv.uri()};
    lost_counter lost;
    auto m = client.mutex("paused", {.lease = 300ms, .watchdog = true, .on_lost = lost.handler()});

    m.lock();
    ASSERT_TRUE(eventually([&] { return client.watchdog().stats().renewals >= 1; }, 3s));
    srv.pause();
    std::this_thread::sleep_for(1200ms);  // four leases
    srv.resume();

    EXPECT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 5s));
    std::this_thread::sleep_for(700ms);
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(m.owned());
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));

    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(any_key_seen_within(other.connection(), {"paused"}, 700ms));

    // The watchdog still works for the next acquisition.
    m.lock();
    std::this_thread::sleep_for(700ms);
    EXPECT_TRUE(m.verify());
    EXPECT_EQ(lost.calls.load(), 1);
    m.unlock();
}

TEST(Watchdog, ServerRestartReportsTheLossOnceAndNothingIsRenewedAfterUnlock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto m =
        client.mutex("restarted", {.lease = 300ms, .watchdog = true, .on_lost = lost.handler()});

    m.lock();
    ASSERT_TRUE(eventually([&] { return client.watchdog().stats().renewals >= 1; }, 3s));
    srv.restart();  // the key is gone with the old process

    EXPECT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 5s));
    std::this_thread::sleep_for(700ms);
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(m.owned());

    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);
    redislock::hiredis_connection probe{srv.uri()};
    EXPECT_FALSE(any_key_seen_within(probe, {"restarted"}, 700ms));

    m.lock();
    std::this_thread::sleep_for(700ms);
    EXPECT_TRUE(m.verify());
    EXPECT_EQ(lost.calls.load(), 1);
    m.unlock();
}

// ---------------------------------------------------------------------------------------------
// Loss handlers and lifetimes

TEST(Watchdog, OnLostHandlerMayUnlockVerifyAndTakeAnotherLockWithoutDeadlock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};

    // The handler's results, published by `done`.
    struct outcome {
        bool verified = true;
        bool took_other = false;
        std::error_code unlocked;
        std::atomic<int> calls{0};
        std::atomic<bool> done{false};
    } seen;
    // An explicit owner lets the watchdog thread act on the locks.
    auto backup = client.mutex("backup", {.lease = 300ms, .watchdog = true, .owner = "job"});
    std::optional<redislock::mutex> m;
    const auto handler = [&] {
        seen.calls.fetch_add(1);
        seen.verified = m->verify();
        seen.took_other = backup.try_lock();
        m->unlock(seen.unlocked);
        seen.done.store(true);
    };
    m.emplace(client.mutex("primary",
                           {.lease = 300ms, .watchdog = true, .on_lost = handler, .owner = "job"}));

    m->lock();
    ASSERT_TRUE(run(other.connection(), {"DEL", "primary"}).is_integer());
    ASSERT_TRUE(eventually([&] { return seen.done.load(); }, 5s)) << "the handler did not finish";
    EXPECT_EQ(seen.calls.load(), 1);
    EXPECT_FALSE(seen.verified);
    EXPECT_TRUE(seen.took_other);
    EXPECT_EQ(seen.unlocked, errc::lock_lost);

    // The lock taken inside the handler is renewed like any other.
    std::this_thread::sleep_for(700ms);
    EXPECT_TRUE(backup.verify());
    EXPECT_EQ(client.watchdog().size(), 1U);
    EXPECT_EQ(seen.calls.load(), 1);
    backup.unlock();
    EXPECT_FALSE(exists(other.connection(), "backup"));
}

TEST(Watchdog, ClientDestroyedWithLocksHeldKeepsRenewingThemUntilTheyGo) {
    redis_server srv;
    redislock::hiredis_connection probe{srv.uri()};
    const std::size_t threads_before = thread_count();
    auto client = std::make_unique<redislock::client>(srv.uri());
    lost_counter lost;
    const redislock::lock_options watched{
        .lease = 300ms, .watchdog = true, .on_lost = lost.handler()};
    std::optional<redislock::mutex> plain{client->mutex("orphan:mutex", watched)};
    std::optional<redislock::recursive_mutex> reentrant{
        client->recursive_mutex("orphan:recursive", watched)};
    std::optional<redislock::shared_mutex> shared{client->shared_mutex("orphan:shared", watched)};
    const std::vector<std::string> keys{"orphan:mutex", "orphan:recursive", "orphan:shared"};

    plain->lock();
    reentrant->lock();
    shared->lock();
    shared->lock_shared();
    client.reset();
    // Locks keep the client's machinery: still renewed well past their lease, never lost.
    std::this_thread::sleep_for(700ms);
    for (const auto& key : keys) {
        EXPECT_GT(pttl(probe, key), 0) << key << " was not renewed after its client went";
    }
    EXPECT_TRUE(plain->owned());
    EXPECT_TRUE(reentrant->owned());
    EXPECT_TRUE(shared->owned());
    EXPECT_EQ(lost.calls.load(), 0);

    // The last lock going releases and stops every thread.
    plain.reset();
    reentrant.reset();
    shared.reset();
    for (const auto& key : keys) {
        EXPECT_FALSE(exists(probe, key)) << key;
    }
    EXPECT_TRUE(eventually([&] { return thread_count() == threads_before; }, 2s))
        << "a thread outlived the client and its locks";
}

TEST(Watchdog, ClientDestroyedDuringARenewalNeitherWaitsNorStopsTheRenewals) {
    redis_server srv;
    redislock::hiredis_connection probe{srv.uri()};
    auto client = std::make_unique<redislock::basic_client<slow_connection>>(srv.uri(), 150ms);
    slow_connection* conn = &client->connection();  // the locks keep it alive
    std::optional<redislock::basic_mutex<slow_connection>> m{
        client->mutex("inflight", {.lease = 600ms, .watchdog = true})};

    m->lock();
    ASSERT_TRUE(eventually([&] { return conn->renewal_in_flight(); }, 3s));
    client.reset();
    const auto renewals = conn->renewals_sent();
    EXPECT_TRUE(eventually([&] { return conn->renewals_sent() > renewals; }, 2s));
    EXPECT_TRUE(m->owned());
    EXPECT_FALSE(conn->arguments_changed()) << "a renewal's arguments were freed in flight";
    m.reset();  // the last lock: releases, then ends the client's machinery (and `conn`)
    EXPECT_FALSE(exists(probe, "inflight"));
}

// ---------------------------------------------------------------------------------------------
// Processes

TEST(Watchdog, HolderKilledWithSigkillFreesTheLockWithinOneLease) {
    redis_server srv;
    const std::string uri = srv.uri();
    // Forked before this process makes a client or a thread.
    child_process holder{[uri](line_channel& parent) {
        redislock::client client{uri};
        auto m = client.mutex("killed", {.lease = 300ms, .watchdog = true});
        m.lock();
        parent.send("locked");
        (void)parent.receive(20s);  // killed long before
        return 0;
    }};
    ASSERT_EQ(holder.channel().receive(10s), "locked");

    redislock::client client{uri};
    auto m = client.mutex("killed", {.lease = 300ms});
    std::this_thread::sleep_for(700ms);
    const bool taken_from_holder = m.try_lock();
    EXPECT_FALSE(taken_from_holder) << "the holder's watchdog did not keep the lock";
    if (taken_from_holder) {
        m.unlock();
    }

    ASSERT_EQ(::kill(holder.pid(), SIGKILL), 0);
    const stopwatch since_kill;
    EXPECT_TRUE(m.try_lock_for(5s));
    EXPECT_LE(since_kill.elapsed(), 300ms + 1000ms);
    EXPECT_EQ(holder.wait(10s), std::nullopt) << "the holder was meant to die from SIGKILL";
    m.unlock();
}

TEST(Watchdog, ChildProcessNeverRenewsItsParentsLocks) {
    redis_server srv;
    const std::string uri = srv.uri();
    // The grandchild is re-parented to this process when its parent dies, so it can be reaped.
    struct subreaper {
        subreaper() { EXPECT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0); }
        ~subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 0); }
    } const reaper;
    child_process parent{[uri](line_channel& test) {
        redislock::client client{uri};
        auto m = client.mutex("inherited", {.lease = 300ms, .watchdog = true});
        m.lock();
        std::this_thread::sleep_for(700ms);
        test.send(m.verify() ? "renewed" : "not renewed");
        const pid_t child = ::fork();
        if (child == 0) {
            test.send("child alive");
            std::this_thread::sleep_for(1500ms);
            test.send("child done");
            ::_exit(0);
        }
        test.send("forked " + std::to_string(child));
        ::kill(::getpid(), SIGKILL);
        return 1;
    }};

    redislock::hiredis_connection probe{uri};
    EXPECT_EQ(parent.channel().receive(10s), "renewed");
    pid_t child = -1;
    bool child_alive = false;
    while (child < 0 || !child_alive) {
        const auto line = parent.channel().receive(10s);
        ASSERT_TRUE(line.has_value()) << "the parent did not fork";
        if (line->starts_with("forked ")) {
            child = std::stoi(line->substr(7));
        } else {
            ASSERT_EQ(*line, "child alive");
            child_alive = true;
        }
    }
    ASSERT_GT(child, 0);
    EXPECT_EQ(parent.wait(10s), std::nullopt) << "the parent was meant to die from SIGKILL";

    // The parent's last renewal runs out within a lease; the child, alive for 1.5 s, must not
    // renew it meanwhile.
    const stopwatch since_death;
    EXPECT_TRUE(eventually([&] { return !exists(probe, "inherited"); }, 300ms + 700ms));
    EXPECT_FALSE(any_key_seen_within(probe, {"inherited"}, 300ms));
    EXPECT_LT(since_death.elapsed(), 1500ms) << "the check outlasted the child";
    EXPECT_EQ(parent.channel().receive(10s), "child done");

    const auto status = redislock::test::wait_child(child, 10s);
    ASSERT_TRUE(status.has_value());
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
}

TEST(Watchdog, ChildForkedDuringARenewalCanDropItsCopiesWithoutHanging) {
    // The child inherits a watchdog that believes a renewal is in flight; no thread of the
    // child will ever finish it.
    redis_server srv;
    auto client = std::make_unique<redislock::basic_client<slow_connection>>(srv.uri(), 200ms);
    slow_connection* conn = &client->connection();

    for (const bool client_first : {true, false}) {
        SCOPED_TRACE(client_first ? "client destroyed first" : "lock destroyed first");
        std::optional<redislock::basic_mutex<slow_connection>> m{client->mutex(
            client_first ? "forked:1" : "forked:2", {.lease = 900ms, .watchdog = true})};
        m->lock();
        ASSERT_TRUE(eventually([&] { return conn->renewal_in_flight(); }, 3s));
        child_process child{[&, client_first](line_channel&) {
            if (client_first) {
                client.reset();
                m.reset();
            } else {
                m.reset();
                client.reset();
            }
            return 0;
        }};
        EXPECT_EQ(child.wait(5s), 0) << "the child hung or failed dropping its copies";
    }
}

}  // namespace

namespace {

// Two leases lost in one batch: the first handler destroys the second lock. Its callbacks still
// queued in that batch must be skipped, not run on the destroyed state (ASan catches a slip).
TEST(Watchdog, HandlerDestroyingAnotherLockOfTheSameBatchSkipsItsCallbacks) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};

    std::atomic<int> first_calls{0};
    std::atomic<int> second_calls{0};
    std::atomic<int> second_calls_by_destruction{-1};
    std::unique_ptr<redislock::mutex> second;
    auto first =
        client.mutex("batch:first", {.lease = 600ms,
                                     .watchdog = true,
                                     .on_lost =
                                         [&] {
                                             first_calls.fetch_add(1);
                                             // Its release may report the loss itself.
                                             second.reset();
                                             second_calls_by_destruction.store(second_calls.load());
                                         },
                                     .owner = "job"});
    second = std::make_unique<redislock::mutex>(
        client.mutex("batch:second", {.lease = 600ms,
                                      .watchdog = true,
                                      .on_lost = [&] { second_calls.fetch_add(1); },
                                      .owner = "job"}));
    // Taken back to back, so their renewals fall due together and share a batch.
    first.lock();
    second->lock();
    ASSERT_TRUE(run(other.connection(), {"DEL", "batch:first", "batch:second"}).is_integer());

    ASSERT_TRUE(eventually([&] { return first_calls.load() == 1; }, 5s));
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(first_calls.load(), 1);
    EXPECT_LE(second_calls_by_destruction.load(), 1);
    EXPECT_EQ(second_calls.load(), second_calls_by_destruction.load())
        << "a callback of the destroyed lock ran after its destruction";
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
}

// A handler may destroy the very lock it reports on: it runs on a copy of itself.
TEST(Watchdog, HandlerMayDestroyItsOwnLock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};

    std::atomic<bool> done{false};
    std::unique_ptr<redislock::mutex> m;
    m = std::make_unique<redislock::mutex>(client.mutex("self:destroy", {.lease = 300ms,
                                                                         .watchdog = true,
                                                                         .on_lost =
                                                                             [&] {
                                                                                 m.reset();
                                                                                 done.store(true);
                                                                             },
                                                                         .owner = "job"}));
    m->lock();
    ASSERT_TRUE(run(other.connection(), {"DEL", "self:destroy"}).is_integer());
    ASSERT_TRUE(eventually([&] { return done.load(); }, 5s));
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
}

}  // namespace
