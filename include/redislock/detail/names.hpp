// Lock names, derived keys and argument checks shared by every lock kind.
#pragma once

#include <charconv>
#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

#include <redislock/error.hpp>
#include <redislock/lock_options.hpp>

namespace redislock::detail {

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
    if (lease <= std::chrono::milliseconds::zero() || lease > max_lease) {
        throw invalid_argument{"redislock: " + std::string{what} + " of " +
                               std::to_string(lease.count()) + " ms is out of range (1 to " +
                               std::to_string(max_lease.count()) + " ms)"};
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
}

/// True when Redis Cluster would hash `key` by a {tag} inside it.
inline bool has_hash_tag(std::string_view key) {
    auto open = key.find('{');
    if (open == std::string_view::npos) {
        return false;
    }
    auto close = key.find('}', open + 1);
    return close != std::string_view::npos && close > open + 1;
}

/// A key or channel beside `name` in the same hash slot: `a{x}b` -> `a{x}b:suffix`,
/// `orders:42` -> `{orders:42}:suffix`.
inline std::string derived_key(std::string_view name, std::string_view suffix) {
    std::string out;
    out.reserve(name.size() + suffix.size() + 3);
    if (has_hash_tag(name)) {
        out.append(name);
    } else {
        out.append("{").append(name).append("}");
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
