// Message tags of the collectives (internal). A tag names the operation, the call's sequence
// number and the message's index within the call, so that ranks running different collectives,
// or the same ones in a different order, fail with a protocol error naming both tags.
#pragma once

#include <cstdint>

namespace kolo::collectives {

enum class OpCode : uint8_t {
  kAllreduce = 1,
  kExchange = 2,
  kBroadcast = 3,
  kAllgatherv = 4,
  kBitwise = 5,
  kMessageLength = 6,
  kMessagePayload = 7,
  kGather = 8,
  kBroadcastMessage = 9,
  kBarrier = 10,
  // The three rings of a hierarchical allreduce.
  kHierReduceScatter = 11,
  kHierCross = 12,
  kHierAllgather = 13,
  // The latency-optimal allreduces (latency.cc).
  kRecursiveDoubling = 14,
  kHalvingDoubling = 15,
};

// [63:56] operation, [55:32] sequence (mod 2^24), [31:0] message index within the call.
inline uint64_t CollectiveTag(OpCode op, uint32_t sequence, uint32_t index) {
  return (uint64_t{static_cast<uint8_t>(op)} << 56) | (uint64_t{sequence & 0xffffffu} << 32) |
         index;
}

// Point-to-point messages keep every bit of the caller's tag (a bijection for a fixed op).
inline uint64_t MessageTag(OpCode op, uint64_t user_tag) {
  return (uint64_t{static_cast<uint8_t>(op)} << 56) ^ user_tag;
}

}  // namespace kolo::collectives
