// What the library needs of the platform, checked first so that a missing piece is named
// plainly instead of surfacing as an error deep inside a header.
#pragma once

#include <version>

#if !defined(__cpp_lib_jthread)
#error \
    "redislock needs C++20's <stop_token> (std::stop_source, std::stop_token): GCC >= 11 or clang >= 14 with libstdc++, or a libc++ that provides it, with -std=c++20"
#endif

#if !defined(__unix__) && !defined(__APPLE__)
#error "redislock runs on POSIX systems only (it uses sockets, poll(), fork handlers and pthreads)"
#endif
