// redislock-torture: the one source of randomness of a plan. splitmix64 with its own range
// reduction, so a seed draws the same plan with every compiler and standard library (the
// std::*_distribution templates are free to differ between them).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string_view>

namespace redislock::torture {

class rng {
public:
    explicit rng(std::uint64_t seed) : state_{seed} {}

    /// A generator of its own for one part of the plan (a thread, the faults), so that drawing
    /// more for one part never changes what another draws.
    rng stream(std::string_view part, std::uint64_t index = 0) const {
        std::uint64_t h = state_ ^ 0x6a09e667f3bcc909ULL;
        for (const char c : part) {
            h = mix(h ^ static_cast<unsigned char>(c));
        }
        return rng{mix(h ^ mix(index + 0x3c6ef372fe94f82bULL))};
    }

    std::uint64_t next() {
        state_ += 0x9e3779b97f4a7c15ULL;
        return mix(state_);
    }

    /// Uniform in [lo, hi].
    int between(int lo, int hi) {
        if (hi <= lo) {
            return lo;
        }
        const auto span = static_cast<std::uint64_t>(hi - lo) + 1;
        return lo + static_cast<int>(next() % span);
    }

    /// True with probability percent / 100.
    bool percent(int percent) { return between(0, 99) < percent; }

    /// Log-uniform in [lo, hi] (lo >= 1): as many draws between 1 and 10 ms as between 100 ms
    /// and 1 s.
    int log_between(int lo, int hi) {
        const double a = std::log(static_cast<double>(lo));
        const double b = std::log(static_cast<double>(hi));
        const double u = static_cast<double>(next() >> 11) / 9007199254740992.0;
        const int v = static_cast<int>(std::lround(std::exp(a + (b - a) * u)));
        return v < lo ? lo : v > hi ? hi : v;
    }

    /// An index drawn with the given weights.
    std::size_t weighted(std::initializer_list<int> weights) {
        int total = 0;
        for (const int w : weights) {
            total += w;
        }
        int draw = between(0, total - 1);
        std::size_t index = 0;
        for (const int w : weights) {
            if (draw < w) {
                return index;
            }
            draw -= w;
            ++index;
        }
        return 0;
    }

private:
    static std::uint64_t mix(std::uint64_t z) {
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        return z ^ (z >> 31);
    }

    std::uint64_t state_;
};

}  // namespace redislock::torture
