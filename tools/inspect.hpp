// redislock-inspect: what a lock holds on the Redis server that has it (one server, the master
// Sentinel names, or the Cluster node serving its slot), and freeing a stuck one.
//
// inspect() reads a lock's key and its derived keys (fencing counter, fair-queue keys) in one
// script, so what it reports is one moment of the server. force_release() deletes the lock's key
// and its queue keys only if the key still holds what inspect() saw, and never the fencing
// counter: a token handed out after the release must stay above every earlier one.
// run() is the whole program over streams, so the tests drive it as a user would.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <exception>
#include <functional>
#include <istream>
#include <optional>
#include <ostream>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <redislock/any_connection.hpp>
#include <redislock/connection.hpp>
#include <redislock/detail/topology/cluster_slot.hpp>
#include <redislock/detail/wire/lock_keys.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/endpoint.hpp>
#include <redislock/error.hpp>
#include <redislock/hiredis.hpp>
#include <redislock/reply.hpp>

namespace redislock::inspect {

/// What the key at a lock's name is.
enum class lock_kind {
    free,             ///< no key: nobody holds the lock
    mutex,            ///< a string: the holder's token
    recursive_mutex,  ///< a hash without a `mode` field: owner -> count
    shared_mutex,     ///< a hash with a `mode` field: per-holder leases
    semaphore,        ///< a sorted set: permit id -> when its lease ends
};

/// The name the library's API uses for a kind ("none" for a free lock).
inline std::string_view kind_name(lock_kind kind) {
    switch (kind) {
        case lock_kind::mutex:
            return "mutex";
        case lock_kind::recursive_mutex:
            return "recursive_mutex";
        case lock_kind::shared_mutex:
            return "shared_mutex";
        case lock_kind::semaphore:
            return "counting_semaphore";
        case lock_kind::free:
            break;
    }
    return "none";
}

/// One holder of a lock.
struct holder {
    std::string who;   ///< mutex: the token; semaphore: the permit id; the others: the owner id
    std::string mode;  ///< shared_mutex: "read" or "write"; empty for the other kinds
    std::int64_t count = 1;
    /// Lease left in ms (0 or less: expired, dropped by the next acquisition); none when the
    /// key has no expiry.
    std::optional<std::int64_t> remaining_ms;
    std::string acquisition_id;  ///< the reentrant kinds' acquisition id, when stored
};

/// A writer waiting for a read-write lock (field `q:<owner>`); new readers wait behind it.
/// With the fair queue, a writer's entry there (an id not starting with 'r') counts too.
struct waiting_writer {
    std::string owner;  ///< the owner id, or the queue entry's waiter id
    /// How long it keeps its place unless it asks again; none for a queue entry without a claim.
    std::optional<std::int64_t> remaining_ms;
    bool queued = false;  ///< an entry of the fair queue, not a `q:` field
};

/// An entry of the fair waiting queue (`{name}:queue`, `{name}:waiting`).
struct waiter {
    std::string id;
    std::optional<std::int64_t> ticket;        ///< its place in the queue (FIFO order)
    std::optional<std::int64_t> remaining_ms;  ///< until its claim expires
};

/// One moment of a lock and its derived keys.
struct report {
    std::string name;
    lock_kind kind = lock_kind::free;
    std::string mode;                        ///< shared_mutex: the `mode` field
    std::optional<std::int64_t> key_ttl_ms;  ///< the key's PTTL; none: absent or no expiry
    std::vector<holder> holders;
    std::vector<waiting_writer> waiting_writers;
    std::vector<waiter> waiters;    ///< the first max_waiters, in queue order
    std::int64_t waiter_total = 0;  ///< entries of the larger of the two queue keys
    bool queue_present = false;
    std::optional<std::int64_t> holder_fence;  ///< a hash lock's `fence` field
    std::optional<std::int64_t> fence;         ///< the fencing counter's value
    std::int64_t fence_ttl_ms = -2;
    std::vector<std::pair<std::string, std::string>> other_fields;  ///< fields of no known role
    std::string fence_key;
    std::string permits_key;  ///< a semaphore's count of permits
    /// The count of permits stored at permits_key, whatever the name holds now (a free
    /// semaphore keeps it).
    std::optional<std::int64_t> permits;
    std::string queue_key;
    std::string waiting_key;
    std::string fingerprint;  ///< the lock key's content as the server hashed it
    /// A simple lock kept free for the head of the fair queue after a release: that waiter's id.
    std::optional<std::string> kept_for;
    /// False when the keys were read one by one: the name's Cluster slot was being migrated with
    /// its keys split between two nodes (TRYAGAIN for commands on several of them), so the
    /// report is not one moment of the server.
    bool one_moment = true;
};

/// A key at the lock's name or a derived name is of a type no lock kind writes.
class unexpected_key_error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// force_release() sent the release and lost its reply: the lock may or may not be freed.
class outcome_unknown_error : public connection_error {
public:
    using connection_error::connection_error;
};

/// What a simple lock's key holds while a release keeps it free for the waiter it told
/// ("queued:<waiter id>"), so a plain SET NX cannot barge in.
inline constexpr std::string_view handoff_prefix = "queued:";

/// The most waiters listed; the rest are only counted.
inline constexpr int max_waiters = 100;

namespace detail {

// Hashes the lock key's type and content, fields sorted (a hash's order may change without a
// write), each part prefixed by its length so no two contents hash alike.
inline constexpr std::string_view fingerprint_lua = R"lua(
local function fingerprint(kind)
    local parts = {}
    if kind == 'string' then
        local value = redis.call('GET', KEYS[1])
        parts[1] = #value .. ':' .. value
    elseif kind == 'hash' then
        local fields = redis.call('HGETALL', KEYS[1])
        for i = 1, #fields, 2 do
            parts[#parts + 1] = #fields[i] .. ':' .. fields[i] .. #fields[i + 1] .. ':' ..
                                fields[i + 1]
        end
        table.sort(parts)
    elseif kind == 'zset' then
        local members = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
        for i = 1, #members, 2 do
            parts[#parts + 1] = #members[i] .. ':' .. members[i] .. #members[i + 1] .. ':' ..
                                members[i + 1]
        end
    end
    return redis.sha1hex(kind .. '|' .. table.concat(parts, '|'))
end
)lua";

// KEYS: the lock, its fencing counter, queue and waiting keys, and a semaphore's count of
// permits. ARGV[1]: most waiters (and a semaphore's holders) listed.
inline constexpr std::string_view snapshot_lua = R"lua(
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local function kind_of(key) return redis.call('TYPE', key).ok end
local lock_kind = kind_of(KEYS[1])
local content = {}
if lock_kind == 'string' then
    content = {redis.call('GET', KEYS[1])}
elseif lock_kind == 'hash' then
    content = redis.call('HGETALL', KEYS[1])
elseif lock_kind == 'zset' then
    content = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
end
local fence_kind = kind_of(KEYS[2])
local fence, fence_ttl = false, -2
if fence_kind == 'string' then
    fence, fence_ttl = redis.call('GET', KEYS[2]), redis.call('PTTL', KEYS[2])
end
local queue_kind, waiting_kind = kind_of(KEYS[3]), kind_of(KEYS[4])
local limit = tonumber(ARGV[1])
local waiters, total = {}, 0
if queue_kind == 'zset' then
    total = redis.call('ZCARD', KEYS[3])
    local queue = redis.call('ZRANGE', KEYS[3], 0, limit - 1, 'WITHSCORES')
    for i = 1, #queue, 2 do
        local expiry = false
        if waiting_kind == 'zset' then
            expiry = redis.call('ZSCORE', KEYS[4], queue[i])
        end
        waiters[#waiters + 1] = {queue[i], queue[i + 1], expiry}
    end
end
if waiting_kind == 'zset' then
    total = math.max(total, redis.call('ZCARD', KEYS[4]))
    if queue_kind ~= 'zset' then
        local waiting = redis.call('ZRANGE', KEYS[4], 0, limit - 1, 'WITHSCORES')
        for i = 1, #waiting, 2 do
            waiters[#waiters + 1] = {waiting[i], false, waiting[i + 1]}
        end
    end
end
local permits_kind = kind_of(KEYS[5])
local permits = permits_kind == 'string' and redis.call('GET', KEYS[5]) or false
return {now, lock_kind, content, redis.call('PTTL', KEYS[1]), fingerprint(lock_kind),
        fence_kind, fence, fence_ttl, queue_kind, waiting_kind, total, waiters, permits_kind,
        permits}
)lua";

// KEYS: one of the keys snapshot_lua reads. ARGV[1]: most members of a sorted set read;
// ARGV[2...]: members whose scores are wanted too (a queue's waiters in the waiting key).
// Returns {server time in ms, type, content (a sorted set's first members with their scores),
// PTTL, fingerprint (meaningful for the lock key only), members of a sorted set, scores}.
inline constexpr std::string_view key_lua = R"lua(
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local kind = redis.call('TYPE', KEYS[1]).ok
local content, members, scores = {}, 0, {}
if kind == 'string' then
    content = {redis.call('GET', KEYS[1])}
elseif kind == 'hash' then
    content = redis.call('HGETALL', KEYS[1])
elseif kind == 'zset' then
    members = redis.call('ZCARD', KEYS[1])
    content = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
    for i = 2, #ARGV do
        scores[i - 1] = redis.call('ZSCORE', KEYS[1], ARGV[i])
    end
end
return {now, kind, content, redis.call('PTTL', KEYS[1]), fingerprint(kind), members, scores}
)lua";

// KEYS: the lock, its queue and waiting keys. ARGV[1]: the fingerprint the caller saw;
// ARGV[2]: the release channel (each waiter is told on its client's, see queue_tell in
// _queue.lua, which precedes this). Never touches the fencing counter.
inline constexpr std::string_view release_lua = R"lua(
if fingerprint(redis.call('TYPE', KEYS[1]).ok) ~= ARGV[1] then
    return {-1, 0}
end
-- Waiters are told so they try again; with the queue gone, the first to come takes the lock.
-- A 'g' or 'h' waiter named plainly would take the lock for handed to it: it is named as standby
-- ('?'), which makes it try again once its grace is over (at most 100 ms) instead.
local waiters = {}
if redis.call('TYPE', KEYS[2]).ok == 'zset' then
    for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
        local handed = string.find(id, '^[gh]')
        waiters[#waiters + 1] = handed and '?' .. id or id
    end
end
local lock = redis.call('DEL', KEYS[1])
local queue = redis.call('DEL', KEYS[2], KEYS[3])
if lock == 1 and #waiters > 0 then
    queue_tell(ARGV[2], waiters)
end
return {lock, queue}
)lua";

inline std::optional<std::int64_t> to_integer(std::string_view text) {
    std::int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc{} || end != text.data() + text.size() || text.empty()) {
        return std::nullopt;
    }
    return value;
}

// A sorted-set score as Redis prints it ("17", "1712345678901"; "1.5" for a non-integer).
inline std::optional<std::int64_t> score(const reply& r) {
    if (!r.is_string()) {
        return std::nullopt;
    }
    double value = 0;
    auto [end, ec] = std::from_chars(r.text().data(), r.text().data() + r.text().size(), value);
    if (ec != std::errc{} || end != r.text().data() + r.text().size()) {
        return std::nullopt;
    }
    return static_cast<std::int64_t>(value);
}

inline const reply& element(const reply& r, std::size_t index) {
    if (!r.is_array() || r.elements().size() <= index) {
        throw connection_error{"redislock-inspect: unexpected reply from the server"};
    }
    return r.elements()[index];
}

// "r:<owner>" / "w:<owner>" = "<count> <expiry ms>[ <acquisition id>]", as shared_acquire.lua
// writes it; "q:<owner>" = "0 <expiry ms>".
struct shared_entry {
    std::int64_t count = 0;
    std::int64_t expiry = 0;
    std::string id;
};

inline std::optional<shared_entry> parse_shared_entry(std::string_view value) {
    const auto first = value.find(' ');
    if (first == std::string_view::npos) {
        return std::nullopt;
    }
    const auto second = value.find(' ', first + 1);
    const auto count = to_integer(value.substr(0, first));
    const auto expiry = to_integer(value.substr(
        first + 1, second == std::string_view::npos ? std::string_view::npos : second - first - 1));
    if (!count || !expiry || *count < 0) {
        return std::nullopt;
    }
    shared_entry entry{*count, *expiry, {}};
    if (second != std::string_view::npos) {
        entry.id = std::string{value.substr(second + 1)};
    }
    return entry;
}

inline void read_shared(report& out, const std::vector<reply>& fields, std::int64_t now) {
    for (std::size_t i = 0; i + 1 < fields.size(); i += 2) {
        const std::string& field = fields[i].text();
        const std::string& value = fields[i + 1].text();
        const auto entry = parse_shared_entry(value);
        if (field == "mode") {
            out.mode = value;
        } else if (field == "fence" && to_integer(value)) {
            out.holder_fence = to_integer(value);
        } else if (entry && (field.starts_with("r:") || field.starts_with("w:"))) {
            out.holders.push_back({field.substr(2), field[0] == 'w' ? "write" : "read",
                                   entry->count, entry->expiry - now, entry->id});
        } else if (entry && field.starts_with("q:")) {
            out.waiting_writers.push_back({field.substr(2), entry->expiry - now, false});
        } else if (field.starts_with("left:") || field.starts_with("firsts:")) {
            // The owner's last releases that landed, and the attempts whose first entries an
            // entry counts (see lua/shared_acquire.lua).
        } else {
            out.other_fields.emplace_back(field, value);
        }
    }
}

inline void read_recursive(report& out, const std::vector<reply>& fields) {
    std::vector<std::pair<std::string, std::string>> ids;
    for (std::size_t i = 0; i + 1 < fields.size(); i += 2) {
        const std::string& field = fields[i].text();
        const std::string& value = fields[i + 1].text();
        if (field == "fence" && to_integer(value)) {
            out.holder_fence = to_integer(value);
        } else if (field.starts_with("id:")) {
            ids.emplace_back(field.substr(3), value);
        } else if (field.starts_with("handed:")) {
            // Marks an entry a release handed to a waiting owner (its id:<owner> names it).
        } else if (field.starts_with("gone:")) {
            // The acquisitions the owner's client gave up (see lua/recursive_acquire.lua).
        } else if (field.starts_with("left:") || field.starts_with("firsts:")) {
            // The owner's last releases that landed, and the attempts whose first entries the
            // count holds (see lua/recursive_acquire.lua).
        } else if (const auto count = to_integer(value); count && *count > 0) {
            out.holders.push_back({field, "", *count, out.key_ttl_ms, ""});
        } else {
            out.other_fields.emplace_back(field, value);
        }
    }
    for (auto& [owner, id] : ids) {
        bool matched = false;
        for (holder& h : out.holders) {
            if (h.who == owner) {
                h.acquisition_id = id;
                matched = true;
            }
        }
        if (!matched) {
            out.other_fields.emplace_back("id:" + owner, std::move(id));
        }
    }
}

}  // namespace detail

namespace detail {

// The slot of `name` being migrated, for messages.
inline std::string migrating_slot_text(std::string_view name) {
    return "cluster slot " + std::to_string(redislock::detail::key_slot(name)) +
           " is being migrated";
}

// One key read by key_lua.
template <connection C>
reply read_key(C& conn, const std::string& key, std::span<const std::string> members) {
    const std::string script = std::string{fingerprint_lua} + std::string{key_lua};
    const std::string limit = std::to_string(max_waiters);
    std::vector<std::string_view> argv{"EVAL", script, "1", key, limit};
    argv.insert(argv.end(), members.begin(), members.end());
    reply r = conn.execute(argv);
    r.throw_if_error();
    return r;
}

// How long a Cluster node is given to run the snapshot before it is asked again with the
// connection's command timeout: a slot being migrated answers TRYAGAIN to commands on several
// keys (some of them absent) until the call's deadline, and a view should not wait that long.
inline constexpr std::chrono::milliseconds migration_probe{500};

// Runs the snapshot script: on a Cluster first within migration_probe, so that a TRYAGAIN comes
// back at once; a node that was merely slow is asked again (the script only reads).
template <connection C>
reply snapshot(C& conn, std::span<const std::string_view> argv) {
    if constexpr (std::same_as<C, any_connection>) {
        if (conn.kind() == topology::cluster) {
            const call_context quick{.deadline =
                                         std::chrono::steady_clock::now() + migration_probe};
            try {
                return conn.execute(argv, quick);
            } catch (const timeout_error&) {
                // slow, or the slot map still being read: the full command timeout below
            }
        }
    }
    return conn.execute(argv);
}

// `score` (a sorted-set score in server milliseconds, as text) moved by `shift` ms; nil stays nil.
inline reply shifted_score(const reply& score, std::int64_t shift) {
    const auto value = detail::score(score);
    return value ? reply::string(std::to_string(*value + shift)) : reply::nil();
}

// What snapshot_lua returns, put together from one read per key: the way to see a lock whose
// slot a migration has split, where commands on several of its keys answer TRYAGAIN.
template <connection C>
reply snapshot_key_by_key(C& conn, const report& out) {
    const reply lock = read_key(conn, out.name, {});
    const reply fence = read_key(conn, out.fence_key, {});
    const reply queue = read_key(conn, out.queue_key, {});
    std::vector<std::string> queued;
    const std::vector<reply>& queue_content = element(queue, 2).elements();
    for (std::size_t i = 0; i + 1 < queue_content.size(); i += 2) {
        queued.push_back(queue_content[i].text());
    }
    const reply waiting = read_key(conn, out.waiting_key, queued);
    const reply permits = read_key(conn, out.permits_key, {});

    const std::string& fence_type = element(fence, 1).text();
    const bool fence_string = fence_type == "string";
    const std::string& queue_type = element(queue, 1).text();
    const std::string& waiting_type = element(waiting, 1).text();
    // Claims expire on the waiting key's clock, which may be another node's during a
    // migration: each is moved onto the lock key's clock, where time left is counted.
    const std::int64_t shift = element(lock, 0).as_integer() - element(waiting, 0).as_integer();
    std::vector<reply> waiters;
    if (queue_type == "zset") {
        const std::vector<reply>& expiries = element(waiting, 6).elements();
        for (std::size_t i = 0; i + 1 < queue_content.size(); i += 2) {
            const std::size_t n = i / 2;
            waiters.push_back(reply::array({queue_content[i], queue_content[i + 1],
                                            waiting_type == "zset" && n < expiries.size()
                                                ? shifted_score(expiries[n], shift)
                                                : reply::nil()}));
        }
    } else if (waiting_type == "zset") {
        const std::vector<reply>& content = element(waiting, 2).elements();
        for (std::size_t i = 0; i + 1 < content.size(); i += 2) {
            waiters.push_back(
                reply::array({content[i], reply::nil(), shifted_score(content[i + 1], shift)}));
        }
    }
    return reply::array({
        element(lock, 0),
        element(lock, 1),
        element(lock, 2),
        element(lock, 3),
        element(lock, 4),
        element(fence, 1),
        fence_string && !element(fence, 2).elements().empty() ? element(fence, 2).elements()[0]
                                                              : reply::nil(),
        fence_string ? element(fence, 3) : reply::integer(-2),
        element(queue, 1),
        element(waiting, 1),
        reply::integer(std::max(element(queue, 5).as_integer(), element(waiting, 5).as_integer())),
        reply::array(std::move(waiters)),
        element(permits, 1),
        element(permits, 1).text() == "string" && !element(permits, 2).elements().empty()
            ? element(permits, 2).elements()[0]
            : reply::nil(),
    });
}

}  // namespace detail

/// Reads the lock `name` and its derived keys in one script (EVAL), on the server that has them
/// (through a Cluster connection, the node serving the name's slot). While a migration has split
/// that slot (the keys answer TRYAGAIN together), reads them one by one instead, and says so
/// (report::one_moment).
/// @throws unexpected_key_error when a key holds a type no lock kind writes (or a fencing counter
///         that is not a number); redislock::server_error for an error reply;
///         redislock::connection_error when the server cannot be reached.
template <connection C>
report inspect(C& conn, std::string_view name) {
    redislock::detail::check_name(name);
    report out;
    out.name = std::string{name};
    out.fence_key = redislock::detail::derived_key(name, "fence");
    out.queue_key = redislock::detail::derived_key(name, "queue");
    out.waiting_key = redislock::detail::derived_key(name, "waiting");
    out.permits_key = redislock::detail::derived_key(name, "permits");
    const std::string script =
        std::string{detail::fingerprint_lua} + std::string{detail::snapshot_lua};
    const std::string limit = std::to_string(max_waiters);
    const std::string_view argv[] = {"EVAL",          script,          "5",
                                     out.name,        out.fence_key,   out.queue_key,
                                     out.waiting_key, out.permits_key, limit};
    reply r = detail::snapshot(conn, argv);
    if (r.is_error_code("TRYAGAIN")) {
        r = detail::snapshot_key_by_key(conn, out);
        out.one_moment = false;
    }
    r.throw_if_error();

    const std::int64_t now = detail::element(r, 0).as_integer();
    const std::string& type = detail::element(r, 1).text();
    const std::vector<reply>& content = detail::element(r, 2).elements();
    const std::int64_t pttl = detail::element(r, 3).as_integer();
    out.fingerprint = detail::element(r, 4).text();
    if (pttl >= 0) {
        out.key_ttl_ms = pttl;
    }
    if (type == "none") {
        out.kind = lock_kind::free;
    } else if (type == "string") {
        out.kind = lock_kind::mutex;
        const std::string value = content.empty() ? "" : content[0].text();
        if (value.starts_with(handoff_prefix)) {
            out.kept_for = value.substr(handoff_prefix.size());
        } else {
            out.holders.push_back({value, "", 1, out.key_ttl_ms, ""});
        }
    } else if (type == "hash") {
        bool has_mode = false;
        for (std::size_t i = 0; i < content.size(); i += 2) {
            has_mode = has_mode || content[i].text() == "mode";
        }
        out.kind = has_mode ? lock_kind::shared_mutex : lock_kind::recursive_mutex;
        if (has_mode) {
            detail::read_shared(out, content, now);
        } else {
            detail::read_recursive(out, content);
        }
    } else if (type == "zset") {
        out.kind = lock_kind::semaphore;
        for (std::size_t i = 0; i + 1 < content.size(); i += 2) {
            const auto ends = detail::score(content[i + 1]);
            out.holders.push_back({content[i].text(), "", 1,
                                   ends ? std::optional<std::int64_t>{*ends - now} : std::nullopt,
                                   ""});
        }
    } else {
        throw unexpected_key_error{
            "the key '" + out.name + "' holds a " + type +
            ", which is not a redislock lock (a lock is a string or a hash, a semaphore a "
            "sorted set)"};
    }
    const std::string& permits_type = detail::element(r, 12).text();
    if (permits_type == "string") {
        out.permits = detail::to_integer(detail::element(r, 13).text());
        if (!out.permits) {
            throw unexpected_key_error{"the count of permits '" + out.permits_key + "' holds '" +
                                       detail::element(r, 13).text() + "', which is not a number"};
        }
    } else if (permits_type != "none") {
        throw unexpected_key_error{"the count of permits '" + out.permits_key + "' holds a " +
                                   permits_type + ", not a string"};
    }

    const std::string& fence_type = detail::element(r, 5).text();
    if (fence_type == "string") {
        out.fence = detail::to_integer(detail::element(r, 6).text());
        if (!out.fence) {
            throw unexpected_key_error{"the fencing counter '" + out.fence_key + "' holds '" +
                                       detail::element(r, 6).text() + "', which is not a number"};
        }
        out.fence_ttl_ms = detail::element(r, 7).as_integer();
    } else if (fence_type != "none") {
        throw unexpected_key_error{"the fencing counter '" + out.fence_key + "' holds a " +
                                   fence_type + ", not a string"};
    }

    for (const auto& [index, key] :
         {std::pair{std::size_t{8}, &out.queue_key}, std::pair{std::size_t{9}, &out.waiting_key}}) {
        const std::string& queue_type = detail::element(r, index).text();
        if (queue_type == "zset") {
            out.queue_present = true;
        } else if (queue_type != "none") {
            throw unexpected_key_error{"the queue key '" + *key + "' holds a " + queue_type +
                                       ", not a sorted set"};
        }
    }
    out.waiter_total = detail::element(r, 10).as_integer();
    for (const reply& w : detail::element(r, 11).elements()) {
        waiter entry{detail::element(w, 0).text(), detail::score(detail::element(w, 1)),
                     std::nullopt};
        if (const auto expiry = detail::score(detail::element(w, 2))) {
            entry.remaining_ms = *expiry - now;
        }
        // Queue waiter ids start with 'r' for readers; any other letter waits to write.
        if (out.kind == lock_kind::shared_mutex && !entry.id.starts_with('r')) {
            out.waiting_writers.push_back({entry.id, entry.remaining_ms, true});
        }
        out.waiters.push_back(std::move(entry));
    }
    return out;
}

/// True when force_release() would have something to delete.
inline bool something_to_free(const report& r) {
    return r.kind != lock_kind::free || r.queue_present;
}

/// What force_release() did.
struct release_result {
    bool changed = false;  ///< the lock key no longer held what was inspected: nothing deleted
    bool lock_deleted = false;
    std::int64_t queue_keys_deleted = 0;
};

/// Deletes the lock's key and its queue keys if the key still holds what `seen` shows, and tells
/// each waiter on its client's release channel. Never deletes the fencing counter. The holders
/// find out at their next renewal or verify().
/// @throws redislock::server_error, redislock::connection_error
template <connection C>
release_result force_release(C& conn, const report& seen) {
    const std::string script = std::string{detail::fingerprint_lua} +
                               std::string{redislock::detail::scripts::queue_piece} +
                               std::string{detail::release_lua};
    const std::string channel = redislock::detail::derived_key(seen.name, "released");
    const std::string_view argv[] = {"EVAL",           script,         "3",
                                     seen.name,        seen.queue_key, seen.waiting_key,
                                     seen.fingerprint, channel};
    // Never sent twice: a second run after a lost reply would find the key gone, and report
    // "changed, nothing freed" for a lock the first run freed.
    reply r;
    try {
        if constexpr (contextual_connection<C>) {
            r = conn.execute(argv, call_context{.key = seen.name, .repeatable = false});
        } else {
            r = conn.execute(argv);
        }
    } catch (const connection_error& e) {
        throw outcome_unknown_error{
            "the release of '" + seen.name + "' was sent and its reply was lost (" + e.what() +
            "): it may or may not have freed the lock; run again to see the lock as it is now"};
    }
    if (r.is_error_code("TRYAGAIN")) {
        throw unavailable_error{detail::migrating_slot_text(seen.name) +
                                ": nothing was freed; free it once the migration has ended"};
    }
    r.throw_if_error();
    const std::int64_t lock = detail::element(r, 0).as_integer();
    return {lock < 0, lock == 1, detail::element(r, 1).as_integer()};
}

/// `text` with control characters, DEL and backslashes written as \xHH, so odd names print on
/// one line.
inline std::string printable(std::string_view text) {
    static constexpr char hex[] = "0123456789abcdef";
    std::string out;
    for (const char c : text) {
        const auto byte = static_cast<unsigned char>(c);
        if (byte < 0x20 || byte == 0x7f || c == '\\') {
            out += "\\x";
            out += hex[byte >> 4];
            out += hex[byte & 0xf];
        } else {
            out += c;
        }
    }
    return out;
}

/// "4873 ms" below ten seconds, "86399 s" above.
inline std::string duration_text(std::int64_t ms) {
    return ms < 10'000 ? std::to_string(ms) + " ms" : std::to_string(ms / 1000) + " s";
}

/// The process an owner id names: "<instance>:<pid>:thread:<n>" or "<instance>:<pid>:owner:<id>".
inline std::optional<std::string> owner_process(std::string_view owner) {
    const auto first = owner.find(':');
    if (first == std::string_view::npos) {
        return std::nullopt;
    }
    const auto second = owner.find(':', first + 1);
    if (second == std::string_view::npos) {
        return std::nullopt;
    }
    const auto pid = owner.substr(first + 1, second - first - 1);
    const auto rest = owner.substr(second + 1);
    if (!detail::to_integer(pid) || !(rest.starts_with("thread:") || rest.starts_with("owner:"))) {
        return std::nullopt;
    }
    return std::string{pid};
}

/// The report as the program prints it: one "label: value" line each, list items indented;
/// `server` (where the lock was read) is the first line when not empty.
inline std::string format(const report& r, std::string_view server = {}) {
    std::ostringstream out;
    const auto line = [&out](std::string_view label, const std::string& value) {
        out << label << ':' << std::string(label.size() < 16 ? 16 - label.size() : 1, ' ') << value
            << '\n';
    };
    if (!server.empty()) {
        line("server", std::string{server});
    }
    line("lock", printable(r.name));
    std::string kind{kind_name(r.kind)};
    switch (r.kind) {
        case lock_kind::free:
            kind += " (no key: the lock is free)";
            break;
        case lock_kind::mutex:
            kind += " (a string holding the holder's token)";
            break;
        case lock_kind::recursive_mutex:
            kind += " (a hash of owner -> count)";
            break;
        case lock_kind::shared_mutex:
            kind += " (a hash of per-holder leases), mode " + printable(r.mode);
            break;
        case lock_kind::semaphore:
            kind += " (a sorted set of permit -> end of its lease)";
            break;
    }
    line("kind", kind);
    if (!r.one_moment) {
        line("read", "key by key, not one moment: " + detail::migrating_slot_text(r.name) +
                         " (commands on several of its keys answer TRYAGAIN)");
    }
    if (r.kind != lock_kind::free) {
        line("key expires in", r.key_ttl_ms ? duration_text(*r.key_ttl_ms) : "never (no TTL)");
    }
    if (r.permits) {
        std::int64_t live = 0;
        for (const holder& h : r.holders) {
            live += !h.remaining_ms || *h.remaining_ms > 0 ? 1 : 0;
        }
        line("permits", std::to_string(*r.permits) + " (" + printable(r.permits_key) + "), " +
                            std::to_string(std::max<std::int64_t>(*r.permits - live, 0)) + " free");
    }

    if (r.kept_for) {
        line("holders",
             "none: kept free for waiter " + printable(*r.kept_for) + ", told it may go" +
                 (r.key_ttl_ms ? " (" + duration_text(*r.key_ttl_ms) + " left)" : std::string{}));
    } else if (r.holders.empty()) {
        line("holders", "none");
    } else {
        line("holders", std::to_string(r.holders.size()));
    }
    for (const holder& h : r.holders) {
        out << "  ";
        if (!h.mode.empty()) {
            out << h.mode << ' ';
        }
        out << (r.kind == lock_kind::mutex       ? "token "
                : r.kind == lock_kind::semaphore ? "permit "
                                                 : "owner ")
            << printable(h.who);
        if (const auto pid = owner_process(h.who)) {
            out << " (process " << *pid << ')';
        }
        out << "  count " << h.count << "  lease ";
        if (!h.remaining_ms) {
            out << "none (no TTL)";
        } else if (*h.remaining_ms <= 0) {
            out << "expired (dropped by the next acquisition)";
        } else {
            out << duration_text(*h.remaining_ms) << " left";
        }
        if (!h.acquisition_id.empty()) {
            out << "  acquisition " << printable(h.acquisition_id);
        }
        out << '\n';
    }

    if (r.kind == lock_kind::shared_mutex || !r.waiting_writers.empty()) {
        line("waiting writers",
             r.waiting_writers.empty() ? "none" : std::to_string(r.waiting_writers.size()));
        for (const waiting_writer& w : r.waiting_writers) {
            out << (w.queued ? "  waiter " : "  owner ") << printable(w.owner);
            if (const auto pid = owner_process(w.owner)) {
                out << " (process " << *pid << ')';
            }
            out << (w.queued ? " in the queue" : "");
            if (w.remaining_ms) {
                out << "  keeps its place "
                    << (*w.remaining_ms > 0 ? duration_text(*w.remaining_ms) + " more"
                                            : std::string{"no longer"});
            }
            out << '\n';
        }
    }

    if (!r.queue_present) {
        line("waiters", "none (no queue)");
    } else {
        line("waiters", std::to_string(r.waiter_total));
        for (const waiter& w : r.waiters) {
            out << "  " << printable(w.id);
            if (w.ticket) {
                out << "  ticket " << *w.ticket;
            }
            if (w.remaining_ms) {
                out << "  claim "
                    << (*w.remaining_ms > 0 ? "expires in " + duration_text(*w.remaining_ms)
                                            : std::string{"expired"});
            }
            out << '\n';
        }
        if (r.waiter_total > static_cast<std::int64_t>(r.waiters.size())) {
            out << "  ... and " << r.waiter_total - static_cast<std::int64_t>(r.waiters.size())
                << " more\n";
        }
    }

    std::string fence;
    if (r.fence) {
        fence = std::to_string(*r.fence) + " (" + printable(r.fence_key);
        fence += r.fence_ttl_ms >= 0 ? ", expires in " + duration_text(r.fence_ttl_ms) + ")" : ")";
    } else {
        fence = "none (" + printable(r.fence_key) + " absent: no fenced acquisition in a day)";
    }
    line("fencing counter", fence);
    if (r.holder_fence) {
        line("holder's token", std::to_string(*r.holder_fence));
    }
    for (const auto& [field, value] : r.other_fields) {
        line("other field", printable(field) + " = " + printable(value));
    }
    return out.str();
}

/// The program's usage text.
inline constexpr std::string_view usage =
    "usage: redislock-inspect URI NAME [--force-release [--yes] | --watch [--count N]]\n"
    "\n"
    "Shows the lock or semaphore NAME: its kind, holders (owner, token or permit, count, lease\n"
    "left), a semaphore's permits, waiting writers, waiters and fencing counter, as the server\n"
    "that holds it has them.\n"
    "\n"
    "  URI              any URI the library's client takes:\n"
    "                     redis://[user:password@]host[:port][/db], rediss://..., unix:///path\n"
    "                     redis-sentinel://s1,s2#master (rediss-sentinel://): the master the\n"
    "                       sentinels name\n"
    "                     redis-cluster://seed1,seed2 (rediss-cluster://): the node serving\n"
    "                       NAME's slot, following MOVED and ASK\n"
    "  --force-release  free the lock after confirmation: deletes its key and queue keys, never\n"
    "                   its fencing counter; nothing is freed if the lock changed since shown\n"
    "  --yes            do not ask for confirmation\n"
    "  --watch          show the lock again every second, until interrupted\n"
    "  --count N        with --watch: stop after N views\n"
    "  --               what follows is the URI and NAME, even if it starts with '-'\n"
    "\n"
    "Exit status: 0 shown (and freed), 1 error (with --watch: the last view failed), 2 bad usage\n"
    "or URI, 3 not freed (not confirmed, or the lock changed since it was shown).\n";

/// The command line, parsed.
struct arguments {
    std::string uri;
    std::string name;
    bool force_release = false;
    bool yes = false;
    bool watch = false;
    std::optional<std::int64_t> count;  ///< --watch: the number of views; none: until interrupted
    bool help = false;
};

/// Parses the arguments after the program name.
/// @throws redislock::invalid_argument naming what is wrong.
inline arguments parse_arguments(std::span<const std::string_view> args) {
    arguments out;
    std::vector<std::string_view> positional;
    bool options_done = false;
    const auto parse_count = [&out](std::string_view text) {
        const auto n = detail::to_integer(text);
        if (!n || *n < 1) {
            throw invalid_argument{"--count takes a whole number of views, 1 or more; got '" +
                                   std::string{text} + "'"};
        }
        out.count = n;
    };
    for (std::size_t i = 0; i < args.size(); ++i) {
        const std::string_view arg = args[i];
        if (options_done || !arg.starts_with("-") || arg == "-") {
            positional.push_back(arg);
        } else if (arg == "--") {
            options_done = true;
        } else if (arg == "--force-release") {
            out.force_release = true;
        } else if (arg == "--yes" || arg == "-y") {
            out.yes = true;
        } else if (arg == "--watch" || arg == "-w") {
            out.watch = true;
        } else if (arg == "--count" || arg == "-n") {
            if (i + 1 == args.size()) {
                throw invalid_argument{"--count needs a number of views"};
            }
            parse_count(args[++i]);
        } else if (arg.starts_with("--count=")) {
            parse_count(arg.substr(std::string_view{"--count="}.size()));
        } else if (arg == "--help" || arg == "-h") {
            out.help = true;
        } else {
            throw invalid_argument{"unknown option '" + std::string{arg} + "'"};
        }
    }
    if (out.help) {
        return out;
    }
    if (positional.size() != 2) {
        throw invalid_argument{"expected URI and NAME, got " + std::to_string(positional.size()) +
                               " argument(s)"};
    }
    if (out.yes && !out.force_release) {
        throw invalid_argument{"--yes goes with --force-release"};
    }
    if (out.count && !out.watch) {
        throw invalid_argument{"--count goes with --watch"};
    }
    if (out.watch && out.force_release) {
        throw invalid_argument{
            "--watch and --force-release do not go together: watch, then free in another run"};
    }
    out.uri = std::string{positional[0]};
    out.name = std::string{positional[1]};
    return out;
}

/// The confirmation `in` must give before a force-release: "y" or "yes".
inline bool confirmed(std::istream& in) {
    std::string answer;
    if (!std::getline(in, answer)) {
        return false;
    }
    return answer == "y" || answer == "Y" || answer == "yes" || answer == "YES";
}

/// Where the lock `name` was read through `conn`, for the report's first line: "host:port, db N"
/// for one server, the master and the sentinels for Sentinel, the node the slot map names for
/// the name's slot on a Cluster, with the slot and, when the slot is being migrated (`migrating`)
/// or the read followed ASK (`asked`), that the data came partly or wholly from the node
/// importing it. Call it after the read, when the master or the slot map is known.
inline std::string server_text(any_connection& conn, std::string_view name, bool migrating = false,
                               bool asked = false) {
    if (const auto* node = conn.get<hiredis_connection>()) {
        return node->config().describe() + ", db " + std::to_string(node->config().db);
    }
    if (auto* sentinel = conn.get<sentinel_connection>()) {
        try {
            const endpoint master = sentinel->master();
            return master.describe() + ", db " + std::to_string(master.db) + " (the master of " +
                   conn.config().describe() + ")";
        } catch (const error&) {
            // a failover under way since the read: no master confirmed right now
            return "the master of " + conn.config().describe();
        }
    }
    const std::string node = conn.node_for_key(name);
    std::string text = (node.empty() ? std::string{"unknown node"} : node) + " (cluster slot " +
                       std::to_string(redislock::detail::key_slot(name));
    if (asked) {
        text +=
            ", being migrated: the slot map's owner; keys read through ASK on the node "
            "importing it";
    } else if (migrating) {
        text += ", being migrated";
    }
    return text + ")";
}

/// What run() waits with between the views of --watch: until the given time.
using view_wait = std::function<void(std::chrono::steady_clock::time_point)>;

namespace detail {

// The line that starts each view of --watch: its number and wall-clock time (UTC).
inline std::string view_heading(std::int64_t number, std::optional<std::int64_t> count) {
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm utc{};
    gmtime_r(&now, &utc);
    char clock[32];
    std::strftime(clock, sizeof clock, "%Y-%m-%d %H:%M:%S UTC", &utc);
    std::string text = "--- view " + std::to_string(number);
    if (count) {
        text += " of " + std::to_string(*count);
    }
    return text + ", " + clock + " ---\n";
}

}  // namespace detail

/// The program: `args` are the arguments after the program name; returns the exit status.
/// `wait_until` paces --watch (the tests step through the views with it).
inline int run(
    std::span<const std::string_view> args, std::istream& in, std::ostream& out, std::ostream& err,
    const view_wait& wait_until = [](std::chrono::steady_clock::time_point t) {
        std::this_thread::sleep_until(t);
    }) {
    constexpr std::string_view program = "redislock-inspect: ";
    arguments parsed;
    std::optional<any_connection> conn;
    try {
        parsed = parse_arguments(args);
        if (parsed.help) {
            out << usage;
            return 0;
        }
        redislock::detail::check_name(parsed.name);
        // Connects nothing yet: the first command does, and says so if it cannot.
        conn.emplace(any_connection::from_uri(parsed.uri));
    } catch (const invalid_argument& e) {
        err << program << e.what() << '\n' << usage;
        return 2;
    }
    // One view: the report, or the error that kept it from being read (status 1).
    const auto asks = [&] {
        const auto* cluster = conn->get<hiredis_cluster_connection>();
        return cluster != nullptr ? cluster->ask_redirections() : std::uint64_t{0};
    };
    const auto show = [&](report& seen) {
        try {
            const std::uint64_t asked_before = asks();
            seen = inspect(*conn, parsed.name);
            out << format(seen,
                          server_text(*conn, parsed.name, !seen.one_moment, asks() > asked_before));
            return 0;
        } catch (const unexpected_key_error& e) {
            err << program << e.what() << '\n';
        } catch (const timeout_error& e) {
            err << program << "no answer from Redis at " << conn->config().describe() << ": "
                << e.what() << '\n';
        } catch (const connection_error& e) {
            err << program << "cannot reach Redis at " << conn->config().describe() << ": "
                << e.what() << '\n';
        } catch (const error& e) {
            err << program << e.what() << '\n';
        } catch (const std::exception& e) {
            err << program << e.what() << '\n';
        }
        return 1;
    };

    report seen;
    if (parsed.watch) {
        // A view a second after the one before began; one that took longer (a hung server, a
        // migration) is followed at once, and the pace resumes from there, never in a burst.
        auto next = std::chrono::steady_clock::now();
        int status = 0;
        for (std::int64_t view = 1; !parsed.count || view <= *parsed.count; ++view) {
            if (view > 1) {
                wait_until(next);
                out << '\n';
            }
            next = std::max(next, std::chrono::steady_clock::now()) + std::chrono::seconds{1};
            out << detail::view_heading(view, parsed.count);
            status = show(seen);
            out << std::flush;
            err << std::flush;
        }
        return status;
    }
    if (const int status = show(seen); status != 0 || !parsed.force_release) {
        return status;
    }
    try {
        if (!something_to_free(seen)) {
            out << "nothing to free: the lock is not held and has no queue\n";
            return 0;
        }
        if (!parsed.yes) {
            out << "Free '" << printable(seen.name)
                << "'? Its holders lose it at their next renewal or verify(); the fencing "
                   "counter is kept. [y/N] "
                << std::flush;
            if (!confirmed(in)) {
                out << "not confirmed: nothing was freed\n";
                return 3;
            }
        }
        const release_result result = force_release(*conn, seen);
        if (result.changed) {
            out << "the lock changed since it was shown (a new holder, a release, a re-entry or a "
                   "read-write holder's renewal): nothing was freed; run again to see it as it "
                   "is now\n";
            return 3;
        }
        out << "freed '" << printable(seen.name)
            << "': " << (result.lock_deleted ? "lock key deleted" : "no lock key") << ", "
            << result.queue_keys_deleted << " queue key(s) deleted; fencing counter kept"
            << (seen.fence ? " at " + std::to_string(*seen.fence) : std::string{}) << '\n';
        return 0;
    } catch (const error& e) {
        err << program << e.what() << '\n';
        return 1;
    }
}

}  // namespace redislock::inspect
