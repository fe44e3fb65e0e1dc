// Every lock kind on a real cluster while it changes under load: slots migrating (ASK, TRYAGAIN,
// MOVED), a graceful CLUSTER FAILOVER, and a master killed with SIGKILL. Mutual exclusion is
// checked outside Redis: holders log their enter and exit times (CLOCK_MONOTONIC, shared by the
// processes of the machine) and no two intervals on one name may overlap; a non-atomic counter per
// name (GET then SET under the lock) must end exact.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/deadline.hpp"
#include "support/exclusion.hpp"
#include "support/redis_cluster.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::reply;
using redislock::test::hold_interval;
using redislock::test::monotonic_ns;

struct section {
    int name = 0;
    hold_interval interval;
};

struct load_result {
    std::vector<section> sections;
    std::vector<std::string> errors;
    std::uint64_t moved = 0;  ///< redirections followed by this process's client
    std::uint64_t asked = 0;
};

std::string counter_key(const std::string& name) {
    return "{" + name + "}:counter";
}

// `threads` threads of this process take random names of `names` under the kind chosen by the
// name's index (simple, reentrant, read-write as writer) until `end_ns`, each critical section
// a GET and a SET of the name's counter through the cluster.
load_result run_load(const std::string& uri, const std::vector<std::string>& names, int threads,
                     std::int64_t end_ns) {
    load_result result;
    std::mutex mutex;
    try {
        redislock::cluster_client cc{uri + "?command_timeout=1000"};
        std::vector<std::thread> workers;
        for (int t = 0; t < threads; ++t) {
            workers.emplace_back([&, t] {
                std::mt19937 rng{std::random_device{}() + static_cast<unsigned>(t)};
                std::vector<section> mine;
                std::vector<std::string> errors;
                const redislock::lock_options options{.lease = 5s, .backoff_max = 16ms};
                const auto critical = [&](int index) {
                    const std::int64_t enter = monotonic_ns();
                    const std::string key = counter_key(names[static_cast<std::size_t>(index)]);
                    const std::array<std::string_view, 2> get{"GET", key};
                    const reply value = cc.connection().execute(get);
                    const long long next = value.is_nil() ? 1 : std::stoll(value.text()) + 1;
                    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1000));
                    const std::string text = std::to_string(next);
                    const std::array<std::string_view, 3> set{"SET", key, text};
                    if (!cc.connection().execute(set).is_status()) {
                        throw std::runtime_error{"SET of a counter failed"};
                    }
                    mine.push_back({index, {enter, monotonic_ns()}});
                };
                while (monotonic_ns() < end_ns) {
                    const int index = static_cast<int>(rng() % names.size());
                    const std::string& name = names[static_cast<std::size_t>(index)];
                    try {
                        switch (index % 3) {
                            case 0: {
                                auto m = cc.mutex(name, options);
                                std::unique_lock guard{m};
                                critical(index);
                                break;
                            }
                            case 1: {
                                auto m = cc.recursive_mutex(name, options);
                                std::unique_lock guard{m};
                                critical(index);
                                break;
                            }
                            default: {
                                auto m = cc.shared_mutex(name, options);
                                std::unique_lock guard{m};
                                critical(index);
                                break;
                            }
                        }
                    } catch (const std::exception& e) {
                        errors.push_back(name + ": " + e.what());
                        if (errors.size() > 20) {
                            break;
                        }
                    }
                }
                std::lock_guard lock{mutex};
                result.sections.insert(result.sections.end(), mine.begin(), mine.end());
                result.errors.insert(result.errors.end(), errors.begin(), errors.end());
            });
        }
        for (auto& w : workers) {
            w.join();
        }
        result.moved = cc.connection().moved_redirections();
        result.asked = cc.connection().ask_redirections();
    } catch (const std::exception& e) {
        result.errors.push_back(std::string{"process: "} + e.what());
    }
    return result;
}

// The load of run_load in this process and in one forked child, while `disturb()` runs on
// another thread of this process; merged.
template <class Disturb>
load_result run_load_with_child(const std::string& uri, const std::vector<std::string>& names,
                                std::chrono::milliseconds duration, Disturb disturb) {
    const std::int64_t end_ns =
        monotonic_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(duration).count();
    redislock::test::child_process child{[&](redislock::test::line_channel& channel) {
        const load_result mine = run_load(uri, names, 3, end_ns);
        for (const section& s : mine.sections) {
            channel.send("s " + std::to_string(s.name) + " " + std::to_string(s.interval.enter_ns) +
                         " " + std::to_string(s.interval.exit_ns));
        }
        for (const std::string& e : mine.errors) {
            channel.send("e " + redislock::test::detail::one_line(e));
        }
        return channel.send("done") ? 0 : 1;
    }};
    std::thread disturber{disturb};
    load_result all = run_load(uri, names, 3, end_ns);
    disturber.join();
    bool done = false;
    while (auto line = child.channel().receive(30s)) {
        std::istringstream words{*line};
        std::string kind;
        words >> kind;
        if (kind == "s") {
            section s;
            words >> s.name >> s.interval.enter_ns >> s.interval.exit_ns;
            all.sections.push_back(s);
        } else if (kind == "e") {
            all.errors.push_back("child: " + line->substr(2));
        } else if (kind == "done") {
            done = true;
            break;
        } else {
            all.errors.push_back("child: " + *line);
        }
    }
    if (!done) {
        all.errors.push_back("child ended without a complete report");
    }
    if (child.wait(10s) != 0) {
        all.errors.push_back("child failed");
    }
    return all;
}

class ClusterUnderChange : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        cluster_ = new redislock::test::redis_cluster{3, 1};
        std::printf("[ cluster  ] 3 masters + 3 replicas ready in %lld ms\n",
                    static_cast<long long>(cluster_->bring_up_time().count()));
    }
    static void TearDownTestSuite() {
        delete cluster_;
        cluster_ = nullptr;
    }

    // Exclusion per name, exact counters, nothing of the locks left in the cluster.
    static void check(const load_result& r, const std::vector<std::string>& names) {
        std::map<int, std::vector<hold_interval>> by_name;
        for (const section& s : r.sections) {
            by_name[s.name].push_back(s.interval);
        }
        redislock::hiredis_cluster_connection conn{cluster_->uri()};
        std::size_t total = 0;
        for (std::size_t i = 0; i < names.size(); ++i) {
            const auto& intervals = by_name[static_cast<int>(i)];
            total += intervals.size();
            const auto overlap = redislock::test::find_overlap(intervals);
            EXPECT_FALSE(overlap) << names[i] << ": [" << overlap->first.enter_ns << ", "
                                  << overlap->first.exit_ns << "] and [" << overlap->second.enter_ns
                                  << ", " << overlap->second.exit_ns << "]";
            const std::string key = counter_key(names[i]);
            const std::array<std::string_view, 2> get{"GET", key};
            const reply value = conn.execute(get);
            const long long counter = value.is_nil() ? 0 : std::stoll(value.text());
            EXPECT_EQ(counter, static_cast<long long>(intervals.size())) << names[i];
            const std::array<std::string_view, 2> exists{"EXISTS", names[i]};
            EXPECT_EQ(conn.execute(exists), reply::integer(0)) << names[i] << " left behind";
            const std::array<std::string_view, 2> del{"DEL", key};
            (void)conn.execute(del);
        }
        EXPECT_GT(total, 200u) << "too little work to prove anything";
        std::string errors;
        for (std::size_t i = 0; i < std::min<std::size_t>(r.errors.size(), 10); ++i) {
            errors += "\n  " + r.errors[i];
        }
        EXPECT_TRUE(r.errors.empty()) << r.errors.size() << " error(s):" << errors;
        std::printf("[ load     ] %zu critical sections on %zu names, %zu errors\n", total,
                    names.size(), r.errors.size());
    }

    static inline redislock::test::redis_cluster* cluster_ = nullptr;
};

std::vector<std::string> load_names(int count, const std::string& prefix) {
    std::vector<std::string> names;
    for (int i = 0; i < count; ++i) {
        names.push_back(prefix + std::to_string(i));
    }
    return names;
}

TEST_F(ClusterUnderChange, ReshardingUnderLoadKeepsExclusionAndCounters) {
    const auto names = load_names(24, "reshard:");
    std::vector<int> slots;
    for (const auto& name : names) {
        slots.push_back(cluster_->key_slot(name));
    }
    const auto masters = cluster_->masters();
    std::atomic<int> migrations{0};
    std::vector<std::string> problems;
    const auto result = run_load_with_child(cluster_->uri(), names, 8s, [&] {
        std::mt19937 rng{7};
        const auto end = std::chrono::steady_clock::now() + 7s;
        try {
            // Where each slot is, kept here: asking the cluster each time would slow the moves.
            std::map<int, int> owner;
            for (int slot : slots) {
                owner[slot] = cluster_->master_for_slot(slot);
            }
            while (std::chrono::steady_clock::now() < end) {
                const int slot = slots[rng() % slots.size()];
                const int from = owner[slot];
                // A target that knows every master's epoch first: another would wait for gossip.
                std::vector<int> targets;
                std::copy_if(masters.begin(), masters.end(), std::back_inserter(targets),
                             [&](int m) { return m != from; });
                std::shuffle(targets.begin(), targets.end(), rng);
                std::stable_partition(targets.begin(), targets.end(),
                                      [&](int m) { return cluster_->knows_current_epochs(m); });
                const int to = targets.front();
                cluster_->begin_migration(slot, from, to);
                std::this_thread::sleep_for(5ms);
                cluster_->move_keys(slot, from, to, 5ms);
                cluster_->finish_migration(slot, from, to);
                owner[slot] = to;
                ++migrations;
            }
        } catch (const std::exception& e) {
            problems.push_back(e.what());
        }
    });
    EXPECT_TRUE(problems.empty()) << problems.front();
    EXPECT_GE(migrations.load(), 5);
    std::printf(
        "[ reshard  ] %d slot migrations under load; this process followed %llu MOVED "
        "and %llu ASK\n",
        migrations.load(), static_cast<unsigned long long>(result.moved),
        static_cast<unsigned long long>(result.asked));
    EXPECT_GT(result.moved, 0u);
    EXPECT_GT(result.asked, 0u);
    check(result, names);
}

TEST_F(ClusterUnderChange, GracefulFailoverUnderLoadKeepsExclusion) {
    const auto names = load_names(24, "failover:");
    std::vector<std::string> problems;
    int failovers = 0;
    const auto result = run_load_with_child(cluster_->uri(), names, 6s, [&] {
        try {
            std::this_thread::sleep_for(500ms);
            for (int master : cluster_->masters()) {
                const auto replicas = cluster_->replicas_of(master);
                if (replicas.empty()) {
                    continue;
                }
                cluster_->failover(replicas.front());
                ++failovers;
                std::this_thread::sleep_for(500ms);
            }
        } catch (const std::exception& e) {
            problems.push_back(e.what());
        }
    });
    EXPECT_TRUE(problems.empty()) << problems.front();
    EXPECT_EQ(failovers, 3);
    check(result, names);
}

TEST_F(ClusterUnderChange, LocksFollowASlotThroughEachStepOfItsMigration) {
    const std::string name = "stepwise:1";
    const std::string neighbour = "{stepwise:1}:neighbour";
    const int slot = cluster_->key_slot(name);
    const int from = cluster_->master_for_slot(slot);
    const auto masters = cluster_->masters();
    const int to = masters.front() == from ? masters.back() : masters.front();
    redislock::cluster_client cc{cluster_->uri()};
    auto& conn = cc.connection();
    redislock::hiredis_connection target{cluster_->uri_of(to)};
    const auto on_target = [&](const std::string& key) {
        const std::array<std::string_view, 1> asking{"ASKING"};
        const std::array<std::string_view, 2> exists{"EXISTS", key};
        const std::array<redislock::command, 2> both{redislock::command{asking},
                                                     redislock::command{exists}};
        return target.execute_pipeline(both)[1] == reply::integer(1);
    };

    // One owner for every thread: the re-entry below runs on a thread of its own.
    auto held = cc.recursive_mutex(name, {.lease = 20s, .fencing = true, .owner = "stepwise"});
    held.lock();
    const auto fence = held.fencing_token();
    cluster_->begin_migration(slot, from, to);

    // A name of the same slot that does not exist yet is created on the target, through ASK (a
    // simple lock's plain SET NX declares its one key).
    auto fresh = cc.mutex(neighbour, {.lease = 20s});
    fresh.lock();
    EXPECT_GT(conn.ask_redirections(), 0u);
    EXPECT_TRUE(on_target(neighbour));

    // The holder's re-entry declares the name's queue keys, which do not exist: with the slot
    // half-migrated it is answered TRYAGAIN, on the source and, once the keys moved, on the
    // target, and waits for the slot to settle.
    auto reentry = std::async(std::launch::async, [&] { held.lock(); });
    EXPECT_EQ(reentry.wait_for(300ms), std::future_status::timeout)
        << "served while its keys were partly missing";
    cluster_->move_keys(slot, from, to);
    EXPECT_TRUE(on_target(name));
    // A renewal or check declares the lock's key alone: it reaches it through ASK at once.
    EXPECT_TRUE(held.verify());
    EXPECT_EQ(reentry.wait_for(300ms), std::future_status::timeout)
        << "served while its keys were partly missing";

    // After SETSLOT NODE the source answers MOVED and the map follows; the re-entry gets in.
    const auto moved_before = conn.moved_redirections();
    cluster_->finish_migration(slot, from, to);
    ASSERT_EQ(reentry.wait_for(20s), std::future_status::ready);
    EXPECT_NO_THROW(reentry.get());
    EXPECT_GT(conn.moved_redirections(), moved_before);
    EXPECT_EQ(conn.node_for_key(name), "127.0.0.1:" + std::to_string(to));
    held.unlock();
    EXPECT_TRUE(held.owned()) << "entered twice";
    held.unlock();
    EXPECT_FALSE(on_target(name));

    held.lock();
    EXPECT_GT(held.fencing_token(), fence) << "the fence counter moved with the slot";
    held.unlock();
    fresh.unlock();
    const std::array<std::string_view, 3> exists{"EXISTS", name, neighbour};
    EXPECT_EQ(conn.execute(exists), reply::integer(0)) << "nothing left behind";
}

TEST_F(ClusterUnderChange, WatchdogKeepsLocksAfterScriptFlushOnEveryMaster) {
    redislock::cluster_client cc{cluster_->uri()};
    redislock::test::lost_counter lost;
    std::vector<redislock::cluster_mutex> locks;
    for (int i = 0; i < 30; ++i) {
        locks.push_back(cc.mutex("flushed:" + std::to_string(i),
                                 {.lease = 900ms, .watchdog = true, .on_lost = lost.handler()}));
        locks.back().lock();
    }
    for (int port : cluster_->masters()) {
        cluster_->cli(port, {"SCRIPT", "FLUSH"});
    }
    // More than two leases without a loss, and five renewals of each lock (about 1.5 s at one
    // round every 300 ms). The count is waited for rather than read after a fixed sleep: a
    // loaded machine may start a round late, and five rounds then take longer than 2 s.
    const auto renewals = cc.watchdog().stats().renewals;
    redislock::test::stopwatch watch;
    std::this_thread::sleep_for(2s);
    EXPECT_TRUE(redislock::test::eventually(
        [&] { return cc.watchdog().stats().renewals - renewals >= 30u * 5; }, 10s))
        << cc.watchdog().stats().renewals - renewals << " renewals in " << watch.elapsed().count()
        << " ms";
    EXPECT_EQ(lost.calls.load(), 0);
    for (auto& m : locks) {
        EXPECT_TRUE(m.verify());
        m.unlock();
    }
}

// A separate cluster: a killed master leaves the cluster with one master fewer in reserve.
class ClusterMasterKilled : public ::testing::Test {
protected:
    void SetUp() override { cluster_ = std::make_unique<redislock::test::redis_cluster>(3, 1); }
    std::unique_ptr<redislock::test::redis_cluster> cluster_;
};

TEST_F(ClusterMasterKilled, ClientsRecoverAfterThePromotion) {
    const int victim = cluster_->masters().front();
    std::vector<std::string> on_victim;
    for (int i = 0; on_victim.size() < 20 && i < 2000; ++i) {
        const std::string name = "killed:" + std::to_string(i);
        if (cluster_->master_for_key(name) == victim) {
            on_victim.push_back(name);
        }
    }
    ASSERT_EQ(on_victim.size(), 20u);
    std::vector<std::string> elsewhere;
    for (int i = 0; elsewhere.size() < 20 && i < 2000; ++i) {
        const std::string name = "alive:" + std::to_string(i);
        if (cluster_->master_for_key(name) != victim) {
            elsewhere.push_back(name);
        }
    }
    redislock::cluster_client cc{cluster_->uri()};

    // Locks taken just before the kill: asynchronous replication may or may not have copied them.
    std::vector<redislock::cluster_mutex> held;
    for (const auto& name : on_victim) {
        held.push_back(cc.mutex(name, {.lease = 60s}));
        held.back().lock();
    }
    std::atomic<bool> stop{false};
    std::atomic<int> errors{0};
    std::atomic<int> sections{0};
    std::string first_error;                   // written by other_masters, read after it is joined
    std::chrono::milliseconds longest_wait{};  // the same
    std::thread other_masters{[&] {
        // Names on the masters still alive keep working during the failover. Until the replica
        // is promoted every master answers CLUSTERDOWN (cluster-require-full-coverage is on by
        // default); a wait longer than the promotion rides that out instead of failing.
        int i = 0;
        while (!stop) {
            const std::string& name = elsewhere[static_cast<std::size_t>(i++) % elsewhere.size()];
            const auto began = std::chrono::steady_clock::now();
            try {
                auto m = cc.mutex(name, {.lease = 5s});
                if (m.try_lock_for(10s)) {
                    ++sections;
                    m.unlock();
                }
            } catch (const redislock::error& e) {
                if (errors++ == 0) {
                    first_error = e.what();
                }
            }
            longest_wait =
                std::max(longest_wait, std::chrono::duration_cast<std::chrono::milliseconds>(
                                           std::chrono::steady_clock::now() - began));
        }
    }};

    // The promotion itself is the cluster's business and its time depends on the machine's load
    // (failure detection, an election, then the new configuration spreading until the promoted
    // node serves writes instead of CLUSTERDOWN); what the client owes is to follow the cluster
    // quickly once it serves. The watch sends a write straight to the replica to see that moment.
    const auto replicas = cluster_->replicas_of(victim);
    ASSERT_FALSE(replicas.empty());
    const std::string probe = "{" + on_victim.front() + "}:probe";
    const std::string served_probe = "{" + on_victim.front() + "}:served";
    std::atomic<bool> promoted{false};
    std::atomic<bool> served{false};
    std::chrono::steady_clock::time_point promoted_at{};  // written before promoted is set
    std::chrono::steady_clock::time_point served_at{};    // written before served is set
    std::thread promotion_watch{[&, port = replicas.front()] {
        redislock::hiredis_connection replica{cluster_->uri_of(port)};
        const std::array<std::string_view, 1> role{"ROLE"};
        const std::array<std::string_view, 5> write{"SET", served_probe, "1", "PX", "1000"};
        const auto give_up = std::chrono::steady_clock::now() + 40s;
        while (std::chrono::steady_clock::now() < give_up) {
            try {
                if (!promoted) {
                    const reply r = replica.execute(role);
                    if (r.is_array() && !r.elements().empty() &&
                        r.elements().front().text() == "master") {
                        promoted_at = std::chrono::steady_clock::now();
                        promoted = true;
                    }
                } else if (replica.execute(write) == reply::status("OK")) {
                    served_at = std::chrono::steady_clock::now();
                    served = true;
                    return;
                }
            } catch (const redislock::error&) {
                // a busy replica; ask again
            }
            std::this_thread::sleep_for(10ms);
        }
    }};

    const auto killed_at = std::chrono::steady_clock::now();
    cluster_->kill(victim);
    // A fresh name on the victim's slots, tried by calls of at most 1 s each until one takes it
    // (a single call stuck across the promotion would not say how soon a call made after it
    // succeeds).
    int failed_calls = 0;  // calls that ended without the lock
    std::string last_failure;
    std::chrono::milliseconds recovered{};
    for (;;) {
        try {
            auto m = cc.mutex(probe, {.lease = 5s});
            if (m.try_lock_for(1s)) {
                m.unlock();
                recovered = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::steady_clock::now() - killed_at);
                break;
            }
            last_failure = "not acquired within 1 s";
        } catch (const redislock::error& e) {
            last_failure = e.what();
        }
        ++failed_calls;
        ASSERT_LT(std::chrono::steady_clock::now() - killed_at, 30s) << last_failure;
    }
    const auto recovered_at = killed_at + recovered;
    stop = true;
    other_masters.join();
    promotion_watch.join();
    cluster_->wait_healthy();
    ASSERT_TRUE(promoted.load()) << "the replica never reported itself master";
    ASSERT_TRUE(served.load()) << "the promoted replica never served a write";
    const auto promotion =
        std::chrono::duration_cast<std::chrono::milliseconds>(promoted_at - killed_at);
    const auto serving =
        std::chrono::duration_cast<std::chrono::milliseconds>(served_at - promoted_at);
    // Negative when the client's lock got in before the watch's write did.
    const auto followed =
        std::chrono::duration_cast<std::chrono::milliseconds>(recovered_at - served_at);

    int survived = 0;
    redislock::hiredis_cluster_connection conn{cluster_->uri()};
    for (const auto& name : on_victim) {
        const std::array<std::string_view, 2> exists{"EXISTS", name};
        survived += conn.execute(exists) == reply::integer(1) ? 1 : 0;
    }
    std::printf(
        "[ kill -9  ] replica promoted %lld ms after the kill, serving writes %lld ms later; lock "
        "on the killed master's slots works again %lld ms after the kill, %lld ms after the "
        "replica served (%d calls of at most 1 s failed "
        "meanwhile); %d of %zu locks taken just before the kill survived the promotion; other "
        "masters: %d sections, %d errors, longest lock+unlock %lld ms\n",
        static_cast<long long>(promotion.count()), static_cast<long long>(serving.count()),
        static_cast<long long>(recovered.count()), static_cast<long long>(followed.count()),
        failed_calls, survived, on_victim.size(), sections.load(), errors.load(),
        static_cast<long long>(longest_wait.count()));
    EXPECT_LT(followed, 4s) << "a promoted master that serves is followed within 4 s; the last "
                               "failed call: "
                            << last_failure;
    EXPECT_GT(sections.load(), 100) << "names on the other masters kept working";
    EXPECT_EQ(errors.load(), 0) << first_error;
    for (auto& m : held) {
        m.unlock();  // never throws; a lock lost with the master says so through its state
    }
}

// Every timed call returns by its deadline plus deadline_slack (support/deadline.hpp), and a stop
// request ends lock(stop) at once, while one master hangs (SIGSTOP: connections complete, nothing
// is answered) and another is killed, through the failures, the slot-map reads and the
// promotions that follow.
TEST_F(ClusterMasterKilled, TimedCallsEndInTimeWithOneMasterStoppedAndOneKilled) {
    const std::vector<int> masters = cluster_->masters();
    ASSERT_EQ(masters.size(), 3u);
    const int stopped = masters[0];
    const int killed = masters[1];
    // Three names per master, each known to the client before the faults (its node's pool is
    // open) and three it meets for the first time afterwards.
    std::vector<std::string> known;
    std::vector<std::string> fresh;
    for (int port : masters) {
        int found = 0;
        for (int i = 0; found < 6 && i < 5000; ++i) {
            const std::string name = "deadline:" + std::to_string(i);
            if (cluster_->master_for_key(name) == port) {
                (found++ < 3 ? known : fresh).push_back(name);
            }
        }
        ASSERT_EQ(found, 6);
    }
    redislock::cluster_client cc{cluster_->uri()};
    for (const auto& name : known) {
        auto m = cc.mutex(name, {.lease = 5s});
        ASSERT_TRUE(m.try_lock_for(5s));
        m.unlock();
    }
    cluster_->pause(stopped);
    cluster_->kill(killed);
    struct late_call {
        std::string what;
        std::string how;
    };
    std::vector<late_call> late;
    int calls = 0;
    const auto began = std::chrono::steady_clock::now();
    // Through the failure detection and both promotions (node timeout 2 s), bounded in time.
    for (int round = 0; std::chrono::steady_clock::now() - began < 6s && round < 40; ++round) {
        const std::string& name =
            (round % 2 == 0
                 ? known
                 : fresh)[static_cast<std::size_t>(round / 2 % static_cast<int>(known.size()))];
        const auto check = [&](const std::string& what, std::chrono::steady_clock::time_point bound,
                               const redislock::test::call_end& end) {
            ++calls;
            if (!end.by(bound)) {
                late.push_back({what + " " + name + ": " + end.late_after(bound), end.how});
            }
        };
        auto m = cc.mutex(name, {.lease = 5s});
        auto rw = cc.shared_mutex(name + ":rw", {.lease = 5s});
        for (const auto timeout : {10ms, 100ms, 300ms}) {
            const auto deadline = std::chrono::steady_clock::now() + timeout;
            bool got = false;
            const auto end = redislock::test::run_to_end([&] { got = m.try_lock_until(deadline); });
            if (got) {
                m.unlock();
            }
            check("mutex try_lock_until(+" + std::to_string(timeout.count()) + " ms)", deadline,
                  end);
            const auto shared_deadline = std::chrono::steady_clock::now() + timeout;
            got = false;
            const auto shared_end = redislock::test::run_to_end(
                [&] { got = rw.try_lock_shared_until(shared_deadline); });
            if (got) {
                rw.unlock_shared();
            }
            check("shared try_lock_shared_until(+" + std::to_string(timeout.count()) + " ms)",
                  shared_deadline, shared_end);
        }
        redislock::test::stop_after stop{100ms};
        bool got = false;
        const auto end = redislock::test::run_to_end([&] { got = m.lock(stop.token()); });
        if (got) {
            m.unlock();
        }
        check("mutex lock(stop), stopped after 100 ms", stop.requested_at(), end);
    }
    cluster_->resume(stopped);
    std::string report;
    for (const auto& l : late) {
        report += "\n  " + l.what + l.how;
    }
    EXPECT_TRUE(late.empty()) << late.size() << " of " << calls << " calls late:" << report;
    EXPECT_GT(calls, 20);
}

}  // namespace
