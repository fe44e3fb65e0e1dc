// detail::query_holder: runs one of the read-only scripts lua/mutex_query.lua,
// recursive_query.lua and shared_query.lua on a lock's key and reads its answer, for the queries
// every lock kind shares (is_locked(), holder_ttl()) and the reentrant lock's hold_count(). The
// scripts tell holders from the books kept beside them; one round trip, routed as the lock's
// other calls are (to the node of the key's slot on a Cluster, to the master on Sentinel).
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <redislock/detail/kinds/reply_meaning.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

/// What a query script found when it ran.
struct holder_snapshot {
    /// The holders' time left: zero when no one holds the lock, milliseconds::max() when it is
    /// held with no expiry (a key another program wrote without one).
    std::chrono::milliseconds ttl{0};
    /// The entries of the owner the script was asked about (recursive_query.lua only).
    std::int64_t count = 0;
};

/// Reads a query script's time left: -1 for a key without expiry, else whole ms.
/// @throws redislock::server_error for a reply of another shape.
inline std::chrono::milliseconds queried_ttl(const reply& r) {
    if (!r.is_integer() || r.as_integer() < -1) {
        throw server_error{"redislock: unexpected reply to a lock query"};
    }
    if (r.as_integer() == -1) {
        return std::chrono::milliseconds::max();
    }
    return std::chrono::milliseconds{r.as_integer()};
}

/// Runs query script `s` on the key of `st` (a lock kind's state) with `args`, within the
/// client's command timeout.
/// @throws redislock::invalid_argument on a moved-from lock (`st` null); what
///         throw_reply_error() throws for an error reply (WRONGTYPE when the key is not a lock
///         of this kind: server_error); redislock::connection_error; redislock::server_error for
///         a reply of another shape.
template <class State, std::size_t ArgCount>
holder_snapshot query_holder(const State* st, const script& s,
                             const std::array<std::string_view, ArgCount>& args) {
    if (st == nullptr) {
        throw invalid_argument{"redislock: use of a moved-from lock"};
    }
    const reply r = run_script(*st->conn, s, std::array{std::string_view{st->name}}, args,
                               call_context{{}, st->core->untimed_deadline()}, &st->core->events);
    if (r.is_error()) {
        throw_reply_error(r, "query", st->name);
    }
    if (!r.is_array()) {
        return {queried_ttl(r), 0};
    }
    if (r.elements().size() != 2 || !r.elements()[1].is_integer()) {
        throw server_error{"redislock: unexpected reply to a lock query"};
    }
    return {queried_ttl(r.elements()[0]), r.elements()[1].as_integer()};
}

}  // namespace redislock::detail
