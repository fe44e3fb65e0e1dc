// Redis Cluster key slots: CRC16 (XMODEM) of the key, or of its hash tag, modulo 16384.
//
// The rules are the cluster specification's: when a key holds a '{' followed later by a '}' with
// at least one character between them, only the text between the first '{' and the first '}'
// after it is hashed. `{user1000}.following` hashes "user1000", `foo{}{bar}` hashes all of it
// (the first tag is empty), `foo{{bar}}zap` hashes "{bar", `foo{bar}{zap}` hashes "bar".
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace redislock::detail {

/// Number of hash slots of a Redis Cluster.
inline constexpr std::size_t cluster_slot_count = 16384;

inline constexpr std::array<std::uint16_t, 256> make_crc16_table() {
    std::array<std::uint16_t, 256> table{};
    for (std::uint32_t byte = 0; byte < 256; ++byte) {
        std::uint32_t crc = byte << 8;
        for (int bit = 0; bit < 8; ++bit) {
            crc = (crc & 0x8000U) != 0 ? (crc << 1) ^ 0x1021U : crc << 1;
        }
        table[byte] = static_cast<std::uint16_t>(crc & 0xffffU);
    }
    return table;
}

inline constexpr std::array<std::uint16_t, 256> crc16_table = make_crc16_table();

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), as Redis Cluster computes it.
constexpr std::uint16_t crc16(std::string_view data) noexcept {
    std::uint16_t crc = 0;
    for (const char c : data) {
        const auto byte = static_cast<std::uint8_t>(c);
        crc = static_cast<std::uint16_t>((crc << 8) ^ crc16_table[((crc >> 8) ^ byte) & 0xffU]);
    }
    return crc;
}

/// The part of `key` that Redis Cluster hashes: its hash tag if it has a non-empty one, else
/// the whole key.
constexpr std::string_view hashed_part(std::string_view key) noexcept {
    const auto open = key.find('{');
    if (open == std::string_view::npos) {
        return key;
    }
    const auto close = key.find('}', open + 1);
    if (close == std::string_view::npos || close == open + 1) {
        return key;
    }
    return key.substr(open + 1, close - open - 1);
}

/// The hash slot of `key`, in [0, 16384).
constexpr std::uint16_t key_slot(std::string_view key) noexcept {
    return static_cast<std::uint16_t>(crc16(hashed_part(key)) & (cluster_slot_count - 1));
}

}  // namespace redislock::detail
