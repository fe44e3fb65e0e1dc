#include <redislock/counting_semaphore.hpp>

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <tuple>
#include <type_traits>
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
using redislock::semaphore_options;
using redislock::test::eventually;
using redislock::test::redis_server;

static_assert(noexcept(std::declval<redislock::counting_semaphore&>().release()));
static_assert(!std::is_copy_constructible_v<redislock::counting_semaphore>);
static_assert(std::is_nothrow_move_constructible_v<redislock::counting_semaphore>);
static_assert(
    !std::is_copy_constructible_v<redislock::permit_guard<redislock::counting_semaphore>>);
static_assert(
    std::is_nothrow_move_constructible_v<redislock::permit_guard<redislock::counting_semaphore>>);

TEST(Semaphore, NoMoreObjectsHoldAPermitThanThereArePermits) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto a = client.semaphore("exports", {.permits = 2, .lease = 5s});
    auto b = client.semaphore("exports", {.permits = 2, .lease = 5s});
    auto c = client.semaphore("exports", {.permits = 2, .lease = 5s});
    EXPECT_EQ(a.available_permits(), 2);
    ASSERT_TRUE(a.try_acquire());
    ASSERT_TRUE(b.try_acquire());
    EXPECT_EQ(a.available_permits(), 0);
    EXPECT_FALSE(c.try_acquire());
    EXPECT_FALSE(c.try_acquire_for(100ms));
    EXPECT_EQ(srv.cli({"ZCARD", "exports"}), "2");
    EXPECT_NE(srv.cli({"ZSCORE", "exports", a.permit_id()}), "") << "each permit has its own id";
    EXPECT_NE(a.permit_id(), b.permit_id());
    EXPECT_EQ(c.permit_id(), "");
    EXPECT_EQ(srv.cli({"GET", "{exports}:permits"}), "2");
    EXPECT_TRUE(a.owned());
    EXPECT_GT(a.remaining(), 4s);

    a.release();
    EXPECT_FALSE(a.owned());
    EXPECT_TRUE(c.try_acquire());
    b.release();
    c.release();
    EXPECT_EQ(a.available_permits(), 2);
    EXPECT_EQ(srv.cli({"EXISTS", "exports"}), "0");
    EXPECT_TRUE(eventually([&] {
        return srv.cli({"EXISTS", "{exports}:queue", "{exports}:waiting"}) == "0";
    }));
    EXPECT_EQ(srv.cli({"EXISTS", "{exports}:permits"}), "1") << "the count is kept";
}

TEST(Semaphore, AnObjectHoldsOnePermitAndAnyThreadMayGiveItBack) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto s = client.semaphore("one", {.permits = 3, .lease = 5s});
    ASSERT_TRUE(s.try_acquire());
    try {
        (void)s.try_acquire();
        ADD_FAILURE() << "a second permit on one object";
    } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), std::errc::resource_deadlock_would_occur);
    }
    std::error_code ec;
    std::thread other{[&] { s.release(ec); }};
    other.join();
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"EXISTS", "one"}), "0");
    s.release(ec);
    EXPECT_EQ(ec, errc::not_held);
}

TEST(Semaphore, BadOptionsAndForeignKeysAreRefused) {
    redis_server srv;
    redislock::client client{srv.uri()};
    EXPECT_THROW((void)client.semaphore("s", {.permits = 0}), redislock::invalid_argument);
    EXPECT_THROW((void)client.semaphore("", {.permits = 1}), redislock::invalid_argument);
    auto s = client.semaphore("s", {.permits = 2});
    EXPECT_THROW((void)s.set_permits(0), redislock::invalid_argument);
    srv.cli({"SET", "s", "not a semaphore"});
    EXPECT_THROW((void)s.try_acquire(), redislock::error);
    EXPECT_EQ(srv.cli({"GET", "s"}), "not a semaphore");
    EXPECT_EQ(srv.cli({"EXISTS", "{s}:permits"}), "0") << "nothing written by a refused call";
    EXPECT_THROW((void)s.available_permits(), redislock::error);
    srv.cli({"DEL", "s"});
    srv.cli({"SET", "{s}:permits", "many"});
    EXPECT_THROW((void)s.try_acquire(), redislock::error);
    EXPECT_EQ(srv.cli({"EXISTS", "s"}), "0");
}

TEST(Semaphore, TheStoredCountStandsAndADifferentOneIsTold) {
    redis_server srv;
    struct told_event {
        redislock::lock_kind kind;
        std::string name;
        std::string detail;  // the event's views last only for the hook's call
    };
    std::mutex m;
    std::vector<told_event> told;
    redislock::client client{
        srv.uri(), {.on_event = [&](const redislock::lock_event& e) {
            if (e.type == redislock::event_type::permits_differ) {
                std::lock_guard guard{m};
                told.push_back({e.kind, std::string{e.name}, std::string{e.detail}});
            }
        }}};
    auto first = client.semaphore("pool", {.permits = 1});
    ASSERT_TRUE(first.try_acquire());
    auto second = client.semaphore("pool", {.permits = 3});
    EXPECT_FALSE(second.try_acquire()) << "the stored count (1) stands";
    EXPECT_FALSE(second.try_acquire());
    std::lock_guard guard{m};
    ASSERT_EQ(told.size(), 1U) << "once per object";
    EXPECT_EQ(told[0].kind, redislock::lock_kind::semaphore);
    EXPECT_EQ(told[0].name, "pool");
    EXPECT_NE(told[0].detail.find("1 permits"), std::string::npos) << told[0].detail;
    EXPECT_EQ(redislock::to_string(redislock::event_type::permits_differ), "permits_differ");
}

TEST(Semaphore, LoweringTheCountRevokesNothingAndRaisingItWakesAWaiter) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto a = client.semaphore("lanes", {.permits = 2, .lease = 10s});
    auto b = client.semaphore("lanes", {.permits = 2, .lease = 10s});
    auto c = client.semaphore("lanes", {.permits = 2, .lease = 10s});
    ASSERT_TRUE(a.try_acquire());
    ASSERT_TRUE(b.try_acquire());
    EXPECT_EQ(a.set_permits(1), 2);
    EXPECT_TRUE(a.extend(10s)) << "a held permit is not revoked";
    EXPECT_TRUE(b.extend(10s));
    a.release();
    EXPECT_FALSE(c.try_acquire()) << "one holder is all one permit allows";
    EXPECT_EQ(c.available_permits(), 0);

    std::atomic<bool> got{false};
    std::thread waiter{[&] { got = c.try_acquire_for(20s); }};
    ASSERT_TRUE(eventually([&] { return srv.cli({"ZCARD", "{lanes}:queue"}) == "1"; }));
    EXPECT_EQ(a.set_permits(3), 1);
    waiter.join();
    EXPECT_TRUE(got.load()) << "the new permit went to the waiter";
    EXPECT_TRUE(b.owned()) << "while the other holder kept its own";
    b.release();
    c.release();
}

TEST(Semaphore, WaitersGetPermitsInTheOrderTheyCame) {
    redis_server srv;
    redislock::client holder_client{srv.uri()};
    auto holder = holder_client.semaphore("fifo", {.permits = 1, .lease = 20s});
    ASSERT_TRUE(holder.try_acquire());
    // Two clients: in one process the threads of one name line up locally as well.
    redislock::client first_client{srv.uri()};
    redislock::client second_client{srv.uri()};
    auto first = first_client.semaphore("fifo", {.permits = 1, .lease = 20s});
    auto second = second_client.semaphore("fifo", {.permits = 1, .lease = 20s});
    std::mutex m;
    std::vector<std::string> order;
    std::thread one{[&] {
        if (first.try_acquire_for(30s)) {
            std::lock_guard guard{m};
            order.push_back("first");
        }
    }};
    ASSERT_TRUE(eventually([&] { return srv.cli({"ZCARD", "{fifo}:queue"}) == "1"; }));
    std::thread two{[&] {
        if (second.try_acquire_for(30s)) {
            std::lock_guard guard{m};
            order.push_back("second");
        }
    }};
    ASSERT_TRUE(eventually([&] { return srv.cli({"ZCARD", "{fifo}:queue"}) == "2"; }));
    holder.release();
    one.join();
    EXPECT_TRUE(second.available_permits() == 0);
    first.release();
    two.join();
    second.release();
    ASSERT_EQ(order.size(), 2U);
    EXPECT_EQ(order[0], "first");
    EXPECT_EQ(order[1], "second");
}

TEST(Semaphore, FencingTokensGrowAcrossPermits) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto a = client.semaphore("fenced", {.permits = 2, .fencing = true});
    auto b = client.semaphore("fenced", {.permits = 2, .fencing = true});
    ASSERT_TRUE(a.try_acquire());
    ASSERT_TRUE(b.try_acquire());
    const auto ta = a.fencing_token();
    const auto tb = b.fencing_token();
    EXPECT_GT(ta, 0);
    EXPECT_GT(tb, ta);
    a.release();
    ASSERT_TRUE(a.try_acquire());
    EXPECT_GT(a.fencing_token(), tb);
    a.release();
    b.release();
    EXPECT_EQ(a.fencing_token(), 0);
}

TEST(Semaphore, APermitNotRenewedIsLostAndTheWatchdogKeepsOne) {
    redis_server srv;
    redislock::client client{srv.uri() + "?command_timeout=200"};
    std::atomic<int> brief_lost{0};
    auto brief = client.semaphore("leases",
                                  {.permits = 2, .lease = 200ms, .on_lost = [&] { ++brief_lost; }});
    auto kept = client.semaphore("leases", {.permits = 2, .lease = 3s, .watchdog = true});
    ASSERT_TRUE(brief.try_acquire());
    ASSERT_TRUE(kept.try_acquire());
    const long long first_end = std::stoll(srv.cli({"ZSCORE", "leases", kept.permit_id()}));
    const auto stopped = brief.lost_token();
    ASSERT_TRUE(eventually([&] { return stopped.stop_requested(); }, 10s));
    EXPECT_FALSE(brief.owned());
    EXPECT_EQ(brief_lost.load(), 1);
    // The watchdog moved the kept permit's lease end on (in the server's time).
    EXPECT_TRUE(eventually(
        [&] {
            const std::string end = srv.cli({"ZSCORE", "leases", kept.permit_id()});
            return !end.empty() && std::stoll(end) > first_end;
        },
        10s));
    EXPECT_GE(kept.available_permits(), 1) << "the lapsed permit is free again";
    std::error_code ec;
    brief.release(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    kept.release();
}

// Checked in the server's time, whatever the scheduler does: the permit a new holder gets starts
// no earlier than the dead holder's lease ends (each member's score is when its lease ends).
TEST(Semaphore, ADeadHoldersPermitComesBackWhenItsLeaseEnds) {
    redis_server srv;
    std::string dead_permit;
    {
        redislock::test::child_process child{[&](redislock::test::line_channel& channel) {
            redislock::client client{srv.uri()};
            auto s = client.semaphore("crash", {.permits = 1, .lease = 700ms});
            if (!s.try_acquire()) {
                return 1;
            }
            channel.send(s.permit_id());
            ::_exit(0);  // dies holding it: no release
        }};
        dead_permit = child.channel().receive(10s).value_or("");
        ASSERT_EQ(dead_permit.size(), 32U) << dead_permit;
        EXPECT_EQ(child.wait(10s), 0);
    }
    const std::string dead_ends = srv.cli({"ZSCORE", "crash", dead_permit});
    redislock::client client{srv.uri()};
    auto s = client.semaphore("crash", {.permits = 1, .lease = 5s});
    ASSERT_TRUE(s.try_acquire_for(10s));
    const long long ends = std::stoll(srv.cli({"ZSCORE", "crash", s.permit_id()}));
    if (!dead_ends.empty()) {  // empty: its lease had ended (and it was removed) already
        EXPECT_GE(ends - 5000, std::stoll(dead_ends)) << "granted before the dead lease ended";
    }
    EXPECT_EQ(srv.cli({"ZSCORE", "crash", dead_permit}), "") << "the lapsed permit was removed";
    s.release();
}

TEST(Semaphore, VerifyAsksRedisWhetherThePermitIsStillLive) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::atomic<int> lost{0};
    auto s = client.semaphore("checked", {.permits = 2, .lease = 10s, .on_lost = [&] { ++lost; }});
    EXPECT_FALSE(s.verify()) << "nothing held";
    ASSERT_TRUE(s.try_acquire());
    EXPECT_TRUE(s.verify());
    srv.cli({"DEL", "checked"});  // freed by hand
    EXPECT_FALSE(s.verify());
    EXPECT_EQ(lost.load(), 1);
    EXPECT_FALSE(s.owned());
    std::error_code ec;
    s.release(ec);
    EXPECT_EQ(ec, errc::lock_lost);
}

TEST(Semaphore, PermitGuardHoldsForAScope) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto s = client.semaphore("scoped", {.permits = 1});
    auto other = client.semaphore("scoped", {.permits = 1});
    {
        redislock::permit_guard guard{s};
        EXPECT_TRUE(guard.owns_permit());
        redislock::permit_guard tried{other, std::try_to_lock};
        EXPECT_FALSE(tried);
        redislock::permit_guard moved{std::move(guard)};
        EXPECT_TRUE(moved.owns_permit());
        EXPECT_FALSE(guard.owns_permit());
        EXPECT_TRUE(s.owned());
    }
    EXPECT_FALSE(s.owned());
    EXPECT_TRUE(other.try_acquire());
    other.release();
}

TEST(Semaphore, CountsBeyondWhatScriptsKeepExactAreRefusedBeforeAnythingIsWritten) {
    redis_server srv;
    redislock::client client{srv.uri()};
    EXPECT_THROW((void)client.semaphore("big", {.permits = 100'000'000'000'000'000}),
                 redislock::invalid_argument);
    auto s = client.semaphore("big", {.permits = 1'000'000'000'000});
    ASSERT_TRUE(s.try_acquire());
    EXPECT_EQ(srv.cli({"GET", "{big}:permits"}), "1000000000000") << "digits, not 1e+12";
    EXPECT_EQ(s.available_permits(), 999'999'999'999);
    EXPECT_THROW((void)s.set_permits(100'000'000'000'000'000), redislock::invalid_argument);
    s.release();

    // The scripts refuse such a count themselves, writing nothing.
    namespace scripts = redislock::detail::scripts;
    const std::array<std::string_view, 4> keys{"huge", "{huge}:queue", "{huge}:waiting",
                                               "{huge}:permits"};
    const reply r = redislock::detail::run_script(
        client.connection(), scripts::semaphore_acquire, keys,
        std::array<std::string_view, 8>{"p1", "5000", "0", "w", "0", "{huge}:released", "100",
                                        "100000000000000000"},
        {}, nullptr);
    EXPECT_TRUE(r.is_error());
    const reply set = redislock::detail::run_script(
        client.connection(), scripts::semaphore_set_permits, keys,
        std::array<std::string_view, 3>{"100000000000000000", "{huge}:released", "100"}, {},
        nullptr);
    EXPECT_TRUE(set.is_error());
    EXPECT_EQ(srv.cli({"EXISTS", "huge", "{huge}:permits"}), "0");
}

TEST(Semaphore, OneAcquireCallAtATimePerObject) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto shared = client.semaphore("shared:object", {.permits = 3, .lease = 5s});
    std::atomic<int> acquired{0};
    std::atomic<int> refused{0};
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
        threads.emplace_back([&] {
            ++ready;
            while (ready.load() < 2) {
            }
            try {
                if (shared.try_acquire_for(2s)) {
                    ++acquired;
                }
            } catch (const std::system_error& e) {
                EXPECT_EQ(e.code(), std::errc::resource_deadlock_would_occur);
                ++refused;
            }
        });
    }
    for (auto& t : threads) {
        t.join();
    }
    EXPECT_EQ(acquired.load(), 1);
    EXPECT_EQ(refused.load(), 1);
    EXPECT_EQ(srv.cli({"ZCARD", "shared:object"}), "1") << "one permit per object";
    shared.release();
    EXPECT_EQ(srv.cli({"EXISTS", "shared:object"}), "0");
}

// A waiter told it may take a free permit that gives up instead passes its turn on: the
// waiters behind it are told at once, not when a lease ends.
TEST(Semaphore, AToldWaiterThatLeavesTellsTheNextOne) {
    redis_server srv;
    redislock::client client{srv.uri()};
    namespace scripts = redislock::detail::scripts;
    const std::string now_ms = srv.cli({"EVAL",
                                        "local t = redis.call('TIME') return "
                                        "t[1] * 1000 + math.floor(t[2] / 1000)",
                                        "0"});
    const long long now = std::stoll(now_ms);
    srv.cli({"ZADD", "turns", std::to_string(now + 60'000), "holder"});
    srv.cli({"SET", "{turns}:permits", "2"});
    for (const auto& [id, ticket] : {std::pair{"wB", "1"}, {"wC", "2"}, {"wD", "3"}}) {
        srv.cli({"ZADD", "{turns}:queue", ticket, id});
        srv.cli({"ZADD", "{turns}:waiting", std::to_string(now + 60'000), id});
    }
    const reply r = redislock::detail::run_script(
        client.connection(), scripts::queue_leave,
        std::array<std::string_view, 4>{"turns", "{turns}:queue", "{turns}:waiting",
                                        "{turns}:permits"},
        std::array<std::string_view, 5>{"wB", "{turns}:released", "100", "s", "2"}, {}, nullptr);
    ASSERT_EQ(r, reply::integer(1)) << r.text();
    EXPECT_EQ(srv.cli({"ZSCORE", "{turns}:queue", "wB"}), "");
    const long long c_lapses = std::stoll(srv.cli({"ZSCORE", "{turns}:waiting", "wC"}));
    EXPECT_LE(c_lapses, now + 10'000) << "C was told: its entry lapses with the grace now";
}

// Two waiters told they may take the two free permits never come: their standby, the third,
// takes one when their places lapse, and the fourth is told of the other at once, not when a
// lease ends.
TEST(Semaphore, AGrantLeavingPermitsFreeTellsTheNextWaiters) {
    redis_server srv;
    redislock::client client{srv.uri()};
    namespace scripts = redislock::detail::scripts;
    const long long now = std::stoll(srv.cli(
        {"EVAL", "local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)",
         "0"}));
    srv.cli({"SET", "{gone}:permits", "2"});
    for (const auto& [id, ticket, lapse] : {std::tuple{"w1", "1", now - 1},
                                            {"w2", "2", now - 1},
                                            {"w3", "3", now + 60'000},
                                            {"w4", "4", now + 60'000}}) {
        srv.cli({"ZADD", "{gone}:queue", ticket, id});
        srv.cli({"ZADD", "{gone}:waiting", std::to_string(lapse), id});
    }
    const reply r = redislock::detail::run_script(
        client.connection(), scripts::semaphore_acquire,
        std::array<std::string_view, 4>{"gone", "{gone}:queue", "{gone}:waiting", "{gone}:permits"},
        std::array<std::string_view, 8>{"p3", "5000", "0", "w3", "2000", "{gone}:released", "100",
                                        "2"},
        {}, nullptr);
    ASSERT_TRUE(r.is_array()) << r.text();
    EXPECT_EQ(r.elements()[0], reply::integer(1)) << "the standby takes a permit";
    const long long w4_lapses = std::stoll(srv.cli({"ZSCORE", "{gone}:waiting", "w4"}));
    EXPECT_LE(w4_lapses, now + 10'000) << "w4 was told of the permit still free";
}

// A count that is not a whole number (written by another program) makes a leaving waiter
// assume its object's count: it never writes and then fails.
TEST(Semaphore, AWaiterLeavesWhateverTheStoredCountHolds) {
    redis_server srv;
    redislock::client client{srv.uri()};
    namespace scripts = redislock::detail::scripts;
    srv.cli({"SET", "{odd}:permits", "3.5"});
    srv.cli({"ZADD", "{odd}:queue", "1", "wX", "2", "wY"});
    srv.cli({"ZADD", "{odd}:waiting", "99999999999999", "wX", "99999999999999", "wY"});
    const reply r = redislock::detail::run_script(
        client.connection(), scripts::queue_leave,
        std::array<std::string_view, 4>{"odd", "{odd}:queue", "{odd}:waiting", "{odd}:permits"},
        std::array<std::string_view, 5>{"wX", "{odd}:released", "100", "s", "2"}, {}, nullptr);
    EXPECT_FALSE(r.is_error()) << r.text();
    EXPECT_EQ(srv.cli({"ZSCORE", "{odd}:queue", "wX"}), "");
}

// A child forked while another thread of its parent waits in acquire() on an object may use its
// copy of that object: the parent's call is not the child's.
TEST(Semaphore, AChildForkedDuringAnAcquireMayAcquireThroughItsCopy) {
#if defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "ThreadSanitizer cannot follow a child forked from a multi-threaded process";
#endif
    redis_server srv;
    redislock::client client{srv.uri()};
    auto holder = client.semaphore("forked", {.permits = 1, .lease = 10s});
    ASSERT_TRUE(holder.try_acquire());
    auto waiting = client.semaphore("forked", {.permits = 1, .lease = 10s});
    std::thread waiter{[&] { (void)waiting.try_acquire_for(3s); }};
    ASSERT_TRUE(eventually([&] { return srv.cli({"ZCARD", "{forked}:queue"}) == "1"; }));
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        int code = 1;
        try {
            code = waiting.try_acquire() ? 2 : 0;  // the one permit is held: false, no throw
        } catch (...) {
            code = 3;
        }
        ::_exit(code);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "3: the child's acquire threw";
    holder.release();
    waiter.join();
    waiting.release();
}

// Outside check: processes x threads take permits (2 of them) through kill -9 of a holder,
// SIGSTOP past the lease and CLIENT KILL; each records its time inside (from the grant until it
// gives back or its local deadline, whichever comes first) in shared memory, and no moment may
// see more than 2 inside.
TEST(SemaphoreFaults, NeverMoreHoldersThanPermitsThroughKillsStopsAndDisconnects) {
    constexpr int permits = 2;
    constexpr int processes = 4;
    constexpr int threads = 2;
    constexpr std::size_t slots = 20000;
    struct shared_log {
        std::atomic<std::size_t> used;
        redislock::test::hold_interval intervals[slots];
    };
    void* memory = ::mmap(nullptr, sizeof(shared_log), PROT_READ | PROT_WRITE,
                          MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(memory, MAP_FAILED);
    auto* log = new (memory) shared_log{};
    redis_server srv;
    std::vector<std::unique_ptr<redislock::test::child_process>> children;
    for (int p = 0; p < processes; ++p) {
        children.push_back(std::make_unique<redislock::test::child_process>(
            [&](redislock::test::line_channel& channel) {
                redislock::client client{srv.uri()};
                std::vector<std::thread> workers;
                const auto end = std::chrono::steady_clock::now() + 6s;
                for (int t = 0; t < threads; ++t) {
                    workers.emplace_back([&] {
                        auto s = client.semaphore("faulty", {.permits = permits, .lease = 400ms});
                        while (std::chrono::steady_clock::now() < end) {
                            try {
                                if (!s.try_acquire_for(1s)) {
                                    continue;
                                }
                            } catch (const redislock::error&) {
                                continue;
                            }
                            const std::int64_t enter = redislock::test::monotonic_ns();
                            const std::int64_t until =
                                enter +
                                std::chrono::duration_cast<std::chrono::nanoseconds>(s.remaining())
                                    .count();
                            std::this_thread::sleep_for(5ms);
                            const std::int64_t left =
                                std::min(redislock::test::monotonic_ns(), until);
                            s.release();
                            const std::size_t at = log->used.fetch_add(1);
                            if (at < slots) {
                                log->intervals[at] = {enter, left};
                            }
                        }
                    });
                }
                for (auto& w : workers) {
                    w.join();
                }
                channel.send("done");
                return 0;
            }));
    }
    std::this_thread::sleep_for(1500ms);
    ::kill(children[0]->pid(), SIGKILL);
    std::this_thread::sleep_for(500ms);
    ::kill(children[1]->pid(), SIGSTOP);
    std::this_thread::sleep_for(1200ms);  // three leases
    ::kill(children[1]->pid(), SIGCONT);
    (void)srv.client_kill_all();
    for (std::size_t i = 1; i < children.size(); ++i) {
        EXPECT_EQ(children[i]->channel().receive(30s).value_or(""), "done") << "process " << i;
        EXPECT_EQ(children[i]->wait(10s), 0);
    }
    (void)children[0]->wait(10s);

    const std::size_t n = std::min(log->used.load(), slots);
    std::vector<std::pair<std::int64_t, int>> edges;
    for (std::size_t i = 0; i < n; ++i) {
        edges.emplace_back(log->intervals[i].enter_ns, +1);
        edges.emplace_back(log->intervals[i].exit_ns, -1);
    }
    std::sort(edges.begin(), edges.end());  // an exit before an entry at the same instant
    int inside = 0;
    int most = 0;
    for (const auto& [at, step] : edges) {
        inside += step;
        most = std::max(most, inside);
    }
    EXPECT_LE(most, permits);
    EXPECT_GT(n, 50U) << "too little work to prove anything";
    std::printf("[ permits  ] %zu holds, at most %d at once\n", n, most);
    // Nothing left but the count, once the killed holder's lease and queue places lapse.
    EXPECT_TRUE(eventually(
        [&] {
            return srv.cli({"EXISTS", "faulty", "{faulty}:queue", "{faulty}:waiting"}) == "0";
        },
        15s));
    ::munmap(memory, sizeof(shared_log));
}

}  // namespace
