#pragma once

// redislock::test::faulty_connection<Inner>: a connection that forwards to a real one (Inner,
// e.g. hiredis_connection) and injects faults into chosen commands, for unit tests of what a
// lock does when one particular round trip goes wrong.
//
//   faulty_connection<hiredis_connection> conn{srv.uri()};
//   redislock::basic_client<faulty_connection<hiredis_connection>> client{conn};
//   conn.add(fault_rule{.command = "EVALSHA", .script = "mutex_release",
//                       .action = fault_action::drop_reply});
//
// Copies share one state (the inner connection, the rules and the log), so the test keeps a copy
// as a handle while the client owns another, and changes the rules while locks run. It models
// exactly the capabilities of Inner: execute(argv) always; execute(argv, how),
// execute_pipeline(commands) and execute_pipeline(commands, hows) when Inner has them.
//
// Rules are tried in the order they were added; the first that matches a command decides its
// fault. A rule matches on the command name (EVALSHA, SET, ...; empty: any) and for EVALSHA on the
// script (its name from detail/wire/scripts.hpp, or its SHA1), and counts the commands it matched:
// it fires on occurrences first .. first + times - 1 (1-based), so {.first = 3, .times = 1} is
// "the third matching command only".
//
// Delays honour the call's context like a slow network would under a connection that honours
// it: a delay that runs past how.deadline ends at the deadline with timeout_error (the command
// sent or not, as the action says), and a stop request ends it at once with cancelled_error.
//
// Thread-safe: any copy may be used from any thread.

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <redislock/connection.hpp>
#include <redislock/detail/wire/scripts.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/script.hpp>

namespace redislock::test {

/// Every script the library embeds, to name them in rules and logs.
inline std::span<const redislock::script> embedded_scripts() {
    namespace s = redislock::detail::scripts;
    static const std::array all{s::mutex_acquire,     s::mutex_extend,      s::mutex_release,
                                s::queue_leave,       s::recursive_acquire, s::recursive_extend,
                                s::recursive_release, s::shared_acquire,    s::shared_extend,
                                s::shared_release,    s::compare_and_delete};
    return all;
}

/// The name of the embedded script with this SHA1, or the SHA1 itself if none has it.
inline std::string script_name_for(std::string_view sha1) {
    for (const auto& s : embedded_scripts()) {
        if (s.sha1 == sha1) {
            return std::string{s.name};
        }
    }
    return std::string{sha1};
}

enum class fault_action {
    drop_reply,         ///< send the command, wait for its reply, discard it, throw timeout_error
    throw_after_send,   ///< send the command, wait for its reply, throw connection_error
    throw_before_send,  ///< throw connection_error; the server never sees the command
    error_reply,        ///< answer rule.error_text as an error reply without sending
    delay_before,       ///< wait rule.delay, then send as usual
    delay_after,        ///< send as usual, then wait rule.delay before returning the reply
};

inline std::string_view to_string(fault_action action) {
    switch (action) {
        case fault_action::drop_reply:
            return "drop_reply";
        case fault_action::throw_after_send:
            return "throw_after_send";
        case fault_action::throw_before_send:
            return "throw_before_send";
        case fault_action::error_reply:
            return "error_reply";
        case fault_action::delay_before:
            return "delay_before";
        case fault_action::delay_after:
            return "delay_after";
    }
    return "unknown";
}

struct fault_rule {
    /// Command name as the library sends it (case-insensitive); empty matches every command.
    std::string command{};
    /// For EVALSHA: the script's name (e.g. "mutex_release") or SHA1; empty matches any script.
    std::string script{};
    fault_action action = fault_action::drop_reply;
    /// First matching occurrence that gets the fault, counted from 1 since the rule was added.
    int first = 1;
    /// How many matching occurrences from `first` on get it; forever for a negative value.
    int times = 1;
    /// For delay_before and delay_after.
    std::chrono::milliseconds delay{0};
    /// For error_reply.
    std::string error_text = "ERR injected by faulty_connection";

    static constexpr int forever = -1;
};

/// One command as the connection saw it.
struct seen_command {
    std::string name;    ///< e.g. "EVALSHA", upper case as sent
    std::string script;  ///< for EVALSHA: the script's name; for SCRIPT: the subcommand
    std::optional<fault_action> fault;
    std::string text() const {
        std::string out = name;
        if (!script.empty()) {
            out += " " + script;
        }
        if (fault) {
            out += " [" + std::string{to_string(*fault)} + "]";
        }
        return out;
    }
};

namespace detail {

inline bool same_name(std::string_view a, std::string_view b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
        const auto upper = [](char c) { return c >= 'a' && c <= 'z' ? char(c - 'a' + 'A') : c; };
        return upper(x) == upper(y);
    });
}

}  // namespace detail

template <redislock::connection Inner>
class faulty_connection {
public:
    /// Builds the inner connection from `args` (e.g. a URI for hiredis_connection).
    template <class... Args>
    requires(sizeof...(Args) > 0 && std::constructible_from<Inner, Args...> &&
             !(sizeof...(Args) == 1 &&
               (std::same_as<std::remove_cvref_t<Args>, faulty_connection> ||
                ...))) explicit faulty_connection(Args&&... args)
        : state_{std::make_shared<state>(std::forward<Args>(args)...)} {}

    /// Adds a rule after the existing ones.
    void add(fault_rule rule) {
        std::lock_guard guard{state_->mutex};
        rule.script = resolve_script(rule.script);
        state_->rules.push_back({std::move(rule), 0});
    }

    /// Removes every rule; commands in flight finish as they started.
    void clear_rules() {
        std::lock_guard guard{state_->mutex};
        state_->rules.clear();
    }

    /// Faults injected so far, by every rule.
    std::size_t faults_injected() const {
        std::lock_guard guard{state_->mutex};
        return state_->injected;
    }

    /// Faults the rules with a finite count have still to inject.
    std::size_t pending_faults() const {
        return pending([](const fault_rule&) { return true; });
    }

    /// As pending_faults(), for the rules on exactly `command` and `script` (empty: any).
    std::size_t pending_faults(std::string_view command, std::string_view script) const {
        const std::string wanted_script = resolve_script(script);
        return pending([&](const fault_rule& rule) {
            return detail::same_name(rule.command, command) && rule.script == wanted_script;
        });
    }

    /// Every command seen, in order (pipelined ones one by one).
    std::vector<seen_command> log() const {
        std::lock_guard guard{state_->mutex};
        return state_->log;
    }

    /// The log as text, one entry per command: "EVALSHA mutex_release [drop_reply]".
    std::vector<std::string> log_text() const {
        std::vector<std::string> out;
        for (const auto& entry : log()) {
            out.push_back(entry.text());
        }
        return out;
    }

    /// How many logged commands are named `name` and, when given, run `script`.
    std::size_t count(std::string_view name, std::string_view script = {}) const {
        const std::string wanted_script = resolve_script(script);
        std::lock_guard guard{state_->mutex};
        return static_cast<std::size_t>(
            std::count_if(state_->log.begin(), state_->log.end(), [&](const seen_command& c) {
                return detail::same_name(c.name, name) &&
                       (wanted_script.empty() || c.script == wanted_script);
            }));
    }

    void clear_log() {
        std::lock_guard guard{state_->mutex};
        state_->log.clear();
    }

    /// The wrapped connection, to send commands that bypass the rules and the log.
    Inner& inner() { return state_->inner; }

    reply execute(redislock::command argv) { return run_one(argv, nullptr); }

    reply execute(redislock::command argv,
                  const call_context& how) requires contextual_connection<Inner> {
        return run_one(argv, &how);
    }

    std::vector<reply> execute_pipeline(std::span<const redislock::command> commands) requires
        pipelining_connection<Inner> {
        return run_pipeline(commands, {});
    }

    std::vector<reply> execute_pipeline(std::span<const redislock::command> commands,
                                        std::span<const call_context> hows) requires
        contextual_pipelining_connection<Inner> {
        return run_pipeline(commands, hows);
    }

private:
    struct counted_rule {
        fault_rule rule;
        int matched;
    };

    struct state {
        template <class... Args>
        explicit state(Args&&... args) : inner(std::forward<Args>(args)...) {}

        Inner inner;
        mutable std::mutex mutex;
        std::vector<counted_rule> rules;
        std::vector<seen_command> log;
        std::size_t injected = 0;
    };

    template <class Which>
    std::size_t pending(Which which) const {
        std::lock_guard guard{state_->mutex};
        std::size_t left = 0;
        for (const auto& [rule, matched] : state_->rules) {
            if (rule.times >= 0 && which(rule)) {
                left += static_cast<std::size_t>(
                    std::max(0, std::min(rule.times, rule.first + rule.times - 1 - matched)));
            }
        }
        return left;
    }

    // A rule's script as it is logged: the name of an embedded script, else the text given.
    static std::string resolve_script(std::string_view script) {
        for (const auto& s : embedded_scripts()) {
            if (s.sha1 == script || s.name == script) {
                return std::string{s.name};
            }
        }
        return std::string{script};
    }

    static seen_command describe(redislock::command argv) {
        seen_command seen;
        if (argv.empty()) {
            return seen;
        }
        seen.name = std::string{argv[0]};
        std::transform(seen.name.begin(), seen.name.end(), seen.name.begin(),
                       [](char c) { return c >= 'a' && c <= 'z' ? char(c - 'a' + 'A') : c; });
        if (seen.name == "EVALSHA" && argv.size() > 1) {
            seen.script = script_name_for(argv[1]);
        } else if (seen.name == "SCRIPT" && argv.size() > 1) {
            seen.script = std::string{argv[1]};
        }
        return seen;
    }

    // Logs the command and returns the rule that fires for it, if any.
    std::optional<fault_rule> choose(redislock::command argv) {
        seen_command seen = describe(argv);
        std::optional<fault_rule> chosen;
        std::lock_guard guard{state_->mutex};
        for (auto& [rule, matched] : state_->rules) {
            if (!rule.command.empty() && !detail::same_name(rule.command, seen.name)) {
                continue;
            }
            if (!rule.script.empty() && rule.script != seen.script) {
                continue;
            }
            ++matched;
            if (!chosen && matched >= rule.first &&
                (rule.times < 0 || matched < rule.first + rule.times)) {
                chosen = rule;
            }
        }
        if (chosen) {
            seen.fault = chosen->action;
            ++state_->injected;
        }
        state_->log.push_back(std::move(seen));
        return chosen;
    }

    // Waits `delay`, ended early by the call's deadline (timeout_error) or a stop request
    // (cancelled_error).
    static void wait(std::chrono::milliseconds delay, const call_context* how) {
        using clock = std::chrono::steady_clock;
        const auto until = clock::now() + delay;
        const auto deadline = how != nullptr ? how->deadline : clock::time_point::max();
        const std::stop_token* stop = how != nullptr ? how->stop : nullptr;
        if (stop == nullptr || !stop->stop_possible()) {
            std::this_thread::sleep_until(std::min(until, deadline));
        } else {
            std::mutex m;
            std::condition_variable_any cv;
            std::unique_lock lock{m};
            cv.wait_until(lock, *stop, std::min(until, deadline), [] { return false; });
            if (stop->stop_requested()) {
                throw cancelled_error{"faulty_connection: stop requested during an injected delay"};
            }
        }
        if (deadline < until) {
            throw timeout_error{
                "faulty_connection: the call's deadline passed during an "
                "injected delay"};
        }
    }

    reply send(redislock::command argv, const call_context* how) {
        if constexpr (contextual_connection<Inner>) {
            if (how != nullptr) {
                return state_->inner.execute(argv, *how);
            }
        }
        return state_->inner.execute(argv);
    }

    // The plain pipeline when no contexts came with the batch and Inner has one; else the
    // contextual one, with default contexts where none came.
    std::vector<reply> send_pipeline(std::span<const redislock::command> commands,
                                     std::vector<call_context>& hows) {
        if constexpr (pipelining_connection<Inner>) {
            if (hows.empty()) {
                return state_->inner.execute_pipeline(commands);
            }
        }
        if constexpr (contextual_pipelining_connection<Inner>) {
            hows.resize(commands.size());
            return state_->inner.execute_pipeline(commands, std::span<const call_context>{hows});
        } else {
            throw std::logic_error{"faulty_connection: Inner cannot run this pipeline"};
        }
    }

    reply run_one(redislock::command argv, const call_context* how) {
        const std::optional<fault_rule> rule = choose(argv);
        if (!rule) {
            return send(argv, how);
        }
        switch (rule->action) {
            case fault_action::throw_before_send:
                throw connection_error{"faulty_connection: connection lost before sending"};
            case fault_action::error_reply:
                return reply::error(rule->error_text);
            case fault_action::drop_reply:
                (void)send(argv, how);
                throw timeout_error{"faulty_connection: the reply was lost"};
            case fault_action::throw_after_send:
                (void)send(argv, how);
                throw connection_error{"faulty_connection: connection lost after sending"};
            case fault_action::delay_before:
                wait(rule->delay, how);
                return send(argv, how);
            case fault_action::delay_after: {
                reply r = send(argv, how);
                wait(rule->delay, how);
                return r;
            }
        }
        throw std::logic_error{"faulty_connection: unknown fault_action"};
    }

    // Each command of the pipeline is matched on its own. Error replies stand in for their
    // commands, which are left out of what is sent; a throw_before_send anywhere sends nothing;
    // a drop_reply or throw_after_send anywhere sends the rest and then throws; the longest
    // delay_before and delay_after apply to the whole batch.
    std::vector<reply> run_pipeline(std::span<const redislock::command> commands,
                                    std::span<const call_context> hows) {
        std::vector<std::optional<fault_rule>> rules;
        for (const auto& argv : commands) {
            rules.push_back(choose(argv));
        }
        const call_context* how = nullptr;
        call_context earliest;
        for (const auto& h : hows) {
            earliest.deadline = std::min(earliest.deadline, h.deadline);
            if (earliest.stop == nullptr) {
                earliest.stop = h.stop;
            }
            how = &earliest;
        }
        std::chrono::milliseconds before{0};
        std::chrono::milliseconds after{0};
        std::optional<fault_action> failure;
        for (const auto& rule : rules) {
            if (!rule) {
                continue;
            }
            switch (rule->action) {
                case fault_action::throw_before_send:
                    throw connection_error{"faulty_connection: connection lost before sending"};
                case fault_action::drop_reply:
                case fault_action::throw_after_send:
                    failure = failure.value_or(rule->action);
                    break;
                case fault_action::delay_before:
                    before = std::max(before, rule->delay);
                    break;
                case fault_action::delay_after:
                    after = std::max(after, rule->delay);
                    break;
                case fault_action::error_reply:
                    break;
            }
        }
        if (before > std::chrono::milliseconds::zero()) {
            wait(before, how);
        }
        std::vector<redislock::command> forwarded;
        std::vector<call_context> forwarded_hows;
        for (std::size_t i = 0; i < commands.size(); ++i) {
            if (!rules[i] || rules[i]->action != fault_action::error_reply) {
                forwarded.push_back(commands[i]);
                if (i < hows.size()) {
                    forwarded_hows.push_back(hows[i]);
                }
            }
        }
        std::vector<reply> sent_replies;
        if (!forwarded.empty()) {
            sent_replies = send_pipeline(forwarded, forwarded_hows);
        }
        if (failure == fault_action::drop_reply) {
            throw timeout_error{"faulty_connection: the pipeline's replies were lost"};
        }
        if (failure == fault_action::throw_after_send) {
            throw connection_error{"faulty_connection: connection lost after sending"};
        }
        if (after > std::chrono::milliseconds::zero()) {
            wait(after, how);
        }
        std::vector<reply> replies;
        std::size_t next = 0;
        for (std::size_t i = 0; i < commands.size(); ++i) {
            if (rules[i] && rules[i]->action == fault_action::error_reply) {
                replies.push_back(reply::error(rules[i]->error_text));
            } else {
                replies.push_back(std::move(sent_replies.at(next++)));
            }
        }
        return replies;
    }

    std::shared_ptr<state> state_;
};

}  // namespace redislock::test
