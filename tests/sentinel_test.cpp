// sentinel_client against a real Sentinel topology (1 master, 2 replicas, 3 sentinels): URI
// parsing, the three lock kinds, failovers under load from threads of two processes, and what a
// client pinned to a demoted master sees.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/deadline.hpp"
#include "support/exclusion.hpp"
#include "support/reconnect_log.hpp"
#include "support/redis_sentinel.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"
#include "support/tls_certs.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::sentinel_endpoint;
using redislock::test::redis_sentinel;

std::string parse_error(std::string_view uri) {
    try {
        (void)sentinel_endpoint::from_uri(uri);
    } catch (const redislock::invalid_argument& e) {
        return e.what();
    }
    return {};
}

void expect_rejected(std::string_view uri, std::string_view why) {
    const std::string message = parse_error(uri);
    EXPECT_NE(message.find(why), std::string::npos) << "uri: " << uri << "\nmessage: " << message;
}

// Settings that cannot work are refused before any sentinel is asked (port 1 has no server: a
// connection attempt would end in connection_error instead).
TEST(SentinelEndpoint, ZeroTimeoutsAndPoolSizeAreRefusedBeforeConnecting) {
    const auto base = sentinel_endpoint::from_uri("redis-sentinel://127.0.0.1:1#mymaster");
    const auto refused = [](const sentinel_endpoint& ep) {
        return redislock::test::refusal_of([&] { return redislock::sentinel_connection{ep}; });
    };
    auto ep = base;
    ep.node.command_timeout = 0ms;
    EXPECT_NE(refused(ep).find("at least 1 ms"), std::string::npos) << refused(ep);
    ep = base;
    ep.node.connect_timeout = 0ms;
    EXPECT_NE(refused(ep).find("at least 1 ms"), std::string::npos) << refused(ep);
    ep = base;
    ep.node.pool_size = 0;
    EXPECT_NE(refused(ep).find("pool_size"), std::string::npos) << refused(ep);
}

TEST(SentinelEndpoint, LettuceFormIsParsed) {
    const auto ep = sentinel_endpoint::from_uri(
        "redis-sentinel://alice:s%40cret@127.0.0.1:26379,127.0.0.2:26380,[::1]/2"
        "?sentinel_password=spw&sentinel_user=watcher&command_timeout=700#my%20master");
    ASSERT_EQ(ep.sentinels.size(), 3U);
    EXPECT_EQ(ep.sentinels[0].host, "127.0.0.1");
    EXPECT_EQ(ep.sentinels[0].port, 26379);
    EXPECT_EQ(ep.sentinels[1].host, "127.0.0.2");
    EXPECT_EQ(ep.sentinels[1].port, 26380);
    EXPECT_EQ(ep.sentinels[2].host, "::1");
    EXPECT_EQ(ep.sentinels[2].port, 26379);  // the sentinel default
    EXPECT_EQ(ep.master_name, "my master");
    EXPECT_EQ(ep.node.user, "alice");
    EXPECT_EQ(ep.node.password, "s@cret");
    EXPECT_EQ(ep.node.db, 2);
    EXPECT_EQ(ep.node.command_timeout, 700ms);
    EXPECT_FALSE(ep.node.tls.enabled);
    EXPECT_EQ(ep.sentinel_user, "watcher");
    EXPECT_EQ(ep.sentinel_password, "spw");

    // The sentinels get their own credentials, never the data nodes'.
    const auto s = ep.sentinel(ep.sentinels[1]);
    EXPECT_EQ(s.host, "127.0.0.2");
    EXPECT_EQ(s.port, 26380);
    EXPECT_EQ(s.user, "watcher");
    EXPECT_EQ(s.password, "spw");
    EXPECT_EQ(s.db, 0);
}

TEST(SentinelEndpoint, SentinelsNeedNoCredentialsByDefault) {
    const auto ep = sentinel_endpoint::from_uri("redis-sentinel://:pw@h1#m");
    EXPECT_EQ(ep.node.password, "pw");
    EXPECT_TRUE(ep.sentinel_password.empty());
    EXPECT_TRUE(ep.sentinel(ep.sentinels[0]).password.empty());
}

TEST(SentinelEndpoint, MasterNameMayComeFromTheQuery) {
    EXPECT_EQ(sentinel_endpoint::from_uri("redis-sentinel://h1?master_name=m1").master_name, "m1");
}

TEST(SentinelEndpoint, TlsSchemeAppliesTlsOptions) {
    const auto ep =
        sentinel_endpoint::from_uri("rediss-sentinel://h1:1,h2:2?tls_ca_file=/ca.pem#m");
    EXPECT_TRUE(ep.node.tls.enabled);
    EXPECT_EQ(ep.node.tls.ca_file, "/ca.pem");
    EXPECT_TRUE(ep.sentinel(ep.sentinels[0]).tls.enabled);
    expect_rejected("redis-sentinel://h1?tls_ca_file=/ca.pem#m", "needs TLS");
}

TEST(SentinelEndpoint, BadUrisAreRejected) {
    expect_rejected("redis-sentinel://h1:26379", "no master name");
    expect_rejected("redis-sentinel://h1:26379#", "no master name");
    expect_rejected("redis://h1:26379#m", "redis-sentinel:// or rediss-sentinel://");
    expect_rejected("redis-sentinel://h1,#m", "empty sentinel address");
    expect_rejected("redis-sentinel://h1,,h2#m", "no host");
    expect_rejected("redis-sentinel://#m", "no host");
    expect_rejected("redis-sentinel://h1:0#m", "port");
    expect_rejected("redis-sentinel://h1?sentinel_pass=x#m", "unknown query option");
}

TEST(SentinelConnection, OnlyHarmlessCommandsAreRepeated) {
    using redislock::detail::safe_to_repeat;
    const auto cmd = [](std::initializer_list<std::string_view> words) {
        return std::vector<std::string_view>(words);
    };
    EXPECT_TRUE(safe_to_repeat(cmd({"EVALSHA", "abc", "1", "k"})));
    EXPECT_TRUE(safe_to_repeat(cmd({"evalsha", "abc", "1", "k"})));
    EXPECT_TRUE(safe_to_repeat(cmd({"SCRIPT", "LOAD", "return 1"})));
    EXPECT_TRUE(safe_to_repeat(cmd({"SET", "k", "v", "NX", "PX", "100"})));
    EXPECT_TRUE(safe_to_repeat(cmd({"PTTL", "k"})));
    EXPECT_FALSE(safe_to_repeat(cmd({"SET", "k", "v"})));
    EXPECT_FALSE(safe_to_repeat(cmd({"INCR", "k"})));
    EXPECT_FALSE(safe_to_repeat(cmd({"DEL", "k"})));
    EXPECT_FALSE(safe_to_repeat(cmd({})));
}

TEST(Sentinel, AllThreeLockKindsWorkThroughTheSentinels) {
    redis_sentinel topo;
    redislock::sentinel_client client{topo.uri()};
    const int master = topo.master_port();
    EXPECT_EQ(client.connection().master().port, master);
    auto& node = topo.node(master);

    auto m = client.mutex("s:mutex", {.lease = 10s});
    {
        std::unique_lock guard{m};
        EXPECT_EQ(node.cli({"EXISTS", "s:mutex"}), "1");
        EXPECT_TRUE(m.verify());
    }
    EXPECT_EQ(node.cli({"EXISTS", "s:mutex"}), "0");

    auto rm = client.recursive_mutex("s:recursive", {.lease = 10s});
    rm.lock();
    rm.lock();
    EXPECT_EQ(node.cli({"EXISTS", "s:recursive"}), "1");
    rm.unlock();
    rm.unlock();
    EXPECT_EQ(node.cli({"EXISTS", "s:recursive"}), "0");

    auto rw = client.shared_mutex("s:rw", {.lease = 10s});
    {
        std::shared_lock reader{rw};
        EXPECT_EQ(node.cli({"EXISTS", "s:rw"}), "1");
    }
    {
        std::unique_lock writer{rw};
        EXPECT_EQ(node.cli({"EXISTS", "s:rw"}), "1");
    }
    EXPECT_EQ(node.cli({"EXISTS", "s:rw"}), "0");
    EXPECT_EQ(client.connection().switches(), 0U);
}

TEST(Sentinel, UnknownMasterNameIsAClearError) {
    redis_sentinel topo;
    std::string uri = topo.uri();
    uri.replace(uri.find('#'), std::string::npos, "#nosuchmaster");
    try {
        redislock::sentinel_client client{uri};
        FAIL() << "an unknown master name must fail";
    } catch (const redislock::connection_error& e) {
        EXPECT_NE(std::string{e.what()}.find("does not know 'nosuchmaster'"), std::string::npos)
            << e.what();
    }
}

TEST(Sentinel, UnreachableSentinelsAreAClearError) {
    redislock::test::refused_port a;
    redislock::test::refused_port b;
    const std::string uri = "redis-sentinel://127.0.0.1:" + std::to_string(a.port()) +
                            ",127.0.0.1:" + std::to_string(b.port()) + "#mymaster";
    try {
        redislock::sentinel_client client{uri};
        FAIL() << "no sentinel: must fail";
    } catch (const redislock::connection_error& e) {
        EXPECT_NE(std::string{e.what()}.find("no sentinel of"), std::string::npos) << e.what();
    }
}

TEST(Sentinel, SkipsASentinelThatIsDownAndFollowsAFailoverWithoutLoad) {
    redis_sentinel topo;
    redislock::test::refused_port dead;
    std::string uri = topo.uri();
    uri.insert(uri.find("://") + 3, "127.0.0.1:" + std::to_string(dead.port()) + ",");
    redislock::sentinel_client client{uri};
    const int old_master = topo.master_port();
    EXPECT_EQ(client.connection().master().port, old_master);

    topo.failover();
    const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });
    // The subscription alone moves the client: no call has failed yet.
    EXPECT_TRUE(redislock::test::eventually(
        [&] { return client.connection().master().port == new_master; }, 5s));
    EXPECT_EQ(client.connection().switches(), 1U);
    auto m = client.mutex("s:after", {.lease = 10s});
    std::unique_lock guard{m};
    EXPECT_EQ(topo.node(new_master).cli({"EXISTS", "s:after"}), "1");
}

// Whether the sentinel on `port` has a subscriber (the client's +switch-master subscription).
bool subscribed_at(int port) {
    return !redis_sentinel::cli(port, {"CLIENT", "LIST", "TYPE", "pubsub"}).empty();
}

bool subscribed_anywhere(redis_sentinel& topo) {
    const std::vector<int> ports = topo.sentinel_ports();
    return std::any_of(ports.begin(), ports.end(), subscribed_at);
}

// A forced failover (SENTINEL FAILOVER) followed through a sentinel that does not lead it: its
// +switch-master comes while the leader still shows the new config epoch with the old master's
// address, and the old master, not yet demoted, still answers ROLE as a master. The client
// takes the address the other sentinels name and follows the new master at once, rather than
// keeping the old one until a call there is refused.
TEST(Sentinel, FollowsAForcedFailoverAnnouncedByASentinelThatDoesNotLeadIt) {
    using redislock::test::eventually;
    redis_sentinel topo;
    redislock::sentinel_client client{topo.uri()};
    const int old_master = topo.master_port();
    EXPECT_EQ(client.connection().master().port, old_master);
    const std::vector<int> sentinels = topo.sentinel_ports();
    // The subscription starts on the first sentinel, the one topo.failover() asks to lead:
    // move it to another.
    ASSERT_TRUE(eventually([&] { return subscribed_at(sentinels[0]); }, 10s));
    (void)redis_sentinel::cli(sentinels[0], {"CLIENT", "KILL", "TYPE", "pubsub"});
    ASSERT_TRUE(eventually(
        [&] {
            return !subscribed_at(sentinels[0]) &&
                   std::any_of(sentinels.begin() + 1, sentinels.end(), subscribed_at);
        },
        10s))
        << "the subscription moved to a sentinel that will not lead the failover";

    topo.failover();
    const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });
    EXPECT_TRUE(eventually([&] { return client.connection().master().port == new_master; }, 5s))
        << "the client still uses the old master " << old_master;
    EXPECT_EQ(client.connection().switches(), 1U);
    auto m = client.mutex("s:forced", {.lease = 10s});
    std::unique_lock guard{m};
    EXPECT_EQ(topo.node(new_master).cli({"EXISTS", "s:forced"}), "1");
}

// ROLE commands a data node has answered: the connection's resolutions send one to each node
// they confirm, and nothing else the tests do sends it.
long role_calls(redis_sentinel& topo, int port) {
    const std::string stats = topo.node(port).cli({"INFO", "commandstats"});
    const std::string field = "cmdstat_role:calls=";
    const auto at = stats.find(field);
    return at == std::string::npos ? 0 : std::stol(stats.substr(at + field.size()));
}

// The hook hears of reconnections to the master: its connections killed, then a failover (told
// by the subscription thread, before any call). Connections to the sentinels, killed and
// reopened on the way (the query links during the failover, then the subscription), are never
// reported.
TEST(Sentinel, ReconnectionsToTheMasterAndASwitchAreReportedAsReconnected) {
    using redislock::test::eventually;
    redis_sentinel topo;
    redislock::test::reconnect_log log;
    redislock::sentinel_client client{topo.uri(), {.on_event = log.hook()}};
    const int old_master = topo.master_port();
    const std::string old_address = "127.0.0.1:" + std::to_string(old_master);
    auto m = client.mutex("s:reconnect", {.lease = 10s});
    m.lock();
    m.unlock();
    EXPECT_EQ(log.count(), 0U) << "finding the first master is no reconnection";

    // The master's pool replaces the connections it lost.
    EXPECT_GE(topo.node(old_master).client_kill_all(), 1);
    std::this_thread::sleep_for(20ms);  // past the idle check's millisecond
    m.lock();
    m.unlock();
    ASSERT_TRUE(eventually([&] { return log.count() >= 1; }, 5s));
    for (const std::string& server : log.servers()) {
        EXPECT_EQ(server, old_address);
    }

    // A switch: a pool to the new master, named. The query links to the sentinels, killed
    // first, are reopened by the resolution that follows the switch.
    for (int port : topo.sentinel_ports()) {
        (void)redis_sentinel::cli(port, {"CLIENT", "KILL", "TYPE", "normal"});
    }
    topo.failover();
    const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });
    const std::string new_address = "127.0.0.1:" + std::to_string(new_master);
    EXPECT_TRUE(eventually([&] { return log.count(new_address) >= 1; }, 10s))
        << "no reconnected event named the new master " << new_address;
    EXPECT_EQ(client.connection().switches(), 1U);
    m.lock();
    EXPECT_EQ(topo.node(new_master).cli({"EXISTS", "s:reconnect"}), "1");
    m.unlock();

    // The subscription: killed, it moves to a sentinel, checks the master there, and nothing
    // is reported.
    const std::size_t after_switch = log.count();
    const long roles_before = role_calls(topo, new_master);
    for (int port : topo.sentinel_ports()) {
        (void)redis_sentinel::cli(port, {"CLIENT", "KILL", "TYPE", "pubsub"});
    }
    ASSERT_TRUE(eventually([&] { return subscribed_anywhere(topo); }, 10s))
        << "the subscription came back";
    // Its check of the master ends with ROLE there; what it would report comes right after.
    ASSERT_TRUE(eventually([&] { return role_calls(topo, new_master) > roles_before; }, 10s))
        << "the subscription checked the master";
    std::this_thread::sleep_for(100ms);
    m.lock();
    m.unlock();
    EXPECT_EQ(log.count(), after_switch);
    EXPECT_EQ(client.connection().switches(), 1U);
    for (const std::string& server : log.servers()) {
        EXPECT_TRUE(server == old_address || server == new_address) << server;
    }
    EXPECT_EQ(log.about_a_lock(), 0U);
}

// The subscription, killed, resubscribes and checks the master with ROLE over the master's
// pool, whose only connection the master had closed: the reconnection is reported once the
// check is over and its connection given back, so a handler that calls into the connection
// gets its answer (it neither waits for the connection the check holds nor for the check).
TEST(Sentinel, ReconnectHandlerMayCallIntoTheConnectionDuringACheckOfTheMaster) {
    using redislock::test::eventually;
    redis_sentinel topo;
    std::mutex answers_mutex;
    std::vector<std::string> answers;
    redislock::sentinel_connection conn{topo.uri("pool_size=1")};
    conn.set_reconnect_handler([&](std::string_view) {
        const std::array<std::string_view, 1> ping{"PING"};
        std::string answer;
        try {
            answer = conn.execute(ping).text();
        } catch (const std::exception& e) {
            answer = e.what();
        }
        std::lock_guard lock{answers_mutex};
        answers.push_back(answer);
    });
    const auto told = [&] {
        std::lock_guard lock{answers_mutex};
        return answers.size();
    };
    const int master = topo.master_port();
    const std::array<std::string_view, 1> ping{"PING"};
    EXPECT_EQ(conn.execute(ping).text(), "PONG");
    ASSERT_TRUE(eventually([&] { return subscribed_anywhere(topo); }, 10s))
        << "the subscription is up";
    ASSERT_EQ(told(), 0U);

    const long roles_before = role_calls(topo, master);
    EXPECT_GE(topo.node(master).client_kill_all(), 1);
    for (int port : topo.sentinel_ports()) {
        (void)redis_sentinel::cli(port, {"CLIENT", "KILL", "TYPE", "pubsub"});
    }
    if (!eventually([&] { return told() >= 1; }, 10s)) {
        ADD_FAILURE() << "the handler did not finish; ROLE calls on the master: "
                      << role_calls(topo, master) - roles_before;
        std::abort();  // the subscription thread is stuck: the connection cannot be destroyed
    }
    EXPECT_GT(role_calls(topo, master), roles_before);
    std::lock_guard lock{answers_mutex};
    for (const std::string& answer : answers) {
        EXPECT_EQ(answer, "PONG");
    }
}

#if defined(REDISLOCK_HAVE_TLS) && REDISLOCK_HAVE_TLS

TEST(Sentinel, TlsToSentinelsAndDataNodesFollowsAFailover) {
    redislock::test::tls_certs certs;
    redis_sentinel topo{
        redis_sentinel::tls_files{certs.server_cert(), certs.server_key(), certs.ca_file()}};
    ASSERT_TRUE(topo.uri().starts_with("rediss-sentinel://"));
    redislock::sentinel_client client{topo.uri()};
    const int old_master = topo.master_port();
    EXPECT_EQ(client.connection().master().port, old_master);
    EXPECT_TRUE(client.connection().master().tls.enabled);
    auto before = client.mutex("s:tls-before", {.lease = 10s});
    ASSERT_TRUE(before.try_lock());
    EXPECT_EQ(topo.node(old_master).cli({"EXISTS", "s:tls-before"}), "1");

    topo.failover();
    const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });
    EXPECT_TRUE(redislock::test::eventually(
        [&] { return client.connection().master().port == new_master; }, 5s));
    auto after = client.mutex("s:tls-after", {.lease = 10s});
    std::unique_lock guard{after};
    EXPECT_EQ(topo.node(new_master).cli({"EXISTS", "s:tls-after"}), "1");
    EXPECT_TRUE(before.verify());  // replicated before the failover, still ours on the new master
    before.unlock();
}

#else

TEST(Sentinel, RedissSentinelWithoutTlsSupportSaysWhatToInstall) {
    try {
        redislock::sentinel_client client{"rediss-sentinel://127.0.0.1:26379#mymaster"};
        FAIL() << "rediss-sentinel:// must be refused without TLS support";
    } catch (const redislock::invalid_argument& e) {
        EXPECT_NE(std::string{e.what()}.find("hiredis_ssl"), std::string::npos) << e.what();
    }
}

#endif

// The master is made a replica behind the sentinels' back (they still name it): a write gets
// READONLY, the client asks again, ROLE no longer says master, and the node is dropped rather
// than used. Once it is a master again the client comes back to it.
TEST(Sentinel, DemotedNodeIsNeverUsedEvenWhileTheSentinelsStillNameIt) {
    redis_sentinel topo;
    redislock::test::redis_server elsewhere;
    redislock::sentinel_client client{topo.uri()};
    const int master = topo.master_port();
    auto m = client.mutex("s:demoted", {.lease = 10s});

    topo.node(master).cli({"REPLICAOF", "127.0.0.1", std::to_string(elsewhere.port())});
    try {
        (void)m.try_lock();
        ADD_FAILURE() << "a lock was taken through a node that is no longer a master";
    } catch (const redislock::connection_error& e) {
        EXPECT_NE(std::string{e.what()}.find("is not a master"), std::string::npos) << e.what();
    }
    EXPECT_EQ(topo.node(master).cli({"EXISTS", "s:demoted"}), "0");

    topo.node(master).cli({"REPLICAOF", "NO", "ONE"});
    EXPECT_TRUE(m.try_lock());
    EXPECT_EQ(topo.node(master).cli({"EXISTS", "s:demoted"}), "1");
    m.unlock();
}

// A child forked while the parent's client is in use takes locks through its copy of the client
// with connections and a subscription thread of its own; the parent's keep working.
TEST(Sentinel, ForkedChildUsesItsOwnConnectionsAndThread) {
#if defined(__SANITIZE_THREAD__)
    GTEST_SKIP() << "ThreadSanitizer cannot run a thread started in a child forked from a "
                    "multi-threaded process, which is what this test checks";
#endif
    redis_sentinel topo;
    redislock::sentinel_client client{topo.uri()};
    auto parent_lock = client.mutex("s:parent", {.lease = 10s});
    ASSERT_TRUE(parent_lock.try_lock());

    redislock::test::child_process child{[&](redislock::test::line_channel& channel) {
        auto m = client.mutex("s:child", {.lease = 10s});
        if (!m.try_lock()) {
            return 1;
        }
        channel.send(topo.node(client.connection().master().port).cli({"EXISTS", "s:child"}));
        m.unlock();
        return 0;
    }};
    EXPECT_EQ(child.channel().receive(20s), std::optional<std::string>{"1"});
    EXPECT_EQ(child.wait(20s), std::optional<int>{0});
    EXPECT_TRUE(parent_lock.verify());
    parent_lock.unlock();
    EXPECT_EQ(topo.node(topo.master_port()).cli({"EXISTS", "s:parent"}), "0");
}

// Drives `scenario` on a thread of this process while processes x threads contend for one
// mutex through sentinel_client. Critical sections are checked outside Redis (intervals on
// CLOCK_MONOTONIC, and a counter on an independent server). Every acquisition waits for one
// replica's acknowledgement (min_replicas = 1), so a failover cannot lose a lock that was
// granted; an acquisition that no replica acknowledges is undone and counted as a failed
// attempt. Returns the report and the longest
// time without any critical section after `scenario` started its disruption.
struct load_result {
    redislock::test::exclusion_report report;
    std::int64_t longest_gap_ms = 0;
    std::int64_t disrupted_ns = 0;
    int failed_attempts = 0;
    std::uint64_t switches = 0;
};

template <class Scenario>
load_result run_under_load(redis_sentinel& topo, std::chrono::milliseconds run_for,
                           Scenario scenario) {
    redislock::test::redis_server counter_server;
    const std::int64_t end_ns =
        redislock::test::monotonic_ns() +
        std::chrono::duration_cast<std::chrono::nanoseconds>(run_for).count();
    std::atomic<std::int64_t> disrupted_ns{0};
    std::atomic<int> failed_attempts{0};
    std::atomic<std::uint64_t> switches{0};  // as this process's client counts them
    std::jthread driver;
    const std::string uri = topo.uri("command_timeout=500&connect_timeout=500");

    redislock::test::exclusion_options options{.uri = counter_server.uri(),
                                               .processes = 2,
                                               .threads = 3,
                                               .iterations = 200'000,
                                               .time_limit = run_for + 30s};
    load_result result;
    result.report = redislock::test::run_exclusion(options, [&](int process) {
        auto client = std::make_shared<redislock::sentinel_client>(uri);
        if (process == 0) {
            driver = std::jthread{[&] { scenario(disrupted_ns); }};
        }
        return [client, end_ns, &failed_attempts, &switches](int) {
            auto lock = std::make_shared<redislock::basic_mutex<redislock::sentinel_connection>>(
                client->mutex("s:load",
                              {.lease = 2s, .min_replicas = 1, .replica_timeout = 200ms}));
            return [client, lock, end_ns, &failed_attempts, &switches](
                       std::mt19937_64&, const std::function<void()>& critical) {
                switches = client->connection().switches();
                while (redislock::test::monotonic_ns() < end_ns) {
                    try {
                        if (!lock->try_lock_for(500ms)) {
                            continue;
                        }
                    } catch (const redislock::error&) {
                        failed_attempts.fetch_add(1);
                        std::this_thread::sleep_for(20ms);
                        continue;
                    }
                    critical();
                    lock->unlock();
                    return;
                }
            };
        };
    });
    driver = {};
    result.disrupted_ns = disrupted_ns.load();
    result.failed_attempts = failed_attempts.load();
    result.switches = switches.load();

    auto intervals = result.report.intervals;
    std::sort(intervals.begin(), intervals.end(),
              [](const auto& a, const auto& b) { return a.enter_ns < b.enter_ns; });
    std::int64_t left = result.disrupted_ns;
    for (const auto& interval : intervals) {
        if (interval.enter_ns < result.disrupted_ns) {
            left = std::max(left, interval.exit_ns);
            continue;
        }
        result.longest_gap_ms =
            std::max(result.longest_gap_ms, (interval.enter_ns - left) / 1'000'000);
        left = std::max(left, interval.exit_ns);
    }
    if (intervals.empty() || intervals.back().enter_ns < result.disrupted_ns) {
        result.longest_gap_ms = -1;  // nothing after the disruption
    }
    return result;
}

void expect_exclusion_and_recovery(const load_result& r, const char* what) {
    std::cout << "[ measured ] " << what << ": " << r.report.completed
              << " critical sections, longest pause after the disruption " << r.longest_gap_ms
              << " ms, " << r.failed_attempts << " failed attempts, " << r.switches
              << " master switch(es) followed\n";
    EXPECT_GE(r.switches, 1U) << "the client never moved to the new master";
    EXPECT_TRUE(r.report.errors.empty()) << r.report.describe();
    EXPECT_FALSE(r.report.overlap().has_value()) << r.report.describe();
    EXPECT_EQ(r.report.counter, r.report.completed) << r.report.describe();
    EXPECT_GE(r.longest_gap_ms, 0) << "no critical section after the disruption";
    EXPECT_LT(r.longest_gap_ms, 10'000) << r.report.describe();
}

TEST(Sentinel, SentinelFailoverUnderLoadKeepsExclusionAndResumes) {
    redis_sentinel topo;
    const int old_master = topo.master_port();
    const auto r = run_under_load(topo, 9s, [&](std::atomic<std::int64_t>& disrupted) {
        std::this_thread::sleep_for(1500ms);
        disrupted = redislock::test::monotonic_ns();
        topo.failover();
        const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });
        std::cout << "[ measured ] SENTINEL FAILOVER: all sentinels name the new master after "
                  << (redislock::test::monotonic_ns() - disrupted.load()) / 1'000'000 << " ms\n";
        (void)new_master;
    });
    expect_exclusion_and_recovery(r, "SENTINEL FAILOVER");
}

TEST(Sentinel, KillOfTheNewMasterUnderLoadKeepsExclusionAndResumes) {
    redis_sentinel topo;
    const int first = topo.master_port();
    topo.failover();
    const int second = topo.wait_agreed_master([&](int p) { return p != first; });
    // As the sentinels would after their 10 s INFO period: the demoted master follows the new.
    topo.repoint(first, second);

    const auto r = run_under_load(topo, 12s, [&](std::atomic<std::int64_t>& disrupted) {
        std::this_thread::sleep_for(1500ms);
        disrupted = redislock::test::monotonic_ns();
        topo.kill_node(second);
        topo.wait_agreed_master([&](int p) { return p != second; });
        std::cout << "[ measured ] kill -9 of the master: all sentinels name the new master after "
                  << (redislock::test::monotonic_ns() - disrupted.load()) / 1'000'000 << " ms\n";
    });
    expect_exclusion_and_recovery(r, "kill -9 of the new master");
}

// A client pinned to one address (redis://old-master) cannot follow a failover. Once the
// demoted master is made a replica (REPLICAOF, as the sentinels do after ~10 s), the lock it
// took there during the split-brain window is gone, and the owner must be told.
TEST(Sentinel, PinnedClientLearnsItsLockOnTheDemotedMasterIsLost) {
    redis_sentinel topo;
    const int old_master = topo.master_port();
    redislock::client pinned{"redis://127.0.0.1:" + std::to_string(old_master)};
    topo.failover();
    const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });

    redislock::test::lost_counter lost;
    auto m = pinned.mutex("s:pinned", {.lease = 1s, .watchdog = true, .on_lost = lost.handler()});
    ASSERT_TRUE(m.try_lock()) << "the demoted master still accepts writes (split brain)";
    EXPECT_TRUE(m.verify());

    redislock::test::stopwatch since_repoint;
    topo.repoint(old_master, new_master);
    EXPECT_TRUE(redislock::test::eventually([&] { return lost.calls.load() > 0; }, 5s))
        << "on_lost was not called";
    std::cout << "[ measured ] pinned client (lock taken after the failover): on_lost after "
              << since_repoint.elapsed().count() << " ms\n";
    EXPECT_FALSE(m.verify());
    EXPECT_EQ(lost.calls.load(), 1);
    m.unlock();
}

// The same, for a lock taken before the failover: it was replicated, so the new master has it
// too (until its lease runs out there, since renewals go to the old node), and the old node, now
// a replica, refuses renewals with READONLY.
TEST(Sentinel, PinnedClientLearnsItsReplicatedLockIsLostAfterTheFailover) {
    redis_sentinel topo;
    const int old_master = topo.master_port();
    redislock::client pinned{"redis://127.0.0.1:" + std::to_string(old_master)};
    redislock::test::lost_counter lost;
    auto m =
        pinned.mutex("s:replicated", {.lease = 1s, .watchdog = true, .on_lost = lost.handler()});
    ASSERT_TRUE(m.try_lock());

    topo.failover();
    const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });
    redislock::test::stopwatch since_repoint;
    topo.repoint(old_master, new_master);
    EXPECT_TRUE(redislock::test::eventually([&] { return lost.calls.load() > 0; }, 5s))
        << "on_lost was not called";
    std::cout << "[ measured ] pinned client (lock taken before the failover): on_lost after "
              << since_repoint.elapsed().count() << " ms, verify() " << m.verify() << "\n";
    EXPECT_FALSE(m.verify());
    m.unlock();
}

// A lock whose lease outlives the failover: the new master still holds it (with this owner's
// token) when the old node becomes a replica, so renewals sent to the old node are refused with
// READONLY while GET there still shows the token. The owner must not go on believing it holds
// a lock it can no longer renew: on_lost no later than its lease.
TEST(Sentinel, PinnedClientWhoseRenewalsAreRefusedAsReadonlyLearnsTheLockIsLost) {
    redis_sentinel topo;
    const int old_master = topo.master_port();
    redislock::client pinned{"redis://127.0.0.1:" + std::to_string(old_master)};
    redislock::test::lost_counter lost;
    redislock::test::stopwatch since_lock;
    auto m = pinned.mutex("s:readonly", {.lease = 6s, .watchdog = true, .on_lost = lost.handler()});
    ASSERT_TRUE(m.try_lock());

    topo.failover();
    const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });
    redislock::test::stopwatch since_repoint;
    topo.repoint(old_master, new_master);
    ASSERT_EQ(topo.node(old_master).cli({"EXISTS", "s:readonly"}), "1")
        << "the scenario needs the lock still present on the new master";
    EXPECT_TRUE(redislock::test::eventually([&] { return lost.calls.load() > 0; }, 8s))
        << "on_lost was not called";
    std::cout << "[ measured ] pinned client, renewals refused with READONLY: on_lost after "
              << since_repoint.elapsed().count() << " ms from the re-point, "
              << since_lock.elapsed().count() << " ms from the acquisition (lease 6000 ms)\n";
    EXPECT_LE(since_lock.elapsed(), 7000ms) << "loss must be told by the end of the lease (6 s)";
    // The loss is told locally (owned(), lost_token()); verify() on the old node, now a replica,
    // is covered by VerifyOnADemotedMasterThatBecameAReplicaIsFalse below.
    EXPECT_FALSE(m.owned());
    EXPECT_TRUE(m.lost_token().stop_requested());
    EXPECT_EQ(lost.calls.load(), 1);
    m.unlock();
}

// A replica answers GET from its copy: on the demoted master, right after it became a replica,
// the token is still there although no renewal can succeed. verify() also asks ROLE, so it is
// false there.
TEST(Sentinel, VerifyOnADemotedMasterThatBecameAReplicaIsFalse) {
    redis_sentinel topo;
    const int old_master = topo.master_port();
    redislock::client pinned{"redis://127.0.0.1:" + std::to_string(old_master)};
    auto m = pinned.mutex("s:verify", {.lease = 30s});
    ASSERT_TRUE(m.try_lock());
    topo.failover();
    const int new_master = topo.wait_agreed_master([&](int p) { return p != old_master; });
    topo.repoint(old_master, new_master);
    ASSERT_EQ(topo.node(old_master).cli({"EXISTS", "s:verify"}), "1");
    EXPECT_FALSE(m.verify());
    m.unlock();
}

// Every timed call returns by its deadline plus deadline_slack (support/deadline.hpp), and a stop
// request ends lock(stop) at once, while the master hangs (SIGSTOP), the sentinels notice it and
// fail over: the master's commands, the sentinels' queries and the connections to the new master
// get what the call has left.
TEST(Sentinel, TimedCallsEndInTimeWhileTheMasterHangsAndIsReplaced) {
    redis_sentinel topo;
    redislock::sentinel_client client{topo.uri()};
    auto m = client.mutex("s:deadline", {.lease = 10s});
    auto rm = client.recursive_mutex("s:deadline:r", {.lease = 10s});
    ASSERT_TRUE(m.try_lock_for(5s));
    m.unlock();
    const int master = topo.master_port();
    std::vector<std::string> late;
    {
        // A wait for a lock held by another client, its lease longer than the wait, during which
        // the master hangs: no attempt goes out past the deadline, none gets more than is left.
        redislock::sentinel_client holder{topo.uri()};
        auto held = holder.mutex("s:deadline:held", {.lease = 30s});
        ASSERT_TRUE(held.try_lock());
        auto waiting = client.mutex("s:deadline:held", {.lease = 10s});
        const auto deadline = std::chrono::steady_clock::now() + 2s;
        std::thread hang_soon{[&] {
            std::this_thread::sleep_for(500ms);
            topo.node(master).pause();
        }};
        bool got = false;
        const auto end =
            redislock::test::run_to_end([&] { got = waiting.try_lock_until(deadline); });
        hang_soon.join();
        EXPECT_FALSE(got);
        if (!end.by(deadline)) {
            late.push_back("wait for a held lock, try_lock_until(+2000 ms): " +
                           end.late_after(deadline) + end.how);
        }
    }
    int calls = 1;
    const auto began = std::chrono::steady_clock::now();
    const auto check = [&](const std::string& what, std::chrono::steady_clock::time_point bound,
                           const redislock::test::call_end& end) {
        ++calls;
        if (!end.by(bound)) {
            late.push_back(what + ": " + end.late_after(bound) + end.how);
        }
    };
    // Through the failure detection (1 s) and the failover (about 2.4 s after the stop).
    for (int round = 0; std::chrono::steady_clock::now() - began < 5s && round < 20; ++round) {
        for (const auto timeout : {50ms, 300ms, 2000ms}) {
            const auto deadline = std::chrono::steady_clock::now() + timeout;
            bool got = false;
            auto end = redislock::test::run_to_end([&] { got = m.try_lock_until(deadline); });
            if (got) {
                m.unlock();
            }
            check("mutex try_lock_until(+" + std::to_string(timeout.count()) + " ms)", deadline,
                  end);
            const auto reentrant_deadline = std::chrono::steady_clock::now() + timeout;
            got = false;
            end = redislock::test::run_to_end([&] { got = rm.try_lock_until(reentrant_deadline); });
            if (got) {
                rm.unlock();
            }
            check("recursive try_lock_until(+" + std::to_string(timeout.count()) + " ms)",
                  reentrant_deadline, end);
        }
        redislock::test::stop_after stop{100ms};
        bool got = false;
        const auto end = redislock::test::run_to_end([&] { got = m.lock(stop.token()); });
        if (got) {
            m.unlock();
        }
        check("mutex lock(stop), stopped after 100 ms", stop.requested_at(), end);
    }
    topo.node(master).resume();
    std::string report;
    for (const auto& l : late) {
        report += "\n  " + l;
    }
    EXPECT_TRUE(late.empty()) << late.size() << " of " << calls << " calls late:" << report;
}

}  // namespace
