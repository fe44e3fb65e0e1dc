// detail::resp_command: one command in the Redis protocol's wire form (RESP), ready to send.
//
// hiredis formats an argv piece by piece into a growing string (a printf-like call and a
// reallocation per argument); for the short commands the locks send that was most of the
// client's work per round trip. Here the length is counted first and the text written once,
// into a buffer on the stack when it fits.
//
// Not copyable or movable (it may point into itself); build one where it is sent.
#pragma once

#include <charconv>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>

namespace redislock::detail {

class resp_command {
public:
    /// Formats `argv` as a RESP array of bulk strings: *N\r\n then $len\r\narg\r\n per argument.
    explicit resp_command(std::span<const std::string_view> argv) {
        std::size_t size = 1 + decimal_digits(argv.size()) + 2;
        for (std::string_view arg : argv) {
            size += 1 + decimal_digits(arg.size()) + 2 + arg.size() + 2;
        }
        if (size > inline_capacity) {
            heap_ = std::make_unique_for_overwrite<char[]>(size);
            data_ = heap_.get();
        }
        char* out = write_header('*', argv.size(), data_);
        for (std::string_view arg : argv) {
            out = write_header('$', arg.size(), out);
            if (!arg.empty()) {
                std::memcpy(out, arg.data(), arg.size());
            }
            out += arg.size();
            out = write_crlf(out);
        }
        size_ = static_cast<std::size_t>(out - data_);
    }
    resp_command(const resp_command&) = delete;
    resp_command& operator=(const resp_command&) = delete;

    const char* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }

private:
    // Enough for every command the locks send; longer ones (a Lua source) go to the heap.
    static constexpr std::size_t inline_capacity = 512;

    static std::size_t decimal_digits(std::size_t value) noexcept {
        std::size_t digits = 1;
        for (; value >= 10; value /= 10) {
            ++digits;
        }
        return digits;
    }

    static char* write_crlf(char* out) noexcept {
        out[0] = '\r';
        out[1] = '\n';
        return out + 2;
    }

    static char* write_header(char type, std::size_t value, char* out) noexcept {
        *out++ = type;
        out = std::to_chars(out, out + decimal_digits(value), value).ptr;
        return write_crlf(out);
    }

    char inline_[inline_capacity];
    std::unique_ptr<char[]> heap_;
    char* data_ = inline_;
    std::size_t size_ = 0;
};

}  // namespace redislock::detail
