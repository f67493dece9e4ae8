// Batched copy kernels for the device fusion buffer (internal to engine/cuda).
//
// One launch handles a whole list of copies: block row y of the grid takes entries y, y + rows,
// ...; the blocks of a row share an entry's bytes. Descriptors live in device memory.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace kolo::cuda {

// Element types of the scaled copy. Kept apart from kolo::DataType so that nvcc never compiles the
// engine's common headers (fmt); device_context.cc maps one to the other.
enum class ElementKind { kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8 };

// Same layout as fusion::CopyEntry: `bytes` bytes from `src` to `dst`, both device memory.
struct CopyDesc {
  const void* src;
  void* dst;
  size_t bytes;
};

// Queues the copy of every descriptor on `stream`. `descs` (device memory) holds n entries;
// `max_bytes` is the largest entry (sizes the grid). Uses 16-, 4- or 1-byte moves per entry as its
// pointers and size allow.
cudaError_t LaunchBatchedCopy(const CopyDesc* descs, int n, size_t max_bytes, cudaStream_t stream);

// Queues dst[i] = src[i] * scale as `kind` for every descriptor (dst may equal src): floats in
// their own precision (float16/bfloat16 through float32, round to nearest even), integers in double
// truncated toward zero and saturated at the type's limits (NaN gives 0).
cudaError_t LaunchBatchedScaleCopy(const CopyDesc* descs, int n, size_t max_bytes, ElementKind kind,
                                   double scale, cudaStream_t stream);

// Queues dst[i] = src[i] * scale converted from `from` to `to` for every descriptor (bytes: the
// source's): float32 -> float16/bfloat16 or back, the product in float32 rounded to nearest even.
// `max_count` is the largest entry's element count. Other pairs: cudaErrorInvalidValue.
cudaError_t LaunchBatchedConvert(const CopyDesc* descs, int n, size_t max_count, ElementKind from,
                                 ElementKind to, double scale, cudaStream_t stream);

}  // namespace kolo::cuda
