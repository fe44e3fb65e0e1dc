#include <redislock/script.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <redislock/detail/scripts.hpp>
#include <redislock/hiredis.hpp>

#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::hiredis_connection;
using redislock::reply;
using redislock::detail::run_script;
using redislock::test::fault;
using redislock::test::fault_connection;
using redislock::test::redis_server;
namespace scripts = redislock::detail::scripts;

using keys1 = std::array<std::string_view, 1>;
using keys2 = std::array<std::string_view, 2>;
using args0 = std::array<std::string_view, 0>;
using args2 = std::array<std::string_view, 2>;

constexpr std::array all_scripts{scripts::mutex_acquire_fenced, scripts::mutex_extend,
                                 scripts::mutex_probe, scripts::mutex_release};

reply run(hiredis_connection& conn, std::initializer_list<std::string_view> words) {
    const std::vector<std::string_view> argv{words};
    return conn.execute(argv);
}

reply acquire_fenced(hiredis_connection& conn, std::string_view token, std::string_view lease) {
    return run_script(conn, scripts::mutex_acquire_fenced, keys2{"lock", "{lock}:fence"},
                      args2{token, lease});
}

// The server's clock in microseconds, the clock fencing tokens never fall below.
std::int64_t server_us(const redis_server& srv) {
    std::istringstream in{srv.cli({"TIME"})};
    std::int64_t seconds = 0;
    std::int64_t micros = 0;
    in >> seconds >> micros;
    return seconds * 1'000'000 + micros;
}

// The fencing token of a reply that says the lock was taken; fails the test and gives -1 for
// any other reply.
std::int64_t taken_fence(const reply& r) {
    if (!r.is_array() || r.elements().size() != 2 || r.elements()[0] != reply::integer(1) ||
        !r.elements()[1].is_integer()) {
        ADD_FAILURE() << "not {1, fence}: kind " << static_cast<int>(r.kind()) << ", "
                      << r.elements().size() << " elements, text '" << r.text() << "'";
        return -1;
    }
    return r.elements()[1].as_integer();
}

// One script found in the generated header by reading its text.
struct header_script {
    std::string name;
    std::string source;
    std::string sha1;
};

std::vector<header_script> scripts_in_header() {
    const auto path = std::filesystem::path{__FILE__}.parent_path().parent_path() / "include" /
                      "redislock" / "detail" / "scripts.hpp";
    std::ifstream in{path};
    const std::string text{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
    std::vector<header_script> found;
    constexpr std::string_view intro = "inline constexpr script ";
    constexpr std::string_view open = "R\"lua(";
    constexpr std::string_view close = ")lua\"";
    for (auto at = text.find(intro); at != std::string::npos; at = text.find(intro, at + 1)) {
        const auto name_start = at + intro.size();
        const auto brace = text.find('{', name_start);
        const auto src_start = text.find(open, brace);
        const auto src_end = text.find(close, src_start);
        const auto sha_start = text.find('"', src_end + close.size());
        const auto sha_end = text.find('"', sha_start + 1);
        if (brace == std::string::npos || src_start == std::string::npos ||
            src_end == std::string::npos || sha_end == std::string::npos) {
            break;
        }
        found.push_back({text.substr(name_start, brace - name_start),
                         text.substr(src_start + open.size(), src_end - src_start - open.size()),
                         text.substr(sha_start + 1, sha_end - sha_start - 1)});
    }
    return found;
}

TEST(Script, EmbeddedSha1IsWhatScriptLoadReturns) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    for (const auto& s : all_scripts) {
        SCOPED_TRACE(std::string{s.name});
        EXPECT_EQ(s.sha1.size(), 40U);
        EXPECT_TRUE(std::all_of(s.sha1.begin(), s.sha1.end(), [](char c) {
            return std::isdigit(static_cast<unsigned char>(c)) || (c >= 'a' && c <= 'f');
        }));
        EXPECT_EQ(run(conn, {"SCRIPT", "LOAD", s.source}), reply::string(std::string{s.sha1}));
    }
}

TEST(Script, EveryScriptInTheGeneratedHeaderLoadsToItsSha1) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    const auto found = scripts_in_header();
    // The header holds at least the scripts this file names, so the parse cannot come up empty.
    ASSERT_GE(found.size(), all_scripts.size());
    for (const auto& s : all_scripts) {
        EXPECT_TRUE(std::any_of(found.begin(), found.end(), [&](const header_script& h) {
            return h.name == s.name;
        })) << s.name;
    }
    for (const auto& h : found) {
        SCOPED_TRACE(h.name);
        EXPECT_EQ(run(conn, {"SCRIPT", "LOAD", h.source}), reply::string(h.sha1));
    }
}

TEST(Script, EvalshaRunsAScriptAlreadyLoaded) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SCRIPT", "LOAD", std::string{scripts::mutex_probe.source}}),
              scripts::mutex_probe.sha1);
    EXPECT_EQ(run_script(conn, scripts::mutex_probe, keys1{"free"}, args0{}), reply::integer(-2));
    EXPECT_EQ(conn.log(), (std::vector<std::string>{"EVALSHA mutex_probe"}));
}

TEST(Script, NoscriptLoadsTheScriptAndRetriesOnce) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SCRIPT", "EXISTS", std::string{scripts::mutex_probe.sha1}}), "0");

    EXPECT_EQ(run_script(conn, scripts::mutex_probe, keys1{"free"}, args0{}), reply::integer(-2));
    EXPECT_EQ(conn.log(), (std::vector<std::string>{"EVALSHA mutex_probe", "SCRIPT LOAD",
                                                    "EVALSHA mutex_probe"}));
    EXPECT_EQ(srv.cli({"SCRIPT", "EXISTS", std::string{scripts::mutex_probe.sha1}}), "1");
}

TEST(Script, ScriptFlushIsRecoveredByTheNextCall) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(run_script(conn, scripts::mutex_probe, keys1{"free"}, args0{}), reply::integer(-2));
    ASSERT_EQ(srv.cli({"SCRIPT", "FLUSH"}), "OK");
    EXPECT_EQ(run_script(conn, scripts::mutex_probe, keys1{"free"}, args0{}), reply::integer(-2));
}

TEST(Script, ServerRestartIsRecoveredByTheNextCall) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(run_script(conn, scripts::mutex_probe, keys1{"free"}, args0{}), reply::integer(-2));
    srv.restart();
    EXPECT_EQ(run_script(conn, scripts::mutex_probe, keys1{"free"}, args0{}), reply::integer(-2));
}

TEST(Script, SecondNoscriptIsReturnedNotLooped) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    conn.inject(fault::answer_noscript, "EVALSHA", 2);
    const reply r = run_script(conn, scripts::mutex_probe, keys1{"free"}, args0{});
    EXPECT_TRUE(r.is_error_code("NOSCRIPT")) << r.text();
    EXPECT_EQ(conn.log(), (std::vector<std::string>{"EVALSHA mutex_probe", "SCRIPT LOAD",
                                                    "EVALSHA mutex_probe"}));
}

TEST(Script, RefusedScriptLoadThrowsServerErrorNamingTheScript) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    conn.inject(fault::answer_noscript, "EVALSHA");
    conn.inject(fault::answer_error, "SCRIPT", 1, std::nullopt, "ERR scripting is disabled");
    try {
        (void)run_script(conn, scripts::mutex_probe, keys1{"free"}, args0{});
        FAIL() << "a refused SCRIPT LOAD must throw";
    } catch (const redislock::server_error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("mutex_probe"), std::string::npos) << what;
        EXPECT_NE(what.find("scripting is disabled"), std::string::npos) << what;
    }
}

TEST(Script, ConnectionErrorPropagates) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    conn.inject(fault::throw_before_send, "EVALSHA");
    EXPECT_THROW((void)run_script(conn, scripts::mutex_probe, keys1{"free"}, args0{}),
                 redislock::connection_error);
}

TEST(Script, OtherErrorRepliesAreReturnedAsReplies) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "lock", "f", "v"}), "1");
    const reply r = run_script(conn, scripts::mutex_probe, keys1{"lock"}, args0{});
    EXPECT_TRUE(r.is_error_code("WRONGTYPE")) << r.text();
}

// mutex_acquire_fenced

TEST(MutexAcquireFencedScript, FreeNameIsTakenWithTheNextFencingToken) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    // With no counter yet, the token is the server's clock in microseconds.
    const std::int64_t before = server_us(srv);
    const std::int64_t first = taken_fence(acquire_fenced(conn, "t1", "5000"));
    EXPECT_GE(first, before);
    EXPECT_LE(first, server_us(srv));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "t1");
    const int pttl = std::stoi(srv.cli({"PTTL", "lock"}));
    EXPECT_GT(pttl, 0);
    EXPECT_LE(pttl, 5000);
    EXPECT_EQ(srv.cli({"GET", "{lock}:fence"}), std::to_string(first));
    // The counter expires a day after its last use, long after every lease.
    const std::int64_t counter_ttl = std::stoll(srv.cli({"PTTL", "{lock}:fence"}));
    EXPECT_GT(counter_ttl, 86'000'000);
    EXPECT_LE(counter_ttl, 86'400'000);

    ASSERT_EQ(srv.cli({"DEL", "lock"}), "1");
    const std::int64_t second = taken_fence(acquire_fenced(conn, "t2", "5000"));
    EXPECT_GT(second, first);
    EXPECT_EQ(srv.cli({"GET", "{lock}:fence"}), std::to_string(second));

    // A counter ahead of the clock continues from whatever it holds.
    ASSERT_EQ(srv.cli({"DEL", "lock"}), "1");
    ASSERT_EQ(srv.cli({"SET", "{lock}:fence", "5000000000000000"}), "OK");
    EXPECT_EQ(acquire_fenced(conn, "t3", "5000"),
              reply::array({reply::integer(1), reply::integer(5'000'000'000'000'001)}));
    EXPECT_EQ(srv.cli({"GET", "{lock}:fence"}), "5000000000000001");
    EXPECT_GT(std::stoll(srv.cli({"PTTL", "{lock}:fence"})), 86'000'000);
}

// Everything that can fail is checked before the first write: no partial write.
TEST(MutexAcquireFencedScript, CounterThatIsNotAnIntegerIsWrongtypeAndTheLockStaysUnset) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "{lock}:fence", "not-a-number"}), "OK");
    const reply r = acquire_fenced(conn, "mine", "5000");
    EXPECT_TRUE(r.is_error_code("WRONGTYPE")) << r.text();
    EXPECT_EQ(srv.cli({"EXISTS", "lock"}), "0");
    EXPECT_EQ(srv.cli({"GET", "{lock}:fence"}), "not-a-number");
    EXPECT_EQ(srv.cli({"PTTL", "{lock}:fence"}), "-1");

    // A counter of another type fails the same way, before anything is written.
    ASSERT_EQ(srv.cli({"DEL", "{lock}:fence"}), "1");
    ASSERT_EQ(srv.cli({"HSET", "{lock}:fence", "f", "v"}), "1");
    const reply on_hash = acquire_fenced(conn, "mine", "5000");
    EXPECT_TRUE(on_hash.is_error_code("WRONGTYPE")) << on_hash.text();
    EXPECT_EQ(srv.cli({"EXISTS", "lock"}), "0");
    EXPECT_EQ(srv.cli({"TYPE", "{lock}:fence"}), "hash");
}

TEST(MutexAcquireFencedScript, HeldNameReturnsTheHoldersPttlAndDrawsNoToken) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other", "PX", "8000"}), "OK");
    const reply r = acquire_fenced(conn, "mine", "5000");
    ASSERT_TRUE(r.is_array());
    ASSERT_EQ(r.elements().size(), 2U);
    EXPECT_EQ(r.elements()[0], reply::integer(0));
    EXPECT_GT(r.elements()[1].as_integer(), 5000);
    EXPECT_LE(r.elements()[1].as_integer(), 8000);
    EXPECT_EQ(srv.cli({"GET", "lock"}), "other");
    EXPECT_EQ(srv.cli({"EXISTS", "{lock}:fence"}), "0");
}

TEST(MutexAcquireFencedScript, HolderWithoutLeaseGivesMinusOne) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other"}), "OK");
    EXPECT_EQ(acquire_fenced(conn, "mine", "5000"),
              reply::array({reply::integer(0), reply::integer(-1)}));
}

TEST(MutexAcquireFencedScript, KeyOfAnotherTypeIsWrongtype) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "lock", "f", "v"}), "1");
    const reply r = acquire_fenced(conn, "mine", "5000");
    EXPECT_TRUE(r.is_error_code("WRONGTYPE")) << r.text();
    EXPECT_EQ(srv.cli({"TYPE", "lock"}), "hash");
}

// mutex_extend

TEST(MutexExtendScript, OwnLockGetsTheNewLease) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "mine", "PX", "1000"}), "OK");
    EXPECT_EQ(run_script(conn, scripts::mutex_extend, keys1{"lock"}, args2{"mine", "60000"}),
              reply::integer(1));
    EXPECT_GT(std::stoi(srv.cli({"PTTL", "lock"})), 30000);
}

TEST(MutexExtendScript, SomeoneElsesLockIsLeftAlone) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other", "PX", "1000"}), "OK");
    EXPECT_EQ(run_script(conn, scripts::mutex_extend, keys1{"lock"}, args2{"mine", "60000"}),
              reply::integer(0));
    EXPECT_LE(std::stoi(srv.cli({"PTTL", "lock"})), 1000);
}

TEST(MutexExtendScript, MissingLockIsNotCreated) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    EXPECT_EQ(run_script(conn, scripts::mutex_extend, keys1{"lock"}, args2{"mine", "60000"}),
              reply::integer(0));
    EXPECT_EQ(srv.cli({"EXISTS", "lock"}), "0");
}

TEST(MutexExtendScript, KeyOfAnotherTypeIsAnErrorReply) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "lock", "f", "v"}), "1");
    const reply r = run_script(conn, scripts::mutex_extend, keys1{"lock"}, args2{"mine", "100"});
    EXPECT_TRUE(r.is_error()) << r.text();
    EXPECT_NE(r.text().find("WRONGTYPE"), std::string::npos) << r.text();
    EXPECT_EQ(srv.cli({"PTTL", "lock"}), "-1");
}

// mutex_probe

TEST(MutexProbeScript, HeldLockGivesItsPttl) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other", "PX", "7000"}), "OK");
    const reply r = run_script(conn, scripts::mutex_probe, keys1{"lock"}, args0{});
    ASSERT_TRUE(r.is_integer());
    EXPECT_GT(r.as_integer(), 0);
    EXPECT_LE(r.as_integer(), 7000);
}

TEST(MutexProbeScript, LockWithoutLeaseGivesMinusOne) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other"}), "OK");
    EXPECT_EQ(run_script(conn, scripts::mutex_probe, keys1{"lock"}, args0{}), reply::integer(-1));
}

TEST(MutexProbeScript, FreeNameGivesMinusTwo) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    EXPECT_EQ(run_script(conn, scripts::mutex_probe, keys1{"lock"}, args0{}), reply::integer(-2));
}

TEST(MutexProbeScript, KeysOfOtherTypesAreWrongtype) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "h", "f", "v"}), "1");
    ASSERT_EQ(srv.cli({"RPUSH", "l", "x"}), "1");
    ASSERT_EQ(srv.cli({"SADD", "s", "x"}), "1");
    ASSERT_EQ(srv.cli({"ZADD", "z", "1", "x"}), "1");
    for (std::string_view key : {"h", "l", "s", "z"}) {
        const reply r = run_script(conn, scripts::mutex_probe, keys1{key}, args0{});
        EXPECT_TRUE(r.is_error_code("WRONGTYPE")) << key << ": " << r.text();
    }
}

// mutex_release

TEST(MutexReleaseScript, OwnLockIsDeleted) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "mine", "PX", "5000"}), "OK");
    EXPECT_EQ(
        run_script(conn, scripts::mutex_release, keys1{"lock"}, args2{"mine", "{lock}:released"}),
        reply::integer(1));
    EXPECT_EQ(srv.cli({"EXISTS", "lock"}), "0");
}

TEST(MutexReleaseScript, SomeoneElsesLockIsKept) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other", "PX", "5000"}), "OK");
    EXPECT_EQ(
        run_script(conn, scripts::mutex_release, keys1{"lock"}, args2{"mine", "{lock}:released"}),
        reply::integer(0));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "other");
}

TEST(MutexReleaseScript, MissingLockGivesZero) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    EXPECT_EQ(
        run_script(conn, scripts::mutex_release, keys1{"lock"}, args2{"mine", "{lock}:released"}),
        reply::integer(0));
}

TEST(MutexReleaseScript, KeyOfAnotherTypeIsAnErrorReplyAndIsKept) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "lock", "f", "v"}), "1");
    const reply r =
        run_script(conn, scripts::mutex_release, keys1{"lock"}, args2{"mine", "{lock}:released"});
    EXPECT_TRUE(r.is_error()) << r.text();
    EXPECT_EQ(srv.cli({"TYPE", "lock"}), "hash");
}

}  // namespace
