// redislock::hiredis_cluster_connection (cluster.hpp): each redirection and error rule against
// scripted fake nodes, then routing, every lock kind and the watchdog on a real 3 + 3 cluster.

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>

#include <redislock/redislock.hpp>

#include "support/deadline.hpp"
#include "support/fake_redis_node.hpp"
#include "support/reconnect_log.hpp"
#include "support/redis_cluster.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::call_context;
using redislock::command;
using redislock::hiredis_cluster_connection;
using redislock::reply;
using redislock::test::fake_command;
using redislock::test::fake_redis_node;
namespace resp = redislock::test::resp;

// A handler that serves CLUSTER SLOTS from `ranges()` (read at each call) and refuses CLUSTER
// SHARDS as a Redis older than 7.0 would; other commands go to `rest`.
template <class Ranges, class Rest>
fake_redis_node::handler cluster_handler(Ranges ranges, Rest rest) {
    return [ranges, rest](const fake_command& c) -> std::string {
        if (c.argv.size() == 2 && c.argv[0] == "CLUSTER" && c.argv[1] == "SHARDS") {
            return resp::error("ERR unknown subcommand 'SHARDS'");
        }
        if (c.argv.size() == 2 && c.argv[0] == "CLUSTER" && c.argv[1] == "SLOTS") {
            return resp::cluster_slots(ranges());
        }
        return rest(c);
    };
}

std::string slot_text(std::string_view key) {
    return std::to_string(redislock::detail::key_slot(key));
}

reply get(hiredis_cluster_connection& conn, std::string_view key) {
    const std::array<std::string_view, 2> argv{"GET", key};
    return conn.execute(argv);
}

TEST(ClusterSeeds, UriGivesOneEndpointPerSeedWithSharedOptions) {
    const auto seeds = redislock::detail::cluster_seeds_from_uri(
        "redis://app:s3cret@127.0.0.1:7000,127.0.0.2:7001,[::1]:7002?command_timeout=300&pool_"
        "size=2");
    ASSERT_EQ(seeds.size(), 3u);
    EXPECT_EQ(seeds[0].port, 7000);
    EXPECT_EQ(seeds[1].host, "127.0.0.2");
    EXPECT_EQ(seeds[2].host, "::1");
    for (const auto& s : seeds) {
        EXPECT_EQ(s.user, "app");
        EXPECT_EQ(s.password, "s3cret");
        EXPECT_EQ(s.command_timeout, 300ms);
        EXPECT_EQ(s.pool_size, 2u);
    }
    EXPECT_THROW(redislock::detail::cluster_seeds_from_uri("redis://127.0.0.1:7000/2"),
                 redislock::invalid_argument);
    EXPECT_THROW(redislock::detail::cluster_seeds_from_uri("redis://127.0.0.1:7000,,a:1"),
                 redislock::invalid_argument);
    EXPECT_THROW(redislock::detail::cluster_seeds_from_uri("unix:///tmp/x.sock"),
                 redislock::invalid_argument);
}

// Settings that cannot work are refused before any seed is asked (port 1 has no server: a
// connection attempt would end in connection_error instead).
TEST(ClusterSeeds, ZeroTimeoutsAndPoolSizeAreRefusedBeforeConnecting) {
    redislock::endpoint base;
    base.host = "127.0.0.1";
    base.port = 1;
    const auto refused = [](const redislock::endpoint& seed) {
        return redislock::test::refusal_of(
            [&] { return hiredis_cluster_connection{std::vector<redislock::endpoint>{seed}}; });
    };
    auto seed = base;
    seed.command_timeout = 0ms;
    EXPECT_NE(refused(seed).find("at least 1 ms"), std::string::npos) << refused(seed);
    seed = base;
    seed.connect_timeout = 0ms;
    EXPECT_NE(refused(seed).find("at least 1 ms"), std::string::npos) << refused(seed);
    seed = base;
    seed.pool_size = 0;
    EXPECT_NE(refused(seed).find("pool_size"), std::string::npos) << refused(seed);
}

TEST(ClusterSeeds, AnySeedThatAnswersSuffices) {
    fake_redis_node node;
    const int port = node.port();
    node.on_command(cluster_handler(
        [port] {
            return std::vector<std::tuple<int, int, int>>{{0, 16383, port}};
        },
        [](const fake_command&) { return resp::bulk("v"); }));
    redislock::test::refused_port refused;
    hiredis_cluster_connection conn{"redis://127.0.0.1:" + std::to_string(refused.port()) + "," +
                                    node.address() + "?connect_timeout=500"};
    EXPECT_EQ(get(conn, "k").text(), "v");
    EXPECT_EQ(conn.masters(), std::vector<std::string>{node.address()});
}

TEST(ClusterSeeds, NoSeedAnsweringIsAConnectionError) {
    redislock::test::refused_port a;
    redislock::test::refused_port b;
    try {
        hiredis_cluster_connection conn{a.uri() + ",127.0.0.1:" + std::to_string(b.port())};
        FAIL() << "connected to nothing";
    } catch (const redislock::connection_error& e) {
        EXPECT_NE(std::string{e.what()}.find(std::to_string(b.port())), std::string::npos)
            << e.what();
    }
}

TEST(ClusterRedirect, MovedRetriesOnTheNamedNodeAndRefreshesTheMap) {
    fake_redis_node a;
    fake_redis_node b;
    std::atomic<bool> moved{false};
    const int pa = a.port();
    const int pb = b.port();
    const auto ranges = [&, pa, pb] {
        return std::vector<std::tuple<int, int, int>>{{0, 16383, moved ? pb : pa}};
    };
    a.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        moved = true;
        return resp::error("MOVED " + slot_text(c.argv[1]) + " " + b.address());
    }));
    b.on_command(cluster_handler(ranges, [](const fake_command&) { return resp::bulk("v"); }));
    hiredis_cluster_connection conn{a.uri()};
    std::this_thread::sleep_for(150ms);  // past the refresh interval of the constructor's read
    EXPECT_EQ(get(conn, "orders:42").text(), "v");
    EXPECT_EQ(a.received("GET").size(), 1u);
    EXPECT_EQ(b.received("GET").size(), 1u);
    EXPECT_EQ(conn.node_for_key("orders:42"), b.address());
    EXPECT_EQ(conn.node_for_key("anything else"), b.address()) << "the whole map was read again";
    EXPECT_GE(conn.map_refreshes(), 2u);
    EXPECT_EQ(get(conn, "orders:42").text(), "v");
    EXPECT_EQ(a.received("GET").size(), 1u) << "later calls go straight to the new owner";
}

TEST(ClusterRedirect, MapRefreshesAreRateLimitedAcrossThreads) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    a.on_command(cluster_handler(
        [pa] {
            return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}};
        },
        [&](const fake_command& c) {
            return resp::error("MOVED " + slot_text(c.argv[1]) + " " + b.address());
        }));
    b.on_command(cluster_handler(
        [pa] {
            return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}};
        },
        [](const fake_command&) { return resp::bulk("v"); }));
    hiredis_cluster_connection conn{a.uri()};
    std::vector<std::thread> threads;
    redislock::test::stopwatch watch;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < 50; ++i) {
                // The stale map keeps sending each new key to a first.
                EXPECT_EQ(get(conn, "k" + std::to_string(t) + ":" + std::to_string(i)).text(), "v");
            }
        });
    }
    for (auto& th : threads) {
        th.join();
    }
    const auto periods = watch.elapsed() / 100ms + 2;
    EXPECT_LE(conn.map_refreshes(), static_cast<std::uint64_t>(periods))
        << "200 MOVED replies in " << watch.elapsed().count() << " ms";
}

// Right after a migration or a failover two nodes can each name the other as the slot's owner
// until gossip settles which one it is. That is a pause, not a failure: the call reads the map
// again and keeps trying within its deadline.
TEST(ClusterRedirect, NodesThatNameEachOtherAreAskedAgainUntilTheyAgree) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    const auto ranges = [pa] { return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}}; };
    std::atomic<int> bounces{0};
    a.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        return ++bounces <= 40 ? resp::error("MOVED " + slot_text(c.argv[1]) + " " + b.address())
                               : resp::bulk("settled");
    }));
    b.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        ++bounces;
        return resp::error("MOVED " + slot_text(c.argv[1]) + " " + a.address());
    }));
    hiredis_cluster_connection conn{a.uri()};
    reply r;
    ASSERT_NO_THROW(
        r = conn.execute(std::array<std::string_view, 2>{"GET", "orders:7"},
                         call_context{.deadline = std::chrono::steady_clock::now() + 20s}));
    EXPECT_EQ(r.text(), "settled");
}

// Nodes that never agree end the call at its deadline, saying so.
TEST(ClusterRedirect, NodesThatNeverAgreeEndTheCallAtItsDeadline) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    const auto ranges = [pa] { return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}}; };
    a.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        return resp::error("MOVED " + slot_text(c.argv[1]) + " " + b.address());
    }));
    b.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        return resp::error("MOVED " + slot_text(c.argv[1]) + " " + a.address());
    }));
    hiredis_cluster_connection conn{a.uri()};
    redislock::test::stopwatch watch;
    try {
        (void)conn.execute(std::array<std::string_view, 2>{"GET", "orders:7"},
                           call_context{.deadline = std::chrono::steady_clock::now() + 300ms});
        ADD_FAILURE() << "a slot no node serves was served";
    } catch (const redislock::timeout_error& e) {
        EXPECT_NE(std::string_view{e.what()}.find("disagree"), std::string_view::npos) << e.what();
    }
    EXPECT_GE(watch.elapsed(), 100ms) << "asked again after pauses, not given up at once";
    EXPECT_GT(a.received("GET").size(), 17u);
}

TEST(ClusterRedirect, AskSendsAskingThenTheCommandOnOneConnectionAndKeepsTheMap) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    const auto ranges = [pa] { return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}}; };
    a.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        return resp::error("ASK " + slot_text(c.argv[1]) + " " + b.address());
    }));
    b.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        return c.asked ? resp::bulk("imported")
                       : resp::error("MOVED " + slot_text(c.argv[1]) + " " + a.address());
    }));
    hiredis_cluster_connection conn{a.uri()};
    const auto refreshes = conn.map_refreshes();
    EXPECT_EQ(get(conn, "lock:{m}").text(), "imported");
    const auto gets = b.received("GET");
    ASSERT_EQ(gets.size(), 1u);
    EXPECT_TRUE(gets[0].asked) << "ASKING must come just before, on the same connection";
    EXPECT_EQ(conn.node_for_key("lock:{m}"), a.address());
    EXPECT_EQ(conn.map_refreshes(), refreshes);
    EXPECT_EQ(get(conn, "lock:{m}").text(), "imported");
    EXPECT_EQ(a.received("GET").size(), 2u) << "ASK does not move the slot";
}

TEST(ClusterRedirect, TryagainIsRetriedUntilItSucceeds) {
    fake_redis_node a;
    const int pa = a.port();
    std::atomic<int> calls{0};
    a.on_command(cluster_handler(
        [pa] {
            return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}};
        },
        [&](const fake_command&) {
            return ++calls <= 3 ? resp::error("TRYAGAIN Multiple keys request during rehashing")
                                : resp::integer(1);
        }));
    hiredis_cluster_connection conn{a.uri()};
    const std::array<std::string_view, 5> argv{"EVALSHA", "0123", "2", "a{m}", "b{m}"};
    const reply r = conn.execute(argv);
    EXPECT_EQ(r, reply::integer(1));
    EXPECT_EQ(calls.load(), 4);
}

// A slot being migrated sends a script whose keys are all missing on the source to the target
// (ASK), which answers TRYAGAIN while some of them are still missing there. Each round is a
// redirection followed by a pause, not nodes that disagree: it is retried until the target
// serves, however many rounds that takes.
TEST(ClusterRedirect, AskAnsweredWithTryagainIsRetriedUntilTheTargetServes) {
    fake_redis_node source;
    fake_redis_node target;
    const int ps = source.port();
    const auto ranges = [ps] { return std::vector<std::tuple<int, int, int>>{{0, 16383, ps}}; };
    std::atomic<int> asked{0};
    source.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        return resp::error("ASK " + slot_text(c.argv[3]) + " " + target.address());
    }));
    target.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        if (!c.asked) {
            return resp::error("MOVED " + slot_text(c.argv[3]) + " " + source.address());
        }
        return ++asked <= 30
                   ? resp::error("TRYAGAIN Multiple keys request during rehashing of slot")
                   : resp::integer(1);
    }));
    hiredis_cluster_connection conn{source.uri()};
    const std::array<std::string_view, 5> argv{"EVALSHA", "0123", "2", "a{m}", "b{m}"};
    reply r;
    ASSERT_NO_THROW(
        r = conn.execute(argv, call_context{.deadline = std::chrono::steady_clock::now() + 20s}));
    EXPECT_EQ(r, reply::integer(1));
    EXPECT_EQ(asked.load(), 31);
}

// TRYAGAIN says the command did not run: when it lasts until the call's deadline, the caller
// gets that answer, not an exception that says the command may have run. Without a deadline of
// the caller's, one command timeout bounds the retries (three are for a failover, where nodes
// do not answer at all).
TEST(ClusterRedirect, TryagainUntilTheDeadlineIsAnsweredAsTryagain) {
    fake_redis_node a;
    const int pa = a.port();
    a.on_command(cluster_handler(
        [pa] {
            return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}};
        },
        [](const fake_command&) {
            return resp::error("TRYAGAIN Multiple keys request during rehashing of slot");
        }));
    hiredis_cluster_connection conn{a.uri() + "?command_timeout=300"};
    const std::array<std::string_view, 5> argv{"EVALSHA", "0123", "2", "a{m}", "b{m}"};
    redislock::test::stopwatch timed;
    reply r;
    ASSERT_NO_THROW(
        r = conn.execute(argv, call_context{.deadline = std::chrono::steady_clock::now() + 200ms}));
    EXPECT_TRUE(r.is_error_code("TRYAGAIN")) << r.text();
    EXPECT_GE(timed.elapsed(), 100ms) << "retried with backoff before giving up";
    EXPECT_GE(a.received("EVALSHA").size(), 3u);

    redislock::test::stopwatch untimed;
    ASSERT_NO_THROW(r = conn.execute(argv));
    EXPECT_TRUE(r.is_error_code("TRYAGAIN")) << r.text();
    EXPECT_GE(untimed.elapsed(), 200ms);
    EXPECT_LT(untimed.elapsed(), 900ms) << "one command timeout, not three";
}

TEST(ClusterRedirect, EveryTransientErrorIsRetried) {
    for (const std::string error :
         {"TRYAGAIN Multiple keys request during rehashing of slot",
          "CLUSTERDOWN The cluster is down", "LOADING Redis is loading the dataset in memory",
          "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."}) {
        SCOPED_TRACE(error);
        fake_redis_node a;
        const int pa = a.port();
        std::atomic<int> calls{0};
        a.on_command(cluster_handler(
            [pa] {
                return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}};
            },
            [&](const fake_command&) {
                return ++calls <= 2 ? resp::error(error) : resp::status("OK");
            }));
        hiredis_cluster_connection conn{a.uri()};
        const std::array<std::string_view, 3> argv{"SET", "k", "v"};
        EXPECT_EQ(conn.execute(argv), reply::status("OK"));
        EXPECT_EQ(calls.load(), 3);
    }
}

TEST(ClusterSeeds, CredentialsAndOptionsReachEveryNodeFoundLater) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    const int pb = b.port();
    const auto ranges = [pa, pb] {
        return std::vector<std::tuple<int, int, int>>{{0, 8191, pa}, {8192, 16383, pb}};
    };
    const auto answer = [](const fake_command& c) {
        return c.argv[0] == "AUTH" ? resp::status("OK") : resp::bulk("v");
    };
    a.on_command(cluster_handler(ranges, answer));
    b.on_command(cluster_handler(ranges, answer));
    hiredis_cluster_connection conn{"redis://app:s3cret@" + a.address() + "?pool_size=3"};
    std::string on_b = "k";
    while (redislock::detail::key_slot(on_b) < 8192) {
        on_b += "x";
    }
    EXPECT_EQ(get(conn, on_b).text(), "v");
    for (const fake_redis_node* node : {&a, &b}) {
        const auto auths = node->received("AUTH");
        ASSERT_FALSE(auths.empty()) << node->address();
        EXPECT_EQ(auths.front().argv, (std::vector<std::string>{"AUTH", "app", "s3cret"}));
    }
    EXPECT_EQ(conn.config().pool_size, 3u);
}

TEST(ClusterRedirect, ClusterdownUntilTheDeadlineIsAnErrorNamingNodeAndSlot) {
    fake_redis_node a;
    const int pa = a.port();
    a.on_command(cluster_handler(
        [pa] {
            return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}};
        },
        [](const fake_command&) { return resp::error("CLUSTERDOWN The cluster is down"); }));
    hiredis_cluster_connection conn{a.uri() + "?command_timeout=200"};
    const std::array<std::string_view, 2> argv{"GET", "orders:42"};
    redislock::test::stopwatch watch;
    try {
        (void)conn.execute(argv,
                           call_context{.deadline = std::chrono::steady_clock::now() + 300ms});
        FAIL() << "CLUSTERDOWN was not reported";
    } catch (const redislock::timeout_error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(a.address()), std::string::npos) << what;
        EXPECT_NE(what.find("slot " + slot_text("orders:42")), std::string::npos) << what;
        EXPECT_NE(what.find("CLUSTERDOWN"), std::string::npos) << what;
    }
    EXPECT_GE(watch.elapsed(), 200ms);
    EXPECT_LT(watch.elapsed(), 1000ms);
    EXPECT_GE(a.received("GET").size(), 3u) << "retried with backoff before giving up";

    redislock::test::stopwatch plain;
    EXPECT_THROW((void)conn.execute(argv), redislock::connection_error);
    EXPECT_GE(plain.elapsed(), 300ms) << "no deadline: a few command timeouts";
    EXPECT_LT(plain.elapsed(), 1500ms);
}

TEST(ClusterRedirect, NoscriptIsHealedOnTheNodeThatAnsweredIt) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    const int pb = b.port();
    const auto ranges = [pa, pb] {
        return std::vector<std::tuple<int, int, int>>{{0, 8191, pa}, {8192, 16383, pb}};
    };
    const std::string sha = "a42059b356c875f0717db19a51f6aaca9ae659ea";
    const std::string source = "return 1";
    a.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        if (c.argv[0] == "SCRIPT") {
            return resp::bulk(sha);
        }
        return resp::error("MOVED " + slot_text(c.argv[3]) + " " + b.address());
    }));
    std::atomic<bool> loaded{false};
    b.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        if (c.argv[0] == "SCRIPT" && c.argv.size() == 3 && c.argv[2] == source) {
            loaded = true;
            return resp::bulk(sha);
        }
        return loaded ? resp::integer(7) : resp::error("NOSCRIPT No matching script.");
    }));
    hiredis_cluster_connection conn{a.uri()};
    // A keyless SCRIPT LOAD, as the watchdog sends it, lands on any master...
    const std::array<std::string_view, 3> load{"SCRIPT", "LOAD", source};
    EXPECT_EQ(conn.execute(load).text(), sha);
    // ...and the EVALSHA that another node runs is healed there, without the caller seeing it.
    std::string key = "k";
    while (redislock::detail::key_slot(key) < 8192) {
        key += "x";
    }
    const std::array<std::string_view, 4> eval{"EVALSHA", sha, "1", key};
    EXPECT_EQ(conn.execute(eval), reply::integer(7));
    ASSERT_EQ(b.received("SCRIPT").size(), 1u);
    EXPECT_EQ(b.received("SCRIPT")[0].argv[2], source);
}

TEST(ClusterRedirect, PipelineIsOneBatchPerNodeInCommandOrderWithRedirectsResent) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    const int pb = b.port();
    const auto ranges = [pa, pb] {
        return std::vector<std::tuple<int, int, int>>{{0, 8191, pa}, {8192, 16383, pb}};
    };
    a.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        if (c.argv[1] == "moved-away") {
            return resp::error("MOVED " + slot_text(c.argv[1]) + " " + b.address());
        }
        return resp::bulk("a:" + c.argv[1]);
    }));
    b.on_command(cluster_handler(
        ranges, [](const fake_command& c) { return resp::bulk("b:" + c.argv[1]); }));
    hiredis_cluster_connection conn{a.uri()};
    std::vector<std::string> keys;
    for (int i = 0; i < 40; ++i) {
        keys.push_back("key" + std::to_string(i));
    }
    keys.push_back("moved-away");
    ASSERT_LT(redislock::detail::key_slot("moved-away"), 8192);
    std::vector<std::array<std::string_view, 2>> argvs;
    for (const auto& k : keys) {
        argvs.push_back({"GET", k});
    }
    std::vector<command> commands(argvs.begin(), argvs.end());
    const auto before = conn.round_trips_per_node();
    const std::vector<reply> replies = conn.execute_pipeline(commands);
    const auto after = conn.round_trips_per_node();
    ASSERT_EQ(replies.size(), keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
        const bool on_a = redislock::detail::key_slot(keys[i]) < 8192 && keys[i] != "moved-away";
        EXPECT_EQ(replies[i].text(), (on_a ? "a:" : "b:") + keys[i]);
    }
    EXPECT_EQ(after.at(a.address()) - before.at(a.address()), 1u);
    EXPECT_EQ(after.at(b.address()) - before.at(b.address()), 2u)
        << "its own batch, then the redirected command";
}

TEST(ClusterRedirect, PipelineFollowsAskForItsCommandsWithAskingBeforeEach) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    const auto ranges = [pa] { return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}}; };
    a.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        if (c.argv[1].starts_with("moving")) {
            return resp::error("ASK " + slot_text(c.argv[1]) + " " + b.address());
        }
        return resp::bulk("a:" + c.argv[1]);
    }));
    b.on_command(cluster_handler(ranges, [&](const fake_command& c) {
        return c.asked ? resp::bulk("b:" + c.argv[1])
                       : resp::error("MOVED " + slot_text(c.argv[1]) + " " + a.address());
    }));
    hiredis_cluster_connection conn{a.uri()};
    const std::vector<std::string> keys{"stay1", "moving1", "stay2", "moving2"};
    std::vector<std::array<std::string_view, 2>> argvs;
    for (const auto& k : keys) {
        argvs.push_back({"GET", k});
    }
    const std::vector<command> commands(argvs.begin(), argvs.end());
    const auto replies = conn.execute_pipeline(commands);
    ASSERT_EQ(replies.size(), 4u);
    EXPECT_EQ(replies[0].text(), "a:stay1");
    EXPECT_EQ(replies[1].text(), "b:moving1");
    EXPECT_EQ(replies[2].text(), "a:stay2");
    EXPECT_EQ(replies[3].text(), "b:moving2");
    const auto gets = b.received("GET");
    ASSERT_EQ(gets.size(), 2u);
    EXPECT_TRUE(gets[0].asked && gets[1].asked);
    EXPECT_EQ(gets[0].connection, gets[1].connection) << "one pipeline to the target";
    EXPECT_EQ(conn.ask_redirections(), 2u);
    EXPECT_EQ(conn.node_for_key("moving1"), a.address());
}

TEST(ClusterRedirect, PipelineWithContextsRoutesKeylessCommandsByTheirKey) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    const int pb = b.port();
    const auto ranges = [pa, pb] {
        return std::vector<std::tuple<int, int, int>>{{0, 8191, pa}, {8192, 16383, pb}};
    };
    a.on_command(cluster_handler(ranges, [](const fake_command&) { return resp::bulk("a"); }));
    b.on_command(cluster_handler(ranges, [](const fake_command&) { return resp::bulk("b"); }));
    hiredis_cluster_connection conn{a.uri()};
    std::string on_b = "k";
    while (redislock::detail::key_slot(on_b) < 8192) {
        on_b += "x";
    }
    // SCRIPT LOAD carries no key of its own: the context says which node needs the script.
    const std::array<std::string_view, 3> load{"SCRIPT", "LOAD", "return 1"};
    const std::array<std::string_view, 2> get{"GET", on_b};
    const std::array<command, 2> commands{command{load}, command{get}};
    const std::array<call_context, 2> hows{call_context{.key = on_b}, call_context{}};
    const auto replies = conn.execute_pipeline(commands, hows);
    ASSERT_EQ(replies.size(), 2u);
    EXPECT_EQ(replies[0].text(), "b");
    EXPECT_EQ(replies[1].text(), "b");
    EXPECT_EQ(b.received("SCRIPT").size(), 1u);
    EXPECT_TRUE(a.received("SCRIPT").empty());
}

TEST(ClusterRedirect, HungNodeFailsOnlyItsShareOfAPipeline) {
    fake_redis_node a;
    fake_redis_node b;
    const int pa = a.port();
    const int pb = b.port();
    const auto ranges = [pa, pb] {
        return std::vector<std::tuple<int, int, int>>{{0, 8191, pa}, {8192, 16383, pb}};
    };
    a.on_command(cluster_handler(ranges, [](const fake_command&) {
        std::this_thread::sleep_for(400ms);  // longer than the command timeout
        return resp::bulk("late");
    }));
    b.on_command(cluster_handler(ranges, [](const fake_command&) { return resp::bulk("b"); }));
    hiredis_cluster_connection conn{a.uri() + "?command_timeout=150"};
    std::string on_a = "k";
    while (redislock::detail::key_slot(on_a) >= 8192) {
        on_a += "x";
    }
    std::string on_b = "k";
    while (redislock::detail::key_slot(on_b) < 8192) {
        on_b += "x";
    }
    // The hung node's command comes first: the other node's must still be sent and answered.
    const std::array<std::string_view, 4> renew_a{"EVALSHA", "0123", "1", on_a};
    const std::array<std::string_view, 4> renew_b{"EVALSHA", "0123", "1", on_b};
    const std::array<command, 2> commands{command{renew_a}, command{renew_b}};
    redislock::test::stopwatch watch;
    const auto replies = conn.execute_pipeline(commands);
    ASSERT_EQ(replies.size(), 2u);
    EXPECT_TRUE(replies[0].text().starts_with(redislock::detail::unanswered_prefix))
        << replies[0].text();
    EXPECT_NE(replies[0].text().find(a.address()), std::string::npos) << replies[0].text();
    EXPECT_EQ(replies[1].text(), "b");
    EXPECT_LT(watch.elapsed(), 1000ms);
    // Alone, the same command is a timeout the caller sees.
    EXPECT_THROW((void)conn.execute(renew_a), redislock::timeout_error);
}

TEST(ClusterRedirect, StopRequestEndsRetriesAtOnce) {
    fake_redis_node a;
    const int pa = a.port();
    a.on_command(cluster_handler(
        [pa] {
            return std::vector<std::tuple<int, int, int>>{{0, 16383, pa}};
        },
        [](const fake_command&) { return resp::error("TRYAGAIN slot being moved"); }));
    hiredis_cluster_connection conn{a.uri() + "?command_timeout=2000"};
    std::stop_source stop;
    const std::stop_token token = stop.get_token();
    std::thread stopper{[&] {
        std::this_thread::sleep_for(100ms);
        stop.request_stop();
    }};
    redislock::test::stopwatch watch;
    const std::array<std::string_view, 2> argv{"GET", "k"};
    EXPECT_THROW((void)conn.execute(argv, call_context{.stop = &token}),
                 redislock::cancelled_error);
    stopper.join();
    EXPECT_LT(watch.elapsed(), 1000ms);
}

TEST(ClusterRedirect, RefusedNodeIsRetriedUntilTheMapNamesAnother) {
    fake_redis_node b;
    const int pb = b.port();
    auto a = std::make_unique<fake_redis_node>();
    const int pa = a->port();
    std::atomic<bool> promoted{false};
    const auto ranges = [&, pa, pb] {
        return std::vector<std::tuple<int, int, int>>{{0, 16383, promoted ? pb : pa}};
    };
    a->on_command(cluster_handler(ranges, [](const fake_command&) { return resp::bulk("a"); }));
    b.on_command(cluster_handler(ranges, [](const fake_command&) { return resp::bulk("b"); }));
    hiredis_cluster_connection conn{a->uri() + "," + b.address()};
    EXPECT_EQ(get(conn, "k").text(), "a");
    a.reset();  // the master is gone: connections refused
    std::thread promote{[&] {
        std::this_thread::sleep_for(300ms);
        promoted = true;
    }};
    redislock::test::stopwatch watch;
    EXPECT_EQ(get(conn, "k").text(), "b");
    promote.join();
    EXPECT_GE(watch.elapsed(), 250ms);
    EXPECT_EQ(conn.node_for_key("k"), b.address());
}

// Makes a fake node's answers hang as a stopped server's would: the next `count` commands that
// reach hold() wait until release() (or 3 s, so that the node's threads always end).
class hang {
public:
    void next(int count) {
        std::lock_guard lock{mutex_};
        left_ = count;
        released_ = false;
    }
    void hold() {
        std::unique_lock lock{mutex_};
        if (left_ == 0) {
            return;
        }
        --left_;
        ++held_;
        changed_.notify_all();
        changed_.wait_for(lock, 3s, [&] { return released_; });
    }
    void release() {
        std::lock_guard lock{mutex_};
        released_ = true;
        changed_.notify_all();
    }
    // Waits until a command is held.
    bool wait_held(std::chrono::milliseconds timeout) {
        std::unique_lock lock{mutex_};
        return changed_.wait_for(lock, timeout, [&] { return held_ > 0; });
    }

private:
    std::mutex mutex_;
    std::condition_variable changed_;
    int left_ = 0;
    int held_ = 0;
    bool released_ = false;
};

// A fake node that serves every slot itself, answers GET with "v", and passes CLUSTER SLOTS
// through `map_read` first.
void serve_everything(fake_redis_node& node, hang& map_read) {
    const int port = node.port();
    node.on_command([port, &map_read](const fake_command& c) -> std::string {
        if (c.argv.size() == 2 && c.argv[0] == "CLUSTER") {
            if (c.argv[1] == "SHARDS") {
                return resp::error("ERR unknown subcommand 'SHARDS'");
            }
            map_read.hold();
            return resp::cluster_slots({{0, 16383, port}});
        }
        if (c.argv[0] == "AUTH") {
            return resp::status("OK");
        }
        return resp::bulk("v");
    });
}

// A slot-map read that hangs (a master stopped mid-read) ends by the deadline of the call that
// started it, and at once on its stop request: no read gets more than the call has left.
TEST(ClusterDeadline, SlotMapReadFromAHungNodeEndsByTheCallsDeadline) {
    fake_redis_node a;
    fake_redis_node b;
    hang a_map;
    hang b_map;
    serve_everything(b, b_map);
    const int pa = a.port();
    a.on_command([&, pa](const fake_command& c) -> std::string {
        if (c.argv.size() == 2 && c.argv[0] == "CLUSTER") {
            if (c.argv[1] == "SHARDS") {
                return resp::error("ERR unknown subcommand 'SHARDS'");
            }
            a_map.hold();
            return resp::cluster_slots({{0, 16383, pa}});
        }
        return resp::error("MOVED " + slot_text(c.argv[1]) + " " + b.address());
    });
    const std::array<std::string_view, 2> argv{"GET", "k"};
    // a, the only seed, serves every slot; its MOVED names b, and the map read that follows
    // asks a first, which hangs.
    {
        hiredis_cluster_connection conn{a.uri()};
        std::this_thread::sleep_for(150ms);  // past the refresh interval of the first read
        a_map.next(1);
        const auto deadline = std::chrono::steady_clock::now() + 100ms;
        const auto end = redislock::test::run_to_end([&] {
            (void)conn.execute(argv, {{}, deadline});
        });
        EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
        a_map.release();
        EXPECT_EQ(get(conn, "k").text(), "v");
    }
    {
        hiredis_cluster_connection conn{a.uri()};
        std::this_thread::sleep_for(150ms);
        a_map.next(1);
        b_map.next(1);
        redislock::test::stop_after stop{100ms};
        const auto end =
            redislock::test::run_to_end([&] { (void)conn.execute(argv, {.stop = &stop.token()}); });
        const auto requested = stop.requested_at();
        EXPECT_TRUE(end.by(requested)) << end.late_after(requested) << end.how;
        EXPECT_NE(end.how.find("cancelled_error"), std::string::npos) << end.how;
        a_map.release();
        b_map.release();
    }
}

// Opening the first connection to a node that does not complete connections (its accept queue
// is full, or its packets are dropped) ends by the call's deadline, and at once on a stop request.
TEST(ClusterDeadline, FirstConnectionToAnUnresponsiveNodeEndsByTheCallsDeadline) {
    fake_redis_node a;
    const redislock::test::unresponsive_listener silent;
    const int silent_port = std::stoi(silent.uri().substr(silent.uri().rfind(':') + 1));
    a.on_command(cluster_handler(
        [silent_port] {
            return std::vector<std::tuple<int, int, int>>{{0, 16383, silent_port}};
        },
        [](const fake_command&) { return resp::bulk("v"); }));
    hiredis_cluster_connection conn{a.uri()};
    const std::array<std::string_view, 2> argv{"GET", "k"};
    {
        const auto deadline = std::chrono::steady_clock::now() + 100ms;
        const auto end = redislock::test::run_to_end([&] {
            (void)conn.execute(argv, {{}, deadline});
        });
        EXPECT_TRUE(end.by(deadline)) << end.late_after(deadline) << end.how;
        EXPECT_NE(end.how.find("timeout_error"), std::string::npos) << end.how;
    }
    {
        redislock::test::stop_after stop{100ms};
        const auto end =
            redislock::test::run_to_end([&] { (void)conn.execute(argv, {.stop = &stop.token()}); });
        const auto requested = stop.requested_at();
        EXPECT_TRUE(end.by(requested)) << end.late_after(requested) << end.how;
        EXPECT_NE(end.how.find("cancelled_error"), std::string::npos) << end.how;
    }
}

// Runs `in_child` in a forked child and returns its exit status (-1: killed after `timeout`,
// because it hung). The child leaves with _exit: the parent's fixtures are not its to end.
template <class InChild>
int exit_status_of_child(InChild in_child, std::chrono::milliseconds timeout) {
    const pid_t pid = ::fork();
    if (pid == 0) {
        int code = 3;
        try {
            code = in_child() ? 0 : 1;
        } catch (...) {
            code = 2;
        }
        ::_exit(code);
    }
    const auto status = redislock::test::wait_child(pid, timeout);
    if (!status) {
        return -1;
    }
    return WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

// A child forked while a thread of its parent reads the slot map (and waits for a node that
// hangs) reads the map and sends commands itself: nothing of its parent's read holds it.
TEST(ClusterFork, ChildForkedDuringASlotMapReadUsesTheConnection) {
    fake_redis_node a;
    hang a_map;
    serve_everything(a, a_map);
    hiredis_cluster_connection conn{a.uri()};
    a_map.next(1);
    std::thread reader{[&] { (void)conn.refresh_map(); }};
    ASSERT_TRUE(a_map.wait_held(2s));
    const int status = exit_status_of_child(
        [&] {
            const std::array<std::string_view, 2> argv{"GET", "k"};
            const auto deadline = std::chrono::steady_clock::now() + 1s;
            return conn.refresh_map() && conn.execute(argv, {{}, deadline}).text() == "v";
        },
        3s);
    a_map.release();
    reader.join();
    EXPECT_EQ(status, 0) << "-1: the child hung";
}

// The same while a thread of the parent opens the first connection to a node (its AUTH hangs).
TEST(ClusterFork, ChildForkedWhileAConnectionToANodeIsOpenedUsesTheConnection) {
    fake_redis_node a;
    fake_redis_node b;
    hang b_auth;
    const int pa = a.port();
    const int pb = b.port();
    const auto handler = [pa, pb](hang* auth) {
        return [pa, pb, auth](const fake_command& c) -> std::string {
            if (c.argv.size() == 2 && c.argv[0] == "CLUSTER") {
                if (c.argv[1] == "SHARDS") {
                    return resp::error("ERR unknown subcommand 'SHARDS'");
                }
                return resp::cluster_slots({{0, 8191, pa}, {8192, 16383, pb}});
            }
            if (c.argv[0] == "AUTH") {
                if (auth != nullptr) {
                    auth->hold();
                }
                return resp::status("OK");
            }
            return resp::bulk("v");
        };
    };
    a.on_command(handler(nullptr));
    b.on_command(handler(&b_auth));
    hiredis_cluster_connection conn{"redis://:pw@127.0.0.1:" + std::to_string(pa)};
    std::string on_b = "k";
    while (redislock::detail::key_slot(on_b) < 8192) {
        on_b += "x";
    }
    const std::array<std::string_view, 2> argv{"GET", on_b};
    b_auth.next(1);
    std::thread opener{
        [&] { (void)redislock::test::run_to_end([&] { (void)conn.execute(argv); }); }};
    ASSERT_TRUE(b_auth.wait_held(2s));
    const int status = exit_status_of_child(
        [&] {
            const auto deadline = std::chrono::steady_clock::now() + 1s;
            return conn.execute(argv, {{}, deadline}).text() == "v";
        },
        3s);
    b_auth.release();
    opener.join();
    EXPECT_EQ(status, 0) << "-1: the child hung";
}

// A real cluster of 3 masters with one replica each, shared by the tests of this suite.
class ClusterConnection : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        cluster_ = new redislock::test::redis_cluster{3, 1};
        std::printf("[ cluster  ] 3 masters + 3 replicas ready in %lld ms\n",
                    static_cast<long long>(cluster_->bring_up_time().count()));
        masters_ = cluster_->masters();
        for (int port : masters_) {
            for (const auto& n : cluster_->nodes(port)) {
                if (n.port == port) {
                    ranges_[port] = n.slot_ranges;
                }
            }
        }
    }
    static void TearDownTestSuite() {
        delete cluster_;
        cluster_ = nullptr;
    }

    // The master serving `key`, from CLUSTER KEYSLOT on a node and the ranges read at start.
    static int owner_of(std::string_view key) {
        redislock::hiredis_connection& conn = direct(masters_.front());
        const std::array<std::string_view, 3> argv{"CLUSTER", "KEYSLOT", key};
        const auto slot = conn.execute(argv).as_integer();
        for (const auto& [port, ranges] : ranges_) {
            for (const auto& [first, last] : ranges) {
                if (slot >= first && slot <= last) {
                    return port;
                }
            }
        }
        return 0;
    }

    // A plain single-node connection to one master, apart from the code under test.
    static redislock::hiredis_connection& direct(int port) {
        static std::mutex mutex;
        static std::map<int, std::unique_ptr<redislock::hiredis_connection>> conns;
        std::lock_guard lock{mutex};
        auto& c = conns[port];
        if (!c) {
            c = std::make_unique<redislock::hiredis_connection>(cluster_->uri_of(port));
        }
        return *c;
    }

    static bool exists_on_owner(std::string_view key) {
        const std::array<std::string_view, 2> argv{"EXISTS", key};
        return direct(owner_of(key)).execute(argv) == reply::integer(1);
    }

    static std::string address(int port) { return "127.0.0.1:" + std::to_string(port); }

    static inline redislock::test::redis_cluster* cluster_ = nullptr;
    static inline std::vector<int> masters_;
    static inline std::map<int, std::vector<std::pair<int, int>>> ranges_;
};

TEST_F(ClusterConnection, SlotMapComesFromClusterShards) {
    hiredis_cluster_connection conn{cluster_->uri()};
    std::vector<std::string> expected;
    for (int port : masters_) {
        expected.push_back(address(port));
    }
    auto masters = conn.masters();
    std::sort(masters.begin(), masters.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(masters, expected);
    EXPECT_EQ(conn.map_refreshes(), 1u);
}

TEST_F(ClusterConnection, EveryKeyGoesToTheMasterOfItsSlot) {
    hiredis_cluster_connection conn{cluster_->uri()};
    std::map<int, int> per_master;
    for (int i = 0; i < 300; ++i) {
        const std::string key = "route:" + std::to_string(i);
        const std::string value = "v" + std::to_string(i);
        const std::array<std::string_view, 3> set{"SET", key, value};
        ASSERT_TRUE(conn.execute(set).is_status());
        const int owner = owner_of(key);
        ++per_master[owner];
        EXPECT_EQ(conn.node_for_key(key), address(owner));
        const std::array<std::string_view, 2> get{"GET", key};
        EXPECT_EQ(direct(owner).execute(get).text(), value) << key;
        const std::array<std::string_view, 2> del{"DEL", key};
        EXPECT_EQ(conn.execute(del), reply::integer(1));
    }
    EXPECT_EQ(per_master.size(), 3u);
    for (const auto& [port, count] : per_master) {
        EXPECT_GT(count, 50) << port;
    }
    EXPECT_EQ(conn.map_refreshes(), 1u) << "no MOVED on a stable cluster";
}

// Names spread over the three masters: `orders:<i>` for i < count.
std::vector<std::string> spread_names(int count) {
    std::vector<std::string> names;
    for (int i = 0; i < count; ++i) {
        names.push_back("orders:" + std::to_string(i));
    }
    return names;
}

TEST_F(ClusterConnection, SimpleLockWithFencingOnEveryMaster) {
    redislock::cluster_client cc{cluster_->uri()};
    redislock::cluster_client rival{cluster_->uri()};
    std::set<int> owners;
    for (const std::string& name : spread_names(24)) {
        auto m = cc.mutex(name, {.lease = 10s, .fencing = true});
        auto other = rival.mutex(name, {.lease = 10s});
        m.lock();
        owners.insert(owner_of(name));
        EXPECT_TRUE(exists_on_owner(name)) << name;
        const auto first = m.fencing_token();
        EXPECT_GT(first, 0);
        EXPECT_FALSE(other.try_lock()) << name;
        m.unlock();
        EXPECT_FALSE(exists_on_owner(name)) << name;
        m.lock();
        EXPECT_GT(m.fencing_token(), first);
        EXPECT_TRUE(m.verify());
        m.unlock();
        EXPECT_TRUE(other.try_lock());
        other.unlock();
    }
    EXPECT_EQ(owners.size(), 3u);
}

// lock_options::min_replicas on a cluster: the WAIT goes with the write to the slot's master,
// whose replica acknowledges it; more replicas than a master has is a clear error, nothing held.
TEST_F(ClusterConnection, ReplicaAcknowledgedLocksOnEveryMaster) {
    redislock::cluster_client cc{cluster_->uri()};
    std::set<int> owners;
    for (const std::string& name : spread_names(12)) {
        auto m = cc.mutex(name, {.lease = 10s, .min_replicas = 1, .replica_timeout = 2s});
        auto rm = cc.recursive_mutex(name + ":r",
                                     {.lease = 10s, .min_replicas = 1, .replica_timeout = 2s});
        // A wait: the first write of a script on a node that lacks it is sent twice (NOSCRIPT),
        // and its WAIT then vouches for nothing, so that attempt counts as unacknowledged.
        ASSERT_TRUE(m.try_lock_for(5s)) << name;
        ASSERT_TRUE(rm.try_lock_for(5s)) << name;
        owners.insert(owner_of(name));
        m.unlock();
        rm.unlock();
        auto too_many = cc.mutex(name, {.lease = 10s, .min_replicas = 2, .replica_timeout = 50ms});
        EXPECT_THROW((void)too_many.try_lock(), redislock::replication_error) << name;
        EXPECT_FALSE(too_many.owned());
        EXPECT_TRUE(redislock::test::eventually([&] { return !exists_on_owner(name); }, 3s))
            << name;
    }
    EXPECT_EQ(owners.size(), 3u);
}

TEST_F(ClusterConnection, ReentrantLockOnEveryMaster) {
    redislock::cluster_client cc{cluster_->uri()};
    redislock::cluster_client rival{cluster_->uri()};
    for (const std::string& name : spread_names(24)) {
        auto m = cc.recursive_mutex(name, {.lease = 10s, .fencing = true});
        auto other = rival.recursive_mutex(name);
        m.lock();
        const auto fence = m.fencing_token();
        m.lock();
        EXPECT_EQ(m.fencing_token(), fence);
        EXPECT_TRUE(exists_on_owner(name)) << name;
        EXPECT_FALSE(other.try_lock());
        m.unlock();
        EXPECT_FALSE(other.try_lock());
        m.unlock();
        EXPECT_FALSE(exists_on_owner(name)) << name;
        EXPECT_TRUE(other.try_lock());
        other.unlock();
    }
}

TEST_F(ClusterConnection, ReadWriteLockOnEveryMaster) {
    redislock::cluster_client cc{cluster_->uri()};
    redislock::cluster_client rival{cluster_->uri()};
    for (const std::string& name : spread_names(24)) {
        auto rw = cc.shared_mutex(name, {.lease = 10s, .fencing = true});
        auto other = rival.shared_mutex(name, {.lease = 10s});
        rw.lock_shared();
        EXPECT_TRUE(other.try_lock_shared()) << "readers share";
        EXPECT_TRUE(exists_on_owner(name)) << name;
        other.unlock_shared();
        EXPECT_FALSE(other.try_lock()) << "a reader holds it";
        rw.unlock_shared();
        rw.lock();
        EXPECT_GT(rw.fencing_token(), 0);
        EXPECT_FALSE(other.try_lock_shared());
        rw.unlock();
        EXPECT_FALSE(exists_on_owner(name)) << name;
    }
}

// The queries of every lock kind run on the master of the name's slot, in one round trip there
// once their script is loaded, and no MOVED: the script declares the one key it reads. A hash
// written straight to that master is what they read.
TEST_F(ClusterConnection, QueriesOfEveryLockKindAskTheMasterOfTheNamesSlotInOneRoundTrip) {
    redislock::cluster_client cc{cluster_->uri()};
    redislock::cluster_client asker{cluster_->uri()};  // sends the queries, and nothing else
    hiredis_cluster_connection& conn = asker.connection();
    const auto one_round_trip_on_its_master = [&](std::string_view name, auto&& query) {
        const auto before = conn.round_trips_per_node();
        query();
        auto after = conn.round_trips_per_node();
        for (const auto& [node, trips] : before) {
            after[node] -= trips;
        }
        std::map<std::string, std::uint64_t> expected;
        for (const auto& [node, trips] : after) {
            expected[node] = node == address(owner_of(name)) ? 1 : 0;
        }
        EXPECT_EQ(after, expected) << name;
    };
    std::set<int> owners;
    for (int i = 0; i < 12; ++i) {
        const std::string name = "queried:" + std::to_string(i);
        SCOPED_TRACE(name);
        owners.insert(owner_of(name));

        auto m = cc.mutex(name, {.lease = 10s});
        const auto seen = asker.mutex(name);
        EXPECT_FALSE(seen.is_locked());
        m.lock();
        one_round_trip_on_its_master(name, [&] { EXPECT_TRUE(seen.is_locked()); });
        EXPECT_GT(seen.holder_ttl(), 0ms);
        EXPECT_LE(seen.holder_ttl(), 10s);
        m.unlock();
        EXPECT_FALSE(seen.is_locked());

        const std::string reentrant = name + ":r";
        auto rm = cc.recursive_mutex(reentrant, {.lease = 10s});
        const auto rseen = asker.recursive_mutex(reentrant);
        EXPECT_FALSE(rseen.is_locked());
        rm.lock();
        rm.lock();
        EXPECT_EQ(rm.hold_count(), 2U);
        one_round_trip_on_its_master(reentrant, [&] { EXPECT_EQ(rseen.hold_count(), 0U); });
        EXPECT_TRUE(rseen.is_locked());
        EXPECT_LE(rseen.holder_ttl(), 10s);
        rm.unlock();
        rm.unlock();
        EXPECT_FALSE(rseen.is_locked());

        const std::string read_write = name + ":rw";
        auto long_reader = cc.shared_mutex(read_write, {.lease = 30s});
        auto short_reader = cc.shared_mutex(read_write, {.lease = 2s, .owner = "short"});
        const auto rwseen = asker.shared_mutex(read_write);
        EXPECT_FALSE(rwseen.is_locked());
        long_reader.lock_shared();
        short_reader.lock_shared();
        one_round_trip_on_its_master(read_write, [&] { EXPECT_GT(rwseen.holder_ttl(), 2s); });
        EXPECT_LE(rwseen.holder_ttl(), 30s);
        short_reader.unlock_shared();
        long_reader.unlock_shared();
        EXPECT_FALSE(rwseen.is_locked());

        // Books only, written straight to the slot's master: held by no one until an entry.
        const std::string books = name + ":books";
        redislock::hiredis_connection& master = direct(owner_of(books));
        const std::array<std::string_view, 6> hset{"HSET", books, "gone:o", "a1", "fence", "5"};
        ASSERT_EQ(master.execute(hset), reply::integer(2));
        const auto planted = asker.recursive_mutex(books);
        EXPECT_FALSE(planted.is_locked());
        const std::array<std::string_view, 6> entry{"HSET", books, "o", "1", "id:o", "a2"};
        ASSERT_EQ(master.execute(entry), reply::integer(2));
        EXPECT_TRUE(planted.is_locked());
        EXPECT_EQ(planted.holder_ttl(), std::chrono::milliseconds::max()) << "no expiry set";
        const std::array<std::string_view, 2> del{"DEL", books};
        EXPECT_EQ(master.execute(del), reply::integer(1));
    }
    EXPECT_EQ(owners.size(), 3u);
    EXPECT_EQ(conn.moved_redirections(), 0u);
    EXPECT_EQ(conn.map_refreshes(), 1u) << "no MOVED on a stable cluster";
}

// A waiter on any master is woken by the release (SPUBLISH stays on the slot's shard, the
// subscriber link goes to the slot's master), not by its long backoff or the holder's lease.
TEST_F(ClusterConnection, WaitersAreWokenByTheReleaseOnEveryMaster) {
    redislock::cluster_client cc{cluster_->uri()};
    redislock::cluster_client rival{cluster_->uri()};
    const redislock::lock_options slow{.lease = 30s, .backoff_min = 5s, .backoff_max = 20s};
    std::set<int> owners;
    for (const std::string& name : spread_names(6)) {
        owners.insert(owner_of(name));
        auto holder = cc.mutex(name, slow);
        auto waiter = rival.mutex(name, slow);
        ASSERT_TRUE(holder.try_lock());
        redislock::test::waiting_thread t{waiter, 25s};
        const std::string queue = redislock::detail::derived_key(name, "queue");
        const std::array<std::string_view, 2> zcard{"ZCARD", queue};
        ASSERT_TRUE(redislock::test::eventually(
            [&] { return direct(owner_of(name)).execute(zcard) == reply::integer(1); }));
        const auto released = std::chrono::steady_clock::now();
        holder.unlock();
        EXPECT_TRUE(redislock::test::eventually([&] { return t.got(); }, 3s)) << name;
        EXPECT_LT(std::chrono::steady_clock::now() - released, 3s) << name;
        t.join();
        EXPECT_FALSE(exists_on_owner(name)) << name;
    }
    EXPECT_EQ(owners.size(), masters_.size());
}

// Names with a '}' and no valid hash tag: every key of a lock must stay in one slot.
TEST_F(ClusterConnection, OddNamesWorkForEveryLockKind) {
    redislock::cluster_client cc{cluster_->uri()};
    for (const std::string name : {"job}1", "a{}b", "{x}", "}{", "a}b{c}", "{{x}}"}) {
        SCOPED_TRACE(name);
        try {
            auto m = cc.mutex(name, {.lease = 10s, .fencing = true});
            m.lock();
            EXPECT_GT(m.fencing_token(), 0);
            m.unlock();
        } catch (const redislock::error& e) {
            ADD_FAILURE() << "fenced mutex: " << e.what();
        }
        try {
            auto m = cc.recursive_mutex(name, {.lease = 10s, .fencing = true});
            m.lock();
            m.unlock();
        } catch (const redislock::error& e) {
            ADD_FAILURE() << "recursive_mutex: " << e.what();
        }
        try {
            auto rw = cc.shared_mutex(name, {.lease = 10s, .fencing = true});
            rw.lock();
            rw.unlock();
            rw.lock_shared();
            rw.unlock_shared();
        } catch (const redislock::error& e) {
            ADD_FAILURE() << "shared_mutex: " << e.what();
        }
    }
}

// For each master, a lock name whose slot it serves.
std::map<int, std::string> name_per_master(const std::vector<int>& masters,
                                           int (*owner_of)(std::string_view)) {
    std::map<int, std::string> out;
    for (int i = 0; out.size() < masters.size() && i < 1000; ++i) {
        std::string name = "reconnect:" + std::to_string(i);
        const int owner = owner_of(name);
        if (!out.contains(owner)) {
            out.emplace(owner, std::move(name));
        }
    }
    return out;
}

// The client's connections on one master are killed: the next lock call on a name of that
// master opens a new one there, and the hook hears of it as reconnected, naming that master
// only. The other masters, whose connections were left alone, are not named.
TEST_F(ClusterConnection, ClientKillOnOneMasterIsReportedAsReconnectedNamingThatMaster) {
    redislock::test::reconnect_log log;
    redislock::cluster_client cc{cluster_->uri(), {.on_event = log.hook()}};
    const auto names = name_per_master(masters_, &owner_of);
    ASSERT_EQ(names.size(), masters_.size());
    for (const auto& [port, name] : names) {
        auto m = cc.mutex(name, {.lease = 10s});
        m.lock();
        m.unlock();
    }
    EXPECT_EQ(log.count(), 0U) << "first connections to each master are no reconnection";

    const int victim = masters_.back();
    EXPECT_GE(std::stoi(cluster_->cli(victim, {"CLIENT", "KILL", "TYPE", "normal"})), 1);
    std::this_thread::sleep_for(20ms);  // past the idle check's millisecond
    for (const auto& [port, name] : names) {
        auto m = cc.mutex(name, {.lease = 10s});
        m.lock();
        EXPECT_TRUE(exists_on_owner(name)) << name;
        m.unlock();
    }
    ASSERT_TRUE(redislock::test::eventually([&] { return log.count() >= 1; }, 5s));
    for (const std::string& server : log.servers()) {
        EXPECT_EQ(server, address(victim));
    }
    EXPECT_EQ(log.about_a_lock(), 0U);
}

// The handler reaches every node's pool: the seed's, opened by the constructor before the
// handler was set, and those opened afterwards, concurrently, by threads that sent the first
// command to the other masters (learnt from the slot map) while the handler was being set.
TEST_F(ClusterConnection, ReconnectHandlerReachesPoolsOpenedBeforeAndAfterItWasSet) {
    redislock::test::reconnect_log log;
    const int seed = masters_.front();
    hiredis_cluster_connection conn{cluster_->uri_of(seed)};
    const auto names = name_per_master(masters_, &owner_of);
    ASSERT_EQ(names.size(), masters_.size());
    const auto get_on_every_master = [&] {
        std::vector<std::thread> threads;
        for (const auto& entry : names) {
            const std::string key = entry.second;  // clang 14: no captured structured bindings
            threads.emplace_back([&conn, key] {
                for (int i = 0; i < 20; ++i) {
                    EXPECT_TRUE(get(conn, key).is_nil()) << key;
                }
            });
        }
        return threads;
    };
    {
        auto threads = get_on_every_master();
        conn.set_reconnect_handler(log.handler());
        for (auto& t : threads) {
            t.join();
        }
    }
    EXPECT_EQ(log.count(), 0U);

    for (int port : masters_) {
        EXPECT_GE(std::stoi(cluster_->cli(port, {"CLIENT", "KILL", "TYPE", "normal"})), 1) << port;
    }
    std::this_thread::sleep_for(20ms);
    for (auto& t : get_on_every_master()) {
        t.join();
    }
    std::size_t on_masters = 0;
    for (int port : masters_) {
        EXPECT_GE(log.count(address(port)), 1U) << address(port);
        on_masters += log.count(address(port));
    }
    EXPECT_EQ(on_masters, log.count()) << "only the masters were used";

    conn.set_reconnect_handler(nullptr);  // an empty handler stops the reports
    const std::size_t before = log.count();
    EXPECT_GE(std::stoi(cluster_->cli(seed, {"CLIENT", "KILL", "TYPE", "normal"})), 1);
    std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(get(conn, names.at(seed)).is_nil());
    EXPECT_EQ(log.count(), before);
}

// A node's pool that reconnects while the slot map is read (its idle connection was closed by
// the node, and CLUSTER SHARDS is the first command that needs one) reports once the read is
// over: a handler that reads the map again itself does not wait for the read it is called from.
TEST_F(ClusterConnection, ReconnectHandlerMayRefreshTheMapFromAReconnectionDuringARefresh) {
    const int seed = masters_.front();
    hiredis_cluster_connection conn{cluster_->uri_of(seed)};
    std::atomic<int> told{0};
    std::atomic<int> refreshed{0};
    conn.set_reconnect_handler([&](std::string_view) {
        ++told;
        if (conn.refresh_map()) {
            ++refreshed;
        }
    });
    // Every master's pool holds an idle connection, whichever the refresh asks first.
    for (const auto& entry : name_per_master(masters_, &owner_of)) {
        EXPECT_TRUE(get(conn, entry.second).is_nil());
    }
    ASSERT_EQ(told.load(), 0);

    for (int port : masters_) {
        (void)cluster_->cli(port, {"CLIENT", "KILL", "TYPE", "normal"});
    }
    std::this_thread::sleep_for(20ms);  // past the idle check's millisecond
    auto refresh = std::async(std::launch::async, [&] { return conn.refresh_map(); });
    if (refresh.wait_for(10s) != std::future_status::ready) {
        ADD_FAILURE() << "refresh_map() did not return: the handler waits for the refresh it "
                         "was called from";
        std::abort();  // the stuck thread cannot be joined
    }
    EXPECT_TRUE(refresh.get());
    EXPECT_GE(told.load(), 1);
    EXPECT_EQ(refreshed.load(), told.load());
}

TEST_F(ClusterConnection, WatchdogRenewsAThousandLocksWithOneBatchPerMasterPerPeriod) {
    redislock::cluster_client cc{cluster_->uri()};
    constexpr int count = 1000;
    // Leases due within a quarter of their renewal interval (lease / 12) of each other share a
    // batch, so the locks must all be taken within that: a 6 s lease (renewals every 2 s, 0.5 s
    // to share a batch), or, when a loaded machine takes longer than half of that to take them,
    // a 24 s lease (2 s to share a batch).
    std::vector<redislock::cluster_mutex> locks;
    std::chrono::milliseconds taken_in{};
    for (const auto lease : {6s, 24s}) {
        locks.clear();
        locks.reserve(count);
        for (int i = 0; i < count; ++i) {
            locks.push_back(
                cc.mutex("wd:" + std::to_string(i), {.lease = lease, .watchdog = true}));
        }
        redislock::test::stopwatch taking;
        for (auto& m : locks) {
            m.lock();
        }
        taken_in = taking.elapsed();
        if (taken_in < lease / 24) {
            break;
        }
        for (auto& m : locks) {
            m.unlock();
        }
    }
    auto& wd = cc.watchdog();
    // Between two rounds: no renewal for longer than the batches of one round can be apart.
    const auto quiet = [&] {
        return redislock::test::eventually(
            [&] {
                const auto renewals = wd.stats().renewals;
                std::this_thread::sleep_for(200ms + taken_in);
                return wd.stats().renewals == renewals;
            },
            10s);
    };
    // The first round loads the renewal script; measure a later full round.
    const auto first_round = wd.stats().renewals;
    ASSERT_TRUE(redislock::test::eventually(
        [&] { return wd.stats().renewals - first_round >= count; }, 30s));
    ASSERT_TRUE(quiet());
    const auto stats_before = wd.stats();
    std::map<std::string, std::uint64_t> before = cc.connection().round_trips_per_node();
    ASSERT_TRUE(redislock::test::eventually(
        [&] { return wd.stats().renewals - stats_before.renewals >= count; }, 30s));
    ASSERT_TRUE(quiet());
    const auto stats_after = wd.stats();
    const auto after = cc.connection().round_trips_per_node();
    const auto batches = stats_after.round_trips - stats_before.round_trips;
    std::printf("[ watchdog ] %d locks taken in %lld ms, renewed in %llu batch(es) per period\n",
                count, static_cast<long long>(taken_in.count()),
                static_cast<unsigned long long>(batches));
    EXPECT_EQ(stats_after.renewals - stats_before.renewals, std::uint64_t{count});
    EXPECT_GE(batches, 1u);
    EXPECT_LE(batches, 2u);
    int nodes_renewed = 0;
    for (const auto& [node, trips] : after) {
        const auto delta = trips - before[node];
        if (delta > 0) {
            ++nodes_renewed;
            EXPECT_EQ(delta, batches) << node << ": one pipelined round trip per node per batch";
        }
    }
    EXPECT_EQ(nodes_renewed, 3) << "renewals reached every master";
    EXPECT_EQ(stats_after.losses, 0u);
    for (auto& m : locks) {
        EXPECT_TRUE(m.owned());
        m.unlock();
    }
    for (int port : masters_) {
        const std::array<std::string_view, 3> scan{"KEYS", "wd:*"};
        EXPECT_TRUE(direct(port).execute(scan).elements().empty()) << "left behind on " << port;
    }
}

}  // namespace
