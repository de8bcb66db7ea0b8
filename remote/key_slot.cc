// SPDX-License-Identifier: Apache-2.0
// CRC16/XMODEM and the Redis Cluster key-to-slot rule (see remote/key_slot.h).
#include "remote/key_slot.h"

#include <array>

namespace ckv::remote {
namespace {

// The table of the byte-at-a-time CRC16/XMODEM (polynomial 0x1021, MSB first), built at compile
// time from the polynomial rather than pasted.
constexpr std::array<uint16_t, 256> MakeCrc16Table() {
  std::array<uint16_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint16_t crc = static_cast<uint16_t>(byte << 8);
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<uint16_t>(crc << 1);
    }
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint16_t, 256> kCrc16Table = MakeCrc16Table();

}  // namespace

uint16_t Crc16(std::string_view data) {
  uint16_t crc = 0;
  for (const char c : data) {
    const uint8_t index = static_cast<uint8_t>((crc >> 8) ^ static_cast<uint8_t>(c));
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[index]);
  }
  return crc;
}

std::string_view HashTagOf(std::string_view key) {
  const size_t open = key.find('{');
  if (open == std::string_view::npos) return key;
  const size_t close = key.find('}', open + 1);
  // No '}' after the '{', or nothing between them ("{}"): the whole key is hashed.
  if (close == std::string_view::npos || close == open + 1) return key;
  return key.substr(open + 1, close - open - 1);
}

uint32_t KeySlot(std::string_view key) { return Crc16(HashTagOf(key)) % kClusterSlots; }

}  // namespace ckv::remote
