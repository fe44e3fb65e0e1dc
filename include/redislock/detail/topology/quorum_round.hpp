// detail::fan_out: one batch of commands sent to several nodes at once from the calling thread,
// and the replies gathered with poll(2) until every node answered, the deadline passed or a stop
// was requested. Also what a node's answer means to a quorum (node_answer, tally()).
//
// With a fanout_connection every batch is written first, so the nodes work on it at the same
// time, and the calling thread then waits for all their sockets at once: no thread hand-off on
// the way. A node with no connection open is connected on its own thread meanwhile
// (detail/topology/node_connector.hpp), and sent the batch once it is open if the round is not
// over: a connect that hangs never delays the other nodes. A call still unanswered when the round
// ends is destroyed, which closes its connection, so a late reply is never read as another
// command's. A connection without that capability is asked one node after another, each call ending
// by the round's deadline.
#pragma once

#include <poll.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/topology/node_connector.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::detail {

/// What one node answered. `yes`: it did what was asked (acquired, released, extended, still
/// ours); `no`: it refused because the key is not ours (held by another, expired); `failed`:
/// it could not say (down, hung, error reply).
enum class node_answer : unsigned char { pending, yes, no, failed };

struct node_outcome {
    node_answer answer = node_answer::pending;
    std::string error;           ///< for `failed`
    bool server_error = false;   ///< `failed` by an error reply, not by the network
    bool first_connect = false;  ///< `failed` only because its first connection was not open yet
};

struct quorum_tally {
    std::size_t yes = 0;
    std::size_t no = 0;
    std::size_t failed = 0;          ///< pending answers count as failed
    std::size_t first_connects = 0;  ///< of `failed`: nodes whose first connection was not open
};

inline quorum_tally tally(const std::vector<node_outcome>& outcomes) {
    quorum_tally t;
    for (const node_outcome& o : outcomes) {
        switch (o.answer) {
            case node_answer::yes:
                ++t.yes;
                break;
            case node_answer::no:
                ++t.no;
                break;
            case node_answer::pending:
            case node_answer::failed:
                ++t.failed;
                t.first_connects += o.first_connect ? 1 : 0;
                break;
        }
    }
    return t;
}

/// One command of a batch. With `evalsha` set the command is EVALSHA of that script, and a
/// node that answers NOSCRIPT gets SCRIPT LOAD and the command again.
struct fanout_command {
    command argv;
    const script* evalsha = nullptr;
};

/// What one node made of a batch.
struct node_replies {
    bool sent = false;           ///< the batch may have reached the node (or did)
    bool answered = false;       ///< every reply is in `replies`
    bool late = false;           ///< not answered: still outstanding when the round ended
    bool first_connect = false;  ///< not sent: its first connection was still being opened
    std::string error;           ///< why not answered
    std::vector<reply> replies;
};

/// Sends `commands` to every node of `order` (indices below `count`), all at once, and gathers
/// the replies until each of those nodes answered, `how.deadline` passed or *how.stop was
/// requested. Failures are reported per node; only std::bad_alloc is thrown.
///
/// With a fanout_connection, `nodes` gives:
///   nodes.start(i, commands, how)  std::optional<C::call>  the batch started on node i's
///                                  connection without waiting for a connect; std::nullopt,
///                                  nothing sent, when one must be opened first (throws: failed)
///   nodes.connector(i)             node_connector&         opens it on its own thread; the
///                                  round sends once it is open, if the round is not over
/// so a node slow to connect never delays the others. Otherwise, nodes.connection(i) gives the
/// connection (made now if need be, which may wait, or throw), and the nodes are asked one after
/// another in the order of `order`.
template <connection C, class Nodes>
std::vector<node_replies> fan_out(std::size_t count, Nodes&& nodes,
                                  std::span<const std::size_t> order,
                                  std::span<const fanout_command> commands,
                                  const call_context& how) {
    std::vector<node_replies> out(count);
    const auto past_deadline = [&how] { return std::chrono::steady_clock::now() >= how.deadline; };
    const auto stopped = [&how] { return how.stop != nullptr && how.stop->stop_requested(); };
    if constexpr (fanout_connection<C>) {
        using call = typename C::call;
        struct node_state {
            std::optional<call> in_flight;
            std::uint64_t connecting = 0;      // the connector's warm-up it waits for; 0: none
            std::vector<reply> first;          // replies to the batch, NOSCRIPT ones included
            std::vector<std::size_t> retried;  // commands sent again behind SCRIPT LOAD
            std::size_t loads = 0;             // SCRIPT LOADs in front of them
        };
        std::vector<node_state> state(count);
        std::vector<command> batch;
        batch.reserve(commands.size());
        for (const fanout_command& c : commands) {
            batch.push_back(c.argv);
        }
        // Made when a node has to connect first; connectors wake the round through it.
        std::shared_ptr<round_signal> signal;
        // Sends the batch to node i, or has its connection opened first.
        const auto begin = [&](std::size_t i) {
            try {
                if (past_deadline()) {
                    out[i].error = "not sent: the round's deadline had passed";
                    return;
                }
                if (std::optional<call> started =
                        nodes.start(i, std::span<const command>{batch}, how)) {
                    out[i].sent = true;
                    state[i].in_flight.emplace(std::move(*started));
                    return;
                }
                if (!signal) {
                    signal = std::make_shared<round_signal>();
                }
                state[i].connecting = nodes.connector(i).request(signal);
            } catch (const std::exception& e) {
                out[i].error = e.what();
            }
        };
        for (std::size_t i : order) {
            begin(i);
        }
        // Scripts the node did not know (a restart, SCRIPT FLUSH): SCRIPT LOAD, then only the
        // commands answered NOSCRIPT again, on a fresh call. False when none was.
        std::vector<std::array<std::string_view, 3>> loads;
        std::vector<command> again;
        const auto reload = [&](std::size_t i) {
            node_state& n = state[i];
            loads.clear();
            again.clear();
            for (std::size_t k = 0; k < commands.size(); ++k) {
                const script* s = commands[k].evalsha;
                if (s == nullptr || !n.first[k].is_error_code("NOSCRIPT")) {
                    continue;
                }
                n.retried.push_back(k);
                if (std::none_of(loads.begin(), loads.end(),
                                 [s](const auto& l) { return l[2].data() == s->source.data(); })) {
                    loads.push_back({"SCRIPT", "LOAD", s->source});
                }
            }
            if (n.retried.empty()) {
                return false;
            }
            for (const auto& l : loads) {
                again.emplace_back(l);
            }
            for (std::size_t k : n.retried) {
                again.push_back(commands[k].argv);
            }
            n.loads = loads.size();
            std::optional<call> started = nodes.start(i, std::span<const command>{again}, how);
            if (!started) {
                throw connection_error{"redislock: no free connection to load a script"};
            }
            n.in_flight.emplace(std::move(*started));
            return true;
        };
        // The node's replies, once its last call came back.
        const auto settle = [&](std::size_t i, std::vector<reply> replies) {
            node_state& n = state[i];
            if (n.retried.empty() && n.first.empty()) {
                n.first = std::move(replies);
                if (reload(i)) {
                    return;
                }
            } else {
                for (std::size_t l = 0; l < n.loads; ++l) {
                    if (replies[l].is_error()) {
                        throw server_error{"redislock: SCRIPT LOAD was refused: " +
                                           replies[l].text()};
                    }
                }
                for (std::size_t r = 0; r < n.retried.size(); ++r) {
                    n.first[n.retried[r]] = std::move(replies[n.loads + r]);
                }
            }
            out[i].answered = true;
            out[i].replies = std::move(n.first);
        };
        std::vector<pollfd> fds;
        std::vector<std::size_t> polled;
        constexpr std::chrono::milliseconds stop_poll_slice{5};
        // Nodes whose connector finished: send to those it connected.
        const auto take_connected = [&] {
            signal->drain();
            for (std::size_t i = 0; i < count; ++i) {
                if (state[i].connecting == 0) {
                    continue;
                }
                try {
                    const auto done = nodes.connector(i).result(state[i].connecting);
                    if (!done) {
                        continue;
                    }
                    state[i].connecting = 0;
                    if (done->ready) {
                        begin(i);  // may have to wait for another connection (one taken meanwhile)
                    } else {
                        out[i].error = done->error;
                    }
                } catch (const std::exception& e) {
                    state[i].connecting = 0;
                    out[i].error = e.what();
                }
            }
        };
        for (;;) {
            fds.clear();
            polled.clear();
            bool buffered = false;
            bool connecting = false;
            for (std::size_t i = 0; i < count; ++i) {
                if (state[i].in_flight) {
                    buffered = buffered || state[i].in_flight->buffered();
                    fds.push_back({state[i].in_flight->fd(), POLLIN, 0});
                    polled.push_back(i);
                }
                connecting = connecting || state[i].connecting != 0;
            }
            if ((polled.empty() && !connecting) || past_deadline() || stopped()) {
                break;
            }
            if (connecting) {
                fds.push_back({signal->fd(), POLLIN, 0});
            }
            auto slice = std::chrono::ceil<std::chrono::milliseconds>(
                how.deadline - std::chrono::steady_clock::now());
            if (how.stop != nullptr && how.stop->stop_possible()) {
                slice = std::min(slice, stop_poll_slice);
            }
            const int ready = ::poll(fds.data(), static_cast<nfds_t>(fds.size()),
                                     buffered ? 0 : static_cast<int>(slice.count()));
            if (ready < 0 && errno != EINTR) {
                break;
            }
            if (connecting && fds.back().revents != 0) {
                take_connected();
            }
            for (std::size_t k = 0; k < polled.size(); ++k) {
                const std::size_t i = polled[k];
                call& c = *state[i].in_flight;
                if (fds[k].revents == 0 && !c.buffered()) {
                    continue;
                }
                try {
                    if (c.read()) {
                        std::vector<reply> replies = c.take();
                        state[i].in_flight.reset();
                        settle(i, std::move(replies));
                    }
                } catch (const std::exception& e) {
                    state[i].in_flight.reset();
                    out[i].error = e.what();
                }
            }
        }
        for (std::size_t i = 0; i < count; ++i) {
            if (state[i].in_flight) {
                state[i].in_flight.reset();  // closes its connection: a late reply is never read
                out[i].late = true;
            }
            if (state[i].connecting != 0) {
                nodes.connector(i).forget(signal.get());
                out[i].error = "not sent: still connecting when the round ended";
                // Unknown rather than failed: its first warm-up has not ended, or has just
                // ended well (after the round's last look).
                const auto done = nodes.connector(i).result(state[i].connecting);
                out[i].first_connect =
                    (done && done->ready) || nodes.connector(i).never_warmed_up();
            }
        }
    } else {
        for (std::size_t i : order) {
            try {
                if (past_deadline()) {
                    out[i].error = "not sent: the round's deadline had passed";
                    continue;
                }
                C* conn = nodes.connection(i);
                if (conn == nullptr) {
                    continue;
                }
                out[i].sent = true;
                for (const fanout_command& c : commands) {
                    reply r = detail::execute(*conn, c.argv, how);
                    if (c.evalsha != nullptr && r.is_error_code("NOSCRIPT")) {
                        const std::array<std::string_view, 3> load{"SCRIPT", "LOAD",
                                                                   c.evalsha->source};
                        const reply loaded = detail::execute(*conn, load, how);
                        if (loaded.is_error()) {
                            throw server_error{"redislock: SCRIPT LOAD was refused: " +
                                               loaded.text()};
                        }
                        r = detail::execute(*conn, c.argv, how);
                    }
                    out[i].replies.push_back(std::move(r));
                }
                out[i].answered = true;
            } catch (const timeout_error& e) {
                out[i].replies.clear();
                out[i].late = true;
                out[i].error = e.what();
            } catch (const std::exception& e) {
                out[i].replies.clear();
                out[i].error = e.what();
            }
        }
    }
    return out;
}

}  // namespace redislock::detail
