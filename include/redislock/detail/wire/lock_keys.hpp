// Lock names, derived keys and argument checks shared by every lock kind.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <redislock/detail/topology/cluster_slot.hpp>
#include <redislock/error.hpp>
#include <redislock/lock_options.hpp>

namespace redislock::detail {

/// The shortest lease accepted: below it a lease is gone before its reply can arrive.
inline constexpr std::chrono::milliseconds min_lease{10};

/// How long a waiter told it may go has to come before the next one may: short, since a dead
/// waiter delays everyone behind it by that much.
inline std::chrono::milliseconds handoff_grace(std::chrono::milliseconds lease) {
    return std::clamp(lease / 4, std::chrono::milliseconds{10}, std::chrono::milliseconds{100});
}

/// The longest lock name accepted, in bytes.
inline constexpr std::size_t max_name_size = 64 * 1024;

inline void check_name(std::string_view name) {
    if (name.empty()) {
        throw invalid_argument{"redislock: a lock name must not be empty"};
    }
    if (name.size() > max_name_size) {
        throw invalid_argument{"redislock: a lock name is " + std::to_string(name.size()) +
                               " bytes long; the limit is " + std::to_string(max_name_size)};
    }
}

inline void check_lease(std::chrono::milliseconds lease, std::string_view what = "lease") {
    if (lease < min_lease || lease > max_lease) {
        throw invalid_argument{"redislock: " + std::string{what} + " of " +
                               std::to_string(lease.count()) + " ms is out of range (" +
                               std::to_string(min_lease.count()) + " to " +
                               std::to_string(max_lease.count()) +
                               " ms; a shorter lease is gone before its reply can arrive)"};
    }
}

inline void check_options(std::string_view name, const lock_options& options) {
    check_name(name);
    check_lease(options.lease);
    // A zero minimum would make waiters poll Redis in a tight loop.
    if (options.backoff_min <= std::chrono::milliseconds::zero() ||
        options.backoff_max < options.backoff_min || options.backoff_max > max_lease) {
        throw invalid_argument{
            "redislock: backoff bounds must satisfy 0 ms < backoff_min <= "
            "backoff_max <= max_lease"};
    }
    if (options.min_replicas < 0 ||
        (options.min_replicas > 0 &&
         (options.replica_timeout <= std::chrono::milliseconds::zero() ||
          options.replica_timeout >= options.lease))) {
        throw invalid_argument{
            "redislock: min_replicas must be 0 or more, and with replicas the replica_timeout "
            "must be positive and below the lease"};
    }
    if (options.max_hold < std::chrono::milliseconds::zero() ||
        (options.max_hold > std::chrono::milliseconds::zero() &&
         options.max_hold < options.lease)) {
        throw invalid_argument{"redislock: max_hold of " +
                               std::to_string(options.max_hold.count()) +
                               " ms must be 0 (no cap) or at least the lease (" +
                               std::to_string(options.lease.count()) + " ms)"};
    }
}

/// True when Redis Cluster would hash `key` by a {tag} inside it.
inline bool has_hash_tag(std::string_view key) {
    return hashed_part(key).size() != key.size();
}

/// A brace-free tag that hashes to `slot`: "rl" and three characters from a 64-letter alphabet,
/// the first match in a fixed order (262,144 candidates cover all 16,384 slots).
inline std::string tag_for_slot(std::uint16_t slot) {
    static constexpr std::string_view alphabet =
        "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_";
    std::string tag = "rl...";
    for (char a : alphabet) {
        for (char b : alphabet) {
            for (char c : alphabet) {
                tag[2] = a;
                tag[3] = b;
                tag[4] = c;
                if (key_slot(tag) == slot) {
                    return tag;
                }
            }
        }
    }
    throw invalid_argument{"redislock: no tag found for cluster slot " + std::to_string(slot)};
}

/// A key or channel in the same hash slot as `name`: `a{x}b` -> `a{x}b:suffix` (hashed by x),
/// `orders:42` -> `{orders:42}:suffix`. A name hashed whole that holds a `}` (`job}1`, `a{}b`)
/// cannot be wrapped in braces (the tag would end at its `}`), so its derived keys carry a short
/// brace-free tag of the same slot: `{rlXYZ}:job}1:suffix`.
inline std::string derived_key(std::string_view name, std::string_view suffix) {
    std::string out;
    if (has_hash_tag(name)) {
        out.append(name);
    } else if (name.find('}') == std::string_view::npos) {
        out.append("{").append(name).append("}");
    } else {
        out.append("{").append(tag_for_slot(key_slot(name))).append("}:").append(name);
    }
    out.append(":").append(suffix);
    return out;
}

/// A number as command text, without allocating for the sizes the locks use.
class decimal {
public:
    explicit decimal(long long value) noexcept {
        size_ =
            static_cast<std::size_t>(std::to_chars(text_, text_ + sizeof text_, value).ptr - text_);
    }
    std::string_view view() const noexcept { return {text_, size_}; }

private:
    char text_[24]{};
    std::size_t size_ = 0;
};

}  // namespace redislock::detail
