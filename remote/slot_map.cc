// SPDX-License-Identifier: Apache-2.0
// CLUSTER SLOTS and redirections, read from untrusted replies (see remote/slot_map.h).
#include "remote/slot_map.h"

#include <algorithm>
#include <charconv>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "ckv/log.h"

namespace ckv::remote {
namespace {

constexpr size_t kMaxHostBytes = 255;
constexpr size_t kMaxReplicas = 1024;

bool ValidPort(long long port) { return port >= 1 && port <= 65535; }

// The endpoint of one node entry ([host, port, id?, ...]) of a range; nullopt when malformed.
std::optional<Endpoint> EndpointOf(const Reply& r, const Endpoint& answered_by) {
  if (r.type != Reply::Type::kArray || r.elements.size() < 2 ||
      r.elements[0].type != Reply::Type::kString || r.elements[1].type != Reply::Type::kInteger ||
      !ValidPort(r.elements[1].integer)) {
    return std::nullopt;
  }
  Endpoint e;
  e.host = r.elements[0].str;
  if (e.host.empty() || e.host == "?") e.host = answered_by.host;
  if (!IsValidHost(e.host)) return std::nullopt;
  e.port = static_cast<int>(r.elements[1].integer);
  return e;
}

// The endpoints of a map, each once, found by "host:port" in constant time: a reply may name
// hundreds of thousands of nodes, and a linear search each made the parse quadratic (minutes).
class EndpointIndex {
 public:
  explicit EndpointIndex(std::vector<Endpoint>* list) : list_(list) {}
  int32_t IndexOf(const Endpoint& e) {
    auto [it, inserted] =
        index_.try_emplace(absl::StrCat(e.host, ":", e.port), static_cast<int32_t>(list_->size()));
    if (inserted) list_->push_back(e);
    return it->second;
  }
  size_t size() const { return list_->size(); }

 private:
  std::vector<Endpoint>* list_;
  absl::flat_hash_map<std::string, int32_t> index_;
};

}  // namespace

bool IsValidHost(std::string_view host) {
  if (host.empty() || host.size() > kMaxHostBytes) return false;
  // Printable ASCII only (an internationalised name travels as punycode): nothing a terminal
  // obeys, nothing Python cannot decode.
  return std::all_of(host.begin(), host.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7f && c != '\\';
  });
}

std::optional<Endpoint> RedirectTarget(std::string_view error, const Endpoint& answered_by) {
  const size_t last_space = error.rfind(' ');
  if (last_space == std::string_view::npos) return std::nullopt;
  std::string_view address = error.substr(last_space + 1);
  const size_t colon = address.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  Endpoint e;
  e.host = std::string(address.substr(0, colon));
  if (e.host.empty()) e.host = answered_by.host;
  if (!IsValidHost(e.host)) return std::nullopt;
  const std::string_view port = address.substr(colon + 1);
  long long p = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || ptr != port.data() + port.size() || !ValidPort(p)) return std::nullopt;
  e.port = static_cast<int>(p);
  return e;
}

absl::StatusOr<SlotMap> ParseSlotMap(const Reply& reply, const Endpoint& answered_by) {
  // Not Endpoint::ToString: this file stands alone (the fuzz target links it without the client).
  const std::string node = absl::StrCat(answered_by.host, ":", answered_by.port);
  auto bad = [&](std::string_view what) {
    return absl::UnavailableError(
        absl::StrCat("redis ", node, ": CLUSTER SLOTS: ", Printable(what)));
  };
  if (reply.type == Reply::Type::kError) return bad(reply.str);
  if (reply.type != Reply::Type::kArray) return bad("not an array");
  if (reply.elements.size() > kClusterSlots) {
    return bad(
        absl::StrCat(reply.elements.size(), " ranges, more than the ", kClusterSlots, " slots"));
  }
  SlotMap map;
  EndpointIndex masters(&map.masters), replicas(&map.replicas);
  size_t covered = 0;
  for (size_t i = 0; i < reply.elements.size(); ++i) {
    const Reply& range = reply.elements[i];
    if (range.type != Reply::Type::kArray || range.elements.size() < 3 ||
        range.elements[0].type != Reply::Type::kInteger ||
        range.elements[1].type != Reply::Type::kInteger) {
      return bad(absl::StrCat("range ", i, " is malformed"));
    }
    const long long first = range.elements[0].integer;
    const long long last = range.elements[1].integer;
    if (first < 0 || last >= kClusterSlots || first > last) {
      return bad(absl::StrCat("range ", i, " is slots ", first, "..", last));
    }
    std::optional<Endpoint> master = EndpointOf(range.elements[2], answered_by);
    if (!master) return bad(absl::StrCat("range ", i, ": its master is not a valid node"));
    // A slot served twice is no map (and overlapping ranges would cost 16384 writes each).
    for (long long s = first; s <= last; ++s) {
      if (map.slot_master[s] >= 0) {
        return bad(absl::StrCat("range ", i, " serves slot ", s, " a second time"));
      }
    }
    const int32_t m = masters.IndexOf(*master);
    for (long long s = first; s <= last; ++s) map.slot_master[s] = m;
    covered += static_cast<size_t>(last - first + 1);
    // Replicas are only asked for the next map: the first kMaxReplicas known are plenty.
    for (size_t r = 3; r < range.elements.size() && replicas.size() < kMaxReplicas; ++r) {
      if (std::optional<Endpoint> replica = EndpointOf(range.elements[r], answered_by)) {
        replicas.IndexOf(*replica);
      }
    }
  }
  if (covered == 0) return bad("no slot is served");
  return map;
}

}  // namespace ckv::remote
