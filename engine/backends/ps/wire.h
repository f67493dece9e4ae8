// The parameter-server wire protocol between workers and servers, over transport::Pair messages.
//
// Every exchange starts with a 64-byte Header message (tag kHeaderTag); what follows it on the
// same pair is fixed by the header, so the receiver posts the matching receives in order:
//   worker -> server  kRegister  bytes = length of the registration text that follows
//                     kPush      [kInitFlag: the shard's initial value, shard bytes], then the
//                                shard's gradient in ChunkCount(elements, chunk elements)
//                                messages, in the registration's push dtype (float32, or half
//                                precision under compression: Options::compression)
//                     kBye       nothing follows; the worker is done
//   server -> worker  kRegistered nothing follows; the server accepted the registration
//                     kPull      the shard's new value, one message of shard bytes
// Payload messages carry PayloadTag(kind, shard), so a desynchronised stream fails at once with
// the transport's tag-mismatch error instead of landing bytes in the wrong variable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/backends/ps/placement.h"
#include "engine/backends/ps/types.h"
#include "engine/common/status.h"

namespace kolo::backends::ps {

// kInit names the initial-value payload of a push in tags only; it is never a header's kind.
enum class Kind : uint32_t {
  kRegister = 1,
  kRegistered = 2,
  kPush = 3,
  kPull = 4,
  kBye = 5,
  kInit = 6,
};
const char* KindName(uint32_t kind);

inline constexpr uint32_t kInitFlag = 1;
inline constexpr uint32_t kHeaderCheck = 0x70736864;  // "pshd"
inline constexpr uint64_t kHeaderTag = 0x7073'0000'0000'0000ull;
inline constexpr size_t kMaxRegistrationBytes = 64 << 20;

inline uint64_t PayloadTag(Kind kind, uint32_t shard) {
  return kHeaderTag | (static_cast<uint64_t>(kind) << 32) | shard;
}

// Host byte order: every rank of a job runs on the same architecture (as the transport frame).
struct Header {
  uint32_t kind = 0;
  uint32_t shard = 0;
  uint64_t step = 0;   // kPush: updates the shard has had before this push; kPull: after
  uint64_t bytes = 0;  // kRegister: text length; kPush/kPull: shard bytes
  uint32_t flags = 0;
  uint32_t check = kHeaderCheck;
  double learning_rate = 0;
  double momentum = 0;
  double weight_decay = 0;
  double grad_scale = 0;
};
static_assert(sizeof(Header) == 64, "the parameter-server header is 64 bytes on the wire");

// The gradient chunk both sides use: the job's ring chunk rounded down to whole float32 elements.
inline size_t PushChunkBytes(int64_t ring_chunk_bytes) {
  return static_cast<size_t>(ring_chunk_bytes < 4 ? 4 : ring_chunk_bytes / 4 * 4);
}

// Gradient messages of a push of `bytes` in pieces of at most `chunk` bytes (0 for 0 bytes).
inline size_t ChunkCount(size_t bytes, size_t chunk) { return (bytes + chunk - 1) / chunk; }

// What every worker sends every server once: the settings that shape placement and framing, and
// the variables in creation order.
struct Registration {
  int servers = 0;
  PlacementPolicy policy = PlacementPolicy::kGreedy;
  int64_t split_min_bytes = kSplitMinBytes;
  int64_t chunk_bytes = 0;
  // The dtype gradients are pushed in: float32, or float16/bfloat16 under compression. A chunk
  // holds chunk_bytes / 4 elements whatever the dtype.
  DataType push_dtype = DataType::kFloat32;
  std::vector<VariableSpec> vars;
};

// Checks a registration a worker is about to send: names non-empty and distinct, float32, no
// negative dimension. The error names the variable.
Status ValidateRegistration(const Registration& r);
std::vector<uint8_t> SerializeRegistration(const Registration& r);
StatusOr<Registration> ParseRegistration(const std::vector<uint8_t>& bytes);
// "" if equal; else where `theirs` first differs from `mine` ("variable 3: 'fc/w' [10,4] vs
// 'fc/w' [4,10]", "servers: 2 vs 1", ...).
std::string DescribeDifference(const Registration& mine, const Registration& theirs);

}  // namespace kolo::backends::ps
