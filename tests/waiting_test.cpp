// Notified, fair waiting (detail/waiting/acquire_in_line.hpp): a release wakes the waiter it names;
// waiters go in arrival order, one per process in Redis; lost notifications, crashed holders and
// waiters that give up delay no one beyond the holder's lease and leave nothing behind.

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

#include "support/redis_server.hpp"
#include "support/test_util.hpp"

namespace {

using namespace std::chrono_literals;
using redislock::lock_options;
using redislock::test::eventually;
using redislock::test::redis_server;
using redislock::test::stopwatch;
using redislock::test::waiting_thread;

// The three kinds behind one interface, for tests that hold for each.
struct any_lock {
    std::function<bool(std::chrono::milliseconds)> try_lock_for;
    std::function<void()> unlock;
};

enum class kind { simple, reentrant, writer, reader };

any_lock make_lock(redislock::client& client, kind k, const std::string& name,
                   lock_options options = {}) {
    switch (k) {
        case kind::simple: {
            auto m = std::make_shared<redislock::mutex>(client.mutex(name, options));
            return {[m](auto d) { return m->try_lock_for(d); }, [m] { m->unlock(); }};
        }
        case kind::reentrant: {
            auto m =
                std::make_shared<redislock::recursive_mutex>(client.recursive_mutex(name, options));
            return {[m](auto d) { return m->try_lock_for(d); }, [m] { m->unlock(); }};
        }
        case kind::writer: {
            auto m = std::make_shared<redislock::shared_mutex>(client.shared_mutex(name, options));
            return {[m](auto d) { return m->try_lock_for(d); }, [m] { m->unlock(); }};
        }
        case kind::reader:
            break;
    }
    auto m = std::make_shared<redislock::shared_mutex>(client.shared_mutex(name, options));
    return {[m](auto d) { return m->try_lock_shared_for(d); }, [m] { m->unlock_shared(); }};
}

const char* kind_name(kind k) {
    switch (k) {
        case kind::simple:
            return "simple";
        case kind::reentrant:
            return "reentrant";
        case kind::writer:
            return "writer";
        case kind::reader:
            return "reader";
    }
    return "?";
}

std::int64_t zcard(redis_server& srv, const std::string& key) {
    return std::stoll(srv.cli({"ZCARD", key}));
}

// True when some client listens for the releases of the lock whose hash tag is `tag`.
bool subscribed(redis_server& srv, const std::string& tag) {
    const std::string channels = srv.cli({"PUBSUB", "SHARDCHANNELS", tag + ":*"});
    return channels.find(tag + ":released:") != std::string::npos;
}

bool nothing_left(redis_server& srv) {
    return srv.cli({"DBSIZE"}) == "0";
}

// A hiredis connection that can fail chosen commands before sending them, and opening subscriber
// links.
struct hooked_connection {
    std::shared_ptr<redislock::hiredis_connection> inner;
    std::shared_ptr<std::function<bool(redislock::command)>> fail_before =
        std::make_shared<std::function<bool(redislock::command)>>();
    std::shared_ptr<std::atomic<bool>> refuse_links = std::make_shared<std::atomic<bool>>(false);

    redislock::reply execute(redislock::command argv) {
        return execute(argv, redislock::call_context{});
    }
    redislock::reply execute(redislock::command argv, const redislock::call_context& how) {
        if (*fail_before && (*fail_before)(argv)) {
            throw redislock::connection_error{"injected: connection reset before sending"};
        }
        return inner->execute(argv, how);
    }
    std::unique_ptr<redislock::subscriber_link> open_subscriber(std::string_view channel) {
        if (*refuse_links) {
            throw redislock::connection_error{"injected: no subscriber link"};
        }
        return inner->open_subscriber(channel);
    }
    const redislock::endpoint& config() const { return inner->config(); }
};

// A hiredis connection that names the node of a subscriber link itself, and can be made to throw
// doing so for the channels of the lock "thrown" (as a connection type's own code might).
struct node_naming_connection {
    std::shared_ptr<redislock::hiredis_connection> inner;
    std::shared_ptr<std::atomic<bool>> throw_naming = std::make_shared<std::atomic<bool>>(false);
    std::shared_ptr<std::atomic<int>> thrown = std::make_shared<std::atomic<int>>(0);

    redislock::reply execute(redislock::command argv) { return inner->execute(argv); }
    redislock::reply execute(redislock::command argv, const redislock::call_context& how) {
        return inner->execute(argv, how);
    }
    std::unique_ptr<redislock::subscriber_link> open_subscriber(std::string_view channel) {
        return inner->open_subscriber(channel);
    }
    std::string subscriber_node(std::string_view channel) const {
        if (*throw_naming && channel.starts_with("{thrown}")) {
            ++*thrown;
            throw std::runtime_error{"injected: cannot name the node"};
        }
        return "the node";
    }
    const redislock::endpoint& config() const { return inner->config(); }
};

bool is_script(redislock::command argv, const redislock::script& s) {
    return argv.size() > 1 && argv[0] == "EVALSHA" && argv[1] == s.sha1;
}

}  // namespace

namespace {

// ---------------------------------------------------------------------------------------------

// The holder's lease is long and the waiter's backoff would be long too: only the release's
// message can wake the waiter soon after the unlock: a sleeping waiter (no spin, or a spin over
// long before the release) and one still spinning when it comes.
class WaitingWithSpin : public ::testing::TestWithParam<std::chrono::microseconds> {};

INSTANTIATE_TEST_SUITE_P(Spins, WaitingWithSpin,
                         ::testing::Values(0us, 1ms, std::chrono::microseconds{30s}),
                         [](const auto& info) {
                             return "spin_" + std::to_string(info.param.count()) + "us";
                         });

TEST_P(WaitingWithSpin, ReleaseWakesTheWaiterOfEveryKind) {
    redis_server srv;
    redislock::client client{srv.uri()};
    for (kind k : {kind::simple, kind::reentrant, kind::writer}) {
        SCOPED_TRACE(kind_name(k));
        const lock_options slow{.lease = 30s, .backoff_min = 5s, .backoff_max = 20s};
        any_lock holder = make_lock(client, k, "w", slow);
        redislock::client other{srv.uri(), redislock::client_options{.wait_spin = GetParam()}};
        any_lock waiter = make_lock(other, k == kind::writer ? kind::reader : k, "w", slow);
        ASSERT_TRUE(holder.try_lock_for(0ms));
        waiting_thread t{waiter, 25s};
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{w}:queue") == 1; }));
        // Subscribed: a waiter that polls (every 50 ms at most, its grace over 2) would pass
        // the checks below too.
        ASSERT_TRUE(eventually([&] { return subscribed(srv, "{w}"); }));
        const stopwatch watch;
        holder.unlock();
        ASSERT_TRUE(eventually([&] { return t.got(); }, 3s)) << "not woken by the release";
        EXPECT_LT(watch.elapsed(), 3s);
        t.join();
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// A waiter still spinning ends its wait at its deadline, and at a stop request, like one that
// sleeps; it leaves its place in the queue behind neither time.
TEST(Waiting, SpinningWaiterEndsAtItsDeadlineAndAtAStopRequest) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri(), redislock::client_options{.wait_spin = 30s}};
    auto holder = client.mutex("s", {.lease = 30s});
    auto waiter = other.mutex("s", {.lease = 30s, .backoff_min = 5s, .backoff_max = 20s});
    ASSERT_TRUE(holder.try_lock());
    const stopwatch watch;
    EXPECT_FALSE(waiter.try_lock_for(300ms));
    EXPECT_LT(watch.elapsed(), 10s);
    EXPECT_TRUE(eventually([&] { return zcard(srv, "{s}:queue") == 0; }));

    std::stop_source stop;
    std::atomic<bool> ended{false};
    std::thread t{[&] {
        EXPECT_FALSE(waiter.lock(stop.get_token()));
        ended = true;
    }};
    ASSERT_TRUE(eventually([&] { return zcard(srv, "{s}:queue") == 1; }));
    stop.request_stop();
    EXPECT_TRUE(eventually([&] { return ended.load(); }, 10s)) << "the stop request was missed";
    t.join();
    EXPECT_TRUE(eventually([&] { return zcard(srv, "{s}:queue") == 0; }));
    holder.unlock();
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// While a waiter spins, the notifier's thread still subscribes the channel of another lock a
// second waiter of the same client comes to wait for, and that waiter is woken by its release.
TEST(Waiting, ChannelsAreSubscribedWhileAWaiterSpins) {
    redis_server srv;
    redislock::client client{srv.uri()};
    redislock::client other{srv.uri(), redislock::client_options{.wait_spin = 30s}};
    const lock_options slow{.lease = 30s, .backoff_min = 5s, .backoff_max = 20s};
    auto first_holder = client.mutex("first", slow);
    auto second_holder = client.mutex("second", slow);
    ASSERT_TRUE(first_holder.try_lock());
    ASSERT_TRUE(second_holder.try_lock());
    auto first = other.mutex("first", slow);
    auto second = other.mutex("second", slow);
    waiting_thread spinning{first, 25s};
    ASSERT_TRUE(eventually([&] { return zcard(srv, "{first}:queue") == 1; }));
    waiting_thread late{second, 25s};
    ASSERT_TRUE(eventually([&] { return zcard(srv, "{second}:queue") == 1; }));
    second_holder.unlock();
    EXPECT_TRUE(eventually([&] { return late.got(); }, 3s)) << "not woken by the release";
    first_holder.unlock();
    EXPECT_TRUE(eventually([&] { return spinning.got(); }, 3s)) << "not woken by the release";
    spinning.join();
    late.join();
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// With the subscriber connection killed mid-wait, a waiter of every kind (a reader behind a
// writer) still gets the lock: it tries again, subscribes anew, and at the latest its holder's
// lease bounds the wait; a simple or reentrant lock handed to it meanwhile is claimed by that
// next attempt. One still spinning is not left to the lease either. (Whether the spinner or the
// notifier's thread reads the link is a matter of latency, which contention_bench shows, not of
// correctness.)
TEST_P(WaitingWithSpin, LostSubscriberConnectionStillAcquiresWithinTheHoldersLease) {
    redis_server srv;
    // The long lease leaves a waiter that spins when the link dies no way to acquire in time
    // but finding out about the loss.
    const auto lease = GetParam() > 1s ? 30s : 2s;
    for (kind k : {kind::simple, kind::reentrant, kind::writer, kind::reader}) {
        SCOPED_TRACE(kind_name(k));
        srv.flushall();
        // Fresh clients: each kind's waiter has a link of its own to lose.
        redislock::client client{srv.uri()};
        redislock::client other{srv.uri(), redislock::client_options{.wait_spin = GetParam()}};
        any_lock holder =
            make_lock(client, k == kind::reader ? kind::writer : k, "lost", {.lease = lease});
        any_lock waiter = make_lock(other, k, "lost", {.lease = lease});
        ASSERT_TRUE(holder.try_lock_for(0ms));
        waiting_thread t{waiter, 10s};
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{lost}:queue") == 1; }));
        ASSERT_TRUE(eventually([&] { return subscribed(srv, "{lost}"); }));
        EXPECT_NE(srv.cli({"CLIENT", "KILL", "TYPE", "pubsub"}), "0");
        holder.unlock();
        EXPECT_TRUE(eventually([&] { return t.got(); }, 3s));
        t.join();
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// The subscriber connections' ids the server lists, in one string.
std::string subscriber_ids(redis_server& srv) {
    const std::string clients = srv.cli({"CLIENT", "LIST", "TYPE", "pubsub"});
    const std::regex id{"id=(\\d+)"};
    std::string ids;
    for (std::sregex_iterator it{clients.begin(), clients.end(), id}, end; it != end; ++it) {
        ids += (*it)[1].str() + " ";
    }
    return ids;
}

// A connection that throws naming a channel's node ends neither the process nor the wait: that
// lock's waiter falls back to the holder's lease, while another lock's waiter stays subscribed on
// the same link and is woken by its release. Once the connection behaves, channels are
// subscribed again.
TEST(Waiting, NotifierOutlivesAConnectionThatThrows) {
    redis_server srv;
    redislock::client client{srv.uri()};
    node_naming_connection conn{std::make_shared<redislock::hiredis_connection>(srv.uri())};
    redislock::basic_client<node_naming_connection> other{conn};
    const lock_options slow{.lease = 30s, .backoff_min = 5s, .backoff_max = 20s};

    auto steady_holder = client.mutex("steady", slow);
    auto steady = other.mutex("steady", slow);
    ASSERT_TRUE(steady_holder.try_lock());
    waiting_thread steady_waiter{steady, 25s};
    ASSERT_TRUE(eventually([&] { return subscribed(srv, "{steady}"); }));
    const std::string link = subscriber_ids(srv);
    ASSERT_NE(link, "");

    *conn.throw_naming = true;
    auto short_holder = client.mutex("thrown", {.lease = 1s});
    auto thrown = other.mutex("thrown", slow);
    ASSERT_TRUE(short_holder.try_lock());
    ASSERT_TRUE(thrown.try_lock_for(10s));
    thrown.unlock();
    EXPECT_GE(conn.thrown->load(), 1);
    EXPECT_EQ(subscriber_ids(srv), link) << "the link of the other lock's waiter was dropped";
    steady_holder.unlock();
    EXPECT_TRUE(eventually([&] { return steady_waiter.got(); }, 3s));
    steady_waiter.join();

    *conn.throw_naming = false;
    auto holder = client.mutex("thrown", slow);
    ASSERT_TRUE(holder.try_lock());
    waiting_thread waiter{thrown, 25s};
    EXPECT_TRUE(eventually([&] { return subscribed(srv, "{thrown}"); }))
        << "the waiter's channel was not subscribed";
    holder.unlock();
    EXPECT_TRUE(eventually([&] { return waiter.got(); }, 3s));
    waiter.join();
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// A client whose subscriber links cannot be opened tells its hook so, naming the lock, and its
// waiter still gets the lock, by polling.
TEST(Waiting, WaiterWhoseLinkCannotBeOpenedIsToldAndPolls) {
    redis_server srv;
    hooked_connection conn{std::make_shared<redislock::hiredis_connection>(srv.uri())};
    *conn.refuse_links = true;
    std::mutex mutex;
    std::vector<std::string> refusals;
    redislock::basic_client<hooked_connection> client{
        conn, {.on_event = [&](const redislock::lock_event& e) {
            if (e.type == redislock::event_type::subscription_refused) {
                std::lock_guard guard{mutex};
                refusals.push_back(std::string{e.name} + ": " + std::string{e.detail});
            }
        }}};
    redislock::client holder_client{srv.uri()};
    auto holder = holder_client.mutex("unlinked", {.lease = 30s});
    auto waiter = client.mutex("unlinked", {.lease = 30s, .backoff_max = 200ms});
    ASSERT_TRUE(holder.try_lock());
    waiting_thread t{waiter, 20s};
    ASSERT_TRUE(eventually([&] {
        std::lock_guard guard{mutex};
        return !refusals.empty();
    }));
    holder.unlock();
    EXPECT_TRUE(eventually([&] { return t.got(); }, 5s));
    t.join();
    std::lock_guard guard{mutex};
    ASSERT_EQ(refusals.size(), 1u);
    EXPECT_EQ(refusals.front(),
              "unlinked: could not open a subscriber link: injected: no subscriber link");
}

// A holder that dies without releasing delays the waiter by its lease, not more.
TEST(Waiting, HolderCrashDelaysTheWaiterOnlyUntilItsLeaseEnds) {
    redis_server srv;
    const pid_t child = ::fork();
    if (child == 0) {
        redislock::client client{srv.uri()};
        auto m = client.mutex("crash", {.lease = 1s});
        std::_Exit(m.try_lock() ? 0 : 1);  // exits holding it
    }
    ASSERT_EQ(redislock::test::wait_child(child, 10s), 0);
    redislock::client client{srv.uri()};
    auto m = client.mutex("crash", {.lease = 1s, .backoff_min = 1s, .backoff_max = 5s});
    const stopwatch watch;
    ASSERT_TRUE(m.try_lock_for(5s));
    EXPECT_LT(watch.elapsed(), 2500ms);
    m.unlock();
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// A forked child, killed (if still running) and reaped when it goes out of scope.
struct child_process {
    pid_t pid = -1;

    // Kills the child with SIGKILL, as a crash would end it; returns its wait status.
    std::optional<int> crash() {
        ::kill(pid, SIGKILL);
        const std::optional<int> status = redislock::test::wait_child(pid, 10s);
        pid = -1;
        return status;
    }
    ~child_process() {
        if (pid > 0) {
            (void)crash();
        }
    }
};

// A holder of any kind that dies without releasing while a waiter already waits (a reader
// behind a writer too) keeps the lock until its lease ends, and delays the waiter no longer:
// the waiter sleeps only as long as the lease it was told is left.
TEST(Waiting, HolderCrashWhileAWaiterWaitsDelaysItOnlyUntilTheLeaseEnds) {
    using redislock::test::monotonic_ns;
    redis_server srv;
    constexpr auto lease = 2s;
    for (kind k : {kind::simple, kind::reentrant, kind::writer, kind::reader}) {
        SCOPED_TRACE(kind_name(k));
        srv.flushall();
        int held[2];
        ASSERT_EQ(::pipe(held), 0);
        child_process child{::fork()};
        if (child.pid == 0) {
            // Tells the parent when it sent the attempt that acquired, then holds until killed;
            // nothing it throws may reach the test runner's copy in this process.
            try {
                redislock::client client{srv.uri()};
                any_lock holder = make_lock(client, k == kind::reader ? kind::writer : k, "crash",
                                            {.lease = lease});
                const std::int64_t sent = monotonic_ns();
                if (!holder.try_lock_for(0ms) ||
                    ::write(held[1], &sent, sizeof sent) != static_cast<ssize_t>(sizeof sent)) {
                    std::_Exit(1);
                }
                std::this_thread::sleep_for(20s);
            } catch (...) {
                std::_Exit(3);
            }
            std::_Exit(2);
        }
        ::close(held[1]);
        pollfd readable{held[0], POLLIN, 0};
        std::int64_t sent = 0;
        const bool told = ::poll(&readable, 1, 10'000) == 1 &&
                          ::read(held[0], &sent, sizeof sent) == static_cast<ssize_t>(sizeof sent);
        ::close(held[0]);
        ASSERT_TRUE(told) << "the child did not acquire";

        redislock::client client{srv.uri()};
        any_lock waiter =
            make_lock(client, k, "crash", {.lease = lease, .backoff_min = 1s, .backoff_max = 5s});
        std::atomic<std::int64_t> acquired{0};
        std::jthread t{[&] {
            if (waiter.try_lock_for(10s)) {
                acquired = monotonic_ns();
                waiter.unlock();
            }
        }};
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{crash}:queue") == 1; }));
        const std::optional<int> status = child.crash();
        EXPECT_LT(std::chrono::nanoseconds{monotonic_ns() - sent}, lease)
            << "the holder's lease ended before it crashed: the waiter was not left waiting";
        ASSERT_TRUE(status.has_value());
        EXPECT_TRUE(WIFSIGNALED(*status)) << "the child did not hold until killed";
        t.join();
        ASSERT_NE(acquired.load(), 0) << "not acquired";
        // The lease runs from the server's grant, after `sent`; the margin below it is for the
        // clocks' rates only.
        const std::chrono::nanoseconds waited{acquired.load() - sent};
        EXPECT_GE(waited, lease - 50ms) << "acquired while the crashed holder's lease ran";
        EXPECT_LT(waited, lease + 1500ms) << "left waiting well past the holder's lease";
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// A waiter the lock is handed to but that never comes (stopped, then killed, before it could read
// the hand-over) holds the next waiter up for about a second at most, whatever its lease: a
// hand-over only reserves the lock until the waiter comes to take it.
TEST(Waiting, LockHandedToAWaiterThatNeverComesIsFreeAgainWithinASecond) {
    using redislock::test::monotonic_ns;
    redis_server srv;
    constexpr auto lease = 20s;
    for (kind k : {kind::simple, kind::reentrant, kind::writer}) {
        SCOPED_TRACE(kind_name(k));
        srv.flushall();
        int go[2];
        ASSERT_EQ(::pipe(go), 0);
        child_process child{::fork()};
        if (child.pid == 0) {
            // Waits in line once told to; nothing it throws may reach the test runner's copy.
            ::close(go[1]);
            try {
                char c = 0;
                if (::read(go[0], &c, 1) != 1) {
                    std::_Exit(1);
                }
                redislock::client client{srv.uri()};
                any_lock waiter = make_lock(client, k, "handed", {.lease = lease});
                std::_Exit(waiter.try_lock_for(30s) ? 0 : 2);
            } catch (...) {
                std::_Exit(3);
            }
        }
        ::close(go[0]);
        redislock::client client{srv.uri()};
        any_lock holder = make_lock(client, k, "handed", {.lease = lease});
        ASSERT_TRUE(holder.try_lock_for(0ms));
        ASSERT_EQ(::write(go[1], "g", 1), 1);
        ::close(go[1]);
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{handed}:queue") == 1; }));
        ASSERT_EQ(::kill(child.pid, SIGSTOP), 0);

        redislock::client other{srv.uri()};
        any_lock next = make_lock(other, k, "handed", {.lease = lease});
        std::atomic<std::int64_t> acquired{0};
        std::jthread t{[&] {
            if (next.try_lock_for(10s)) {
                acquired = monotonic_ns();
                next.unlock();
            }
        }};
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{handed}:queue") == 2; }));
        const std::int64_t released = monotonic_ns();
        holder.unlock();  // hands the lock to the stopped waiter
        const std::optional<int> status = child.crash();
        ASSERT_TRUE(status.has_value());
        EXPECT_TRUE(WIFSIGNALED(*status)) << "the stopped waiter returned";
        t.join();
        if (acquired.load() == 0) {
            ADD_FAILURE() << "the next waiter did not get the lock within 10 s";
            continue;
        }
        EXPECT_LT(std::chrono::nanoseconds{acquired.load() - released}, 1s);
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// Forks a child that, once `go` is written to, waits in line for `name` as a lock of kind `k`
// (lease `lease`) for at most `wait`; when it gets the lock it writes the monotonic time then to
// `got` (when given), unlocks and exits 0. Nothing it throws reaches the test runner's copy.
child_process fork_waiter(redis_server& srv, kind k, const std::string& name,
                          std::chrono::milliseconds lease, std::chrono::milliseconds wait,
                          const int (&go)[2], const int* got) {
    child_process child{::fork()};
    if (child.pid != 0) {
        return child;
    }
    ::close(go[1]);
    try {
        char c = 0;
        if (::read(go[0], &c, 1) != 1) {
            std::_Exit(1);
        }
        redislock::client client{srv.uri()};
        any_lock waiter = make_lock(client, k, name, {.lease = lease});
        if (!waiter.try_lock_for(wait)) {
            std::_Exit(2);
        }
        const std::int64_t at = redislock::test::monotonic_ns();
        if (got != nullptr && ::write(got[1], &at, sizeof at) != static_cast<ssize_t>(sizeof at)) {
            std::_Exit(4);
        }
        waiter.unlock();
        std::_Exit(0);
    } catch (...) {
        std::_Exit(3);
    }
}

// A waiter told it may go that comes after its grace (its machine busy; stopped here) has lapsed
// from the queue, and the waiter behind it, which died meanwhile, heads the queue with the lapse
// time it joined with: the previous holder's lease and more. The free lock is handed on to that
// dead head as a release would, for a grace only, and the late waiter gets it within a second of
// coming back, whatever the lease, not at the dead waiter's lapse time.
TEST(Waiting, LateWaiterGetsTheFreeLockSoonWhenADeadWaiterMovedUpBeforeIt) {
    using redislock::test::monotonic_ns;
    redis_server srv;
    constexpr auto lease = 30s;
    for (kind k : {kind::simple, kind::reentrant, kind::writer}) {
        SCOPED_TRACE(kind_name(k));
        srv.flushall();
        int go_late[2];
        int go_dead[2];
        int got[2];
        ASSERT_EQ(::pipe(go_late), 0);
        ASSERT_EQ(::pipe(go_dead), 0);
        ASSERT_EQ(::pipe(got), 0);
        // Both forked before this process opens a client.
        child_process late = fork_waiter(srv, k, "late", lease, 10s, go_late, got);
        child_process dead = fork_waiter(srv, k, "late", lease, 60s, go_dead, nullptr);
        for (int fd : {go_late[0], go_dead[0], got[1]}) {
            ::close(fd);
        }
        redislock::client client{srv.uri()};
        any_lock holder = make_lock(client, k, "late", {.lease = lease});
        ASSERT_TRUE(holder.try_lock_for(0ms));
        ASSERT_EQ(::write(go_late[1], "g", 1), 1);
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{late}:queue") == 1; }));
        ASSERT_EQ(::write(go_dead[1], "g", 1), 1);
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{late}:queue") == 2; }));
        ASSERT_TRUE(dead.crash().has_value());
        ASSERT_EQ(::kill(late.pid, SIGSTOP), 0);

        holder.unlock();  // tells the stopped waiter it may go, for a grace of 100 ms
        std::this_thread::sleep_for(500ms);
        const std::int64_t resumed = monotonic_ns();
        ASSERT_EQ(::kill(late.pid, SIGCONT), 0);
        pollfd ready{got[0], POLLIN, 0};
        std::int64_t acquired = 0;
        if (::poll(&ready, 1, 20'000) != 1 ||
            ::read(got[0], &acquired, sizeof acquired) != static_cast<ssize_t>(sizeof acquired)) {
            ADD_FAILURE() << "the late waiter did not get the lock within its 10 s";
        } else {
            const std::chrono::nanoseconds took{acquired - resumed};
            RecordProperty(
                std::string{kind_name(k)} + "_ms",
                std::to_string(
                    std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
            EXPECT_LT(took, 1s);
        }
        const std::optional<int> status = redislock::test::wait_child(late.pid, 20s);
        late.pid = -1;
        ASSERT_TRUE(status.has_value());
        EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
        for (int fd : {go_late[1], go_dead[1], got[0]}) {
            ::close(fd);
        }
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// Waiters whose lapse times were lost (the :waiting key evicted, or deleted here) keep their
// places while they are alive: told to check, each comes back and keeps its place for the wait
// it now needs, and is told at its turn, rather than lapsing unheard and waking at the end of
// the wait it was told (the first holder's lease, longer than their deadline here).
TEST(Waiting, WaitersWhoseLapseTimesWereLostKeepTheirPlaces) {
    redis_server srv;
    const lock_options slow{.lease = 30s, .backoff_min = 5s, .backoff_max = 20s};
    for (kind k : {kind::simple, kind::reentrant, kind::writer}) {
        SCOPED_TRACE(kind_name(k));
        srv.flushall();
        redislock::client client{srv.uri()};
        any_lock holder = make_lock(client, k, "lost", slow);
        ASSERT_TRUE(holder.try_lock_for(0ms));
        std::vector<std::unique_ptr<redislock::client>> clients;
        std::vector<std::jthread> waiters;
        std::atomic<int> got{0};
        for (int i = 0; i < 3; ++i) {
            clients.push_back(std::make_unique<redislock::client>(srv.uri()));
            waiters.emplace_back([&, waiter = make_lock(*clients.back(), k, "lost", slow)] {
                if (waiter.try_lock_for(20s)) {
                    ++got;
                    // Held past the 2 s the lost lapse times are given, so the next release
                    // prunes whoever did not come back.
                    std::this_thread::sleep_for(2500ms);
                    waiter.unlock();
                }
            });
            ASSERT_TRUE(eventually([&] { return zcard(srv, "{lost}:queue") == i + 1; }));
        }
        ASSERT_EQ(srv.cli({"DEL", "{lost}:waiting"}), "1");
        holder.unlock();
        waiters.clear();  // joins them
        EXPECT_EQ(got.load(), 3);
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// Each client hears a lock's releases on a channel of its own beside the lock's: a release tells
// every waiter it lets go (here two readers of two clients), each on its client's channel, and
// publishes nothing on a channel the other clients hear too.
TEST(Waiting, EachClientIsToldOnItsOwnChannel) {
    redis_server srv;
    redislock::client client{srv.uri()};
    const lock_options slow{.lease = 30s, .backoff_min = 5s, .backoff_max = 20s};
    any_lock writer = make_lock(client, kind::writer, "own", slow);
    ASSERT_TRUE(writer.try_lock_for(0ms));
    redislock::test::subscriber shared_channel{srv, "{own}:released"};
    std::vector<std::unique_ptr<redislock::client>> clients;
    std::vector<std::jthread> readers;
    std::atomic<int> got{0};
    for (int i = 0; i < 2; ++i) {
        clients.push_back(std::make_unique<redislock::client>(srv.uri()));
        readers.emplace_back([&, reader = make_lock(*clients.back(), kind::reader, "own", slow)] {
            if (reader.try_lock_for(25s)) {
                ++got;
                reader.unlock();
            }
        });
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{own}:queue") == i + 1; }));
    }
    // Each reader's client subscribed '{own}:released:<its tag>', and no other.
    ASSERT_TRUE(eventually([&] {
        return srv.cli({"PUBSUB", "SHARDNUMSUB", "{own}:released"}) == "{own}:released\n1";
    }));
    std::string channels;
    ASSERT_TRUE(eventually([&] {
        channels = srv.cli({"PUBSUB", "SHARDCHANNELS", "{own}:released:*"});
        return std::count(channels.begin(), channels.end(), '\n') >= 1;
    })) << channels;
    const std::regex tagged{"\\{own\\}:released:[0-9a-f]{16}"};
    std::vector<std::string> lines;
    std::istringstream in{channels};
    for (std::string line; std::getline(in, line);) {
        lines.push_back(line);
    }
    ASSERT_EQ(lines.size(), 2U) << channels;
    EXPECT_NE(lines[0], lines[1]);
    for (const std::string& channel : lines) {
        EXPECT_TRUE(std::regex_match(channel, tagged)) << channel;
    }
    const stopwatch watch;
    writer.unlock();
    ASSERT_TRUE(eventually([&] { return got.load() == 2; }, 3s)) << "not woken by the release";
    EXPECT_LT(watch.elapsed(), 3s);
    // Messages arrive in order: the marker comes first only if no release published here.
    ASSERT_EQ(srv.cli({"SPUBLISH", "{own}:released", "marker"}), "1");
    EXPECT_EQ(shared_channel.next(), "marker");
    readers.clear();
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// Threads of one client that wait for one name queue locally: one entry in Redis, for every
// kind (readers behind a writer too).
TEST(Waiting, ThreadsOfOneProcessPutOneWaiterInRedis) {
    redis_server srv;
    for (kind k : {kind::simple, kind::reentrant, kind::writer, kind::reader}) {
        SCOPED_TRACE(kind_name(k));
        srv.flushall();
        redislock::client holder_client{srv.uri()};
        redislock::client client{srv.uri()};
        any_lock holder = make_lock(holder_client, k == kind::reader ? kind::writer : k, "gate");
        ASSERT_TRUE(holder.try_lock_for(0ms));
        constexpr int threads = 4;
        std::atomic<int> started{0};
        std::atomic<int> acquired{0};
        std::vector<std::jthread> pool;
        for (int i = 0; i < threads; ++i) {
            pool.emplace_back([&] {
                any_lock lock = make_lock(client, k, "gate");
                ++started;
                if (lock.try_lock_for(20s)) {
                    ++acquired;
                    lock.unlock();
                }
            });
        }
        ASSERT_TRUE(eventually([&] { return started.load() == threads; }));
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{gate}:queue") == 1; }));
        std::this_thread::sleep_for(200ms);  // time for any other thread to (wrongly) queue too
        EXPECT_EQ(zcard(srv, "{gate}:queue"), 1);
        holder.unlock();
        pool.clear();
        EXPECT_EQ(acquired.load(), threads);
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// Waiters of separate clients (as separate processes would) get the lock in arrival order,
// and a holder that locks again at once queues behind them.
TEST(Waiting, WaitersGoInArrivalOrder) {
    redis_server srv;
    for (kind k : {kind::simple, kind::reentrant, kind::writer}) {
        SCOPED_TRACE(kind_name(k));
        srv.flushall();
        redislock::client holder_client{srv.uri()};
        any_lock holder = make_lock(holder_client, k, "fifo");
        ASSERT_TRUE(holder.try_lock_for(0ms));
        constexpr int waiters = 3;
        std::vector<std::unique_ptr<redislock::client>> clients;
        std::vector<std::thread> pool;
        std::mutex order_mutex;
        std::vector<int> order;
        for (int i = 0; i < waiters; ++i) {
            clients.push_back(std::make_unique<redislock::client>(srv.uri()));
            any_lock lock = make_lock(*clients.back(), k, "fifo");
            pool.emplace_back([&, lock, i] {
                if (lock.try_lock_for(20s)) {
                    {
                        std::lock_guard guard{order_mutex};
                        order.push_back(i);
                    }
                    std::this_thread::sleep_for(20ms);
                    lock.unlock();
                }
            });
            ASSERT_TRUE(eventually([&] { return zcard(srv, "{fifo}:queue") == i + 1; }));
        }
        holder.unlock();
        EXPECT_FALSE(holder.try_lock_for(0ms)) << "a try barged past the queue";
        for (auto& t : pool) {
            t.join();
        }
        EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// Two writers locking in a loop do not starve a reader, and readers in a loop do not starve a
// writer (phase-fair through the queue).
TEST(Waiting, NeitherReadersNorWritersStarve) {
    redis_server srv;
    for (const bool readers_loop : {false, true}) {
        SCOPED_TRACE(readers_loop ? "readers loop, a writer waits"
                                  : "writers loop, a reader waits");
        srv.flushall();
        std::atomic<bool> stop{false};
        std::vector<std::thread> loopers;
        std::atomic<int> rounds{0};
        for (int i = 0; i < 2; ++i) {
            loopers.emplace_back([&] {
                redislock::client client{srv.uri()};
                auto rw = client.shared_mutex("phase");
                while (!stop) {
                    if (readers_loop ? rw.try_lock_shared_for(5s) : rw.try_lock_for(5s)) {
                        ++rounds;
                        std::this_thread::sleep_for(2ms);
                        readers_loop ? rw.unlock_shared() : rw.unlock();
                    }
                }
            });
        }
        ASSERT_TRUE(eventually([&] { return rounds.load() > 20; }));
        redislock::client client{srv.uri()};
        auto rw = client.shared_mutex("phase");
        const bool got = readers_loop ? rw.try_lock_for(5s) : rw.try_lock_shared_for(5s);
        EXPECT_TRUE(got);
        if (got) {
            readers_loop ? rw.unlock() : rw.unlock_shared();
        }
        stop = true;
        for (auto& t : loopers) {
            t.join();
        }
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// Writers that leave the lock no gap (4 threads of 2 clients: while one holds, the next of each
// client already waits) do not starve a reader either: queued by arrival, it lets in only the
// writers queued before it joined, at most one per client (the others wait in their client's
// local gate), and none that came after it.
TEST(Waiting, ReaderAmongGaplessWritersWaitsOnlyForThoseQueuedBeforeIt) {
    using clock = std::chrono::steady_clock;
    redis_server srv;
    constexpr int writer_clients = 2;
    constexpr int writers_per_client = 2;
    std::vector<std::unique_ptr<redislock::client>> clients;
    for (int i = 0; i < writer_clients; ++i) {
        clients.push_back(std::make_unique<redislock::client>(srv.uri()));
    }
    std::mutex times_mutex;
    std::vector<clock::time_point> acquisitions;  // when each writer's lock() returned
    std::vector<std::jthread> writers;
    for (int i = 0; i < writer_clients * writers_per_client; ++i) {
        writers.emplace_back([&, &client = *clients[i % writer_clients]](std::stop_token stop) {
            auto rw = client.shared_mutex("gapless");
            const auto give_up = clock::now() + 60s;
            for (int round = 0; round < 100'000 && !stop.stop_requested() && clock::now() < give_up;
                 ++round) {
                if (rw.try_lock_for(10s, stop)) {
                    {
                        std::lock_guard guard{times_mutex};
                        acquisitions.push_back(clock::now());
                    }
                    std::this_thread::sleep_for(2ms);
                    rw.unlock();
                }
            }
        });
    }
    const auto rounds = [&] {
        std::lock_guard guard{times_mutex};
        return acquisitions.size();
    };
    ASSERT_TRUE(eventually([&] { return rounds() > 50; }));

    // The reader's client notes when its first attempt that joins the queue is sent (ARGV[9] of
    // shared_acquire.lua, after EVALSHA, its digest, the key count and the keys, is '0' for one
    // that does not).
    hooked_connection conn{std::make_shared<redislock::hiredis_connection>(srv.uri())};
    std::atomic<clock::rep> joined{0};
    *conn.fail_before = [&](redislock::command argv) {
        if (!is_script(argv, redislock::detail::scripts::shared_acquire) || argv.size() < 3) {
            return false;
        }
        const std::size_t keep = 3 + std::stoul(std::string{argv[2]}) + 8;
        if (argv.size() > keep && argv[keep] != "0") {
            clock::rep none = 0;
            joined.compare_exchange_strong(none, clock::now().time_since_epoch().count());
        }
        return false;
    };
    redislock::basic_client<hooked_connection> reader_client{conn};
    auto reader = reader_client.shared_mutex("gapless");
    // A try that finds the lock free between two writers gets in without queueing, which says
    // nothing about the order: read again until a read queued (a few times at most).
    bool got = false;
    clock::time_point got_at;
    for (int round = 0; round < 5 && joined.load() == 0; ++round) {
        got = reader.try_lock_shared_for(10s);
        got_at = clock::now();
        if (!got) {
            break;
        }
        reader.unlock_shared();
    }
    for (auto& w : writers) {
        w.request_stop();
    }
    writers.clear();
    ASSERT_TRUE(got) << "the reader starved";
    ASSERT_NE(joined.load(), 0) << "the writers left a gap: the reader got in without queueing";
    const clock::time_point joined_at{clock::duration{joined.load()}};
    const auto let_in = std::count_if(acquisitions.begin(), acquisitions.end(),
                                      [&](auto at) { return at > joined_at && at < got_at; });
    // A slack of 4: a writer the server let in before the reader joined may return after, and a
    // reader woken later than its grace (on a loaded machine) loses its turn. One let in
    // regardless of arrival order would starve here, or see hundreds of writers go first.
    EXPECT_LE(let_in, writer_clients + 4);
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// A waiter that gives up (deadline or stop request) leaves the queue, and one standing first
// lets the next waiter go at once rather than after its entry lapses.
TEST(Waiting, WaitersThatGiveUpLeaveNothingBehind) {
    redis_server srv;
    redislock::client holder_client{srv.uri()};
    redislock::client client{srv.uri()};
    auto holder = holder_client.mutex("quit", {.lease = 5s});
    ASSERT_TRUE(holder.try_lock());
    auto timed = client.mutex("quit");
    EXPECT_FALSE(timed.try_lock_for(300ms));
    std::stop_source source;
    std::thread stopper{[&] {
        std::this_thread::sleep_for(300ms);
        source.request_stop();
    }};
    auto stopped = client.mutex("quit");
    const stopwatch watch;
    EXPECT_FALSE(
        stopped.try_lock_until(std::chrono::steady_clock::now() + 10s, source.get_token()));
    EXPECT_LT(watch.elapsed(), 3s);
    stopper.join();
    EXPECT_TRUE(eventually([&] { return srv.cli({"EXISTS", "{quit}:queue"}) == "0"; }, 3s));
    holder.unlock();
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// Readers and writers that give up (deadline or stop request) after joining the queue of a
// read-write lock leave it, and add no field to the lock's hash: once the holder releases,
// nothing is left. A writer waits behind a reader, a reader only behind a writer.
TEST(Waiting, ReadWriteWaitersThatGiveUpLeaveNothingBehind) {
    redis_server srv;
    redislock::client holder_client{srv.uri()};
    redislock::client client{srv.uri()};
    for (const bool write_held : {true, false}) {
        SCOPED_TRACE(write_held ? "held by a writer" : "held by a reader");
        auto holder = holder_client.shared_mutex("quit", {.lease = 30s});
        ASSERT_TRUE(write_held ? holder.try_lock() : holder.try_lock_shared());
        const std::string fields = srv.cli({"HKEYS", "quit"});
        auto waiter = client.shared_mutex("quit");
        std::vector<bool> readers{false};
        if (write_held) {
            readers.push_back(true);
        }
        for (const bool reader : readers) {
            SCOPED_TRACE(reader ? "reader" : "writer");
            {
                std::atomic<bool> got{true};
                std::jthread timed{[&] {
                    got = reader ? waiter.try_lock_shared_for(1s) : waiter.try_lock_for(1s);
                }};
                ASSERT_TRUE(eventually([&] { return zcard(srv, "{quit}:queue") == 1; }));
                timed.join();
                EXPECT_FALSE(got.load());
                EXPECT_TRUE(eventually([&] { return zcard(srv, "{quit}:queue") == 0; }, 3s));
            }
            {
                std::atomic<bool> got{true};
                std::atomic<bool> ended{false};
                // Stopped by its own stop source, also when an assertion ends the test.
                std::jthread stopped{[&](std::stop_token stop) {
                    got = reader ? waiter.lock_shared(stop) : waiter.lock(stop);
                    ended = true;
                }};
                ASSERT_TRUE(eventually([&] { return zcard(srv, "{quit}:queue") == 1; }));
                stopped.request_stop();
                EXPECT_TRUE(eventually([&] { return ended.load(); }, 3s))
                    << "the stop request was missed";
                stopped.join();
                EXPECT_FALSE(got.load());
                EXPECT_TRUE(eventually([&] { return zcard(srv, "{quit}:queue") == 0; }, 3s));
            }
        }
        EXPECT_EQ(srv.cli({"EXISTS", "{quit}:queue", "{quit}:waiting"}), "0");
        EXPECT_EQ(srv.cli({"HKEYS", "quit"}), fields);
        write_held ? holder.unlock() : holder.unlock_shared();
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// The head of the queue gives up: the one behind it gets the lock at the next release, not after
// the head's entry lapses.
TEST(Waiting, HeadThatGivesUpPassesTheLockOn) {
    redis_server srv;
    redislock::client holder_client{srv.uri()};
    redislock::client first_client{srv.uri()};
    redislock::client second_client{srv.uri()};
    const lock_options slow{.lease = 20s, .backoff_min = 5s, .backoff_max = 10s};
    auto holder = holder_client.mutex("pass", slow);
    auto first = first_client.mutex("pass", slow);
    auto second = second_client.mutex("pass", slow);
    ASSERT_TRUE(holder.try_lock());
    std::stop_source give_up;
    std::thread t1{[&] {
        if (first.try_lock_until(std::chrono::steady_clock::now() + 20s, give_up.get_token())) {
            first.unlock();  // the hand-over won the race with the stop: unlock hands it on
        }
    }};
    ASSERT_TRUE(eventually([&] { return zcard(srv, "{pass}:queue") == 1; }));
    waiting_thread t2{second, 20s};
    ASSERT_TRUE(eventually([&] { return zcard(srv, "{pass}:queue") == 2; }));
    give_up.request_stop();
    t1.join();
    holder.unlock();
    EXPECT_TRUE(eventually([&] { return t2.got(); }, 5s));
    t2.join();
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// Reentrant waiters whose short waits keep ending around the releases that hand them the lock:
// an entry handed to a call that gave up is handed on, never held by two, and nothing is left.
TEST(Waiting, ReentrantWaitersGivingUpAroundHandOversNeverOverlapAndLeaveNothing) {
    redis_server srv;
    constexpr int threads = 3;
    constexpr int rounds = 150;
    std::atomic<int> inside{0};
    std::atomic<int> overlaps{0};
    std::atomic<int> not_held{0};
    std::atomic<int> taken{0};
    std::vector<std::jthread> workers;
    for (int t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
            redislock::client client{srv.uri()};
            // A lease longer than the final check waits: an entry left behind would still be there.
            auto m = client.recursive_mutex("brief", {.lease = 30s});
            for (int round = 0; round < rounds; ++round) {
                // So short a wait may end inside a round trip: the call then throws the timeout
                // (its attempt's outcome unknown), which is given up like any other.
                bool got = false;
                try {
                    got = m.try_lock_for(std::chrono::microseconds{500 + 700 * ((round + t) % 4)});
                } catch (const redislock::timeout_error&) {
                }
                if (!got) {
                    continue;
                }
                if (inside.fetch_add(1) != 0) {
                    overlaps.fetch_add(1);
                }
                // Not a hand-over it only believes in (the grace that keeps others out would
                // hide that from the overlap count).
                if (!m.verify()) {
                    not_held.fetch_add(1);
                }
                std::this_thread::sleep_for(300us);
                inside.fetch_sub(1);
                taken.fetch_add(1);
                m.unlock();
            }
        });
    }
    workers.clear();
    EXPECT_EQ(overlaps.load(), 0);
    EXPECT_EQ(not_held.load(), 0);
    EXPECT_GT(taken.load(), 0);
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// A holder that enters again through another object of its own is a re-entry, not a waiter:
// it must not queue behind the threads that wait for its own release.
TEST(Waiting, ReentryThroughAnotherObjectPassesTheLocalGate) {
    redis_server srv;
    redislock::client client{srv.uri()};
    auto first = client.recursive_mutex("again");
    auto second = client.recursive_mutex("again");
    auto rw_first = client.shared_mutex("again-rw");
    auto rw_second = client.shared_mutex("again-rw");
    first.lock();
    rw_first.lock_shared();
    std::atomic<bool> stop{false};
    std::thread waiter{[&] {
        auto other = client.recursive_mutex("again");
        auto other_rw = client.shared_mutex("again-rw");
        while (!stop) {
            if (other.try_lock_for(100ms)) {
                other.unlock();
            }
            if (other_rw.try_lock_for(100ms)) {
                other_rw.unlock();
            }
        }
    }};
    ASSERT_TRUE(eventually([&] { return zcard(srv, "{again}:queue") == 1; }));
    EXPECT_TRUE(second.try_lock_for(2s));
    second.unlock();
    ASSERT_TRUE(eventually([&] { return zcard(srv, "{again-rw}:queue") == 1; }));
    EXPECT_TRUE(rw_second.try_lock_shared_for(2s));
    rw_second.unlock_shared();
    stop = true;
    waiter.join();
    first.unlock();
    rw_first.unlock_shared();
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// A holder entering again through another object, whose first attempt meets a transient
// error, must not then queue in the local gate behind a thread waiting for its own release.
TEST(Waiting, ReentryAfterATransientErrorStillPassesTheLocalGate) {
    redis_server srv;
    hooked_connection conn{std::make_shared<redislock::hiredis_connection>(srv.uri())};
    redislock::basic_client<hooked_connection> client{conn};
    auto held = client.recursive_mutex("gate-again");
    auto waiting = client.recursive_mutex("gate-again");
    auto again = client.recursive_mutex("gate-again");
    // Set before any other thread uses the connection; armed later through the counter.
    std::atomic<int> failures{0};
    *conn.fail_before = [&](redislock::command argv) {
        return is_script(argv, redislock::detail::scripts::recursive_acquire) &&
               failures.exchange(0) == 1;
    };
    held.lock();
    std::thread waiter{[&] {
        if (waiting.try_lock_for(4s)) {
            waiting.unlock();
        }
    }};
    ASSERT_TRUE(eventually([&] { return zcard(srv, "{gate-again}:queue") == 1; }));
    failures = 1;
    const stopwatch watch;
    EXPECT_TRUE(again.try_lock_for(2s));
    EXPECT_LT(watch.elapsed(), 1500ms);
    again.unlock();
    held.unlock();
    waiter.join();
    EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
}

// The queue's lapse times (`{name}:waiting`) lost (evicted under an allkeys-* policy; DEL here)
// while a waiter that never comes heads the queue, before or after the release that told it to
// go: that head is pruned within a bounded time (2 s), the lock goes to the waiter behind it,
// which sleeps meanwhile rather than poll. The holder is released at script level with a grace
// of 3 s, so the lapse times are surely lost while the lock is kept for the dead head.
TEST(Waiting, LostLapseTimesNeverJamTheQueueBehindAHeadThatDoesNotCome) {
    redis_server srv;
    for (const bool lost_before_release : {true, false}) {
        SCOPED_TRACE(lost_before_release ? "lost before the release" : "lost after it");
        srv.flushall();
        redislock::client holder_client{srv.uri()};
        ASSERT_EQ(srv.cli({"SET", "jam", "holder", "PX", "2000"}), "OK");
        // A waiter that never comes: queued at script level, as a lock() call that then died was.
        const redislock::reply queued = redislock::detail::run_script(
            holder_client.connection(), redislock::detail::scripts::mutex_acquire,
            std::array<std::string_view, 3>{"jam", "{jam}:queue", "{jam}:waiting"},
            std::array<std::string_view, 7>{"dead-token", "30000", "0", "wdead", "2000",
                                            "{jam}:released", "100"});
        ASSERT_TRUE(queued.is_array()) << queued.text();
        ASSERT_EQ(queued.elements().at(0).as_integer(), 0);

        std::atomic<int> attempts{0};
        redislock::client client{srv.uri(), {.on_event = [&](const redislock::lock_event& e) {
                                     if (e.type == redislock::event_type::contended) {
                                         ++attempts;
                                     }
                                 }}};
        auto m = client.mutex("jam");
        std::atomic<bool> acquired{false};
        std::atomic<std::int64_t> waited_ms{0};
        std::string failure;
        std::jthread waiter{[&] {
            const stopwatch watch;
            try {
                acquired = m.try_lock_for(6s);
            } catch (const redislock::error& e) {
                failure = e.what();
            }
            waited_ms = watch.elapsed().count();
            if (acquired) {
                m.unlock();
            }
        }};
        ASSERT_TRUE(eventually([&] { return zcard(srv, "{jam}:queue") == 2; }));
        if (lost_before_release) {
            ASSERT_EQ(srv.cli({"DEL", "{jam}:waiting"}), "1");
        }
        // Released at script level with a grace of 3 s, so that the lapse times are surely lost
        // while the lock is kept for the dead head, however slow the machine.
        const redislock::reply released = redislock::detail::run_script(
            holder_client.connection(), redislock::detail::scripts::mutex_release,
            std::array<std::string_view, 3>{"jam", "{jam}:queue", "{jam}:waiting"},
            std::array<std::string_view, 3>{"holder", "{jam}:released", "3000"});
        ASSERT_EQ(released, redislock::reply::integer(2));  // tells the dead head
        if (!lost_before_release) {
            ASSERT_EQ(srv.cli({"DEL", "{jam}:waiting"}), "1");
        }
        waiter.join();
        EXPECT_EQ(failure, "");
        EXPECT_TRUE(acquired) << "the queue stayed jammed for " << waited_ms << " ms";
        EXPECT_LT(attempts.load(), 20) << "the waiter polled";
        EXPECT_TRUE(eventually([&] { return nothing_left(srv); }));
    }
}

// A holder key that is not ours, of the kind's type, with a TTL longer than any lease: past
// 2^63 ns (about 292 years) the time it asks a waiter to wait overflows a steady_clock time
// point, and from 10^17 ms (Redis 7.0; 10^14 ms elsewhere) Lua hands the queue's PEXPIRE a
// float it refuses. A timed call waits it out like any holder: it returns false at its
// deadline, without an error and without polling, and leaves nothing behind.
TEST(Waiting, HolderWithATtlOfCenturiesIsWaitedForWithoutAnErrorOrPolling) {
    redis_server srv;
    for (kind k : {kind::simple, kind::reentrant, kind::writer, kind::reader}) {
        for (const std::string ttl : {"10000000000000", "200000000000000", "200000000000000000"}) {
            SCOPED_TRACE(std::string{kind_name(k)} + ", TTL " + ttl + " ms");
            srv.flushall();
            std::istringstream time{srv.cli({"TIME"})};
            long long seconds = 0;
            long long micros = 0;
            time >> seconds >> micros;
            const std::string expiry =
                std::to_string(seconds * 1000 + micros / 1000 + std::stoll(ttl));
            switch (k) {
                case kind::simple:
                    ASSERT_EQ(srv.cli({"SET", "far", "foreign"}), "OK");
                    break;
                case kind::reentrant:
                    ASSERT_EQ(srv.cli({"HSET", "far", "other-owner", "1", "id:other-owner", "a1"}),
                              "2");
                    break;
                case kind::writer:
                case kind::reader:
                    ASSERT_EQ(srv.cli({"HSET", "far", "mode", "write", "w:other-owner",
                                       "1 " + expiry + " a1"}),
                              "2");
                    break;
            }
            ASSERT_EQ(srv.cli({"PEXPIRE", "far", ttl}), "1");

            std::atomic<int> attempts{0};
            redislock::client client{srv.uri(), {.on_event = [&](const redislock::lock_event& e) {
                                         if (e.type == redislock::event_type::contended) {
                                             ++attempts;
                                         }
                                     }}};
            any_lock waiter = make_lock(client, k, "far");
            bool acquired = true;
            try {
                acquired = waiter.try_lock_for(300ms);
            } catch (const redislock::error& e) {
                ADD_FAILURE() << "the wait ended in " << e.what();
            }
            EXPECT_FALSE(acquired);
            EXPECT_LE(attempts.load(), 3) << "the waiter polled";
            // The waiter's queue entry goes with it; the holder's key stays, for as long as it
            // had (a read-write lock's TTL follows its latest entry, cut to the longest lease).
            EXPECT_TRUE(eventually([&] { return srv.cli({"DBSIZE"}) == "1"; }))
                << srv.cli({"KEYS", "*"});
            const long long longest = redislock::max_lease.count();
            const long long kept = k == kind::simple || k == kind::reentrant
                                       ? std::stoll(ttl)
                                       : std::min(std::stoll(ttl), longest);
            EXPECT_GT(std::stoll(srv.cli({"PTTL", "far"})), kept - 60'000);
        }
    }
}

TEST(Waiting, UncontendedLocksTouchNoQueue) {
    redis_server srv;
    redislock::client client{srv.uri()};
    (void)srv.cli({"CONFIG", "RESETSTAT"});
    auto m = client.mutex("calm");
    for (int i = 0; i < 10; ++i) {
        m.lock();
        m.unlock();
    }
    const std::string stats = srv.cli({"INFO", "commandstats"});
    EXPECT_EQ(stats.find("cmdstat_spublish"), std::string::npos) << stats;
    EXPECT_EQ(stats.find("cmdstat_ssubscribe"), std::string::npos) << stats;
    EXPECT_TRUE(nothing_left(srv));
}

// A subscriber link whose server the test plays: it keeps what the notifier sends, and its read()
// returns the replies the test queued, its fd readable while some are queued.
struct scripted_wire {
    std::mutex mutex;
    std::vector<std::string> sent;  // "VERB channel"
    std::vector<redislock::reply> queued;
    bool broken = false;             // the next read() finds the connection closed
    bool closes_after_send = false;  // a send() breaks it (as a server at maxclients does)
    std::string error_after_send;    // a send() is answered so
    int pipe[2]{-1, -1};

    scripted_wire() {
        if (::pipe(pipe) != 0) {
            throw std::runtime_error{"pipe"};
        }
    }
    ~scripted_wire() {
        ::close(pipe[0]);
        ::close(pipe[1]);
    }
    void push(redislock::reply r) {
        std::lock_guard guard{mutex};
        queued.push_back(std::move(r));
        (void)!::write(pipe[1], "x", 1);
    }
    std::size_t count(const std::string& what) {
        std::lock_guard guard{mutex};
        return static_cast<std::size_t>(std::count(sent.begin(), sent.end(), what));
    }
};

class scripted_link final : public redislock::subscriber_link {
public:
    explicit scripted_link(std::shared_ptr<scripted_wire> wire) : wire_{std::move(wire)} {}
    int fd() const noexcept override { return wire_->pipe[0]; }
    void send(redislock::command argv) override {
        std::lock_guard guard{wire_->mutex};
        wire_->sent.push_back(std::string{argv[0]} + " " + std::string{argv[1]});
        if (wire_->closes_after_send) {
            wire_->broken = true;
            (void)!::write(wire_->pipe[1], "x", 1);
        } else if (!wire_->error_after_send.empty()) {
            wire_->queued.push_back(redislock::reply::error(wire_->error_after_send));
            (void)!::write(wire_->pipe[1], "x", 1);
        }
    }
    void read(std::vector<redislock::reply>& out) override {
        std::lock_guard guard{wire_->mutex};
        if (wire_->broken) {
            throw redislock::connection_error{"injected: closed by the server"};
        }
        char drained[64];
        for (std::size_t i = 0; i < wire_->queued.size(); ++i) {
            (void)!::read(wire_->pipe[0], drained, 1);
        }
        for (auto& r : wire_->queued) {
            out.push_back(std::move(r));
        }
        wire_->queued.clear();
    }

private:
    std::shared_ptr<scripted_wire> wire_;
};

redislock::reply push_message(const char* kind, const std::string& channel) {
    using redislock::reply;
    return reply::array({reply::string(kind), reply::string(channel), reply::integer(0)});
}

// A notifier on one scripted link, for waiter 'w@1' of lock 'lk'. Its refusal reports are kept
// as "name: why", and `after_report` runs after each. With `node_throws` set, naming a channel's
// node throws; with `open_throws` set, opening a link does, and with `down_throws` opening one
// for a channel starting "down" does, after `down_delay`, until `down_moved` names another node
// for it (`opens` counts the tries). The node of every channel is "node"; with
// `node_per_channel` set, the channel itself, but none ("") for a channel starting "unserved". Made
// with `names_nodes` false, the notifier has no node namer, as for a connection to one server.
struct scripted_notifier {
    explicit scripted_notifier(bool names_nodes = true) : names_nodes{names_nodes} {}

    bool names_nodes;
    std::shared_ptr<scripted_wire> wire = std::make_shared<scripted_wire>();
    std::atomic<bool> node_throws{false};
    std::atomic<bool> node_per_channel{false};
    std::atomic<bool> open_throws{false};
    std::atomic<bool> down_throws{false};
    std::atomic<bool> down_moved{false};  // a "down" channel's slot moved to node "elsewhere"
    std::chrono::milliseconds down_delay{0};
    std::atomic<int> opens{0};
    std::mutex reports_mutex;
    std::vector<std::string> reports;
    std::function<void()> after_report = [] {};
    redislock::detail::notifier notifier{
        [this](std::string_view channel) {
            ++opens;
            const bool down = down_throws && channel.starts_with("down") && !down_moved;
            if (down) {
                std::this_thread::sleep_for(down_delay);
            }
            if (open_throws || down) {
                throw redislock::connection_error{"injected: connection refused"};
            }
            return std::make_unique<scripted_link>(wire);
        },
        names_nodes ? redislock::detail::notifier::node_namer{[this](std::string_view channel) {
            if (node_throws) {
                throw std::runtime_error{"injected: no node"};
            }
            if (channel.starts_with("unserved")) {
                return std::string{};
            }
            if (down_moved && channel.starts_with("down")) {
                return std::string{"elsewhere"};
            }
            return node_per_channel ? std::string{channel} : "node";
        }}
                    : redislock::detail::notifier::node_namer{},
        {},
        [this](std::string_view name, std::string_view why) {
            {
                std::lock_guard guard{reports_mutex};
                reports.push_back(std::string{name} + ": " + std::string{why});
            }
            after_report();
        }};
    std::shared_ptr<redislock::detail::wake_slot> slot =
        std::make_shared<redislock::detail::wake_slot>(100ms);

    bool enroll(const std::string& channel, std::chrono::milliseconds budget) {
        return notifier.enroll(channel, "lk", "w@1", slot,
                               std::chrono::steady_clock::now() + budget, {});
    }
    // The same for waiter 'w@2' of lock 'other'.
    std::shared_ptr<redislock::detail::wake_slot> other_slot =
        std::make_shared<redislock::detail::wake_slot>(100ms);
    bool enroll_other(const std::string& channel, std::chrono::milliseconds budget) {
        return notifier.enroll(channel, "other", "w@2", other_slot,
                               std::chrono::steady_clock::now() + budget, {});
    }
    // Replies that come in one read.
    void push(std::vector<redislock::reply> replies) {
        std::lock_guard guard{wire->mutex};
        for (auto& r : replies) {
            wire->queued.push_back(std::move(r));
            (void)!::write(wire->pipe[1], "x", 1);
        }
    }
    std::vector<std::string> reported() {
        std::lock_guard guard{reports_mutex};
        return reports;
    }
};

// The server confirming a subscription and dropping the channel right after (its slot moved),
// both read at once, lets the waiter in enroll() go at once, to poll and enroll anew, instead of
// at the end of its budget. (Whether it saw the short-lived confirmation first is a race.)
TEST(Notifier, ChannelDroppedRightAfterItsConfirmationEndsTheEnrollment) {
    scripted_notifier n;
    std::atomic<bool> done{false};
    std::jthread waiter{[&] {
        (void)n.enroll("ch", 10s);
        done = true;
    }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE ch") == 1; }));
    n.push({push_message("ssubscribe", "ch"), push_message("sunsubscribe", "ch")});
    EXPECT_TRUE(eventually([&] { return done.load(); }, 3s)) << "enroll() waited for its budget";
    waiter.join();
    EXPECT_TRUE(eventually([&] { return !n.slot->subscribed(); }));
    n.notifier.withdraw("ch", "w@1");
}

// A drop the server announces while an SSUBSCRIBE of the same channel is still unanswered (the
// answer to an earlier SUNSUBSCRIBE) does not shift which channel a later error refuses.
TEST(Notifier, StrayDropDoesNotShiftTheNextRefusal) {
    scripted_notifier n;
    std::jthread first{[&] { (void)n.enroll("a", 3s); }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE a") == 1; }));
    std::jthread second{[&] { (void)n.enroll_other("b", 3s); }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE b") == 1; }));
    n.push({push_message("sunsubscribe", "a"), redislock::reply::error("MOVED 1 127.0.0.1:1"),
            push_message("ssubscribe", "b")});
    ASSERT_TRUE(eventually([&] { return !n.reported().empty(); }));
    const std::vector<std::string> expected{"lk: MOVED 1 127.0.0.1:1"};
    EXPECT_EQ(n.reported(), expected);
}

// A channel subscribed again after a stray drop awaits two answers; the first confirmation
// accounts for one of them only, so an error after it still refuses that channel.
TEST(Notifier, ChannelAwaitingTwoAnswersIsConfirmedOnce) {
    scripted_notifier n;
    std::jthread first{[&] {
        (void)n.enroll("a", 3s);  // let go by the drop below
        (void)n.enroll("a", 3s);  // sent again
    }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE a") == 1; }));
    n.push({push_message("sunsubscribe", "a")});
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE a") == 2; }));
    std::jthread second{[&] { (void)n.enroll_other("b", 3s); }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE b") == 1; }));
    n.push({push_message("ssubscribe", "a"), redislock::reply::error("MOVED 1 127.0.0.1:1"),
            push_message("ssubscribe", "b")});
    ASSERT_TRUE(eventually([&] { return !n.reported().empty(); }));
    const std::vector<std::string> expected{"lk: MOVED 1 127.0.0.1:1"};
    EXPECT_EQ(n.reported(), expected);
}

// A hook that stops the notifier (as dropping the last reference to its client does, on its
// thread) is not called again: refusals still queued are dropped, since what the hook reports
// to may be gone.
TEST(Notifier, NoReportAfterTheHookStoppedTheNotifier) {
    scripted_notifier n;
    n.after_report = [&] { n.notifier.stop(); };
    std::jthread first{[&] { (void)n.enroll("a", 3s); }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE a") == 1; }));
    std::jthread second{[&] { (void)n.enroll_other("b", 3s); }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE b") == 1; }));
    n.push({redislock::reply::error("NOPERM a"), redislock::reply::error("NOPERM b")});
    first.join();
    second.join();
    std::this_thread::sleep_for(200ms);
    EXPECT_EQ(n.reported().size(), 1u);
}

// A channel the server refused (NOPERM: no rights to it under an ACL) is not asked for again
// before its pause is over, even once its waiters have all left: every new wait would otherwise
// pay a refused subscription.
TEST(Notifier, RefusedChannelStaysRefusedAfterItsWaitersLeave) {
    scripted_notifier n;
    std::atomic<bool> done{false};
    std::jthread waiter{[&] {
        EXPECT_FALSE(n.enroll("ch", 10s));
        done = true;
    }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE ch") == 1; }));
    n.wire->push(
        redislock::reply::error("NOPERM this user has no permissions to access the 'ch' "
                                "channel"));
    ASSERT_TRUE(eventually([&] { return done.load(); }, 3s));
    waiter.join();
    n.notifier.withdraw("ch", "w@1");
    // Rounds of the notifier's thread that find the channel without waiters (one every 200 ms).
    std::this_thread::sleep_for(700ms);
    const stopwatch watch;
    EXPECT_FALSE(n.enroll("ch", 3s));
    EXPECT_LT(watch.elapsed(), 2s);
    n.notifier.withdraw("ch", "w@1");
    std::this_thread::sleep_for(300ms);
    EXPECT_EQ(n.wire->count("SSUBSCRIBE ch"), 1u) << "subscribed again within the pause";
    const std::vector<std::string> expected{
        "lk: NOPERM this user has no permissions to access the 'ch' channel"};
    EXPECT_EQ(n.reported(), expected);
}

// A connection that cannot name a channel's node is reported like a refusal, with what it threw.
TEST(Notifier, ConnectionThatCannotNameTheNodeIsReported) {
    scripted_notifier n;
    n.node_throws = true;
    EXPECT_FALSE(n.enroll("ch", 3s));
    ASSERT_TRUE(eventually([&] { return !n.reported().empty(); }));
    EXPECT_EQ(n.reported().front(), "lk: injected: no node");
    EXPECT_EQ(n.wire->count("SSUBSCRIBE ch"), 0u);
    n.notifier.withdraw("ch", "w@1");
}

// Enrolls as waiter 'w@1' of lock 'lk' until the channel is subscribed (a paused node refuses
// enrollments at once for a while), for at most 5 s.
bool enroll_until_subscribed(scripted_notifier& n, const std::string& channel) {
    const auto give_up = std::chrono::steady_clock::now() + 5s;
    while (!n.enroll(channel, 1s)) {
        if (std::chrono::steady_clock::now() >= give_up) {
            return false;
        }
        std::this_thread::sleep_for(20ms);
    }
    return true;
}

// Enrolls as waiter 'w@1' of lock 'lk' again and again for `how_long`, each refused, as a waiter
// that polls does; then withdraws.
void enroll_refused_for(scripted_notifier& n, const std::string& channel,
                        std::chrono::milliseconds how_long) {
    const auto until = std::chrono::steady_clock::now() + how_long;
    while (std::chrono::steady_clock::now() < until) {
        EXPECT_FALSE(n.enroll(channel, 300ms));
        std::this_thread::sleep_for(10ms);
    }
    n.notifier.withdraw(channel, "w@1");
}

// A subscriber link that cannot be opened (its server out of reach, or refusing connections) is
// reported like a refusal, with what the connection threw: once while the tries keep failing,
// across the waits of that time, and again after the channel was subscribed in between.
TEST(Notifier, LinkThatCannotBeOpenedIsReportedOnceUntilSubscribedAgain) {
    scripted_notifier n;
    n.open_throws = true;
    const std::string told = "lk: could not open a subscriber link: injected: connection refused";
    for (int i = 0; i < 3; ++i) {
        EXPECT_FALSE(n.enroll("ch", 2s));
        n.notifier.withdraw("ch", "w@1");
        std::this_thread::sleep_for(500ms);  // rounds that forget the channel without waiters
    }
    EXPECT_GE(n.opens.load(), 2);
    ASSERT_TRUE(eventually([&] { return !n.reported().empty(); }));
    EXPECT_EQ(n.reported(), std::vector<std::string>{told});

    n.open_throws = false;
    std::jthread waiter{[&] { EXPECT_TRUE(enroll_until_subscribed(n, "ch")); }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE ch") == 1; }));
    n.push({push_message("ssubscribe", "ch")});
    waiter.join();

    n.open_throws = true;
    {
        std::lock_guard guard{n.wire->mutex};
        n.wire->broken = true;
    }
    n.wire->push(push_message("smessage", "ch"));
    ASSERT_TRUE(eventually([&] { return !n.slot->subscribed(); }));
    ASSERT_TRUE(eventually([&] {
        (void)n.enroll("ch", 300ms);
        return n.reported().size() == 2;
    }));
    EXPECT_EQ(n.reported().back(), told);
    n.notifier.withdraw("ch", "w@1");
}

// A link the server closes before it answered a subscription counts as a failed open: it is told
// once, and the node is left alone for a pause, instead of being connected to again at every try.
TEST(Notifier, LinkClosedBeforeSubscribingPausesItsNode) {
    scripted_notifier n;
    n.wire->closes_after_send = true;
    enroll_refused_for(n, "ch", 1500ms);
    EXPECT_GE(n.opens.load(), 2);
    EXPECT_LE(n.opens.load(), 9) << "a pause of 200 ms between the tries";
    const std::vector<std::string> expected{
        "lk: the subscriber link failed before subscribing: injected: closed by the server"};
    EXPECT_EQ(n.reported(), expected);
}

// A server at maxclients answers the first command of a new connection with an error (and closes
// it): told once per lock as the link's failure, not as a refusal of the channel too.
TEST(Notifier, ServerThatAnswersTheFirstSubscriptionWithAnErrorAndClosesIsToldOnce) {
    scripted_notifier n;
    n.wire->error_after_send = "ERR max number of clients reached";
    enroll_refused_for(n, "ch", 1s);
    EXPECT_GE(n.opens.load(), 2);
    const std::vector<std::string> expected{
        "lk: the subscriber link failed before subscribing: ERR max number of clients reached"};
    EXPECT_EQ(n.reported(), expected);
}

// A channel whose node timed out opening is named again soon, not after that node's whole pause:
// its slot may have moved to a node that answers (a Cluster failover).
TEST(Notifier, ChannelOfANodeThatTimedOutIsNamedAgainSoon) {
    scripted_notifier n;
    n.node_per_channel = true;
    n.down_throws = true;
    n.down_delay = 2s;  // the node is then left alone 2 s
    EXPECT_FALSE(n.enroll("down-x", 5s));
    ASSERT_EQ(n.opens.load(), 1);
    const stopwatch since_failure;
    n.down_moved = true;
    std::jthread waiter{[&] { EXPECT_TRUE(enroll_until_subscribed(n, "down-x")); }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE down-x") == 1; }, 5s));
    EXPECT_LT(since_failure.elapsed(), 1500ms) << "named again only after the node's pause";
    n.push({push_message("ssubscribe", "down-x")});
    waiter.join();
    n.notifier.withdraw("down-x", "w@1");
}

// A channel whose node the connection cannot name now (a Cluster slot no node serves) is refused
// at once, without an open, and its waiters are told.
TEST(Notifier, ChannelNoNodeServesIsRefusedWithoutAnOpen) {
    scripted_notifier n;
    EXPECT_FALSE(n.enroll("unserved", 3s));
    ASSERT_TRUE(eventually([&] { return !n.reported().empty(); }));
    EXPECT_EQ(n.reported().front(), "lk: no node serves the channel's slot now");
    EXPECT_EQ(n.opens.load(), 0);
    n.notifier.withdraw("unserved", "w@1");
}

// On a connection to one server (no node namer), every channel is on the one node "": a failed
// open is told for the locks someone waits for, not for one refused earlier and left since.
TEST(Notifier, FailedOpenIsToldOnlyForLocksSomeoneWaitsFor) {
    scripted_notifier n{false};
    std::jthread refused{[&] { EXPECT_FALSE(n.enroll_other("b", 3s)); }};
    ASSERT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE b") == 1; }));
    n.wire->push(redislock::reply::error("NOPERM b"));
    refused.join();
    n.notifier.withdraw("b", "w@2");

    n.open_throws = true;
    {
        std::lock_guard guard{n.wire->mutex};
        n.wire->broken = true;
    }
    n.wire->push(push_message("smessage", "b"));
    ASSERT_TRUE(eventually([&] {
        (void)n.enroll("ch", 300ms);
        return n.opens.load() >= 2 && n.reported().size() >= 2;
    }));
    n.notifier.withdraw("ch", "w@1");
    const std::vector<std::string> expected{
        "other: NOPERM b", "lk: could not open a subscriber link: injected: connection refused"};
    EXPECT_EQ(n.reported(), expected);
}

// A node whose link cannot be opened, even slowly, does not keep the links to other nodes from
// being opened.
TEST(Notifier, NodeThatCannotBeReachedDelaysNoOtherNode) {
    scripted_notifier n;
    n.node_per_channel = true;
    n.down_throws = true;
    n.down_delay = 250ms;  // longer than a round's tick
    std::atomic<bool> done{false};
    std::jthread down{[&] {
        while (!done) {
            (void)n.enroll("down", 300ms);  // first in the channels' order
            std::this_thread::sleep_for(10ms);
        }
        n.notifier.withdraw("down", "w@1");
    }};
    ASSERT_TRUE(eventually([&] { return n.opens.load() >= 2; }));
    std::jthread up{[&] { EXPECT_TRUE(n.enroll_other("up", 5s)); }};
    EXPECT_TRUE(eventually([&] { return n.wire->count("SSUBSCRIBE up") == 1; }, 3s))
        << "the other node's link was not opened";
    n.push({push_message("ssubscribe", "up")});
    up.join();
    done = true;
    down.join();
    n.notifier.withdraw("up", "w@2");
}

}  // namespace
