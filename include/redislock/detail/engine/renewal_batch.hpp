// One batch of the watchdog engine: the renewal each due lease sends (renewal_job,
// make_renewal_job), one reply per renewal once its WAIT's is folded in (one_reply_per_renewal),
// and what that reply means (renewal_outcome, renewal_result, classify_renewal) and, for a lease
// lost, the reason and message it is told (loss_reason_of, why_lost). Apart from
// watchdog_engine.hpp, which owns the thread, the queue and the connection: these are plain
// functions of a lease's record and a reply, and hold no lock and do no I/O.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/engine/watchdog_lease.hpp>
#include <redislock/events.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

// A renewal taken out of the queue for one batch.
struct renewal_job {
    std::uint64_t id;  // the watchdog_engine's lease_id
    const script* renew_script;
    std::vector<std::string_view> argv;      // EVALSHA sha nkeys keys... args...; empty: expiry
    call_context how;                        // the first key, and when the lease surely ends
    int min_replicas = 0;                    // > 0: a WAIT follows the renewal
    std::array<std::string, 2> wait_text{};  // WAIT's arguments
};

enum class renewal_outcome { renewed, not_ours, server_lost, failed };

// What one renewal came to, and for a failure what it got (empty: no reply).
struct renewal_result {
    renewal_outcome what = renewal_outcome::failed;
    std::string why{};

    std::string_view told() const { return why.empty() ? "no reply" : std::string_view{why}; }
};

// The job's strings point into `e`, which must stay put until the batch is sent.
inline renewal_job make_renewal_job(std::uint64_t id, const watchdog_lease& e) {
    static constexpr std::array<std::string_view, 10> digits{"0", "1", "2", "3", "4",
                                                             "5", "6", "7", "8", "9"};
    renewal_job j{id, e.renewal.renew_script, {}, {}, e.renewal.min_replicas, {}};
    if (j.min_replicas > 0) {
        j.wait_text = {std::to_string(j.min_replicas),
                       std::to_string(e.renewal.replica_timeout.count())};
    }
    const auto& r = e.renewal;
    if (e.expiring) {
        return j;  // no command: only the expiry check
    }
    if (!r.keys.empty()) {
        j.how.key = r.keys.front();
    }
    j.argv.reserve(3 + r.keys.size() + r.args.size());
    j.argv.push_back("EVALSHA");
    j.argv.push_back(r.renew_script->sha1);
    j.argv.push_back(digits[r.keys.size()]);
    for (const std::string& key : r.keys) {
        j.argv.push_back(key);
    }
    for (const std::string& arg : r.args) {
        j.argv.push_back(arg);
    }
    return j;
}

// `replies` answer the batch's renewals of `which`, each followed by its WAIT when its lock asks
// for replica acknowledgements. One reply per renewal; a renewal too few replicas acknowledged
// counts as failed.
inline std::vector<reply> one_reply_per_renewal(const std::vector<renewal_job>& batch,
                                                const std::vector<std::size_t>& which,
                                                std::vector<reply> replies) {
    std::vector<reply> results;
    results.reserve(which.size());
    std::size_t k = 0;
    for (std::size_t i : which) {
        reply r = std::move(replies[k++]);
        if (batch[i].min_replicas > 0) {
            const reply& acknowledged = replies[k++];
            if (r.is_integer() && r.as_integer() == 1 &&
                (!acknowledged.is_integer() || acknowledged.as_integer() < batch[i].min_replicas)) {
                r = reply::error("NOREPLICAS too few replicas acknowledged the renewal");
            }
        }
        results.push_back(std::move(r));
    }
    return results;
}

inline renewal_result classify_renewal(const reply& r) {
    if (r.is_integer()) {
        return r.as_integer() == 1
                   ? renewal_result{renewal_outcome::renewed}
                   : renewal_result{renewal_outcome::not_ours, "the lock is not ours"};
    }
    // WRONGTYPE: the name now holds something else, so ours is gone. READONLY: the node was
    // demoted to a replica, which cannot keep a lock for anyone. Other errors: retry.
    if (r.is_error_code("WRONGTYPE") || r.is_error_code("READONLY")) {
        return {renewal_outcome::server_lost, r.text()};
    }
    return {renewal_outcome::failed, r.is_error() ? r.text() : "an unexpected reply"};
}

inline loss_reason loss_reason_of(renewal_outcome what) {
    switch (what) {
        case renewal_outcome::not_ours:
            return loss_reason::taken;
        case renewal_outcome::server_lost:
            return loss_reason::server_lost;
        default:
            return loss_reason::expired;  // max_hold, or no renewal confirmed in time
    }
}

inline std::string why_lost(const watchdog_lease& e, const renewal_result& r) {
    if (e.expiring) {
        return "max_hold reached";
    }
    if (r.what == renewal_outcome::failed) {
        return "no renewal was confirmed before the lease ran out (" + std::string{r.told()} + ")";
    }
    return std::string{r.told()};
}

}  // namespace redislock::detail
