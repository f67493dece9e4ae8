// Input data and the local reference the benchmark checks every backend's result against.
//
// Rank r's input element i is a small integer given by a seeded formula of (r, i), so that the
// expected sum over ranks is computable on every rank without communication, and is exact in every
// dtype for the rank counts this harness runs (|sum| <= 4 * ranks; exact in bfloat16 up to 64
// ranks, float16 up to 512). Beyond that, floating types are compared with a tolerance scaled by
// the dtype's precision. Integer types are compared exactly, wrapping as the reduction does; an
// integer average is the sum times 1/ranks in double, truncated toward zero (kernels::Scale).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/common/dtype.h"
#include "engine/common/status.h"
#include "engine/engine.h"

namespace kolo::bench {

// A page-aligned host buffer whose pages are touched at allocation, so that first-touch page
// faults (milliseconds per MiB on a VM) never land inside a timed region. Zero-filled.
class HostBuffer {
 public:
  HostBuffer() = default;
  // A zero-filled, pre-faulted buffer of `bytes`; InvalidArgument naming the size (and the rank's
  // memory as the likely cause) if the allocation fails.
  static StatusOr<HostBuffer> Allocate(size_t bytes);
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

// Writes rank `rank`'s input elements [0, count) of `dtype` into `buf`.
void FillInput(DataType dtype, void* buf, size_t count, int rank);

struct CheckResult {
  int64_t wrong = 0;     // elements outside the tolerance (NaN counts as wrong)
  double max_error = 0;  // largest |got - expected| over all elements (infinite for NaN)
};

// Compares `out[0, count)` with `op` applied over the inputs of ranks 0..size-1.
CheckResult CheckOutput(DataType dtype, const void* out, size_t count, int size, ReduceOp op);

}  // namespace kolo::bench
