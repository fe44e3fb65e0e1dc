// redislock-torture: a seeded schedule explorer for redislock. See tools/torture/options.hpp for
// what it does and docs/operations.md for how to read what it prints.

#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <random>
#include <string_view>
#include <vector>

#include "torture/options.hpp"
#include "torture/report.hpp"
#include "torture/run.hpp"

namespace {

// Moves the process into a network namespace of its own with its loopback up: every server,
// proxy and client of the run lives there, so packet drops (iptables) touch nothing else, and
// vanish with the run. Needs root; false when not possible.
bool enter_private_network() {
    if (::geteuid() != 0 || ::unshare(CLONE_NEWNET) != 0) {
        return false;
    }
    const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        return false;
    }
    ifreq ifr{};
    std::strncpy(ifr.ifr_name, "lo", IFNAMSIZ - 1);
    bool up = ::ioctl(fd, SIOCGIFFLAGS, &ifr) == 0;
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
    up = up && ::ioctl(fd, SIOCSIFFLAGS, &ifr) == 0;
    ::close(fd);
    return up;
}

void on_signal(int) {
    redislock::torture::interrupted = 1;
}

}  // namespace

int main(int argc, char** argv) {
    using namespace redislock::torture;
    const std::vector<std::string_view> args(argv + 1, argv + argc);
    options o;
    try {
        o = parse_options(args);
    } catch (const std::exception& e) {
        std::cerr << "redislock-torture: " << e.what() << "\n" << usage_text;
        return 2;
    }
    if (o.help) {
        std::cout << usage_text;
        return 0;
    }
    const std::uint64_t seed =
        o.seed ? *o.seed : std::random_device{}() * 0x100000001ULL ^ std::random_device{}();
    const bool private_netns = o.netns && o.uri.empty() && enter_private_network();

    struct sigaction sa {};
    sa.sa_handler = on_signal;
    ::sigemptyset(&sa.sa_mask);
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    std::size_t violations = 0;
    std::size_t tool_errors = 0;
    for (const topology_kind kind : o.topologies) {
        if (interrupted != 0) {
            break;
        }
        try {
            const run_outcome r = run_one(o, kind, seed, private_netns, std::cout);
            violations += r.violations;
            tool_errors += r.tool_errors;
        } catch (const std::exception& e) {
            std::cout << "TOOL ERROR: " << to_string(kind) << ": " << e.what() << "\n";
            ++tool_errors;
        }
    }
    if (violations > 0 || tool_errors > 0 || interrupted != 0) {
        std::cout << "FAILED with seed " << seed_text(seed) << ": " << violations << " violations, "
                  << tool_errors << " tool errors" << (interrupted != 0 ? ", interrupted" : "")
                  << "\n";
    }
    if (interrupted != 0) {
        return 130;
    }
    return violations > 0 ? 1 : tool_errors > 0 ? 3 : 0;
}
