#include <redislock/recursive_mutex.hpp>

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <sys/time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <stop_token>
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
using redislock::test::child_process;
using redislock::test::line_channel;
using redislock::test::redis_server;
using redislock::test::stopwatch;
using redislock::test::subscriber;

// ---- Probes that read Redis through redis-cli, never through the code under test ----

// The owner fields of the reentrant lock `key`: every field but the fencing token, the
// acquisition ids, the marks of handed entries and the lists of given-up attempts, of releases
// that landed and of the first entries counted.
std::vector<std::string> owners_of(const redis_server& srv, const std::string& key) {
    std::vector<std::string> owners;
    std::istringstream lines{srv.cli({"HKEYS", key})};
    for (std::string line; std::getline(lines, line);) {
        if (!line.empty() && line != "fence" && !line.starts_with("id:") &&
            !line.starts_with("handed:") && !line.starts_with("gone:") &&
            !line.starts_with("left:") && !line.starts_with("firsts:")) {
            owners.push_back(line);
        }
    }
    return owners;
}

// The single owner field of `key`; fails the test (and returns "") when there is not exactly one.
std::string sole_owner(const redis_server& srv, const std::string& key) {
    const auto owners = owners_of(srv, key);
    EXPECT_EQ(owners.size(), 1U) << "owners of " << key << ": " << testing::PrintToString(owners);
    return owners.size() == 1 ? owners.front() : std::string{};
}

// The entry count of the single owner of `key`, as redis-cli prints it.
std::string sole_count(const redis_server& srv, const std::string& key) {
    const std::string owner = sole_owner(srv, key);
    return owner.empty() ? std::string{"(no single owner)"} : srv.cli({"HGET", key, owner});
}

std::int64_t pttl(const redis_server& srv, const std::string& key) {
    return std::stoll(srv.cli({"PTTL", key}));
}

std::string exists(const redis_server& srv, const std::string& key) {
    return srv.cli({"EXISTS", key});
}

// ---- The scripts run directly, with arguments the test chooses ----

// The integers of an integer reply or of an array reply, so a failed check prints values. The
// acquisition id an acquisition returns last is left out (acquisition_id() reads it).
std::vector<std::int64_t> integers(const redislock::reply& r) {
    if (r.is_integer()) {
        return {r.as_integer()};
    }
    std::vector<std::int64_t> out;
    for (const auto& element : r.elements()) {
        if (!element.is_string()) {
            out.push_back(element.is_integer() ? element.as_integer()
                                               : std::numeric_limits<std::int64_t>::min());
        }
    }
    return out;
}

std::string acquisition_id(const redislock::reply& r) {
    return r.is_array() && r.elements().size() == 3 ? r.elements()[2].text() : "(none)";
}

// The acquisition id the script tests offer for `owner`.
std::string id_for(std::string_view owner) {
    return "acq-" + std::string{owner};
}

// The waiter id the script tests use for `owner`: exclusive kinds' ids start with 'w'.
std::string waiter_for(std::string_view owner) {
    return "w" + std::string{owner};
}

// Without `id`, offers the owner's id_for(). `holds_none` ('1': the calling object holds no
// entry) and `given_up` (the ids of the attempts the client gave up) default to an object that
// holds an entry and gave up nothing, so an owner's entry is re-entered. `keep` '0' is a try
// that does not join the waiting queue; otherwise a refused attempt queues waiter_for(owner). A
// free lock the queue keeps from the caller goes to the head for `grace` ms.
redislock::reply run_acquire(redislock::client& client, std::string_view key,
                             std::string_view owner, std::string_view lease_ms,
                             std::string_view fencing, std::optional<std::string> id = std::nullopt,
                             std::string_view holds_none = "0", std::string_view given_up = "",
                             std::string_view keep = "0", std::string_view waiter_id = "",
                             std::string_view grace = "2000") {
    const std::string fence_key = redislock::detail::derived_key(key, "fence");
    const std::string queue_key = redislock::detail::derived_key(key, "queue");
    const std::string lapse_key = redislock::detail::derived_key(key, "waiting");
    const std::string channel = redislock::detail::derived_key(key, "released");
    const std::string offered = id.value_or(id_for(owner));
    const std::string waiter = waiter_id.empty() ? waiter_for(owner) : std::string{waiter_id};
    const std::array<std::string_view, 10> args{owner,    lease_ms, fencing, offered, holds_none,
                                                given_up, waiter,   keep,    channel, grace};
    if (fencing == "1") {
        return redislock::detail::run_script(
            client.connection(), redislock::detail::scripts::recursive_acquire,
            std::array<std::string_view, 4>{key, queue_key, lapse_key, fence_key}, args);
    }
    return redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::recursive_acquire,
        std::array<std::string_view, 3>{key, queue_key, lapse_key}, args);
}

// `owner` tries `key` once and, refused, joins its waiting queue as waiter_for(owner).
redislock::reply queue_owner(redislock::client& client, std::string_view key,
                             std::string_view owner) {
    return run_acquire(client, key, owner, "60000", "0", std::nullopt, "1", "", "5000");
}

// The waiter id of an `owner` the lock may be handed to, as acquisition `acquisition` (hex) with
// a lease of `lease_ms` (see _queue.lua).
std::string handed_waiter(std::string_view acquisition, std::string_view owner,
                          std::string_view lease_ms = "5000") {
    return "h" + std::string{acquisition} + "." + std::string{lease_ms} + "." + std::string{owner};
}

// `owner` tries `key` once as the waiter `waiter` and, refused, joins its waiting queue.
redislock::reply queue_as(redislock::client& client, std::string_view key, std::string_view owner,
                          std::string_view waiter) {
    return run_acquire(client, key, owner, "60000", "0", std::nullopt, "1", "", "5000", waiter);
}

// Waiter `waiter` gives up and leaves `key`'s queue (lua/queue_leave.lua); `kind` 'k': its call
// counted the entry handed to it.
redislock::reply run_leave(redislock::client& client, std::string_view key, std::string_view waiter,
                           std::string_view kind = "") {
    const std::string channel = redislock::detail::derived_key(key, "released");
    const std::string queue_key = redislock::detail::derived_key(key, "queue");
    const std::string lapse_key = redislock::detail::derived_key(key, "waiting");
    return redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::queue_leave,
        std::array<std::string_view, 3>{key, queue_key, lapse_key},
        std::array<std::string_view, 4>{waiter, channel, "2000", kind});
}

// The waiter ids in `key`'s waiting queue, first to last.
std::vector<std::string> queue_of(const redis_server& srv, std::string_view key) {
    std::vector<std::string> ids;
    std::istringstream lines{
        srv.cli({"ZRANGE", redislock::detail::derived_key(key, "queue"), "0", "-1"})};
    for (std::string line; std::getline(lines, line);) {
        if (!line.empty()) {
            ids.push_back(line);
        }
    }
    return ids;
}

// The server's clock in microseconds, the clock fencing tokens never fall below.
std::int64_t server_us(const redis_server& srv) {
    std::istringstream in{srv.cli({"TIME"})};
    std::int64_t seconds = 0;
    std::int64_t micros = 0;
    in >> seconds >> micros;
    return seconds * 1'000'000 + micros;
}

// The fence of a reply with status `status` ({status, fence, id}); fails the test and gives -1
// for any other reply.
std::int64_t fence_of(const redislock::reply& r, std::int64_t status = 1) {
    const auto values = integers(r);
    if (!r.is_array() || r.elements().size() != 3 || values.size() != 2 || values[0] != status) {
        ADD_FAILURE() << "not {" << status << ", fence, id}: " << testing::PrintToString(values)
                      << " " << r.text();
        return -1;
    }
    return values[1];
}

// The fencing counter's PTTL: it expires a day after its last use.
void expect_counter_lives_a_day(const redis_server& srv, const std::string& counter) {
    const std::int64_t ttl = pttl(srv, counter);
    EXPECT_GT(ttl, 86'000'000) << counter;
    EXPECT_LE(ttl, 86'400'000) << counter;
}

redislock::reply run_release(redislock::client& client, std::string_view key,
                             std::string_view owner, std::string_view entries,
                             std::string_view lease_ms, std::string_view channel,
                             std::optional<std::string> id = std::nullopt,
                             std::string_view grace = "2000", std::string_view release_id = "") {
    const std::string acquisition = id.value_or(id_for(owner));
    const std::string queue_key = redislock::detail::derived_key(key, "queue");
    const std::string lapse_key = redislock::detail::derived_key(key, "waiting");
    return redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::recursive_release,
        std::array<std::string_view, 3>{key, queue_key, lapse_key},
        std::array<std::string_view, 7>{owner, entries, lease_ms, channel, acquisition, grace,
                                        release_id});
}

// The release the reaper sends for an attempt the client gave up (ARGV[8] '1'): it leaves the
// attempt's first entry while it is counted.
redislock::reply run_attempt_release(redislock::client& client, std::string_view key,
                                     std::string_view owner, std::string_view attempt) {
    const std::string queue_key = redislock::detail::derived_key(key, "queue");
    const std::string lapse_key = redislock::detail::derived_key(key, "waiting");
    const std::string channel = redislock::detail::derived_key(key, "released");
    return redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::recursive_release,
        std::array<std::string_view, 3>{key, queue_key, lapse_key},
        std::array<std::string_view, 8>{owner, "1", "0", channel, attempt, "2000", "", "1"});
}

// o1 takes "s", the waiters (owner, waiter id) queue in this order, and o1's release hands the
// lock to the first or tells it.
void release_to(redislock::client& client,
                const std::vector<std::pair<std::string, std::string>>& waiters) {
    ASSERT_EQ(integers(run_acquire(client, "s", "o1", "60000", "0")).at(0), 1);
    for (const auto& [owner, waiter] : waiters) {
        ASSERT_EQ(integers(queue_as(client, "s", owner, waiter)).at(0), 0) << waiter;
    }
    ASSERT_EQ(integers(run_release(client, "s", "o1", "1", "60000", "{s}:released")),
              std::vector<std::int64_t>{2});
}

redislock::reply run_extend(redislock::client& client, std::string_view key, std::string_view owner,
                            std::string_view lease_ms,
                            std::optional<std::string> id = std::nullopt) {
    const std::string acquisition = id.value_or(id_for(owner));
    return redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::recursive_extend,
        std::array<std::string_view, 1>{key},
        std::array<std::string_view, 3>{owner, lease_ms, acquisition});
}

// What `call` threw as a redislock::server_error, or what it did instead.
template <class Call>
std::string server_error_from(Call&& call) {
    try {
        call();
        return "(returned without an exception)";
    } catch (const redislock::server_error& e) {
        return e.what();
    } catch (const std::exception& e) {
        return std::string{"(another exception) "} + e.what();
    }
}

bool names_wrongtype(const std::string& what) {
    return what.find("WRONGTYPE") != std::string::npos;
}

// Waits, bounded, until `flag` is set.
bool wait_for_flag(const std::atomic<bool>& flag, std::chrono::milliseconds timeout) {
    const stopwatch watch;
    while (!flag.load() && watch.elapsed() < timeout) {
        std::this_thread::sleep_for(5ms);
    }
    return flag.load();
}

// ---- recursive_acquire.lua ----

TEST(RecursiveAcquireScript, NewAcquisitionReturnsOneAndNextFenceAndSetsCountAndLease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    // The fencing counter only grows: it continues from whatever it holds, and never below the
    // server's clock in microseconds.
    ASSERT_EQ(srv.cli({"SET", "{s}:fence", "41"}), "OK");

    const std::int64_t before = server_us(srv);
    const stopwatch since_sent;
    const std::int64_t fence = fence_of(run_acquire(client, "s", "o1", "5000", "1"));
    EXPECT_GT(fence, 41);
    EXPECT_GE(fence, before);
    EXPECT_LE(fence, server_us(srv));
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "1");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o1"}), id_for("o1"));
    EXPECT_EQ(srv.cli({"HGET", "s", "fence"}), std::to_string(fence));
    EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), std::to_string(fence));
    expect_counter_lives_a_day(srv, "{s}:fence");  // far longer than any lease
    const auto ttl = pttl(srv, "s");
    EXPECT_GE(ttl, 5000 - since_sent.elapsed().count() - 1);
    EXPECT_LE(ttl, 5000);

    // The next acquisition draws a greater token.
    ASSERT_EQ(srv.cli({"DEL", "s"}), "1");
    const std::int64_t next = fence_of(run_acquire(client, "s", "o2", "5000", "1"));
    EXPECT_GT(next, fence);
    EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), std::to_string(next));

    // A counter ahead of the clock goes on by one.
    ASSERT_EQ(srv.cli({"DEL", "s"}), "1");
    ASSERT_EQ(srv.cli({"SET", "{s}:fence", "5000000000000000"}), "OK");
    EXPECT_EQ(integers(run_acquire(client, "s", "o1", "5000", "1")),
              (std::vector<std::int64_t>{1, 5'000'000'000'000'001}));
    EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), "5000000000000001");
    expect_counter_lives_a_day(srv, "{s}:fence");
}

TEST(RecursiveAcquireScript, NewAcquisitionWithoutFencingReturnsZeroFenceAndDrawsNone) {
    redis_server srv;
    redislock::client client{srv.uri()};

    EXPECT_EQ(integers(run_acquire(client, "s", "o1", "5000", "0")),
              (std::vector<std::int64_t>{1, 0}));
    EXPECT_EQ(owners_of(srv, "s"), std::vector<std::string>{"o1"});
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o1"}), id_for("o1"));
    EXPECT_EQ(srv.cli({"HGET", "s", "fence"}), "");
    EXPECT_EQ(exists(srv, "{s}:fence"), "0");
}

TEST(RecursiveAcquireScript, ReentryReturnsTwoWithFirstFenceAndRefreshesLease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::int64_t fence = fence_of(run_acquire(client, "s", "o1", "1000", "1"));
    ASSERT_GT(fence, 0);

    EXPECT_EQ(integers(run_acquire(client, "s", "o1", "60000", "1")),
              (std::vector<std::int64_t>{2, fence}));
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "2");
    EXPECT_GT(pttl(srv, "s"), 50'000);  // the re-entry's lease replaced the first
    EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), std::to_string(fence));  // no new token drawn
    EXPECT_EQ(srv.cli({"HGET", "s", "fence"}), std::to_string(fence));
}

TEST(RecursiveAcquireScript, AnotherOwnerGetsZeroAndHoldersTtlAndChangesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::int64_t fence = fence_of(run_acquire(client, "s", "o1", "60000", "1"));
    ASSERT_GT(fence, 0);

    const auto r = integers(run_acquire(client, "s", "o2", "1000", "1"));
    ASSERT_EQ(r.size(), 2U);
    EXPECT_EQ(r[0], 0);
    EXPECT_GT(r[1], 50'000);
    EXPECT_LE(r[1], 60'000);
    EXPECT_EQ(owners_of(srv, "s"), std::vector<std::string>{"o1"});
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "1");
    EXPECT_GT(pttl(srv, "s"), 50'000);  // the refused owner's shorter lease was not applied
    EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), std::to_string(fence));
    EXPECT_EQ(srv.cli({"HGET", "s", "fence"}), std::to_string(fence));
}

TEST(RecursiveAcquireScript, StringKeyIsWrongTypeAndStaysUntouched) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "s", "plain"}), "OK");

    const auto r = run_acquire(client, "s", "o1", "5000", "1");
    EXPECT_TRUE(r.is_error_code("WRONGTYPE")) << r.text();
    EXPECT_EQ(srv.cli({"GET", "s"}), "plain");
    EXPECT_EQ(exists(srv, "{s}:fence"), "0");

    // A simple lock's key is such a string: the two kinds must not mix on one name.
    auto simple = client.mutex("m");
    simple.lock();
    const std::string token = srv.cli({"GET", "m"});
    const auto on_simple = run_acquire(client, "m", "o1", "5000", "0");
    EXPECT_TRUE(on_simple.is_error_code("WRONGTYPE")) << on_simple.text();
    EXPECT_EQ(srv.cli({"GET", "m"}), token);
    EXPECT_EQ(srv.cli({"TYPE", "m"}), "string");
}

TEST(RecursiveAcquireScript, HashWithModeFieldOrOtherTypeIsWrongType) {
    redis_server srv;
    redislock::client client{srv.uri()};
    // A read-write lock's hash has a `mode` field; even a field named like the owner does not
    // make it a reentrant lock.
    ASSERT_EQ(srv.cli({"HSET", "rw", "mode", "write", "o1", "1"}), "2");
    const auto on_rw = run_acquire(client, "rw", "o1", "5000", "0");
    EXPECT_TRUE(on_rw.is_error_code("WRONGTYPE")) << on_rw.text();
    EXPECT_EQ(srv.cli({"HGET", "rw", "o1"}), "1");
    EXPECT_EQ(pttl(srv, "rw"), -1);

    ASSERT_EQ(srv.cli({"RPUSH", "list", "a"}), "1");
    const auto on_list = run_acquire(client, "list", "o1", "5000", "0");
    EXPECT_TRUE(on_list.is_error_code("WRONGTYPE")) << on_list.text();
    EXPECT_EQ(srv.cli({"LRANGE", "list", "0", "-1"}), "a");
}

// ---- recursive_release.lua ----

TEST(RecursiveReleaseScript, LastEntryDeletesKeyAndPublishesNothingWhenNoOneWaits) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::int64_t fence = fence_of(run_acquire(client, "s", "o1", "60000", "1"));
    ASSERT_GT(fence, 0);
    subscriber released{srv, "{s}:released"};

    EXPECT_EQ(integers(run_release(client, "s", "o1", "1", "60000", "{s}:released")),
              std::vector<std::int64_t>{1});
    EXPECT_EQ(exists(srv, "s"), "0");  // the fence field went with it
    // The counter stays for the next holder.
    EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), std::to_string(fence));
    // Messages arrive in order: the marker comes first only if the release published nothing.
    ASSERT_EQ(srv.cli({"SPUBLISH", "{s}:released", "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");
}

TEST(RecursiveReleaseScript, LastEntryWithAWaiterQueuedPublishesTheWaitersId) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_GT(fence_of(run_acquire(client, "s", "o1", "60000", "1")), 0);
    subscriber released{srv, "{s}:released"};
    // o2 and o3 find it held and wait in line; the holder's re-entry does not queue.
    ASSERT_EQ(integers(queue_owner(client, "s", "o2")).at(0), 0);
    ASSERT_EQ(integers(queue_owner(client, "s", "o3")).at(0), 0);
    ASSERT_EQ(
        integers(run_acquire(client, "s", "o1", "60000", "1", std::nullopt, "0", "", "5000")).at(0),
        2);
    ASSERT_EQ(queue_of(srv, "s"), (std::vector<std::string>{"wo2", "wo3"}));

    // Leaving the inner entry tells nobody.
    EXPECT_EQ(integers(run_release(client, "s", "o1", "1", "60000", "{s}:released")),
              std::vector<std::int64_t>{0});
    ASSERT_EQ(srv.cli({"SPUBLISH", "{s}:released", "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");

    // The last entry tells the head, and the one after it to check once the grace is over.
    EXPECT_EQ(integers(run_release(client, "s", "o1", "1", "60000", "{s}:released")),
              std::vector<std::int64_t>{2});
    EXPECT_EQ(exists(srv, "s"), "0");
    EXPECT_EQ(released.next(), "wo2 ?wo3");
    // Only the head may take it; it leaves the queue when it does.
    EXPECT_EQ(integers(queue_owner(client, "s", "o3")).at(0), 0);
    EXPECT_EQ(exists(srv, "s"), "0");
    EXPECT_EQ(integers(queue_owner(client, "s", "o2")), (std::vector<std::int64_t>{1, 0}));
    EXPECT_EQ(queue_of(srv, "s"), (std::vector<std::string>{"wo3"}));
}

// A queue key another program made a string: joining and the last release refuse before their
// first write, so neither writes and then fails half-way.
TEST(RecursiveReleaseScript, QueueKeyOfAnotherTypeIsRefusedBeforeAnyWrite) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(integers(run_acquire(client, "s", "o1", "60000", "0")).at(0), 1);
    ASSERT_EQ(integers(queue_owner(client, "s", "o2")).at(0), 0);
    ASSERT_EQ(srv.cli({"SET", "{s}:waiting", "not a queue"}), "OK");

    const redislock::reply joined = queue_owner(client, "s", "o3");
    EXPECT_TRUE(joined.is_error()) << joined.text();
    EXPECT_EQ(queue_of(srv, "s"), (std::vector<std::string>{"wo2"}));
    const redislock::reply released = run_release(client, "s", "o1", "1", "60000", "{s}:released");
    EXPECT_TRUE(released.is_error()) << released.text();
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "1") << "the release wrote";
}

// The entry is kept for the 'h' head for the grace only (2 s here), no longer than its lease, and
// the head keeps its place in line until its next attempt claims the entry.
TEST(RecursiveReleaseScript, LastEntryHandsTheLockToAnHWaiterAtTheHeadAndTellsIt) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(integers(run_acquire(client, "s", "o1", "60000", "0")).at(0), 1);
    subscriber released{srv, "{s}:released"};
    const std::string o2 = handed_waiter("00aa", "o2");
    ASSERT_EQ(integers(queue_as(client, "s", "o2", o2)).at(0), 0);
    ASSERT_EQ(integers(queue_owner(client, "s", "o3")).at(0), 0);

    EXPECT_EQ(integers(run_release(client, "s", "o1", "1", "60000", "{s}:released")),
              std::vector<std::int64_t>{2});
    EXPECT_EQ(released.next(), o2 + " ?wo3");
    // One entry of o2, under the acquisition id its waiter id names, kept for the grace.
    EXPECT_EQ(sole_owner(srv, "s"), "o2");
    EXPECT_EQ(sole_count(srv, "s"), "1");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o2"}), "00aa");
    EXPECT_GT(pttl(srv, "s"), 0);
    EXPECT_LE(pttl(srv, "s"), 2000);
    EXPECT_EQ(queue_of(srv, "s"), (std::vector<std::string>{o2, "wo3"}));

    // o2's next attempt claims it for its lease and leaves the queue.
    const auto claimed =
        run_acquire(client, "s", "o2", "60000", "0", std::string{"acq-new"}, "1", "", "5000", o2);
    EXPECT_EQ(integers(claimed), (std::vector<std::int64_t>{1, 0}));
    EXPECT_EQ(acquisition_id(claimed), "00aa");
    EXPECT_GT(pttl(srv, "s"), 50'000);
    EXPECT_EQ(queue_of(srv, "s"), (std::vector<std::string>{"wo3"}));

    // o2 holds it as that acquisition: its release tells the next waiter.
    EXPECT_EQ(integers(run_release(client, "s", "o2", "1", "60000", "{s}:released", "00aa")),
              std::vector<std::int64_t>{2});
    EXPECT_EQ(released.next(), "wo3");
}

TEST(RecursiveAcquireScript, EntryHandedToTheCallIsClaimedAsItIsByItsNextAttempt) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string o2 = handed_waiter("00bb", "o2");
    ASSERT_NO_FATAL_FAILURE(release_to(client, {{"o2", o2}}));
    ASSERT_EQ(srv.cli({"HGET", "s", "id:o2"}), "00bb");
    ASSERT_EQ(srv.cli({"HGET", "s", "handed:o2"}), "00bb");

    // Another call of the same owner comes first: the entry is the handed waiter's reservation
    // until it claims it, so that call waits.
    const auto other = [&] {
        return run_acquire(client, "s", "o2", "60000", "0", std::string{"acq-other"}, "1", "",
                           "5000", handed_waiter("00cc", "o2"));
    };
    EXPECT_EQ(integers(other()).at(0), 0);
    EXPECT_EQ(sole_count(srv, "s"), "1");

    // Its message lost, the handed call tries again, even through an object that believes it
    // holds (a lease it has not yet found lost): it claims the handed entry as it is, under the
    // handed acquisition id and a fresh lease; the mark stays.
    const auto again =
        run_acquire(client, "s", "o2", "60000", "0", std::string{"acq-new"}, "0", "", "5000", o2);
    EXPECT_EQ(integers(again), (std::vector<std::int64_t>{1, 0}));
    EXPECT_EQ(acquisition_id(again), "00bb");
    EXPECT_EQ(sole_count(srv, "s"), "1");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o2"}), "00bb");
    EXPECT_EQ(srv.cli({"HGET", "s", "handed:o2"}), "00bb");
    EXPECT_GT(pttl(srv, "s"), 50'000);

    // The other call comes back: it re-enters the claimed entry, as any entry of the owner.
    EXPECT_EQ(integers(other()), (std::vector<std::int64_t>{2, 0}));
    EXPECT_EQ(sole_count(srv, "s"), "2");

    // Sent again (its reply lost), the claim changes nothing; each call then leaves its entry.
    EXPECT_EQ(integers(run_acquire(client, "s", "o2", "60000", "0", std::string{"acq-new"}, "0", "",
                                   "5000", o2)),
              (std::vector<std::int64_t>{1, 0}));
    EXPECT_EQ(sole_count(srv, "s"), "2");
    EXPECT_EQ(
        integers(run_release(client, "s", "o2", "1", "60000", "{s}:released", std::string{"00bb"})),
        std::vector<std::int64_t>{0});
    EXPECT_EQ(
        integers(run_release(client, "s", "o2", "1", "60000", "{s}:released", std::string{"00bb"})),
        std::vector<std::int64_t>{1});
    EXPECT_EQ(exists(srv, "s"), "0");
}

// The claim of a handed entry checks the queue keys before its first write: with the lapse
// times turned into a string by another program, it fails having written nothing, and the entry
// is still kept for the grace only, not for the claimer's lease.
TEST(RecursiveAcquireScript, ClaimRefusesAQueueKeyOfAnotherTypeBeforeAnyWrite) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string o2 = handed_waiter("00f2", "o2");
    ASSERT_NO_FATAL_FAILURE(release_to(client, {{"o2", o2}}));
    ASSERT_LE(pttl(srv, "s"), 2000);
    ASSERT_EQ(srv.cli({"SET", "{s}:waiting", "not a queue"}), "OK");

    const auto claimed =
        run_acquire(client, "s", "o2", "60000", "0", std::string{"acq-new"}, "1", "", "5000", o2);
    EXPECT_TRUE(claimed.is_error()) << claimed.text();
    EXPECT_LE(pttl(srv, "s"), 2000) << "the claim extended the entry, then failed";
    EXPECT_EQ(queue_of(srv, "s"), std::vector<std::string>{o2});
}

// An entry handed to a waiter is a reservation until that waiter's own attempt claims it:
// another call of the same owner does not enter it (it would turn the reservation into a lease
// that outlives that call, for a waiter that may never come), but waits, told to come back when
// the grace is over; once the waiter claimed it, the other call re-enters it and leaves the
// queue it joined.
TEST(RecursiveAcquireScript, HandedEntryIsNotEnteredByAnotherCallOfItsOwnerBeforeItsClaim) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string o2 = handed_waiter("00e2", "o2");
    const std::string other = handed_waiter("00e9", "o2");
    ASSERT_NO_FATAL_FAILURE(release_to(client, {{"o2", o2}}));
    ASSERT_LE(pttl(srv, "s"), 2000);

    const auto refused = run_acquire(client, "s", "o2", "60000", "0", std::string{"acq-other"}, "1",
                                     "", "5000", other);
    EXPECT_EQ(integers(refused).at(0), 0);
    EXPECT_LE(integers(refused).at(1), 2000);
    EXPECT_EQ(sole_count(srv, "s"), "1");
    EXPECT_LE(pttl(srv, "s"), 2000) << "the reservation became a lease";
    EXPECT_EQ(queue_of(srv, "s"), (std::vector<std::string>{o2, other}));

    // The handed waiter claims it; the other call then re-enters, and is out of the queue.
    const auto claimed =
        run_acquire(client, "s", "o2", "60000", "0", std::string{"acq-new"}, "1", "", "5000", o2);
    EXPECT_EQ(integers(claimed), (std::vector<std::int64_t>{1, 0}));
    const auto entered = run_acquire(client, "s", "o2", "60000", "0", std::string{"acq-other"}, "1",
                                     "", "5000", other);
    EXPECT_EQ(integers(entered), (std::vector<std::int64_t>{2, 0}));
    EXPECT_EQ(acquisition_id(entered), "00e2");
    EXPECT_EQ(sole_count(srv, "s"), "2");
    EXPECT_TRUE(queue_of(srv, "s").empty());
    EXPECT_EQ(exists(srv, "{s}:waiting"), "0");
}

// A free lock that the queue keeps from the caller, because an 'h' waiter heads it, is handed to
// that head as a release would: an entry of its owner kept for the caller's grace, the head told.
// A head that never comes then holds the lock for the grace only, not until the lapse time it
// joined with.
TEST(RecursiveAcquireScript, FreeLockFoundByAWaiterBehindTheHeadIsHandedToTheHeadForTheGrace) {
    redis_server srv;
    redislock::client client{srv.uri()};
    subscriber released{srv, "{s}:released"};
    ASSERT_EQ(integers(run_acquire(client, "s", "o1", "60000", "0")).at(0), 1);
    const std::string o2 = handed_waiter("00d2", "o2");
    ASSERT_EQ(integers(queue_as(client, "s", "o2", o2)).at(0), 0);
    ASSERT_EQ(integers(queue_owner(client, "s", "o3")).at(0), 0);
    ASSERT_EQ(srv.cli({"DEL", "s"}), "1");  // gone without a release (expired, say)

    const auto refused =
        run_acquire(client, "s", "o3", "60000", "0", std::nullopt, "1", "", "5000", "", "3000");
    EXPECT_EQ(integers(refused).at(0), 0);
    EXPECT_LE(integers(refused).at(1), 3000) << "asked to wait for the head's old lapse time";
    EXPECT_EQ(sole_owner(srv, "s"), "o2");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o2"}), "00d2");
    EXPECT_LE(pttl(srv, "s"), 3000);
    EXPECT_EQ(released.next(), o2 + " ?wo3");

    // o2 never comes: once the grace is over, o3 takes the lock.
    std::this_thread::sleep_for(3100ms);
    const auto taken =
        run_acquire(client, "s", "o3", "60000", "0", std::nullopt, "1", "", "5000", "", "3000");
    EXPECT_EQ(integers(taken).at(0), 1);
    EXPECT_EQ(sole_owner(srv, "s"), "o3");
    EXPECT_TRUE(queue_of(srv, "s").empty());
}

TEST(RecursiveQueueLeaveScript, WaiterHandedTheLockThatGivesUpHandsItOn) {
    redis_server srv;
    redislock::client client{srv.uri()};
    subscriber released{srv, "{s}:released"};
    const std::string o2 = handed_waiter("00a2", "o2");
    const std::string o3 = handed_waiter("00a3", "o3");
    ASSERT_NO_FATAL_FAILURE(release_to(client, {{"o2", o2}, {"o3", o3}}));
    ASSERT_EQ(released.next(), o2 + " ?" + o3);

    // o2 gave up before it heard: its entry goes to o3, kept for it until it comes.
    EXPECT_EQ(integers(run_leave(client, "s", o2)), std::vector<std::int64_t>{1});
    EXPECT_EQ(released.next(), o3);
    EXPECT_EQ(sole_owner(srv, "s"), "o3");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o3"}), "00a3");
    EXPECT_EQ(queue_of(srv, "s"), std::vector<std::string>{o3});

    // Sent again (its reply lost), the leave finds nothing of o2's and changes nothing.
    EXPECT_EQ(integers(run_leave(client, "s", o2)), std::vector<std::int64_t>{0});
    EXPECT_EQ(sole_owner(srv, "s"), "o3");

    // Claimed (its reply lost) and re-entered since by another call of its owner, which could
    // not enter it before the claim: the leave takes nothing back (the claim's attempt id names
    // the entry now), the claim's given-up attempt leaves it once, and the re-entry stays: that
    // call counts on it, and its release frees the lock.
    const auto other = [&] {
        return integers(run_acquire(client, "s", "o3", "60000", "0", std::string{"x"}, "1", "",
                                    "5000", handed_waiter("00d3", "o3")))
            .at(0);
    };
    ASSERT_EQ(other(), 0);
    ASSERT_EQ(integers(run_acquire(client, "s", "o3", "60000", "0", std::string{"c3"}, "1", "",
                                   "5000", o3))
                  .at(0),
              1);
    ASSERT_EQ(other(), 2);
    EXPECT_EQ(integers(run_leave(client, "s", o3)), std::vector<std::int64_t>{0});
    EXPECT_EQ(sole_count(srv, "s"), "2");
    EXPECT_EQ(integers(run_attempt_release(client, "s", "o3", "c3")), std::vector<std::int64_t>{0});
    EXPECT_EQ(sole_count(srv, "s"), "1");
    EXPECT_EQ(integers(run_attempt_release(client, "s", "o3", "c3")),
              std::vector<std::int64_t>{-1});
    EXPECT_EQ(integers(run_leave(client, "s", o3)), std::vector<std::int64_t>{0});
    EXPECT_EQ(sole_count(srv, "s"), "1");
    EXPECT_EQ(
        integers(run_release(client, "s", "o3", "1", "60000", "{s}:released", std::string{"00a3"})),
        std::vector<std::int64_t>{1});
    EXPECT_EQ(exists(srv, "s"), "0");
}

// A waiter gives up after its claim of the entry handed to it went unanswered, while another
// object of the owner joined the claimed entry: the waiter's leave takes nothing back (a claimed
// entry is named by the claim's attempt id, see recursive_acquire.lua), the reaper's release of
// that attempt leaves it once, and the joiner keeps its entry.
TEST(RecursiveQueueLeaveScript, WaiterWhoseClaimWentUnansweredLeavesItByTheClaimsIdOnly) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string o2 = handed_waiter("00b2", "o2");
    ASSERT_NO_FATAL_FAILURE(release_to(client, {{"o2", o2}}));
    ASSERT_EQ(integers(run_acquire(client, "s", "o2", "60000", "0", std::string{"c2"}, "1", "",
                                   "5000", o2)),
              (std::vector<std::int64_t>{1, 0}));  // this reply never reached the caller
    ASSERT_EQ(integers(run_acquire(client, "s", "o2", "60000", "0", std::string{"j1"}, "1")).at(0),
              2);
    ASSERT_EQ(sole_count(srv, "s"), "2");

    for (int landing = 0; landing < 2; ++landing) {
        EXPECT_EQ(integers(run_leave(client, "s", o2)), std::vector<std::int64_t>{0});
        EXPECT_EQ(sole_count(srv, "s"), landing == 0 ? "2" : "1");
        EXPECT_EQ(integers(run_attempt_release(client, "s", "o2", "c2")),
                  std::vector<std::int64_t>{landing == 0 ? 0 : -1});
        EXPECT_EQ(sole_count(srv, "s"), "1");
    }
    EXPECT_EQ(integers(run_acquire(client, "s", "o3", "60000", "0", std::nullopt, "1")).at(0), 0);
    EXPECT_EQ(
        integers(run_release(client, "s", "o2", "1", "0", "{s}:released", std::string{"00b2"})),
        std::vector<std::int64_t>{1});
    EXPECT_EQ(exists(srv, "s"), "0");
}

// A call that counted the entry handed to it and then failed to record it gave the entry back
// itself: its leave takes nothing back, as another thread of the owner may hold it.
TEST(RecursiveQueueLeaveScript, WaiterThatCountedItsHandedEntryTakesNothingBack) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string o2 = handed_waiter("00c2", "o2");
    ASSERT_NO_FATAL_FAILURE(release_to(client, {{"o2", o2}}));

    EXPECT_EQ(integers(run_leave(client, "s", o2, "k")), std::vector<std::int64_t>{0});
    EXPECT_EQ(sole_count(srv, "s"), "1");
    EXPECT_EQ(srv.cli({"HGET", "s", "handed:o2"}), "00c2");
}

// The call's attempt that claimed the entry handed to it was given up (its reply lost, or its
// grant came too late): the call's next attempt leaves that claim's entry, the owner's only one,
// and enters the lock, now free, anew under its own id; it claims nothing twice.
TEST(RecursiveAcquireScript, HandedEntryWhoseClaimWasGivenUpIsLeftNotClaimedAgain) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string o2 = handed_waiter("00d2", "o2");
    ASSERT_NO_FATAL_FAILURE(release_to(client, {{"o2", o2}}));
    const auto claimed =
        run_acquire(client, "s", "o2", "60000", "0", std::string{"c1"}, "1", "", "5000", o2);
    ASSERT_EQ(integers(claimed).at(0), 1);
    ASSERT_EQ(acquisition_id(claimed), "00d2");

    const auto again =
        run_acquire(client, "s", "o2", "60000", "0", std::string{"c9"}, "1", "c1", "5000", o2);
    EXPECT_EQ(integers(again), (std::vector<std::int64_t>{1, 0}));
    EXPECT_EQ(acquisition_id(again), "c9");
    EXPECT_EQ(sole_count(srv, "s"), "1");
    EXPECT_EQ(srv.cli({"HEXISTS", "s", "handed:o2"}), "0");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o2"}), "c9");
}

// A claim's attempt was given back (its grant came too late), while another object of the owner
// had joined the claimed entry: the call's next attempt joins what is left, it never claims the
// entry again (two objects would then count one entry).
TEST(RecursiveAcquireScript, HandedEntryGivenBackIsJoinedNotClaimedAgain) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string o2 = handed_waiter("00d3", "o2");
    ASSERT_NO_FATAL_FAILURE(release_to(client, {{"o2", o2}}));
    ASSERT_EQ(integers(run_acquire(client, "s", "o2", "60000", "0", std::string{"c1"}, "1", "",
                                   "5000", o2))
                  .at(0),
              1);
    ASSERT_EQ(integers(run_acquire(client, "s", "o2", "60000", "0", std::string{"j1"}, "1")).at(0),
              2);
    ASSERT_EQ(srv.cli({"EVALSHA", std::string{redislock::detail::scripts::recursive_release.sha1},
                       "3", "s", "{s}:queue", "{s}:waiting", "o2", "1", "0", "{s}:released", "c1",
                       "2000", "", "1"}),
              "0");
    ASSERT_EQ(sole_count(srv, "s"), "1");

    const auto next =
        run_acquire(client, "s", "o2", "60000", "0", std::string{"c2"}, "1", "", "5000", o2);
    EXPECT_EQ(integers(next), (std::vector<std::int64_t>{2, 0}));
    EXPECT_EQ(sole_count(srv, "s"), "2");
}

// A call whose attempt "x1" was given up mid-flight claims the entry handed to it, naming "x1":
// should "x1" land only then, it adds no entry (one no unlock() would count).
TEST(RecursiveAcquireScript, GivenUpAttemptLandingAfterTheClaimOfAHandedEntryAddsNone) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::string o2 = handed_waiter("00e2", "o2");
    ASSERT_NO_FATAL_FAILURE(release_to(client, {{"o2", o2}}));

    const auto claimed =
        run_acquire(client, "s", "o2", "60000", "0", std::string{"c1"}, "1", "x1", "5000", o2);
    ASSERT_EQ(integers(claimed).at(0), 1);
    ASSERT_EQ(acquisition_id(claimed), "00e2");

    const auto late = run_acquire(client, "s", "o2", "60000", "0", std::string{"x1"}, "1");
    EXPECT_EQ(integers(late), (std::vector<std::int64_t>{0, 0}));
    EXPECT_EQ(sole_count(srv, "s"), "1");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o2"}), "00e2");
}

TEST(RecursiveQueueLeaveScript, HeadLeavingAFreeLockHandsItToAnHWaiterNext) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(integers(run_acquire(client, "s", "o1", "60000", "0")).at(0), 1);
    subscriber released{srv, "{s}:released"};
    ASSERT_EQ(integers(queue_owner(client, "s", "o2")).at(0), 0);
    const std::string o3 = handed_waiter("00e3", "o3");
    ASSERT_EQ(integers(queue_as(client, "s", "o3", o3)).at(0), 0);

    // The holder's key goes without a release (its lease ran out); then the head gives up.
    ASSERT_EQ(srv.cli({"DEL", "s"}), "1");
    EXPECT_EQ(integers(run_leave(client, "s", "wo2")), std::vector<std::int64_t>{1});
    EXPECT_EQ(released.next(), o3);
    EXPECT_EQ(sole_owner(srv, "s"), "o3");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o3"}), "00e3");
    EXPECT_EQ(queue_of(srv, "s"), std::vector<std::string>{o3});
}

TEST(RecursiveAcquireScript, SecondWaiterCannotTakeAFreeLockWhileTheFirstIsQueued) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(integers(run_acquire(client, "s", "o1", "60000", "0")).at(0), 1);
    const auto first = integers(queue_owner(client, "s", "o2"));
    ASSERT_EQ(first.at(0), 0);
    EXPECT_GT(first.at(1), 50'000);  // the holder's PTTL
    ASSERT_EQ(integers(queue_owner(client, "s", "o3")).at(0), 0);

    // The holder's key goes without a release (expired, say): o2 is still first in line.
    ASSERT_EQ(srv.cli({"DEL", "s"}), "1");
    const auto refused = run_acquire(client, "s", "o3", "60000", "0", std::nullopt, "1");
    const auto values = integers(refused);
    ASSERT_EQ(values.size(), 2U);
    EXPECT_EQ(values[0], 0);
    EXPECT_GT(values[1], 0);  // at most until o2's entry lapses
    EXPECT_LE(values[1], 65'000);
    EXPECT_EQ(acquisition_id(refused), "");
    EXPECT_EQ(exists(srv, "s"), "0");

    EXPECT_EQ(integers(queue_owner(client, "s", "o2")), (std::vector<std::int64_t>{1, 0}));
    EXPECT_EQ(owners_of(srv, "s"), std::vector<std::string>{"o2"});
    EXPECT_EQ(queue_of(srv, "s"), (std::vector<std::string>{"wo3"}));
}

TEST(RecursiveReleaseScript, LeavingEveryEntryAtOnceReleases) {
    redis_server srv;
    redislock::client client{srv.uri()};
    for (int i = 0; i < 3; ++i) {
        ASSERT_FALSE(run_acquire(client, "s", "o1", "60000", "0").is_error());
    }
    ASSERT_EQ(srv.cli({"HGET", "s", "o1"}), "3");

    EXPECT_EQ(integers(run_release(client, "s", "o1", "3", "60000", "{s}:released")),
              std::vector<std::int64_t>{1});
    EXPECT_EQ(exists(srv, "s"), "0");
}

TEST(RecursiveReleaseScript, InnerEntryDecrementsAndRefreshesLeaseWithoutPublishing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_FALSE(run_acquire(client, "s", "o1", "60000", "0").is_error());
    ASSERT_FALSE(run_acquire(client, "s", "o1", "60000", "0").is_error());
    ASSERT_EQ(srv.cli({"PEXPIRE", "s", "1000"}), "1");
    subscriber released{srv, "{s}:released"};

    EXPECT_EQ(integers(run_release(client, "s", "o1", "1", "60000", "{s}:released")),
              std::vector<std::int64_t>{0});
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "1");
    EXPECT_GT(pttl(srv, "s"), 50'000);
    // Messages arrive in order: the marker comes first only if the release published nothing.
    ASSERT_EQ(srv.cli({"SPUBLISH", "{s}:released", "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");
}

TEST(RecursiveReleaseScript, NonOwnerOrMissingKeyGetsMinusOneAndChangesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_FALSE(run_acquire(client, "s", "o1", "60000", "0").is_error());
    ASSERT_EQ(srv.cli({"SET", "str", "plain"}), "OK");
    subscriber released{srv, "{s}:released"};

    EXPECT_EQ(integers(run_release(client, "s", "o2", "1", "1000", "{s}:released")),
              std::vector<std::int64_t>{-1});
    EXPECT_EQ(owners_of(srv, "s"), std::vector<std::string>{"o1"});  // nothing left for o2
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "1");
    EXPECT_GT(pttl(srv, "s"), 50'000);

    EXPECT_EQ(integers(run_release(client, "gone", "o1", "1", "1000", "{s}:released")),
              std::vector<std::int64_t>{-1});
    EXPECT_EQ(exists(srv, "gone"), "0");

    EXPECT_EQ(integers(run_release(client, "str", "o1", "1", "1000", "{s}:released")),
              std::vector<std::int64_t>{-1});
    EXPECT_EQ(srv.cli({"GET", "str"}), "plain");

    ASSERT_EQ(srv.cli({"SPUBLISH", "{s}:released", "marker"}), "1");
    EXPECT_EQ(released.next(), "marker");
}

// ---- recursive_extend.lua ----

TEST(RecursiveExtendScript, OwnerGetsOneAndTheNewLease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_FALSE(run_acquire(client, "s", "o1", "1000", "0").is_error());

    EXPECT_EQ(integers(run_extend(client, "s", "o1", "60000")), std::vector<std::int64_t>{1});
    EXPECT_GT(pttl(srv, "s"), 50'000);
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "1");  // extending is not entering
}

TEST(RecursiveExtendScript, NonOwnerOrMissingKeyGetsZeroAndLeaseStays) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_FALSE(run_acquire(client, "s", "o1", "60000", "0").is_error());
    ASSERT_EQ(srv.cli({"SET", "str", "plain"}), "OK");

    EXPECT_EQ(integers(run_extend(client, "s", "o2", "100")), std::vector<std::int64_t>{0});
    EXPECT_GT(pttl(srv, "s"), 50'000);

    EXPECT_EQ(integers(run_extend(client, "gone", "o1", "60000")), std::vector<std::int64_t>{0});
    EXPECT_EQ(exists(srv, "gone"), "0");

    EXPECT_EQ(integers(run_extend(client, "str", "o1", "100")), std::vector<std::int64_t>{0});
    EXPECT_EQ(pttl(srv, "str"), -1);
}

// ---- acquisition ids ----

TEST(RecursiveAcquireScript, ReentryReturnsTheFirstEntrysAcquisitionId) {
    redis_server srv;
    redislock::client client{srv.uri()};
    EXPECT_EQ(acquisition_id(run_acquire(client, "s", "o1", "60000", "0")), id_for("o1"));
    // A re-entry offering another id still joins the first acquisition.
    const auto reentry = redislock::detail::run_script(
        client.connection(), redislock::detail::scripts::recursive_acquire,
        std::array<std::string_view, 3>{"s", "{s}:queue", "{s}:waiting"},
        std::array<std::string_view, 10>{"o1", "60000", "0", "other-id", "0", "", "wo1", "0",
                                         "{s}:released", "2000"});
    EXPECT_EQ(integers(reentry), (std::vector<std::int64_t>{2, 0}));
    EXPECT_EQ(acquisition_id(reentry), id_for("o1"));
    EXPECT_EQ(acquisition_id(run_acquire(client, "s", "o2", "60000", "0")), "");
}

// ---- takeovers: an entry of the owner that the calling object does not hold ----

// An attempt whose first reply was lost is sent again as it was: its own entry, which did land,
// is claimed as it is (its fence, its count, which may hold entries another object of the owner
// joined since), not re-entered. An object that holds an entry re-enters as before.
TEST(RecursiveAcquireScript, AttemptSentAgainAfterALostReplyClaimsItsEntryAsItIs) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::int64_t first =
        fence_of(run_acquire(client, "s", "o1", "1000", "1", std::string{"cand"}, "1"));
    ASSERT_GT(first, 0);
    const auto joiner = run_acquire(client, "s", "o1", "1000", "1", std::string{"j"}, "1");
    ASSERT_EQ(integers(joiner), (std::vector<std::int64_t>{2, first}));
    ASSERT_EQ(srv.cli({"HGET", "s", "o1"}), "2");

    const auto retry = run_acquire(client, "s", "o1", "60000", "1", std::string{"cand"}, "1");
    EXPECT_EQ(integers(retry), (std::vector<std::int64_t>{1, first}));
    EXPECT_EQ(acquisition_id(retry), "cand");
    EXPECT_EQ(owners_of(srv, "s"), std::vector<std::string>{"o1"});
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "2");  // the lost entry is this one; the joiner's stays
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o1"}), "cand");
    EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), std::to_string(first));
    EXPECT_GT(pttl(srv, "s"), 50'000);

    // The same id from an object that holds an entry is a re-entry, as is another id from an
    // object that holds none (a second object of the same owner).
    const auto reentry = run_acquire(client, "s", "o1", "60000", "1", std::string{"cand"}, "0");
    EXPECT_EQ(integers(reentry), (std::vector<std::int64_t>{2, first}));
    EXPECT_EQ(acquisition_id(reentry), "cand");
    const auto joined = run_acquire(client, "s", "o1", "60000", "1", std::string{"fresh"}, "1");
    EXPECT_EQ(integers(joined), (std::vector<std::int64_t>{2, first}));
    EXPECT_EQ(acquisition_id(joined), "cand");
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "4");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o1"}), "cand");
    EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), std::to_string(first));
}

// An attempt the client gave up is left by the owner's next first entry naming it, its one entry
// only and only once, whichever of that entry and the reaper's release comes first; the caller
// then joins what other objects of the owner hold, or, with nothing left, enters anew, the hash
// rewritten in place (with fencing off, the old acquisition's fence goes).
TEST(RecursiveAcquireScript, AttemptTheClientGaveUpIsLeftOnceAndTheRestJoined) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::int64_t old_fence =
        fence_of(run_acquire(client, "s", "o1", "1000", "1", std::string{"old"}, "1"));
    ASSERT_GT(old_fence, 0);
    ASSERT_EQ(fence_of(run_acquire(client, "s", "o1", "1000", "1", std::string{"x"}), 2),
              old_fence);
    ASSERT_EQ(srv.cli({"HGET", "s", "o1"}), "2");

    // Ids of no first entry counted here leave nothing: "old" is joined.
    const auto joined =
        run_acquire(client, "s", "o1", "1000", "0", std::string{"new"}, "1", "unrelated x");
    EXPECT_EQ(integers(joined), (std::vector<std::int64_t>{2, old_fence}));
    EXPECT_EQ(acquisition_id(joined), "old");
    ASSERT_EQ(srv.cli({"HGET", "s", "o1"}), "3");

    const auto settled = run_acquire(client, "s", "o1", "60000", "0", std::string{"new2"}, "1",
                                     "old old");  // named twice: left once
    EXPECT_EQ(integers(settled), (std::vector<std::int64_t>{2, old_fence}));
    EXPECT_EQ(acquisition_id(settled), "old");
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "3");  // one left, one joined
    EXPECT_GT(pttl(srv, "s"), 50'000);
    // Named again, or sent by the reaper, it leaves nothing more.
    EXPECT_EQ(
        integers(run_acquire(client, "s", "o1", "60000", "0", std::string{"new3"}, "1", "old")),
        (std::vector<std::int64_t>{2, old_fence}));
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "4");
    EXPECT_EQ(integers(run_attempt_release(client, "s", "o1", "old")),
              std::vector<std::int64_t>{-1});
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "4");
    ASSERT_EQ(
        integers(run_release(client, "s", "o1", "4", "0", "{s}:released", std::string{"old"})),
        std::vector<std::int64_t>{1});
    ASSERT_EQ(exists(srv, "s"), "0");

    // Its one entry the only one: the lock is free, and entered anew in place.
    const std::int64_t lone_fence =
        fence_of(run_acquire(client, "s", "o1", "1000", "1", std::string{"lone"}, "1"));
    ASSERT_GT(lone_fence, old_fence);
    const auto fresh =
        run_acquire(client, "s", "o1", "60000", "0", std::string{"next"}, "1", "lone");
    EXPECT_EQ(integers(fresh), (std::vector<std::int64_t>{1, 0}));
    EXPECT_EQ(acquisition_id(fresh), "next");
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "1");
    EXPECT_EQ(srv.cli({"HGET", "s", "id:o1"}), "next");
    EXPECT_EQ(srv.cli({"HEXISTS", "s", "fence"}), "0");  // not the old acquisition's token
    EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), std::to_string(lone_fence));  // none drawn
    EXPECT_GT(pttl(srv, "s"), 50'000);
    // The given-up attempt's release, if it lands now, leaves the new one alone.
    EXPECT_EQ(integers(run_attempt_release(client, "s", "o1", "lone")),
              std::vector<std::int64_t>{-1});
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "1");
}

// An attempt through an object holding none that joins the owner's entry is counted once however
// often it lands, and its id names that entry for the reaper's release or a given-up item, which
// leave it once; a release by acquisition leaves entries as before.
TEST(RecursiveAcquireScript, AJoinIsCountedOnceAndLeftByItsAttemptsId) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(integers(run_acquire(client, "s", "o1", "60000", "0", std::string{"a"}, "1")).at(0),
              1);
    for (int landing = 0; landing < 2; ++landing) {
        const auto joined = run_acquire(client, "s", "o1", "60000", "0", std::string{"j1"}, "1");
        EXPECT_EQ(integers(joined), (std::vector<std::int64_t>{2, 0}));
        EXPECT_EQ(acquisition_id(joined), "a");
        EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "2");
    }
    ASSERT_EQ(integers(run_acquire(client, "s", "o1", "60000", "0", std::string{"j2"}, "1")).at(0),
              2);
    ASSERT_EQ(srv.cli({"HGET", "s", "o1"}), "3");
    // The reaper's release of the first join, sent twice, leaves one entry.
    for (int landing = 0; landing < 2; ++landing) {
        EXPECT_EQ(integers(run_attempt_release(client, "s", "o1", "j1")),
                  std::vector<std::int64_t>{landing == 0 ? 0 : -1});
        EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "2");
    }
    // A given-up attempt named by the next first entry leaves its entry; the caller joins.
    const auto next = run_acquire(client, "s", "o1", "60000", "0", std::string{"j3"}, "1", "j2");
    EXPECT_EQ(integers(next), (std::vector<std::int64_t>{2, 0}));
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "2");
    // An id no first entry had names nothing; nor does a release by an attempt's id without
    // ARGV[8].
    EXPECT_EQ(integers(run_attempt_release(client, "s", "o1", "never")),
              std::vector<std::int64_t>{-1});
    EXPECT_EQ(integers(run_release(client, "s", "o1", "1", "0", "{s}:released", std::string{"j3"})),
              std::vector<std::int64_t>{-1});
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "2");
}

// Neither rule ever takes over another owner's entry, even one named by the ids offered.
TEST(RecursiveAcquireScript, AnotherOwnersEntryIsNeverTakenOver) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::int64_t fence =
        fence_of(run_acquire(client, "s", "o1", "60000", "1", std::string{"shared-id"}, "1"));
    ASSERT_GT(fence, 0);
    ASSERT_FALSE(run_acquire(client, "s", "o1", "60000", "1", std::string{"shared-id"}).is_error());
    ASSERT_EQ(srv.cli({"HGET", "s", "o1"}), "2");
    const std::string before = srv.cli({"HGETALL", "s"});

    // As a retry of a lost reply, and as a given-up acquisition.
    for (const auto& [offered, given_up] :
         {std::pair<std::string, std::string>{"shared-id", ""}, {"other", "shared-id"}}) {
        SCOPED_TRACE(offered + " / " + given_up);
        const auto r = run_acquire(client, "s", "o2", "1000", "1", offered, "1", given_up);
        const auto values = integers(r);
        ASSERT_EQ(values.size(), 2U);
        EXPECT_EQ(values[0], 0);
        EXPECT_GT(values[1], 50'000);
        EXPECT_LE(values[1], 60'000);
        EXPECT_EQ(acquisition_id(r), "");
        EXPECT_EQ(srv.cli({"HGETALL", "s"}), before);
        EXPECT_EQ(owners_of(srv, "s"), std::vector<std::string>{"o1"});
        EXPECT_EQ(srv.cli({"GET", "{s}:fence"}), std::to_string(fence));
        EXPECT_GT(pttl(srv, "s"), 50'000);
    }
}

// A release or renewal made for an acquisition that was lost must not act on a later
// acquisition of the same owner.
TEST(RecursiveReleaseScript, ReleaseOrExtendForAnotherAcquisitionOfTheOwnerChangesNothing) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_FALSE(run_acquire(client, "s", "o1", "60000", "0").is_error());
    ASSERT_EQ(srv.cli({"PEXPIRE", "s", "30000"}), "1");

    EXPECT_EQ(integers(run_release(client, "s", "o1", "1", "1000", "{s}:released", "stale")),
              std::vector<std::int64_t>{-1});
    EXPECT_EQ(integers(run_extend(client, "s", "o1", "100", "stale")),
              std::vector<std::int64_t>{0});
    EXPECT_EQ(srv.cli({"HGET", "s", "o1"}), "1");
    EXPECT_GT(pttl(srv, "s"), 20'000);
}

// ---- recursive_mutex ----

// Object a's entries expire unnoticed; the same thread then acquires anew through b. Releasing
// a's stale entries must leave b's acquisition alone.
TEST(RecursiveMutex, StaleObjectOfTheSameOwnerNeverReleasesALaterAcquisition) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::atomic<int> lost_a{0};
    auto a = client.recursive_mutex("x", {.lease = 200ms, .on_lost = [&] { ++lost_a; }});
    auto b = client.recursive_mutex("x", {.lease = 10s});
    a.lock();
    std::this_thread::sleep_for(400ms);
    b.lock();  // a new acquisition: a's entry is gone
    std::error_code ec;
    a.unlock(ec);
    EXPECT_EQ(ec, redislock::errc::lock_lost);
    EXPECT_EQ(lost_a.load(), 1);
    EXPECT_EQ(sole_count(srv, "x"), "1");
    EXPECT_TRUE(b.verify());
    b.unlock();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, NestedLockToDepthHundredCountsEveryEntryAndLeavesNoKey) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rm = client.recursive_mutex("x");
    constexpr int depth = 100;

    for (int i = 0; i < depth; ++i) {
        rm.lock();
    }
    EXPECT_EQ(rm.depth(), std::size_t{depth});
    EXPECT_EQ(sole_count(srv, "x"), "100");

    for (int left = depth - 1; left >= 0; --left) {
        std::error_code ec;
        rm.unlock(ec);
        ASSERT_FALSE(ec) << "unlock with " << left << " entries left: " << ec.message();
        if (left == depth / 2) {
            EXPECT_EQ(sole_count(srv, "x"), "50");
        }
    }
    EXPECT_EQ(rm.depth(), 0U);
    EXPECT_FALSE(rm.owned());
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, SecondObjectOfTheSameOwnerReentersAndTheKeyStaysUntilTheLastUnlock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto a = client.recursive_mutex("x");
    auto b = client.recursive_mutex("x");

    a.lock();
    ASSERT_TRUE(b.try_lock());  // same thread, same client: a re-entry, not contention
    const std::string owner = sole_owner(srv, "x");
    EXPECT_EQ(owner.rfind(client.instance_id() + ":" + std::to_string(::getpid()) + ":thread:", 0),
              0U)
        << owner;
    EXPECT_EQ(srv.cli({"HGET", "x", owner}), "2");
    EXPECT_EQ(a.depth(), 1U);
    EXPECT_EQ(b.depth(), 1U);

    std::error_code ec;
    b.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(srv.cli({"HGET", "x", owner}), "1");
    EXPECT_TRUE(a.owned());
    EXPECT_TRUE(a.verify());

    a.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, AnotherThreadIsExcludedThroughItsOwnObjectAndTheSharedOne) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto shared = client.recursive_mutex("x");
    shared.lock();

    bool got_own = true;
    bool got_shared = true;
    std::thread{[&] {
        auto own = client.recursive_mutex("x");
        got_own = own.try_lock();
        got_shared = shared.try_lock();
    }}.join();
    EXPECT_FALSE(got_own);
    EXPECT_FALSE(got_shared);
    EXPECT_EQ(shared.depth(), 1U);
    EXPECT_EQ(sole_count(srv, "x"), "1");

    // Released, the same calls succeed: the refusals above were exclusion.
    shared.unlock();
    std::thread{[&] {
        auto own = client.recursive_mutex("x");
        got_own = own.try_lock();
        if (got_own) {
            own.unlock();
        }
        got_shared = shared.try_lock();
        if (got_shared) {
            shared.unlock();
        }
    }}.join();
    EXPECT_TRUE(got_own);
    EXPECT_TRUE(got_shared);
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, AnotherProcessIsExcludedWhileHeld) {
    redis_server srv;
    const std::string uri = srv.uri();
    // Forked before this process makes any thread or client; the child makes its own.
    child_process child{[uri](line_channel& parent) {
        if (parent.receive(10s) != "held") {
            return 10;
        }
        redislock::client client{uri};
        auto rm = client.recursive_mutex("x");
        parent.send(rm.try_lock() ? "acquired" : "refused");
        if (parent.receive(10s) != "released") {
            return 11;
        }
        const bool acquired = rm.try_lock();
        parent.send(acquired ? "acquired" : "refused");
        if (acquired) {
            rm.unlock();
        }
        return 0;
    }};

    redislock::client client{uri};
    auto rm = client.recursive_mutex("x");
    rm.lock();
    rm.lock();
    child.channel().send("held");
    EXPECT_EQ(child.channel().receive(10s), "refused");
    EXPECT_EQ(sole_count(srv, "x"), "2");

    rm.unlock();
    rm.unlock();
    child.channel().send("released");
    EXPECT_EQ(child.channel().receive(10s), "acquired");
    EXPECT_EQ(child.wait(10s), 0);
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, ReentryRefreshesTheLease) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rm = client.recursive_mutex("x", {.lease = 2000ms});
    rm.lock();
    std::this_thread::sleep_for(700ms);
    EXPECT_LE(pttl(srv, "x"), 1400);  // the first lease has been running

    rm.lock();
    const auto refreshed = pttl(srv, "x");
    EXPECT_GT(refreshed, 1700);
    EXPECT_LE(refreshed, 2000);
    EXPECT_GT(rm.remaining(), 1500ms);

    // Leaving an inner entry refreshes it as well.
    std::this_thread::sleep_for(700ms);
    rm.unlock();
    EXPECT_GT(pttl(srv, "x"), 1700);
    rm.unlock();
    EXPECT_EQ(exists(srv, "x"), "0");
}

// Objects of one owner share its entries, so the key must last as long as any of them counts
// on: a rival that takes the lock while one of them still holds is a second holder.
// `rival_gets_in` tries the lock as another owner (and gives it back at once).
// Whether the key's TTL covers what `holder` believes it has left: the TTL is read first, so
// the local estimate, read after it, can only be lower.
testing::AssertionResult outlives(const redis_server& srv, const std::string& key,
                                  const redislock::recursive_mutex& holder) {
    const auto ttl = pttl(srv, key);
    const auto believed = holder.remaining().count();
    if (ttl >= believed) {
        return testing::AssertionSuccess();
    }
    return testing::AssertionFailure()
           << "the key has " << ttl << " ms left, the holder believes it has " << believed;
}

bool rival_gets_in(redislock::recursive_mutex& rival) {
    const bool got = rival.try_lock();
    if (got) {
        rival.unlock();
    }
    return got;
}

TEST(RecursiveMutex, ObjectWithAShorterLeaseNeverShortensWhatAnotherObjectOfItsOwnerHolds) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    auto rival = other.recursive_mutex("x");
    auto a = client.recursive_mutex("x", {.lease = 10s});
    auto b = client.recursive_mutex("x", {.lease = 1s});
    a.lock();

    b.lock();  // a re-entry
    EXPECT_TRUE(outlives(srv, "x", a));
    b.unlock();  // an inner release
    EXPECT_TRUE(outlives(srv, "x", a));

    std::this_thread::sleep_for(1200ms);
    ASSERT_TRUE(a.owned());
    EXPECT_FALSE(rival_gets_in(rival))
        << "a rival got in while a holds with " << a.remaining().count() << " ms left";
    a.unlock();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, ReentryThroughAnotherObjectKeepsALeaseTheHolderExtended) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    auto rival = other.recursive_mutex("x");
    auto a = client.recursive_mutex("x", {.lease = 1s});
    auto b = client.recursive_mutex("x", {.lease = 1s});
    a.lock();
    ASSERT_TRUE(a.extend(10s));

    b.lock();
    b.unlock();
    EXPECT_TRUE(outlives(srv, "x", a));

    std::this_thread::sleep_for(1200ms);
    ASSERT_TRUE(a.owned());
    EXPECT_FALSE(rival_gets_in(rival))
        << "a rival got in while a holds with " << a.remaining().count() << " ms left";
    a.unlock();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, ExtendThroughAnotherObjectNeverShortensWhatTheHolderCountsOn) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    auto rival = other.recursive_mutex("x");
    auto a = client.recursive_mutex("x", {.lease = 10s});
    auto b = client.recursive_mutex("x", {.lease = 10s});
    a.lock();
    b.lock();

    ASSERT_TRUE(b.extend(1s));
    EXPECT_TRUE(outlives(srv, "x", a));

    std::this_thread::sleep_for(1200ms);
    ASSERT_TRUE(a.owned());
    EXPECT_FALSE(rival_gets_in(rival))
        << "a rival got in while a holds with " << a.remaining().count() << " ms left";
    b.unlock();
    a.unlock();
    EXPECT_EQ(exists(srv, "x"), "0");
}

// A re-entry never shortens what the object itself was granted: the server keeps the longer
// lease, and so does the object's local deadline (a shorter one would be told lost early).
TEST(RecursiveMutex, ReentryKeepsTheLongerLeaseTheObjectWasExtendedTo) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rm = client.recursive_mutex("x", {.lease = 1s});
    rm.lock();
    ASSERT_TRUE(rm.extend(10s));

    rm.lock();
    EXPECT_GT(pttl(srv, "x"), 9000);
    EXPECT_GT(rm.remaining(), 8s);
    rm.unlock();
    EXPECT_GT(pttl(srv, "x"), 9000);
    EXPECT_GT(rm.remaining(), 8s);
    rm.unlock();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, ExpiredLeaseIsReportedOnceAndNeverTouchesTheNewHolder) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    std::atomic<int> lost{0};
    auto rm = client.recursive_mutex("x", {.lease = 200ms, .on_lost = [&] { ++lost; }});
    rm.lock();
    std::this_thread::sleep_for(400ms);
    ASSERT_EQ(exists(srv, "x"), "0");  // Redis let the lease run out

    EXPECT_FALSE(rm.owned());
    EXPECT_EQ(rm.remaining(), 0ms);
    EXPECT_FALSE(rm.verify());
    EXPECT_EQ(lost.load(), 1);
    EXPECT_FALSE(rm.verify());
    EXPECT_EQ(lost.load(), 1);

    auto newcomer = other_client.recursive_mutex("x");
    ASSERT_TRUE(newcomer.try_lock());
    const std::string owner = sole_owner(srv, "x");

    EXPECT_FALSE(rm.extend(60s));
    EXPECT_LE(pttl(srv, "x"), 30'000);  // the newcomer's lease, not ours

    std::error_code ec;
    rm.unlock(ec);
    EXPECT_EQ(ec, errc::lock_lost) << ec.message();
    EXPECT_EQ(rm.depth(), 0U);
    EXPECT_EQ(lost.load(), 1);
    EXPECT_EQ(owners_of(srv, "x"), std::vector<std::string>{owner});
    EXPECT_EQ(srv.cli({"HGET", "x", owner}), "1");
    EXPECT_TRUE(newcomer.verify());

    rm.unlock(ec);
    EXPECT_EQ(ec, errc::not_held) << ec.message();
    newcomer.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, RelockingAfterTheEntriesWereLostStartsAFreshOutermostEntry) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::atomic<int> lost{0};
    auto rm = client.recursive_mutex("x", {.fencing = true, .on_lost = [&] { ++lost; }});
    rm.lock();
    const auto first_token = rm.fencing_token();
    // The entry disappears behind the holder's back (an expiry, or an operator's DEL).
    ASSERT_EQ(srv.cli({"DEL", "x"}), "1");

    rm.lock();  // Redis sees a new acquisition, not a re-entry
    EXPECT_EQ(sole_count(srv, "x"), "1");
    EXPECT_EQ(rm.depth(), 1U);
    EXPECT_TRUE(rm.owned());
    EXPECT_GT(rm.fencing_token(), first_token);
    EXPECT_EQ(lost.load(), 1);  // the first acquisition was lost

    std::error_code ec;
    rm.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(exists(srv, "x"), "0");
    rm.unlock(ec);
    EXPECT_EQ(ec, errc::not_held) << ec.message();
    EXPECT_EQ(lost.load(), 1);
}

TEST(RecursiveMutex, NonOwnerUnlockLeavesOwnersCountUnchanged) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rm = client.recursive_mutex("x");
    rm.lock();
    rm.lock();
    const std::string owner = sole_owner(srv, "x");
    ASSERT_EQ(srv.cli({"HGET", "x", owner}), "2");

    std::error_code through_shared;
    std::error_code through_own;
    std::thread{[&] {
        rm.unlock(through_shared);
        auto own = client.recursive_mutex("x");
        own.unlock(through_own);
    }}.join();
    EXPECT_EQ(through_shared, errc::not_holder) << through_shared.message();
    EXPECT_EQ(through_own, errc::not_held) << through_own.message();
    EXPECT_EQ(srv.cli({"HGET", "x", owner}), "2");
    EXPECT_EQ(rm.depth(), 2U);

    rm.unlock();
    rm.unlock();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, UnlockWhenNeverLockedReportsNotHeld) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto holder = other_client.recursive_mutex("x");
    holder.lock();
    const std::string owner = sole_owner(srv, "x");

    auto rm = client.recursive_mutex("x");
    std::error_code ec;
    rm.unlock(ec);
    EXPECT_EQ(ec, errc::not_held) << ec.message();
    EXPECT_EQ(srv.cli({"HGET", "x", owner}), "1");

    holder.unlock();
    rm.lock();
    rm.unlock();
    rm.unlock(ec);  // one unlock too many
    EXPECT_EQ(ec, errc::not_held) << ec.message();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, ExplicitOwnerLocksOnOneThreadAndUnlocksOnAnother) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rm = client.recursive_mutex("x", {.owner = "task-7"});

    std::thread{[&] {
        rm.lock();
        rm.lock();
    }}.join();
    EXPECT_EQ(owners_of(srv, "x"),
              std::vector<std::string>{client.instance_id() + ":" + std::to_string(::getpid()) +
                                       ":owner:task-7"});
    EXPECT_EQ(sole_count(srv, "x"), "2");

    std::error_code first;
    std::error_code second;
    std::thread{[&] { rm.unlock(first); }}.join();
    EXPECT_EQ(sole_count(srv, "x"), "1");
    std::thread{[&] { rm.unlock(second); }}.join();
    EXPECT_FALSE(first) << first.message();
    EXPECT_FALSE(second) << second.message();
    EXPECT_EQ(rm.depth(), 0U);
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, ObjectsWithTheSameExplicitOwnerReenterEachOther) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const redislock::lock_options task{.owner = "task-7"};
    auto a = client.recursive_mutex("x", task);
    auto b = client.recursive_mutex("x", task);

    bool reentered = false;
    std::thread{[&] { a.lock(); }}.join();
    std::thread{[&] { reentered = b.try_lock(); }}.join();
    EXPECT_TRUE(reentered);
    EXPECT_EQ(sole_count(srv, "x"), "2");

    // Only the same owner re-enters: a plain thread, or the same owner name on another client
    // (another instance), is someone else.
    bool plain_got_it = true;
    std::thread{[&] {
        auto plain = client.recursive_mutex("x");
        plain_got_it = plain.try_lock();
    }}.join();
    EXPECT_FALSE(plain_got_it);
    redislock::client other_client{srv.uri()};
    auto elsewhere = other_client.recursive_mutex("x", task);
    EXPECT_FALSE(elsewhere.try_lock());

    std::error_code ec;
    a.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(sole_count(srv, "x"), "1");
    b.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, FencingTokenIsOnePerOutermostAcquisitionAndStrictlyIncreases) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    const redislock::lock_options fenced{.fencing = true};
    auto a = client.recursive_mutex("x", fenced);
    auto b = client.recursive_mutex("x", fenced);
    EXPECT_EQ(a.fencing_token(), 0);

    a.lock();
    const std::int64_t first = a.fencing_token();
    EXPECT_GT(first, 0);
    a.lock();
    EXPECT_EQ(a.fencing_token(), first);
    b.lock();
    EXPECT_EQ(b.fencing_token(), first);  // a re-entry through another object of the owner
    EXPECT_EQ(srv.cli({"GET", "{x}:fence"}), std::to_string(first));
    b.unlock();
    a.unlock();
    a.unlock();
    EXPECT_EQ(a.fencing_token(), 0);

    // Outermost acquisitions by this thread, another thread and another client.
    std::vector<std::int64_t> tokens{first};
    for (int round = 0; round < 3; ++round) {
        b.lock();
        tokens.push_back(b.fencing_token());
        b.unlock();
        std::thread{[&] {
            auto own = client.recursive_mutex("x", fenced);
            own.lock();
            tokens.push_back(own.fencing_token());
            own.unlock();
        }}.join();
        auto elsewhere = other_client.recursive_mutex("x", fenced);
        elsewhere.lock();
        tokens.push_back(elsewhere.fencing_token());
        elsewhere.unlock();
    }
    for (std::size_t i = 1; i < tokens.size(); ++i) {
        EXPECT_LT(tokens[i - 1], tokens[i])
            << "acquisition " << i << " of " << testing::PrintToString(tokens);
    }

    // Without fencing no token is drawn.
    auto plain = client.recursive_mutex("y");
    plain.lock();
    EXPECT_EQ(plain.fencing_token(), 0);
    EXPECT_EQ(exists(srv, "{y}:fence"), "0");
    plain.unlock();
}

TEST(RecursiveMutex, EmptyNameOrLeaseOutOfRangeIsInvalidArgument) {
    redis_server srv;
    redislock::client client{srv.uri()};
    using redislock::invalid_argument;

    EXPECT_THROW((void)client.recursive_mutex(""), invalid_argument);
    EXPECT_THROW((void)client.recursive_mutex(std::string(64 * 1024 + 1, 'n')), invalid_argument);
    EXPECT_THROW((void)client.recursive_mutex("x", {.lease = 0ms}), invalid_argument);
    EXPECT_THROW((void)client.recursive_mutex("x", {.lease = -1ms}), invalid_argument);
    EXPECT_THROW((void)client.recursive_mutex("x", {.lease = redislock::max_lease + 1ms}),
                 invalid_argument);
    EXPECT_NO_THROW((void)client.recursive_mutex("x", {.lease = redislock::max_lease}));

    auto rm = client.recursive_mutex("x");
    rm.lock();
    EXPECT_THROW((void)rm.extend(0ms), invalid_argument);
    EXPECT_THROW((void)rm.extend(-5ms), invalid_argument);
    EXPECT_THROW((void)rm.extend(redislock::max_lease + 1ms), invalid_argument);
    EXPECT_EQ(sole_count(srv, "x"), "1");  // a rejected call changes nothing
    EXPECT_GT(pttl(srv, "x"), 20'000);
    rm.unlock();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, KeyOfAnotherTypeMakesLockAndTryLockThrowServerError) {
    redis_server srv;
    redislock::client client{srv.uri()};
    ASSERT_EQ(srv.cli({"SET", "x", "plain"}), "OK");
    auto rm = client.recursive_mutex("x");

    const std::string from_try_lock = server_error_from([&] { (void)rm.try_lock(); });
    EXPECT_TRUE(names_wrongtype(from_try_lock)) << from_try_lock;
    const std::string from_try_lock_for = server_error_from([&] { (void)rm.try_lock_for(5s); });
    EXPECT_TRUE(names_wrongtype(from_try_lock_for)) << from_try_lock_for;

    // lock() must fail, not retry forever. Were it retrying, deleting the key lets it acquire
    // and return, so the test ends either way.
    auto locking =
        std::async(std::launch::async, [&] { return server_error_from([&] { rm.lock(); }); });
    if (locking.wait_for(10s) != std::future_status::ready) {
        ADD_FAILURE() << "lock() on a key of another type had not returned after 10 s";
        srv.cli({"DEL", "x"});
    }
    const std::string from_lock = locking.get();
    EXPECT_TRUE(names_wrongtype(from_lock)) << from_lock;
    EXPECT_EQ(rm.depth(), 0U);
    EXPECT_EQ(srv.cli({"GET", "x"}), "plain");

    // A simple lock's key and a read-write lock's hash are refused the same way.
    auto simple = client.mutex("m");
    simple.lock();
    auto on_simple = client.recursive_mutex("m");
    const std::string from_simple = server_error_from([&] { (void)on_simple.try_lock(); });
    EXPECT_TRUE(names_wrongtype(from_simple)) << from_simple;
    auto read_write = client.shared_mutex("rw");
    read_write.lock_shared();
    ASSERT_EQ(srv.cli({"HEXISTS", "rw", "mode"}), "1");
    auto on_rw = client.recursive_mutex("rw");
    const std::string from_rw = server_error_from([&] { on_rw.lock(); });
    EXPECT_TRUE(names_wrongtype(from_rw)) << from_rw;
    read_write.unlock_shared();
}

TEST(RecursiveMutex, FailedReleaseIsReportedButIsNoLoss) {
    redis_server srv;
    redislock::basic_client<redislock::test::fault_connection> client{srv.uri()};
    std::atomic<int> lost{0};
    auto rm = client.recursive_mutex("x", {.on_lost = [&] { ++lost; }});
    rm.lock();
    rm.lock();
    const std::string owner = sole_owner(srv, "x");

    // An error reply (here a replica's refusal) is not a lost lock: the release is finished in
    // the background, once.
    client.connection().inject(redislock::test::fault::answer_error, "EVALSHA", 1,
                               redislock::detail::scripts::recursive_release,
                               "READONLY You can't write against a read only replica.");
    std::error_code ec;
    rm.unlock(ec);
    EXPECT_EQ(ec, errc::server_failed) << ec.message();
    EXPECT_TRUE(redislock::test::eventually(
        [&] {
            return srv.cli({"HGET", "x", owner}) == "1";
        },
        3s));
    std::this_thread::sleep_for(100ms);
    EXPECT_EQ(srv.cli({"HGET", "x", owner}), "1");
    EXPECT_TRUE(rm.owned());

    // Nor is a release that never reached the server. The last one is finished in the
    // background too.
    client.connection().inject(redislock::test::fault::throw_before_send, "EVALSHA", 1,
                               redislock::detail::scripts::recursive_release);
    rm.unlock(ec);
    EXPECT_EQ(ec, errc::connection_failed) << ec.message();
    EXPECT_TRUE(redislock::test::eventually([&] { return srv.cli({"EXISTS", "x"}) == "0"; }, 3s));
    EXPECT_EQ(rm.depth(), 0U);
    EXPECT_EQ(lost.load(), 0);
    EXPECT_EQ(client.connection().pending_faults(), 0);
}

TEST(RecursiveMutex, ErrorReplyToVerifyOrExtendIsThrownNotTakenForALoss) {
    redis_server srv;
    redislock::basic_client<redislock::test::fault_connection> client{srv.uri()};
    std::atomic<int> lost{0};
    auto rm = client.recursive_mutex("x", {.on_lost = [&] { ++lost; }});
    rm.lock();

    client.connection().inject(redislock::test::fault::answer_error, "HGET", 1, std::nullopt,
                               "LOADING Redis is loading the dataset in memory");
    EXPECT_THROW((void)rm.verify(), redislock::server_error);
    client.connection().inject(redislock::test::fault::answer_error, "EVALSHA", 1,
                               redislock::detail::scripts::recursive_extend,
                               "BUSY Redis is busy running a script.");
    EXPECT_THROW((void)rm.extend(10s), redislock::server_error);
    EXPECT_EQ(client.connection().pending_faults(), 0);

    EXPECT_EQ(lost.load(), 0);
    EXPECT_TRUE(rm.owned());
    EXPECT_TRUE(rm.verify());
    std::error_code ec;
    rm.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, WatchdogRenewsTheLeaseUntilTheLastEntryIsLeft) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::atomic<int> lost{0};
    auto rm =
        client.recursive_mutex("x", {.lease = 600ms, .watchdog = true, .on_lost = [&] { ++lost; }});
    rm.lock();
    rm.lock();
    EXPECT_EQ(client.watchdog().size(), 1U);  // one renewal per acquisition, not per entry

    std::this_thread::sleep_for(1500ms);  // more than two leases
    EXPECT_TRUE(rm.verify());
    rm.unlock();
    std::this_thread::sleep_for(1500ms);  // renewal goes on while an entry remains
    EXPECT_TRUE(rm.verify());
    EXPECT_EQ(client.watchdog().size(), 1U);

    rm.unlock();
    // A lease cancelled while its renewal is in flight goes when that renewal settles.
    EXPECT_TRUE(redislock::test::eventually([&] { return client.watchdog().size() == 0; }, 2s));
    EXPECT_EQ(exists(srv, "x"), "0");
    EXPECT_EQ(lost.load(), 0);
}

TEST(RecursiveMutex, DestroyingAHeldObjectLeavesEveryEntryItMade) {
    redis_server srv;
    redislock::client client{srv.uri()};
    {
        auto rm = client.recursive_mutex("x");
        rm.lock();
        rm.lock();
        rm.lock();
        ASSERT_EQ(sole_count(srv, "x"), "3");
    }
    EXPECT_EQ(exists(srv, "x"), "0");

    // Entries the same owner made through another object stay.
    auto outer = client.recursive_mutex("x");
    outer.lock();
    {
        auto inner = client.recursive_mutex("x");
        inner.lock();
        inner.lock();
        ASSERT_EQ(sole_count(srv, "x"), "3");
    }
    EXPECT_EQ(sole_count(srv, "x"), "1");
    EXPECT_TRUE(outer.verify());
    std::error_code ec;
    outer.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(exists(srv, "x"), "0");
}

TEST(RecursiveMutex, MovingKeepsEntriesAndOverwritingLeavesThem) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto original = client.recursive_mutex("x");
    original.lock();
    original.lock();

    auto moved = std::move(original);
    EXPECT_EQ(moved.depth(), 2U);
    EXPECT_EQ(sole_count(srv, "x"), "2");

    moved = client.recursive_mutex("y");
    EXPECT_EQ(exists(srv, "x"), "0");
    EXPECT_EQ(moved.name(), "y");
    EXPECT_EQ(moved.depth(), 0U);
}

TEST(RecursiveMutex, LastUnlockPublishesOnTheChannelBesideTheNameOnlyWhenSomeoneWaits) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::vector<std::pair<std::string, std::string>> cases{
        {"orders:42", "{orders:42}:released"}, {"a{tag}b", "a{tag}b:released"}};
    for (const auto& [name, channel] : cases) {
        SCOPED_TRACE(name);
        subscriber released{srv, channel};
        auto rm = client.recursive_mutex(name);
        rm.lock();
        rm.lock();
        rm.unlock();
        rm.unlock();
        // Messages arrive in order: nobody waited, so neither unlock published anything.
        ASSERT_EQ(srv.cli({"SPUBLISH", channel, "marker"}), "1");
        EXPECT_EQ(released.next(), "marker");

        // With a waiter in line (queued at script level), only the last unlock tells it.
        rm.lock();
        rm.lock();
        ASSERT_EQ(integers(queue_owner(client, name, "other")).at(0), 0);
        rm.unlock();
        ASSERT_EQ(srv.cli({"SPUBLISH", channel, "marker"}), "1");
        EXPECT_EQ(released.next(), "marker");  // leaving an inner entry tells nobody
        rm.unlock();
        EXPECT_EQ(released.next(), waiter_for("other"));
    }
}

TEST(RecursiveMutex, ReleaseHandsTheLockToTheWaiterUnderTheIdItQueuedWith) {
    redis_server srv;
    redislock::client holder_client{srv.uri()};
    redislock::client waiter_client{srv.uri()};
    auto holder = holder_client.recursive_mutex("handed", {.lease = 10s});
    // An explicit owner, so this thread may check and leave what the waiting thread took.
    auto waiter = waiter_client.recursive_mutex("handed", {.lease = 10s, .owner = "svc-2"});
    holder.lock();
    auto got = std::async(std::launch::async, [&] { return waiter.try_lock_for(20s); });
    std::string queued;
    ASSERT_TRUE(redislock::test::eventually([&] {
        const auto ids = queue_of(srv, "handed");
        queued = ids.empty() ? std::string{} : ids.front();
        return !queued.empty();
    }));
    ASSERT_EQ(queued.front(), 'h') << queued;
    const std::string acquisition = queued.substr(1, queued.find('.') - 1);

    holder.unlock();
    ASSERT_TRUE(got.get());
    // The release made the entry (a fresh attempt would have named its own acquisition).
    const std::string owner = sole_owner(srv, "handed");
    EXPECT_TRUE(owner.ends_with(":owner:svc-2")) << owner;
    EXPECT_EQ(srv.cli({"HGET", "handed", "id:" + owner}), acquisition);
    EXPECT_EQ(sole_count(srv, "handed"), "1");
    EXPECT_TRUE(queue_of(srv, "handed").empty());
    EXPECT_TRUE(waiter.verify());

    // Its entries count as any other's: a re-entry and two unlocks free the name.
    waiter.lock();
    EXPECT_EQ(sole_count(srv, "handed"), "2");
    waiter.unlock();
    waiter.unlock();
    EXPECT_EQ(exists(srv, "handed"), "0");
    EXPECT_TRUE(holder.try_lock());
    holder.unlock();
}

// Two threads share an explicit owner. The lock is handed to the first one's waiter, which polls
// (its user may not subscribe) and so claims it with an attempt; the second re-enters it before
// that. Both entries count: no one else gets the lock until both are left.
TEST(RecursiveMutex, HandedEntryReenteredByAnotherThreadOfItsOwnerKeepsBothEntries) {
    redis_server srv;
    ASSERT_EQ(
        srv.cli({"ACL", "SETUSER", "nochannels", "on", ">pw", "~*", "+@all", "resetchannels"}),
        "OK");
    redislock::client holder_client{srv.uri()};
    redislock::client shared_client{"redis://nochannels:pw@127.0.0.1:" +
                                    std::to_string(srv.port())};
    redislock::client other_client{srv.uri()};
    const redislock::lock_options shared{.lease = 10s, .owner = "svc"};
    auto holder = holder_client.recursive_mutex("both", {.lease = 10s});
    auto first = shared_client.recursive_mutex("both", shared);
    auto second = shared_client.recursive_mutex("both", shared);
    auto other = other_client.recursive_mutex("both", {.lease = 10s});
    holder.lock();
    auto got = std::async(std::launch::async, [&] { return first.try_lock_for(20s); });
    ASSERT_TRUE(redislock::test::eventually([&] {
        const auto ids = queue_of(srv, "both");
        return !ids.empty() && ids.front().starts_with('h');
    }));
    holder.unlock();  // hands an entry of "svc" to the first thread's waiter
    second.lock();    // most often before the first one's next poll claims it
    ASSERT_TRUE(got.get());
    EXPECT_EQ(sole_count(srv, "both"), "2");

    first.unlock();
    EXPECT_FALSE(other.try_lock()) << "taken while the second thread still holds";
    EXPECT_TRUE(second.verify());
    std::error_code ec;
    second.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_EQ(exists(srv, "both"), "0");
    EXPECT_TRUE(other.try_lock());
    other.unlock();
}

TEST(RecursiveMutex, FencedWaiterOrOneWhoseOwnerTheIdCannotCarryIsToldNotHanded) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const std::vector<redislock::lock_options> cases{{.lease = 10s, .fencing = true},
                                                     {.lease = 10s, .owner = "svc 2"},
                                                     {.lease = 10s, .owner = "svc@2"}};
    for (const auto& options : cases) {
        SCOPED_TRACE(options.owner);
        redislock::client holder_client{srv.uri()};
        auto holder = holder_client.recursive_mutex("told", {.lease = 10s});
        auto waiter = client.recursive_mutex("told", options);
        holder.lock();
        auto got = std::async(std::launch::async, [&] {
            const bool taken = waiter.try_lock_for(20s);
            if (taken) {
                waiter.unlock();
            }
            return taken;
        });
        std::string queued;
        ASSERT_TRUE(redislock::test::eventually([&] {
            const auto ids = queue_of(srv, "told");
            queued = ids.empty() ? std::string{} : ids.front();
            return !queued.empty();
        }));
        EXPECT_EQ(queued.front(), 'w') << queued;
        holder.unlock();
        EXPECT_TRUE(got.get());
        EXPECT_EQ(exists(srv, "told"), "0");
    }
}

TEST(RecursiveMutex, WorksWithStandardGuards) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto x = client.recursive_mutex("x");
    auto y = client.recursive_mutex("y");
    {
        std::unique_lock outer{x};
        std::scoped_lock both{x, y};  // std::lock over a held recursive lock re-enters it
        EXPECT_EQ(sole_count(srv, "x"), "2");
        EXPECT_EQ(sole_count(srv, "y"), "1");
    }
    EXPECT_EQ(exists(srv, "x"), "0");
    EXPECT_EQ(exists(srv, "y"), "0");
}

TEST(RecursiveMutex, StopRequestEndsAWaitingLockWithFalse) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto holder = other_client.recursive_mutex("x");
    holder.lock();
    const std::string owner = sole_owner(srv, "x");
    auto waiter = client.recursive_mutex("x");

    std::stop_source stop;
    std::atomic<bool> finished{false};
    bool acquired = true;
    std::thread waiting{[&] {
        acquired = waiter.lock(stop.get_token());
        finished = true;
    }};
    std::this_thread::sleep_for(200ms);
    EXPECT_FALSE(finished.load());  // still waiting while the lock is held

    const stopwatch since_stop;
    stop.request_stop();
    if (!wait_for_flag(finished, 10s)) {
        ADD_FAILURE() << "lock(stop_token) ignored the stop request for 10 s";
        holder.unlock();  // lets the waiter acquire and return, so the test ends
    }
    waiting.join();
    EXPECT_FALSE(acquired);
    EXPECT_LT(since_stop.elapsed(), 5s);
    EXPECT_EQ(waiter.depth(), 0U);
    EXPECT_EQ(srv.cli({"HGET", "x", owner}), "1");
}

TEST(RecursiveMutex, TryLockForTimesOutWhileHeldAndSucceedsOnceReleased) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other_client{srv.uri()};
    auto holder = other_client.recursive_mutex("x");
    holder.lock();
    auto waiter = client.recursive_mutex("x");

    const stopwatch waited;
    EXPECT_FALSE(waiter.try_lock_for(300ms));
    EXPECT_GE(waited.elapsed(), 290ms);
    EXPECT_LT(waited.elapsed(), 5s);
    EXPECT_FALSE(waiter.try_lock_until(std::chrono::steady_clock::now() + 100ms));
    EXPECT_EQ(waiter.depth(), 0U);

    // Released while another thread waits: that wait ends with the lock.
    std::atomic<bool> finished{false};
    bool acquired = false;
    std::thread waiting{[&] {
        acquired = waiter.try_lock_for(10s);
        if (acquired) {
            waiter.unlock();
        }
        finished = true;
    }};
    std::this_thread::sleep_for(200ms);
    holder.unlock();
    EXPECT_TRUE(wait_for_flag(finished, 12s));
    waiting.join();
    EXPECT_TRUE(acquired);
    EXPECT_EQ(exists(srv, "x"), "0");
}

// ---- queries: is_locked(), holder_ttl() and hold_count() ask the server ----

TEST(RecursiveMutex, QueriesSeeAFreeNameAsHeldByNoOne) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const auto m = client.recursive_mutex("x");
    EXPECT_FALSE(m.is_locked());
    EXPECT_EQ(m.holder_ttl(), 0ms);
    EXPECT_EQ(m.hold_count(), 0U);
    EXPECT_EQ(exists(srv, "x"), "0") << "a query writes nothing";
}

TEST(RecursiveMutex, HoldCountFollowsNestedEntriesAndReleasesOfTheOwnerThroughEveryObject) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.recursive_mutex("x", {.lease = 5s});
    auto same_owner = client.recursive_mutex("x", {.lease = 5s});
    m.lock();
    EXPECT_EQ(m.hold_count(), 1U);
    m.lock();
    m.lock();
    EXPECT_EQ(m.hold_count(), 3U);
    same_owner.lock();  // the same thread through another object: a re-entry
    EXPECT_EQ(m.hold_count(), 4U);
    EXPECT_EQ(same_owner.hold_count(), 4U);
    EXPECT_EQ(m.depth(), 3U) << "depth() counts this object's entries only";
    EXPECT_TRUE(m.is_locked());
    EXPECT_GT(m.holder_ttl(), 0ms);
    EXPECT_LE(m.holder_ttl(), 5s);
    same_owner.unlock();
    m.unlock();
    EXPECT_EQ(m.hold_count(), 2U);
    m.unlock();
    EXPECT_EQ(m.hold_count(), 1U);
    EXPECT_TRUE(m.is_locked());
    m.unlock();
    EXPECT_EQ(m.hold_count(), 0U);
    EXPECT_FALSE(m.is_locked());
    EXPECT_EQ(m.holder_ttl(), 0ms);
}

TEST(RecursiveMutex, QueriesSeeAnotherOwnersHoldButCountOnlyTheCallingOwnersEntries) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client elsewhere{srv.uri()};  // another process, as far as the server knows
    auto m = client.recursive_mutex("x", {.lease = 5s});
    const auto other = elsewhere.recursive_mutex("x");
    m.lock();
    m.lock();
    EXPECT_TRUE(other.is_locked());
    EXPECT_GT(other.holder_ttl(), 0ms);
    EXPECT_LE(other.holder_ttl(), 5s);
    EXPECT_EQ(other.hold_count(), 0U);
    // Another thread is another owner, through the very object that holds.
    std::size_t other_thread_count = 99;
    bool other_thread_sees_it = false;
    std::thread{[&] {
        other_thread_count = m.hold_count();
        other_thread_sees_it = m.is_locked();
    }}.join();
    EXPECT_EQ(other_thread_count, 0U);
    EXPECT_TRUE(other_thread_sees_it);
    EXPECT_EQ(m.hold_count(), 2U);
    m.unlock();
    m.unlock();
}

TEST(RecursiveMutex, HoldCountOfAnExplicitOwnerIsTheSameOnEveryThread) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.recursive_mutex("x", {.lease = 5s, .owner = "job-7"});
    m.lock();
    m.lock();
    std::size_t seen = 0;
    std::thread{[&] { seen = m.hold_count(); }}.join();
    EXPECT_EQ(seen, 2U);
    const auto another_job = client.recursive_mutex("x", {.owner = "job-8"});
    EXPECT_EQ(another_job.hold_count(), 0U);
    EXPECT_TRUE(another_job.is_locked());
    m.unlock();
    m.unlock();
}

TEST(RecursiveMutex, QueriesSeeAnExpiredLockAsFree) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.recursive_mutex("x", {.lease = 200ms});
    m.lock();
    m.lock();
    EXPECT_EQ(m.hold_count(), 2U);
    std::this_thread::sleep_for(400ms);
    EXPECT_FALSE(m.is_locked());
    EXPECT_EQ(m.holder_ttl(), 0ms);
    EXPECT_EQ(m.hold_count(), 0U);
}

// The books kept beside entries (the fencing token, handed:, gone: and id: fields) hold nothing
// by themselves; an owner holds once its field counts entries of the acquisition id:<owner> names.
TEST(RecursiveMutex, QueriesDoNotCountAHashHoldingOnlyBooksAsHeld) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const auto m = client.recursive_mutex("x", {.owner = "job"});
    const std::string owner = redislock::detail::owner_id(client.instance_id(), "job");
    ASSERT_EQ(srv.cli({"HSET", "x", "gone:" + owner, "a1 a2", "fence", "17", "handed:" + owner,
                       "a3", "gone:someone", "b1"}),
              "4");
    ASSERT_EQ(srv.cli({"PEXPIRE", "x", "5000"}), "1");
    EXPECT_FALSE(m.is_locked());
    EXPECT_EQ(m.holder_ttl(), 0ms);
    EXPECT_EQ(m.hold_count(), 0U);
    // An id without a count, and a count without an id, are books too.
    ASSERT_EQ(srv.cli({"HSET", "x", "id:" + owner, "a3", "someone", "2"}), "2");
    EXPECT_FALSE(m.is_locked());
    EXPECT_EQ(m.hold_count(), 0U);
    ASSERT_EQ(srv.cli({"HSET", "x", owner, "3"}), "1");
    EXPECT_TRUE(m.is_locked());
    EXPECT_GT(m.holder_ttl(), 0ms);
    EXPECT_LE(m.holder_ttl(), 5s);
    EXPECT_EQ(m.hold_count(), 3U);
    ASSERT_EQ(srv.cli({"HSET", "x", owner, "0"}), "0");
    EXPECT_FALSE(m.is_locked());
    EXPECT_EQ(m.hold_count(), 0U);
}

TEST(RecursiveMutex, QueriesOnAReadWriteLockOrAStringThrowWrongtype) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rw = client.shared_mutex("x", {.lease = 5s});
    rw.lock_shared();
    const auto m = client.recursive_mutex("x");
    try {
        (void)m.is_locked();
        ADD_FAILURE() << "a query on a read-write lock's name must throw";
    } catch (const redislock::server_error& e) {
        EXPECT_NE(std::string{e.what()}.find("WRONGTYPE"), std::string::npos) << e.what();
    }
    rw.unlock_shared();
    ASSERT_EQ(srv.cli({"SET", "x", "token"}), "OK");
    EXPECT_THROW((void)m.hold_count(), redislock::server_error);
    EXPECT_THROW((void)m.holder_ttl(), redislock::server_error);
}

// ---- mutual exclusion under load ----

// One process of the stress test: its client, a lock object all its threads share, and how
// often any of its locks reported a loss (never expected: the lease outlasts the test).
struct stress_process {
    explicit stress_process(const std::string& uri)
        : client{uri}, shared{client.recursive_mutex("stress", options())} {}

    redislock::lock_options options() {
        return {.on_lost = [this] { ++lost; }, .backoff_max = 8ms};
    }

    std::atomic<int> lost{0};
    redislock::client client;
    redislock::recursive_mutex shared;
};

// Leaves, innermost first, every entry still held when a critical section throws.
struct entry_stack {
    entry_stack() = default;
    entry_stack(const entry_stack&) = delete;
    entry_stack& operator=(const entry_stack&) = delete;
    ~entry_stack() {
        while (!entries.empty()) {
            entries.back()->unlock();
            entries.pop_back();
        }
    }
    std::vector<redislock::recursive_mutex*> entries;
};

TEST(RecursiveMutex, ThreadsAndProcessesNeverOverlapAndLoseNoIncrement) {
    redis_server srv;
    const redislock::test::exclusion_options options{.uri = srv.uri(),
                                                     .counter_key = "counter",
                                                     .processes = 2,
                                                     .threads = 3,
                                                     .iterations = 150};

    const auto report = redislock::test::run_exclusion(options, [&options](int) {
        auto process = std::make_shared<stress_process>(options.uri);
        return [process](int) {
            auto own = std::make_shared<redislock::recursive_mutex>(
                process->client.recursive_mutex("stress", process->options()));
            return [process, own](std::mt19937_64& rng, const std::function<void()>& critical) {
                // Mostly the object every thread shares, sometimes this thread's own one.
                const auto pick = [&] { return rng() % 3 == 0 ? own.get() : &process->shared; };
                entry_stack held;
                auto* first = pick();
                if (!first->try_lock_for(20s)) {
                    throw std::runtime_error{"no lock within 20 s"};
                }
                held.entries.push_back(first);
                const auto depth = 1 + rng() % 5;
                while (held.entries.size() < depth) {
                    auto* next = pick();
                    if (!next->try_lock()) {  // a re-entry never waits
                        throw std::runtime_error{"re-entry refused"};
                    }
                    held.entries.push_back(next);
                }
                critical();
                while (!held.entries.empty()) {
                    std::error_code ec;
                    held.entries.back()->unlock(ec);
                    held.entries.pop_back();
                    if (ec) {
                        throw std::runtime_error{"unlock: " + ec.message()};
                    }
                }
                if (process->lost.load() != 0) {
                    throw std::runtime_error{"on_lost was called"};
                }
            };
        };
    });

    EXPECT_TRUE(report.errors.empty()) << report.describe();
    EXPECT_EQ(report.completed, report.planned) << report.describe();
    EXPECT_EQ(report.counter, report.completed) << report.describe();
    EXPECT_FALSE(report.overlap().has_value()) << report.describe();
    EXPECT_EQ(exists(srv, "stress"), "0");
}

// A hiredis connection, with its subscriber links, that notes which threads run a script.
struct script_counting_connection {
    struct record {
        std::mutex mutex;
        std::string sha1;
        std::vector<std::thread::id> runs;
    };
    std::shared_ptr<redislock::hiredis_connection> inner;
    std::shared_ptr<record> noted = std::make_shared<record>();

    explicit script_counting_connection(const std::string& uri)
        : inner{std::make_shared<redislock::hiredis_connection>(uri)} {}
    // Notes the runs of `s` from now on, forgetting earlier ones.
    void note(const redislock::script& s) {
        std::lock_guard guard{noted->mutex};
        noted->sha1 = s.sha1;
        noted->runs.clear();
    }
    // How many runs were noted, and by how many threads.
    std::pair<std::size_t, std::size_t> runs() const {
        std::lock_guard guard{noted->mutex};
        std::vector<std::thread::id> threads = noted->runs;
        std::sort(threads.begin(), threads.end());
        return {noted->runs.size(),
                static_cast<std::size_t>(
                    std::distance(threads.begin(), std::unique(threads.begin(), threads.end())))};
    }
    redislock::reply execute(redislock::command argv) {
        return execute(argv, redislock::call_context{});
    }
    redislock::reply execute(redislock::command argv, const redislock::call_context& how) {
        if (argv.size() > 1 && argv[0] == "EVALSHA") {
            std::lock_guard guard{noted->mutex};
            if (argv[1] == noted->sha1) {
                noted->runs.push_back(std::this_thread::get_id());
            }
        }
        return inner->execute(argv, how);
    }
    std::unique_ptr<redislock::subscriber_link> open_subscriber(std::string_view channel) {
        return inner->open_subscriber(channel);
    }
    const redislock::endpoint& config() const { return inner->config(); }
};

// A thread that holds no reentrant or read-write lock cannot re-enter the one it waits for, so
// it queues in its client's local gate without trying first: while a lock of either kind is held
// elsewhere, only the first of four waiting threads of one client sends attempts (its try, then
// its attempt that joins the queue), where each used to try once. A thread that holds another
// lock still tries first, as its own release may be what the gate waits for.
TEST(LocalGate, ThreadsThatHoldNothingQueueWithoutTryingFirst) {
    namespace scripts = redislock::detail::scripts;
    redis_server srv;
    script_counting_connection conn{srv.uri()};
    redislock::basic_client<script_counting_connection> client{conn};
    redislock::client other{srv.uri()};

    const auto expect_attempts = [&](const redislock::script& script, auto make, auto&& holder,
                                     bool hold_another, std::size_t threads_in_redis) {
        SCOPED_TRACE(std::string{script.name} + (hold_another ? ", one holding another" : ""));
        holder.lock();
        conn.note(script);
        std::vector<std::jthread> waiters;
        std::atomic<int> started{0};
        std::atomic<int> acquired{0};
        for (int i = 0; i < 4; ++i) {
            waiters.emplace_back([&, i] {
                std::optional<redislock::basic_shared_mutex<script_counting_connection>> another;
                if (hold_another && i == 3) {
                    another.emplace(client.shared_mutex("another"));
                    another->lock();
                }
                auto m = make();
                ++started;
                if (m.try_lock_for(10s)) {
                    ++acquired;
                    m.unlock();
                }
            });
            if (i == 0) {
                // The first thread is the one in Redis: its try, then its attempt that joins.
                ASSERT_TRUE(
                    redislock::test::eventually([&] { return conn.runs().first >= 2; }, 5s));
            }
        }
        ASSERT_TRUE(redislock::test::eventually([&] { return started.load() == 4; }, 5s));
        ASSERT_TRUE(redislock::test::eventually(
            [&] { return conn.runs().second >= threads_in_redis; }, 5s));
        std::this_thread::sleep_for(300ms);  // a thread that tries first has done so by now
        EXPECT_EQ(conn.runs().second, threads_in_redis);
        holder.unlock();
        waiters.clear();
        EXPECT_EQ(acquired.load(), 4);
    };
    expect_attempts(
        scripts::recursive_acquire, [&] { return client.recursive_mutex("r", {.lease = 10s}); },
        other.recursive_mutex("r", {.lease = 10s}), false, 1);
    expect_attempts(
        scripts::shared_acquire, [&] { return client.shared_mutex("w", {.lease = 10s}); },
        other.shared_mutex("w", {.lease = 10s}), false, 1);
    expect_attempts(
        scripts::recursive_acquire, [&] { return client.recursive_mutex("r", {.lease = 10s}); },
        other.recursive_mutex("r", {.lease = 10s}), true, 2);
}

// The count behind the local gate's choice (detail/waiting/thread_holds.hpp): a thread's holds of
// both kinds under its own owner are counted while it has them; holds of an explicit owner are not
// (its waits always try first); a hold ended from another thread stays counted on its own.
TEST(LocalGate, ThreadCountsItsOwnHoldsOfBothKinds) {
    using redislock::detail::thread_may_hold_any;
    redis_server srv;
    redislock::client client{srv.uri()};
    std::thread{[&] {
        auto r = client.recursive_mutex("r");
        auto w = client.shared_mutex("w");
        EXPECT_FALSE(thread_may_hold_any());
        r.lock();
        r.lock();
        EXPECT_TRUE(thread_may_hold_any());
        r.unlock();
        EXPECT_TRUE(thread_may_hold_any());
        r.unlock();
        EXPECT_FALSE(thread_may_hold_any());
        w.lock();
        w.lock_shared();  // a downgrade: two holds
        w.unlock();
        EXPECT_TRUE(thread_may_hold_any());
        w.unlock_shared();
        EXPECT_FALSE(thread_may_hold_any());

        auto shared_owner = client.recursive_mutex("o", {.owner = "job-7"});
        shared_owner.lock();
        EXPECT_FALSE(thread_may_hold_any());
        shared_owner.unlock();

        auto dropped = std::make_unique<redislock::recursive_mutex>(client.recursive_mutex("d"));
        dropped->lock();
        std::thread{[&] { dropped.reset(); }}.join();
        EXPECT_TRUE(thread_may_hold_any());
    }}.join();
}

// A connection that holds one reentrant acquisition back: the caller is answered at once with
// the timeout a slow reply would end in, and the script runs on the server only when released,
// as an attempt given up mid-flight lands after the calls that followed it.
struct held_back_connection {
    struct held {
        std::mutex mutex;
        bool armed = false;
        std::vector<std::string> argv;
    };
    std::shared_ptr<redislock::hiredis_connection> inner;
    std::shared_ptr<held> back = std::make_shared<held>();

    explicit held_back_connection(const std::string& uri)
        : inner{std::make_shared<redislock::hiredis_connection>(uri)} {}
    // Holds back the next acquisition.
    void arm() {
        std::lock_guard guard{back->mutex};
        back->armed = true;
    }
    // Runs the acquisition held back, now; false when none was.
    bool land() {
        std::vector<std::string> argv;
        {
            std::lock_guard guard{back->mutex};
            argv.swap(back->argv);
        }
        if (argv.empty()) {
            return false;
        }
        const std::vector<std::string_view> views(argv.begin(), argv.end());
        (void)inner->execute(views);
        return true;
    }
    redislock::reply execute(redislock::command argv) {
        return execute(argv, redislock::call_context{});
    }
    redislock::reply execute(redislock::command argv, const redislock::call_context& how) {
        if (argv.size() > 1 && argv[0] == "EVALSHA" &&
            argv[1] == redislock::detail::scripts::recursive_acquire.sha1) {
            std::lock_guard guard{back->mutex};
            if (back->armed) {
                back->armed = false;
                back->argv.assign(argv.begin(), argv.end());
                throw redislock::timeout_error{"held back: its reply did not come in time"};
            }
        }
        return inner->execute(argv, how);
    }
    std::unique_ptr<redislock::subscriber_link> open_subscriber(std::string_view channel) {
        return inner->open_subscriber(channel);
    }
    const redislock::endpoint& config() const { return inner->config(); }
};

// An acquisition given up mid-flight whose script lands only after the same object's next
// acquisition must not join that one: the entry it would add is counted by no unlock(), and the
// lock would stay held, by no one, for the rest of its lease.
TEST(RecursiveMutex, AnAttemptGivenUpMidFlightThatLandsAfterTheNextAcquisitionAddsNoEntry) {
    redis_server srv;
    held_back_connection conn{srv.uri()};
    redislock::basic_client<held_back_connection> client{conn};
    auto m = client.recursive_mutex("late-join", {.lease = 30s});
    m.lock();  // loads the script
    m.unlock();

    conn.arm();
    try {
        m.lock();  // may retry at once, and acquire through its next attempt
    } catch (const redislock::timeout_error&) {
    }
    if (!m.owned()) {
        m.lock();
    }
    ASSERT_TRUE(conn.land());
    m.unlock();
    // The reaper drops what the given-up attempt may have left; nothing may remain.
    EXPECT_TRUE(redislock::test::eventually(
        [&] {
            return srv.cli({"EXISTS", "late-join"}) == "0";
        },
        3s))
        << srv.cli({"HGETALL", "late-join"});
    redislock::client rival{srv.uri()};
    auto other = rival.recursive_mutex("late-join");
    EXPECT_TRUE(other.try_lock());
    other.unlock();
}

// Two objects of one owner share its entry; the second one's last release goes unanswered for a
// while: its next lock() must leave the first object's entry in place.
TEST(RecursiveMutex, ANextLockAfterAnUnansweredReleaseKeepsAnotherObjectsEntry) {
    redis_server srv;
    using faulty = redislock::test::faulty_connection<redislock::hiredis_connection>;
    faulty conn{srv.uri()};
    redislock::basic_client<faulty> client{conn};
    const redislock::lock_options task{.lease = 30s, .owner = "task-9"};
    auto first = client.recursive_mutex("x", task);
    auto joined = client.recursive_mutex("x", task);
    first.lock();
    first.lock();
    first.unlock();
    joined.lock();
    ASSERT_EQ(sole_count(srv, "x"), "2");
    conn.add({.command = "EVALSHA",
              .script = "recursive_release",
              .action = redislock::test::fault_action::drop_reply,
              .times = -1});
    std::error_code ec;
    joined.unlock(ec);
    EXPECT_TRUE(ec) << "the reply was dropped";
    try {
        joined.lock();  // sends that release first: unanswered, the call fails
    } catch (const redislock::error&) {
    }
    conn.clear_rules();
    if (!joined.owned()) {
        joined.lock();
    }
    joined.unlock(ec);
    EXPECT_FALSE(ec);
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(sole_count(srv, "x"), "1");
    EXPECT_TRUE(first.owned());
    redislock::client rival_client{srv.uri()};
    auto rival = rival_client.recursive_mutex("x");
    EXPECT_FALSE(rival.try_lock());
    first.unlock();
    EXPECT_EQ(srv.cli({"EXISTS", "x"}), "0");
}

// An attempt that timed out lands late (the server slept), after its lease and the client's
// record of it, and its entry is joined by another object of the owner; the first object's next
// lock() must leave only that attempt's own entry, never take the joiner's with it.
TEST(RecursiveMutex, AnAttemptGivenUpAndJoinedLaterKeepsTheJoinersEntry) {
    redis_server srv{{.extra_args = {"--enable-debug-command", "yes"}}};
    using faulty = redislock::test::faulty_connection<redislock::hiredis_connection>;
    faulty conn{srv.uri()};
    redislock::basic_client<faulty> client{conn};
    auto brief = client.recursive_mutex("x", {.lease = 1500ms, .owner = "task-9"});
    auto joiner = client.recursive_mutex("x", {.lease = 30s, .owner = "task-9"});
    brief.lock();
    brief.unlock();  // both scripts are loaded
    // The reaper's leave of the given-up attempt never goes out: the next lock() settles it.
    conn.add({.command = "EVALSHA",
              .script = "recursive_release",
              .action = redislock::test::fault_action::throw_before_send,
              .times = -1});
    bool acquired = false;
    {
        // The server sleeps past the attempt's lease: the attempt waits in its socket and runs
        // when it wakes, after its caller and the client's registry gave it up.
        const redislock::test::server_asleep sleep{srv, 3s};
        ASSERT_TRUE(sleep.asleep());
        try {
            acquired = brief.try_lock_for(50ms);
        } catch (const redislock::error&) {
        }
    }
    ASSERT_FALSE(acquired);
    // It runs once the server wakes.
    ASSERT_TRUE(redislock::test::eventually([&] { return srv.cli({"EXISTS", "x"}) == "1"; }, 1s));
    ASSERT_EQ(sole_count(srv, "x"), "1") << srv.cli({"HGETALL", "x"});
    joiner.lock();
    ASSERT_EQ(sole_count(srv, "x"), "2");
    conn.clear_rules();
    brief.lock();
    EXPECT_EQ(sole_count(srv, "x"), "2");
    brief.unlock();
    ASSERT_TRUE(redislock::detail::background_reaper().wait_idle(5s));
    EXPECT_TRUE(joiner.owned());
    EXPECT_EQ(sole_count(srv, "x"), "1");
    redislock::client rival_client{srv.uri()};
    auto rival = rival_client.recursive_mutex("x");
    EXPECT_FALSE(rival.try_lock());
    joiner.unlock();
    EXPECT_EQ(srv.cli({"EXISTS", "x"}), "0");
}

// An attempt that joined the owner's entry through another object, whose reply was lost, is given
// up, and the object locks again: the lost join must be left once, so that nothing is held once
// every object let go.
TEST(RecursiveMutex, AJoinWhoseReplyWasLostIsLeftOnce) {
    redis_server srv;
    using faulty = redislock::test::faulty_connection<redislock::hiredis_connection>;
    faulty conn{srv.uri()};
    redislock::basic_client<faulty> client{conn};
    const redislock::lock_options task{.lease = 30s, .owner = "task-9"};
    auto first = client.recursive_mutex("x", task);
    auto joiner = client.recursive_mutex("x", task);
    first.lock();
    conn.add({.command = "EVALSHA",
              .script = "recursive_acquire",
              .action = redislock::test::fault_action::drop_reply});
    try {
        joiner.lock();  // the reply is lost
    } catch (const redislock::error&) {
    }
    if (!joiner.owned()) {
        joiner.lock();
    }
    std::error_code ec;
    joiner.unlock(ec);
    EXPECT_FALSE(ec);
    first.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    ASSERT_TRUE(redislock::detail::background_reaper().wait_idle(5s));
    EXPECT_EQ(srv.cli({"EXISTS", "x"}), "0") << srv.cli({"HGETALL", "x"});
}

// The local deadline has passed (owned() is false) but the loss timer has not told it yet (its
// thread is busy telling another loss): lock() must be a first entry with a lease of its own,
// never a re-entry into the expired hold.
TEST(RecursiveMutex, ALockAfterTheLocalDeadlineIsAFirstEntryBeforeTheTimerTellsTheLoss) {
    redis_server srv;
    redislock::client client{srv.uri()};
    std::atomic<bool> telling{false};
    std::atomic<bool> let_timer_go{false};
    auto blocker = client.mutex("blocker", {.lease = 300ms, .on_lost = [&] {
                                                telling = true;
                                                for (int i = 0; i < 400 && !let_timer_go; ++i) {
                                                    std::this_thread::sleep_for(5ms);
                                                }
                                            }});
    auto m = client.recursive_mutex("x", {.lease = 1s});
    blocker.lock();
    m.lock();
    ASSERT_TRUE(redislock::test::eventually([&] { return telling.load(); }, 2s));
    ASSERT_TRUE(redislock::test::eventually([&] { return !m.owned(); }, 2s));
    m.lock();
    EXPECT_TRUE(m.owned());
    EXPECT_EQ(m.depth(), 1U);
    EXPECT_FALSE(m.lost_token().stop_requested());
    let_timer_go = true;
    std::error_code ec;
    m.unlock(ec);
    EXPECT_FALSE(ec) << ec.message();
    EXPECT_TRUE(redislock::test::eventually([&] { return exists(srv, "x") == "0"; }, 2s));
}

// An object of the owner whose own lease ran out locally, while another object of the owner
// still holds the entry they share, locks again: the first object's entry must stay.
TEST(RecursiveMutex, AnObjectLostByItsLeaseKeepsAnotherObjectsEntryOnItsNextLock) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto first = client.recursive_mutex("x", {.lease = 30s, .owner = "task-9"});
    auto brief = client.recursive_mutex("x", {.lease = 1s, .owner = "task-9"});
    first.lock();
    brief.lock();
    ASSERT_TRUE(redislock::test::eventually([&] { return !brief.owned(); }, 10s));
    // Its loss is told and its entry taken back in the background.
    ASSERT_TRUE(redislock::test::eventually([&] { return sole_count(srv, "x") == "1"; }, 10s));
    brief.lock();
    brief.unlock();
    std::this_thread::sleep_for(200ms);
    EXPECT_TRUE(first.owned());
    EXPECT_EQ(sole_count(srv, "x"), "1");
    redislock::client rival_client{srv.uri()};
    auto rival = rival_client.recursive_mutex("x");
    EXPECT_FALSE(rival.try_lock());
    first.unlock();
    EXPECT_EQ(srv.cli({"EXISTS", "x"}), "0");
}

// The object's last release goes unanswered and its resend is slow; the object's next lock()
// loses its reply too and retries: once all of that has landed and the object has let go, the
// lock is free (a join into the unsettled acquisition whose reply was lost would leave a count no
// one leaves, kept alive by every later re-entry of the owner).
TEST(RecursiveMutex, ALockAfterAnUnansweredReleaseLeavesNoCountBehind) {
    redis_server srv;
    using faulty = redislock::test::faulty_connection<redislock::hiredis_connection>;
    faulty conn{srv.uri()};
    redislock::basic_client<faulty> client{conn};
    auto first = client.recursive_mutex("x", {.lease = 30s, .owner = "task-9"});
    first.lock();
    first.lock();
    first.unlock();  // the release script is loaded
    conn.add({.command = "EVALSHA",
              .script = "recursive_release",
              .action = redislock::test::fault_action::throw_before_send});
    conn.add({.command = "EVALSHA",
              .script = "recursive_release",
              .action = redislock::test::fault_action::delay_before,
              .first = 2,
              .delay = 900ms});
    std::error_code ec;
    first.unlock(ec);
    EXPECT_TRUE(ec) << "the release was never sent";
    conn.add({.command = "EVALSHA",
              .script = "recursive_acquire",
              .action = redislock::test::fault_action::drop_reply});
    try {
        first.lock();
    } catch (const redislock::error&) {
    }
    if (!first.owned()) {
        first.lock();
    }
    ASSERT_TRUE(redislock::detail::background_reaper().wait_idle(5s));
    first.unlock();
    ASSERT_TRUE(redislock::detail::background_reaper().wait_idle(5s));
    for (int i = 0; i < 3; ++i) {
        first.lock();
        first.unlock();
    }
    EXPECT_EQ(srv.cli({"EXISTS", "x"}), "0") << srv.cli({"HGETALL", "x"});
    redislock::client rival_client{srv.uri()};
    auto rival = rival_client.recursive_mutex("x");
    EXPECT_TRUE(rival.try_lock());
}

}  // namespace

// A release whose reply was lost is sent again in the background: when the first send had
// landed, the second must leave nothing, else it takes the entry another object of the owner
// joined and frees the lock under that holder.
TEST(RecursiveMutex, AReleaseSentAgainAfterALostReplyNeverTakesAnotherObjectsEntry) {
    redis_server srv;
    using faulty = redislock::test::faulty_connection<redislock::hiredis_connection>;
    faulty conn{srv.uri()};
    redislock::basic_client<faulty> client{conn};
    const redislock::lock_options task{.lease = 30s, .owner = "task-9"};
    auto first = client.recursive_mutex("x", task);
    auto joined = client.recursive_mutex("x", task);
    first.lock();
    first.lock();
    first.unlock();  // the release script is loaded: a dropped reply is then its answer's
    joined.lock();
    ASSERT_EQ(sole_count(srv, "x"), "2");
    const auto before = conn.count("EVALSHA", "recursive_release");
    conn.add({.command = "EVALSHA",
              .script = "recursive_release",
              .action = redislock::test::fault_action::drop_reply});
    std::error_code ec;
    joined.unlock(ec);
    EXPECT_TRUE(ec) << "the reply was dropped";
    // The reaper sends the release again.
    ASSERT_TRUE(redislock::test::eventually(
        [&] { return conn.count("EVALSHA", "recursive_release") >= before + 2; }, 10s));
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(sole_count(srv, "x"), "1");
    EXPECT_TRUE(first.owned());
    redislock::client rival_client{srv.uri()};
    auto rival = rival_client.recursive_mutex("x");
    EXPECT_FALSE(rival.try_lock());
    first.unlock();
    EXPECT_EQ(srv.cli({"EXISTS", "x"}), "0");
}
