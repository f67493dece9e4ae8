// The persistent Tensor Fusion buffer, and the batched copies in and out of it.
//
// Each cycle the engine packs a group of small tensors into one buffer, reduces the buffer with a
// single collective, and unpacks it back into the tensors' outputs. The buffer is allocated once
// and only grows, with its pages faulted in at allocation: a first touch costs ~2.5 ms per MiB on
// the VMs this runs on, which must not land inside a timed collective.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/common/dtype.h"
#include "engine/common/status.h"

namespace kolo::fusion {

// One contiguous copy: `bytes` bytes from `src` to `dst`. The two ranges must not overlap.
struct CopyEntry {
  const void* src;
  void* dst;
  size_t bytes;
};

// A 64-byte-aligned byte buffer that only grows.
// Not thread-safe: one owner (the engine's background thread) uses it.
class FusionBuffer {
 public:
  static constexpr size_t kAlignment = 64;

  FusionBuffer() = default;
  ~FusionBuffer();
  FusionBuffer(FusionBuffer&& other) noexcept;
  FusionBuffer& operator=(FusionBuffer&& other) noexcept;
  FusionBuffer(const FusionBuffer&) = delete;
  FusionBuffer& operator=(const FusionBuffer&) = delete;

  // Ensures capacity() >= bytes. Does nothing when it already is; otherwise maps a new region
  // (rounded up to whole pages, aligned to at least kAlignment), faults every page in, and
  // releases the old one. Contents are NOT preserved when it grows, and data() changes.
  // On failure (out of memory) the buffer is left exactly as it was.
  [[nodiscard]] Status Reserve(size_t bytes);

  // Start of the buffer; nullptr until the first successful Reserve of a nonzero size.
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  // Usable bytes at data().
  size_t capacity() const { return capacity_; }

 private:
  void Release();

  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

// Copy-in: for each entry, copies `bytes` from `src` to `dst` (typically a tensor into its slot
// in the fusion buffer). Entries are independent; n == 0 does nothing.
void PackEntries(const CopyEntry* entries, size_t n);

// Copy-out with the average's scaling fused in, so averaging costs no extra pass over memory.
// scale == 1.0: for each entry, a plain byte copy of `bytes` from `src` to `dst`.
// Otherwise: dst[i] = src[i] * scale element-wise as `dtype`, with the semantics of
// kernels::Scale (floats in their own precision, float16/bfloat16 via float32, integers in
// double truncated toward zero).
// REQUIRES: with scale != 1.0, every entry's bytes is a multiple of DataTypeSize(dtype).
void UnpackEntries(const CopyEntry* entries, size_t n, DataType dtype, double scale);

}  // namespace kolo::fusion
