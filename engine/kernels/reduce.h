// Reduction kernels on the CPU, vectorised for every dtype.
//
// float16 and bfloat16 are accumulated in float32 and rounded once per element (round to nearest
// even). Integers wrap on overflow (two's complement), as MPI_SUM does in practice. A NaN result
// is a NaN; its sign and payload are unspecified (they may differ between CPUs).
// All functions are thread-safe (no state) and accept count == 0. Pointers need no alignment.
#pragma once

#include <cstddef>

#include "engine/common/dtype.h"

namespace kolo::kernels {

// dst[i] = dst[i] + src[i] for i in [0, count).  dst and src must not overlap unless equal.
void ReduceSum(DataType dtype, void* dst, const void* src, size_t count);

// dst[i] = a[i] + b[i]. dst may equal a or b.
void ReduceSum3(DataType dtype, void* dst, const void* a, const void* b, size_t count);

// data[i] = data[i] * factor. Floating types multiply in their own precision (float16/bfloat16 via
// float32); integer types compute data[i] * factor in double and truncate toward zero, so that
// averaging integers gives the sum divided by the rank count, truncated. Integer results saturate
// at the type's limits (a NaN product gives 0). factor == 1.0 leaves data unchanged, bit for bit.
void Scale(DataType dtype, void* data, size_t count, double factor);

// dst[i] = src[i] * factor with Scale's semantics, in one pass (a scaled copy). dst may equal src;
// otherwise they must not overlap. factor == 1.0 is a plain copy.
void ScaleCopy(DataType dtype, void* dst, const void* src, size_t count, double factor);

// Gradient compression's casts: dst[i] = src[i] * factor converted from `from` to `to`, in one
// pass. Allowed pairs: float32 -> float16 or bfloat16, and float16 or bfloat16 -> float32. The
// product is taken in float32 (factor == 1.0 multiplies by nothing) and rounded once, to nearest
// even; NaN stays NaN (quiet) and infinities stay infinite; float32 beyond float16's range
// (65504) becomes an infinity. dst and src must not overlap. See CanConvert.
void Convert(DataType from, DataType to, void* dst, const void* src, size_t count, double factor);
// Whether Convert takes this pair.
bool CanConvert(DataType from, DataType to);

// dst[i] &= src[i], dst[i] |= src[i] over 64-bit words (response-cache bit vectors).
void BitAnd(uint64_t* dst, const uint64_t* src, size_t words);
void BitOr(uint64_t* dst, const uint64_t* src, size_t words);

}  // namespace kolo::kernels
