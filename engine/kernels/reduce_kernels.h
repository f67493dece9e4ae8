// The reduction kernels behind reduce.h, one table per instruction set.
//
// reduce.h's functions call Active(), chosen once per process. Tests and benchmarks use the tables
// directly to check and time every instruction set the CPU has, not only the one chosen.
// Every kernel has the semantics its reduce.h counterpart documents, and every table gives the
// same bits for the same inputs, except for the sign and payload of NaN results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/common/dtype.h"

namespace kolo::kernels::cpu {

struct ReduceKernels {
  const char* name;  // "baseline" or "avx2"
  // dst[i] = a[i] + b[i]; dst may equal a or b, otherwise no overlap.
  void (*sum3)(DataType dtype, void* dst, const void* a, const void* b, size_t count);
  // dst[i] = src[i] * factor with Scale's semantics; dst may equal src, otherwise no overlap.
  void (*scale_copy)(DataType dtype, void* dst, const void* src, size_t count, double factor);
  // Convert's semantics (reduce.h); only the pairs CanConvert allows.
  void (*convert)(DataType from, DataType to, void* dst, const void* src, size_t count,
                  double factor);
  void (*bit_and)(uint64_t* dst, const uint64_t* src, size_t words);
  void (*bit_or)(uint64_t* dst, const uint64_t* src, size_t words);
};

// Portable C++ loops, compiled for the library's baseline ISA (x86-64-v2); always available.
const ReduceKernels& Baseline();
// AVX2 + F16C intrinsics; nullptr when the CPU lacks either extension.
const ReduceKernels* Avx2();
// Avx2() when available, else Baseline(). Chosen on first use; thread-safe.
const ReduceKernels& Active();

}  // namespace kolo::kernels::cpu
