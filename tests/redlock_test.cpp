// Tests of redlock.hpp and redlock_mutex.hpp against five real, independent redis-server
// masters, started once for the suite. Faults: a master hung by SIGSTOP, a master killed.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <iostream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/deadline.hpp"
#include "support/exclusion.hpp"
#include "support/fault_proxy.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace redislock::test {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t masters = 5;

class Redlock : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        for (auto& server : servers_) {
            server = std::make_unique<redis_server>(
                redis_server::options{.extra_args = {"--hz", "100"}});
        }
    }

    static void TearDownTestSuite() {
        for (auto& server : servers_) {
            server.reset();
        }
    }

    void SetUp() override {
        for (std::size_t i = 0; i < masters; ++i) {
            bring_back(i);
            raw(i, {"FLUSHALL"});
        }
    }

    void TearDown() override {
        for (std::size_t i = 0; i < masters; ++i) {
            bring_back(i);
        }
    }

    static redis_server& server(std::size_t i) { return *servers_[i]; }

    static std::vector<std::string> uris() {
        std::vector<std::string> out;
        for (const auto& server : servers_) {
            out.push_back(server->uri());
        }
        return out;
    }

    static std::string port_of(std::size_t i) { return std::to_string(servers_[i]->port()); }

    // Hangs master i (SIGSTOP): it accepts connections but answers nothing.
    void hang(std::size_t i) {
        server(i).pause();
        paused_[i] = true;
    }

    void resume(std::size_t i) {
        server(i).resume();
        paused_[i] = false;
    }

    void kill(std::size_t i) { server(i).stop(); }

    // Sends one command to master i on a fresh connection, past the code under test.
    static reply raw(std::size_t i, std::vector<std::string> words) {
        hiredis_connection conn{server(i).uri()};
        std::vector<std::string_view> argv{words.begin(), words.end()};
        return conn.execute(argv);
    }

    static std::optional<std::string> value_on(std::size_t i, const std::string& key) {
        const reply r = raw(i, {"GET", key});
        if (r.is_nil()) {
            return std::nullopt;
        }
        return r.text();
    }

    static std::size_t masters_holding(const std::string& key) {
        std::size_t count = 0;
        for (std::size_t i = 0; i < masters; ++i) {
            count += value_on(i, key).has_value() ? 1 : 0;
        }
        return count;
    }

    static bool gone_everywhere(const std::string& key) { return masters_holding(key) == 0; }

    // "master i: value (PTTL ms)" for each master that holds `key`, for failure messages.
    static std::string where(const std::string& key) {
        std::string out;
        for (std::size_t i = 0; i < masters; ++i) {
            if (const auto value = value_on(i, key)) {
                out += "\n  master " + std::to_string(i) + ": " + *value + " (PTTL " +
                       std::to_string(raw(i, {"PTTL", key}).as_integer()) + " ms)";
            }
        }
        return out.empty() ? "nowhere" : out;
    }

private:
    void bring_back(std::size_t i) {
        if (paused_[i]) {
            resume(i);
        }
        if (server(i).pid() <= 0) {
            server(i).start();
        }
    }

    static inline std::array<std::unique_ptr<redis_server>, masters> servers_{};
    std::array<bool, masters> paused_{};
};

// For tests that time faults: a hung master costs 100 ms.
redlock_options fast() {
    return redlock_options{.node_timeout = 100ms};
}

// For tests that need every master to answer, however loaded the machine is.
redlock_options patient() {
    return redlock_options{.node_timeout = 2s};
}

// When `token` was requested, on `clock`, as read by the thread that requested it (a
// stop_callback runs there): a test thread polling stop_requested() would add its own sleep and
// wake-up to the time measured, a few milliseconds on a loaded machine, where the bounds below
// leave only the drift allowance (lease / 100 + 2 ms).
class request_time {
public:
    request_time(const std::stop_token& token, const stopwatch& clock)
        : callback_{token, [this, &clock] { at_ms_ = clock.elapsed().count(); }} {}

    bool known() const { return at_ms_.load() >= 0; }
    std::chrono::milliseconds get() const { return std::chrono::milliseconds{at_ms_.load()}; }

private:
    std::atomic<long long> at_ms_{-1};  // before callback_: the callback may run at once
    std::stop_callback<std::function<void()>> callback_;
};

TEST_F(Redlock, QuorumAcquisitionSetsOneTokenOnEveryMasterAndUnlockRemovesItEverywhere) {
    redlock_client rl{uris(), patient()};
    EXPECT_EQ(rl.size(), 5u);
    EXPECT_EQ(rl.quorum(), 3u);
    auto m = rl.mutex("orders:42", {.lease = 10s});
    ASSERT_TRUE(m.try_lock());
    EXPECT_TRUE(m.owned());
    EXPECT_GT(m.remaining(), 9s);
    EXPECT_LE(m.remaining(), 10s - 100ms - 2ms);  // drift: 1% of the lease + 2 ms

    ASSERT_TRUE(eventually([&] { return masters_holding("orders:42") == masters; }, 3s));
    const auto token = value_on(0, "orders:42");
    ASSERT_TRUE(token.has_value());
    EXPECT_EQ(token->size(), 32u);
    for (std::size_t i = 0; i < masters; ++i) {
        EXPECT_EQ(value_on(i, "orders:42"), token) << "master " << i;
        const auto pttl = raw(i, {"PTTL", "orders:42"}).as_integer();
        EXPECT_GT(pttl, 9000) << "master " << i;
        EXPECT_LE(pttl, 10000) << "master " << i;
    }
    EXPECT_TRUE(m.verify());

    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(m.owned());
    EXPECT_TRUE(gone_everywhere("orders:42"));  // unlock() waits for every master's answer
    EXPECT_FALSE(m.lost_token().stop_requested());

    m.unlock(ec);
    EXPECT_EQ(ec, errc::not_held);
}

TEST_F(Redlock, SecondLockOnTheSameNameIsExcludedUntilReleased) {
    redlock_client rl{uris(), patient()};
    auto first = rl.mutex("shared-name");
    auto second = rl.mutex("shared-name");
    ASSERT_TRUE(first.try_lock());
    EXPECT_FALSE(second.try_lock());
    stopwatch waited;
    EXPECT_FALSE(second.try_lock_for(150ms));
    EXPECT_GE(waited.elapsed(), 150ms);
    first.unlock();
    EXPECT_TRUE(second.try_lock_for(2s));
    second.unlock();
}

TEST_F(Redlock, ForeignHolderOnThreeMastersMakesTryLockFalseAndTheMinorityIsReleased) {
    for (std::size_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(raw(i, {"SET", "contended", "foreign", "NX", "PX", "10000"}).is_status());
    }
    redlock_client rl{uris(), patient()};
    auto m = rl.mutex("contended", {.lease = 10s});
    EXPECT_FALSE(m.try_lock());
    EXPECT_FALSE(m.owned());
    // Our SET landed on masters 3 and 4; the failed attempt must take it back there.
    EXPECT_TRUE(eventually([&] { return !value_on(3, "contended") && !value_on(4, "contended"); }));
    for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(value_on(i, "contended"), "foreign") << "master " << i;
    }
    EXPECT_FALSE(m.try_lock_for(100ms));  // contention stays a false, never an exception
}

TEST_F(Redlock, EventsTellAcquiredContendedReleasedAndLostForTheLockAsAWhole) {
    struct seen {
        event_type type;
        lock_kind kind;
        std::string name;
        std::uint32_t attempts;
        loss_reason reason;
    };
    auto events = std::make_shared<std::vector<seen>>();
    auto guard = std::make_shared<std::mutex>();
    redlock_options options = patient();
    options.on_event = [events, guard](const lock_event& e) {
        std::lock_guard lock{*guard};
        events->push_back({e.type, e.kind, std::string{e.name}, e.attempts, e.reason});
    };
    redlock_client rl{uris(), options};
    auto first = rl.mutex("observed", {.lease = 10s});
    auto second = rl.mutex("observed", {.lease = 10s});
    const auto count = [&](event_type type) {
        std::lock_guard lock{*guard};
        return std::count_if(events->begin(), events->end(), [&](const seen& e) {
            return e.type == type && e.kind == lock_kind::redlock_mutex && e.name == "observed";
        });
    };

    ASSERT_TRUE(first.try_lock());
    EXPECT_EQ(count(event_type::acquired), 1);
    EXPECT_FALSE(second.try_lock());
    EXPECT_EQ(count(event_type::contended), 1);
    first.unlock();
    EXPECT_EQ(count(event_type::released), 1);

    // Taken behind its back on a majority: unlock() finds it lost and says so once, as taken.
    ASSERT_TRUE(second.try_lock());
    for (std::size_t i = 0; i < 3; ++i) {
        raw(i, {"SET", "observed", "someone-else"});
    }
    std::error_code ec;
    second.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(count(event_type::acquired), 2);
    EXPECT_EQ(count(event_type::released), 1);
    ASSERT_EQ(count(event_type::lost), 1);
    std::lock_guard lock{*guard};
    const auto lost = std::find_if(events->begin(), events->end(),
                                   [](const seen& e) { return e.type == event_type::lost; });
    EXPECT_EQ(lost->reason, loss_reason::taken);
    EXPECT_EQ(to_string(lost->kind), "redlock_mutex");
}

// A master's connection closed by the server (CLIENT KILL) is replaced by the next round and
// reported as reconnected, naming that master, once the round is over: with another master hung,
// the round lasts the whole node timeout, so a report made inside it would come sooner.
TEST_F(Redlock, ReconnectedNamesTheMasterWhoseConnectionWasReplacedOnceTheRoundIsOver) {
    using clock = std::chrono::steady_clock;
    struct seen {
        event_type type;
        std::string name;
        clock::time_point at;
    };
    auto events = std::make_shared<std::vector<seen>>();
    auto guard = std::make_shared<std::mutex>();
    redlock_options options{.node_timeout = 500ms};
    options.on_event = [events, guard](const lock_event& e) {
        std::lock_guard lock{*guard};
        events->push_back({e.type, std::string{e.name}, clock::now()});
    };
    redlock_client rl{uris(), options};
    auto m = rl.mutex("reconnecting", {.lease = 10s});
    const auto reconnections = [&] {
        std::lock_guard lock{*guard};
        std::vector<seen> out;
        std::copy_if(events->begin(), events->end(), std::back_inserter(out),
                     [](const seen& e) { return e.type == event_type::reconnected; });
        return out;
    };
    ASSERT_TRUE(m.try_lock());
    m.unlock();
    EXPECT_TRUE(reconnections().empty()) << "a first connection is not a reconnection";

    EXPECT_GT(server(2).client_kill_all(), 0);
    std::this_thread::sleep_for(20ms);  // past the pool's idle check
    hang(4);
    const auto started = clock::now();
    ASSERT_TRUE(m.try_lock());
    const auto returned = clock::now();
    const std::vector<seen> reported = reconnections();
    ASSERT_EQ(reported.size(), 1U);
    EXPECT_EQ(reported.front().name, server(2).host() + ":" + port_of(2));
    EXPECT_GE(reported.front().at, started + options.node_timeout)
        << "reported while the round still waited for the hung master";
    EXPECT_LE(reported.front().at, returned) << "not reported by the call that reconnected";
    resume(4);
    m.unlock();
}

TEST_F(Redlock, AnUnrenewedLeaseIsReportedLostAsExpired) {
    std::atomic<int> expired{0};
    redlock_options options = fast();
    options.on_event = [&expired](const lock_event& e) {
        if (e.type == event_type::lost && e.reason == loss_reason::expired) {
            ++expired;
        }
    };
    redlock_client rl{uris(), options};
    auto m = rl.mutex("short", {.lease = 300ms});
    ASSERT_TRUE(m.try_lock());
    EXPECT_TRUE(eventually([&] { return expired.load() == 1; }, 3s));
    EXPECT_FALSE(m.owned());
}

TEST_F(Redlock, AcquiredComesBeforeLostEvenWithAHookSlowerThanTheLease) {
    auto order = std::make_shared<std::vector<event_type>>();
    auto guard = std::make_shared<std::mutex>();
    std::atomic<int> reasons{0};
    redlock_options options = fast();
    options.on_event = [order, guard](const lock_event& e) {
        if (e.type == event_type::acquired) {
            std::this_thread::sleep_for(300ms);  // longer than the lease
        }
        if (e.type == event_type::acquired || e.type == event_type::lost) {
            std::lock_guard lock{*guard};
            order->push_back(e.type);
        }
    };
    redlock_client rl{uris(), options};
    auto m = rl.mutex("slow-hook", {.lease = 200ms, .on_lost_reason = [&](loss_reason why) {
                                        if (why == loss_reason::expired) {
                                            ++reasons;
                                        }
                                    }});
    ASSERT_TRUE(m.try_lock());
    ASSERT_TRUE(eventually([&] { return reasons.load() == 1; }, 3s));
    std::lock_guard lock{*guard};
    ASSERT_EQ(order->size(), 2U);
    EXPECT_EQ(order->at(0), event_type::acquired);
    EXPECT_EQ(order->at(1), event_type::lost);
}

TEST_F(Redlock, UnlockWithoutAQuorumOfAnswersIsReportedAsReleasedInTheBackground) {
    auto details = std::make_shared<std::vector<std::string>>();
    auto guard = std::make_shared<std::mutex>();
    redlock_options options = fast();
    options.on_event = [details, guard](const lock_event& e) {
        if (e.type == event_type::released || e.type == event_type::lost) {
            std::lock_guard lock{*guard};
            details->push_back(std::string{to_string(e.type)} + ": " + std::string{e.detail});
        }
    };
    redlock_client rl{uris(), options};
    auto m = rl.mutex("unanswered", {.lease = 10s});
    ASSERT_TRUE(m.try_lock());
    hang(0);
    hang(1);
    hang(2);
    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::connection_failed);
    {
        std::lock_guard lock{*guard};
        ASSERT_EQ(details->size(), 1U);
        EXPECT_EQ(details->front(), "released: no answer: left to the reaper");
    }
    resume(0);
    resume(1);
    resume(2);
    EXPECT_TRUE(eventually([&] { return gone_everywhere("unanswered"); }, 5s))
        << where("unanswered");
}

TEST_F(Redlock, TwoMastersDownOneHungOneKilledStillAcquiresWithinTheNodeTimeout) {
    redlock_client rl{uris(), fast()};
    hang(0);
    kill(1);
    auto m = rl.mutex("two-down", {.lease = 10s});
    stopwatch took;
    ASSERT_TRUE(m.try_lock());
    EXPECT_LT(took.elapsed(), fast().node_timeout * 2);
    EXPECT_GT(m.remaining(), 9s);
    for (std::size_t i = 2; i < masters; ++i) {
        EXPECT_TRUE(value_on(i, "two-down").has_value()) << "master " << i;
    }
    EXPECT_TRUE(m.verify());
    EXPECT_TRUE(m.extend(10s));

    stopwatch unlocking;
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_LT(unlocking.elapsed(), fast().node_timeout * 2);
    EXPECT_TRUE(eventually([&] {
        return !value_on(2, "two-down") && !value_on(3, "two-down") && !value_on(4, "two-down");
    }));
}

TEST_F(Redlock, SetLandingLateOnAHungMasterIsReleasedInTheBackground) {
    redlock_client rl{uris(), fast()};
    hang(0);
    auto m = rl.mutex("ghost", {.lease = 10s});
    ASSERT_TRUE(m.try_lock());
    m.unlock();
    // The hung master holds our SET and the releases sent so far in its socket buffers; they run
    // in any order when it wakes up. The releases that timed out are sent again in the
    // background with doubling delays (200, 400, 800 ms... after each failure), so one sent
    // after the wake-up takes the key back.
    std::this_thread::sleep_for(300ms);
    resume(0);
    EXPECT_TRUE(eventually([&] { return gone_everywhere("ghost"); }, 5s))
        << "master 0 still holds " << value_on(0, "ghost").value_or("(nothing)");
}

TEST_F(Redlock, LateRepliesOfAHungMasterAreNeverTakenForLaterOnes) {
    redlock_client rl{uris(), fast()};
    auto m = rl.mutex("late", {.lease = 10s});
    hang(0);
    for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(m.try_lock());
        m.unlock();
    }
    resume(0);
    // The calls given up on master 0 are answered now; a connection that kept them would hand
    // those replies to the rounds below, which then see the wrong answer from master 0. The
    // late SETs land there first; the background releases take them back.
    ASSERT_TRUE(eventually([&] { return !value_on(0, "late").has_value(); }, 5s)) << where("late");
    for (int i = 0; i < 10; ++i) {
        ASSERT_TRUE(m.try_lock()) << i;
        ASSERT_TRUE(eventually([&] { return masters_holding("late") == masters; }, 2s))
            << where("late");
        const auto token = value_on(1, "late");
        for (std::size_t n = 0; n < masters; ++n) {
            EXPECT_EQ(value_on(n, "late"), token) << "master " << n;
        }
        EXPECT_TRUE(m.extend(10s));
        EXPECT_TRUE(m.verify());
        std::error_code ec;
        m.unlock(ec);
        EXPECT_FALSE(ec) << ec.message();
        EXPECT_TRUE(gone_everywhere("late")) << where("late");
    }
}

TEST_F(Redlock, WatchdogRenewsOnTheQuorumWhileTwoMastersHang) {
    redlock_client rl{uris(), fast()};
    lost_counter lost;
    auto m =
        rl.mutex("renewed-minority", {.lease = 600ms, .watchdog = true, .on_lost = lost.handler()});
    ASSERT_TRUE(m.try_lock());
    hang(0);
    hang(1);
    // Each renewal round waits the node timeout for the hung masters, all at once: the three
    // others confirm every time, long past the lease.
    std::this_thread::sleep_for(1500ms);
    EXPECT_TRUE(m.owned());
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_FALSE(m.lost_token().stop_requested());
    for (std::size_t i = 2; i < masters; ++i) {
        EXPECT_GT(raw(i, {"PTTL", "renewed-minority"}).as_integer(), 0) << "master " << i;
    }
    m.unlock();
}

// A master dropped off the network: a connect to it neither succeeds nor is refused (its SYNs
// are dropped) until the client gives up. Opening a connection to it must never delay the other
// masters' attempts: the four others are a quorum, every time. It comes first in the list, so a
// connect made in line would be made before any other master is asked.
TEST_F(Redlock, AMasterWhoseConnectsHangNeverDelaysTheOthers) {
    unresponsive_listener dropped;
    std::vector<std::string> list = uris();
    list[0] = dropped.uri();
    // Every round waits the node timeout for the lost master; generous, for a loaded machine.
    redlock_client rl{list, {.node_timeout = 500ms}};
    auto m = rl.mutex("unreachable-master", {.lease = 10s});
    int acquired = 0;
    std::string refused;
    for (int i = 0; i < 5; ++i) {
        try {
            if (m.try_lock()) {
                ++acquired;
                EXPECT_GT(m.remaining(), 9s);
                for (std::size_t n = 1; n < masters; ++n) {
                    EXPECT_TRUE(value_on(n, "unreachable-master").has_value()) << "master " << n;
                }
                std::error_code ec;
                m.unlock(ec);
                EXPECT_FALSE(ec) << ec.message();
            }
        } catch (const quorum_error& e) {
            refused = e.what();
        }
    }
    EXPECT_EQ(acquired, 5) << "last refusal: " << refused;
    EXPECT_TRUE(eventually([&] { return gone_everywhere("unreachable-master"); }))
        << where("unreachable-master");
}

// A holder that locked before a master dropped off the network keeps its lock: its established
// connection goes silent, the connects that replace it hang, and renewals still go through the
// four others every time. Other locks are still taken meanwhile.
TEST_F(Redlock, AHolderKeepsItsLockWhileAMasterIsOffTheNetwork) {
    fault_proxy path{server(0).host(), server(0).port()};
    std::vector<std::string> list = uris();
    list[0] = path.uri();
    redlock_client rl{list, {.node_timeout = 500ms}};
    lost_counter lost;
    auto held = rl.mutex("holder-before-the-drop",
                         {.lease = 3s, .watchdog = true, .on_lost = lost.handler()});
    ASSERT_TRUE(held.try_lock());
    path.unreachable(true);
    auto other = rl.mutex("taken-after-the-drop", {.lease = 10s});
    int taken = 0;
    std::string refused;
    stopwatch since_drop;
    while (since_drop.elapsed() < 4500ms) {  // a lease and a half
        try {
            if (other.try_lock()) {
                ++taken;
                other.unlock();
            }
        } catch (const quorum_error& e) {
            refused = e.what();
        }
    }
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_TRUE(held.owned());
    EXPECT_FALSE(held.lost_token().stop_requested());
    EXPECT_TRUE(refused.empty()) << refused;
    EXPECT_GT(taken, 0);
    std::error_code ec;
    held.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    path.heal();
}

// Renewal rounds without a quorum (three masters hung) still extend the key on the two live
// masters; none of them counts, so the holder is told lost at its local deadline. What they left
// there must not outlive that.
TEST_F(Redlock, RenewalsWithoutAQuorumLeaveNothingPastTheHoldersLoss) {
    using clock = std::chrono::steady_clock;
    redlock_client rl{uris(), fast()};
    std::atomic<clock::rep> lost_at{0};
    auto held = rl.mutex("unconfirmed-renewals", {.lease = 3s, .watchdog = true, .on_lost = [&] {
                                                      lost_at =
                                                          clock::now().time_since_epoch().count();
                                                  }});
    ASSERT_TRUE(held.try_lock());
    for (std::size_t i = 0; i < 3; ++i) {
        hang(i);
    }
    ASSERT_TRUE(eventually([&] { return lost_at.load() != 0; }, 10s));
    const clock::time_point told{clock::duration{lost_at.load()}};
    // Polled on fresh connections: a probe reads the live masters only.
    const auto on_live_masters = [&] {
        return value_on(3, "unconfirmed-renewals").has_value() ||
               value_on(4, "unconfirmed-renewals").has_value();
    };
    ASSERT_TRUE(eventually([&] { return !on_live_masters(); }, 10s))
        << where("unconfirmed-renewals");
    const auto outlived = clock::now() - told;
    EXPECT_LT(outlived, 1s)
        << "the key outlived the holder's loss on the live masters by "
        << std::chrono::duration_cast<std::chrono::milliseconds>(outlived).count() << " ms";
}

TEST_F(Redlock, TimedLockReturnsByItsDeadlineWhileAMasterIsHung) {
    // Two masters held by another, one hung, two free: no round settles before the hung master's
    // timeout, so every attempt lasts a full node timeout unless cut short.
    for (std::size_t i = 1; i < 3; ++i) {
        ASSERT_TRUE(raw(i, {"SET", "timed", "foreign", "NX", "PX", "10000"}).is_status());
    }
    redlock_client rl{uris(), fast()};
    hang(0);
    auto m = rl.mutex("timed", {.lease = 10s});
    stopwatch took;
    EXPECT_FALSE(m.try_lock_for(250ms));
    // A last attempt started just before the deadline would otherwise run its full 100 ms.
    EXPECT_GE(took.elapsed(), 250ms);
    EXPECT_LT(took.elapsed(), 320ms);
}

TEST_F(Redlock, StopRequestEndsAWaitAtOnceEvenWhileAMasterIsHung) {
    const redlock_options slow{.node_timeout = 1s};
    for (std::size_t i = 1; i < 3; ++i) {
        ASSERT_TRUE(raw(i, {"SET", "stopped", "foreign", "NX", "PX", "10000"}).is_status());
    }
    redlock_client rl{uris(), slow};
    hang(0);  // every round waits for master 0 until the node timeout
    auto m = rl.mutex("stopped", {.lease = 10s});
    std::stop_source source;
    std::thread stopper{[&] {
        std::this_thread::sleep_for(100ms);
        source.request_stop();
    }};
    stopwatch took;
    EXPECT_FALSE(m.lock(source.get_token()));
    stopper.join();
    EXPECT_LT(took.elapsed(), 400ms);  // not the hung master's 1 s
    EXPECT_FALSE(m.owned());
    // Our SET landed on the free masters 3 and 4; the abandoned attempt takes it back.
    EXPECT_TRUE(eventually([&] { return !value_on(3, "stopped") && !value_on(4, "stopped"); }));
}

TEST_F(Redlock, ThreeMastersDownThrowsAQuorumErrorNamingThemWithinTheNodeTimeout) {
    const redlock_options options{.node_timeout = 150ms};
    redlock_client rl{uris(), options};
    hang(0);
    hang(1);
    kill(2);
    auto m = rl.mutex("outage", {.lease = 10s});
    stopwatch took;
    try {
        (void)m.try_lock();
        FAIL() << "try_lock returned instead of throwing";
    } catch (const quorum_error& e) {
        // In parallel: about one node timeout, not one per master.
        EXPECT_LT(took.elapsed(), options.node_timeout * 2);
        const std::string what = e.what();
        for (std::size_t i = 0; i < 3; ++i) {
            EXPECT_NE(what.find(":" + port_of(i)), std::string::npos) << what;
        }
        EXPECT_NE(what.find("outage"), std::string::npos) << what;
        std::set<std::string> failed;
        for (const auto& failure : e.failures()) {
            failed.insert(failure.node);
            EXPECT_FALSE(failure.what.empty());
        }
        for (std::size_t i = 0; i < 3; ++i) {
            EXPECT_EQ(failed.count("127.0.0.1:" + port_of(i)), 1u) << what;
        }
    }
    EXPECT_FALSE(m.owned());
    // The two live masters got the SET; the failed attempt takes it back.
    EXPECT_TRUE(eventually([&] { return !value_on(3, "outage") && !value_on(4, "outage"); }));

    // A timed wait reports the outage too, instead of spinning until its deadline.
    stopwatch timed;
    EXPECT_THROW((void)m.try_lock_for(5s), quorum_error);
    EXPECT_LT(timed.elapsed(), 1s);
}

TEST_F(Redlock, ProcessesAndThreadsNeverOverlap) {
    exclusion_options options;
    options.uri = server(0).uri();
    options.counter_key = "exclusion:counter";
    options.processes = 2;
    options.threads = 3;
    options.iterations = 25;
    const std::vector<std::string> all = uris();
    const auto report = run_exclusion(options, [&all](int) {
        auto rl = std::make_shared<redlock_client>(all, patient());
        return [rl](int) {
            auto m = std::make_shared<redlock_mutex>(rl->mutex("exclusion", {.lease = 10s}));
            return [m](std::mt19937_64&, const std::function<void()>& critical) {
                std::unique_lock guard{*m};
                critical();
            };
        };
    });
    EXPECT_TRUE(report.errors.empty()) << report.describe();
    EXPECT_EQ(report.completed, report.planned) << report.describe();
    EXPECT_EQ(report.counter, report.planned) << report.describe();
    EXPECT_FALSE(report.overlap().has_value()) << report.describe();
}

TEST_F(Redlock, WatchdogKeepsTheLockPastSeveralLeasesAndReportsLossWhenAQuorumOfKeysIsDeleted) {
    redlock_client rl{uris(), fast()};
    lost_counter lost;
    auto m = rl.mutex("renewed", {.lease = 400ms, .watchdog = true, .on_lost = lost.handler()});
    ASSERT_TRUE(m.try_lock());
    const std::stop_token token = m.lost_token();
    std::this_thread::sleep_for(1500ms);  // almost four leases
    EXPECT_TRUE(m.owned());
    EXPECT_TRUE(m.verify());
    EXPECT_GE(masters_holding("renewed"), rl.quorum());
    EXPECT_EQ(lost.calls.load(), 0);
    EXPECT_FALSE(token.stop_requested());

    for (std::size_t i = 0; i < 3; ++i) {
        raw(i, {"DEL", "renewed"});
    }
    EXPECT_TRUE(eventually([&] { return lost.calls.load() == 1; }, 2s));
    EXPECT_TRUE(token.stop_requested());
    EXPECT_FALSE(m.owned());
    EXPECT_EQ(m.remaining(), 0ms);

    std::error_code ec;
    m.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost);
    EXPECT_EQ(lost.calls.load(), 1);  // once per acquisition
    EXPECT_TRUE(eventually([&] { return gone_everywhere("renewed"); }));
}

TEST_F(Redlock, LostTokenIsRequestedAtTheLocalDeadlineWhileRenewalsHangOnAQuorum) {
    redlock_client rl{uris(), fast()};
    lost_counter lost;
    constexpr auto lease = 600ms;
    auto m = rl.mutex("stalled", {.lease = lease, .watchdog = true, .on_lost = lost.handler()});
    ASSERT_TRUE(m.try_lock());
    stopwatch since_acquired;
    const std::stop_token token = m.lost_token();
    const request_time requested{token, since_acquired};
    hang(0);
    hang(1);
    hang(2);
    ASSERT_TRUE(eventually([&] { return requested.known(); }, 3s));
    const auto when = requested.get();
    EXPECT_LE(when, lease);  // never later than the lease, whatever the renewal rounds are doing
    EXPECT_GE(when, lease / 2);
    // on_lost is called after the loss is marked (lost_token() requested), not before.
    EXPECT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 2s));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(m.owned());
    EXPECT_EQ(m.remaining(), 0ms);
}

TEST_F(Redlock, LockWithoutWatchdogIsReportedLostWhenItsValidityRunsOut) {
    redlock_client rl{uris(), fast()};
    lost_counter lost;
    auto m = rl.mutex("short", {.lease = 300ms, .on_lost = lost.handler()});
    const auto& machine = redislock::test::scheduling_probe::machine();
    ASSERT_TRUE(m.try_lock());
    const std::stop_token token = m.lost_token();
    const auto acquired = std::chrono::steady_clock::now();
    stopwatch since_acquired;
    const request_time requested{token, since_acquired};
    ASSERT_TRUE(eventually([&] { return requested.known(); }, 2s));
    EXPECT_TRUE(token.stop_requested());
    // By the lease, unless the machine kept threads from running meanwhile.
    EXPECT_LE(requested.get(), 300ms + machine.stall_between(acquired, acquired + requested.get()));
    EXPECT_GE(requested.get(), 200ms);
    // on_lost is called after the loss is marked (lost_token() requested), not before.
    EXPECT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 2s));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(m.owned());
}

TEST_F(Redlock, OnLostIsCalledOncePerAcquisition) {
    redlock_client rl{uris(), fast()};
    lost_counter lost;
    auto m = rl.mutex("twice", {.lease = 250ms, .on_lost = lost.handler()});
    for (int round = 1; round <= 2; ++round) {
        ASSERT_TRUE(m.try_lock_for(2s));
        const std::stop_token token = m.lost_token();
        ASSERT_TRUE(eventually([&] { return token.stop_requested(); }, 2s));
        // The local deadline comes first (drift allowance); then the masters expire the keys.
        ASSERT_TRUE(eventually([&] { return gone_everywhere("twice"); }, 2s));
        EXPECT_FALSE(m.verify());  // found lost again: not reported twice
        std::error_code ec;
        m.unlock(ec);
        EXPECT_EQ(ec, errc::lock_lost);
        EXPECT_EQ(lost.calls.load(), round);
    }
}

TEST_F(Redlock, MaxHoldStopsRenewalsAndTheLossIsReported) {
    redlock_client rl{uris(), fast()};
    lost_counter lost;
    auto m = rl.mutex(
        "capped", {.lease = 300ms, .watchdog = true, .on_lost = lost.handler(), .max_hold = 600ms});
    ASSERT_TRUE(m.try_lock());
    stopwatch held;
    const std::stop_token token = m.lost_token();
    const request_time requested{token, held};
    ASSERT_TRUE(eventually([&] { return requested.known(); }, 3s));
    EXPECT_GE(requested.get(), 600ms);   // renewed up to max_hold
    EXPECT_LE(requested.get(), 1000ms);  // then the lease ran out
    // on_lost is called after the loss is marked (lost_token() requested), not before.
    EXPECT_TRUE(eventually([&] { return lost.calls.load() > 0; }, 2s));
    EXPECT_EQ(lost.calls.load(), 1);
}

TEST_F(Redlock, ExtendAndVerifyNeedAQuorum) {
    redlock_client rl{uris(), fast()};
    lost_counter lost;
    auto m = rl.mutex("extended", {.lease = 2s, .on_lost = lost.handler()});
    EXPECT_FALSE(m.extend(1s));  // not held
    EXPECT_FALSE(m.verify());
    ASSERT_TRUE(m.try_lock());
    ASSERT_TRUE(m.extend(20s));
    EXPECT_GT(m.remaining(), 19s);
    for (std::size_t i = 0; i < masters; ++i) {
        EXPECT_GT(raw(i, {"PTTL", "extended"}).as_integer(), 19000) << "master " << i;
    }

    hang(0);
    hang(1);
    hang(2);
    EXPECT_THROW((void)m.extend(20s), quorum_error);
    EXPECT_THROW((void)m.verify(), quorum_error);
    resume(0);
    resume(1);
    resume(2);
    EXPECT_TRUE(m.verify());
    EXPECT_EQ(lost.calls.load(), 0);

    for (std::size_t i = 2; i < masters; ++i) {
        raw(i, {"DEL", "extended"});
    }
    EXPECT_FALSE(m.verify());
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(m.extend(1s));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_TRUE(m.lost_token().stop_requested());
}

// A shorter lease lands on the masters that answer even when too few do to make a quorum: the
// holder counts on it from when it was sent, never on the longer lease it had before.
TEST_F(Redlock, AShorteningExtendWithoutAQuorumStillCutsTheLocalDeadline) {
    redlock_client rl{uris(), fast()};
    auto m = rl.mutex("shortened", {.lease = 30s});
    ASSERT_TRUE(m.try_lock());
    hang(0);
    hang(1);
    hang(2);
    EXPECT_THROW((void)m.extend(2s), quorum_error);
    EXPECT_LE(raw(3, {"PTTL", "shortened"}).as_integer(), 2000);
    EXPECT_LE(raw(4, {"PTTL", "shortened"}).as_integer(), 2000);
    EXPECT_LE(m.remaining(), 2s);
    resume(0);
    resume(1);
    resume(2);
    m.unlock();
}

TEST_F(Redlock, FencingIsRejectedBecauseNoCounterOrdersIndependentMasters) {
    redlock_client rl{uris(), fast()};
    try {
        (void)rl.mutex("fenced", {.fencing = true});
        FAIL() << "fencing was accepted";
    } catch (const invalid_argument& e) {
        EXPECT_NE(std::string{e.what()}.find("independent masters"), std::string::npos) << e.what();
    }
}

TEST_F(Redlock, BadArgumentsAreClearErrors) {
    EXPECT_THROW(redlock_client(std::vector<std::string>{}), invalid_argument);
    EXPECT_THROW(redlock_client({"redis://127.0.0.1:1", "redis://127.0.0.1:1"}), invalid_argument);
    EXPECT_THROW(redlock_client({"not a uri"}), invalid_argument);
    EXPECT_THROW(redlock_client(uris(), redlock_options{.node_timeout = 0ms}), invalid_argument);
    redlock_client rl{uris(), fast()};
    EXPECT_THROW((void)rl.mutex(""), invalid_argument);
    EXPECT_THROW((void)rl.mutex("x", {.lease = 0ms}), invalid_argument);
    EXPECT_THROW((void)rl.mutex("x", {.lease = -5ms}), invalid_argument);
    // No acquisition could be valid: the whole lease may go to one slow master.
    EXPECT_THROW((void)rl.mutex("x", {.lease = fast().node_timeout}), invalid_argument);
    EXPECT_NO_THROW((void)rl.mutex("x", {.lease = 2 * fast().node_timeout}));
}

TEST_F(Redlock, LockByItsHolderIsADeadlockErrorAndUnlockFromAnotherThreadIsRefused) {
    redlock_client rl{uris(), patient()};
    auto m = rl.mutex("owned-by-thread");
    ASSERT_TRUE(m.try_lock());
    EXPECT_THROW(m.lock(), std::system_error);
    std::error_code from_other;
    std::thread{[&] { m.unlock(from_other); }}.join();
    EXPECT_EQ(from_other, errc::not_holder);
    EXPECT_TRUE(m.owned());
    m.unlock();
}

// A guard released on another thread: refused as above, and told (on f377ae8 it was not).
TEST_F(Redlock, UnlockFromAnotherThreadIsReportedWithBothThreads) {
    struct refusal {
        lock_kind kind;
        std::string name;
        std::thread::id holder;
        std::thread::id caller;
    };
    auto refused = std::make_shared<std::vector<refusal>>();
    auto guard = std::make_shared<std::mutex>();
    redlock_options options = patient();
    options.on_event = [refused, guard](const lock_event& e) {
        if (e.type == event_type::unlock_refused) {
            std::lock_guard lock{*guard};
            refused->push_back({e.kind, std::string{e.name}, e.holder_thread, e.caller_thread});
        }
    };
    redlock_client rl{uris(), options};
    auto m = rl.mutex("guarded-on-one-thread", {.lease = 10s});
    std::thread::id releaser;
    {
        std::unique_lock held{m};
        std::thread{[&] {
            releaser = std::this_thread::get_id();
            held.unlock();
        }}.join();
    }
    EXPECT_TRUE(m.owned());
    {
        std::lock_guard lock{*guard};
        ASSERT_EQ(refused->size(), 1U);
        EXPECT_EQ(refused->front().kind, lock_kind::redlock_mutex);
        EXPECT_EQ(refused->front().name, "guarded-on-one-thread");
        EXPECT_EQ(refused->front().holder, std::this_thread::get_id());
        EXPECT_EQ(refused->front().caller, releaser);
    }
    m.unlock();
    EXPECT_FALSE(m.owned());
}

TEST_F(Redlock, ForkedChildMakesItsOwnConnectionsAndLeavesTheParentsLocksAlone) {
    redlock_client rl{uris(), patient()};
    auto held = rl.mutex("parent-held", {.lease = 10s});
    ASSERT_TRUE(held.try_lock());  // the connections and the loss timer now exist in this process
    child_process child{[&](line_channel&) {
        std::error_code ec;
        held.unlock(ec);
        if (ec != errc::not_holder) {
            return 2;
        }
        auto mine = rl.mutex("child-own", {.lease = 10s});
        if (!mine.try_lock()) {
            return 3;
        }
        mine.unlock(ec);
        return ec ? 4 : 0;
    }};
    EXPECT_EQ(child.wait(10s), 0);
    EXPECT_GE(masters_holding("parent-held"), rl.quorum());  // untouched by the child
    EXPECT_TRUE(held.verify());
    held.unlock();
    // The child exited right after unlock(): its key is gone from every master at once, not
    // left on a minority until its lease runs out.
    EXPECT_TRUE(gone_everywhere("child-own"));
}

// ---- interop with node-redlock (npm `redlock` v5 + ioredis) on the same masters ----

struct node_peer {
    bool available = false;
    std::string why_not;
};

node_peer install_node_redlock() {
    node_peer peer;
    try {
        const auto result = detail::run_capture(
            {detail::find_executable("sh"), REDISLOCK_TEST_SUPPORT_DIR "/install_node_redlock.sh",
             REDISLOCK_TEST_NODE_DIR},
            300s);
        if (WIFEXITED(result.status) && WEXITSTATUS(result.status) == 0) {
            peer.available = true;
        } else {
            peer.why_not = "the install failed: " + result.out + result.err;
        }
    } catch (const std::exception& e) {
        peer.why_not = e.what();
    }
    return peer;
}

// Runs the node peer (support/node_redlock_peer.js) to its end; returns its output.
std::string run_node_peer(std::string_view mode, const std::string& resource,
                          std::chrono::milliseconds hold, const std::vector<std::string>& ports) {
    std::vector<std::string> args{detail::find_executable("node"),
                                  REDISLOCK_TEST_SUPPORT_DIR "/node_redlock_peer.js",
                                  REDISLOCK_TEST_NODE_DIR,
                                  std::string{mode},
                                  resource,
                                  std::to_string(hold.count())};
    args.insert(args.end(), ports.begin(), ports.end());
    const auto result = detail::run_capture(args, 60s);
    return result.out + result.err;
}

TEST_F(Redlock, ExcludesAndIsExcludedByNodeRedlockOnTheSameMasters) {
    const node_peer peer = install_node_redlock();
    redlock_client rl{uris(), patient()};
    auto m = rl.mutex("interop", {.lease = 10s});
    if (!peer.available) {
        // Not skipped: the same exclusion is checked against a raw SET NX PX holder, which is
        // what node-redlock and redsync write.
        std::cout << "[   NOTE   ] node-redlock could not be installed (" << peer.why_not
                  << "); checking interop against a raw SET NX PX holder instead" << std::endl;
        for (std::size_t i = 0; i < masters; ++i) {
            ASSERT_TRUE(raw(i, {"SET", "interop", "raw-holder", "NX", "PX", "10000"}).is_status());
        }
        EXPECT_FALSE(m.try_lock());
        for (std::size_t i = 0; i < masters; ++i) {
            raw(i, {"DEL", "interop"});
        }
        ASSERT_TRUE(m.try_lock());
        for (std::size_t i = 0; i < masters; ++i) {
            EXPECT_TRUE(raw(i, {"SET", "interop", "raw-holder", "NX", "PX", "10000"}).is_nil());
        }
        m.unlock();
        return;
    }
    std::cout << "[   NOTE   ] interop checked against node-redlock 5 (" REDISLOCK_TEST_NODE_DIR ")"
              << std::endl;
    std::vector<std::string> ports;
    for (std::size_t i = 0; i < masters; ++i) {
        ports.push_back(port_of(i));
    }

    // We hold: node-redlock is refused; once we release, it gets in.
    ASSERT_TRUE(m.try_lock());
    EXPECT_EQ(run_node_peer("try", "interop", 0ms, ports), "busy\n");
    m.unlock();
    const std::string after = run_node_peer("try", "interop", 0ms, ports);
    EXPECT_NE(after.find("acquired"), std::string::npos) << after;
    EXPECT_NE(after.find("released"), std::string::npos) << after;

    // node-redlock holds: we are refused; once it releases, we get in.
    std::string held_output;
    std::thread holder{[&] { held_output = run_node_peer("hold", "interop", 2000ms, ports); }};
    ASSERT_TRUE(eventually([&] { return masters_holding("interop") >= 3; }, 20s)) << held_output;
    EXPECT_FALSE(m.try_lock());
    holder.join();
    EXPECT_NE(held_output.find("acquired"), std::string::npos) << held_output;
    EXPECT_NE(held_output.find("released"), std::string::npos) << held_output;
    EXPECT_TRUE(gone_everywhere("interop")) << where("interop") << "\n" << held_output;
    EXPECT_TRUE(m.try_lock());
    m.unlock();
}

}  // namespace
}  // namespace redislock::test
