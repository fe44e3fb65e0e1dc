// redislock::reply: the library's own small value type for a Redis reply.
//
// Connection adapters convert their client's reply into this type, so the locks never depend on
// a particular client library. A reply is a plain value: copyable, movable, no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <redislock/error.hpp>

namespace redislock {

/// The RESP type of a reply.
enum class reply_kind { nil, integer, string, status, error, array };

/// One Redis reply: nil, integer, string, status, error or an array of replies. A plain value.
class reply {
public:
    /// A nil reply (RESP null bulk string or null array).
    reply() = default;

    /// A nil reply.
    static reply nil() { return reply{}; }
    /// An integer reply.
    static reply integer(std::int64_t value) {
        reply r{reply_kind::integer};
        r.integer_ = value;
        return r;
    }
    /// A bulk string reply.
    static reply string(std::string value) { return reply{reply_kind::string, std::move(value)}; }
    /// A status reply, such as OK.
    static reply status(std::string value) { return reply{reply_kind::status, std::move(value)}; }
    /// An error reply; `value` starts with the error code, e.g. "NOSCRIPT ...".
    static reply error(std::string value) { return reply{reply_kind::error, std::move(value)}; }
    /// An array reply.
    static reply array(std::vector<reply> elements) {
        reply r{reply_kind::array};
        r.elements_ = std::move(elements);
        return r;
    }

    /// The reply's RESP type.
    reply_kind kind() const noexcept { return kind_; }
    /// True for a nil reply.
    bool is_nil() const noexcept { return kind_ == reply_kind::nil; }
    /// True for an integer reply.
    bool is_integer() const noexcept { return kind_ == reply_kind::integer; }
    /// True for a bulk string reply.
    bool is_string() const noexcept { return kind_ == reply_kind::string; }
    /// True for a status reply.
    bool is_status() const noexcept { return kind_ == reply_kind::status; }
    /// True for an error reply.
    bool is_error() const noexcept { return kind_ == reply_kind::error; }
    /// True for an array reply.
    bool is_array() const noexcept { return kind_ == reply_kind::array; }

    /// The value of an integer reply; 0 for other kinds.
    std::int64_t as_integer() const noexcept { return integer_; }
    /// The text of a string, status or error reply; empty for other kinds.
    const std::string& text() const noexcept { return text_; }
    /// The elements of an array reply; empty for other kinds.
    const std::vector<reply>& elements() const noexcept { return elements_; }

    /// True for an error reply whose code (first word) is `code`, e.g. "NOSCRIPT". Also true
    /// when a script's redis.call() raised that error on Redis before 7.0, which wraps it:
    /// "ERR Error running script (call to f_...): @user_script:6: WRONGTYPE ...".
    bool is_error_code(std::string_view code) const noexcept {
        if (!is_error()) {
            return false;
        }
        const std::string_view text{text_};
        if (text.substr(0, code.size()) == code &&
            (text.size() == code.size() || text[code.size()] == ' ')) {
            return true;
        }
        const auto at = text.find(code);
        return at != std::string_view::npos && at >= 2 && text.substr(at - 2, 2) == ": " &&
               (at + code.size() == text.size() || text[at + code.size()] == ' ');
    }

    /// Throws server_error if this is an error reply; returns *this otherwise.
    const reply& throw_if_error() const& {
        if (is_error()) {
            throw server_error{"redislock: server error: " + text_};
        }
        return *this;
    }

    friend bool operator==(const reply&, const reply&) = default;

private:
    explicit reply(reply_kind kind, std::string text = {}) : kind_{kind}, text_{std::move(text)} {}

    reply_kind kind_ = reply_kind::nil;
    std::int64_t integer_ = 0;
    std::string text_;
    std::vector<reply> elements_;
};

}  // namespace redislock
