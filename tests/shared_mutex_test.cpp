#include <redislock/shared_mutex.hpp>

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <sys/time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/exclusion.hpp"
#include "support/faulty_connection.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::errc;
using redislock::lock_options;
using redislock::reply;
using redislock::test::child_process;
using redislock::test::eventually;
using redislock::test::hold_interval;
using redislock::test::line_channel;
using redislock::test::lost_counter;
using redislock::test::monotonic_ns;
using redislock::test::redis_server;
using redislock::test::stopwatch;
using redislock::test::subscriber;

static_assert(noexcept(std::declval<redislock::shared_mutex&>().unlock()));
static_assert(noexcept(std::declval<redislock::shared_mutex&>().unlock_shared()));
static_assert(!std::is_copy_constructible_v<redislock::shared_mutex>);
static_assert(std::is_nothrow_move_constructible_v<redislock::shared_mutex>);

// ---------------------------------------------------------------------------------------------
// Helpers

using hash = std::map<std::string, std::string>;

// The lock's hash as the server has it, read with redis-cli rather than through the library.
hash hash_of(const redis_server& srv, const std::string& key) {
    std::istringstream lines{srv.cli({"HGETALL", key})};
    hash fields;
    for (std::string field, value; std::getline(lines, field) && std::getline(lines, value);) {
        fields[field] = value;
    }
    return fields;
}

// One entry in the hash: "<count> <expiry ms> <acquisition id>" for a holder.
struct entry {
    long long count = -1;
    long long expiry = -1;
    std::string id;
};

entry parse_entry(const std::string& text) {
    entry e;
    std::istringstream in{text};
    in >> e.count >> e.expiry >> e.id;
    return e;
}

std::size_t count_prefixed(const hash& fields, std::string_view prefix) {
    return static_cast<std::size_t>(std::count_if(
        fields.begin(), fields.end(), [&](const auto& f) { return f.first.starts_with(prefix); }));
}

long long pttl(const redis_server& srv, const std::string& key) {
    return std::stoll(srv.cli({"PTTL", key}));
}

bool exists(const redis_server& srv, const std::string& key) {
    return srv.cli({"EXISTS", key}) == "1";
}

// The server's clock in ms, the clock every expiry in the hash is written in.
long long server_ms(const redis_server& srv) {
    std::istringstream in{srv.cli({"TIME"})};
    long long seconds = 0;
    long long micros = 0;
    in >> seconds >> micros;
    return seconds * 1000 + micros / 1000;
}

// The owner id the library writes for the calling thread of `client`.
std::string caller_owner(const redislock::client& client) {
    return redislock::detail::owner_id(client.instance_id(), {});
}

// Runs `f`, which must throw redislock::server_error naming WRONGTYPE.
template <class F>
void expect_wrongtype(F f) {
    try {
        f();
        ADD_FAILURE() << "no server_error was thrown";
    } catch (const redislock::server_error& e) {
        EXPECT_NE(std::string_view{e.what()}.find("WRONGTYPE"), std::string_view::npos) << e.what();
    }
}

// Runs `f`, which must throw std::system_error(resource_deadlock_would_occur).
template <class F>
void expect_deadlock_refused(F f) {
    try {
        f();
        ADD_FAILURE() << "no std::system_error was thrown";
    } catch (const std::system_error& e) {
        EXPECT_EQ(e.code(), std::errc::resource_deadlock_would_occur) << e.what();
    }
}

// The acquisition id the script tests offer, and then name, for `owner`: fixed, so the entries
// it ends up in can be checked.
std::string id_for(std::string_view owner) {
    return "acq-" + std::string{owner};
}

// The waiter id the script tests use for `owner` waiting in mode `kind`: 'r<owner>' for a
// reader, 'w<owner>' for a writer.
std::string waiter_for(std::string_view owner, std::string_view kind) {
    return std::string{kind} + std::string{owner};
}

// The waiter ids in `name`'s waiting queue, first to last, as the server has them.
std::vector<std::string> queue_of(const redis_server& srv, const std::string& name) {
    std::vector<std::string> ids;
    std::istringstream lines{
        srv.cli({"ZRANGE", redislock::detail::derived_key(name, "queue"), "0", "-1"})};
    for (std::string line; std::getline(lines, line);) {
        if (!line.empty()) {
            ids.push_back(line);
        }
    }
    return ids;
}

// True when neither of `name`'s queue keys exists: no one waits in line.
bool no_queue(const redis_server& srv, const std::string& name) {
    return srv.cli({"EXISTS", redislock::detail::derived_key(name, "queue"),
                    redislock::detail::derived_key(name, "waiting")}) == "0";
}

// The scripts called directly, to check their replies rather than what the class makes of them.
// Without `id`, each names the owner's id_for(). An acquisition's `holds_none` ('1': the calling
// object holds no entry in this mode) and `given_up` (ids the object gave up, space-separated)
// default to an object that holds an entry and gave up nothing, so an owner's entry is re-entered.
// `queue_ms` is the keep: '0' a try that does not join the waiting queue; otherwise a refused
// attempt queues waiter_for(owner, kind) that long past the wait its reply asks for.
reply run_acquire(redislock::client& client, std::string_view name, std::string_view owner,
                  std::string_view kind, std::string_view lease, std::string_view fencing = "0",
                  std::string_view queue_ms = "0", std::optional<std::string> id = std::nullopt,
                  std::string_view holds_none = "0", std::string_view given_up = "") {
    const std::string fence_key = redislock::detail::derived_key(name, "fence");
    const std::string queue_key = redislock::detail::derived_key(name, "queue");
    const std::string lapse_key = redislock::detail::derived_key(name, "waiting");
    const std::string channel = redislock::detail::derived_key(name, "released");
    const std::string offered = id.value_or(id_for(owner));
    const std::string waiter = waiter_for(owner, kind);
    const std::array<std::string_view, 11> args{owner,    kind,    lease,      fencing,
                                                waiter,   offered, holds_none, given_up,
                                                queue_ms, channel, "2000"};
    if (kind == "w" && fencing == "1") {
        return redislock::detail::run_script(
            client.connection(), redislock::detail::scripts::shared_acquire,
            std::array<std::string_view, 4>{name, queue_key, lapse_key, fence_key}, args);
    }
    return redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::shared_acquire,
        std::array<std::string_view, 3>{name, queue_key, lapse_key}, args);
}

std::int64_t run_release(redislock::client& client, std::string_view name, std::string_view owner,
                         std::string_view kind, std::string_view entries = "1",
                         std::optional<std::string> id = std::nullopt,
                         std::string_view release_id = "", std::string_view grace = "2000") {
    const std::string channel = redislock::detail::derived_key(name, "released");
    const std::string queue_key = redislock::detail::derived_key(name, "queue");
    const std::string lapse_key = redislock::detail::derived_key(name, "waiting");
    const std::string acquisition = id.value_or(id_for(owner));
    const reply r = redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::shared_release,
        std::array<std::string_view, 3>{name, queue_key, lapse_key},
        std::array<std::string_view, 7>{owner, kind, entries, channel, acquisition, grace,
                                        release_id});
    EXPECT_TRUE(r.is_integer()) << r.text();
    return r.as_integer();
}

// The release the reaper sends for an attempt the client gave up (ARGV[8] '1'): it leaves the
// attempt's first entry in mode `kind` while it is counted.
std::int64_t run_attempt_release(redislock::client& client, std::string_view name,
                                 std::string_view owner, std::string_view kind,
                                 std::string_view attempt) {
    const std::string queue_key = redislock::detail::derived_key(name, "queue");
    const std::string lapse_key = redislock::detail::derived_key(name, "waiting");
    const std::string channel = redislock::detail::derived_key(name, "released");
    const reply r = redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::shared_release,
        std::array<std::string_view, 3>{name, queue_key, lapse_key},
        std::array<std::string_view, 8>{owner, kind, "1", channel, attempt, "2000", "", "1"});
    EXPECT_TRUE(r.is_integer()) << r.text();
    return r.as_integer();
}

std::int64_t run_extend(redislock::client& client, std::string_view name, std::string_view owner,
                        std::string_view kind, std::string_view lease,
                        std::optional<std::string> id = std::nullopt) {
    const std::string acquisition = id.value_or(id_for(owner));
    const reply r = redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::shared_extend,
        std::array<std::string_view, 1>{name},
        std::array<std::string_view, 4>{owner, kind, lease, acquisition});
    EXPECT_TRUE(r.is_integer()) << r.text();
    return r.as_integer();
}

using verdict = std::pair<std::int64_t, std::int64_t>;

// {status, value} of an acquisition reply; acquisition_id() reads the id that comes last.
verdict verdict_of(const reply& r) {
    if (!r.is_array() || r.elements().size() != 3) {
        ADD_FAILURE() << "not a three-element array: " << r.text();
        return {-99, -99};
    }
    return {r.elements()[0].as_integer(), r.elements()[1].as_integer()};
}

std::string acquisition_id(const reply& r) {
    return r.is_array() && r.elements().size() == 3 ? r.elements()[2].text() : "(none)";
}

// The server's clock in microseconds, the clock fencing tokens never fall below.
long long server_us(const redis_server& srv) {
    std::istringstream in{srv.cli({"TIME"})};
    long long seconds = 0;
    long long micros = 0;
    in >> seconds >> micros;
    return seconds * 1'000'000 + micros;
}

// The fence of an acquisition reply with status `status`; fails the test and gives -1 for any
// other status.
std::int64_t fence_of(const reply& r, std::int64_t status = 1) {
    const auto [got, fence] = verdict_of(r);
    if (got != status) {
        ADD_FAILURE() << "status " << got << ", not " << status;
        return -1;
    }
    return fence;
}

// The fencing counter's PTTL: it expires a day after its last use.
void expect_counter_lives_a_day(const redis_server& srv, const std::string& counter) {
    const long long ttl = pttl(srv, counter);
    EXPECT_GT(ttl, 86'000'000) << counter;
    EXPECT_LE(ttl, 86'400'000) << counter;
}

std::int64_t counter_step(redislock::client& client, std::string_view key, std::string_view by) {
    const std::array<std::string_view, 3> incrby{"INCRBY", key, by};
    const reply r = client.connection().execute(incrby);
    if (!r.is_integer()) {
        throw std::runtime_error{"INCRBY " + std::string{key} + ": " + r.text()};
    }
    return r.as_integer();
}

// ---------------------------------------------------------------------------------------------
// shared_acquire.lua

TEST(SharedAcquireScript, ReaderEntersWithItsOwnLeaseThenReentersCounted) {
    redis_server srv;
    redislock::client client{srv.uri()};

    const long long before = server_ms(srv);
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(1, 0));
    hash fields = hash_of(srv, "doc");
    EXPECT_EQ(fields["mode"], "read");
    const entry first = parse_entry(fields["r:A"]);
    EXPECT_EQ(first.count, 1);
    EXPECT_EQ(first.id, id_for("A"));
    // The entry's expiry is in server time, one lease from the acquisition.
    EXPECT_GE(first.expiry, before + 30'000);
    EXPECT_LE(first.expiry, server_ms(srv) + 30'000);
    EXPECT_GT(pttl(srv, "doc"), 25'000);

    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(2, 0));
    EXPECT_EQ(parse_entry(hash_of(srv, "doc")["r:A"]).count, 2);

    // Another reader gets an entry of its own beside A's.
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "B", "r", "30000")), verdict(1, 0));
    fields = hash_of(srv, "doc");
    EXPECT_EQ(count_prefixed(fields, "r:"), 2U);
    EXPECT_EQ(parse_entry(fields["r:A"]).count, 2);
    EXPECT_EQ(parse_entry(fields["r:B"]).count, 1);
    EXPECT_EQ(parse_entry(fields["r:A"]).id, id_for("A"));
    EXPECT_EQ(parse_entry(fields["r:B"]).id, id_for("B"));
}

TEST(SharedAcquireScript, WriterEntersWithANewFenceAndReentersWithTheSameOne) {
    redis_server srv;
    redislock::client client{srv.uri()};
    // The fencing counter only grows: it continues from whatever it holds, and never below the
    // server's clock in microseconds.
    ASSERT_EQ(srv.cli({"SET", "{doc}:fence", "41"}), "OK");

    const long long before = server_us(srv);
    const std::int64_t fence = fence_of(run_acquire(client, "doc", "W", "w", "30000", "1"));
    EXPECT_GT(fence, 41);
    EXPECT_GE(fence, before);
    EXPECT_LE(fence, server_us(srv));
    hash fields = hash_of(srv, "doc");
    EXPECT_EQ(fields["mode"], "write");
    EXPECT_EQ(fields["fence"], std::to_string(fence));
    EXPECT_EQ(parse_entry(fields["w:W"]).count, 1);
    EXPECT_EQ(srv.cli({"GET", "{doc}:fence"}), std::to_string(fence));

    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "W", "w", "30000", "1")), verdict(2, fence));
    EXPECT_EQ(parse_entry(hash_of(srv, "doc")["w:W"]).count, 2);
    // A re-entry draws no token.
    EXPECT_EQ(srv.cli({"GET", "{doc}:fence"}), std::to_string(fence));
    expect_counter_lives_a_day(srv, "{doc}:fence");  // far longer than any lease

    ASSERT_EQ(run_release(client, "doc", "W", "w", "2"), 1);
    const std::int64_t next = fence_of(run_acquire(client, "doc", "V", "w", "30000", "1"));
    EXPECT_GT(next, fence);
    EXPECT_EQ(srv.cli({"GET", "{doc}:fence"}), std::to_string(next));
    ASSERT_EQ(run_release(client, "doc", "V", "w"), 1);
    // Without fencing a writer draws nothing.
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "U", "w", "30000", "0")), verdict(1, 0));
    EXPECT_EQ(srv.cli({"GET", "{doc}:fence"}), std::to_string(next));
    ASSERT_EQ(run_release(client, "doc", "U", "w"), 1);

    // A counter ahead of the clock goes on by one.
    ASSERT_EQ(srv.cli({"SET", "{doc}:fence", "5000000000000000"}), "OK");
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "W", "w", "30000", "1")),
              verdict(1, 5'000'000'000'000'001));
    EXPECT_EQ(srv.cli({"GET", "{doc}:fence"}), "5000000000000001");
    expect_counter_lives_a_day(srv, "{doc}:fence");
}

TEST(SharedAcquireScript, EveryoneWaitsBehindAWriterForItsRemainingLease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "W", "w", "10000")), verdict(1, 0));
    const hash held = hash_of(srv, "doc");

    const auto [reader_status, reader_wait] =
        verdict_of(run_acquire(client, "doc", "R", "r", "30000"));
    EXPECT_EQ(reader_status, 0);
    EXPECT_GT(reader_wait, 8'000);
    EXPECT_LE(reader_wait, 10'000);

    const auto [writer_status, writer_wait] =
        verdict_of(run_acquire(client, "doc", "X", "w", "30000"));
    EXPECT_EQ(writer_status, 0);
    EXPECT_GT(writer_wait, 8'000);
    EXPECT_LE(writer_wait, 10'000);

    // Neither left an entry, and neither asked to queue.
    EXPECT_EQ(hash_of(srv, "doc"), held);
    EXPECT_TRUE(no_queue(srv, "doc"));
}

TEST(SharedAcquireScript, WriterWaitsBehindReadersForTheLongestLease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "5000")), verdict(1, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "B", "r", "20000")), verdict(1, 0));

    const auto [status, wait] = verdict_of(run_acquire(client, "doc", "W", "w", "30000"));
    EXPECT_EQ(status, 0);
    EXPECT_GT(wait, 18'000);
    EXPECT_LE(wait, 20'000);
    const hash fields = hash_of(srv, "doc");
    EXPECT_EQ(count_prefixed(fields, "w:"), 0U);
    EXPECT_EQ(fields.at("mode"), "read");
    EXPECT_TRUE(no_queue(srv, "doc"));  // a try ('0') does not queue
}

TEST(SharedAcquireScript, QueuedWriterHoldsBackNewReadersButNotReadersInside) {
    redis_server srv;
    redislock::client client{srv.uri()};
    subscriber released{srv, "{doc}:released"};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(1, 0));

    const long long before = server_ms(srv);
    const auto [status, wait] =
        verdict_of(run_acquire(client, "doc", "W", "w", "30000", "0", "1000"));
    EXPECT_EQ(status, 0);
    EXPECT_GT(wait, 25'000);  // A's lease
    EXPECT_EQ(queue_of(srv, "doc"), std::vector<std::string>{"wW"});
    // The entry lapses A's lease plus the keep from now, unless W comes back.
    const long long lapse = std::stoll(srv.cli({"ZSCORE", "{doc}:waiting", "wW"}));
    EXPECT_GE(lapse, before + wait + 1000);
    EXPECT_LE(lapse, server_ms(srv) + 31'000);
    EXPECT_EQ(count_prefixed(hash_of(srv, "doc"), "w:"), 0U);  // a waiting writer holds nothing

    // A new reader waits for the queued writer (phase-fair), trying or waiting in line; the
    // reader already inside re-enters.
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "N", "r", "30000")).first, 0);
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "N", "r", "30000", "0", "1000")).first, 0);
    EXPECT_EQ(hash_of(srv, "doc").count("r:N"), 0U);
    EXPECT_EQ(queue_of(srv, "doc"), (std::vector<std::string>{"wW", "rN"}));
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(2, 0));

    // A's release leaves no one inside: the key goes and the writer is told, N to check after.
    ASSERT_EQ(run_release(client, "doc", "A", "r", "2"), 2);
    EXPECT_FALSE(exists(srv, "doc"));
    EXPECT_EQ(released.next(), "wW ?rN");
    // N still may not pass the writer, which gets in; its queue entry goes.
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "N", "r", "30000", "0", "1000")).first, 0);
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "W", "w", "30000", "0", "1000")),
              verdict(1, 0));
    EXPECT_EQ(hash_of(srv, "doc")["mode"], "write");
    EXPECT_EQ(queue_of(srv, "doc"), std::vector<std::string>{"rN"});

    // The writer's release lets N in.
    ASSERT_EQ(run_release(client, "doc", "W", "w"), 2);
    EXPECT_EQ(released.next(), "rN");
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "N", "r", "30000", "0", "1000")),
              verdict(1, 0));
    EXPECT_TRUE(no_queue(srv, "doc"));
}

// Readers queued before a writer go together when a writer releases; a reader queued after the
// writer waits for it, and the writer for the readers before it.
TEST(SharedAcquireScript, ReadersQueuedBeforeAWriterGoTogetherAfterAWriterReleases) {
    redis_server srv;
    redislock::client client{srv.uri()};
    subscriber released{srv, "{doc}:released"};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "W", "w", "30000")), verdict(1, 0));
    for (const auto& [owner, kind] :
         {std::pair<std::string, std::string>{"R1", "r"}, {"R2", "r"}, {"X", "w"}, {"R3", "r"}}) {
        ASSERT_EQ(verdict_of(run_acquire(client, "doc", owner, kind, "30000", "0", "5000")).first,
                  0)
            << owner;
    }
    ASSERT_EQ(queue_of(srv, "doc"), (std::vector<std::string>{"rR1", "rR2", "wX", "rR3"}));

    ASSERT_EQ(run_release(client, "doc", "W", "w"), 2);
    EXPECT_EQ(released.next(), "rR1 rR2 ?wX");
    // Both readers before X get in together, in either order; R3 and X still wait.
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "R2", "r", "30000", "0", "5000")),
              verdict(1, 0));
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "R1", "r", "30000", "0", "5000")),
              verdict(1, 0));
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "R3", "r", "30000", "0", "5000")).first, 0);
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "X", "w", "30000", "0", "5000")).first, 0);
    hash fields = hash_of(srv, "doc");
    EXPECT_EQ(fields["mode"], "read");
    EXPECT_EQ(count_prefixed(fields, "r:"), 2U);
    EXPECT_EQ(queue_of(srv, "doc"), (std::vector<std::string>{"wX", "rR3"}));

    // The first reader out tells nobody (R2 still reads); the last one tells X.
    EXPECT_EQ(run_release(client, "doc", "R1", "r"), 1);
    ASSERT_EQ(srv.cli({"SPUBLISH", "{doc}:released", "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");
    EXPECT_EQ(run_release(client, "doc", "R2", "r"), 2);
    EXPECT_EQ(released.next(), "wX ?rR3");
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "R3", "r", "30000", "0", "5000")).first, 0);
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "X", "w", "30000", "0", "5000")),
              verdict(1, 0));
    EXPECT_EQ(queue_of(srv, "doc"), std::vector<std::string>{"rR3"});
}

// A queue key another program made a string: joining and the last release refuse before their
// first write, so neither writes and then fails half-way.
TEST(SharedAcquireScript, QueueKeyOfAnotherTypeIsRefusedBeforeAnyWrite) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "W", "w", "30000")), verdict(1, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "R", "r", "30000", "0", "5000")).first, 0);
    ASSERT_EQ(srv.cli({"SET", "{doc}:waiting", "not a queue"}), "OK");

    const reply joined = run_acquire(client, "doc", "X", "w", "30000", "0", "5000");
    EXPECT_TRUE(joined.is_error()) << joined.text();
    EXPECT_EQ(queue_of(srv, "doc"), (std::vector<std::string>{"rR"}));
    const std::string acquisition = id_for("W");
    const reply released = redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::shared_release,
        std::array<std::string_view, 3>{"doc", "{doc}:queue", "{doc}:waiting"},
        std::array<std::string_view, 6>{"W", "w", "1", "{doc}:released", acquisition, "2000"});
    EXPECT_TRUE(released.is_error()) << released.text();
    EXPECT_EQ(hash_of(srv, "doc")["mode"], "write") << "the release wrote";
}

TEST(SharedAcquireScript, WriterMayReadDespiteAnotherQueuedWriter) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "W", "w", "30000")), verdict(1, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "X", "w", "30000", "0", "1000")).first, 0);
    ASSERT_EQ(queue_of(srv, "doc"), std::vector<std::string>{"wX"});

    // Downgrade by the holder must not wait for a writer that waits for the holder.
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "W", "r", "30000")), verdict(1, 0));
    EXPECT_EQ(hash_of(srv, "doc")["mode"], "write");
}

TEST(SharedAcquireScript, ReaderAskingToWriteIsRefusedAndNothingChanges) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(1, 0));
    const hash before = hash_of(srv, "doc");

    const reply refused = run_acquire(client, "doc", "A", "w", "30000", "1", "1000");
    EXPECT_EQ(verdict_of(refused), verdict(-1, 0));
    EXPECT_EQ(acquisition_id(refused), "");
    EXPECT_EQ(hash_of(srv, "doc"), before);    // no write entry
    EXPECT_TRUE(no_queue(srv, "doc"));         // no queue entry
    EXPECT_FALSE(exists(srv, "{doc}:fence"));  // no token drawn
}

TEST(SharedAcquireScript, KeysThatAreNotReadWriteLocksAreWrongType) {
    redis_server srv;
    redislock::client client{srv.uri()};

    ASSERT_EQ(srv.cli({"SET", "plain", "value"}), "OK");
    const reply on_string = run_acquire(client, "plain", "A", "r", "30000");
    EXPECT_TRUE(on_string.is_error_code("WRONGTYPE")) << on_string.text();
    EXPECT_EQ(srv.cli({"GET", "plain"}), "value");

    // A reentrant lock's hash has no `mode` field.
    ASSERT_EQ(srv.cli({"HSET", "reentrant", "someone", "1"}), "1");
    const reply on_hash = run_acquire(client, "reentrant", "A", "w", "30000");
    EXPECT_TRUE(on_hash.is_error_code("WRONGTYPE")) << on_hash.text();
    EXPECT_EQ(hash_of(srv, "reentrant"), (hash{{"someone", "1"}}));

    ASSERT_EQ(srv.cli({"RPUSH", "list", "a"}), "1");
    const reply on_list = run_acquire(client, "list", "A", "r", "30000");
    EXPECT_TRUE(on_list.is_error_code("WRONGTYPE")) << on_list.text();
}

TEST(SharedAcquireScript, ReentryReturnsTheFirstEntrysIdEvenWhenOfferedAnother) {
    redis_server srv;
    redislock::client client{srv.uri()};

    const reply first = run_acquire(client, "doc", "A", "r", "30000");
    EXPECT_EQ(verdict_of(first), verdict(1, 0));
    EXPECT_EQ(acquisition_id(first), id_for("A"));
    // A re-entry joins the acquisition it enters: the id offered for a new one is not used.
    const reply reentry = run_acquire(client, "doc", "A", "r", "30000", "0", "0", "other-id");
    EXPECT_EQ(verdict_of(reentry), verdict(2, 0));
    EXPECT_EQ(acquisition_id(reentry), id_for("A"));
    const entry read = parse_entry(hash_of(srv, "doc")["r:A"]);
    EXPECT_EQ(read.count, 2);
    EXPECT_EQ(read.id, id_for("A"));
    ASSERT_EQ(run_release(client, "doc", "A", "r", "2"), 1);

    // The same for a writer, whose re-entry keeps its fence too.
    const reply writing = run_acquire(client, "doc", "W", "w", "30000", "1");
    const std::int64_t fence = fence_of(writing);
    EXPECT_GT(fence, 0);
    EXPECT_EQ(acquisition_id(writing), id_for("W"));
    const reply rewriting = run_acquire(client, "doc", "W", "w", "30000", "1", "0", "other-id");
    EXPECT_EQ(verdict_of(rewriting), verdict(2, fence));
    EXPECT_EQ(acquisition_id(rewriting), id_for("W"));
    EXPECT_EQ(parse_entry(hash_of(srv, "doc")["w:W"]).id, id_for("W"));

    // Each mode is an acquisition of its own: the writer's first read takes the offered id.
    const reply downgrade = run_acquire(client, "doc", "W", "r", "30000", "0", "0", "read-id");
    EXPECT_EQ(verdict_of(downgrade), verdict(1, 0));
    EXPECT_EQ(acquisition_id(downgrade), "read-id");
    const hash fields = hash_of(srv, "doc");
    EXPECT_EQ(parse_entry(fields.at("r:W")).id, "read-id");
    EXPECT_EQ(parse_entry(fields.at("w:W")).id, id_for("W"));
}

TEST(SharedAcquireScript, WaiterGetsNoAcquisitionId) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "W", "w", "30000")), verdict(1, 0));

    const reply reader = run_acquire(client, "doc", "R", "r", "30000");
    EXPECT_EQ(verdict_of(reader).first, 0);
    EXPECT_EQ(acquisition_id(reader), "");
    const reply writer = run_acquire(client, "doc", "X", "w", "30000", "0", "1000");
    EXPECT_EQ(verdict_of(writer).first, 0);
    EXPECT_EQ(acquisition_id(writer), "");

    // The queued writer waits in line, and has no entry in the hash: nothing was acquired.
    EXPECT_EQ(queue_of(srv, "doc"), std::vector<std::string>{"wX"});
    const hash fields = hash_of(srv, "doc");
    EXPECT_EQ(fields.count("r:R"), 0U);
    EXPECT_EQ(fields.count("w:X"), 0U);
}

// An attempt whose first reply was lost is sent again as it was: its own entry in that mode,
// which did land, is this call's as it is (its count, its fence; the later lease), not
// re-entered.
TEST(SharedAcquireScript, AttemptSentAgainAfterALostReplyClaimsItsOwnEntryInThatMode) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "R", "r", "1000", "0", "0", "rc", "1")),
              verdict(1, 0));
    const long long before = server_ms(srv);
    const reply read_retry = run_acquire(client, "doc", "R", "r", "30000", "0", "0", "rc", "1");
    EXPECT_EQ(verdict_of(read_retry), verdict(1, 0));
    EXPECT_EQ(acquisition_id(read_retry), "rc");
    const entry read = parse_entry(hash_of(srv, "doc")["r:R"]);
    EXPECT_EQ(read.count, 1);  // not 2: the lost entry is this one
    EXPECT_EQ(read.id, "rc");
    EXPECT_GE(read.expiry, before + 30'000);  // the retry's lease
    ASSERT_EQ(run_release(client, "doc", "R", "r", "1", std::string{"rc"}), 1);
    ASSERT_FALSE(exists(srv, "doc"));

    const std::int64_t first =
        fence_of(run_acquire(client, "doc", "W", "w", "1000", "1", "0", std::string{"wc"}, "1"));
    ASSERT_GT(first, 0);
    const reply write_retry = run_acquire(client, "doc", "W", "w", "30000", "1", "0", "wc", "1");
    const std::int64_t again = fence_of(write_retry);
    EXPECT_EQ(again, first);  // the acquisition's own token
    EXPECT_EQ(acquisition_id(write_retry), "wc");
    hash fields = hash_of(srv, "doc");
    EXPECT_EQ(parse_entry(fields["w:W"]).count, 1);
    EXPECT_EQ(parse_entry(fields["w:W"]).id, "wc");
    EXPECT_EQ(fields["fence"], std::to_string(again));
    EXPECT_EQ(fields["mode"], "write");
    EXPECT_EQ(srv.cli({"GET", "{doc}:fence"}), std::to_string(again));

    // The same id from an object that holds an entry in that mode is a re-entry, as is another
    // id from an object that holds none (a second object of the same owner).
    const reply reentry = run_acquire(client, "doc", "W", "w", "30000", "1", "0", "wc", "0");
    EXPECT_EQ(verdict_of(reentry), verdict(2, again));
    EXPECT_EQ(acquisition_id(reentry), "wc");
    const reply joined = run_acquire(client, "doc", "W", "w", "30000", "1", "0", "fresh", "1");
    EXPECT_EQ(verdict_of(joined), verdict(2, again));
    EXPECT_EQ(acquisition_id(joined), "wc");
    fields = hash_of(srv, "doc");
    EXPECT_EQ(parse_entry(fields["w:W"]).count, 3);
    EXPECT_EQ(parse_entry(fields["w:W"]).id, "wc");
    EXPECT_EQ(srv.cli({"GET", "{doc}:fence"}), std::to_string(again));

    // Another owner offering that id takes nothing over: it waits.
    const hash held = hash_of(srv, "doc");
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "X", "w", "30000", "1", "0", "wc", "1")).first,
              0);
    EXPECT_EQ(hash_of(srv, "doc"), held);
}

// As above, when others joined the waiting queue between the first attempt and its retry (as they
// do while the entry they wait for is held): the retry still claims its own entry rather than
// queueing behind waiters who wait for that very entry.
TEST(SharedAcquireScript, AttemptSentAgainClaimsItsEntryDespiteLaterWaiters) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::int64_t first = fence_of(
        run_acquire(client, "doc", "W", "w", "30000", "1", "1000", std::string{"wc"}, "1"));
    ASSERT_GT(first, 0);
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "X", "r", "30000", "0", "1000")).first, 0);
    ASSERT_EQ(queue_of(srv, "doc"), std::vector<std::string>{"rX"});
    const reply write_retry =
        run_acquire(client, "doc", "W", "w", "30000", "1", "1000", std::string{"wc"}, "1");
    EXPECT_EQ(fence_of(write_retry), first);
    EXPECT_EQ(acquisition_id(write_retry), "wc");
    EXPECT_EQ(queue_of(srv, "doc"), std::vector<std::string>{"rX"});

    ASSERT_EQ(verdict_of(run_acquire(client, "page", "R", "r", "30000", "0", "1000",
                                     std::string{"rc"}, "1")),
              verdict(1, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "page", "V", "w", "30000", "0", "1000")).first, 0);
    ASSERT_EQ(queue_of(srv, "page"), std::vector<std::string>{"wV"});
    const reply read_retry =
        run_acquire(client, "page", "R", "r", "30000", "0", "1000", std::string{"rc"}, "1");
    EXPECT_EQ(verdict_of(read_retry), verdict(1, 0));
    EXPECT_EQ(acquisition_id(read_retry), "rc");
    EXPECT_EQ(queue_of(srv, "page"), std::vector<std::string>{"wV"});
}

// Releases of the owner whose reply was lost, named as '<acquisition>/<count>/<release id>', are
// left before the owner enters, once, and only the owner's: other owners' entries stay.
TEST(SharedAcquireScript, UnsettledItemsLeaveTheOwnersEntriesOnceAndNoMore) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::int64_t old_fence =
        fence_of(run_acquire(client, "doc", "A", "w", "30000", "1", "0", "gw", "1"));
    ASSERT_GT(old_fence, 0);
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000", "0", "0", "gr", "1")),
              verdict(1, 0));  // a writer may read

    // Another object of the owner joins the write; ids of no first entry counted here, and
    // releases of another acquisition, leave nothing.
    const reply joined =
        run_acquire(client, "doc", "A", "w", "30000", "1", "0", "other", "1", "unrelated x/1/r0");
    EXPECT_EQ(verdict_of(joined), verdict(2, old_fence));
    EXPECT_EQ(acquisition_id(joined), "gw");
    ASSERT_EQ(parse_entry(hash_of(srv, "doc")["w:A"]).count, 2);

    // Naming both leaves one entry of each, not the joiner's: the read goes, the write is
    // re-entered by this call.
    const reply settled =
        run_acquire(client, "doc", "A", "w", "30000", "1", "0", "new", "1", "gr/1/r1 gw/1/r2");
    EXPECT_EQ(verdict_of(settled), verdict(2, old_fence));
    EXPECT_EQ(acquisition_id(settled), "gw");
    hash fields = hash_of(srv, "doc");
    EXPECT_EQ(fields.count("r:A"), 0U);
    EXPECT_EQ(parse_entry(fields["w:A"]).count, 2);
    EXPECT_EQ(fields["mode"], "write");
    // Named again, they leave nothing more.
    EXPECT_EQ(verdict_of(run_acquire(client, "doc", "A", "w", "30000", "1", "0", "again", "0",
                                     "gr/1/r1 gw/1/r2")),
              verdict(2, old_fence));
    EXPECT_EQ(parse_entry(hash_of(srv, "doc")["w:A"]).count, 3);
    // Nor does the release the reaper sends with the same id.
    EXPECT_EQ(run_release(client, "doc", "A", "w", "1", std::string{"gw"}, "r2"), 0);
    EXPECT_EQ(parse_entry(hash_of(srv, "doc")["w:A"]).count, 3);
    ASSERT_EQ(run_release(client, "doc", "A", "w", "3", std::string{"gw"}), 1);
    ASSERT_FALSE(exists(srv, "doc"));

    // Another owner's entry with a listed id stays, and still counts.
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "B", "r", "30000", "0", "0", "shared-id", "1")),
              verdict(1, 0));
    const entry b_before = parse_entry(hash_of(srv, "doc")["r:B"]);
    EXPECT_EQ(
        verdict_of(run_acquire(client, "doc", "A", "r", "30000", "0", "0", "a1", "1", "shared-id")),
        verdict(1, 0));
    EXPECT_EQ(
        verdict_of(run_acquire(client, "doc", "A", "w", "30000", "1", "0", "a2", "1", "shared-id")),
        verdict(-1, 0));  // A reads: its upgrade is refused, B's entry is not dropped
    fields = hash_of(srv, "doc");
    const entry b_after = parse_entry(fields["r:B"]);
    EXPECT_EQ(b_after.count, b_before.count);
    EXPECT_EQ(b_after.id, "shared-id");
    EXPECT_EQ(b_after.expiry, b_before.expiry);
    EXPECT_EQ(parse_entry(fields["r:A"]).id, "a1");
    const auto [status, wait] = verdict_of(
        run_acquire(client, "doc", "C", "w", "30000", "1", "0", "c1", "1", "shared-id/1/r4"));
    EXPECT_EQ(status, 0);  // B (and A) still hold the read lock
    EXPECT_GT(wait, 25'000);
}

// An attempt through an object holding none that joins the owner's entry is counted once however
// often it lands, and its id names that entry for a release or an unsettled item, which leave
// it once.
TEST(SharedAcquireScript, AJoinIsCountedOnceAndLeftByItsAttemptsId) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string owner = "A";
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", owner, "r", "30000", "0", "0", "a", "1")),
              verdict(1, 0));
    for (int landing = 0; landing < 2; ++landing) {
        const reply joined = run_acquire(client, "doc", owner, "r", "30000", "0", "0", "j1", "1");
        EXPECT_EQ(verdict_of(joined), verdict(2, 0));
        EXPECT_EQ(acquisition_id(joined), "a");
        EXPECT_EQ(parse_entry(hash_of(srv, "doc")["r:A"]).count, 2);
    }
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", owner, "r", "30000", "0", "0", "j2", "1")),
              verdict(2, 0));
    ASSERT_EQ(parse_entry(hash_of(srv, "doc")["r:A"]).count, 3);
    // The reaper's release of the first join, sent twice, leaves one entry; in the other mode,
    // or as a release of an acquisition, that id names nothing.
    EXPECT_EQ(run_attempt_release(client, "doc", owner, "w", "j1"), -1);
    EXPECT_EQ(run_release(client, "doc", owner, "r", "1", std::string{"j1"}, "r0"), -1);
    for (int landing = 0; landing < 2; ++landing) {
        EXPECT_EQ(run_attempt_release(client, "doc", owner, "r", "j1"), landing == 0 ? 0 : -1);
        EXPECT_EQ(parse_entry(hash_of(srv, "doc")["r:A"]).count, 2);
    }
    // A given-up attempt named by the next first entry leaves its entry: the owner's write is
    // then no upgrade once the first entry goes too.
    ASSERT_EQ(run_release(client, "doc", owner, "r", "1", std::string{"a"}), 0);
    const reply write = run_acquire(client, "doc", owner, "w", "30000", "0", "0", "w1", "1", "j2");
    EXPECT_EQ(verdict_of(write), verdict(1, 0));
    const hash fields = hash_of(srv, "doc");
    EXPECT_EQ(fields.count("r:A"), 0U);
    EXPECT_EQ(fields.count("firsts:r:A"), 0U);  // gone with the read entry
    EXPECT_EQ(fields.at("firsts:w:A"), "w1");
    EXPECT_EQ(parse_entry(fields.at("w:A")).count, 1);
}

// ---------------------------------------------------------------------------------------------
// shared_release.lua

TEST(SharedReleaseScript, LastReleaseDeletesTheKeyAndPublishesNothingWhenNoOneWaits) {
    redis_server srv;
    redislock::client client{srv.uri()};
    subscriber released{srv, "{doc}:released"};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(1, 0));

    EXPECT_EQ(run_release(client, "doc", "A", "r"), 1);
    EXPECT_FALSE(exists(srv, "doc"));
    // Messages arrive in order: the marker comes first only if the release published nothing.
    ASSERT_EQ(srv.cli({"SPUBLISH", "{doc}:released", "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");
}

TEST(SharedReleaseScript, LastReleaseWithAWaiterQueuedPublishesTheWaitersId) {
    redis_server srv;
    redislock::client client{srv.uri()};
    subscriber released{srv, "{doc}:released"};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "w", "30000")), verdict(1, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "B", "w", "30000", "0", "1000")).first, 0);

    const long long before = server_ms(srv);
    EXPECT_EQ(run_release(client, "doc", "A", "w", "1", std::nullopt, "", "3000"), 2);
    EXPECT_FALSE(exists(srv, "doc"));  // nothing kept in the hash for the waiter
    EXPECT_EQ(released.next(), "wB");
    // The told waiter's entry now lapses with the grace.
    const long long lapse = std::stoll(srv.cli({"ZSCORE", "{doc}:waiting", "wB"}));
    EXPECT_GE(lapse, before + 3000 - 1);
    EXPECT_LE(lapse, server_ms(srv) + 3000);
}

TEST(SharedReleaseScript, ReleaseWithOthersLeftKeepsTheKeyAndRecomputesModeAndLease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    // W writes with a long lease and reads with a short one; the key lives as long as the write.
    ASSERT_GT(fence_of(run_acquire(client, "doc", "W", "w", "60000", "1")), 0);
    ASSERT_EQ(hash_of(srv, "doc").count("fence"), 1U);
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "W", "r", "10000")), verdict(1, 0));
    ASSERT_GT(pttl(srv, "doc"), 50'000);

    EXPECT_EQ(run_release(client, "doc", "W", "w"), 1);
    const hash fields = hash_of(srv, "doc");
    EXPECT_EQ(fields.at("mode"), "read");
    EXPECT_EQ(fields.count("w:W"), 0U);
    EXPECT_EQ(fields.count("fence"), 0U);  // the token went with the write
    EXPECT_EQ(parse_entry(fields.at("r:W")).count, 1);
    // The key now lives only as long as what is left.
    EXPECT_GT(pttl(srv, "doc"), 5'000);
    EXPECT_LE(pttl(srv, "doc"), 10'000);
}

TEST(SharedReleaseScript, OuterEntriesKeepTheLockAndItsExpiry) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(1, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(2, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(2, 0));
    const long long expiry = parse_entry(hash_of(srv, "doc")["r:A"]).expiry;

    EXPECT_EQ(run_release(client, "doc", "A", "r"), 0);
    EXPECT_EQ(parse_entry(hash_of(srv, "doc")["r:A"]).count, 2);
    EXPECT_EQ(run_release(client, "doc", "A", "r"), 0);
    const entry left = parse_entry(hash_of(srv, "doc")["r:A"]);
    EXPECT_EQ(left.count, 1);
    EXPECT_EQ(left.expiry, expiry);
    EXPECT_EQ(left.id, id_for("A"));
    EXPECT_EQ(run_release(client, "doc", "A", "r"), 1);
    EXPECT_FALSE(exists(srv, "doc"));
}

TEST(SharedReleaseScript, EntryNotHeldOrExpiredIsMinusOneAndLeavesOthersAlone) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "B", "r", "60000")), verdict(1, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "50")), verdict(1, 0));
    std::this_thread::sleep_for(200ms);
    const hash before = hash_of(srv, "doc");

    EXPECT_EQ(run_release(client, "doc", "A", "r"), -1);      // expired
    EXPECT_EQ(run_release(client, "doc", "C", "r"), -1);      // never held
    EXPECT_EQ(run_release(client, "doc", "B", "w"), -1);      // held, but not in that mode
    EXPECT_EQ(run_release(client, "missing", "B", "r"), -1);  // no lock at all
    EXPECT_EQ(hash_of(srv, "doc"), before);
    EXPECT_GT(pttl(srv, "doc"), 50'000);
}

// A release made for an acquisition that was lost must not act on a later acquisition of the
// same owner.
TEST(SharedReleaseScript, ReleaseNamingAnotherAcquisitionIsMinusOneAndChangesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    subscriber released{srv, "{doc}:released"};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(1, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(2, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "B", "r", "60000")), verdict(1, 0));
    const hash before = hash_of(srv, "doc");

    EXPECT_EQ(run_release(client, "doc", "A", "r", "1", "stale"), -1);
    EXPECT_EQ(run_release(client, "doc", "A", "r", "2", "stale"), -1);
    EXPECT_EQ(run_release(client, "doc", "A", "r", "1", id_for("B")), -1);  // another owner's id
    EXPECT_EQ(hash_of(srv, "doc"), before);
    EXPECT_GT(pttl(srv, "doc"), 50'000);
    // Nothing was published: a marker published now is the next message.
    ASSERT_EQ(srv.cli({"SPUBLISH", "{doc}:released", "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");

    // The right id still releases.
    EXPECT_EQ(run_release(client, "doc", "A", "r", "2"), 1);
    EXPECT_EQ(hash_of(srv, "doc").count("r:A"), 0U);
}

TEST(SharedReleaseScript, WriteReleaseNamingAnotherAcquisitionKeepsTheEntryAndItsFence) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::int64_t fence = fence_of(run_acquire(client, "doc", "W", "w", "30000", "1"));
    ASSERT_GT(fence, 0);
    const hash before = hash_of(srv, "doc");

    EXPECT_EQ(run_release(client, "doc", "W", "w", "1", "stale"), -1);
    EXPECT_EQ(hash_of(srv, "doc"), before);
    EXPECT_EQ(before.at("fence"), std::to_string(fence));
    EXPECT_EQ(run_release(client, "doc", "W", "w"), 1);
    EXPECT_FALSE(exists(srv, "doc"));
}

// ---------------------------------------------------------------------------------------------
// shared_extend.lua

TEST(SharedExtendScript, ExtendMovesTheEntryAndTheKeyTtlAndACheckMovesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "1000")), verdict(1, 0));
    const long long first = parse_entry(hash_of(srv, "doc")["r:A"]).expiry;

    EXPECT_EQ(run_extend(client, "doc", "A", "r", "60000"), 1);
    const entry extended = parse_entry(hash_of(srv, "doc")["r:A"]);
    EXPECT_EQ(extended.count, 1);
    EXPECT_EQ(extended.id, id_for("A"));
    EXPECT_GE(extended.expiry - first, 58'000);
    EXPECT_GT(pttl(srv, "doc"), 55'000);
    EXPECT_LE(pttl(srv, "doc"), 60'000);

    EXPECT_EQ(run_extend(client, "doc", "A", "r", "0"), 1);
    EXPECT_EQ(parse_entry(hash_of(srv, "doc")["r:A"]).expiry, extended.expiry);
}

TEST(SharedExtendScript, EntryNotHeldOrExpiredIsZeroAndStaysAsItWas) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "60000")), verdict(1, 0));
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "C", "r", "50")), verdict(1, 0));
    std::this_thread::sleep_for(200ms);
    const hash before = hash_of(srv, "doc");

    EXPECT_EQ(run_extend(client, "doc", "C", "r", "60000"), 0);  // expired
    EXPECT_EQ(run_extend(client, "doc", "C", "r", "0"), 0);
    EXPECT_EQ(run_extend(client, "doc", "B", "r", "60000"), 0);  // never held
    EXPECT_EQ(run_extend(client, "doc", "A", "w", "60000"), 0);  // held, but not in that mode
    EXPECT_EQ(run_extend(client, "missing", "A", "r", "60000"), 0);
    EXPECT_EQ(hash_of(srv, "doc"), before);
    EXPECT_FALSE(exists(srv, "missing"));
}

// A renewal made for an acquisition that was lost must not keep a later acquisition of the same
// owner alive.
TEST(SharedExtendScript, ExtendNamingAnotherAcquisitionIsZeroAndChangesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(verdict_of(run_acquire(client, "doc", "A", "r", "30000")), verdict(1, 0));
    const hash before = hash_of(srv, "doc");

    EXPECT_EQ(run_extend(client, "doc", "A", "r", "60000", "stale"), 0);
    EXPECT_EQ(run_extend(client, "doc", "A", "r", "0", "stale"), 0);  // a check says so too
    EXPECT_EQ(run_extend(client, "doc", "A", "r", "60000", id_for("B")), 0);
    EXPECT_EQ(hash_of(srv, "doc"), before);
    EXPECT_LE(pttl(srv, "doc"), 30'000);

    // The right id still extends.
    EXPECT_EQ(run_extend(client, "doc", "A", "r", "60000"), 1);
    EXPECT_GT(pttl(srv, "doc"), 50'000);
}

// ---------------------------------------------------------------------------------------------
// Readers together, writers alone

TEST(SharedMutex, ReadersHoldTheLockAtTheSameTime) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rw = client.shared_mutex("catalog");

    std::mutex gate;
    std::condition_variable changed;
    int inside = 0;
    bool leave = false;
    std::array<bool, 2> saw_other{};
    std::vector<std::thread> readers;
    for (std::size_t i = 0; i < 2; ++i) {
        readers.emplace_back([&, i] {
            if (!rw.try_lock_shared_for(10s)) {
                return;
            }
            std::unique_lock lock{gate};
            ++inside;
            changed.notify_all();
            // Each reader waits, while holding, for the other to be inside too.
            saw_other[i] = changed.wait_for(lock, 10s, [&] { return inside == 2; });
            changed.wait_for(lock, 10s, [&] { return leave; });
            lock.unlock();
            rw.unlock_shared();
        });
    }
    bool both_inside = false;
    {
        std::unique_lock lock{gate};
        both_inside = changed.wait_for(lock, 10s, [&] { return inside == 2; });
    }
    // Redis agrees: two read entries at once.
    hash fields = hash_of(srv, "catalog");
    {
        std::lock_guard lock{gate};
        leave = true;
    }
    changed.notify_all();
    for (auto& reader : readers) {
        reader.join();
    }

    EXPECT_TRUE(both_inside);
    EXPECT_TRUE(saw_other[0]);
    EXPECT_TRUE(saw_other[1]);
    EXPECT_EQ(count_prefixed(fields, "r:"), 2U);
    EXPECT_EQ(fields["mode"], "read");
    EXPECT_FALSE(exists(srv, "catalog"));
}

TEST(SharedMutex, WriterExcludesReadersAndWriters) {
    redis_server srv;
    redislock::client writer_client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto writer = writer_client.shared_mutex("catalog");
    auto other = other_client.shared_mutex("catalog");

    writer.lock();
    EXPECT_EQ(hash_of(srv, "catalog")["mode"], "write");
    EXPECT_FALSE(other.try_lock_shared());
    EXPECT_FALSE(other.try_lock());
    EXPECT_FALSE(other.try_lock_shared_for(100ms));
    EXPECT_FALSE(other.try_lock_for(100ms));
    // Another thread through the writer's own object is another owner, and excluded too.
    bool read_from_thread = true;
    bool write_from_thread = true;
    std::thread{[&] {
        read_from_thread = writer.try_lock_shared();
        write_from_thread = writer.try_lock();
    }}.join();
    EXPECT_FALSE(read_from_thread);
    EXPECT_FALSE(write_from_thread);
    // The timed attempts that gave up left no queue entry behind (they leave in the background).
    EXPECT_TRUE(eventually([&] { return no_queue(srv, "catalog"); }))
        << testing::PrintToString(queue_of(srv, "catalog"));

    writer.unlock();
    EXPECT_FALSE(exists(srv, "catalog"));
    EXPECT_TRUE(other.try_lock_shared());
    other.unlock_shared();
    EXPECT_TRUE(other.try_lock());
    other.unlock();
}

// ---------------------------------------------------------------------------------------------
// Seed 004: one reader's release or expiry must never free another's read lock

TEST(SharedMutex, ReleasedReaderLeavesOtherReadersProtected) {
    redis_server srv;
    redislock::client a{srv.uri()};
    redislock::client b{srv.uri()};
    redislock::client w{srv.uri()};
    auto reader_a = a.shared_mutex("catalog");
    auto reader_b = b.shared_mutex("catalog");
    auto writer = w.shared_mutex("catalog");

    reader_a.lock_shared();
    reader_b.lock_shared();
    reader_a.unlock_shared();
    // B's own entry is untouched by A's release.
    const hash fields = hash_of(srv, "catalog");
    EXPECT_EQ(count_prefixed(fields, "r:"), 1U);
    EXPECT_EQ(fields.count("r:" + caller_owner(b)), 1U);
    EXPECT_FALSE(writer.try_lock());

    reader_b.unlock_shared();
    EXPECT_TRUE(writer.try_lock());
    writer.unlock();
}

TEST(SharedMutex, ExpiredReaderLeavesOtherReadersProtected) {
    redis_server srv;
    redislock::client a{srv.uri()};
    redislock::client b{srv.uri()};
    redislock::client w{srv.uri()};
    auto reader_a = a.shared_mutex("catalog", {.lease = 200ms});
    auto reader_b = b.shared_mutex("catalog", {.lease = 60s});
    auto writer = w.shared_mutex("catalog");

    reader_a.lock_shared();
    reader_b.lock_shared();
    std::this_thread::sleep_for(400ms);
    // A's lease has run out on the server, not only in A's estimate.
    EXPECT_FALSE(reader_a.verify());
    EXPECT_TRUE(reader_b.verify());
    EXPECT_FALSE(writer.try_lock());
    EXPECT_GT(pttl(srv, "catalog"), 50'000);  // the key lives as long as B's lease

    reader_b.unlock_shared();
    EXPECT_TRUE(writer.try_lock());
    writer.unlock();
}

// ---------------------------------------------------------------------------------------------
// Reentrancy, ownership, leases

// Objects of one owner share its entry in each mode, so that entry, and the key, must last as
// long as any of them counts on: a rival that gets in while one of them still holds is a second
// holder. `rival_gets_in` tries the other mode's lock as another owner (and gives it back).
// Whether the key's TTL covers what `holder` believes it has left: the TTL is read first, so
// the local estimate, read after it, can only be lower.
testing::AssertionResult outlives(const redis_server& srv, const std::string& key,
                                  const redislock::shared_mutex& holder) {
    const auto ttl = pttl(srv, key);
    const auto believed = holder.remaining().count();
    if (ttl >= believed) {
        return testing::AssertionSuccess();
    }
    return testing::AssertionFailure()
           << "the key has " << ttl << " ms left, the holder believes it has " << believed;
}

bool rival_gets_in(redislock::shared_mutex& rival, bool write) {
    const bool got = write ? rival.try_lock() : rival.try_lock_shared();
    if (got) {
        if (write) {
            rival.unlock();
        } else {
            rival.unlock_shared();
        }
    }
    return got;
}

TEST(SharedMutex, ObjectWithAShorterLeaseNeverShortensWhatAnotherObjectOfItsOwnerHolds) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    auto rival = other.shared_mutex("doc");
    for (const bool write : {false, true}) {
        SCOPED_TRACE(write ? "write" : "read");
        auto a = client.shared_mutex("doc", {.lease = 10s});
        auto b = client.shared_mutex("doc", {.lease = 1s});
        if (write) {
            a.lock();
            b.lock();  // a re-entry
            b.unlock();
        } else {
            a.lock_shared();
            b.lock_shared();
            b.unlock_shared();
        }
        EXPECT_TRUE(outlives(srv, "doc", a));

        std::this_thread::sleep_for(1200ms);
        ASSERT_TRUE(a.owned());
        EXPECT_FALSE(rival_gets_in(rival, !write))
            << "a rival got in while a holds with " << a.remaining().count() << " ms left";
        if (write) {
            a.unlock();
        } else {
            a.unlock_shared();
        }
        EXPECT_FALSE(exists(srv, "doc"));
    }
}

TEST(SharedMutex, ReentryThroughAnotherObjectKeepsALeaseTheHolderExtended) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    auto rival = other.shared_mutex("doc");
    auto a = client.shared_mutex("doc", {.lease = 1s});
    auto b = client.shared_mutex("doc", {.lease = 1s});
    a.lock_shared();
    ASSERT_TRUE(a.extend(10s));

    b.lock_shared();
    b.unlock_shared();
    EXPECT_TRUE(outlives(srv, "doc", a));

    std::this_thread::sleep_for(1200ms);
    ASSERT_TRUE(a.owned());
    EXPECT_FALSE(rival_gets_in(rival, true))
        << "a writer got in while a reads with " << a.remaining().count() << " ms left";
    a.unlock_shared();
    EXPECT_FALSE(exists(srv, "doc"));
}

TEST(SharedMutex, ExtendThroughAnotherObjectNeverShortensWhatTheHolderCountsOn) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    auto rival = other.shared_mutex("doc");
    auto a = client.shared_mutex("doc", {.lease = 10s});
    auto b = client.shared_mutex("doc", {.lease = 10s});
    a.lock_shared();
    b.lock_shared();

    ASSERT_TRUE(b.extend(1s));

    std::this_thread::sleep_for(1200ms);
    ASSERT_TRUE(a.owned());
    EXPECT_FALSE(rival_gets_in(rival, true))
        << "a writer got in while a reads with " << a.remaining().count() << " ms left";
    b.unlock_shared();
    a.unlock_shared();
    EXPECT_FALSE(exists(srv, "doc"));
}

// A re-entry never shortens what the object itself was granted: its entry keeps the longer
// lease, and so does its local deadline (a shorter one would be told lost early).
TEST(SharedMutex, ReentryKeepsTheLongerLeaseTheObjectWasExtendedTo) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rw = client.shared_mutex("doc", {.lease = 1s});
    const std::string field = "r:" + caller_owner(client);
    rw.lock_shared();
    ASSERT_TRUE(rw.extend(10s));
    const long long extended = parse_entry(hash_of(srv, "doc")[field]).expiry;

    rw.lock_shared();
    EXPECT_GE(parse_entry(hash_of(srv, "doc")[field]).expiry, extended);
    EXPECT_GT(pttl(srv, "doc"), 9000);
    EXPECT_GT(rw.remaining(), 8s);
    rw.unlock_shared();
    rw.unlock_shared();
    EXPECT_FALSE(exists(srv, "doc"));
}

TEST(SharedMutex, ReadLockIsReentrant) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    auto other = other_client.shared_mutex("catalog");
    const std::string field = "r:" + caller_owner(client);

    rw.lock_shared();
    EXPECT_TRUE(rw.try_lock_shared());
    EXPECT_TRUE(rw.try_lock_shared_for(1s));
    EXPECT_EQ(parse_entry(hash_of(srv, "catalog")[field]).count, 3);

    std::error_code ec;
    rw.unlock_shared(ec);
    EXPECT_FALSE(ec) << ec.message();
    rw.unlock_shared(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(parse_entry(hash_of(srv, "catalog")[field]).count, 1);
    EXPECT_FALSE(other.try_lock());  // one entry left still reads

    rw.unlock_shared(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(exists(srv, "catalog"));
    rw.unlock_shared(ec);
    EXPECT_EQ(ec, redislock::make_error_code(errc::not_held));
}

TEST(SharedMutex, WriteLockIsReentrant) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    auto other = other_client.shared_mutex("catalog");
    const std::string field = "w:" + caller_owner(client);

    rw.lock();
    EXPECT_TRUE(rw.try_lock());
    EXPECT_EQ(parse_entry(hash_of(srv, "catalog")[field]).count, 2);

    std::error_code ec;
    rw.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(parse_entry(hash_of(srv, "catalog")[field]).count, 1);
    EXPECT_FALSE(other.try_lock_shared());

    rw.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(exists(srv, "catalog"));
    EXPECT_TRUE(other.try_lock_shared());
    other.unlock_shared();
}

TEST(SharedMutex, UpgradeThroughTheSameObjectIsRefusedAsADeadlock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    auto other = other_client.shared_mutex("catalog");

    rw.lock_shared();
    const hash before = hash_of(srv, "catalog");
    expect_deadlock_refused([&] { rw.lock(); });
    expect_deadlock_refused([&] { (void)rw.try_lock_for(1s); });
    EXPECT_EQ(hash_of(srv, "catalog"), before);  // no write entry, no queue entry

    // Still a reader, and nothing more.
    EXPECT_TRUE(rw.owned());
    EXPECT_TRUE(other.try_lock_shared());
    other.unlock_shared();
    rw.unlock_shared();
    EXPECT_TRUE(other.try_lock());
    other.unlock();
}

TEST(SharedMutex, UpgradeThroughAnotherObjectOfTheSameOwnerIsRefusedByTheScript) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto reading = client.shared_mutex("catalog");
    // This object holds nothing itself: only the server knows the owner reads.
    auto writing = client.shared_mutex("catalog");

    reading.lock_shared();
    const hash before = hash_of(srv, "catalog");
    expect_deadlock_refused([&] { writing.lock(); });
    expect_deadlock_refused([&] { (void)writing.try_lock(); });
    EXPECT_EQ(hash_of(srv, "catalog"), before);
    EXPECT_FALSE(writing.owned());

    reading.unlock_shared();
    EXPECT_TRUE(writing.try_lock());
    writing.unlock();
}

TEST(SharedMutex, OwnerWritingThroughAnotherObjectReentersTheWriteLockWhileReading) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto writing = client.shared_mutex("catalog");
    // Reads as a writer may (a downgrade), then asks to write again: not an upgrade.
    auto reading = client.shared_mutex("catalog");
    const std::string owner = caller_owner(client);

    writing.lock();
    reading.lock_shared();
    EXPECT_NO_THROW(reading.lock());
    EXPECT_EQ(parse_entry(hash_of(srv, "catalog")["w:" + owner]).count, 2);
    reading.unlock();
    reading.unlock_shared();
    writing.unlock();
    EXPECT_FALSE(exists(srv, "catalog"));
}

TEST(SharedMutex, OnlyTheHoldingThreadCanReleaseItsEntry) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    auto stranger = other_client.shared_mutex("catalog");

    rw.lock_shared();
    const hash reading = hash_of(srv, "catalog");
    std::error_code read_release;
    std::error_code write_release;
    std::thread{[&] {
        rw.unlock_shared(read_release);
        rw.unlock(write_release);
    }}.join();
    EXPECT_EQ(read_release, redislock::make_error_code(errc::not_holder));
    EXPECT_EQ(write_release, redislock::make_error_code(errc::not_held));  // nobody writes
    std::error_code stranger_release;
    stranger.unlock_shared(stranger_release);
    EXPECT_EQ(stranger_release, redislock::make_error_code(errc::not_held));
    EXPECT_EQ(hash_of(srv, "catalog"), reading);
    rw.unlock_shared();

    rw.lock();
    const hash writing = hash_of(srv, "catalog");
    std::thread{[&] { rw.unlock(write_release); }}.join();
    EXPECT_EQ(write_release, redislock::make_error_code(errc::not_holder));
    EXPECT_EQ(hash_of(srv, "catalog"), writing);
    EXPECT_TRUE(rw.owned());
    rw.unlock();
    EXPECT_FALSE(exists(srv, "catalog"));
}

TEST(SharedMutex, LeaseFreesTheLockWhenTheReadingProcessDies) {
    redis_server srv;
    const std::string uri = srv.uri();
    // Forked before this process has any client or thread.
    child_process child{[&](line_channel& channel) -> int {
        redislock::client client{uri};
        auto rw = client.shared_mutex("catalog", {.lease = 300ms});
        const std::int64_t started = monotonic_ns();
        rw.lock_shared();
        channel.send("reading " + std::to_string(started));
        ::_exit(0);  // dies holding the read lock: no unlock, no destructor
    }};
    const auto line = child.channel().receive(10s);
    ASSERT_TRUE(line.has_value()) << "the child did not report";
    std::istringstream words{*line};
    std::string what;
    std::int64_t started = 0;
    words >> what >> started;
    ASSERT_EQ(what, "reading") << *line;
    EXPECT_EQ(child.wait(10s), 0);

    redislock::client client{uri};
    auto writer = client.shared_mutex("catalog");
    const bool entered = writer.try_lock_for(5s);
    const std::int64_t entered_ns = monotonic_ns();
    ASSERT_TRUE(entered) << "the dead reader's lease never ran out";
    // The dead reader kept the writer out for its whole lease (less clock rounding).
    EXPECT_GE(entered_ns - started, std::chrono::nanoseconds{290ms}.count());
    writer.unlock();
}

TEST(SharedMutex, DowngradeKeepsReadingAfterTheWriteLockIsReleased) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client writer_client{srv.uri()};
    redislock::client reader_client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    auto other_writer = writer_client.shared_mutex("catalog");
    auto other_reader = reader_client.shared_mutex("catalog");
    const std::string owner = caller_owner(client);

    rw.lock();
    rw.lock_shared();
    hash fields = hash_of(srv, "catalog");
    EXPECT_EQ(fields["mode"], "write");
    EXPECT_EQ(fields.count("w:" + owner), 1U);
    EXPECT_EQ(fields.count("r:" + owner), 1U);
    EXPECT_FALSE(other_reader.try_lock_shared());  // still written
    // Writing and reading, lock() re-enters the write lock.
    rw.lock();
    EXPECT_EQ(parse_entry(hash_of(srv, "catalog")["w:" + owner]).count, 2);
    rw.unlock();

    rw.unlock();
    fields = hash_of(srv, "catalog");
    EXPECT_EQ(fields["mode"], "read");
    EXPECT_EQ(fields.count("w:" + owner), 0U);
    EXPECT_TRUE(rw.owned());
    EXPECT_TRUE(rw.verify());
    EXPECT_FALSE(other_writer.try_lock());
    EXPECT_TRUE(other_reader.try_lock_shared());
    other_reader.unlock_shared();

    rw.unlock_shared();
    EXPECT_FALSE(exists(srv, "catalog"));
}

TEST(SharedMutex, DestroyingOrReassigningTheObjectLeavesItsEntriesAndMovingKeepsThem) {
    redis_server srv;
    redislock::client client{srv.uri()};
    {
        auto rw = client.shared_mutex("catalog");
        rw.lock();
        rw.lock();
        rw.lock_shared();
    }
    EXPECT_FALSE(exists(srv, "catalog"));

    auto first = client.shared_mutex("first");
    first.lock_shared();
    auto moved = std::move(first);
    EXPECT_TRUE(moved.owned());
    EXPECT_EQ(count_prefixed(hash_of(srv, "first"), "r:"), 1U);
    moved = client.shared_mutex("second");
    EXPECT_FALSE(exists(srv, "first"));
    moved.lock();
    EXPECT_EQ(hash_of(srv, "second")["mode"], "write");
    moved.unlock();
    EXPECT_FALSE(exists(srv, "second"));
}

TEST(SharedMutex, LockOutlivesItsClientAndStillReleases) {
    redis_server srv;
    auto client = std::make_unique<redislock::client>(srv.uri());
    auto rw = client->shared_mutex("catalog");
    rw.lock_shared();
    client.reset();
    EXPECT_TRUE(exists(srv, "catalog"));
    std::error_code ec;
    rw.unlock_shared(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_FALSE(exists(srv, "catalog"));
}

// ---------------------------------------------------------------------------------------------
// Writer priority

TEST(SharedMutex, WaitingWriterIsNotStarvedByAStreamOfReaders) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client writer_client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    auto writer = writer_client.shared_mutex("catalog");

    std::mutex gate;
    std::condition_variable changed;
    int inside = 0;  // readers between lock_shared() returning and unlock_shared()
    bool stop = false;
    std::atomic<long> reads{0};
    std::atomic<int> reader_failures{0};
    std::vector<std::thread> readers;
    const auto give_up = std::chrono::steady_clock::now() + 60s;
    for (int i = 0; i < 4; ++i) {
        readers.emplace_back([&] {
            for (int round = 0; round < 100'000 && std::chrono::steady_clock::now() < give_up;
                 ++round) {
                if (!rw.try_lock_shared_for(10s)) {
                    reader_failures.fetch_add(1);
                    continue;
                }
                {
                    std::lock_guard lock{gate};
                    ++inside;
                }
                changed.notify_all();
                std::this_thread::sleep_for(2ms);
                {
                    // Leave only while another reader is inside, so the read lock never has a
                    // gap a writer could slip through; alone, wait a little for company.
                    std::unique_lock lock{gate};
                    changed.wait_for(lock, 25ms, [&] { return inside >= 2 || stop; });
                    --inside;
                    if (stop) {
                        lock.unlock();
                        rw.unlock_shared();
                        return;
                    }
                }
                rw.unlock_shared();
                reads.fetch_add(1);
            }
        });
    }
    const bool streaming = eventually([&] { return reads.load() >= 40; });

    const stopwatch waited;
    const bool entered = writer.try_lock_for(10s);
    const auto wait = waited.elapsed();
    int readers_seen_inside = 0;
    long reads_when_released = 0;
    if (entered) {
        for (int i = 0; i < 5; ++i) {
            {
                std::lock_guard lock{gate};
                readers_seen_inside = std::max(readers_seen_inside, inside);
            }
            std::this_thread::sleep_for(1ms);
        }
        reads_when_released = reads.load();
        writer.unlock();
    }
    // Readers carry on once the writer is done.
    const bool resumed = eventually([&] { return reads.load() > reads_when_released + 4; });
    {
        std::lock_guard lock{gate};
        stop = true;
    }
    changed.notify_all();
    for (auto& reader : readers) {
        reader.join();
    }

    std::cout << "writer waited " << wait.count() << " ms behind 4 back-to-back readers"
              << std::endl;
    ASSERT_TRUE(streaming);
    ASSERT_TRUE(entered);
    EXPECT_LT(wait, 5s);
    EXPECT_EQ(readers_seen_inside, 0);
    EXPECT_TRUE(resumed);
    EXPECT_EQ(reader_failures.load(), 0);
}

TEST(SharedMutex, QueuedWriterBlocksNewReadersButNotReentry) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client writer_client{srv.uri()};
    redislock::client newcomer_client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    auto writer = writer_client.shared_mutex("catalog");
    auto newcomer = newcomer_client.shared_mutex("catalog");

    rw.lock_shared();
    std::atomic<bool> entered{false};
    std::thread waiting_writer{[&] {
        if (writer.try_lock_for(10s)) {
            entered = true;
            writer.unlock();
        }
    }};
    const bool queued = eventually([&] {
        const auto line = queue_of(srv, "catalog");
        return line.size() == 1 && line.front().starts_with("w");
    });
    const bool newcomer_read = newcomer.try_lock_shared();
    const bool reentered = rw.try_lock_shared();
    const long long depth = parse_entry(hash_of(srv, "catalog")["r:" + caller_owner(client)]).count;
    const bool writer_in_early = entered.load();
    rw.unlock_shared();
    rw.unlock_shared();
    waiting_writer.join();

    ASSERT_TRUE(queued);
    EXPECT_FALSE(newcomer_read);
    EXPECT_TRUE(reentered);
    EXPECT_EQ(depth, 2);
    EXPECT_FALSE(writer_in_early);
    EXPECT_TRUE(entered);
    EXPECT_FALSE(exists(srv, "catalog"));  // nothing left once the writer is done
    EXPECT_TRUE(newcomer.try_lock_shared());
    newcomer.unlock_shared();
}

TEST(SharedMutex, WriterWhoseWaitEndsInAnErrorLeavesTheQueue) {
    redis_server srv;
    redislock::client reader_client{srv.uri()};
    redislock::client newcomer_client{srv.uri()};
    redislock::basic_client<redislock::test::fault_connection> faulty{srv.uri()};
    auto reader = reader_client.shared_mutex("catalog");
    auto newcomer = newcomer_client.shared_mutex("catalog");
    auto writer = faulty.shared_mutex("catalog");

    reader.lock_shared();
    std::atomic<bool> failed{false};
    std::thread waiting_writer{[&] {
        try {
            (void)writer.try_lock_for(10s);
        } catch (const redislock::server_error&) {
            failed = true;
        }
    }};
    std::vector<std::string> line;
    const bool queued = eventually([&] {
        line = queue_of(srv, "catalog");
        return line.size() == 1 && line.front().starts_with("w");
    });
    // The writer's next attempt fails.
    // (an error that is not transient: a connection error would be ridden out until the deadline)
    faulty.connection().inject(redislock::test::fault::answer_error, "EVALSHA", 1,
                               redislock::detail::scripts::shared_acquire, "ERR injected failure");
    // Wake the writer now, as a release naming it would, rather than at its fallback timer.
    if (queued) {
        (void)srv.cli({"SPUBLISH", "{catalog}:released", line.front()});
    }
    waiting_writer.join();

    ASSERT_TRUE(queued);
    EXPECT_TRUE(failed);
    // A writer that no longer waits must not keep new readers out: it leaves the queue (in the
    // background).
    EXPECT_TRUE(eventually([&] { return no_queue(srv, "catalog"); }))
        << testing::PrintToString(queue_of(srv, "catalog"));
    EXPECT_TRUE(newcomer.try_lock_shared());
    newcomer.unlock_shared();
    reader.unlock_shared();
}

// ---------------------------------------------------------------------------------------------
// Stress: threads x processes

constexpr std::string_view stress_lock = "stress";
constexpr std::string_view readers_key = "stress:readers";
constexpr std::string_view writers_key = "stress:writers";

struct stress_tally {
    long long reads = 0;
    long long writes = 0;
    long long violations = 0;  // a counter showed someone inside who must not be
    long long timeouts = 0;
    long long errors = 0;
    std::vector<hold_interval> read_intervals;
    std::vector<hold_interval> write_intervals;

    void add(const stress_tally& other) {
        reads += other.reads;
        writes += other.writes;
        violations += other.violations;
        timeouts += other.timeouts;
        errors += other.errors;
        read_intervals.insert(read_intervals.end(), other.read_intervals.begin(),
                              other.read_intervals.end());
        write_intervals.insert(write_intervals.end(), other.write_intervals.begin(),
                               other.write_intervals.end());
    }
};

// One process's share: readers and writers on one lock object of one client until `end_ns`.
// While inside, a reader counts itself in `readers` and checks `writers` is 0; a writer counts
// itself in `writers`, checks it is alone there and that `readers` is 0.
stress_tally stress_party(const std::string& uri, int readers, int writers, std::int64_t end_ns) {
    redislock::client client{uri};
    auto rw = client.shared_mutex(stress_lock);
    std::mutex merge;
    stress_tally total;
    std::vector<std::thread> threads;
    for (int t = 0; t < readers + writers; ++t) {
        threads.emplace_back([&, writer = t >= readers] {
            stress_tally mine;
            try {
                for (int round = 0; round < 100'000 && monotonic_ns() < end_ns; ++round) {
                    if (writer) {
                        if (!rw.try_lock_for(10s)) {
                            ++mine.timeouts;
                            continue;
                        }
                        const std::int64_t enter = monotonic_ns();
                        mine.violations += counter_step(client, writers_key, "1") != 1;
                        mine.violations += counter_step(client, readers_key, "0") != 0;
                        std::this_thread::sleep_for(500us);
                        mine.violations += counter_step(client, readers_key, "0") != 0;
                        counter_step(client, writers_key, "-1");
                        mine.write_intervals.push_back({enter, monotonic_ns()});
                        rw.unlock();
                        ++mine.writes;
                        std::this_thread::sleep_for(10ms);  // let readers in between writes
                    } else {
                        if (!rw.try_lock_shared_for(10s)) {
                            ++mine.timeouts;
                            continue;
                        }
                        const std::int64_t enter = monotonic_ns();
                        counter_step(client, readers_key, "1");
                        mine.violations += counter_step(client, writers_key, "0") != 0;
                        std::this_thread::sleep_for(500us);
                        mine.violations += counter_step(client, writers_key, "0") != 0;
                        counter_step(client, readers_key, "-1");
                        mine.read_intervals.push_back({enter, monotonic_ns()});
                        rw.unlock_shared();
                        ++mine.reads;
                    }
                }
            } catch (...) {
                ++mine.errors;
            }
            std::lock_guard guard{merge};
            total.add(mine);
        });
    }
    for (auto& thread : threads) {
        thread.join();
    }
    return total;
}

void send_tally(line_channel& channel, const stress_tally& t) {
    channel.send("counts " + std::to_string(t.reads) + " " + std::to_string(t.writes) + " " +
                 std::to_string(t.violations) + " " + std::to_string(t.timeouts) + " " +
                 std::to_string(t.errors));
    for (const auto& [kind, intervals] :
         {std::pair{"read", &t.read_intervals}, std::pair{"write", &t.write_intervals}}) {
        for (const auto& i : *intervals) {
            channel.send(std::string{kind} + " " + std::to_string(i.enter_ns) + " " +
                         std::to_string(i.exit_ns));
        }
    }
    channel.send("done");
}

// Reads a child's report; false if it did not finish it in time.
bool receive_tally(line_channel& channel, stress_tally& into) {
    for (int lines = 0; lines < 1'000'000; ++lines) {
        const auto line = channel.receive(60s);
        if (!line) {
            return false;
        }
        std::istringstream words{*line};
        std::string kind;
        words >> kind;
        if (kind == "done") {
            return true;
        }
        if (kind == "counts") {
            stress_tally t;
            words >> t.reads >> t.writes >> t.violations >> t.timeouts >> t.errors;
            into.add(t);
        } else if (kind == "read" || kind == "write") {
            hold_interval i;
            words >> i.enter_ns >> i.exit_ns;
            (kind == "read" ? into.read_intervals : into.write_intervals).push_back(i);
        } else {
            ADD_FAILURE() << "child said: " << *line;
        }
    }
    return false;
}

// Write intervals that overlap a read interval.
int writes_overlapping_reads(const stress_tally& t) {
    int overlaps = 0;
    for (const auto& w : t.write_intervals) {
        for (const auto& r : t.read_intervals) {
            if (r.enter_ns < w.exit_ns && w.enter_ns < r.exit_ns) {
                ++overlaps;
            }
        }
    }
    return overlaps;
}

TEST(SharedMutex, ReadersAndWritersExcludeEachOtherAcrossThreadsAndProcesses) {
    redis_server srv;
    const std::string uri = srv.uri();
    const std::int64_t end_ns = monotonic_ns() + std::chrono::nanoseconds{3s}.count();

    // Forked before this process has any client or thread.
    std::vector<std::unique_ptr<child_process>> children;
    for (int p = 0; p < 2; ++p) {
        children.push_back(std::make_unique<child_process>([&](line_channel& channel) {
            send_tally(channel, stress_party(uri, 3, 1, end_ns));
            return 0;
        }));
    }
    stress_tally all = stress_party(uri, 3, 1, end_ns);
    for (auto& child : children) {
        EXPECT_TRUE(receive_tally(child->channel(), all));
        EXPECT_EQ(child->wait(30s), 0);
    }

    std::cout << "stress: " << all.reads << " reads, " << all.writes << " writes" << std::endl;
    EXPECT_EQ(all.violations, 0);
    EXPECT_EQ(all.timeouts, 0);
    EXPECT_EQ(all.errors, 0);
    EXPECT_GT(all.reads, 0);
    EXPECT_GT(all.writes, 0);
    EXPECT_EQ(static_cast<long long>(all.read_intervals.size()), all.reads);
    EXPECT_EQ(static_cast<long long>(all.write_intervals.size()), all.writes);
    EXPECT_FALSE(redislock::test::find_overlap(all.write_intervals).has_value());
    EXPECT_EQ(writes_overlapping_reads(all), 0);
    EXPECT_EQ(srv.cli({"GET", std::string{readers_key}}), "0");
    EXPECT_EQ(srv.cli({"GET", std::string{writers_key}}), "0");
    EXPECT_FALSE(exists(srv, std::string{stress_lock}));
}

TEST(SharedMutex, WritersIncrementAnExactCounterAcrossThreadsAndProcesses) {
    redis_server srv;
    const redislock::test::exclusion_options options{.uri = srv.uri()};
    const auto report = redislock::test::run_exclusion(options, [&](int) {
        auto client = std::make_shared<redislock::client>(options.uri);
        return [client](int) {
            auto rw = std::make_shared<redislock::shared_mutex>(client->shared_mutex("ledger"));
            return [client, rw](std::mt19937_64&, const std::function<void()>& critical) {
                std::unique_lock guard{*rw};
                critical();
            };
        };
    });
    EXPECT_TRUE(report.errors.empty()) << report.describe();
    EXPECT_EQ(report.completed, report.planned) << report.describe();
    EXPECT_EQ(report.counter, report.planned) << report.describe();
    EXPECT_FALSE(report.overlap().has_value()) << report.describe();
}

// ---------------------------------------------------------------------------------------------
// extend, remaining, owned, verify, fencing_token

TEST(SharedMutex, QueriesConcernTheCallingOwnerOnly) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rw = client.shared_mutex("catalog", {.fencing = true});

    rw.lock();
    const std::int64_t token = rw.fencing_token();
    const hash before = hash_of(srv, "catalog");
    struct seen {
        bool owned = true;
        std::chrono::milliseconds remaining{1};
        bool verified = true;
        bool extended = true;
        std::int64_t token = -1;
    } other;
    std::thread{[&] {
        other.owned = rw.owned();
        other.remaining = rw.remaining();
        other.verified = rw.verify();
        other.extended = rw.extend(60s);
        other.token = rw.fencing_token();
    }}.join();

    EXPECT_FALSE(other.owned);
    EXPECT_EQ(other.remaining, 0ms);
    EXPECT_FALSE(other.verified);
    EXPECT_FALSE(other.extended);
    EXPECT_EQ(other.token, 0);
    EXPECT_EQ(hash_of(srv, "catalog"), before);  // the other thread's extend moved nothing

    EXPECT_TRUE(rw.owned());
    EXPECT_GT(rw.remaining(), 0ms);
    EXPECT_TRUE(rw.verify());
    EXPECT_GT(token, 0);
    rw.unlock();
}

TEST(SharedMutex, ExtendMovesEveryHeldEntryAndVerifyOnlyChecks) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rw = client.shared_mutex("catalog", {.lease = 1s});
    const std::string owner = caller_owner(client);

    rw.lock();
    rw.lock_shared();
    hash fields = hash_of(srv, "catalog");
    const long long write_before = parse_entry(fields["w:" + owner]).expiry;
    const long long read_before = parse_entry(fields["r:" + owner]).expiry;
    EXPECT_LE(rw.remaining(), 1s);

    ASSERT_TRUE(rw.extend(60s));
    fields = hash_of(srv, "catalog");
    const long long write_after = parse_entry(fields["w:" + owner]).expiry;
    const long long read_after = parse_entry(fields["r:" + owner]).expiry;
    EXPECT_GE(write_after - write_before, 58'000);
    EXPECT_GE(read_after - read_before, 58'000);
    EXPECT_GT(pttl(srv, "catalog"), 55'000);
    EXPECT_LE(pttl(srv, "catalog"), 60'000);
    EXPECT_GT(rw.remaining(), 50s);
    EXPECT_LE(rw.remaining(), 60s);

    ASSERT_TRUE(rw.verify());
    fields = hash_of(srv, "catalog");
    EXPECT_EQ(parse_entry(fields["w:" + owner]).expiry, write_after);
    EXPECT_EQ(parse_entry(fields["r:" + owner]).expiry, read_after);

    rw.unlock();
    rw.unlock_shared();
    EXPECT_FALSE(rw.extend(60s));  // holds nothing: false without asking
    EXPECT_FALSE(rw.verify());
    EXPECT_FALSE(rw.owned());
    EXPECT_EQ(rw.remaining(), 0ms);
    EXPECT_FALSE(exists(srv, "catalog"));  // the failed extend made no key
}

TEST(SharedMutex, ExtendOfAnEntryGoneBehindItsBackFailsAndReportsTheLoss) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto rw = client.shared_mutex("catalog", {.on_lost = lost.handler()});

    rw.lock_shared();
    ASSERT_EQ(srv.cli({"DEL", "catalog"}), "1");
    EXPECT_TRUE(rw.owned());  // local: it cannot know yet
    EXPECT_FALSE(rw.extend(60s));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(rw.owned());
    EXPECT_FALSE(exists(srv, "catalog"));  // extend never recreates a lost entry
    std::error_code ec;
    rw.unlock_shared(ec);
    EXPECT_EQ(ec, redislock::make_error_code(errc::lock_lost));
    EXPECT_EQ(lost.calls.load(), 1);
}

TEST(SharedMutex, ExpiryWhileReadingIsReportedOnceThroughOnLost) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto rw = client.shared_mutex("catalog", {.lease = 200ms, .on_lost = lost.handler()});

    rw.lock_shared();
    EXPECT_TRUE(rw.owned());
    std::this_thread::sleep_for(400ms);
    EXPECT_FALSE(rw.owned());
    EXPECT_EQ(rw.remaining(), 0ms);
    EXPECT_EQ(lost.calls.load(), 1);  // told at the local deadline, before a rival can be inside

    EXPECT_FALSE(rw.verify());
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_FALSE(rw.verify());
    EXPECT_FALSE(rw.extend(1s));
    std::error_code ec;
    rw.unlock_shared(ec);
    EXPECT_EQ(ec, redislock::make_error_code(errc::lock_lost));
    EXPECT_EQ(lost.calls.load(), 1);
    rw.unlock_shared(ec);
    EXPECT_EQ(ec, redislock::make_error_code(errc::not_held));
}

TEST(SharedMutex, ExpiryWhileWritingIsReportedOnceAndLetsAnotherWriterIn) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    lost_counter lost;
    auto rw = client.shared_mutex("catalog", {.lease = 200ms, .on_lost = lost.handler()});
    auto other = other_client.shared_mutex("catalog");

    rw.lock();
    std::this_thread::sleep_for(400ms);
    EXPECT_TRUE(other.try_lock());
    EXPECT_FALSE(rw.owned());
    EXPECT_FALSE(rw.verify());
    EXPECT_EQ(lost.calls.load(), 1);

    // The expired writer's unlock leaves the new writer's entry alone.
    const hash held = hash_of(srv, "catalog");
    std::error_code ec;
    rw.unlock(ec);
    EXPECT_EQ(ec, redislock::make_error_code(errc::lock_lost));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(hash_of(srv, "catalog"), held);
    other.unlock();
}

// Object a's read entry expires unnoticed; the same thread then reads anew through b. a's
// release, made for the lost acquisition, must leave b's acquisition alone.
TEST(SharedMutex, StaleObjectOfTheSameOwnerNeverReleasesALaterAcquisition) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto a = client.shared_mutex("catalog", {.lease = 200ms, .on_lost = lost.handler()});
    auto b = client.shared_mutex("catalog", {.lease = 10s});
    const std::string field = "r:" + caller_owner(client);

    a.lock_shared();
    std::this_thread::sleep_for(400ms);
    b.lock_shared();  // a new acquisition: a's entry is gone
    const hash held = hash_of(srv, "catalog");
    ASSERT_EQ(held.count(field), 1U);
    ASSERT_EQ(parse_entry(held.at(field)).count, 1);

    std::error_code ec;
    a.unlock_shared(ec);
    EXPECT_EQ(ec, redislock::make_error_code(errc::lock_lost));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(hash_of(srv, "catalog"), held);  // b's entry, count and lease untouched
    EXPECT_TRUE(b.verify());
    EXPECT_EQ(lost.calls.load(), 1);

    b.unlock_shared();
    EXPECT_FALSE(exists(srv, "catalog"));
}

// The same for renewal: a's extend, made for the lost acquisition, must not move b's lease.
TEST(SharedMutex, StaleObjectOfTheSameOwnerNeverRenewsALaterAcquisition) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    auto a = client.shared_mutex("catalog", {.lease = 200ms, .on_lost = lost.handler()});
    auto b = client.shared_mutex("catalog", {.lease = 10s});

    a.lock_shared();
    std::this_thread::sleep_for(400ms);
    b.lock_shared();
    const hash held = hash_of(srv, "catalog");

    EXPECT_FALSE(a.extend(60s));
    EXPECT_EQ(lost.calls.load(), 1);
    EXPECT_EQ(hash_of(srv, "catalog"), held);
    EXPECT_LE(pttl(srv, "catalog"), 10'000);
    EXPECT_TRUE(b.verify());

    std::error_code ec;
    a.unlock_shared(ec);
    EXPECT_EQ(ec, redislock::make_error_code(errc::lock_lost));
    EXPECT_EQ(lost.calls.load(), 1);
    b.unlock_shared();
    EXPECT_FALSE(exists(srv, "catalog"));
}

TEST(SharedMutex, WatchdogKeepsEveryHeldModeAlivePastItsLease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    // A lease long enough for a machine busy with other work to renew in time.
    auto rw = client.shared_mutex("catalog", {.lease = 1500ms, .watchdog = true});
    auto other = other_client.shared_mutex("catalog");

    rw.lock();
    rw.lock_shared();
    std::this_thread::sleep_for(2s);  // more than a lease
    EXPECT_TRUE(rw.verify());
    EXPECT_TRUE(rw.owned());
    EXPECT_FALSE(other.try_lock_shared());
    rw.unlock();
    std::this_thread::sleep_for(2s);
    EXPECT_TRUE(rw.verify());  // the read entry is still renewed
    EXPECT_FALSE(other.try_lock());
    EXPECT_TRUE(other.try_lock_shared());
    other.unlock_shared();

    rw.unlock_shared();
    EXPECT_FALSE(exists(srv, "catalog"));
}

TEST(SharedMutex, FencingTokensIncreaseAcrossWriteAcquisitionsAndReadersHaveNone) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto rw = client.shared_mutex("catalog", {.fencing = true});
    auto other = other_client.shared_mutex("catalog", {.fencing = true});

    rw.lock();
    const std::int64_t first = rw.fencing_token();
    EXPECT_GT(first, 0);
    rw.lock();
    EXPECT_EQ(rw.fencing_token(), first);  // a re-entry keeps its token
    rw.lock_shared();
    EXPECT_EQ(rw.fencing_token(), first);  // so does reading as well
    rw.unlock_shared();
    rw.unlock();
    rw.unlock();
    EXPECT_EQ(rw.fencing_token(), 0);

    rw.lock();
    const std::int64_t second = rw.fencing_token();
    rw.unlock();
    other.lock();
    const std::int64_t third = other.fencing_token();
    other.unlock();
    EXPECT_GT(second, first);
    EXPECT_GT(third, second);
    EXPECT_EQ(srv.cli({"GET", "{catalog}:fence"}), std::to_string(third));

    rw.lock_shared();
    EXPECT_EQ(rw.fencing_token(), 0);
    rw.unlock_shared();
}

// Queues waiter `waiter` for the read-write lock `name` at script level, as a lock() call that
// found it held would; returns the reply's status (0: refused, and queued).
std::int64_t queue_waiter(redislock::client& client, const std::string& name, std::string_view kind,
                          std::string_view waiter) {
    const std::string queue_key = redislock::detail::derived_key(name, "queue");
    const std::string lapse_key = redislock::detail::derived_key(name, "waiting");
    const std::string channel = redislock::detail::derived_key(name, "released");
    const reply r = redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::shared_acquire,
        std::array<std::string_view, 3>{name, queue_key, lapse_key},
        std::array<std::string_view, 11>{"script-owner", kind, "60000", "0", waiter, "script-id",
                                         "1", "", "5000", channel, "2000"});
    return verdict_of(r).first;
}

TEST(SharedMutex, LastReleasePublishesOnTheReleaseChannelOnlyWhenSomeoneWaits) {
    redis_server srv;
    redislock::client client{srv.uri()};
    subscriber released{srv, "{catalog}:released"};
    subscriber tagged{srv, "a{x}b:released"};
    auto rw = client.shared_mutex("catalog");
    auto tagged_rw = client.shared_mutex("a{x}b");

    // Nobody waits: no release publishes. Messages arrive in order, so a marker published
    // afterwards is the next message.
    rw.lock_shared();
    rw.lock_shared();
    rw.unlock_shared();
    rw.unlock_shared();
    ASSERT_EQ(srv.cli({"SPUBLISH", "{catalog}:released", "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");

    // A writer waits (queued at script level): the outer release tells nobody, the last one
    // tells the writer.
    rw.lock_shared();
    rw.lock_shared();
    ASSERT_EQ(queue_waiter(client, "catalog", "w", "wwaiting"), 0);
    rw.unlock_shared();
    ASSERT_EQ(srv.cli({"SPUBLISH", "{catalog}:released", "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");
    rw.unlock_shared();
    EXPECT_EQ(released.next(), "wwaiting");

    // On a name with a hash tag, the channel reuses the tag.
    tagged_rw.lock();
    tagged_rw.unlock();
    ASSERT_EQ(srv.cli({"SPUBLISH", "a{x}b:released", "marker"}), "1");
    EXPECT_EQ(tagged.next(), "marker");
    tagged_rw.lock();
    ASSERT_EQ(queue_waiter(client, "a{x}b", "r", "rwaiting"), 0);
    tagged_rw.unlock();
    EXPECT_EQ(tagged.next(), "rwaiting");
}

// ---------------------------------------------------------------------------------------------
// Queries: is_locked() and holder_ttl() ask the server about the name, whoever holds it

TEST(SharedMutex, QueriesSeeAFreeNameAsHeldByNoOne) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const auto rw = client.shared_mutex("catalog");
    EXPECT_FALSE(rw.is_locked());
    EXPECT_EQ(rw.holder_ttl(), 0ms);
    EXPECT_FALSE(exists(srv, "catalog")) << "a query writes nothing";
}

TEST(SharedMutex, QueriesSeeAWriterWhoeverItIs) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client elsewhere{srv.uri()};  // another process, as far as the server knows
    auto rw = client.shared_mutex("catalog", {.lease = 5s});
    const auto other = elsewhere.shared_mutex("catalog");
    rw.lock();
    EXPECT_TRUE(rw.is_locked());
    EXPECT_TRUE(other.is_locked());
    EXPECT_GT(other.holder_ttl(), 0ms);
    EXPECT_LE(other.holder_ttl(), 5s);
    rw.unlock();
    EXPECT_FALSE(other.is_locked());
    EXPECT_EQ(other.holder_ttl(), 0ms);
}

// Each reader has its own lease: the lock stays held as long as the longest of them.
TEST(SharedMutex, HolderTtlOfSeveralReadersIsTheLongestLease) {
    redis_server srv;
    redislock::client a{srv.uri()};
    redislock::client b{srv.uri()};
    auto long_reader = a.shared_mutex("catalog", {.lease = 30s});
    auto short_reader = b.shared_mutex("catalog", {.lease = 2s});
    long_reader.lock_shared();
    short_reader.lock_shared();  // the last entry, not the longest
    EXPECT_TRUE(short_reader.is_locked());
    EXPECT_GT(short_reader.holder_ttl(), 2s);
    EXPECT_LE(short_reader.holder_ttl(), 30s);
    long_reader.unlock_shared();
    EXPECT_TRUE(long_reader.is_locked());
    EXPECT_GT(long_reader.holder_ttl(), 0ms);
    EXPECT_LE(long_reader.holder_ttl(), 2s);
    short_reader.unlock_shared();
    EXPECT_FALSE(long_reader.is_locked());
    EXPECT_EQ(long_reader.holder_ttl(), 0ms);
}

TEST(SharedMutex, QueriesSeeAnExpiredLockAsFree) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rw = client.shared_mutex("catalog", {.lease = 200ms});
    rw.lock_shared();
    EXPECT_TRUE(rw.is_locked());
    std::this_thread::sleep_for(400ms);
    EXPECT_FALSE(rw.is_locked());
    EXPECT_EQ(rw.holder_ttl(), 0ms);
}

// An entry past its own expiry holds nothing, though it stays in the hash until a script prunes
// it and the key lives on (as long as the longest lease it was given); the key's TTL still
// bounds what an entry has left.
TEST(SharedMutex, QueriesReadEachEntrysOwnExpiryNotTheKeys) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const auto rw = client.shared_mutex("catalog");
    // A reader's entry that expired a second after the epoch, in a key with 30 s left.
    ASSERT_EQ(srv.cli({"HSET", "catalog", "mode", "read", "r:someone", "1 1000 a1"}), "2");
    ASSERT_EQ(srv.cli({"PEXPIRE", "catalog", "30000"}), "1");
    EXPECT_FALSE(rw.is_locked());
    EXPECT_EQ(rw.holder_ttl(), 0ms);

    // A writer's entry whose expiry is far away, in a key with 3 s left: 3 s at most.
    ASSERT_EQ(srv.cli({"HSET", "catalog", "w:someone", "1 99999999999999 a1", "mode", "write"}),
              "1");
    ASSERT_EQ(srv.cli({"PEXPIRE", "catalog", "3000"}), "1");
    EXPECT_TRUE(rw.is_locked());
    EXPECT_GT(rw.holder_ttl(), 0ms);
    EXPECT_LE(rw.holder_ttl(), 3s);
}

TEST(SharedMutex, QueriesDoNotCountAHashHoldingOnlyBooksAsHeld) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const auto rw = client.shared_mutex("catalog");
    ASSERT_EQ(srv.cli({"HSET", "catalog", "mode", "read", "fence", "12", "r:gone",
                       "0 99999999999999 a1"}),
              "3");
    ASSERT_EQ(srv.cli({"PEXPIRE", "catalog", "5000"}), "1");
    EXPECT_FALSE(rw.is_locked());
    EXPECT_EQ(rw.holder_ttl(), 0ms);
}

TEST(SharedMutex, QueriesOnAReentrantLockOrAStringThrowWrongtype) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.recursive_mutex("catalog", {.lease = 5s});
    m.lock();
    const auto rw = client.shared_mutex("catalog");
    try {
        (void)rw.is_locked();
        ADD_FAILURE() << "a query on a reentrant lock's name must throw";
    } catch (const redislock::server_error& e) {
        EXPECT_NE(std::string{e.what()}.find("WRONGTYPE"), std::string::npos) << e.what();
    }
    m.unlock();
    ASSERT_EQ(srv.cli({"SET", "catalog", "token"}), "OK");
    EXPECT_THROW((void)rw.holder_ttl(), redislock::server_error);
}

// ---------------------------------------------------------------------------------------------
// Bad input

TEST(SharedMutex, RejectsBadNamesLeasesAndBackoffBounds) {
    redis_server srv;
    redislock::client client{srv.uri()};

    EXPECT_THROW((void)client.shared_mutex(""), redislock::invalid_argument);
    EXPECT_THROW((void)client.shared_mutex(std::string(64 * 1024 + 1, 'n')),
                 redislock::invalid_argument);
    EXPECT_THROW((void)client.shared_mutex("catalog", {.lease = 0ms}), redislock::invalid_argument);
    EXPECT_THROW((void)client.shared_mutex("catalog", {.lease = -5ms}),
                 redislock::invalid_argument);
    EXPECT_THROW((void)client.shared_mutex("catalog", {.lease = redislock::max_lease + 1ms}),
                 redislock::invalid_argument);
    const lock_options inverted{.backoff_min = 10ms, .backoff_max = 5ms};
    EXPECT_THROW((void)client.shared_mutex("catalog", inverted), redislock::invalid_argument);
    EXPECT_NO_THROW((void)client.shared_mutex("catalog", {.lease = redislock::max_lease}));

    auto rw = client.shared_mutex("catalog");
    rw.lock_shared();
    EXPECT_THROW((void)rw.extend(0ms), redislock::invalid_argument);
    EXPECT_THROW((void)rw.extend(-1ms), redislock::invalid_argument);
    EXPECT_THROW((void)rw.extend(redislock::max_lease + 1ms), redislock::invalid_argument);
    EXPECT_TRUE(rw.verify());  // the refused extends left the lock as it was
    rw.unlock_shared();
    EXPECT_EQ(srv.cli({"DBSIZE"}), "0");
}

TEST(SharedMutex, NameHoldingAnotherKindOfLockFailsWithWrongType) {
    redis_server srv;
    redislock::client client{srv.uri()};

    auto simple = client.mutex("orders");
    simple.lock();
    const std::string token = srv.cli({"GET", "orders"});
    auto on_simple = client.shared_mutex("orders");
    expect_wrongtype([&] { (void)on_simple.try_lock_shared(); });
    expect_wrongtype([&] { on_simple.lock(); });
    EXPECT_EQ(srv.cli({"GET", "orders"}), token);
    EXPECT_FALSE(on_simple.owned());

    auto reentrant = client.recursive_mutex("stock");
    reentrant.lock();
    const hash reentrant_hash = hash_of(srv, "stock");
    auto on_reentrant = client.shared_mutex("stock");
    expect_wrongtype([&] { on_reentrant.lock_shared(); });
    expect_wrongtype([&] { (void)on_reentrant.try_lock_for(100ms); });
    EXPECT_EQ(hash_of(srv, "stock"), reentrant_hash);

    simple.unlock();
    reentrant.unlock();
}

TEST(SharedMutex, OtherKindsOfLockFailWithWrongTypeOnAReadWriteLocksName) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    rw.lock_shared();
    const hash held = hash_of(srv, "catalog");

    auto reentrant = client.recursive_mutex("catalog");
    expect_wrongtype([&] { (void)reentrant.try_lock(); });
    expect_wrongtype([&] { reentrant.lock(); });
    auto simple = client.mutex("catalog");
    expect_wrongtype([&] { (void)simple.try_lock(); });
    EXPECT_EQ(hash_of(srv, "catalog"), held);

    rw.unlock_shared();
    EXPECT_FALSE(exists(srv, "catalog"));
}

// ---------------------------------------------------------------------------------------------
// Standard guards

TEST(SharedMutex, UniqueLockGuardsTheWriteSide) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    auto other = other_client.shared_mutex("catalog");
    {
        std::unique_lock writing{rw};
        EXPECT_TRUE(writing.owns_lock());
        EXPECT_FALSE(other.try_lock_shared());
        std::unique_lock refused{other, std::try_to_lock};
        EXPECT_FALSE(refused.owns_lock());
        std::unique_lock timed_out{other, 50ms};
        EXPECT_FALSE(timed_out.owns_lock());
    }
    EXPECT_FALSE(exists(srv, "catalog"));
    {
        std::unique_lock timed{other, 2s};
        EXPECT_TRUE(timed.owns_lock());
        EXPECT_EQ(hash_of(srv, "catalog")["mode"], "write");
    }
    EXPECT_FALSE(exists(srv, "catalog"));
}

TEST(SharedMutex, SharedLockGuardsTheReadSide) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client reader_client{srv.uri()};
    redislock::client writer_client{srv.uri()};
    auto rw = client.shared_mutex("catalog");
    auto reader = reader_client.shared_mutex("catalog");
    auto writer = writer_client.shared_mutex("catalog");
    {
        std::shared_lock reading{rw};
        std::shared_lock also{reader, std::try_to_lock};
        std::shared_lock timed{reader, 2s};  // the same owner again: a re-entry
        EXPECT_TRUE(reading.owns_lock());
        EXPECT_TRUE(also.owns_lock());
        EXPECT_TRUE(timed.owns_lock());
        EXPECT_EQ(count_prefixed(hash_of(srv, "catalog"), "r:"), 2U);
        std::unique_lock excluded{writer, std::try_to_lock};
        EXPECT_FALSE(excluded.owns_lock());
    }
    EXPECT_FALSE(exists(srv, "catalog"));
}

TEST(SharedMutex, ScopedLockTakesSeveralLocksTogether) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto first = client.shared_mutex("first");
    auto second = client.shared_mutex("second");
    auto simple = client.mutex("third");
    auto other_first = other_client.shared_mutex("first");
    auto other_second = other_client.shared_mutex("second");
    {
        std::scoped_lock all{first, second, simple};
        EXPECT_EQ(hash_of(srv, "first")["mode"], "write");
        EXPECT_EQ(hash_of(srv, "second")["mode"], "write");
        EXPECT_TRUE(exists(srv, "third"));
        EXPECT_FALSE(other_first.try_lock_shared());
        EXPECT_FALSE(other_second.try_lock_shared());
    }
    EXPECT_FALSE(exists(srv, "first"));
    EXPECT_FALSE(exists(srv, "second"));
    EXPECT_FALSE(exists(srv, "third"));
}

}  // namespace

namespace {

// Re-entered reads found gone at unlock: the renewal of that hold must stop with it, or it would
// outlive the object and call back into freed state (ASan catches a slip).
TEST(SharedMutex, ReadEntriesFoundGoneAtUnlockStopTheirRenewal) {
    redis_server srv;
    redislock::client client{srv.uri()};
    lost_counter lost;
    {
        auto rw = client.shared_mutex(
            "gone:rw", {.lease = 300ms, .watchdog = true, .on_lost = lost.handler()});
        rw.lock_shared();
        rw.lock_shared();
        ASSERT_EQ(client.watchdog().size(), 1U);
        ASSERT_EQ(srv.cli({"DEL", "gone:rw"}), "1");
        std::error_code ec;
        rw.unlock_shared(ec);  // depth 2 -> 1 locally; Redis has nothing left
        EXPECT_EQ(ec, errc::lock_lost);
        // A lease cancelled while its renewal is in flight goes when that renewal settles.
        EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
        EXPECT_FALSE(rw.owned());
    }
    std::this_thread::sleep_for(400ms);  // past a renewal period, with the object gone
    EXPECT_LE(lost.calls.load(), 1);
}

// The entry `owner` holds in `name` in mode `kind` ('r' or 'w'), as the server has it.
entry entry_of(const redis_server& srv, const std::string& name, std::string_view kind,
               const std::string& owner) {
    const hash fields = hash_of(srv, name);
    const auto it = fields.find(std::string{kind} + ":" + owner);
    return it == fields.end() ? entry{} : parse_entry(it->second);
}

using faulty_hiredis = redislock::test::faulty_connection<redislock::hiredis_connection>;

// Locks `m` in `kind` ('r' or 'w').
void enter(redislock::basic_shared_mutex<faulty_hiredis>& m, std::string_view kind) {
    kind == "w" ? m.lock() : m.lock_shared();
}

void leave(redislock::basic_shared_mutex<faulty_hiredis>& m, std::string_view kind,
           std::error_code& ec) {
    kind == "w" ? m.unlock(ec) : m.unlock_shared(ec);
}

bool owns(const redislock::basic_shared_mutex<faulty_hiredis>& m, std::string_view) {
    return m.owned();
}

// Whether a writer of another client gets `name` now.
bool a_rival_writer_gets_in(const redis_server& srv, const std::string& name) {
    redislock::client rival_client{srv.uri()};
    auto rival = rival_client.shared_mutex(name);
    if (!rival.try_lock()) {
        return false;
    }
    rival.unlock();
    return true;
}

// Two objects of one owner share its entry; the release of the second one's last entry is sent
// again after its reply was lost, in the background: it must leave that entry once, never the
// first object's.
TEST(SharedMutex, AReleaseSentAgainAfterALostReplyNeverTakesAnotherObjectsEntry) {
    for (const std::string_view kind : {"w", "r"}) {
        SCOPED_TRACE(kind);
        redis_server srv;
        faulty_hiredis conn{srv.uri()};
        redislock::basic_client<faulty_hiredis> client{conn};
        const redislock::lock_options task{.lease = 30s, .owner = "task-9"};
        const std::string owner = redislock::detail::owner_id(client.instance_id(), "task-9");
        auto first = client.shared_mutex("x", task);
        auto joined = client.shared_mutex("x", task);
        enter(first, kind);
        enter(first, kind);
        std::error_code ec;
        leave(first, kind, ec);  // the release script is loaded: a dropped reply is its answer's
        ASSERT_FALSE(ec);
        enter(joined, kind);
        ASSERT_EQ(entry_of(srv, "x", kind, owner).count, 2);
        const auto before = conn.count("EVALSHA", "shared_release");
        conn.add({.command = "EVALSHA",
                  .script = "shared_release",
                  .action = redislock::test::fault_action::drop_reply});
        leave(joined, kind, ec);
        EXPECT_TRUE(ec) << "the reply was dropped";
        ASSERT_TRUE(redislock::test::eventually(
            [&] { return conn.count("EVALSHA", "shared_release") >= before + 2; }, 10s));
        std::this_thread::sleep_for(200ms);
        EXPECT_EQ(entry_of(srv, "x", kind, owner).count, 1);
        EXPECT_TRUE(owns(first, kind));
        EXPECT_FALSE(a_rival_writer_gets_in(srv, "x"));
        leave(first, kind, ec);
        EXPECT_FALSE(ec);
        EXPECT_FALSE(exists(srv, "x"));
    }
}

// The same, with every send of that release unanswered: the object's next lock() settles it
// and must leave the first object's entry in place.
TEST(SharedMutex, ANextLockAfterAnUnansweredReleaseKeepsAnotherObjectsEntry) {
    for (const std::string_view kind : {"w", "r"}) {
        SCOPED_TRACE(kind);
        redis_server srv;
        faulty_hiredis conn{srv.uri()};
        redislock::basic_client<faulty_hiredis> client{conn};
        const redislock::lock_options task{.lease = 30s, .owner = "task-9"};
        const std::string owner = redislock::detail::owner_id(client.instance_id(), "task-9");
        auto first = client.shared_mutex("x", task);
        auto joined = client.shared_mutex("x", task);
        enter(first, kind);
        enter(first, kind);
        std::error_code ec;
        leave(first, kind, ec);
        enter(joined, kind);
        conn.add({.command = "EVALSHA",
                  .script = "shared_release",
                  .action = redislock::test::fault_action::drop_reply,
                  .times = -1});
        leave(joined, kind, ec);
        EXPECT_TRUE(ec) << "the reply was dropped";
        enter(joined, kind);
        conn.clear_rules();
        leave(joined, kind, ec);
        EXPECT_FALSE(ec);
        std::this_thread::sleep_for(200ms);
        EXPECT_EQ(entry_of(srv, "x", kind, owner).count, 1);
        EXPECT_TRUE(owns(first, kind));
        EXPECT_FALSE(a_rival_writer_gets_in(srv, "x"));
        leave(first, kind, ec);
        EXPECT_FALSE(ec);
        EXPECT_FALSE(exists(srv, "x"));
    }
}

// An attempt that joined the owner's entry through another object, whose reply was lost, is given
// up, and the object locks again: the lost join must be left once, so that nothing is held once
// every object let go, and the owner's next write is no upgrade.
TEST(SharedMutex, AJoinWhoseReplyWasLostIsLeftOnce) {
    for (const std::string_view kind : {"w", "r"}) {
        SCOPED_TRACE(kind);
        redis_server srv;
        faulty_hiredis conn{srv.uri()};
        redislock::basic_client<faulty_hiredis> client{conn};
        const redislock::lock_options task{.lease = 30s, .owner = "task-9"};
        const std::string owner = redislock::detail::owner_id(client.instance_id(), "task-9");
        auto first = client.shared_mutex("x", task);
        auto joiner = client.shared_mutex("x", task);
        enter(first, kind);
        conn.add({.command = "EVALSHA",
                  .script = "shared_acquire",
                  .action = redislock::test::fault_action::drop_reply});
        try {
            enter(joiner, kind);  // the reply is lost
        } catch (const redislock::error&) {
        }
        if (!owns(joiner, kind)) {
            enter(joiner, kind);
        }
        std::error_code ec;
        leave(joiner, kind, ec);
        EXPECT_FALSE(ec);
        leave(first, kind, ec);
        EXPECT_FALSE(ec);
        ASSERT_TRUE(redislock::detail::background_reaper().wait_idle(5s));
        EXPECT_FALSE(exists(srv, "x")) << srv.cli({"HGETALL", "x"});
        first.lock();  // no read entry of the owner is left to make this an upgrade
        EXPECT_EQ(entry_of(srv, "x", "w", owner).count, 1);
        first.unlock();
        EXPECT_FALSE(exists(srv, "x"));
    }
}

// The local deadline has passed (owned() is false) but the loss timer has not told it yet (its
// thread is busy telling another loss): the next lock must be a first entry with a lease of its
// own, never a re-entry into the expired hold.
TEST(SharedMutex, ALockAfterTheLocalDeadlineIsAFirstEntryBeforeTheTimerTellsTheLoss) {
    for (const std::string_view kind : {"w", "r"}) {
        SCOPED_TRACE(kind);
        redis_server srv;
        faulty_hiredis conn{srv.uri()};
        redislock::basic_client<faulty_hiredis> client{conn};
        std::atomic<bool> telling{false};
        std::atomic<bool> let_timer_go{false};
        auto blocker = client.mutex("blocker", {.lease = 300ms, .on_lost = [&] {
                                                    telling = true;
                                                    for (int i = 0; i < 400 && !let_timer_go; ++i) {
                                                        std::this_thread::sleep_for(5ms);
                                                    }
                                                }});
        auto m = client.shared_mutex("x", {.lease = 1s});
        blocker.lock();
        enter(m, kind);
        ASSERT_TRUE(redislock::test::eventually([&] { return telling.load(); }, 2s));
        ASSERT_TRUE(redislock::test::eventually([&] { return !owns(m, kind); }, 2s));
        enter(m, kind);
        EXPECT_TRUE(owns(m, kind));
        EXPECT_FALSE(m.lost_token().stop_requested());
        let_timer_go = true;
        std::error_code ec;
        leave(m, kind, ec);
        EXPECT_FALSE(ec) << ec.message();
        EXPECT_TRUE(redislock::test::eventually([&] { return !exists(srv, "x"); }, 2s));
    }
}

// An object of the owner whose own lease ran out locally, while another object of the owner
// still holds the entry they share, locks again: the first object's entry must stay.
TEST(SharedMutex, AnObjectLostByItsLeaseKeepsAnotherObjectsEntryOnItsNextLock) {
    for (const std::string_view kind : {"w", "r"}) {
        SCOPED_TRACE(kind);
        redis_server srv;
        faulty_hiredis conn{srv.uri()};
        redislock::basic_client<faulty_hiredis> client{conn};
        const std::string owner = redislock::detail::owner_id(client.instance_id(), "task-9");
        auto first = client.shared_mutex("x", {.lease = 30s, .owner = "task-9"});
        auto brief = client.shared_mutex("x", {.lease = 1s, .owner = "task-9"});
        enter(first, kind);
        enter(brief, kind);
        ASSERT_TRUE(redislock::test::eventually([&] { return !owns(brief, kind); }, 10s));
        std::this_thread::sleep_for(200ms);  // its entry is taken back in the background
        enter(brief, kind);
        std::error_code ec;
        leave(brief, kind, ec);
        EXPECT_FALSE(ec);
        EXPECT_TRUE(owns(first, kind));
        EXPECT_EQ(entry_of(srv, "x", kind, owner).count, 1);
        EXPECT_FALSE(a_rival_writer_gets_in(srv, "x"));
        leave(first, kind, ec);
        EXPECT_FALSE(ec);
        EXPECT_FALSE(exists(srv, "x"));
    }
}

// A release whose reply was lost is settled once: after it landed, eight more releases of the
// owner that push its id out of left:<owner> never let the object's next lock() leave it again.
TEST(SharedMutex, ASettledReleaseIsNeverLeftAgain) {
    for (const std::string_view kind : {"r", "w"}) {
        SCOPED_TRACE(kind);
        redis_server srv;
        faulty_hiredis conn{srv.uri()};
        redislock::basic_client<faulty_hiredis> client{conn};
        const redislock::lock_options task{.lease = 30s, .owner = "task-9"};
        const std::string owner = redislock::detail::owner_id(client.instance_id(), "task-9");
        auto first = client.shared_mutex("x", task);
        auto joined = client.shared_mutex("x", task);
        std::error_code ec;
        enter(first, kind);
        enter(first, kind);
        leave(first, kind, ec);  // the release script is loaded: a dropped reply is its answer's
        enter(joined, kind);
        enter(joined, kind);
        ASSERT_EQ(entry_of(srv, "x", kind, owner).count, 3);
        const auto before = conn.count("EVALSHA", "shared_release");
        conn.add({.command = "EVALSHA",
                  .script = "shared_release",
                  .action = redislock::test::fault_action::drop_reply});
        leave(joined, kind, ec);  // an inner release: it lands, its reply is lost
        EXPECT_TRUE(ec);
        ASSERT_TRUE(redislock::test::eventually(
            [&] { return conn.count("EVALSHA", "shared_release") >= before + 2; }, 10s));
        std::this_thread::sleep_for(200ms);
        ASSERT_EQ(entry_of(srv, "x", kind, owner).count, 2);
        for (int i = 0; i < 8; ++i) {
            enter(first, kind);
            leave(first, kind, ec);
            ASSERT_FALSE(ec);
        }
        leave(joined, kind, ec);
        ASSERT_FALSE(ec);
        ASSERT_EQ(entry_of(srv, "x", kind, owner).count, 1);
        enter(joined, kind);
        leave(joined, kind, ec);
        EXPECT_FALSE(ec);
        EXPECT_TRUE(owns(first, kind));
        EXPECT_EQ(entry_of(srv, "x", kind, owner).count, 1);
        EXPECT_FALSE(a_rival_writer_gets_in(srv, "x"));
        leave(first, kind, ec);
        EXPECT_FALSE(ec);
        EXPECT_FALSE(exists(srv, "x"));
    }
}

// A re-entry whose reply was lost (it landed) is left with the hold's last release: the lock is
// free after it, even while the owner comes back within a lease.
TEST(SharedMutex, AReentryWhoseReplyWasLostIsLeftWithTheLastRelease) {
    redis_server srv;
    faulty_hiredis conn{srv.uri()};
    redislock::basic_client<faulty_hiredis> client{conn};
    auto m = client.shared_mutex("x", {.lease = 2s, .owner = "task-9"});
    m.lock();
    conn.add({.command = "EVALSHA",
              .script = "shared_acquire",
              .action = redislock::test::fault_action::drop_reply});
    try {
        m.lock();  // its reply is lost; a retry may re-enter again
    } catch (const redislock::error&) {
    }
    std::error_code ec;
    while (!ec) {
        m.unlock(ec);
    }
    EXPECT_EQ(ec, redislock::errc::not_held);
    EXPECT_FALSE(exists(srv, "x"));
    m.lock();
    m.unlock();
    EXPECT_TRUE(a_rival_writer_gets_in(srv, "x"));
}

// Releases of an owner that left keep no books in a hash other holders keep alive.
TEST(SharedMutex, AnOwnerThatLeftKeepsNoReleaseIdsInTheHash) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto reader = client.shared_mutex("x", {.lease = 30s, .owner = "stays"});
    reader.lock_shared();
    for (int i = 0; i < 5; ++i) {
        auto passing =
            client.shared_mutex("x", {.lease = 30s, .owner = "passing-" + std::to_string(i)});
        passing.lock_shared();
        passing.lock_shared();
        passing.unlock_shared();
        passing.unlock_shared();
    }
    EXPECT_EQ(count_prefixed(hash_of(srv, "x"), "left:"), 0U);
    reader.unlock_shared();
    EXPECT_FALSE(exists(srv, "x"));
}

// An attempt that timed out lands late (the server slept) and its entry is joined by another
// object of the owner once the client no longer names it as given up; the first object's next
// lock() must leave only that attempt's own entry, never the joiner's.
TEST(SharedMutex, AnAttemptGivenUpAndJoinedLaterKeepsTheJoinersEntry) {
    redis_server srv{{.extra_args = {"--enable-debug-command", "yes"}}};
    faulty_hiredis conn{srv.uri()};
    redislock::basic_client<faulty_hiredis> client{conn};
    const std::string owner = redislock::detail::owner_id(client.instance_id(), "task-9");
    auto brief = client.shared_mutex("x", {.lease = 1500ms, .owner = "task-9"});
    auto joiner = client.shared_mutex("x", {.lease = 30s, .owner = "task-9"});
    brief.lock();
    brief.lock();
    brief.unlock();
    brief.unlock();  // both scripts are loaded
    // The reaper's leave of the given-up attempt never goes out: the next lock() settles it.
    conn.add({.command = "EVALSHA",
              .script = "shared_release",
              .action = redislock::test::fault_action::throw_before_send,
              .times = -1});
    bool acquired = false;
    {
        // The server sleeps past the attempt's lease: the attempt waits in its socket and runs
        // when it wakes, after its caller and the client's registry gave it up (a paused
        // client's command would be dropped with its connection instead).
        const redislock::test::server_asleep sleep{srv, 3s};
        ASSERT_TRUE(sleep.asleep());
        try {
            acquired = brief.try_lock_for(50ms);
        } catch (const redislock::error&) {
        }
    }
    ASSERT_FALSE(acquired);
    // It runs once the server wakes.
    ASSERT_TRUE(redislock::test::eventually([&] { return exists(srv, "x"); }, 1s));
    ASSERT_EQ(entry_of(srv, "x", "w", owner).count, 1) << srv.cli({"HGETALL", "x"});
    joiner.lock();
    ASSERT_EQ(entry_of(srv, "x", "w", owner).count, 2);
    conn.clear_rules();
    brief.lock();
    brief.unlock();
    ASSERT_TRUE(redislock::detail::background_reaper().wait_idle(5s));
    EXPECT_TRUE(joiner.owned());
    EXPECT_EQ(entry_of(srv, "x", "w", owner).count, 1);
    EXPECT_FALSE(a_rival_writer_gets_in(srv, "x"));
    joiner.unlock();
    EXPECT_FALSE(exists(srv, "x"));
}

}  // namespace
