// detail::wakeup_pipe: how another thread wakes the notifier's thread while it sleeps in poll()
// on its subscriber links: a byte written to a non-blocking pipe whose read end it polls with
// them. Apart from the notifier because it shares none of the notifier's state: its mutexes,
// channels and links play no part in it.
//
// Thread safety: poke(), poked() and read_fd() may be called from any thread once open()
// succeeded; open() and close() by the owner only, while no other thread uses the pipe.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <atomic>

namespace redislock::detail {

class wakeup_pipe {
public:
    wakeup_pipe() = default;
    wakeup_pipe(const wakeup_pipe&) = delete;
    wakeup_pipe& operator=(const wakeup_pipe&) = delete;
    ~wakeup_pipe() { close(); }

    /// Makes the pipe, both ends non-blocking and closed on exec. False when none can be made.
    bool open() noexcept {
        if (::pipe(pipe_) != 0) {
            return false;
        }
        for (int fd : pipe_) {
            ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
            ::fcntl(fd, F_SETFD, FD_CLOEXEC);
        }
        return true;
    }

    void close() noexcept {
        for (int& fd : pipe_) {
            if (fd >= 0) {
                ::close(fd);
                fd = -1;
            }
        }
    }

    /// The end to poll for POLLIN.
    int read_fd() const noexcept { return pipe_[0]; }

    /// Wakes the thread that polls read_fd(), or makes its next poll() return at once.
    void poke() noexcept {
        poked_.store(true, std::memory_order_release);
        if (pipe_[1] >= 0) {
            const char byte = 1;
            [[maybe_unused]] const auto ignored = ::write(pipe_[1], &byte, 1);
        }
    }

    /// True when the pipe may hold a byte: for a thread that polls it only once poked.
    bool poked() const noexcept { return poked_.load(std::memory_order_acquire); }

    /// Reads every byte the pipe holds.
    void empty() noexcept {
        poked_.store(false, std::memory_order_release);  // before: a later poke sets it again
        char drain[64];
        while (::read(pipe_[0], drain, sizeof drain) > 0) {
        }
    }

private:
    std::atomic<bool> poked_{false};  // the pipe may hold a byte
    int pipe_[2]{-1, -1};
};

}  // namespace redislock::detail
