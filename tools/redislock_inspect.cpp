// redislock-inspect URI NAME [--force-release [--yes] | --watch [--count N]]: shows a lock's kind,
// holders, waiting writers, waiters and fencing counter, again every second with --watch, and
// frees a stuck lock after confirmation.
// The program is tools/inspect.hpp's run(); see its usage text.

#include <iostream>
#include <string_view>
#include <vector>

#include "inspect.hpp"

int main(int argc, char** argv) {
    const std::vector<std::string_view> args(argv + 1, argv + argc);
    return redislock::inspect::run(args, std::cin, std::cout, std::cerr);
}
