// redislock-inspect (tools/inspect.hpp) against real servers: each lock kind taken with the
// library, read back by the tool, and freed with --force-release.

#include "inspect.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <shared_mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/inspect_program.hpp"
#include "support/redis_cluster.hpp"
#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::inspect::lock_kind;
using redislock::test::contains;
using redislock::test::eventually;
using redislock::test::redis_server;

TEST(Inspect, AFreeNameIsReportedFreeWithNoFence) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const auto r = redislock::inspect::inspect(client.connection(), "orders:42");
    EXPECT_EQ(r.kind, lock_kind::free);
    EXPECT_TRUE(r.holders.empty());
    EXPECT_FALSE(r.fence);
    EXPECT_FALSE(r.queue_present);
    EXPECT_FALSE(redislock::inspect::something_to_free(r));
    const std::string text = redislock::inspect::format(r);
    EXPECT_TRUE(contains(text, "kind:            none (no key: the lock is free)")) << text;
    EXPECT_TRUE(contains(text, "holders:         none")) << text;
    EXPECT_TRUE(contains(text, "waiters:         none (no queue)")) << text;
    EXPECT_TRUE(contains(text, "fencing counter: none ({orders:42}:fence absent")) << text;
}

TEST(Inspect, MutexShowsItsTokenLeaseAndFencingCounter) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("orders:42", {.lease = 5s, .fencing = true});
    std::unique_lock guard{m};

    const auto r = redislock::inspect::inspect(client.connection(), "orders:42");
    EXPECT_EQ(r.kind, lock_kind::mutex);
    ASSERT_EQ(r.holders.size(), 1U);
    EXPECT_EQ(r.holders[0].who, srv.cli({"GET", "orders:42"}));
    EXPECT_EQ(r.holders[0].count, 1);
    ASSERT_TRUE(r.holders[0].remaining_ms);
    EXPECT_GT(*r.holders[0].remaining_ms, 0);
    EXPECT_LE(*r.holders[0].remaining_ms, 5000);
    ASSERT_TRUE(r.fence);
    EXPECT_EQ(*r.fence, m.fencing_token());
    EXPECT_GT(r.fence_ttl_ms, 0);
    EXPECT_EQ(r.fence_key, "{orders:42}:fence");

    const std::string text = redislock::inspect::format(r);
    EXPECT_TRUE(contains(text, "kind:            mutex")) << text;
    EXPECT_TRUE(contains(text, "  token " + r.holders[0].who + "  count 1  lease ")) << text;
    EXPECT_TRUE(contains(text, "fencing counter: " + std::to_string(m.fencing_token()))) << text;
}

TEST(Inspect, SemaphoreShowsItsPermitsHoldersAndWaiters) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto a = client.semaphore("exports", {.permits = 2, .lease = 5s, .fencing = true});
    auto b = client.semaphore("exports", {.permits = 2, .lease = 5s});
    ASSERT_TRUE(a.try_acquire());
    ASSERT_TRUE(b.try_acquire());
    auto waiter = client.semaphore("exports", {.permits = 2, .lease = 5s});
    std::thread waiting{[&] { (void)waiter.try_acquire_for(20s); }};
    ASSERT_TRUE(eventually([&] { return srv.cli({"ZCARD", "{exports}:queue"}) == "1"; }));

    const auto r = redislock::inspect::inspect(client.connection(), "exports");
    EXPECT_EQ(r.kind, lock_kind::semaphore);
    ASSERT_EQ(r.holders.size(), 2U);
    for (const auto& h : r.holders) {
        ASSERT_TRUE(h.remaining_ms);
        EXPECT_GT(*h.remaining_ms, 0);
        EXPECT_LE(*h.remaining_ms, 5000);
    }
    ASSERT_TRUE(r.permits);
    EXPECT_EQ(*r.permits, 2);
    EXPECT_EQ(r.waiter_total, 1);
    ASSERT_TRUE(r.fence);
    EXPECT_EQ(*r.fence, a.fencing_token());
    const std::string text = redislock::inspect::format(r);
    EXPECT_TRUE(contains(text, "kind:            counting_semaphore")) << text;
    EXPECT_TRUE(contains(text, "permits:         2 ({exports}:permits), 0 free")) << text;
    EXPECT_TRUE(contains(text, "  permit " + r.holders[0].who + "  count 1  lease ")) << text;

    const auto freed = redislock::inspect::force_release(client.connection(), r);
    EXPECT_TRUE(freed.lock_deleted);
    waiting.join();
    EXPECT_TRUE(waiter.owned()) << "the waiter was told and took a permit";
    EXPECT_EQ(srv.cli({"GET", "{exports}:permits"}), "2") << "the count is kept";
    waiter.release();
    const auto after = redislock::inspect::inspect(client.connection(), "exports");
    EXPECT_EQ(after.kind, lock_kind::free);
    EXPECT_TRUE(contains(redislock::inspect::format(after), "2 free"));
}

TEST(Inspect, RecursiveMutexShowsTheOwnerItsCountAndAcquisition) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.recursive_mutex("jobs", {.lease = 5s, .fencing = true});
    m.lock();
    m.lock();

    const auto r = redislock::inspect::inspect(client.connection(), "jobs");
    EXPECT_EQ(r.kind, lock_kind::recursive_mutex);
    ASSERT_EQ(r.holders.size(), 1U);
    EXPECT_TRUE(r.holders[0].who.starts_with(client.instance_id() + ":")) << r.holders[0].who;
    EXPECT_TRUE(contains(r.holders[0].who, ":thread:")) << r.holders[0].who;
    EXPECT_EQ(r.holders[0].count, 2);
    EXPECT_FALSE(r.holders[0].acquisition_id.empty());
    ASSERT_TRUE(r.key_ttl_ms);
    EXPECT_GT(*r.key_ttl_ms, 0);
    ASSERT_TRUE(r.holder_fence);
    EXPECT_EQ(*r.holder_fence, m.fencing_token());
    EXPECT_EQ(r.fence, r.holder_fence);
    EXPECT_TRUE(r.other_fields.empty());

    const std::string text = redislock::inspect::format(r);
    EXPECT_TRUE(contains(text, "kind:            recursive_mutex")) << text;
    EXPECT_TRUE(contains(text, "(process " + std::to_string(::getpid()) + ")  count 2")) << text;
    m.unlock();
    m.unlock();
}

TEST(Inspect, SharedMutexShowsEachReaderAndAWaitingWriter) {
    redis_server srv;
    redislock::client readers{srv.uri()};
    redislock::client writers{srv.uri()};
    auto r1 = readers.shared_mutex("catalog", {.lease = 5s});
    auto r2 = writers.shared_mutex("catalog", {.lease = 5s});
    // Two clients: two owners, each with its own lease.
    r1.lock_shared();
    r2.lock_shared();

    redislock::client waiting{srv.uri()};
    auto w = waiting.shared_mutex("catalog", {.lease = 5s, .fencing = true});
    bool acquired = false;
    std::thread writer{[&] {
        acquired = w.try_lock_for(20s);
        if (acquired) {
            w.unlock();
        }
    }};
    // The writer waits as a q: field of the hash, or as a writer's entry of the fair queue.
    const bool queued = eventually([&] {
        return contains(srv.cli({"HKEYS", "catalog"}), "q:") ||
               srv.cli({"EXISTS", redislock::detail::derived_key("catalog", "queue")}) == "1";
    });

    const auto r = redislock::inspect::inspect(readers.connection(), "catalog");
    r1.unlock_shared();
    r2.unlock_shared();
    writer.join();
    ASSERT_TRUE(queued);
    EXPECT_TRUE(acquired);

    EXPECT_EQ(r.kind, lock_kind::shared_mutex);
    EXPECT_EQ(r.mode, "read");
    ASSERT_EQ(r.holders.size(), 2U);
    for (const auto& h : r.holders) {
        EXPECT_EQ(h.mode, "read");
        EXPECT_EQ(h.count, 1);
        ASSERT_TRUE(h.remaining_ms);
        EXPECT_GT(*h.remaining_ms, 0);
        EXPECT_LE(*h.remaining_ms, 5000);
        EXPECT_FALSE(h.acquisition_id.empty());
    }
    EXPECT_NE(r.holders[0].who, r.holders[1].who);
    ASSERT_EQ(r.waiting_writers.size(), 1U);
    const auto& writer_entry = r.waiting_writers[0];
    if (writer_entry.queued) {
        EXPECT_FALSE(writer_entry.owner.starts_with("r")) << writer_entry.owner;
    } else {
        EXPECT_TRUE(writer_entry.owner.starts_with(waiting.instance_id())) << writer_entry.owner;
    }
    ASSERT_TRUE(writer_entry.remaining_ms);
    EXPECT_GT(*writer_entry.remaining_ms, 0);
    const std::string text = redislock::inspect::format(r);
    EXPECT_TRUE(contains(text,
                         "kind:            shared_mutex (a hash of per-holder leases), mode "
                         "read"))
        << text;
    EXPECT_TRUE(contains(text, "  read owner ")) << text;
    EXPECT_TRUE(contains(text, std::string{"waiting writers: 1\n  "} +
                                   (writer_entry.queued ? "waiter " : "owner ") +
                                   writer_entry.owner))
        << text;
}

TEST(Inspect, SharedMutexWriterShowsItsFence) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rw = client.shared_mutex("catalog", {.lease = 5s, .fencing = true});
    std::unique_lock guard{rw};
    const auto r = redislock::inspect::inspect(client.connection(), "catalog");
    EXPECT_EQ(r.mode, "write");
    ASSERT_EQ(r.holders.size(), 1U);
    EXPECT_EQ(r.holders[0].mode, "write");
    ASSERT_TRUE(r.holder_fence);
    EXPECT_EQ(*r.holder_fence, rw.fencing_token());
    EXPECT_EQ(r.fence, r.holder_fence);
    EXPECT_TRUE(r.waiting_writers.empty());
}

TEST(Inspect, OddNamesReadTheLibrarysDerivedKeys) {
    redis_server srv;
    redislock::client client{srv.uri()};
    for (const std::string name : {"a{x}b", "job}1", "a{}b", "line\nbreak"}) {
        auto m = client.mutex(name, {.lease = 5s, .fencing = true});
        std::unique_lock guard{m};
        const auto r = redislock::inspect::inspect(client.connection(), name);
        EXPECT_EQ(r.fence_key, redislock::detail::derived_key(name, "fence")) << name;
        EXPECT_EQ(r.queue_key, redislock::detail::derived_key(name, "queue")) << name;
        ASSERT_TRUE(r.fence) << name;
        EXPECT_EQ(*r.fence, m.fencing_token()) << name;
    }
    EXPECT_EQ(redislock::inspect::inspect(client.connection(), "job}1").fence_key.substr(0, 3),
              "{rl");
    EXPECT_TRUE(contains(
        redislock::inspect::format(redislock::inspect::inspect(client.connection(), "line\nbreak")),
        "lock:            line\\x0abreak"));
}

TEST(Inspect, QueueWaitersAreListedInTicketOrderWithTheirClaims) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("orders:42", {.lease = 5s});
    std::unique_lock guard{m};
    const std::string queue = redislock::detail::derived_key("orders:42", "queue");
    const std::string waiting = redislock::detail::derived_key("orders:42", "waiting");
    const std::string now_ms = srv.cli({"EVAL",
                                        "local t = redis.call('TIME') return t[1] * 1000 + "
                                        "math.floor(t[2] / 1000)",
                                        "0"});
    const long long now = std::stoll(now_ms);
    srv.cli({"ZADD", queue, "2", "second", "1", "first", "3", "third"});
    srv.cli({"ZADD", waiting, std::to_string(now + 30000), "first", std::to_string(now + 60000),
             "second", std::to_string(now - 10), "third"});

    const auto r = redislock::inspect::inspect(client.connection(), "orders:42");
    EXPECT_TRUE(r.queue_present);
    EXPECT_EQ(r.waiter_total, 3);
    ASSERT_EQ(r.waiters.size(), 3U);
    EXPECT_EQ(r.waiters[0].id, "first");
    EXPECT_EQ(r.waiters[1].id, "second");
    EXPECT_EQ(r.waiters[2].id, "third");
    EXPECT_EQ(r.waiters[0].ticket, 1);
    ASSERT_TRUE(r.waiters[0].remaining_ms);
    EXPECT_GT(*r.waiters[0].remaining_ms, 25000);
    EXPECT_LE(*r.waiters[0].remaining_ms, 30000);
    ASSERT_TRUE(r.waiters[2].remaining_ms);
    EXPECT_LE(*r.waiters[2].remaining_ms, 0);
    const std::string text = redislock::inspect::format(r);
    EXPECT_TRUE(contains(text, "waiters:         3\n  first  ticket 1  claim expires in ")) << text;
    EXPECT_TRUE(contains(text, "  third  ticket 3  claim expired")) << text;

    // Only the claims key: listed in expiry order, without tickets.
    srv.cli({"DEL", queue});
    const auto claims = redislock::inspect::inspect(client.connection(), "orders:42");
    ASSERT_EQ(claims.waiters.size(), 3U);
    EXPECT_EQ(claims.waiters[0].id, "third");
    EXPECT_FALSE(claims.waiters[0].ticket);
}

TEST(Inspect, WritersInTheQueueOfAReadWriteLockCountAsWaitingWriters) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto rw = client.shared_mutex("catalog", {.lease = 5s});
    std::shared_lock reader{rw};
    const std::string queue = redislock::detail::derived_key("catalog", "queue");
    srv.cli({"ZADD", queue, "1", "w-first", "2", "r-second"});
    const auto r = redislock::inspect::inspect(client.connection(), "catalog");
    ASSERT_EQ(r.waiting_writers.size(), 1U);
    EXPECT_EQ(r.waiting_writers[0].owner, "w-first");
    EXPECT_TRUE(r.waiting_writers[0].queued);
    EXPECT_EQ(r.waiters.size(), 2U);
    EXPECT_TRUE(contains(redislock::inspect::format(r), "  waiter w-first in the queue\n"));
}

TEST(Inspect, ASimpleLockKeptFreeForAQueuedWaiterHasNoHolder) {
    redis_server srv;
    redislock::client client{srv.uri()};
    srv.cli({"SET", "orders:42", "queued:w17", "PX", "5000"});
    const auto r = redislock::inspect::inspect(client.connection(), "orders:42");
    EXPECT_EQ(r.kind, lock_kind::mutex);
    EXPECT_TRUE(r.holders.empty());
    EXPECT_EQ(r.kept_for, "w17");
    const std::string text = redislock::inspect::format(r);
    EXPECT_TRUE(contains(text, "holders:         none: kept free for waiter w17, told it may go ("))
        << text;
    EXPECT_TRUE(redislock::inspect::something_to_free(r));
}

TEST(Inspect, KeysOfUnexpectedTypesAreClearErrors) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto& conn = client.connection();
    using redislock::inspect::unexpected_key_error;

    srv.cli({"RPUSH", "orders:42", "x"});
    EXPECT_THROW(redislock::inspect::inspect(conn, "orders:42"), unexpected_key_error);
    srv.cli({"DEL", "orders:42"});

    srv.cli({"SET", "{orders:42}:fence", "not a number"});
    EXPECT_THROW(redislock::inspect::inspect(conn, "orders:42"), unexpected_key_error);
    srv.cli({"DEL", "{orders:42}:fence"});
    srv.cli({"HSET", "{orders:42}:fence", "a", "1"});
    EXPECT_THROW(redislock::inspect::inspect(conn, "orders:42"), unexpected_key_error);
    srv.cli({"DEL", "{orders:42}:fence"});

    srv.cli({"SET", "{orders:42}:queue", "x"});
    EXPECT_THROW(redislock::inspect::inspect(conn, "orders:42"), unexpected_key_error);
    srv.cli({"DEL", "{orders:42}:queue"});
    EXPECT_NO_THROW(redislock::inspect::inspect(conn, "orders:42"));

    srv.cli({"SADD", "orders:42", "x"});
    const auto out = redislock::test::run_inspect({srv.uri(), "orders:42"});
    EXPECT_EQ(out.status, 1);
    EXPECT_TRUE(contains(out.err, "holds a set, which is not a redislock lock")) << out.err;
}

TEST(Inspect, ForceReleaseFreesEachKindAndKeepsTheFencingCounter) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto& conn = client.connection();
    const redislock::lock_options options{.lease = 20s, .fencing = true};

    auto m = client.mutex("m", options);
    auto rm = client.recursive_mutex("rm", options);
    auto rw = client.shared_mutex("rw", options);
    m.lock();
    rm.lock();
    rw.lock();
    srv.cli({"ZADD", redislock::detail::derived_key("m", "queue"), "1", "someone"});
    const std::int64_t fences[] = {m.fencing_token(), rm.fencing_token(), rw.fencing_token()};

    int index = 0;
    for (const std::string name : {"m", "rm", "rw"}) {
        const auto seen = redislock::inspect::inspect(conn, name);
        ASSERT_TRUE(redislock::inspect::something_to_free(seen)) << name;
        const auto result = redislock::inspect::force_release(conn, seen);
        EXPECT_FALSE(result.changed) << name;
        EXPECT_TRUE(result.lock_deleted) << name;
        EXPECT_EQ(srv.cli({"EXISTS", name}), "0") << name;
        EXPECT_EQ(srv.cli({"GET", seen.fence_key}), std::to_string(fences[index])) << name;
        ++index;
    }
    EXPECT_EQ(srv.cli({"EXISTS", redislock::detail::derived_key("m", "queue")}), "0");

    EXPECT_FALSE(m.verify());
    EXPECT_FALSE(rm.verify());
    EXPECT_FALSE(rw.verify());
    m.unlock();
    rm.unlock();
    rw.unlock();

    // The next holder's token is larger: storage that checks tokens refuses the old holder.
    auto next = client.mutex("m", options);
    std::unique_lock guard{next};
    EXPECT_GT(next.fencing_token(), fences[0]);
}

// Force-releasing a stuck lock tells its waiters, each on its own client's channel: another
// client's waiter takes the lock at once, not when the stuck holder's lease ends.
TEST(Inspect, ForceReleaseWakesTheWaitersOfEachKind) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri()};
    const redislock::lock_options stuck{.lease = 30s, .backoff_min = 5s, .backoff_max = 20s};
    const auto check = [&](const std::string& name, auto& holder, auto& waiter) {
        SCOPED_TRACE(name);
        holder.lock();
        std::atomic<bool> got{false};
        std::atomic<bool> held{false};
        std::jthread t{[&] {
            if (waiter.try_lock_for(25s)) {
                got = true;
                held = waiter.verify();  // not a hand-over it only believes in
                waiter.unlock();
            }
        }};
        ASSERT_TRUE(eventually([&] {
            return srv.cli({"ZCARD", redislock::detail::derived_key(name, "queue")}) == "1";
        }));
        const auto seen = redislock::inspect::inspect(client.connection(), name);
        const redislock::test::stopwatch watch;
        ASSERT_TRUE(redislock::inspect::force_release(client.connection(), seen).lock_deleted);
        EXPECT_TRUE(eventually([&] { return got.load(); }, 3s)) << "not woken";
        EXPECT_LT(watch.elapsed(), 3s);
        t.join();
        EXPECT_TRUE(held.load()) << "believed it held a lock it did not";
        EXPECT_FALSE(holder.verify());
        holder.unlock();
    };
    auto m = client.mutex("m", stuck);
    auto m_waiter = other.mutex("m", stuck);
    check("m", m, m_waiter);
    auto rm = client.recursive_mutex("rm", stuck);
    auto rm_waiter = other.recursive_mutex("rm", stuck);
    check("rm", rm, rm_waiter);
    auto rw = client.shared_mutex("rw", stuck);
    auto rw_waiter = other.shared_mutex("rw", stuck);
    check("rw", rw, rw_waiter);
}

TEST(Inspect, ForceReleaseFreesNothingWhenTheLockChangedSinceItWasShown) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto& conn = client.connection();
    auto first = client.mutex("orders:42", {.lease = 20s});
    first.lock();
    const auto seen = redislock::inspect::inspect(conn, "orders:42");
    first.unlock();

    redislock::client other{srv.uri()};
    auto second = other.mutex("orders:42", {.lease = 20s});
    second.lock();
    const auto result = redislock::inspect::force_release(conn, seen);
    EXPECT_TRUE(result.changed);
    EXPECT_FALSE(result.lock_deleted);
    EXPECT_TRUE(second.verify());
    second.unlock();
}

TEST(Inspect, ProgramAsksBeforeFreeingAndTellsWhatItDid) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("orders:42", {.lease = 20s, .fencing = true});
    m.lock();
    const std::string uri = srv.uri();

    auto shown = redislock::test::run_inspect({uri, "orders:42"});
    EXPECT_EQ(shown.status, 0) << shown.err;
    EXPECT_TRUE(contains(shown.out, "server:          127.0.0.1:" + std::to_string(srv.port()) +
                                        ", db 0\nlock:            orders:42\n"))
        << shown.out;

    auto declined = redislock::test::run_inspect({uri, "orders:42", "--force-release"}, "n\n");
    EXPECT_EQ(declined.status, 3);
    EXPECT_TRUE(contains(declined.out, "[y/N] not confirmed: nothing was freed")) << declined.out;
    EXPECT_EQ(srv.cli({"EXISTS", "orders:42"}), "1");

    auto no_answer = redislock::test::run_inspect({uri, "orders:42", "--force-release"});
    EXPECT_EQ(no_answer.status, 3);
    EXPECT_EQ(srv.cli({"EXISTS", "orders:42"}), "1");

    auto freed = redislock::test::run_inspect({uri, "--force-release", "orders:42"}, "y\n");
    EXPECT_EQ(freed.status, 0) << freed.err;
    EXPECT_TRUE(contains(freed.out,
                         "freed 'orders:42': lock key deleted, 0 queue key(s) deleted; "
                         "fencing counter kept at " +
                             std::to_string(m.fencing_token())))
        << freed.out;
    EXPECT_EQ(srv.cli({"EXISTS", "orders:42"}), "0");
    EXPECT_EQ(srv.cli({"EXISTS", "{orders:42}:fence"}), "1");

    auto nothing = redislock::test::run_inspect({uri, "orders:42", "--force-release", "--yes"});
    EXPECT_EQ(nothing.status, 0);
    EXPECT_TRUE(contains(nothing.out, "nothing to free")) << nothing.out;
    m.unlock();
}

TEST(Inspect, ProgramRejectsBadUsageBadUrisAndUnreachableServers) {
    auto none = redislock::test::run_inspect({});
    EXPECT_EQ(none.status, 2);
    EXPECT_TRUE(contains(none.err, "expected URI and NAME")) << none.err;
    EXPECT_TRUE(contains(none.err, "usage: redislock-inspect")) << none.err;

    EXPECT_EQ(redislock::test::run_inspect({"redis://127.0.0.1:1", "x", "--frobnicate"}).status, 2);
    EXPECT_EQ(redislock::test::run_inspect({"redis://127.0.0.1:1", "x", "--yes"}).status, 2);
    EXPECT_EQ(redislock::test::run_inspect({"redis://127.0.0.1:1", ""}).status, 2);
    EXPECT_EQ(redislock::test::run_inspect({"--help"}).status, 0);

    auto bad_uri = redislock::test::run_inspect({"http://127.0.0.1:6379", "x"});
    EXPECT_EQ(bad_uri.status, 2);
    EXPECT_TRUE(contains(bad_uri.err, "bad Redis URI 'http://127.0.0.1:6379'")) << bad_uri.err;
    EXPECT_EQ(redislock::test::run_inspect({"redis://127.0.0.1:99999", "x"}).status, 2);

    // A loopback port nobody listens on.
    const int port = redislock::test::detail::pick_free_port();
    const std::string unreachable = "redis://127.0.0.1:" + std::to_string(port);
    auto down = redislock::test::run_inspect({unreachable, "x"});
    EXPECT_EQ(down.status, 1);
    EXPECT_TRUE(contains(down.err, "cannot reach Redis at 127.0.0.1:" + std::to_string(port)))
        << down.err;
}

std::size_t occurrences(const std::string& text, std::string_view part) {
    std::size_t n = 0;
    for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) {
        ++n;
    }
    return n;
}

using steady = std::chrono::steady_clock;

TEST(Inspect, WatchShowsTheLockAgainEachSecondUntilItsCount) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.shared_mutex("reports", {.lease = 20s});
    m.lock_shared();
    const std::string uri = srv.uri();
    // Between the first two views the lock changes hands; the later views show it.
    std::vector<steady::time_point> waited_for;
    const auto wait_until = [&](steady::time_point t) {
        waited_for.push_back(t);
        if (waited_for.size() == 1) {
            m.unlock_shared();
            m.lock();
        }
        std::this_thread::sleep_until(t);
    };
    const std::vector<std::string_view> args{uri, "reports", "--watch", "--count", "3"};
    std::istringstream in;
    std::ostringstream out;
    std::ostringstream err;
    const auto started = steady::now();
    const int status = redislock::inspect::run(args, in, out, err, wait_until);
    const std::string text = out.str();
    EXPECT_EQ(status, 0) << err.str();
    const auto second = text.find("--- view 2 of 3, ");
    const auto third = text.find("--- view 3 of 3, ");
    ASSERT_TRUE(text.starts_with("--- view 1 of 3, ") && second != std::string::npos &&
                third != std::string::npos)
        << text;
    EXPECT_FALSE(contains(text, "view 4")) << text;
    EXPECT_EQ(occurrences(text, "lock:            reports\n"), 3u) << text;
    EXPECT_TRUE(contains(text.substr(0, second), "mode read")) << text;
    EXPECT_TRUE(contains(text.substr(second, third - second), "mode write")) << text;
    EXPECT_TRUE(contains(text.substr(third), "mode write")) << text;
    ASSERT_EQ(waited_for.size(), 2u);
    EXPECT_GE(waited_for[0] - started, 1s) << "views are a second apart";
    EXPECT_GE(waited_for[1] - waited_for[0], 1s) << "views are a second apart";
    m.unlock();
}

// A view that began late (the one before took long: a hung server, a migration) sets the pace
// from when it began: the views after it are a second apart again, not a burst catching up.
TEST(Inspect, WatchResumesItsPaceAfterALateViewInsteadOfCatchingUp) {
    redis_server srv;
    const std::string uri = srv.uri();
    std::vector<steady::time_point> waited_for;
    std::vector<steady::time_point> resumed_at;
    const auto wait_until = [&](steady::time_point t) {
        waited_for.push_back(t);
        std::this_thread::sleep_until(t + (waited_for.size() == 1 ? 2500ms : 0ms));
        resumed_at.push_back(steady::now());
    };
    const std::vector<std::string_view> args{uri, "free-name", "--watch", "--count=3"};
    std::istringstream in;
    std::ostringstream out;
    std::ostringstream err;
    EXPECT_EQ(redislock::inspect::run(args, in, out, err, wait_until), 0) << err.str();
    ASSERT_EQ(waited_for.size(), 2u);
    EXPECT_GE(waited_for[1] - resumed_at[0], 1s);
}

// The release is sent once: were it sent again after a lost reply, the second run would find
// the key the first one deleted gone and report "changed, nothing freed" for a freed lock.
TEST(Inspect, ForceReleaseWhoseReplyIsLostSaysTheOutcomeIsUnknown) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("orders:42", {.lease = 20s});
    m.lock();
    redislock::hiredis_connection direct{srv.uri()};
    struct reply_losing_connection {
        redislock::hiredis_connection& inner;
        std::vector<bool> repeatable{};
        redislock::reply execute(redislock::command argv) { return execute(argv, {}); }
        redislock::reply execute(redislock::command argv, const redislock::call_context& how) {
            redislock::reply r = inner.execute(argv);
            if (argv.size() > 2 && argv[2] == "3") {  // the release script: its reply is lost
                repeatable.push_back(how.repeatable);
                throw redislock::connection_error{"connection reset after sending"};
            }
            return r;
        }
    } conn{direct};
    const auto seen = redislock::inspect::inspect(conn, "orders:42");
    try {
        (void)redislock::inspect::force_release(conn, seen);
        ADD_FAILURE() << "a lost reply was taken for an outcome";
    } catch (const redislock::inspect::outcome_unknown_error& e) {
        EXPECT_TRUE(contains(e.what(), "may or may not have freed")) << e.what();
    }
    EXPECT_EQ(conn.repeatable, std::vector<bool>{false});
    EXPECT_EQ(srv.cli({"EXISTS", "orders:42"}), "0");
    EXPECT_FALSE(m.verify());
    m.unlock();
}

TEST(Inspect, WatchGoesOnThroughViewsThatFailAndEndsWithTheLastOnesStatus) {
    const int port = redislock::test::detail::pick_free_port();
    const std::string unreachable = "redis://127.0.0.1:" + std::to_string(port);
    const auto down = redislock::test::run_inspect({unreachable, "x", "--watch", "--count=2"});
    EXPECT_EQ(down.status, 1);
    EXPECT_EQ(occurrences(down.out, "--- view "), 2u) << down.out;
    EXPECT_EQ(occurrences(down.err, "cannot reach Redis at 127.0.0.1:" + std::to_string(port)), 2u)
        << down.err;
}

TEST(Inspect, WatchOptionsAreCheckedBeforeAnythingIsSent) {
    for (const std::vector<std::string_view>& args :
         {std::vector<std::string_view>{"redis://127.0.0.1:1", "x", "--count", "3"},
          std::vector<std::string_view>{"redis://127.0.0.1:1", "x", "--watch", "--count", "0"},
          std::vector<std::string_view>{"redis://127.0.0.1:1", "x", "--watch", "--count", "two"},
          std::vector<std::string_view>{"redis://127.0.0.1:1", "x", "--watch", "--count"},
          std::vector<std::string_view>{"redis://127.0.0.1:1", "x", "--watch",
                                        "--force-release"}}) {
        const auto refused = redislock::test::run_inspect(args);
        EXPECT_EQ(refused.status, 2) << refused.out;
        EXPECT_TRUE(contains(refused.err, "usage: redislock-inspect")) << refused.err;
    }
}

TEST(Inspect, EveryUriTheClientTakesIsAccepted) {
    // Checked, not connected: the first view would connect.
    for (const std::string_view uri :
         {"redis-sentinel://127.0.0.1:1,127.0.0.1:2#mymaster", "redis-cluster://127.0.0.1:1",
          "unix:///nonexistent/redis.sock"}) {
        const auto r = redislock::test::run_inspect({uri, "x"});
        EXPECT_EQ(r.status, 1) << uri << ": " << r.err;
    }
    EXPECT_EQ(redislock::test::run_inspect({"redis-cluster://", "x"}).status, 2);
}

TEST(Inspect, NamesStartingWithADashFollowTheOptionsEnd) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.mutex("-odd", {.lease = 5s});
    std::unique_lock guard{m};
    auto shown = redislock::test::run_inspect({"--", srv.uri(), "-odd"});
    EXPECT_EQ(shown.status, 0) << shown.err;
    EXPECT_TRUE(contains(shown.out, "kind:            mutex")) << shown.out;
}

#ifdef REDISLOCK_INSPECT_PROGRAM
// The built program, run as a user would.
TEST(InspectProgram, ShowsAndFreesALockTakenByTheLibrary) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto m = client.recursive_mutex("orders:42", {.lease = 20s});
    m.lock();
    const auto shown = redislock::test::detail::run_capture(
        {REDISLOCK_INSPECT_PROGRAM, srv.uri(), "orders:42"}, 30s);
    ASSERT_TRUE(WIFEXITED(shown.status));
    EXPECT_EQ(WEXITSTATUS(shown.status), 0) << shown.err;
    EXPECT_TRUE(contains(shown.out, "kind:            recursive_mutex")) << shown.out;
    EXPECT_TRUE(contains(shown.out, "count 1")) << shown.out;

    const auto freed = redislock::test::detail::run_capture(
        {REDISLOCK_INSPECT_PROGRAM, srv.uri(), "orders:42", "--force-release", "--yes"}, 30s);
    ASSERT_TRUE(WIFEXITED(freed.status));
    EXPECT_EQ(WEXITSTATUS(freed.status), 0) << freed.err;
    EXPECT_TRUE(contains(freed.out, "freed 'orders:42'")) << freed.out;
    EXPECT_EQ(srv.cli({"EXISTS", "orders:42"}), "0");
    EXPECT_FALSE(m.verify());
    m.unlock();
}

// On a cluster, the node that serves the name's slot shows the lock like a single server.
TEST(InspectProgram, ShowsALockOnTheClusterNodeOfItsSlot) {
    redislock::test::redis_cluster cluster{3, 0};
    redislock::cluster_client client{cluster.uri()};
    auto m = client.recursive_mutex("orders:42", {.lease = 20s});
    m.lock();
    const int node = cluster.master_for_key("orders:42");
    const auto shown = redislock::test::detail::run_capture(
        {REDISLOCK_INSPECT_PROGRAM, cluster.uri_of(node), "orders:42"}, 30s);
    ASSERT_TRUE(WIFEXITED(shown.status));
    EXPECT_EQ(WEXITSTATUS(shown.status), 0) << shown.err;
    EXPECT_TRUE(contains(shown.out, "kind:            recursive_mutex")) << shown.out;
    EXPECT_TRUE(contains(shown.out, "count 1")) << shown.out;
    m.unlock();
}
#endif

#ifdef REDISLOCK_METRICS_EXAMPLE
// The examples the documentation points to run to their end against a real server.
TEST(Examples, MetricsCountsEventsAndPrintsThem) {
    redis_server srv;
    const auto run =
        redislock::test::detail::run_capture({REDISLOCK_METRICS_EXAMPLE, srv.uri()}, 60s);
    ASSERT_TRUE(WIFEXITED(run.status)) << run.err;
    EXPECT_EQ(WEXITSTATUS(run.status), 0) << run.err << run.out;
    EXPECT_TRUE(contains(run.out, "wait histogram")) << run.out;
    EXPECT_TRUE(contains(run.out, "losses by reason")) << run.out;
}

TEST(Examples, LeaderElectionElectsStepsDownAndElectsAgain) {
    redis_server srv;
    const auto run = redislock::test::detail::run_capture(
        {REDISLOCK_LEADER_ELECTION_EXAMPLE, srv.uri(), "4"}, 60s);
    ASSERT_TRUE(WIFEXITED(run.status)) << run.err;
    EXPECT_EQ(WEXITSTATUS(run.status), 0) << run.err << run.out;
    EXPECT_TRUE(contains(run.out, "elections")) << run.out;
}
#endif

}  // namespace
