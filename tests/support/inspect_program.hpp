// redislock-inspect's run() (tools/inspect.hpp) driven as a user would drive the program: its
// arguments, what it reads from stdin, and what it prints.
#pragma once

#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inspect.hpp"

namespace redislock::test {

struct program_result {
    int status;
    std::string out;
    std::string err;
};

inline program_result run_inspect(std::vector<std::string_view> args, std::string input = {}) {
    std::istringstream in{std::move(input)};
    std::ostringstream out;
    std::ostringstream err;
    const int status = redislock::inspect::run(args, in, out, err);
    return {status, out.str(), err.str()};
}

inline bool contains(const std::string& text, std::string_view part) {
    return text.find(part) != std::string::npos;
}

}  // namespace redislock::test
