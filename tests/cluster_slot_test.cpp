// Slot hashing (detail/topology/cluster_slot.hpp) and key routing
// (detail/topology/cluster_command.hpp) against the cluster specification's vectors and a real
// cluster-enabled redis-server.

#include <gtest/gtest.h>

#include <array>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <redislock/detail/topology/cluster_command.hpp>
#include <redislock/detail/topology/cluster_slot.hpp>
#include <redislock/hiredis.hpp>

#include "support/redis_server.hpp"

namespace {

using redislock::detail::crc16;
using redislock::detail::key_slot;

TEST(ClusterSlot, Crc16MatchesTheSpecificationVector) {
    EXPECT_EQ(crc16("123456789"), 0x31C3);
    EXPECT_EQ(crc16(""), 0);
    static_assert(crc16("123456789") == 0x31C3, "crc16 is usable at compile time");
}

TEST(ClusterSlot, HashTagsFollowTheSpecificationExamples) {
    EXPECT_EQ(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
    EXPECT_EQ(key_slot("{user1000}.following"), key_slot("user1000"));
    EXPECT_EQ(key_slot("foo{}{bar}"), crc16("foo{}{bar}") % 16384);
    EXPECT_EQ(key_slot("foo{{bar}}zap"), key_slot("{bar"));
    EXPECT_EQ(key_slot("foo{bar}{zap}"), key_slot("bar"));
    EXPECT_EQ(redislock::detail::hashed_part("foo{{bar}}zap"), "{bar");
    EXPECT_EQ(redislock::detail::hashed_part("foo{}{bar}"), "foo{}{bar}");
    EXPECT_EQ(redislock::detail::hashed_part("job}1"), "job}1");
    EXPECT_EQ(redislock::detail::hashed_part("{x}"), "x");
    EXPECT_EQ(key_slot("foo"), 12182);  // CLUSTER KEYSLOT foo, as documented
}

std::vector<std::string> odd_names() {
    std::vector<std::string> names{"",         "a",         "{",
                                   "}",        "{}",        "}{",
                                   "{x}",      "x{}",       "{}x",
                                   "job}1",    "a{}b",      "a{b}c",
                                   "a{b}{c}",  "a{{b}}",    "{{}}",
                                   "{a}}",     "}{a}",      "a}b{c}",
                                   "a{b",      "orders:42", "{orders:42}:fence",
                                   "lock:{m}", "中文{锁}",  "\xff\xfe{\x01}"};
    names.push_back(std::string{"nul\0{in}side", 13});
    std::mt19937 rng{12345};
    const std::string alphabet = "ab{}:}{-_x";
    for (int i = 0; i < 300; ++i) {
        std::string name;
        const auto size = rng() % 12;
        for (std::size_t j = 0; j < size; ++j) {
            name += alphabet[rng() % alphabet.size()];
        }
        names.push_back(name);
    }
    return names;
}

TEST(ClusterSlot, MatchesClusterKeyslotOfARealNodeForOddNames) {
    const int bus_port = redislock::test::detail::pick_free_port();
    redislock::test::redis_server node{redislock::test::redis_server::options{
        false,
        {"--cluster-enabled", "yes", "--cluster-port", std::to_string(bus_port),
         "--cluster-config-file", "nodes.conf"}}};
    redislock::hiredis_connection conn{node.uri()};
    for (const std::string& name : odd_names()) {
        const std::array<std::string_view, 3> argv{"CLUSTER", "KEYSLOT", name};
        const redislock::reply r = conn.execute(argv);
        ASSERT_TRUE(r.is_integer()) << r.text();
        EXPECT_EQ(key_slot(name), r.as_integer()) << "name '" << name << "'";
    }
}

TEST(ClusterCommand, RoutingKeyOfScriptsIsTheirFirstKey) {
    using redislock::detail::routing_key;
    const std::array<std::string_view, 5> evalsha{"EVALSHA", "abc", "2", "k1", "k2"};
    EXPECT_EQ(routing_key(evalsha), "k1");
    const std::array<std::string_view, 4> no_keys{"EVALSHA", "abc", "0", "arg"};
    EXPECT_FALSE(routing_key(no_keys));
    const std::array<std::string_view, 6> set{"SET", "name", "v", "NX", "PX", "10"};
    EXPECT_EQ(routing_key(set), "name");
    const std::array<std::string_view, 3> load{"SCRIPT", "LOAD", "return 1"};
    EXPECT_FALSE(routing_key(load));
    const std::array<std::string_view, 3> hget{"hget", "h", "f"};
    EXPECT_EQ(routing_key(hget), "h");
    const std::array<std::string_view, 1> ping{"PING"};
    EXPECT_FALSE(routing_key(ping));
}

TEST(ClusterCommand, ParsesRedirections) {
    using redislock::reply;
    const auto moved =
        redislock::detail::parse_redirection(reply::error("MOVED 3999 127.0.0.1:6381"));
    ASSERT_TRUE(moved);
    EXPECT_FALSE(moved->ask);
    EXPECT_EQ(moved->slot, 3999);
    EXPECT_EQ(moved->address(), "127.0.0.1:6381");
    const auto ask = redislock::detail::parse_redirection(reply::error("ASK 1 [::1]:7000"));
    ASSERT_TRUE(ask);
    EXPECT_TRUE(ask->ask);
    EXPECT_EQ(ask->host, "::1");
    EXPECT_EQ(ask->port, 7000);
    const auto empty_host = redislock::detail::parse_redirection(reply::error("MOVED 5 :7001"));
    ASSERT_TRUE(empty_host);
    EXPECT_EQ(empty_host->host, "");
    EXPECT_FALSE(redislock::detail::parse_redirection(reply::error("ERR MOVED 1 a:1")));
    EXPECT_FALSE(redislock::detail::parse_redirection(reply::error("MOVED 99999 a:1")));
    EXPECT_FALSE(redislock::detail::parse_redirection(reply::status("MOVED 1 a:1")));
    EXPECT_TRUE(redislock::detail::is_transient_cluster_error(
        reply::error("TRYAGAIN Multiple keys request during rehashing of slot")));
    EXPECT_TRUE(redislock::detail::is_transient_cluster_error(
        reply::error("CLUSTERDOWN The cluster is down")));
    EXPECT_FALSE(redislock::detail::is_transient_cluster_error(reply::error("ERR x")));
}

}  // namespace
