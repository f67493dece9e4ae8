// What travels between the two ranks of a shm pair: message frames in the rings, control frames
// on the pair's socket. Host byte order: both ends run on one host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kolo::transport::shm {

// A message in a ring: this 32-byte header, then `length` payload bytes, then padding to the next
// multiple of kRingAlign. Headers start at multiples of kRingAlign, so a payload element of a
// size dividing it never straddles the ring's end.
struct RingFrame {
  uint64_t tag = 0;
  uint64_t length = 0;
  uint32_t check = 0;  // kRingFrameCheck; catches rings out of step
  uint32_t reserved = 0;
  uint64_t sequence = 0;  // messages sent before this one on the direction
};
static_assert(sizeof(RingFrame) == 32);
inline constexpr uint32_t kRingFrameCheck = 0x676e6972;  // "ring"
inline constexpr uint64_t kRingAlign = 16;

inline constexpr uint64_t AlignUp(uint64_t n) { return (n + kRingAlign - 1) & ~(kRingAlign - 1); }
inline constexpr uint64_t AlignDown(uint64_t n) { return n & ~(kRingAlign - 1); }

// Copies n bytes into / out of a ring of mask + 1 bytes at position pos, wrapping at its end.
inline void CopyIntoRing(uint8_t* ring, uint64_t mask, uint64_t pos, const void* src, size_t n) {
  const size_t at = static_cast<size_t>(pos & mask);
  const size_t first = n < mask + 1 - at ? n : static_cast<size_t>(mask + 1 - at);
  std::memcpy(ring + at, src, first);
  if (first < n) std::memcpy(ring, static_cast<const uint8_t*>(src) + first, n - first);
}
inline void CopyFromRing(const uint8_t* ring, uint64_t mask, uint64_t pos, void* dst, size_t n) {
  const size_t at = static_cast<size_t>(pos & mask);
  const size_t first = n < mask + 1 - at ? n : static_cast<size_t>(mask + 1 - at);
  std::memcpy(dst, ring + at, first);
  if (first < n) std::memcpy(static_cast<uint8_t*>(dst) + first, ring, n - first);
}

// Control frames on the pair's socket after set-up: one type byte; ABORT is followed by a 2-byte
// length and that many bytes of reason.
enum class Control : uint8_t {
  kDoorbell = 1,   // the ring you wait on has moved as far as you asked
  kKeepalive = 2,  // the sender is alive
  kGoodbye = 3,    // the sender shuts down cleanly; every message it sent is in the ring
  kAbort = 4,      // the sender is failing
};
inline constexpr size_t kMaxAbortReason = 4096;

}  // namespace kolo::transport::shm
