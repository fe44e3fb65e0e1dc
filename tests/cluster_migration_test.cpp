// Every lock kind while its slot is being migrated, half a step at a time, the way
// `redis-cli --cluster reshard` does it (MIGRATE without REPLACE): the keys of a name are still on
// the source, or some of them moved, or all of them. A command whose declared keys are partly
// missing on a migrating slot is answered TRYAGAIN (and one whose keys are all missing is sent
// to the target with ASK, where it is answered TRYAGAIN unless they are all there): calls ride
// that out within their deadline, and no script writes and then fails.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/redis_cluster.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::reply;
using redislock::detail::derived_key;

class ClusterMigration : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        cluster_ = new redislock::test::redis_cluster{3, 0};
        std::printf("[ cluster  ] 3 masters ready in %lld ms\n",
                    static_cast<long long>(cluster_->bring_up_time().count()));
    }
    static void TearDownTestSuite() {
        delete cluster_;
        cluster_ = nullptr;
    }

    // Where the slot of `name` is, and a master to move it to.
    struct move {
        int slot = 0;
        int from = 0;
        int to = 0;
    };
    static move plan(const std::string& name) {
        move m;
        m.slot = cluster_->key_slot(name);
        m.from = cluster_->master_for_slot(m.slot);
        const auto masters = cluster_->masters();
        m.to = masters.front() == m.from ? masters.back() : masters.front();
        return m;
    }

    // Whether `key` exists on the node on `port`, asked with ASKING (so an importing target
    // answers for its slot too).
    static bool exists_on(int port, const std::string& key) {
        redislock::hiredis_connection node{cluster_->uri_of(port)};
        const std::array<std::string_view, 1> asking{"ASKING"};
        const std::array<std::string_view, 2> exists{"EXISTS", key};
        const std::array<redislock::command, 2> both{redislock::command{asking},
                                                     redislock::command{exists}};
        return node.execute_pipeline(both)[1] == reply::integer(1);
    }

    // How many of `keys` exist, through the cluster (after the migration).
    static long long count_existing(const std::vector<std::string>& keys) {
        redislock::hiredis_cluster_connection conn{cluster_->uri()};
        long long n = 0;
        for (const auto& key : keys) {
            const std::array<std::string_view, 2> exists{"EXISTS", key};
            n += conn.execute(exists).as_integer();
        }
        return n;
    }

    static inline redislock::test::redis_cluster* cluster_ = nullptr;
};

// Failures seen on other threads, reported by the test's thread; and when each call guarded
// ended, counted from the object's creation.
class problems {
public:
    template <class F>
    void guard(const std::string& what, F&& f) {
        try {
            f();
        } catch (const std::exception& e) {
            add(what + ": " + e.what());
        }
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - start_)
                            .count();
        std::lock_guard lock{mutex_};
        timeline_ += " " + what + " " + std::to_string(ms) + " ms;";
    }
    std::string timeline() const {
        std::lock_guard lock{mutex_};
        return timeline_;
    }
    void add(const std::string& problem) {
        std::lock_guard lock{mutex_};
        list_.push_back(problem);
    }
    std::string text() const {
        std::lock_guard lock{mutex_};
        std::string out;
        for (const auto& p : list_) {
            out += "\n  " + p;
        }
        return out;
    }
    bool empty() const {
        std::lock_guard lock{mutex_};
        return list_.empty();
    }

private:
    const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
    mutable std::mutex mutex_;
    std::vector<std::string> list_;
    std::string timeline_;
};

// Runs `test(kind, make, reentrant)` for the three lock kinds; make(client, name, options)
// gives a lock of that kind, `reentrant` says its holder may lock() again.
template <class Test>
void for_each_kind(Test&& test) {
    test(
        std::string{"simple"},
        [](redislock::cluster_client& c, const std::string& n, const redislock::lock_options& o) {
            return c.mutex(n, o);
        },
        false);
    test(
        std::string{"reentrant"},
        [](redislock::cluster_client& c, const std::string& n, const redislock::lock_options& o) {
            return c.recursive_mutex(n, o);
        },
        true);
    test(
        std::string{"read-write"},
        [](redislock::cluster_client& c, const std::string& n, const redislock::lock_options& o) {
            return c.shared_mutex(n, o);
        },
        true);
}

// Unfenced locks of every kind go on working while their slot migrates: the holder re-enters and
// releases, a rival's try_lock() says false, a waiter gets the lock once it is released, a fresh
// name of the slot is locked, and a try_lock() of another answers — none throws. The slot stays
// half-migrated for 1.5 s (keys on the source), then 1.5 s more (keys on the target).
TEST_F(ClusterMigration, UnfencedLocksOfEveryKindWorkWhileTheirSlotMigrates) {
    for_each_kind([&](const std::string& kind, auto make, bool reentrant) {
        SCOPED_TRACE(kind);
        const std::string name = "unfenced:" + kind;
        const std::string fresh = "{" + name + "}:fresh";
        const std::string other = "{" + name + "}:other";
        const move m = plan(name);
        // The command timeout bounds a release: longer than the migration here.
        redislock::cluster_client cc{cluster_->uri("command_timeout=5000")};
        redislock::cluster_client rivals{cluster_->uri("command_timeout=5000")};
        const redislock::lock_options options{.lease = 30s};
        auto holder = make(cc, name, options);
        holder.lock();

        cluster_->begin_migration(m.slot, m.from, m.to);
        problems seen;
        std::jthread mover{[&] {
            seen.guard("migration", [&] {
                std::this_thread::sleep_for(1500ms);
                cluster_->move_keys(m.slot, m.from, m.to);
                std::this_thread::sleep_for(1500ms);
                cluster_->finish_migration(m.slot, m.from, m.to);
            });
        }};
        std::atomic<bool> rival_done{false};
        std::atomic<int> rival_got{-1};
        std::jthread rival{[&] {
            seen.guard("rival try_lock()", [&] {
                auto r = make(rivals, name, options);
                rival_got = r.try_lock() ? 1 : 0;
                if (rival_got == 1) {
                    r.unlock();
                }
            });
            rival_done = true;
        }};
        std::atomic<bool> waiter_got{false};
        std::jthread waiter{[&] {
            seen.guard("waiter try_lock_for()", [&] {
                auto w = make(rivals, name, options);
                waiter_got = w.try_lock_for(30s);
                if (waiter_got) {
                    w.unlock();
                }
            });
        }};
        std::jthread fresh_name{[&] {
            auto f = make(cc, fresh, options);
            seen.guard("lock() of a fresh name", [&] { f.lock(); });
            seen.guard("its unlock()", [&] { f.unlock(); });
        }};
        std::jthread other_name{[&] {
            seen.guard("try_lock() of a fresh name", [&] {
                auto o = make(rivals, other, options);
                if (o.try_lock()) {
                    o.unlock();
                }
            });
        }};
        if (reentrant) {
            seen.guard("re-entry", [&] {
                holder.lock();
                holder.unlock();
            });
            EXPECT_TRUE(holder.owned()) << "the outer entry stays";
        }
        EXPECT_TRUE(redislock::test::eventually([&] { return rival_done.load(); }, 30s));
        std::error_code ec;
        seen.guard("release", [&] { holder.unlock(ec); });
        EXPECT_FALSE(ec) << ec.message();
        for (std::jthread* t : {&mover, &rival, &waiter, &fresh_name, &other_name}) {
            t->join();
        }
        EXPECT_TRUE(seen.empty()) << seen.text();
        std::printf("[ %-10s] after the migration began:%s\n", kind.c_str(),
                    seen.timeline().c_str());
        EXPECT_EQ(rival_got.load(), 0) << "the lock was held";
        EXPECT_TRUE(waiter_got.load());
        EXPECT_EQ(count_existing({name, fresh, other, derived_key(name, "queue"),
                                  derived_key(name, "waiting")}),
                  0)
            << "nothing left behind";
    });
}

// A slot left half-migrated longer than the command timeout: try_lock() of a held name and of a
// fresh one answer false after one command timeout, without throwing; the holder's release,
// retried that long, fails without having freed anything, and once the migration ends the
// client's reaper finishes it.
TEST_F(ClusterMigration, TryLockDuringAStuckMigrationIsFalseAndAFailedReleaseWritesNothing) {
    for_each_kind([&](const std::string& kind, auto make, bool) {
        SCOPED_TRACE(kind);
        const std::string name = "stuck:" + kind;
        const std::string fresh = "{" + name + "}:fresh";
        const move m = plan(name);
        redislock::cluster_client cc{cluster_->uri("command_timeout=500")};
        const redislock::lock_options options{.lease = 20s};
        auto holder = make(cc, name, options);
        holder.lock();
        cluster_->begin_migration(m.slot, m.from, m.to);

        std::jthread rival{[&] {
            auto r = make(cc, name, options);
            redislock::test::stopwatch watch;
            bool got = true;
            EXPECT_NO_THROW(got = r.try_lock());
            EXPECT_FALSE(got);
            // One command timeout; three are the bound of a failover, not of a migration.
            EXPECT_LT(watch.elapsed(), 1500ms);
        }};
        rival.join();
        {
            // A simple lock's plain SET NX is served on the target (one key, through ASK); the
            // scripts of the other kinds, whose keys are all missing, are answered TRYAGAIN.
            auto f = make(cc, fresh, options);
            redislock::test::stopwatch watch;
            bool got = false;
            EXPECT_NO_THROW(got = f.try_lock());
            const auto took = watch.elapsed();
            EXPECT_LT(took, 1500ms);
            std::printf(
                "[ %-10s] try_lock() of a fresh name during a stuck migration: %s in %lld ms\n",
                kind.c_str(), got ? "true" : "false", static_cast<long long>(took.count()));
            if (got) {
                f.unlock();
            }
        }

        std::error_code ec;
        holder.unlock(ec);
        EXPECT_TRUE(ec) << "released though the slot kept answering TRYAGAIN";
        EXPECT_TRUE(exists_on(m.from, name)) << "a release that failed freed the lock";

        cluster_->move_keys(m.slot, m.from, m.to);
        cluster_->finish_migration(m.slot, m.from, m.to);
        EXPECT_TRUE(redislock::test::eventually([&] { return count_existing({name}) == 0; }, 15s))
            << "the reaper finishes the release once the slot settles";
    });
}

// The holder releases on the migrating source while the queue keys have already moved to the
// target: the release waits for the slot (TRYAGAIN) instead of deleting the lock and failing on
// the queue, succeeds once the rest moved, and the waiter gets the lock soon after, long before
// the 20 s lease it was shown.
TEST_F(ClusterMigration, ReleaseOnAMigratingSourceWithTheQueueMovedTellsTheWaiter) {
    for_each_kind([&](const std::string& kind, auto make, bool) {
        SCOPED_TRACE(kind);
        const std::string name = "told:" + kind;
        const std::string queue = derived_key(name, "queue");
        const std::string waiting = derived_key(name, "waiting");
        const move m = plan(name);
        redislock::cluster_client cc{cluster_->uri("command_timeout=5000")};
        redislock::cluster_client other{cluster_->uri("command_timeout=5000")};
        const redislock::lock_options options{.lease = 20s};
        auto holder = make(cc, name, options);
        holder.lock();

        problems seen;
        std::atomic<bool> waiter_got{false};
        std::atomic<long long> got_at_ms{0};
        const auto t0 = std::chrono::steady_clock::now();
        std::jthread waiter{[&] {
            seen.guard("waiter", [&] {
                auto w = make(other, name, options);
                waiter_got = w.try_lock_for(40s);
                got_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - t0)
                                .count();
                if (waiter_got) {
                    w.unlock();
                }
            });
        }};
        ASSERT_TRUE(redislock::test::eventually([&] { return exists_on(m.from, queue); }, 10s));

        cluster_->begin_migration(m.slot, m.from, m.to);
        cluster_->move_named_keys(m.from, m.to, {queue, waiting});
        std::jthread mover{[&] {
            seen.guard("migration", [&] {
                std::this_thread::sleep_for(500ms);
                cluster_->move_keys(m.slot, m.from, m.to);
                cluster_->finish_migration(m.slot, m.from, m.to);
            });
        }};
        std::error_code ec;
        holder.unlock(ec);
        const auto released_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now() - t0)
                                     .count();
        EXPECT_FALSE(ec) << ec.message();
        mover.join();
        waiter.join();
        EXPECT_TRUE(seen.empty()) << seen.text();
        EXPECT_TRUE(waiter_got.load());
        // Told (or woken as the slot's channels move), the waiter comes at once.
        EXPECT_LT(got_at_ms.load() - released_ms, 5000)
            << "released at " << released_ms << " ms, acquired at " << got_at_ms.load() << " ms";
        EXPECT_EQ(count_existing({name, queue, waiting}), 0) << "nothing left behind";
    });
}

// The slot starts migrating while every key of the name is still on the source, a waiter already
// queued there. Each command of a script on a migrating source is checked against the keys the
// node has at that moment: a key the script deleted, or a queue it emptied, is then "not local"
// (ASK) to the rest of the script. The release must not delete the lock and then fail on it:
// it succeeds, and the waiter gets the lock soon after, long before the 20 s lease it was shown.
TEST_F(ClusterMigration, ReleaseOnAMigratingSourceWithAWaiterQueuedThereHandsTheLockOn) {
    for_each_kind([&](const std::string& kind, auto make, bool) {
        SCOPED_TRACE(kind);
        const std::string name = "handed:" + kind;
        const std::string queue = derived_key(name, "queue");
        const std::string waiting = derived_key(name, "waiting");
        const move m = plan(name);
        redislock::cluster_client cc{cluster_->uri("command_timeout=5000")};
        redislock::cluster_client other{cluster_->uri("command_timeout=5000")};
        const redislock::lock_options options{.lease = 20s};
        auto holder = make(cc, name, options);
        holder.lock();

        problems seen;
        std::atomic<bool> waiter_got{false};
        std::atomic<long long> got_at_ms{0};
        const auto t0 = std::chrono::steady_clock::now();
        std::jthread waiter{[&] {
            seen.guard("waiter", [&] {
                auto w = make(other, name, options);
                waiter_got = w.try_lock_for(40s);
                got_at_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - t0)
                                .count();
                if (waiter_got) {
                    w.unlock();
                }
            });
        }};
        ASSERT_TRUE(redislock::test::eventually([&] { return exists_on(m.from, queue); }, 10s));

        cluster_->begin_migration(m.slot, m.from, m.to);
        std::error_code ec;
        holder.unlock(ec);
        const auto released_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                     std::chrono::steady_clock::now() - t0)
                                     .count();
        EXPECT_FALSE(ec) << ec.message();
        std::jthread mover{[&] {
            seen.guard("migration", [&] {
                std::this_thread::sleep_for(1000ms);
                cluster_->move_keys(m.slot, m.from, m.to);
                cluster_->finish_migration(m.slot, m.from, m.to);
            });
        }};
        mover.join();
        waiter.join();
        EXPECT_TRUE(seen.empty()) << seen.text();
        EXPECT_TRUE(waiter_got.load());
        EXPECT_LT(got_at_ms.load() - released_ms, 5000)
            << "released at " << released_ms << " ms, acquired at " << got_at_ms.load() << " ms";
        EXPECT_EQ(count_existing({name, queue, waiting}), 0) << "nothing left behind";
    });
}

// Each script run on a migrating source that still has every key it declares, in the states
// where it removes a key (DEL, or the last entry of a queue) and would then touch that key again,
// which Redis refuses a script on a slot being migrated ("non local key") after the removal: every
// one answers as on a stable slot, and leaves the keys as it would there. The grace is long, so
// that what a script keeps for a waiter is still there to be read.
TEST_F(ClusterMigration, ScriptsOnAMigratingSourceNeverTouchAKeyTheyRemoved) {
    namespace scripts = redislock::detail::scripts;
    using keys3 = std::array<std::string_view, 3>;
    const move m = plan("{mig}");
    const int src = m.from;
    const auto node = [&](const std::vector<std::string>& args) {
        return cluster_->command(src, args);
    };
    const std::string time = node({"TIME"});
    const long long now = std::stoll(time.substr(0, time.find('\n'))) * 1000;
    const std::string live = std::to_string(now + 600'000);
    const std::string held = "1 " + live + " a1";
    const std::string grace = "60000";
    struct names {
        std::string lock, queue, waiting, channel;
    };
    const auto named = [](const std::string& n) {
        return names{n, derived_key(n, "queue"), derived_key(n, "waiting"),
                     derived_key(n, "released")};
    };
    // Queues `ids` (waiter id -> lapse time in server ms) in that order.
    const auto queue_up = [&](const names& k,
                              const std::vector<std::pair<std::string, std::string>>& ids) {
        for (std::size_t i = 0; i < ids.size(); ++i) {
            node({"ZADD", k.queue, std::to_string(i + 1), ids[i].first});
            node({"ZADD", k.waiting, ids[i].second, ids[i].first});
        }
        node({"PEXPIRE", k.queue, "600000"});
        node({"PEXPIRE", k.waiting, "600000"});
    };
    const auto simple_lock = [&](const names& k, const std::string& holder) {
        node({"SET", k.lock, holder, "PX", "600000"});
    };
    const auto hash_lock = [&](const names& k, std::vector<std::string> fields) {
        fields.insert(fields.begin(), {"HSET", k.lock});
        node(fields);
        node({"PEXPIRE", k.lock, "600000"});
    };

    // A simple lock released with a waiter queued: kept for it.
    const names release = named("{mig}:release");
    simple_lock(release, "tok");
    queue_up(release, {{"wA", live}});
    // The same, with a 'g' waiter: kept for it under its token.
    const names release_g = named("{mig}:release-g");
    simple_lock(release_g, "tok");
    queue_up(release_g, {{"g0d.600000", live}});
    // A simple lock released with only a lapsed waiter queued: freed, the queue pruned.
    const names release_lapsed = named("{mig}:release-lapsed");
    simple_lock(release_lapsed, "tok");
    queue_up(release_lapsed, {{"wDead", "1"}});
    // A simple lock kept for waiter wA, who gives up with wB behind it: kept for wB.
    const names handoff = named("{mig}:handoff");
    simple_lock(handoff, "queued:wA");
    queue_up(handoff, {{"wA", live}, {"wB", live}});
    // The same, wA alone: the lock is freed.
    const names alone = named("{mig}:alone");
    simple_lock(alone, "queued:wA");
    queue_up(alone, {{"wA", live}});
    // wA comes for the lock kept for it after its entry lapsed, the queue's only one: acquired.
    const names late = named("{mig}:late");
    simple_lock(late, "queued:wA");
    queue_up(late, {{"wA", "1"}});
    // A reentrant lock released with an 'h' waiter queued: an entry of its owner kept for it.
    const names entry = named("{mig}:entry");
    hash_lock(entry, {"own", "1", "id:own", "a1"});
    queue_up(entry, {{"h0b.600000.other", live}});
    // A reentrant lock released with only a lapsed waiter queued: freed, the queue pruned.
    const names entry_lapsed = named("{mig}:entry-lapsed");
    hash_lock(entry_lapsed, {"own", "1", "id:own", "a1"});
    queue_up(entry_lapsed, {{"h0b.600000.other", "1"}});
    // A reentrant entry handed to waiter h0a, who gives it back with h0c behind it: kept for h0c.
    const names back = named("{mig}:back");
    hash_lock(back, {"own", "1", "id:own", "0a", "handed:own", "0a"});
    queue_up(back, {{"h0a.600000.own", live}, {"h0c.600000.other", live}});
    // A read-write lock read-held, only a lapsed writer queued: a new writer waits, in line.
    const names writer = named("{mig}:writer");
    hash_lock(writer, {"mode", "read", "r:rdr", held});
    queue_up(writer, {{"wDead", "1"}});
    // Its last reader leaves, only a lapsed writer queued: the key goes.
    const names reader = named("{mig}:reader");
    hash_lock(reader, {"mode", "read", "r:rdr", held});
    queue_up(reader, {{"wDead", "1"}});
    // Read-held, its only waiter, a writer, gives up.
    const names gives_up = named("{mig}:gives-up");
    hash_lock(gives_up, {"mode", "read", "r:rdr", held});
    queue_up(gives_up, {{"wX", live}});

    cluster_->begin_migration(m.slot, m.from, m.to);
    struct settle {
        const move& m;
        ~settle() {
            cluster_->move_keys(m.slot, m.from, m.to);
            cluster_->finish_migration(m.slot, m.from, m.to);
        }
    } settle_at_end{m};
    // A read on the source: "" for a key it no longer has (the source answers ASK for it).
    const auto peek = [&](const std::vector<std::string>& args) {
        try {
            return node(args);
        } catch (const std::runtime_error& e) {
            if (std::string_view{e.what()}.find(" ASK ") == std::string_view::npos) {
                throw;
            }
            return std::string{};
        }
    };
    const auto gone = [&](const std::vector<std::string>& keys) {
        for (const std::string& key : keys) {
            const std::string there = peek({"EXISTS", key});
            if (!there.empty() && there != "0") {
                return false;
            }
        }
        return true;
    };
    redislock::hiredis_connection conn{cluster_->uri_of(src)};
    const auto run = [&](const redislock::script& s, const names& k, auto args) {
        return redislock::detail::run_script(conn, s, keys3{k.lock, k.queue, k.waiting}, args);
    };
    using args3 = std::array<std::string_view, 3>;
    using args4 = std::array<std::string_view, 4>;
    using args6 = std::array<std::string_view, 6>;
    using args7 = std::array<std::string_view, 7>;
    using args11 = std::array<std::string_view, 11>;

    reply r = run(scripts::mutex_release, release, args3{"tok", release.channel, grace});
    EXPECT_EQ(r, reply::integer(2)) << "simple release: " << r.text();
    EXPECT_EQ(peek({"GET", release.lock}), "queued:wA");

    r = run(scripts::mutex_release, release_g, args3{"tok", release_g.channel, grace});
    EXPECT_EQ(r, reply::integer(2)) << "simple release, a 'g' waiter: " << r.text();
    EXPECT_EQ(peek({"GET", release_g.lock}), "0d");

    r = run(scripts::mutex_release, release_lapsed, args3{"tok", release_lapsed.channel, grace});
    EXPECT_EQ(r, reply::integer(1)) << "simple release, a lapsed waiter: " << r.text();
    EXPECT_TRUE(gone({release_lapsed.lock, release_lapsed.queue, release_lapsed.waiting}));

    r = run(scripts::queue_leave, handoff, args4{"wA", handoff.channel, grace, "m"});
    EXPECT_EQ(r, reply::integer(1)) << "simple leave, another behind: " << r.text();
    EXPECT_EQ(peek({"GET", handoff.lock}), "queued:wB");

    r = run(scripts::queue_leave, alone, args4{"wA", alone.channel, grace, "m"});
    EXPECT_EQ(r, reply::integer(0)) << "simple leave, alone: " << r.text();
    EXPECT_TRUE(gone({alone.lock, alone.queue, alone.waiting}));

    r = run(scripts::mutex_acquire, late,
            args7{"mine", "600000", "0", "wA", "5000", late.channel, grace});
    EXPECT_TRUE(r.is_array()) << "simple acquisition, late: " << r.text();
    EXPECT_EQ(peek({"GET", late.lock}), "mine");
    EXPECT_TRUE(gone({late.queue, late.waiting}));

    r = run(scripts::recursive_release, entry,
            args6{"own", "1", "600000", entry.channel, "a1", grace});
    EXPECT_EQ(r, reply::integer(2)) << "reentrant release: " << r.text();
    EXPECT_EQ(peek({"HGET", entry.lock, "id:other"}), "0b");
    EXPECT_EQ(peek({"HEXISTS", entry.lock, "own"}), "0");

    r = run(scripts::recursive_release, entry_lapsed,
            args6{"own", "1", "600000", entry_lapsed.channel, "a1", grace});
    EXPECT_EQ(r, reply::integer(1)) << "reentrant release, a lapsed waiter: " << r.text();
    EXPECT_TRUE(gone({entry_lapsed.lock, entry_lapsed.queue, entry_lapsed.waiting}));

    r = run(scripts::queue_leave, back, args4{"h0a.600000.own", back.channel, grace, ""});
    EXPECT_EQ(r, reply::integer(1)) << "reentrant leave: " << r.text();
    EXPECT_EQ(peek({"HGET", back.lock, "id:other"}), "0c");
    EXPECT_EQ(peek({"HEXISTS", back.lock, "own"}), "0");

    r = run(scripts::shared_acquire, writer,
            args11{"wr", "w", "600000", "0", "wNew", "a2", "1", "", "5000", writer.channel, grace});
    EXPECT_TRUE(r.is_array()) << "writer behind a reader: " << r.text();
    EXPECT_EQ(peek({"ZRANGE", writer.queue, "0", "-1"}), "wNew");

    r = run(scripts::shared_release, reader, args6{"rdr", "r", "1", reader.channel, "a1", grace});
    EXPECT_EQ(r, reply::integer(1)) << "last reader's release: " << r.text();
    EXPECT_TRUE(gone({reader.lock, reader.queue, reader.waiting}));

    r = run(scripts::queue_leave, gives_up, args4{"wX", gives_up.channel, grace, ""});
    EXPECT_EQ(r, reply::integer(0)) << "read-held, its only waiter leaves: " << r.text();
    EXPECT_TRUE(gone({gives_up.queue, gives_up.waiting}));
    EXPECT_EQ(peek({"HGET", gives_up.lock, "r:rdr"}), held);
}

// Every script in states drawn at random (seeded) for each lock kind, run on a migrating source
// that has every key it declares and, the same state, on a stable slot: the same answer and the
// same keys left, so never a call on a key the script removed ("non local key"). Expiry times
// and waits are left out of the comparison; lapse times are far from the server's clock.
TEST_F(ClusterMigration, ScriptsInRandomStatesAnswerOnAMigratingSourceAsOnAStableSlot) {
    namespace scripts = redislock::detail::scripts;
    const move m = plan("{fuzz}");
    const int steady_slot = cluster_->key_slot("{steady}");
    ASSERT_NE(steady_slot, m.slot);
    redislock::hiredis_connection on_source{cluster_->uri_of(m.from)};
    redislock::hiredis_connection on_stable{
        cluster_->uri_of(cluster_->master_for_slot(steady_slot))};
    const auto call = [](redislock::hiredis_connection& c, const std::vector<std::string>& words) {
        const std::vector<std::string_view> argv{words.begin(), words.end()};
        return c.execute(argv);
    };
    const long long now = std::stoll(call(on_source, {"TIME"}).elements().at(0).text()) * 1000;
    const std::string live = std::to_string(now + 600'000);
    const std::string lapsed = std::to_string(now - 1000);

    // A drawn case: "$L" stands for the lock's key and "$C" for its channel.
    struct drawn {
        std::vector<std::vector<std::string>> lock;
        std::vector<std::pair<std::string, bool>> queue;  // id, whether its entry is live
        std::size_t lost = SIZE_MAX;                      // an id without a lapse time
        const redislock::script* s = nullptr;
        std::vector<std::string> args;
    };
    const unsigned seed = 28;
    std::mt19937 rng{seed};
    const auto pick = [&](const std::vector<std::string>& from) {
        return from[std::uniform_int_distribution<std::size_t>{0, from.size() - 1}(rng)];
    };
    const auto chance = [&](int percent) {
        return std::uniform_int_distribution<int>{0, 99}(rng) < percent;
    };
    const std::string grace = "60000";
    const auto draw = [&]() {
        drawn d;
        std::vector<std::string> pool;
        const int kind = std::uniform_int_distribution<int>{0, 2}(rng);
        const int script = std::uniform_int_distribution<int>{0, 2}(rng);
        if (kind == 0) {
            d.lock.push_back({"SET", "$L", pick({"tok", "queued:wA", "queued:wB", "0d", "mine"}),
                              "PX", "600000"});
            pool = {"wA", "wB", "g0d.600000", "wDead"};
            if (script == 0) {
                d.s = &scripts::mutex_acquire;
                d.args = {pick({"tok", "mine", "0d"}),
                          "600000",
                          "0",
                          pick({"wA", "wB", "g0d.600000", "wNew"}),
                          pick({"0", "5000"}),
                          "$C",
                          grace};
            } else if (script == 1) {
                d.s = &scripts::mutex_release;
                d.args = {pick({"tok", "0d", "x"}), "$C", grace};
            } else {
                d.s = &scripts::queue_leave;
                d.args = {pick({"wA", "wB", "g0d.600000", "wDead", "wNew"}), "$C", grace, "m"};
            }
        } else if (kind == 1) {
            const std::string owner = pick({"own", "other"});
            const std::string id = pick({"a1", "0a", "0b"});
            std::vector<std::string> hset{"HSET", "$L", owner, pick({"1", "2"}), "id:" + owner, id};
            if (chance(50)) {
                hset.insert(hset.end(), {"handed:" + owner, id});
            }
            if (chance(30)) {
                hset.insert(hset.end(), {"fence", "5"});
            }
            d.lock = {hset, {"PEXPIRE", "$L", "600000"}};
            pool = {"h0a.600000.own", "h0b.600000.other", "h0c.600000.other", "wA"};
            if (script == 0) {
                d.s = &scripts::recursive_acquire;
                d.args = {pick({"own", "other"}),
                          "600000",
                          "0",
                          pick({"a1", "0a", "0b", "a9"}),
                          pick({"0", "1"}),
                          pick({"", "a1", "0a"}),
                          pick({"h0a.600000.own", "h0b.600000.other", "h0c.600000.other", "wA"}),
                          pick({"0", "5000"}),
                          "$C",
                          grace};
            } else if (script == 1) {
                d.s = &scripts::recursive_release;
                d.args = {pick({"own", "other"}),   pick({"1", "1000000"}),
                          pick({"600000", "0"}),    "$C",
                          pick({"a1", "0a", "0b"}), grace};
            } else {
                d.s = &scripts::queue_leave;
                d.args = {pick({"h0a.600000.own", "h0b.600000.other", "wA", "wDead"}), "$C", grace,
                          pick({"", "k"})};
            }
        } else {
            std::vector<std::string> hset{"HSET", "$L", "mode", pick({"read", "write"})};
            if (chance(70)) {
                hset.insert(hset.end(), {"r:rdr", "1 " + pick({live, lapsed}) + " a1"});
            }
            if (chance(40)) {
                hset.insert(hset.end(), {"w:wr", "1 " + pick({live, lapsed}) + " a2"});
            }
            if (chance(20)) {
                hset.insert(hset.end(), {"r:wr", "1 " + pick({live, lapsed}) + " a2"});
            }
            d.lock = {hset, {"PEXPIRE", "$L", "600000"}};
            pool = {"rX", "rY", "wA", "wDead"};
            if (script == 0) {
                d.s = &scripts::shared_acquire;
                const std::string want = pick({"r", "w"});
                d.args = {pick({"rdr", "wr", "new"}),
                          want,
                          "600000",
                          "0",
                          want == "r" ? pick({"rX", "rY", "rNew"}) : pick({"wA", "wNew"}),
                          pick({"a1", "a2", "a9"}),
                          pick({"0", "1"}),
                          pick({"", "a1"}),
                          pick({"0", "5000"}),
                          "$C",
                          grace};
            } else if (script == 1) {
                d.s = &scripts::shared_release;
                d.args = {pick({"rdr", "wr"}),    pick({"r", "w"}),
                          pick({"1", "1000000"}), "$C",
                          pick({"a1", "a2"}),     grace};
            } else {
                d.s = &scripts::queue_leave;
                d.args = {pick({"rX", "rY", "wA", "wDead", "rNew"}), "$C", grace, ""};
            }
        }
        std::shuffle(pool.begin(), pool.end(), rng);
        pool.resize(std::uniform_int_distribution<std::size_t>{1, 3}(rng));
        for (const std::string& id : pool) {
            d.queue.emplace_back(id, chance(70));
        }
        if (d.queue.size() > 1 && chance(20)) {
            d.lost = std::uniform_int_distribution<std::size_t>{0, d.queue.size() - 1}(rng);
        }
        return d;
    };

    struct names {
        std::string lock, queue, waiting, channel;
    };
    const auto named = [](const names& n) {
        return [&n](const std::string& word) {
            if (word == "$L") {
                return n.lock;
            }
            return word == "$C" ? n.channel : word;
        };
    };
    // Sets the case up under `n`.
    const auto set_up = [&](redislock::hiredis_connection& c, const drawn& d, const names& n) {
        for (const auto& words : d.lock) {
            std::vector<std::string> argv;
            std::transform(words.begin(), words.end(), std::back_inserter(argv), named(n));
            ASSERT_FALSE(call(c, argv).is_error());
        }
        for (std::size_t i = 0; i < d.queue.size(); ++i) {
            call(c, {"ZADD", n.queue, std::to_string(i + 1), d.queue[i].first});
            if (i != d.lost) {
                call(c, {"ZADD", n.waiting, d.queue[i].second ? live : lapsed, d.queue[i].first});
            }
        }
        call(c, {"PEXPIRE", n.queue, "600000"});
        call(c, {"PEXPIRE", n.waiting, "600000"});
    };
    // Runs the case's script under `n` and says what it answered and left, the names written
    // as "$".
    const auto play = [&](redislock::hiredis_connection& c, const drawn& d, const names& n) {
        std::vector<std::string> eval{"EVALSHA", std::string{d.s->sha1}, "3", n.lock, n.queue,
                                      n.waiting};
        std::transform(d.args.begin(), d.args.end(), std::back_inserter(eval), named(n));
        const reply r = call(c, eval);
        std::string seen;
        if (r.is_error()) {
            seen = "error " + r.text();
            for (const std::string* key : {&n.lock, &n.queue, &n.waiting}) {
                for (auto at = seen.find(*key); at != std::string::npos; at = seen.find(*key)) {
                    seen.replace(at, key->size(), "$");
                }
            }
        } else if (r.is_array()) {
            seen = "{" + std::to_string(r.elements().at(0).as_integer()) + ", ...}";
        } else {
            seen = std::to_string(r.as_integer());
        }
        // What is left; a key the migrating source no longer has is answered with ASK.
        for (const std::string* key : {&n.lock, &n.queue, &n.waiting}) {
            const reply type = call(c, {"TYPE", *key});
            const std::string kind = type.is_error() ? "none" : type.text();
            seen += " | " + kind;
            if (kind == "string") {
                seen += " " + call(c, {"GET", *key}).text();
            } else if (kind == "zset") {
                const reply ids = call(c, {"ZRANGE", *key, "0", "-1"});
                for (const reply& id : ids.elements()) {
                    seen += " " + id.text();
                }
            } else if (kind == "hash") {
                std::vector<std::string> fields;
                const auto all = call(c, {"HGETALL", *key}).elements();
                for (std::size_t i = 0; i + 1 < all.size(); i += 2) {
                    std::string value = all[i + 1].text();
                    if (all[i].text().starts_with("r:") || all[i].text().starts_with("w:")) {
                        value = value.substr(0, value.find(' ')) +
                                value.substr(value.rfind(' '));  // count and id
                    }
                    fields.push_back(all[i].text() + "=" + value);
                }
                std::sort(fields.begin(), fields.end());
                for (const std::string& f : fields) {
                    seen += " " + f;
                }
            }
        }
        return seen;
    };

    for (const redislock::script* s :
         {&scripts::mutex_acquire, &scripts::mutex_release, &scripts::queue_leave,
          &scripts::recursive_acquire, &scripts::recursive_release, &scripts::shared_acquire,
          &scripts::shared_release}) {
        for (redislock::hiredis_connection* c : {&on_source, &on_stable}) {
            ASSERT_EQ(call(*c, {"SCRIPT", "LOAD", std::string{s->source}}).text(), s->sha1);
        }
    }
    constexpr int cases = 600;
    std::vector<drawn> drawn_cases;
    std::vector<names> on_fuzz;
    std::vector<names> on_steady;
    for (int i = 0; i < cases; ++i) {
        drawn_cases.push_back(draw());
        const auto names_for = [&](const std::string& tag) {
            const std::string name = "{" + tag + "}:" + std::to_string(i);
            return names{name, derived_key(name, "queue"), derived_key(name, "waiting"),
                         derived_key(name, "released")};
        };
        on_fuzz.push_back(names_for("fuzz"));
        on_steady.push_back(names_for("steady"));
        set_up(on_stable, drawn_cases.back(), on_steady.back());
        set_up(on_source, drawn_cases.back(), on_fuzz.back());
    }
    // Every key is on the source as the slot starts migrating.
    cluster_->begin_migration(m.slot, m.from, m.to);
    struct settle {
        const move& m;
        ~settle() {
            cluster_->move_keys(m.slot, m.from, m.to);
            cluster_->finish_migration(m.slot, m.from, m.to);
        }
    } settle_at_end{m};
    int differ = 0;
    int ran = 0;
    for (int i = 0; i < cases && differ < 10; ++i, ++ran) {
        const drawn& d = drawn_cases[static_cast<std::size_t>(i)];
        const std::string stable = play(on_stable, d, on_steady[static_cast<std::size_t>(i)]);
        const std::string migrating = play(on_source, d, on_fuzz[static_cast<std::size_t>(i)]);
        if (migrating != stable) {
            ++differ;
            std::string state;
            for (const auto& words : d.lock) {
                for (const std::string& w : words) {
                    state += w + " ";
                }
                state += "; ";
            }
            for (std::size_t q = 0; q < d.queue.size(); ++q) {
                state += d.queue[q].first + (q == d.lost         ? "(no lapse time)"
                                             : d.queue[q].second ? "(live) "
                                                                 : "(lapsed) ");
            }
            std::string args;
            for (const std::string& a : d.args) {
                args += "'" + a + "' ";
            }
            ADD_FAILURE() << "case " << i << " (seed " << seed << "): " << d.s->name << " " << args
                          << "\n  state:     " << state << "\n  stable:    " << stable
                          << "\n  migrating: " << migrating;
        }
    }
    std::printf("[ random   ] %d cases of seed %u, %d answered otherwise on the migrating source\n",
                ran, seed, differ);
}

// Once the lock key (and fencing counter) moved and the queue has not, a new waiter waits for the
// slot instead of starting a second queue on the target, so MIGRATE without REPLACE moves the
// queue; both waiters then get the lock in turn.
TEST_F(ClusterMigration, NewWaiterAfterTheLockKeyMovedJoinsTheOneQueue) {
    for (const bool fencing : {true, false}) {
        for_each_kind([&](const std::string& kind, auto make, bool) {
            SCOPED_TRACE(kind + (fencing ? ", fenced" : ", unfenced"));
            const std::string name = std::string{fencing ? "fenced:" : "plain:"} + kind;
            const std::string queue = derived_key(name, "queue");
            const std::string waiting = derived_key(name, "waiting");
            const move m = plan(name);
            redislock::cluster_client cc{cluster_->uri("command_timeout=5000")};
            redislock::cluster_client first{cluster_->uri("command_timeout=5000")};
            redislock::cluster_client second{cluster_->uri("command_timeout=5000")};
            const redislock::lock_options options{.lease = 20s, .fencing = fencing};
            auto holder = make(cc, name, options);
            holder.lock();

            problems seen;
            std::atomic<int> got{0};
            const auto wait_for_it = [&](redislock::cluster_client& client) {
                return [&] {
                    seen.guard("waiter", [&] {
                        auto w = make(client, name, options);
                        if (w.try_lock_for(40s)) {
                            ++got;
                            w.unlock();
                        }
                    });
                };
            };
            std::jthread waiter1{wait_for_it(first)};
            ASSERT_TRUE(redislock::test::eventually([&] { return exists_on(m.from, queue); }, 10s));

            cluster_->begin_migration(m.slot, m.from, m.to);
            std::vector<std::string> lock_keys{name};
            if (fencing) {
                lock_keys.push_back(derived_key(name, "fence"));
            }
            cluster_->move_named_keys(m.from, m.to, lock_keys);
            std::jthread waiter2{wait_for_it(second)};
            std::this_thread::sleep_for(500ms);  // its attempts meet the half-moved slot
            seen.guard("moving the queue without REPLACE",
                       [&] { cluster_->move_keys(m.slot, m.from, m.to); });
            cluster_->finish_migration(m.slot, m.from, m.to);
            std::error_code ec;
            holder.unlock(ec);
            EXPECT_FALSE(ec) << ec.message();
            waiter1.join();
            waiter2.join();
            EXPECT_TRUE(seen.empty()) << seen.text();
            EXPECT_EQ(got.load(), 2);
            EXPECT_EQ(count_existing({name, queue, waiting}), 0) << "nothing left behind";
        });
    }
}

}  // namespace
