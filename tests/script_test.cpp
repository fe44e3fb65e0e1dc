#include <redislock/script.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/detail/wire/scripts.hpp>
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
using redislock::test::subscriber;
namespace scripts = redislock::detail::scripts;

using keys1 = std::array<std::string_view, 1>;
using keys2 = std::array<std::string_view, 2>;
using keys3 = std::array<std::string_view, 3>;
using keys4 = std::array<std::string_view, 4>;
using args2 = std::array<std::string_view, 2>;
using args3 = std::array<std::string_view, 3>;
using args4 = std::array<std::string_view, 4>;
using args7 = std::array<std::string_view, 7>;

constexpr std::array all_scripts{scripts::mutex_acquire, scripts::mutex_extend,
                                 scripts::mutex_release, scripts::queue_leave};

// The keys and channel beside the simple lock "lock" (derived_key("lock", ...)).
constexpr std::string_view fence_key = "{lock}:fence";
constexpr std::string_view queue_key = "{lock}:queue";
constexpr std::string_view lapse_key = "{lock}:waiting";
constexpr std::string_view channel = "{lock}:released";

reply run(hiredis_connection& conn, std::initializer_list<std::string_view> words) {
    const std::vector<std::string_view> argv{words};
    return conn.execute(argv);
}

// mutex_acquire.lua on "lock" with `token` and `lease`; `waiter` defaults to "w" + token, and
// `keep` '0' is a try that does not join the queue. A free lock the queue keeps from it goes to
// the head for `grace` ms.
reply acquire(hiredis_connection& conn, std::string_view token, std::string_view lease,
              std::string_view fencing = "0", std::optional<std::string> waiter = std::nullopt,
              std::string_view keep = "0", std::string_view grace = "2000") {
    const std::string id = waiter.value_or("w" + std::string{token});
    const args7 args{token, lease, fencing, id, keep, channel, grace};
    if (fencing == "1") {
        return run_script(conn, scripts::mutex_acquire,
                          keys4{"lock", queue_key, lapse_key, fence_key}, args);
    }
    return run_script(conn, scripts::mutex_acquire, keys3{"lock", queue_key, lapse_key}, args);
}

reply acquire_fenced(hiredis_connection& conn, std::string_view token, std::string_view lease) {
    return acquire(conn, token, lease, "1");
}

// A waiter `waiter` (token `token`) that tries once and, refused, joins the queue for `keep` ms
// past the wait the reply asks for.
reply wait_in_line(hiredis_connection& conn, std::string_view token, std::string_view waiter,
                   std::string_view keep = "5000") {
    return acquire(conn, token, "60000", "0", std::string{waiter}, keep);
}

reply release(hiredis_connection& conn, std::string_view token, std::string_view grace = "2000") {
    return run_script(conn, scripts::mutex_release, keys3{"lock", queue_key, lapse_key},
                      args3{token, channel, grace});
}

reply leave(hiredis_connection& conn, std::string_view waiter, std::string_view grace = "2000",
            std::string_view simple = "m") {
    return run_script(conn, scripts::queue_leave, keys3{"lock", queue_key, lapse_key},
                      args4{waiter, channel, grace, simple});
}

// The ids in the waiting queue, first to last, as the server has them.
std::vector<std::string> queue_of(const redis_server& srv) {
    std::vector<std::string> ids;
    std::istringstream lines{srv.cli({"ZRANGE", std::string{queue_key}, "0", "-1"})};
    for (std::string line; std::getline(lines, line);) {
        if (!line.empty()) {
            ids.push_back(line);
        }
    }
    return ids;
}

// {status, value} of an acquisition reply ({1, fence} or {0, ms}); {-99, -99} and a failure for
// anything else.
std::pair<std::int64_t, std::int64_t> verdict_of(const reply& r) {
    if (!r.is_array() || r.elements().size() != 2 || !r.elements()[0].is_integer() ||
        !r.elements()[1].is_integer()) {
        ADD_FAILURE() << "not {status, value}: " << r.text();
        return {-99, -99};
    }
    return {r.elements()[0].as_integer(), r.elements()[1].as_integer()};
}

// The server's clock in ms, the clock of the queue's lapse times.
std::int64_t server_ms(const redis_server& srv) {
    std::istringstream in{srv.cli({"TIME"})};
    std::int64_t seconds = 0;
    std::int64_t micros = 0;
    in >> seconds >> micros;
    return seconds * 1000 + micros / 1000;
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
                      "redislock" / "detail" / "wire/scripts.hpp";
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

// Extending a lock that is not there: a script that writes nothing and answers 0.
constexpr args2 extend_args{"mine", "1000"};

TEST(Script, EvalshaRunsAScriptAlreadyLoaded) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SCRIPT", "LOAD", std::string{scripts::mutex_extend.source}}),
              scripts::mutex_extend.sha1);
    EXPECT_EQ(run_script(conn, scripts::mutex_extend, keys1{"free"}, extend_args),
              reply::integer(0));
    EXPECT_EQ(conn.log(), (std::vector<std::string>{"EVALSHA mutex_extend"}));
}

TEST(Script, NoscriptLoadsTheScriptAndRetriesOnce) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SCRIPT", "EXISTS", std::string{scripts::mutex_extend.sha1}}), "0");

    EXPECT_EQ(run_script(conn, scripts::mutex_extend, keys1{"free"}, extend_args),
              reply::integer(0));
    EXPECT_EQ(conn.log(), (std::vector<std::string>{"EVALSHA mutex_extend", "SCRIPT LOAD",
                                                    "EVALSHA mutex_extend"}));
    EXPECT_EQ(srv.cli({"SCRIPT", "EXISTS", std::string{scripts::mutex_extend.sha1}}), "1");
}

TEST(Script, ScriptFlushIsRecoveredByTheNextCall) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(run_script(conn, scripts::mutex_extend, keys1{"free"}, extend_args),
              reply::integer(0));
    ASSERT_EQ(srv.cli({"SCRIPT", "FLUSH"}), "OK");
    EXPECT_EQ(run_script(conn, scripts::mutex_extend, keys1{"free"}, extend_args),
              reply::integer(0));
}

TEST(Script, ServerRestartIsRecoveredByTheNextCall) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(run_script(conn, scripts::mutex_extend, keys1{"free"}, extend_args),
              reply::integer(0));
    srv.restart();
    EXPECT_EQ(run_script(conn, scripts::mutex_extend, keys1{"free"}, extend_args),
              reply::integer(0));
}

TEST(Script, SecondNoscriptIsReturnedNotLooped) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    conn.inject(fault::answer_noscript, "EVALSHA", 2);
    const reply r = run_script(conn, scripts::mutex_extend, keys1{"free"}, extend_args);
    EXPECT_TRUE(r.is_error_code("NOSCRIPT")) << r.text();
    EXPECT_EQ(conn.log(), (std::vector<std::string>{"EVALSHA mutex_extend", "SCRIPT LOAD",
                                                    "EVALSHA mutex_extend"}));
}

TEST(Script, RefusedScriptLoadThrowsServerErrorNamingTheScript) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    conn.inject(fault::answer_noscript, "EVALSHA");
    conn.inject(fault::answer_error, "SCRIPT", 1, std::nullopt, "ERR scripting is disabled");
    try {
        (void)run_script(conn, scripts::mutex_extend, keys1{"free"}, extend_args);
        FAIL() << "a refused SCRIPT LOAD must throw";
    } catch (const redislock::server_error& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find("mutex_extend"), std::string::npos) << what;
        EXPECT_NE(what.find("scripting is disabled"), std::string::npos) << what;
    }
}

TEST(Script, ConnectionErrorPropagates) {
    redis_server srv;
    fault_connection conn{srv.uri()};
    conn.inject(fault::throw_before_send, "EVALSHA");
    EXPECT_THROW((void)run_script(conn, scripts::mutex_extend, keys1{"free"}, extend_args),
                 redislock::connection_error);
}

TEST(Script, OtherErrorRepliesAreReturnedAsReplies) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "lock", "f", "v"}), "1");
    const reply r = acquire(conn, "mine", "5000");
    EXPECT_TRUE(r.is_error_code("WRONGTYPE")) << r.text();
}

// mutex_acquire

TEST(MutexAcquireScript, FreeNameIsTakenWithTheNextFencingToken) {
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
TEST(MutexAcquireScript, CounterThatIsNotAnIntegerIsWrongtypeAndTheLockStaysUnset) {
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

TEST(MutexAcquireScript, HeldNameReturnsTheHoldersPttlAndDrawsNoToken) {
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
    // A try ('0') does not join the waiting queue.
    EXPECT_EQ(srv.cli({"EXISTS", std::string{queue_key}, std::string{lapse_key}}), "0");
}

TEST(MutexAcquireScript, HolderWithoutLeaseGivesMinusOne) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other"}), "OK");
    EXPECT_EQ(acquire_fenced(conn, "mine", "5000"),
              reply::array({reply::integer(0), reply::integer(-1)}));
}

TEST(MutexAcquireScript, KeyOfAnotherTypeIsWrongtype) {
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

// mutex_acquire without fencing, as a try that does not join the queue

TEST(MutexAcquireScript, FreeNameIsTakenWithoutATokenWhenNotFenced) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    EXPECT_EQ(verdict_of(acquire(conn, "mine", "7000")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "mine");
    const int pttl = std::stoi(srv.cli({"PTTL", "lock"}));
    EXPECT_GT(pttl, 5000);
    EXPECT_LE(pttl, 7000);
    EXPECT_EQ(srv.cli({"EXISTS", "{lock}:fence", std::string{queue_key}, std::string{lapse_key}}),
              "0");
}

// A waiting attempt sent again after its reply was lost finds its own token: acquired, even
// when the server refuses writes (its quick SET NX is refused, not only unneeded); a key of
// another type is still WRONGTYPE there, not the refusal.
TEST(MutexAcquireScript, ResentAttemptIsAcquiredAndOtherTypesAreWrongtypeAtOutOfMemory) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(verdict_of(acquire(conn, "mine", "60000", "0", std::nullopt, "5000")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    run(conn, {"HSET", "{lock}:hash", "f", "v"});
    ASSERT_GT(srv.fill_memory_until_oom(), 0);
    EXPECT_EQ(verdict_of(acquire(conn, "mine", "60000", "0", std::nullopt, "5000")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    const reply other =
        run_script(conn, scripts::mutex_acquire, keys3{"{lock}:hash", queue_key, lapse_key},
                   args7{"t", "60000", "0", "wt", "5000", channel, "2000"});
    EXPECT_TRUE(other.is_error_code("WRONGTYPE")) << other.text();
}

TEST(MutexAcquireScript, TryOnAHeldLockGivesItsPttlAndChangesNothing) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other", "PX", "7000"}), "OK");
    const auto [status, wait] = verdict_of(acquire(conn, "mine", "5000"));
    EXPECT_EQ(status, 0);
    EXPECT_GT(wait, 0);
    EXPECT_LE(wait, 7000);
    EXPECT_EQ(srv.cli({"GET", "lock"}), "other");
    EXPECT_EQ(srv.cli({"EXISTS", std::string{queue_key}, std::string{lapse_key}}), "0");
}

TEST(MutexAcquireScript, TryOnALockWithoutLeaseGivesMinusOne) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other"}), "OK");
    EXPECT_EQ(acquire(conn, "mine", "5000"), reply::array({reply::integer(0), reply::integer(-1)}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "other");
}

TEST(MutexAcquireScript, KeysOfOtherTypesAreWrongtypeAndNothingIsWritten) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "h", "f", "v"}), "1");
    ASSERT_EQ(srv.cli({"RPUSH", "l", "x"}), "1");
    ASSERT_EQ(srv.cli({"SADD", "s", "x"}), "1");
    ASSERT_EQ(srv.cli({"ZADD", "z", "1", "x"}), "1");
    for (std::string_view key : {"h", "l", "s", "z"}) {
        const std::string key_text{key};
        const std::string queue = "{" + key_text + "}:queue";
        const std::string lapses = "{" + key_text + "}:waiting";
        const std::string fence = "{" + key_text + "}:fence";
        // Even an attempt that would wait in line joins no queue.
        const reply r = run_script(conn, scripts::mutex_acquire, keys4{key, queue, lapses, fence},
                                   args7{"mine", "5000", "1", "wmine", "5000", channel, "2000"});
        EXPECT_TRUE(r.is_error_code("WRONGTYPE")) << key << ": " << r.text();
        EXPECT_EQ(srv.cli({"EXISTS", fence, queue, lapses}), "0") << key;
    }
    EXPECT_EQ(srv.cli({"TYPE", "h"}), "hash");
    EXPECT_EQ(srv.cli({"TYPE", "z"}), "zset");
}

// mutex_release

TEST(MutexReleaseScript, OwnLockIsDeletedAndNothingIsPublishedWhenNoOneWaits) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    subscriber released{srv, std::string{channel}};
    ASSERT_EQ(srv.cli({"SET", "lock", "mine", "PX", "5000"}), "OK");
    EXPECT_EQ(release(conn, "mine"), reply::integer(1));
    EXPECT_EQ(srv.cli({"EXISTS", "lock"}), "0");
    EXPECT_EQ(released.next(100ms), std::nullopt);  // and the subscriber stays usable after it
    // Messages arrive in order: the marker comes first only if the release published nothing.
    ASSERT_EQ(srv.cli({"SPUBLISH", std::string{channel}, "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");
}

TEST(MutexReleaseScript, SomeoneElsesLockIsKept) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "other", "PX", "5000"}), "OK");
    EXPECT_EQ(release(conn, "mine"), reply::integer(0));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "other");
}

TEST(MutexReleaseScript, MissingLockGivesZero) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    EXPECT_EQ(release(conn, "mine"), reply::integer(0));
}

TEST(MutexReleaseScript, KeyOfAnotherTypeIsAnErrorReplyAndIsKept) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"HSET", "lock", "f", "v"}), "1");
    const reply r = release(conn, "mine");
    EXPECT_TRUE(r.is_error()) << r.text();
    EXPECT_EQ(srv.cli({"TYPE", "lock"}), "hash");
}

TEST(MutexReleaseScript, ReleaseWithAWaiterKeepsTheLockForItAndPublishesItsId) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    subscriber released{srv, std::string{channel}};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);
    ASSERT_EQ(queue_of(srv), (std::vector<std::string>{"wA", "wB"}));

    const std::int64_t before = server_ms(srv);
    EXPECT_EQ(release(conn, "holder", "2000"), reply::integer(2));
    // The lock is kept free for the head, for the grace only.
    EXPECT_EQ(srv.cli({"GET", "lock"}), "queued:wA");
    const int pttl = std::stoi(srv.cli({"PTTL", "lock"}));
    EXPECT_GT(pttl, 0);
    EXPECT_LE(pttl, 2000);
    // The head is told it may go, and the next one to check after the grace; the head's entry
    // now lapses with the grace, the next one's 2 s after it unless it checks (it lapsed with the
    // holder's lease before: a standby that died would hold up the queue that long once first).
    EXPECT_EQ(released.next(), "wA ?wB");
    EXPECT_GE(std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wA"})), before + 2000 - 1);
    EXPECT_LE(std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wA"})), server_ms(srv) + 2000);
    EXPECT_GE(std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wB"})),
              before + 2000 + 2000 - 1);
    EXPECT_LE(std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wB"})),
              server_ms(srv) + 2000 + 2000);
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wA", "wB"}));
}

// A release rewrites the key for the waiter it keeps the lock for (it never deletes it and then
// writes it again): out of memory, where Redis refuses a script's SET, HSET or ZADD unless the
// script already wrote, its first write is one Redis allows, so the hand-over still happens, also
// when the queue's lapse times were lost and the release gives them back first.
TEST(MutexReleaseScript, ReleaseWithAWaiterKeepsTheLockForItAtOutOfMemory) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 0);
    // A reentrant lock of owner "own", an 'h' waiter of owner "other" queued (see _queue.lua).
    const std::string rqueue = "{rlock}:queue";
    const std::string rlapses = "{rlock}:waiting";
    ASSERT_EQ(srv.cli({"HSET", "rlock", "own", "1", "id:own", "a1"}), "2");
    ASSERT_EQ(srv.cli({"PEXPIRE", "rlock", "60000"}), "1");
    const std::string far = std::to_string(server_ms(srv) + 60'000);
    ASSERT_EQ(srv.cli({"ZADD", rqueue, "1", "h0b.60000.other"}), "1");
    ASSERT_EQ(srv.cli({"ZADD", rlapses, far, "h0b.60000.other"}), "1");
    // A simple lock whose queue lost its lapse times.
    ASSERT_EQ(srv.cli({"SET", "{lost}", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(srv.cli({"ZADD", "{lost}:queue", "1", "wL"}), "1");
    for (const redislock::script& s : {scripts::mutex_release, scripts::recursive_release}) {
        ASSERT_EQ(run(conn, {"SCRIPT", "LOAD", s.source}), reply::string(std::string{s.sha1}));
    }
    ASSERT_GT(srv.fill_memory_until_oom(), 0);
    // Out of memory as each script starts: the filler's connections are gone, which freed a
    // little, so this connection fills up to the limit again.
    const auto out_of_memory = [&] {
        for (int i = 0; i < 100'000; ++i) {
            const std::string key = "oom-top:" + std::to_string(i);
            if (run(conn, {"SET", key, std::string(64, 'x')}).is_error_code("OOM")) {
                return true;
            }
        }
        return false;
    };

    ASSERT_TRUE(out_of_memory());
    EXPECT_EQ(release(conn, "holder", "60000"), reply::integer(2));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "queued:wA");

    ASSERT_TRUE(out_of_memory());
    reply r = run_script(
        conn, scripts::recursive_release, keys3{"rlock", rqueue, rlapses},
        std::array<std::string_view, 6>{"own", "1", "60000", "{rlock}:released", "a1", "60000"});
    EXPECT_EQ(r, reply::integer(2)) << r.text();
    EXPECT_EQ(srv.cli({"HGET", "rlock", "id:other"}), "0b");
    EXPECT_EQ(srv.cli({"HEXISTS", "rlock", "own"}), "0");
    EXPECT_GT(std::stoll(srv.cli({"PTTL", "rlock"})), 0);

    ASSERT_TRUE(out_of_memory());
    r = run_script(conn, scripts::mutex_release, keys3{"{lost}", "{lost}:queue", "{lost}:waiting"},
                   args3{"holder", "{lost}:released", "60000"});
    EXPECT_EQ(r, reply::integer(2)) << r.text();
    EXPECT_EQ(srv.cli({"GET", "{lost}"}), "queued:wL");
    EXPECT_EQ(srv.cli({"ZCARD", "{lost}:waiting"}), "1");
}

// ---------------------------------------------------------------------------------------------
// The waiting queue of a simple lock (_queue.lua through mutex_acquire, mutex_release and
// queue_leave)

TEST(MutexQueueScript, WaitersJoinInArrivalOrderForTheHoldersTtlPlusTheirKeep) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    // Bounds from the time the holder's key was set: a busy machine may take its time between
    // the commands below.
    const std::int64_t before = server_ms(srv);
    const redislock::test::stopwatch since_set;
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "10000"}), "OK");
    const auto [status, wait] = verdict_of(wait_in_line(conn, "a", "wA", "3000"));
    EXPECT_EQ(status, 0);
    EXPECT_GE(wait, 10'000 - since_set.elapsed().count() - 1);
    EXPECT_LE(wait, 10'000);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB", "3000")).first, 0);
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wA", "wB"}));
    // The entry lapses the holder's TTL plus the keep from now, unless its waiter comes back;
    // both keys live as long as their latest entry.
    const std::int64_t lapse = std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wA"}));
    EXPECT_GE(lapse, before + 13'000 - 1);
    EXPECT_LE(lapse, server_ms(srv) + 13'000);
    for (const auto key : {queue_key, lapse_key}) {
        const int ttl = std::stoi(srv.cli({"PTTL", std::string{key}}));
        EXPECT_GE(ttl, 13'000 - since_set.elapsed().count() - 1) << key;
        EXPECT_LE(ttl, 13'000) << key;
    }
    // Coming back keeps the place in line.
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA", "3000")).first, 0);
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wA", "wB"}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "holder");
}

TEST(MutexQueueScript, QueueKeysLiveAtLeastAsLongAsTheirLatestEntryWhateverOrderTheyJoinIn) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    const redislock::test::stopwatch since_set;
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "10000"}), "OK");
    // Each entry lapses the holder's TTL plus its keep after it joined, `total` ms after the
    // holder's key was set: the keys' TTLs, read later, are within what has passed since.
    const auto ttls_end_at = [&](int total) {
        for (const auto key : {queue_key, lapse_key}) {
            const int ttl = std::stoi(srv.cli({"PTTL", std::string{key}}));
            EXPECT_GE(ttl, total - since_set.elapsed().count() - 1) << key;
            EXPECT_LE(ttl, total) << key;
        }
    };
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA", "30000")).first, 0);
    ttls_end_at(40'000);
    // A later entry that lapses sooner leaves the keys to the earlier one...
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB", "100")).first, 0);
    ttls_end_at(40'000);
    // ...and one that lapses later makes them live longer.
    ASSERT_EQ(verdict_of(wait_in_line(conn, "c", "wC", "60000")).first, 0);
    ttls_end_at(70'000);
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wA", "wB", "wC"}));
}

TEST(MutexQueueScript, SecondWaiterCannotTakeAFreeLockWhileTheFirstIsQueued) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);

    // The holder's key goes without a release (expired, say): the lock is free, but wA is first:
    // it is handed to wA as a release would, kept for it for the grace (10 s here).
    ASSERT_EQ(srv.cli({"DEL", "lock"}), "1");
    const auto [status, wait] =
        verdict_of(acquire(conn, "b", "60000", "0", std::string{"wB"}, "5000", "10000"));
    EXPECT_EQ(status, 0);
    EXPECT_GT(wait, 0);  // at most for the grace
    EXPECT_LE(wait, 10'000);
    EXPECT_EQ(srv.cli({"GET", "lock"}), "queued:wA");
    // Nor can a newcomer, trying or waiting.
    EXPECT_EQ(verdict_of(acquire(conn, "c", "60000")).first, 0);
    EXPECT_EQ(verdict_of(wait_in_line(conn, "c", "wC")).first, 0);
    EXPECT_EQ(srv.cli({"GET", "lock"}), "queued:wA");
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wA", "wB", "wC"}));

    // The head takes it, and leaves the queue; then the next in line is first.
    EXPECT_EQ(verdict_of(wait_in_line(conn, "a", "wA")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "a");
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wB", "wC"}));
    EXPECT_EQ(srv.cli({"ZSCORE", std::string{lapse_key}, "wA"}), "");
    ASSERT_EQ(release(conn, "a"), reply::integer(2));
    EXPECT_EQ(verdict_of(wait_in_line(conn, "c", "wC")).first, 0);
    EXPECT_EQ(verdict_of(wait_in_line(conn, "b", "wB")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wC"}));
}

TEST(MutexQueueScript, LapsedEntryIsPrunedAndNoLongerBlocks) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "400"}), "OK");
    // wA's entry lapses about 500 ms from now unless wA comes back; wC's much later.
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA", "100")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "c", "wC", "60000")).first, 0);
    ASSERT_EQ(queue_of(srv), (std::vector<std::string>{"wA", "wC"}));
    ASSERT_EQ(srv.cli({"DEL", "lock"}), "1");

    // While wA's entry lives, the lock is handed to it for what is left of its entry, and wC
    // waits for it: at most until it lapses (the key may be gone by the time redis-cli reads it).
    const auto [status, wait] = verdict_of(acquire(conn, "c", "60000", "0", std::string{"wC"}));
    ASSERT_EQ(status, 0) << "wA's entry lapsed before the check; the test needs it alive";
    EXPECT_LE(wait, 500);
    EXPECT_LE(std::stoll(srv.cli({"PTTL", "lock"})), 500);

    // wA never comes back: its entry lapses, is pruned, and wC goes.
    std::this_thread::sleep_for(std::chrono::milliseconds{wait + 100});
    EXPECT_EQ(verdict_of(acquire(conn, "c", "60000", "0", std::string{"wC"})),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "c");
    EXPECT_EQ(srv.cli({"EXISTS", std::string{queue_key}, std::string{lapse_key}}), "0");
}

TEST(MutexQueueScript, TensOfThousandsOfLapsedEntriesArePrunedByOneAttempt) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    // Waiters that crashed while the lock was held, their entries long lapsed: more ids than
    // Lua's unpack() takes at once.
    constexpr int crashed = 50'000;
    std::vector<std::string> ids;
    for (int i = 0; i < crashed; ++i) {
        ids.push_back("w" + std::to_string(i));
    }
    for (const auto key : {queue_key, lapse_key}) {
        std::vector<std::string_view> argv{"ZADD", key};
        for (const std::string& id : ids) {
            argv.push_back("1");
            argv.push_back(id);
        }
        ASSERT_EQ(conn.execute(argv), reply::integer(crashed));
    }
    EXPECT_EQ(verdict_of(wait_in_line(conn, "c", "wC")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "c");
    EXPECT_EQ(srv.cli({"EXISTS", std::string{queue_key}, std::string{lapse_key}}), "0");
}

TEST(MutexQueueScript, LockKeptForTheHeadIsTakenOnlyByIt) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);
    ASSERT_EQ(release(conn, "holder", "5000"), reply::integer(2));
    ASSERT_EQ(srv.cli({"GET", "lock"}), "queued:wA");

    // Neither the next waiter, nor a newcomer, nor a plain SET NX gets in; the reply asks them
    // to wait for the grace.
    for (const auto& [token, waiter] :
         {std::pair<std::string, std::string>{"b", "wB"}, {"c", "wC"}}) {
        SCOPED_TRACE(waiter);
        const auto [status, wait] = verdict_of(acquire(conn, token, "60000", "1", waiter));
        EXPECT_EQ(status, 0);
        EXPECT_GT(wait, 0);
        EXPECT_LE(wait, 5000);
    }
    EXPECT_EQ(srv.cli({"SET", "lock", "plain", "NX", "PX", "60000"}), "");
    EXPECT_EQ(srv.cli({"GET", "lock"}), "queued:wA");
    EXPECT_EQ(srv.cli({"EXISTS", "{lock}:fence"}), "0");  // no token drawn for them

    // The head takes it, with a fencing token if it asks.
    const reply taken = acquire(conn, "a", "60000", "1", std::string{"wA"});
    const auto [status, fence] = verdict_of(taken);
    EXPECT_EQ(status, 1);
    EXPECT_GT(fence, 0);
    EXPECT_EQ(srv.cli({"GET", "lock"}), "a");
    EXPECT_GT(std::stoi(srv.cli({"PTTL", "lock"})), 50'000);
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wB"}));
}

TEST(MutexQueueScript, HeadLeavingALockKeptForItHandsItToTheNext) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    subscriber released{srv, std::string{channel}};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "c", "wC")).first, 0);
    ASSERT_EQ(release(conn, "holder", "5000"), reply::integer(2));
    ASSERT_EQ(released.next(), "wA ?wB");

    // wA gives up: the lock is kept for wB now, and wB is told.
    EXPECT_EQ(leave(conn, "wA", "5000"), reply::integer(1));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "queued:wB");
    EXPECT_GT(std::stoi(srv.cli({"PTTL", "lock"})), 0);
    EXPECT_EQ(released.next(), "wB ?wC");
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wB", "wC"}));
    EXPECT_EQ(srv.cli({"ZSCORE", std::string{lapse_key}, "wA"}), "");
    EXPECT_EQ(verdict_of(acquire(conn, "a", "60000", "0", std::string{"wA"})).first, 0);
    EXPECT_EQ(verdict_of(acquire(conn, "c", "60000", "0", std::string{"wC"})).first, 0);
    EXPECT_EQ(verdict_of(acquire(conn, "b", "60000", "0", std::string{"wB"})),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "b");
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wC"}));
}

// A 'g' waiter takes the lock handed to it under its own token (see queue_hand_on): the key is
// kept for it for the grace only, and it keeps its place in the queue until it comes. One that
// gives up before its message is read frees the lock: its leave hands it to the next 'g' waiter
// the same way, and to no one when none waits; no queue is left behind.
TEST(MutexQueueScript, HandedWaiterLeavingHandsTheLockOnOrFreesIt) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    subscriber released{srv, std::string{channel}};
    const std::string first = "g00aa.60000";
    const std::string second = "g00bb.30000";
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "00aa", first)).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "00bb", second)).first, 0);
    ASSERT_EQ(release(conn, "holder"), reply::integer(2));
    ASSERT_EQ(srv.cli({"GET", "lock"}), "00aa");
    ASSERT_EQ(released.next(), first + " ?" + second);
    ASSERT_EQ(queue_of(srv), (std::vector<std::string>{first, second}));

    // The next 'g' waiter gets it under its own token, kept for it for the grace.
    EXPECT_EQ(leave(conn, first), reply::integer(1));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "00bb");
    const int pttl = std::stoi(srv.cli({"PTTL", "lock"}));
    EXPECT_GT(pttl, 0);
    EXPECT_LE(pttl, 2000);
    EXPECT_EQ(released.next(), second);
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{second}));
    // The same leave again (a retry from the background) takes nothing from the new holder.
    EXPECT_EQ(leave(conn, first), reply::integer(0));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "00bb");

    // The last one gives up too: the lock is free for anyone, and no one is told.
    EXPECT_EQ(leave(conn, second), reply::integer(0));
    EXPECT_EQ(srv.cli({"EXISTS", "lock", std::string{queue_key}, std::string{lapse_key}}), "0");
    ASSERT_EQ(srv.cli({"SPUBLISH", std::string{channel}, "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");
    EXPECT_EQ(verdict_of(acquire(conn, "c", "60000")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
}

// The same leave with a plain waiter next keeps the lock free for it, and tells it.
TEST(MutexQueueScript, HandedWaiterLeavingKeepsTheLockForTheNextWaiter) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    subscriber released{srv, std::string{channel}};
    const std::string first = "g00aa.60000";
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "00aa", first)).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);
    ASSERT_EQ(release(conn, "holder"), reply::integer(2));
    ASSERT_EQ(srv.cli({"GET", "lock"}), "00aa");
    ASSERT_EQ(released.next(), first + " ?wB");

    EXPECT_EQ(leave(conn, first), reply::integer(1));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "queued:wB");
    EXPECT_EQ(released.next(), "wB");
    EXPECT_EQ(verdict_of(acquire(conn, "c", "60000", "0", std::string{"wC"})).first, 0);
    EXPECT_EQ(verdict_of(acquire(conn, "b", "60000", "0", std::string{"wB"})),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "b");
    EXPECT_EQ(srv.cli({"EXISTS", std::string{queue_key}, std::string{lapse_key}}), "0");
}

// A lock handed to a 'g' waiter is kept for it for the grace only: its next attempt takes it for
// its own lease and leaves the queue; a head that does not come lapses with the grace, and the
// lock is the next waiter's, whatever the lease the first one asked for.
TEST(MutexQueueScript, HandedLockIsKeptForTheGraceUntilItsWaiterComesToTakeIt) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    const std::string first = "g00aa.60000";
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "00aa", first)).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);

    // Comes in time: its attempt takes the lock for its lease.
    ASSERT_EQ(release(conn, "holder", "5000"), reply::integer(2));
    ASSERT_LE(std::stoi(srv.cli({"PTTL", "lock"})), 5000);
    EXPECT_EQ(verdict_of(wait_in_line(conn, "ignored", first)),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "ignored");
    EXPECT_GT(std::stoi(srv.cli({"PTTL", "lock"})), 50'000);
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wB"}));

    // Never comes: kept 100 ms (whether the key is still there when redis-cli reads it depends
    // on the machine's load), then the next waiter gets it.
    ASSERT_EQ(verdict_of(wait_in_line(conn, "00cc", "g00cc.60000")).first, 0);
    ASSERT_EQ(release(conn, "ignored"), reply::integer(2));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "queued:wB");
    EXPECT_EQ(verdict_of(wait_in_line(conn, "b", "wB")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    ASSERT_EQ(release(conn, "b", "100"), reply::integer(2));
    EXPECT_LE(std::stoi(srv.cli({"PTTL", "lock"})), 100);
    std::this_thread::sleep_for(150ms);
    EXPECT_EQ(verdict_of(acquire(conn, "d", "60000", "0", std::string{"wD"}, "5000")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "d");
    EXPECT_EQ(srv.cli({"EXISTS", std::string{queue_key}, std::string{lapse_key}}), "0");
}

TEST(MutexQueueScript, LeavingWhileTheLockIsHeldTellsNobody) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    subscriber released{srv, std::string{channel}};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);

    EXPECT_EQ(leave(conn, "wA"), reply::integer(0));
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wB"}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "holder");
    ASSERT_EQ(srv.cli({"SPUBLISH", std::string{channel}, "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");

    // The last waiter leaving a lock kept for it frees the lock for anyone.
    ASSERT_EQ(release(conn, "holder"), reply::integer(2));
    ASSERT_EQ(released.next(), "wB");
    EXPECT_EQ(leave(conn, "wB"), reply::integer(0));
    EXPECT_EQ(srv.cli({"EXISTS", "lock", std::string{queue_key}, std::string{lapse_key}}), "0");
    EXPECT_EQ(verdict_of(acquire(conn, "c", "60000")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
}

// A queue key another program made a string: each script that may write the queue refuses
// before its first write, so it never writes and then fails half-way.
TEST(MutexQueueScript, QueueKeyOfAnotherTypeIsRefusedBeforeAnyWrite) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 0);
    ASSERT_EQ(srv.cli({"SET", std::string{lapse_key}, "not a queue"}), "OK");

    // Joining would add wB to the queue, then fail on the lapse times.
    const reply joined = wait_in_line(conn, "b", "wB");
    EXPECT_TRUE(joined.is_error()) << joined.text();
    EXPECT_NE(joined.text().find(lapse_key), std::string::npos) << joined.text();
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wA"}));
    // Releasing would delete the lock, then fail on the queue.
    const reply released = release(conn, "holder");
    EXPECT_TRUE(released.is_error()) << released.text();
    EXPECT_EQ(srv.cli({"GET", "lock"}), "holder");
    // Leaving would take wA out of the queue, then fail on the lapse times.
    const reply left = leave(conn, "wA");
    EXPECT_TRUE(left.is_error()) << left.text();
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wA"}));
    EXPECT_EQ(srv.cli({"GET", std::string{lapse_key}}), "not a queue");
}

// A free lock that the queue keeps from the caller, because another waiter heads it, is handed
// to that head as a release would hand it on: kept for it for the caller's grace, the head told,
// and its entry lapsing with that grace. A head that never comes (it died, or moved up while its
// lapse time was the previous holder's lease) then holds the lock for the grace only, not until
// the lapse time it joined with.
TEST(MutexQueueScript, FreeLockFoundByAWaiterBehindTheHeadIsHandedToTheHeadForTheGrace) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    subscriber released{srv, std::string{channel}};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);
    ASSERT_EQ(srv.cli({"DEL", "lock"}), "1");  // gone without a release (expired, say)

    const std::int64_t before = server_ms(srv);
    const auto [status, wait] =
        verdict_of(acquire(conn, "b", "60000", "0", std::string{"wB"}, "5000", "3000"));
    EXPECT_EQ(status, 0);
    EXPECT_LE(wait, 3000) << "asked to wait for the head's old lapse time";
    EXPECT_EQ(srv.cli({"GET", "lock"}), "queued:wA");
    EXPECT_LE(std::stoll(srv.cli({"PTTL", "lock"})), 3000);
    EXPECT_LE(std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wA"})), server_ms(srv) + 3000);
    EXPECT_GE(std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wB"})), before + 5000);
    EXPECT_EQ(released.next(), "wA ?wB");

    // wA never comes: once the grace is over, wB takes the lock.
    std::this_thread::sleep_for(3100ms);
    EXPECT_EQ(verdict_of(acquire(conn, "b", "60000", "0", std::string{"wB"}, "5000", "3000")),
              (std::pair<std::int64_t, std::int64_t>{1, 0}));
    EXPECT_EQ(srv.cli({"GET", "lock"}), "b");
    EXPECT_EQ(srv.cli({"EXISTS", std::string{queue_key}, std::string{lapse_key}}), "0");
}

// The waiter after the ones a release lets go is told to check once their grace is over, and its
// entry lapses soon after unless it does: a standby that died no longer holds the queue up for
// the lapse time it joined with (the previous holder's lease and more) once it heads it.
TEST(MutexQueueScript, ReleaseBringsTheStandbysLapseTimeCloseAndItsCheckKeepsItsPlace) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "c", "wC")).first, 0);
    ASSERT_EQ(release(conn, "holder", "5000"), reply::integer(2));

    const std::int64_t lapse = std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wB"}));
    EXPECT_LE(lapse, server_ms(srv) + 5000 + 2000) << "the standby keeps its old lapse time";
    // wC, not told, keeps its lapse time.
    EXPECT_GT(std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wC"})),
              server_ms(srv) + 60'000);
    // The standby checks: wA holds the lock now, and wB's entry lives that long again.
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 1);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB")).first, 0);
    EXPECT_GT(std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wB"})),
              server_ms(srv) + 60'000);
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wB", "wC"}));
}

// Each queue key gets the time to live its entries need, whichever of the two was lost: a queue
// key lost while the lapse times live is made again with a TTL, so a waiter that then dies leaves
// nothing behind for ever.
TEST(MutexQueueScript, QueueKeyMadeAgainWhileItsLapseTimesLiveGetsATtl) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "10000"}), "OK");
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA", "3000")).first, 0);
    for (const auto lost : {queue_key, lapse_key}) {
        SCOPED_TRACE(lost);
        ASSERT_EQ(srv.cli({"DEL", std::string{lost}}), "1");
        // wB's entry lapses before wA's: the key that was not lost needs no longer TTL.
        ASSERT_EQ(verdict_of(wait_in_line(conn, "b", "wB", "1000")).first, 0);
        for (const auto key : {queue_key, lapse_key}) {
            const std::int64_t ttl = std::stoll(srv.cli({"PTTL", std::string{key}}));
            EXPECT_GT(ttl, 0) << key;
            EXPECT_LE(ttl, 13'000) << key;
        }
    }
}

// Waiters whose lapse times were lost (evicted, deleted) are given a lapse time 2 s from now and
// told to check: each comes back within that time if it is alive and keeps its place with the
// lapse time its wait needs, instead of lapsing unheard while it sleeps through a long wait.
TEST(MutexQueueScript, WaitersWhoseLapseTimesWereLostAreToldToCheck) {
    redis_server srv;
    hiredis_connection conn{srv.uri()};
    subscriber released{srv, std::string{channel}};
    ASSERT_EQ(srv.cli({"SET", "lock", "holder", "PX", "60000"}), "OK");
    for (const auto& [token, waiter] :
         {std::pair<std::string, std::string>{"a", "wA"}, {"b", "wB"}, {"c", "wC"}}) {
        ASSERT_EQ(verdict_of(wait_in_line(conn, token, waiter)).first, 0);
    }
    ASSERT_EQ(srv.cli({"DEL", std::string{lapse_key}}), "1");
    ASSERT_EQ(release(conn, "holder", "5000"), reply::integer(2));

    std::vector<std::string> words;
    for (int i = 0; i < 2; ++i) {
        const std::optional<std::string> message = released.next(1s);
        if (!message) {
            break;
        }
        std::istringstream in{*message};
        for (std::string word; in >> word;) {
            words.push_back(word);
        }
    }
    EXPECT_NE(std::find(words.begin(), words.end(), "?wC"), words.end())
        << "wC is not told; heard: " << testing::PrintToString(words);
    const std::int64_t lapse = std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wC"}));
    EXPECT_LE(lapse, server_ms(srv) + 2000);
    // wC checks: it keeps its place for as long as its wait now needs.
    ASSERT_EQ(verdict_of(wait_in_line(conn, "a", "wA")).first, 1);
    ASSERT_EQ(verdict_of(wait_in_line(conn, "c", "wC")).first, 0);
    EXPECT_GT(std::stoll(srv.cli({"ZSCORE", std::string{lapse_key}, "wC"})),
              server_ms(srv) + 60'000);
    EXPECT_EQ(queue_of(srv), (std::vector<std::string>{"wB", "wC"}));
}

}  // namespace
