// SPDX-License-Identifier: Apache-2.0
// remote/slot_map.h: the slot map of a Redis Cluster, read from a CLUSTER SLOTS reply, and the
// node a MOVED or ASK answer names.
//
// Both come from the wire, so both are checked before anything is routed by them: at most
// kClusterSlots ranges, each within 0..16383 with its first slot not past its last, and no slot
// served twice; ports 1..65535 (a node that says 99999 is wrong, not 34463); host names of
// 1..255 bytes of printable ASCII (they are printed in messages and logs). A node that does not
// know its own address reports "" or "?": the host we reached it by stands in. The parse takes
// time linear in the reply: endpoints are found by hash, at most 1024 replicas are kept.
//
// Thread-safety: pure functions; a SlotMap is immutable once made.
#ifndef CKV_REMOTE_SLOT_MAP_H_
#define CKV_REMOTE_SLOT_MAP_H_

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "remote/cluster_client.h"
#include "remote/key_slot.h"

namespace ckv::remote {

// For each slot the index of its master in `masters` (-1: no master).
struct SlotMap {
  std::vector<Endpoint> masters;
  std::vector<Endpoint> replicas;  // known for the next refresh only
  std::vector<int32_t> slot_master = std::vector<int32_t>(kClusterSlots, -1);
};

// The map of `reply`, a CLUSTER SLOTS answer of `answered_by`. Unavailable naming the node and
// what is wrong for a reply that is not a well-formed map, or that serves no slot.
absl::StatusOr<SlotMap> ParseSlotMap(const Reply& reply, const Endpoint& answered_by);

// The node named by a MOVED or ASK error text ("MOVED 3999 127.0.0.1:6381"); an empty host
// means the host of the node that answered. nullopt when it names no valid endpoint.
std::optional<Endpoint> RedirectTarget(std::string_view error, const Endpoint& answered_by);

// True for a host name that may be routed to and printed: 1..255 bytes of printable ASCII
// other than space and backslash.
bool IsValidHost(std::string_view host);

}  // namespace ckv::remote

#endif  // CKV_REMOTE_SLOT_MAP_H_
