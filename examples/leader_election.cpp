// Leader election: candidates campaign for one lock; the winner leads while the watchdog keeps its
// lease, steps down when its term ends or as soon as the lock is lost, and campaigns again.
//
// Each candidate has its own client, as separate processes would. Halfway through, the example
// deletes the lock's key, as a failover that loses a write would: the leader of the moment hears
// of it at its next renewal (lost_token() is stopped) and steps down at once, or, if its term ends
// first, when it releases. Another candidate may be elected before that, so for a moment two
// believe they lead: the leader's writes carry its fencing token, which storage can check to
// refuse the older one.
//
// Usage: leader_election [redis://127.0.0.1:6379] [seconds (8)]

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <redislock/redislock.hpp>

using namespace std::chrono_literals;

namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::string_view leader_key = "example:leader";
constexpr int candidates = 3;

const clock_type::time_point started = clock_type::now();

void say(int candidate, const std::string& what) {
    static std::mutex output;
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - started);
    const std::string who =
        candidate > 0 ? "candidate " + std::to_string(candidate) : std::string{"operator"};
    std::lock_guard guard{output};
    std::printf("%6.2f s  %s: %s\n", static_cast<double>(ms.count()) / 1000.0, who.c_str(),
                what.c_str());
    std::fflush(stdout);
}

struct tally {
    std::atomic<int> elections{0};
    std::atomic<int> losses{0};
    std::atomic<int> failures{0};
};

// Leads until the term's steps are done, the run ends, or the lock is lost; returns the steps
// done. Waits on the lost token, so a loss interrupts a step at once.
int lead(std::stop_token lost, int term_steps, clock_type::time_point end) {
    std::mutex m;
    std::condition_variable_any wake;
    int steps = 0;
    while (steps < term_steps && clock_type::now() < end && !lost.stop_requested()) {
        // The leader's work goes here: e.g. one pass of a scheduler only one process may run.
        std::unique_lock guard{m};
        wake.wait_for(guard, lost, 300ms, [] { return false; });
        if (!lost.stop_requested()) {
            ++steps;
        }
    }
    return steps;
}

// The watchdog needs a lease of at least 6 command timeouts (docs/configuration.md, "Rules of
// thumb"), so a renewal that stalls can be retried twice before the lease runs out: for a 1.5 s
// lease, commands give up after 250 ms (the default, 2 s, would need a lease of 12 s).
constexpr auto lease = 1500ms;
constexpr auto command_timeout = 250ms;

redislock::endpoint server_of(const std::string& uri) {
    redislock::endpoint server = redislock::endpoint::from_uri(uri);
    server.command_timeout =
        std::min<std::chrono::milliseconds>(server.command_timeout, command_timeout);
    server.connect_timeout = std::min(server.connect_timeout, server.command_timeout);
    return server;
}

void campaign(const std::string& uri, int id, clock_type::time_point end, tally& counts) {
    try {
        redislock::client client{server_of(uri)};
        // A short lease, renewed by the watchdog every third of it: a crashed leader is replaced
        // within 1.5 s, a live one keeps the lock as long as it likes.
        auto lock = client.mutex(leader_key, {.lease = lease, .watchdog = true, .fencing = true});
        int term = 0;
        while (clock_type::now() < end) {
            const auto left = std::chrono::ceil<std::chrono::milliseconds>(end - clock_type::now());
            if (!lock.try_lock_for(std::min<std::chrono::milliseconds>(1s, left))) {
                continue;  // someone else leads; campaign again
            }
            counts.elections.fetch_add(1);
            const std::stop_token lost = lock.lost_token();
            say(id, "elected (fencing token " + std::to_string(lock.fencing_token()) + ")");
            // Terms of different lengths, so the candidates take turns in no fixed order.
            const int steps = lead(lost, 2 + (id + term++) % 4, end);
            const bool was_lost = lost.stop_requested();
            // After a loss unlock() only ends the object's hold: it never touches a new leader's
            // key. A loss not yet noticed when the term ended shows up here, as lock_lost.
            std::error_code released;
            lock.unlock(released);
            if (was_lost) {
                counts.losses.fetch_add(1);
                say(id, "lost the lock after " + std::to_string(steps) +
                            " step(s): stepped down at once");
            } else if (released == redislock::errc::lock_lost) {
                counts.losses.fetch_add(1);
                say(id, "stepped down after " + std::to_string(steps) +
                            " step(s), and found the lock already lost: its last steps may have "
                            "overlapped the next leader's");
            } else {
                say(id, "stepped down after " + std::to_string(steps) + " step(s)");
            }
            // Out of the next election for a moment, so another candidate can win it.
            std::this_thread::sleep_for(100ms);
        }
    } catch (const std::exception& e) {
        counts.failures.fetch_add(1);
        say(id, std::string{"failed: "} + e.what());
    }
}

// Deletes the leader's key once someone leads, as a failover that loses the write would.
void lose_the_key(const std::string& uri) {
    redislock::client client{uri};
    const std::array<std::string_view, 2> get{"GET", leader_key};
    const std::array<std::string_view, 2> del{"DEL", leader_key};
    for (int tries = 0; tries < 100; ++tries) {
        if (!client.connection().execute(get).is_nil()) {
            client.connection().execute(del).throw_if_error();
            say(0, "deleted the leader's key (as a failover that loses it would)");
            return;
        }
        std::this_thread::sleep_for(20ms);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const std::string uri = argc > 1 ? argv[1] : "redis://127.0.0.1:6379";
    int seconds = 8;
    if (argc > 2) {
        const std::string_view text{argv[2]};
        auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
        if (ec != std::errc{} || end != text.data() + text.size() || seconds < 1 || seconds > 600) {
            std::cerr << "usage: leader_election [uri] [seconds 1..600]\n";
            return 2;
        }
    }
    try {
        const auto end = clock_type::now() + std::chrono::seconds{seconds};
        tally counts;
        std::vector<std::jthread> threads;
        for (int id = 1; id <= candidates; ++id) {
            threads.emplace_back([&uri, id, end, &counts] { campaign(uri, id, end, counts); });
        }
        std::this_thread::sleep_for(std::chrono::seconds{seconds} / 2);
        lose_the_key(uri);
        threads.clear();  // joins: every candidate ends by `end`
        std::cout << counts.elections << " elections, " << counts.losses
                  << " term(s) ended with the lock lost\n";
        return counts.failures == 0 && counts.elections > 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
