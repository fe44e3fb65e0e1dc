// Every lock kind while its slot is being migrated, half a step at a time, the way
// `redis-cli --cluster reshard` does it (MIGRATE without REPLACE): the keys of a name are still on
// the source, or some of them moved, or all of them. A command whose declared keys are partly
// missing on a migrating slot is answered TRYAGAIN (and one whose keys are all missing is sent
// to the target with ASK, where it is answered TRYAGAIN unless they are all there): calls ride
// that out within their deadline, and no script writes and then fails.

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
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
