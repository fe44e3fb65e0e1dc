// Building blocks of the hot path, tested on their own: the RESP formatting that replaces
// hiredis's, the in-place callable of the loss timer, and the timer's reuse of its nodes.

#include <gtest/gtest.h>

#include <hiredis/hiredis.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::detail::inplace_function;
using redislock::detail::loss_timer;
using redislock::detail::resp_command;

// What hiredis itself makes of the same argv.
std::string formatted_by_hiredis(const std::vector<std::string_view>& argv) {
    std::vector<const char*> pointers;
    std::vector<std::size_t> lengths;
    for (std::string_view arg : argv) {
        pointers.push_back(arg.data());
        lengths.push_back(arg.size());
    }
    char* out = nullptr;
    const auto size = redisFormatCommandArgv(&out, static_cast<int>(argv.size()), pointers.data(),
                                             lengths.data());
    std::string text{out, static_cast<std::size_t>(size)};
    redisFreeCommand(out);
    return text;
}

std::string formatted_here(const std::vector<std::string_view>& argv) {
    const resp_command command{argv};
    return std::string{command.data(), command.size()};
}

TEST(RespCommand, MatchesHiredisForTheCommandsTheLocksSend) {
    const std::vector<std::vector<std::string_view>> cases{
        {"PING"},
        {"SET", "orders:42", "0123456789abcdef0123456789abcdef", "NX", "PX", "30000"},
        {"EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "2", "k1", "{k1}:fence", "a", "b",
         "c", "d", "e", "f", "g"},
    };
    for (const auto& argv : cases) {
        EXPECT_EQ(formatted_here(argv), formatted_by_hiredis(argv)) << argv.front();
    }
}

TEST(RespCommand, EmptyAndBinaryArgumentsAreSentAsTheyAre) {
    using namespace std::string_view_literals;
    const std::vector<std::string_view> argv{"SET", ""sv, "a\0b\r\n$3\r\n"sv, "\xff"sv};
    EXPECT_EQ(formatted_here(argv), formatted_by_hiredis(argv));
    EXPECT_EQ(formatted_here({"GET", ""}), "*2\r\n$3\r\nGET\r\n$0\r\n\r\n");
}

TEST(RespCommand, CommandsLongerThanTheInlineBufferAreWhole) {
    const std::string script(5000, 'x');
    std::vector<std::string_view> argv{"SCRIPT", "LOAD", script};
    EXPECT_EQ(formatted_here(argv), formatted_by_hiredis(argv));
    // Many arguments: a two-digit count, and a buffer just past the inline size.
    std::vector<std::string> words;
    for (int i = 0; i < 120; ++i) {
        words.push_back("w" + std::to_string(i));
    }
    std::vector<std::string_view> many{"DEL"};
    many.insert(many.end(), words.begin(), words.end());
    EXPECT_EQ(formatted_here(many), formatted_by_hiredis(many));
    for (std::size_t length : {480u, 490u, 495u, 500u, 510u, 520u}) {
        const std::string value(length, 'v');
        const std::vector<std::string_view> edge{"SET", "k", value};
        EXPECT_EQ(formatted_here(edge), formatted_by_hiredis(edge)) << length;
    }
}

TEST(InplaceFunction, CallsWhatItHoldsAndMovesItAlong) {
    auto counter = std::make_shared<int>(0);
    inplace_function<int(), 64> f{[counter] { return ++*counter; }};
    ASSERT_TRUE(f);
    EXPECT_EQ(f(), 1);
    inplace_function<int(), 64> g{std::move(f)};
    EXPECT_FALSE(f);  // moving empties the source
    ASSERT_TRUE(g);
    EXPECT_EQ(g(), 2);
    EXPECT_EQ(counter.use_count(), 2);
    f = std::move(g);
    EXPECT_EQ(f(), 3);
    EXPECT_EQ(counter.use_count(), 2);
}

TEST(InplaceFunction, ResetAndDestructionReleaseWhatWasCaptured) {
    auto held = std::make_shared<int>(7);
    {
        inplace_function<int(), 64> f{[held] { return *held; }};
        EXPECT_EQ(held.use_count(), 2);
        f.reset();
        EXPECT_FALSE(f);
        EXPECT_EQ(held.use_count(), 1);
        f = inplace_function<int(), 64>{[held] { return *held + 1; }};
        EXPECT_EQ(held.use_count(), 2);
    }
    EXPECT_EQ(held.use_count(), 1);
    inplace_function<int(), 64> a{[held] { return *held - 6; }};
    inplace_function<int(), 64> b{[held] { return *held - 5; }};
    EXPECT_EQ(held.use_count(), 3);
    a = std::move(b);  // a's own capture goes, b's moves in
    EXPECT_EQ(held.use_count(), 2);
    EXPECT_EQ(a(), 2);
}

// Records which entries fired, in order.
struct fired_log {
    std::mutex mutex;
    std::vector<int> order;
    void add(int which) {
        std::lock_guard lock{mutex};
        order.push_back(which);
    }
    std::vector<int> seen() {
        std::lock_guard lock{mutex};
        return order;
    }
};

TEST(LossTimer, FiresInDeadlineOrderAndNeverAfterRemove) {
    loss_timer timer;
    fired_log log;
    const auto now = loss_timer::clock::now();
    auto callback = [&log](int which) {
        return [&log, which] {
            log.add(which);
            return loss_timer::loss_notice{};
        };
    };
    timer.add(now + 60ms, callback(3));
    timer.add(now + 20ms, callback(1));
    const auto removed = timer.add(now + 30ms, callback(99));
    const auto moved = timer.add(now + 10s, callback(2));
    timer.remove(removed);
    timer.move(moved, now + 40ms);
    ASSERT_TRUE(redislock::test::eventually([&] { return log.seen().size() == 3; }, 5s));
    EXPECT_EQ(log.seen(), (std::vector<int>{1, 2, 3}));
    EXPECT_EQ(timer.size(), 0u);
}

TEST(LossTimer, ReusedEntriesKeepWorkingAndReleaseTheirCaptures) {
    loss_timer timer;
    auto captured = std::make_shared<int>(0);
    std::atomic<int> fired{0};
    // More rounds than the timer keeps spare nodes: entries are made, reused and dropped.
    for (int round = 0; round < 300; ++round) {
        std::vector<loss_timer::entry_id> ids;
        for (int i = 0; i < round % 7 + 1; ++i) {
            ids.push_back(timer.add(loss_timer::clock::now() + 1h, [captured] {
                (void)captured;
                return loss_timer::loss_notice{};
            }));
        }
        for (auto id : ids) {
            timer.move(id, loss_timer::clock::now() + 2h);
            timer.remove(id);
        }
    }
    EXPECT_EQ(timer.size(), 0u);
    EXPECT_EQ(captured.use_count(), 1) << "a removed entry still holds its callback's captures";
    // A reused entry fires at its own deadline with its own callback.
    for (int i = 0; i < 5; ++i) {
        timer.add(loss_timer::clock::now() + 5ms, [&fired, captured] {
            (void)captured;
            ++fired;
            return loss_timer::loss_notice{};
        });
    }
    ASSERT_TRUE(redislock::test::eventually([&] { return fired.load() == 5; }, 5s));
    ASSERT_TRUE(redislock::test::eventually([&] { return captured.use_count() == 1; }, 5s))
        << "a fired entry still holds its callback's captures";
}

TEST(LossTimer, StopRequestsAndHandlersRunAfterTheMark) {
    loss_timer timer;
    std::stop_source source;
    std::atomic<bool> handled{false};
    timer.add(loss_timer::clock::now() + 5ms, [&] {
        loss_timer::loss_notice notice;
        notice.source = source;
        notice.handler = [&] { handled = source.stop_requested(); };
        return notice;
    });
    ASSERT_TRUE(redislock::test::eventually([&] { return handled.load(); }, 5s));
}

}  // namespace

namespace {

using redislock::detail::local_gates;
using redislock::detail::steady;

// Threads take their turns in the order they came; one that gives up (deadline or stop request)
// before its turn leaves the line without holding up the ones behind it.
TEST(LocalGates, TurnsGoInArrivalOrderAndThoseWhoGiveUpAreSkipped) {
    local_gates gates;
    std::mutex order_mutex;
    std::vector<int> order;
    auto first = std::make_unique<local_gates::place>(gates, "name");
    ASSERT_TRUE(first->wait_turn(steady::now(), {}));  // already the first
    EXPECT_FALSE(gates.look("name").idle);

    std::stop_source stop_fourth;
    std::vector<std::thread> threads;
    std::atomic<int> queued{0};
    std::atomic<int> gave_up{0};
    const auto join = [&](int who, steady::time_point deadline, std::stop_token stop) {
        threads.emplace_back([&, who, deadline, stop] {
            local_gates::place place{gates, "name"};
            ++queued;
            if (place.wait_turn(deadline, stop)) {
                std::lock_guard guard{order_mutex};
                order.push_back(who);
            } else {
                ++gave_up;
            }
        });
        while (queued.load() < who - 1) {
            std::this_thread::yield();
        }
    };
    // No deadline for those who get their turn: only being told can end their wait.
    join(2, steady::time_point::max(), {});
    join(3, steady::now() + 50ms, {});  // gives up before its turn
    join(4, steady::time_point::max(), stop_fourth.get_token());
    join(5, steady::time_point::max(), {});
    stop_fourth.request_stop();
    while (gave_up.load() < 2) {
        std::this_thread::sleep_for(1ms);
    }
    {
        std::lock_guard guard{order_mutex};
        EXPECT_TRUE(order.empty()) << "a turn came while the first still held it";
    }
    first.reset();
    for (auto& t : threads) {
        t.join();
    }
    EXPECT_EQ(order, (std::vector<int>{2, 5}));
    EXPECT_TRUE(gates.look("name").idle);
}

// A pipelining connection that answers every batch with the replies it was given.
struct scripted_pipeline {
    std::vector<redislock::reply> answers;
    std::vector<std::string> sent;

    redislock::reply execute(redislock::command argv) {
        return execute(argv, redislock::call_context{});
    }
    redislock::reply execute(redislock::command argv, const redislock::call_context&) {
        sent.emplace_back(argv[0]);
        return redislock::reply::integer(1);
    }
    std::vector<redislock::reply> execute_pipeline(std::span<const redislock::command> commands) {
        for (const auto& argv : commands) {
            sent.emplace_back(argv[0]);
        }
        return answers;
    }
    std::vector<redislock::reply> execute_pipeline(std::span<const redislock::command> commands,
                                                   std::span<const redislock::call_context>) {
        return execute_pipeline(commands);
    }
    const redislock::endpoint& config() const {
        static const redislock::endpoint e = redislock::endpoint::from_uri("redis://127.0.0.1:1");
        return e;
    }
};

// run_script_after_ping: the script's reply is returned as the server gave it, errors included;
// an error reply a connection stood in for an answer that never came is told as no answer.
TEST(RunScriptAfterPing, ReturnsTheScriptsReplyAndTellsAStandInErrorAsNoAnswer) {
    using redislock::reply;
    const auto run = [](std::vector<reply> answers) {
        scripted_pipeline conn{std::move(answers), {}};
        const reply r = redislock::detail::run_script_after_ping(
            conn, redislock::detail::scripts::mutex_release, std::array<std::string_view, 1>{"k"},
            std::array<std::string_view, 1>{"token"});
        EXPECT_EQ(conn.sent, (std::vector<std::string>{"PING", "EVALSHA"}));
        return r;
    };
    EXPECT_EQ(run({reply::status("PONG"), reply::integer(2)}).as_integer(), 2);
    EXPECT_EQ(run({reply::error("ERR no PING here"), reply::integer(1)}).as_integer(), 1);
    EXPECT_EQ(run({reply::status("PONG"), reply::error("WRONGTYPE not a lock")}).text(),
              "WRONGTYPE not a lock");
    EXPECT_THROW(
        (void)run({reply::status("PONG"), reply::error("ERR redislock: node 127.0.0.1:7000: no")}),
        redislock::connection_error);
    EXPECT_THROW((void)run({reply::status("PONG")}), redislock::connection_error);
}

// A write acknowledged by replicas whose own answer never came, though its WAIT's did, is told
// as no answer, not as the stand-in error reply: the write may have landed.
TEST(RunScriptAfterPing, AcknowledgedWriteWithoutAnAnswerIsNoAnswer) {
    using redislock::reply;
    scripted_pipeline conn{
        {reply::error("ERR redislock: node 127.0.0.1:7000: no"), reply::integer(1)}, {}};
    const std::array<std::string_view, 2> set{"SET", "k"};
    EXPECT_THROW((void)redislock::detail::execute_acknowledged(conn, set, {}, 1, 100ms),
                 redislock::connection_error);
    conn.answers = {reply::status("OK"), reply::integer(1)};
    const auto acknowledged = redislock::detail::execute_acknowledged(conn, set, {}, 1, 100ms);
    EXPECT_EQ(acknowledged.value.text(), "OK");
    EXPECT_EQ(acknowledged.replicas, 1);
}

// A hold taken over from a thread that ended while holding is counted on the thread that takes
// it, though that thread may get the ended one's std::thread::id.
TEST(ThreadHolds, HoldTakenOverFromAnEndedThreadIsCountedOnTheNewOne) {
    using redislock::detail::thread_may_hold_any;
    redislock::test::redis_server srv;
    redislock::client client{srv.uri()};
    auto held = client.recursive_mutex("h", {.lease = 10s});
    std::thread{[&] { held.lock(); }}.join();  // ends holding
    (void)srv.cli({"DEL", "h"});               // and its hold is lost
    std::thread{[&] {
        EXPECT_FALSE(thread_may_hold_any());
        held.lock();
        EXPECT_TRUE(thread_may_hold_any());
        held.unlock();
        EXPECT_FALSE(thread_may_hold_any());
    }}.join();
}

// The reaper's lanes: a cleanup that blocks holds up its own lane only, and each lane's thread
// ends once the lane has been idle a while (none is left behind).
TEST(Reaper, ACleanupThatBlocksHoldsUpOnlyItsOwnLane) {
    using clock = std::chrono::steady_clock;
    redislock::detail::reaper reaper;
    std::atomic<bool> blocking{false};
    std::atomic<bool> unblock{false};
    reaper.add(
        "hung:1",
        [&](clock::time_point deadline) {
            blocking = true;
            while (!unblock && clock::now() < deadline) {
                std::this_thread::sleep_for(1ms);
            }
            return unblock.load();
        },
        clock::now() + 30s);
    ASSERT_TRUE(redislock::test::eventually([&] { return blocking.load(); }, 5s));
    std::atomic<int> healthy_runs{0};
    redislock::test::stopwatch since_added;
    reaper.add(
        "healthy:2",
        [&](clock::time_point) { return ++healthy_runs == 3; },  // done at its third attempt
        clock::now() + 30s);
    EXPECT_TRUE(redislock::test::eventually([&] { return healthy_runs.load() == 3; }, 5s));
    // Its retries come 10 and 20 ms apart; the hung lane's attempt lasts 1 s.
    EXPECT_LT(since_added.elapsed(), 500ms);
    EXPECT_EQ(reaper.pending(), 1u);
    EXPECT_EQ(reaper.running_lanes(), 2u);
    unblock = true;
    EXPECT_TRUE(reaper.wait_idle(5s));
    EXPECT_TRUE(redislock::test::eventually([&] { return reaper.running_lanes() == 0; }, 10s));
    // A lane whose thread ended starts again with its next cleanup.
    std::atomic<bool> ran_again{false};
    reaper.add(
        "healthy:2", [&](clock::time_point) { return ran_again = true; }, clock::now() + 30s);
    EXPECT_TRUE(redislock::test::eventually([&] { return ran_again.load(); }, 5s));
    EXPECT_TRUE(reaper.wait_idle(5s));
}

// One server's trouble never delays another's cleanup. Releases on a hung server were handed to
// the reaper, whose every attempt there blocks for the command timeout (1 s); an orphan left on
// a healthy server must still be cleaned up at once, not after them.
TEST(Reaper, CleanupsStuckOnAHungServerNeverDelayAnotherServersCleanup) {
    using redislock::test::fault;
    using redislock::test::redis_server;
    using redislock::test::stopwatch;
    redis_server hung_server;
    redis_server healthy_server;
    redislock::client hung{redislock::test::with_query(hung_server, "command_timeout=1000")};
    std::vector<redislock::mutex> stuck;
    for (int i = 0; i < 4; ++i) {
        stuck.push_back(hung.mutex("stuck:" + std::to_string(i),
                                   {.lease = 30s, .owner = "stuck-" + std::to_string(i)}));
    }
    for (auto& m : stuck) {
        m.lock();
    }
    hung_server.pause();
    {
        std::vector<std::jthread> unlocking;
        for (auto& m : stuck) {
            unlocking.emplace_back([&m] {
                std::error_code ec;
                m.unlock(ec);
                EXPECT_EQ(ec, redislock::errc::connection_failed) << ec.message();
            });
        }
    }
    ASSERT_GE(redislock::detail::background_reaper().pending(), stuck.size());

    redislock::basic_client<redislock::test::fault_connection> healthy{healthy_server.uri()};
    auto orphan = healthy.mutex("orphan", {.lease = 30s});
    orphan.lock();
    healthy.connection().inject(fault::throw_before_send, "EVALSHA", 1,
                                redislock::detail::scripts::mutex_release);
    std::error_code ec;
    orphan.unlock(ec);
    EXPECT_EQ(ec, redislock::errc::connection_failed);
    redislock::hiredis_connection probe{healthy_server.uri()};
    stopwatch since_orphaned;
    // The lease is 30 s: only the reaper's release can free the key this soon.
    EXPECT_TRUE(redislock::test::eventually(
        [&] {
            return probe.execute(std::array<std::string_view, 2>{"EXISTS", "orphan"})
                       .as_integer() == 0;
        },
        10s));
    EXPECT_LT(since_orphaned.elapsed(), 500ms)
        << "the orphan on the healthy server waited behind the hung server's cleanups";

    hung_server.resume();
    EXPECT_TRUE(redislock::test::eventually(
        [&] {
            for (int i = 0; i < 4; ++i) {
                if (hung_server.cli({"EXISTS", "stuck:" + std::to_string(i)}) != "0") {
                    return false;
                }
            }
            return true;
        },
        10s));
}
}  // namespace
