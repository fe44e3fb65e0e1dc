// detail::hiredis_subscriber_link: the subscriber link of the hiredis adapter, a dedicated context
// in subscriber mode read without blocking.
#pragma once

#include <poll.h>

#include <chrono>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <hiredis/hiredis.h>

#include <redislock/detail/wire/hiredis_io.hpp>
#include <redislock/error.hpp>
#include <redislock/reply.hpp>
#include <redislock/subscriber.hpp>

namespace redislock::detail {

/// A dedicated context in subscriber mode, read without blocking (see subscriber.hpp). A command
/// it sends waits for room in the socket no longer than `send_timeout`.
class hiredis_subscriber_link final : public subscriber_link {
public:
    hiredis_subscriber_link(context_ptr ctx, std::string describe,
                            std::chrono::milliseconds send_timeout)
        : ctx_{std::move(ctx)}, describe_{std::move(describe)}, send_timeout_{send_timeout} {}

    int fd() const noexcept override { return ctx_->fd; }

    void send(command argv) override {
        const auto deadline = std::chrono::steady_clock::now() + send_timeout_;
        switch (send_commands(*ctx_, std::span<const command>{&argv, 1}, deadline, nullptr)) {
            case send_outcome::sent:
                return;
            case send_outcome::failed:
                fail();
            case send_outcome::timed_out:
            case send_outcome::stopped:
                throw timeout_error{"redislock: subscriber connection to " + describe_ +
                                    " took no command within " +
                                    std::to_string(send_timeout_.count()) + " ms"};
        }
    }

    void read(std::vector<reply>& out) override {
        pollfd pfd{ctx_->fd, POLLIN, 0};
        if (buffered() || ::poll(&pfd, 1, 0) > 0) {
            if (redisBufferRead(ctx_.get()) != REDIS_OK) {
                fail();
            }
        }
        for (;;) {
            void* raw = nullptr;
            if (redisGetReplyFromReader(ctx_.get(), &raw) != REDIS_OK) {
                fail();
            }
            if (raw == nullptr) {
                return;
            }
            hiredis_reply_ptr owned{raw};
            out.push_back(convert_reply(*static_cast<redisReply*>(owned.get())));
        }
    }

    bool buffered() const noexcept override { return hiredis_tls_pending(*ctx_); }

    // A plain socket is read only after poll() found input; a TLS record may need more.
    bool reads_without_blocking() const noexcept override { return !hiredis_is_tls(*ctx_); }

private:
    [[noreturn]] void fail() {
        throw connection_error{"redislock: subscriber connection to " + describe_ + " failed: " +
                               (ctx_->errstr[0] != '\0' ? ctx_->errstr : "connection closed")};
    }

    context_ptr ctx_;
    std::string describe_;
    std::chrono::milliseconds send_timeout_;
};

}  // namespace redislock::detail
