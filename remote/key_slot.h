// SPDX-License-Identifier: Apache-2.0
// remote/key_slot.h: which Redis Cluster slot a key belongs to.
//
// Redis Cluster splits its key space into 16384 slots: slot = CRC16(k) mod 16384, where CRC16 is
// the XMODEM variant (polynomial 0x1021, initial value 0, no reflection, no final xor; the check
// value of "123456789" is 0x31C3), and k is the whole key unless the key holds a hash tag: when
// the key contains a '{' and, after the first '{', a '}' with at least one byte between them,
// k is only the bytes between that first '{' and the first '}' after it. Keys with the same tag
// land in the same slot. (Redis Cluster specification, "Keys distribution model".)
//
// Thread-safety: pure functions.
#ifndef CKV_REMOTE_KEY_SLOT_H_
#define CKV_REMOTE_KEY_SLOT_H_

#include <cstdint>
#include <string_view>

namespace ckv::remote {

// Slots of a Redis Cluster: 0 .. kClusterSlots - 1.
inline constexpr uint32_t kClusterSlots = 16384;

// CRC16/XMODEM of `data`.
uint16_t Crc16(std::string_view data);

// The part of `key` that is hashed: its hash tag when it has one, else the whole key.
std::string_view HashTagOf(std::string_view key);

// The slot of `key`: Crc16(HashTagOf(key)) mod 16384.
uint32_t KeySlot(std::string_view key);

}  // namespace ckv::remote

#endif  // CKV_REMOTE_KEY_SLOT_H_
