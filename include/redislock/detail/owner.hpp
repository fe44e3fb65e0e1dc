// Owner ids of the reentrant kinds: "<client instance id>:thread:<number>" for the calling
// thread, "<client instance id>:owner:<id>" for an explicit lock_options::owner.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

namespace redislock::detail {

/// A number for the calling thread, unique in the process and never reused.
inline std::uint64_t thread_number() noexcept {
    static std::atomic<std::uint64_t> next{1};
    thread_local const std::uint64_t number = next.fetch_add(1, std::memory_order_relaxed);
    return number;
}

/// The owner id of the calling thread, or of `explicit_owner` when it is not empty.
inline std::string owner_id(std::string_view instance_id, std::string_view explicit_owner) {
    std::string id{instance_id};
    if (explicit_owner.empty()) {
        id += ":thread:";
        id += std::to_string(thread_number());
    } else {
        id += ":owner:";
        id += explicit_owner;
    }
    return id;
}

}  // namespace redislock::detail
