// Random 128-bit tokens and instance ids, as 32 hex characters.
#pragma once

#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>

namespace redislock::detail {

/// Counts fork()s in the child, so a child never repeats its parent's random sequence.
inline std::atomic<std::uint64_t>& fork_generation() {
    static std::atomic<std::uint64_t> generation{0};
    static const bool registered = [] {
        ::pthread_atfork(nullptr, nullptr,
                         [] { fork_generation().fetch_add(1, std::memory_order_relaxed); });
        return true;
    }();
    (void)registered;
    return generation;
}

/// The fork generation now: an acquisition made in another generation belongs to a parent
/// process, which alone may release it.
inline std::uint64_t current_fork_generation() noexcept {
    return fork_generation().load(std::memory_order_relaxed);
}

/// xoshiro256** seeded per thread from std::random_device, reseeded after fork().
class random_source {
public:
    static std::uint64_t next() {
        thread_local random_source source;
        const auto generation = fork_generation().load(std::memory_order_relaxed);
        if (generation != source.generation_) {
            source.seed(generation);
        }
        return source.step();
    }

private:
    random_source() { seed(fork_generation().load(std::memory_order_relaxed)); }

    void seed(std::uint64_t generation) {
        std::random_device device;
        for (auto& word : state_) {
            word = (std::uint64_t{device()} << 32) ^ device();
        }
        generation_ = generation;
    }

    static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

    std::uint64_t step() {
        const std::uint64_t result = rotl(state_[1] * 5, 7) * 9;
        const std::uint64_t t = state_[1] << 17;
        state_[2] ^= state_[0];
        state_[3] ^= state_[1];
        state_[1] ^= state_[2];
        state_[0] ^= state_[3];
        state_[2] ^= t;
        state_[3] = rotl(state_[3], 45);
        return result;
    }

    std::array<std::uint64_t, 4> state_{};
    std::uint64_t generation_ = 0;
};

/// A random 128-bit value as 32 lowercase hex characters; no allocation.
class token {
public:
    static constexpr std::size_t size = 32;

    static token random() {
        token t;
        constexpr char digits[] = "0123456789abcdef";
        for (std::size_t half = 0; half < 2; ++half) {
            std::uint64_t bits = random_source::next();
            for (std::size_t i = 0; i < 16; ++i, bits >>= 4) {
                t.text_[half * 16 + i] = digits[bits & 0xf];
            }
        }
        return t;
    }

    std::string_view view() const noexcept { return {text_.data(), size}; }
    std::string str() const { return std::string{view()}; }
    friend bool operator==(const token&, const token&) = default;

private:
    std::array<char, size> text_{};
};

}  // namespace redislock::detail
