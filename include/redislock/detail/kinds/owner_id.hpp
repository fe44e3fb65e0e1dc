// Owner ids of the reentrant kinds: "<client instance id>:<pid>:thread:<number>" for the calling
// thread, "<client instance id>:<pid>:owner:<id>" for an explicit lock_options::owner. The
// process id is part of it because a forked child inherits its parent's client (and so its
// instance id) and the forking thread's number: without it the child would re-enter locks its
// parent holds.
#pragma once

#include <unistd.h>

#include <array>
#include <atomic>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <redislock/detail/util/token.hpp>

namespace redislock::detail {

/// A number for the calling thread, unique in the process and never reused.
inline std::uint64_t thread_number() noexcept {
    static std::atomic<std::uint64_t> next{1};
    thread_local const std::uint64_t number = next.fetch_add(1, std::memory_order_relaxed);
    return number;
}

/// This process's id, read once per fork generation (getpid is a system call).
inline std::uint64_t process_id() noexcept {
    static std::atomic<std::uint64_t> cached{0};
    static std::atomic<std::uint64_t> cached_generation{~std::uint64_t{0}};
    const std::uint64_t generation = current_fork_generation();
    if (cached_generation.load(std::memory_order_acquire) != generation) {
        cached.store(static_cast<std::uint64_t>(::getpid()), std::memory_order_relaxed);
        cached_generation.store(generation, std::memory_order_release);
    }
    return cached.load(std::memory_order_relaxed);
}

/// The owner id of the calling thread, or of `explicit_owner` when it is not empty.
inline std::string owner_id(std::string_view instance_id, std::string_view explicit_owner) {
    std::string id{instance_id};
    id += ':';
    id += std::to_string(process_id());
    if (explicit_owner.empty()) {
        id += ":thread:";
        id += std::to_string(thread_number());
    } else {
        id += ":owner:";
        id += explicit_owner;
    }
    return id;
}

/// True when `id` is what owner_id(`instance_id`, `explicit_owner`) makes on the calling thread;
/// builds nothing, for release paths that must not allocate.
inline bool is_owner_id(std::string_view id, std::string_view instance_id,
                        std::string_view explicit_owner) noexcept {
    const auto take = [&id](std::string_view part) {
        if (!id.starts_with(part)) {
            return false;
        }
        id.remove_prefix(part.size());
        return true;
    };
    std::array<char, 24> digits{};
    const auto decimal = [&digits](std::uint64_t n) {
        const auto end = std::to_chars(digits.data(), digits.data() + digits.size(), n).ptr;
        return std::string_view{digits.data(), static_cast<std::size_t>(end - digits.data())};
    };
    if (!take(instance_id) || !take(":") || !take(decimal(process_id()))) {
        return false;
    }
    const bool owner_matches = explicit_owner.empty()
                                   ? take(":thread:") && take(decimal(thread_number()))
                                   : take(":owner:") && take(explicit_owner);
    return owner_matches && id.empty();
}

}  // namespace redislock::detail
