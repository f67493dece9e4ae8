// The RDMA transport's wire vocabulary (the protocol is described in device.h): the layout of the
// control block a peer writes into and of the local staging memory, the 32-bit immediate that
// names each notification, the 64-bit work-request ids that route a completion back to its pair,
// and little-endian packing of the fields written into peer memory. Internal to rdma/.
#pragma once

#include <arpa/inet.h>

#include <cstddef>
#include <cstdint>

namespace kolo::transport::rdma {

// Eager slots per pair and direction, and their size (a 16-byte header, then the payload).
inline constexpr uint64_t kSlots = 16;
inline constexpr size_t kSlotBytes = 32 << 10;
inline constexpr size_t kHeaderBytes = 16;
inline constexpr size_t kEagerMax = kSlotBytes - kHeaderBytes;
// Messages up to this size go eager even when their receive's advert is at hand (one work
// request and a copy beat two work requests); larger ones go direct when they can.
inline constexpr size_t kPreferEager = 4096;
// Adverts in flight per pair and direction (the advert ring and the direct headers).
inline constexpr uint64_t kAdverts = 32;
inline constexpr size_t kAdvertBytes = 48;
inline constexpr size_t kReasonBytes = 512;
inline constexpr size_t kProofBytes = 32;
// Largest single RDMA write; longer messages are written in pieces.
inline constexpr size_t kMaxWrite = size_t{1} << 30;
inline constexpr uint32_t kInlineWanted = 64;

// Queue depths per QP. Receives are zero-length notifications reposted as each completes.
inline constexpr int kSqDepth = 2 * kSlots + 2 * kAdverts + 64;
inline constexpr int kRqDepth = kSlots + 2 * kAdverts + 64;

// Control block layout (the memory a peer writes into), in bytes from its start.
inline constexpr size_t kSlotsOffset = 0;
inline constexpr size_t kAdvertsOffset = kSlotsOffset + kSlots * kSlotBytes;
inline constexpr size_t kDirectOffset = kAdvertsOffset + kAdverts * kAdvertBytes;
inline constexpr size_t kReasonOffset = kDirectOffset + kAdverts * kHeaderBytes;
inline constexpr size_t kProofOffset = kReasonOffset + kReasonBytes;
inline constexpr size_t kCtrlBytes = (kProofOffset + kProofBytes + 4095) & ~size_t{4095};
// Staging layout (local memory work requests gather from when they cannot be inline).
inline constexpr size_t kStEagerOffset = 0;
inline constexpr size_t kStAdvertOffset = kStEagerOffset + kSlots * kHeaderBytes;
inline constexpr size_t kStDirectOffset = kStAdvertOffset + kAdverts * kAdvertBytes;
inline constexpr size_t kStReasonOffset = kStDirectOffset + kAdverts * kHeaderBytes;
inline constexpr size_t kStProofOffset = kStReasonOffset + kReasonBytes;
inline constexpr size_t kStagingBytes = (kStProofOffset + kProofBytes + 4095) & ~size_t{4095};

// The immediate: a type in the top 4 bits, a value in the low 28.
enum class Imm : uint32_t {
  kEager = 1,
  kCredit = 2,
  kAdvert = 3,
  kDirect = 4,
  kRts = 5,
  kKeepalive = 6,
  kGoodbye = 7,
  kAbort = 8,
  kProof = 9,
};
inline constexpr uint32_t kValueBits = 28;
inline constexpr uint32_t kValueMask = (1u << kValueBits) - 1;
inline constexpr uint32_t kWithheld = 1;  // eager header flag: the payload was not sent

// The immediate of `type` with the low 28 bits of `value`, in network byte order (as wc.imm_data
// and wr.imm_data carry it).
inline uint32_t MakeImm(Imm type, uint64_t value) {
  return htonl((static_cast<uint32_t>(type) << kValueBits) |
               (static_cast<uint32_t>(value) & kValueMask));
}
// The full counter whose low 28 bits are `low`, nearest at or after `base`; -1 when it would lie
// before `base` (a value for something already past). Counters travel as their low 28 bits: the
// receiver knows the full counter to within half that range, far more than a pair has in flight.
inline int64_t Unwrap(uint64_t base, uint32_t low) {
  const uint32_t diff = (low - static_cast<uint32_t>(base)) & kValueMask;
  if (diff < (1u << (kValueBits - 1))) return static_cast<int64_t>(base + diff);
  return -1;
}

// Work request ids: kind in the top byte, peer in the next two, a value in the low 40 bits.
enum class Wr : uint64_t { kSendLast = 1, kSendPart = 2, kControl = 3, kAdvert = 4, kRecv = 5 };
inline uint64_t MakeWrId(Wr kind, int peer, uint64_t value = 0) {
  return (static_cast<uint64_t>(kind) << 56) | (static_cast<uint64_t>(peer & 0xffff) << 40) |
         (value & ((uint64_t{1} << 40) - 1));
}
inline Wr WrKind(uint64_t id) { return static_cast<Wr>(id >> 56); }
inline int WrPeer(uint64_t id) { return static_cast<int>((id >> 40) & 0xffff); }
inline uint64_t WrValue(uint64_t id) { return id & ((uint64_t{1} << 40) - 1); }

// Little-endian fields in memory a peer reads (independent of either host's byte order).
inline void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
inline uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace kolo::transport::rdma
