// What a reply means to every lock kind, decided without any I/O: an error reply transient or a
// real failure (is_transient, throw_reply_error), one that says the lock is not ours
// (throw_unless_not_ours), a grant that cannot stand (refuse_grant), an entry script's answer
// (decode_entry); and a lock call whose grants can never stand: its replies counted against the
// lease (late_replies), until it throws lease_error.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include <redislock/detail/kinds/lease_time.hpp>
#include <redislock/detail/waiting/backoff.hpp>
#include <redislock/error.hpp>
#include <redislock/lock_options.hpp>
#include <redislock/reply.hpp>

namespace redislock::detail {

/// True for error replies that say "not now" rather than "no".
inline bool is_transient(const reply& r) {
    for (std::string_view code :
         {"LOADING", "READONLY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "BUSY", "NOREPLICAS"}) {
        if (r.is_error_code(code)) {
            return true;
        }
    }
    // A script that reaches an undeclared key missing on a slot being migrated (the library's
    // declare every key they touch; a script of the caller's may not): the slot settles within
    // the migration. Redis 7.0 says "non local key"; later versions say the undeclared keys were
    // accessed "during rehashing of the slot".
    return r.is_error() && (r.text().find("non local key") != std::string::npos ||
                            r.text().find("rehashing of the slot") != std::string::npos);
}

/// TRYAGAIN: the lock's slot is being migrated and the keys the command declares are partly on
/// each side, so it did not run. To an acquisition it is no failure: waits ride it out as they
/// would a held lock (an untimed lock() too, since the cluster settles the slot), and a wait that
/// meets it until its deadline, try_lock() included, is not acquired.
class slot_migrating_error : public unavailable_error {
public:
    using unavailable_error::unavailable_error;
};

/// True when `e` says the attempt did not run because its slot is being migrated.
inline bool is_slot_migrating(const error& e) {
    return dynamic_cast<const slot_migrating_error*>(&e) != nullptr;
}

/// Throws the exception an error reply to `what` on `name` deserves.
[[noreturn]] inline void throw_reply_error(const reply& r, std::string_view what,
                                           std::string_view name) {
    const std::string message =
        "redislock: cannot " + std::string{what} + " '" + std::string{name} + "': " + r.text();
    if (r.is_error_code("TRYAGAIN")) {
        throw slot_migrating_error{message};
    }
    if (is_transient(r)) {
        throw unavailable_error{message};
    }
    throw server_error{message};
}

/// Throws for an error reply to `what` on `name` other than WRONGTYPE, which means the name now
/// holds another type, so the lock is surely not ours; other error replies (LOADING, BUSY,
/// READONLY...) say nothing about ownership.
inline void throw_unless_not_ours(const reply& r, std::string_view what, std::string_view name) {
    if (r.is_error() && !r.is_error_code("WRONGTYPE")) {
        throw_reply_error(r, what, name);
    }
}

/// errc::server_failed for a release or renewal answered with `r`, an error reply; the reply's
/// text becomes the code's message on this thread.
inline std::error_code server_failure(const reply& r) noexcept {
    try {
        last_server_failure() = r.text();
    } catch (...) {
    }
    return errc::server_failed;
}

/// True when an acquisition that WAIT counted `replicas` for lacks the acknowledgements
/// lock_options::min_replicas asks for.
inline bool unacknowledged(std::int64_t replicas, const lock_options& options) {
    return options.min_replicas > 0 && replicas < options.min_replicas;
}

[[noreturn]] inline void throw_unacknowledged(std::string_view name, std::int64_t replicas,
                                              const lock_options& options) {
    throw replication_error{
        "redislock: '" + std::string{name} + "' was acquired but only " + std::to_string(replicas) +
        " of the " + std::to_string(options.min_replicas) +
        " replicas asked for acknowledged it within " +
        std::to_string(options.replica_timeout.count()) + " ms; the acquisition was undone"};
}

/// What refuse_grant() throws for a grant whose reply came after its lease ran out, given back:
/// a failed attempt, which the lock call counts (late_replies) and tells (late_grant event). Not
/// a redislock::error: it never leaves a lock call.
struct late_grant {
    steady::duration round_trip;  // from the attempt's send to its reply
};

/// Gives up, with `abandon()`, a grant of `lk` sent at `sent` that cannot stand: too few of the
/// replicas asked for acknowledged it (throws replication_error), or its lease ran out before
/// the reply came (throws late_grant: it counts as a failed attempt). std::nullopt when the
/// grant stands.
template <class State, class Abandon>
std::optional<holder_ttl> refuse_grant(const State& lk, steady::time_point sent,
                                       std::int64_t replicas, Abandon abandon) {
    if (unacknowledged(replicas, lk.options)) {
        abandon();
        throw_unacknowledged(lk.name, replicas, lk.options);
    }
    if (const auto now = steady::now(); now >= valid_until(sent, lk.options.lease)) {
        abandon();  // granted, but its lease ran out before the reply came
        throw late_grant{now - sent};
    }
    return std::nullopt;
}

/// Counts the attempts of one lock call that were answered only after their lease ran out
/// (counted from each attempt's send, with the drift allowance of valid_until()), granted or
/// not: such a reply proves that no grant could have stood. `limit` of them in a row, with no
/// attempt answered in time between them, end the call with lease_error; an attempt that failed
/// (timeout, connection error) neither counts nor breaks the row. One stall of the server or the
/// network thus costs an attempt or two, while round trips that always outlast the lease end the
/// call after three.
class late_replies {
public:
    static constexpr int limit = 3;

    /// Notes an attempt sent at `sent` and answered at `answered`; true once `limit` in a row
    /// were late.
    bool note(steady::time_point sent, steady::time_point answered,
              std::chrono::milliseconds lease) {
        if (answered < valid_until(sent, lease)) {
            in_a_row_ = 0;
            return false;
        }
        ++in_a_row_;
        last_ = answered - sent;
        return in_a_row_ >= limit;
    }

    /// Throws the lease_error that ends a lock call of `name` with `lease`.
    [[noreturn]] void fail(std::string_view name, std::chrono::milliseconds lease) const {
        throw lease_error{
            "redislock: cannot lock '" + std::string{name} + "': " + std::to_string(in_a_row_) +
            " attempts in a row were answered after their lease of " +
            std::to_string(lease.count()) + " ms had run out (the last after " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(last_).count()) +
            " ms), so no grant could stand; the lease must be longer than the round trips to "
            "the server"};
    }

private:
    int in_a_row_ = 0;
    steady::duration last_{};
};

/// What a reentrant or read-write acquisition script answers: its status (0: not acquired, then
/// `value` is the holder's TTL, saturated_ttl(); 1: a new acquisition; 2: a re-entry...), `value`
/// (the fencing token when acquired) and the id of the acquisition the entry belongs to.
struct entry_reply {
    std::int64_t status = 0;
    std::int64_t value = 0;
    std::string acquisition;
};

/// Decodes `r`, the reply of an entry script acquiring `name`.
/// @throws what throw_reply_error() throws for an error reply; redislock::server_error saying
///         `unexpected` for a reply of another shape.
inline entry_reply decode_entry(const reply& r, std::string_view name, const char* unexpected) {
    if (r.is_error()) {
        throw_reply_error(r, "lock", name);
    }
    if (!r.is_array() || r.elements().size() != 3) {
        throw server_error{unexpected};
    }
    entry_reply got{r.elements()[0].as_integer(), r.elements()[1].as_integer(),
                    r.elements()[2].text()};
    if (got.status == 0) {
        got.value = saturated_ttl(got.value).count();
    }
    return got;
}

}  // namespace redislock::detail
