// CRC16/XMODEM and the Redis Cluster key slot, as the cluster specification defines them.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace redislock::detail {

inline constexpr std::array<std::uint16_t, 256> crc16_table = [] {
    std::array<std::uint16_t, 256> table{};
    for (unsigned i = 0; i < 256; ++i) {
        std::uint16_t crc = static_cast<std::uint16_t>(i << 8);
        for (int bit = 0; bit < 8; ++bit) {
            crc = static_cast<std::uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
        }
        table[i] = crc;
    }
    return table;
}();

/// CRC16/XMODEM (polynomial 0x1021, initial value 0): crc16("123456789") == 0x31C3.
constexpr std::uint16_t crc16(std::string_view data) noexcept {
    std::uint16_t crc = 0;
    for (char c : data) {
        crc = static_cast<std::uint16_t>((crc << 8) ^
                                         crc16_table[((crc >> 8) ^ static_cast<unsigned char>(c)) & 0xff]);
    }
    return crc;
}

/// The part of `key` Redis Cluster hashes: the text of the first {...} when it is not empty,
/// else the whole key.
constexpr std::string_view hash_tag_part(std::string_view key) noexcept {
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

inline constexpr std::uint16_t cluster_slots = 16384;

/// The cluster slot of `key`.
constexpr std::uint16_t key_slot(std::string_view key) noexcept {
    return static_cast<std::uint16_t>(crc16(hash_tag_part(key)) % cluster_slots);
}

}  // namespace redislock::detail
