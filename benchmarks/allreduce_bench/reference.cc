#include "benchmarks/allreduce_bench/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

namespace kolo::bench {
namespace {

constexpr size_t kPage = 4096;
constexpr uint64_t kSeed = 0x2545;

// Residue classes of the formula. uint8 keeps its inputs non-negative.
struct Formula {
  int64_t modulus;
  int64_t base;
};
Formula FormulaFor(DataType dtype) {
  return dtype == DataType::kUInt8 ? Formula{5, 0} : Formula{9, -4};
}

// 13 is coprime to both moduli, so consecutive ranks cycle through every residue.
inline int64_t ClassOf(size_t i, const Formula& f) {
  return static_cast<int64_t>((static_cast<uint64_t>(i) * 7 + kSeed) %
                              static_cast<uint64_t>(f.modulus));
}
inline int64_t Value(int64_t cls, int rank, const Formula& f) {
  return (cls + 13 * static_cast<int64_t>(rank)) % f.modulus + f.base;
}

bool IsFloat(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat64 ||
         dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

// Spacing of representable values at 1.0, and the largest integer below which every integer is
// exact.
double Epsilon(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat64:
      return std::ldexp(1.0, -52);
    case DataType::kFloat16:
      return std::ldexp(1.0, -10);
    case DataType::kBFloat16:
      return std::ldexp(1.0, -7);
    default:
      return std::ldexp(1.0, -23);
  }
}
double ExactIntegerLimit(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat64:
      return std::ldexp(1.0, 53);
    case DataType::kFloat16:
      return std::ldexp(1.0, 11);
    case DataType::kBFloat16:
      return std::ldexp(1.0, 8);
    default:
      return std::ldexp(1.0, 24);
  }
}

// The sum as the reduction computes it in an integer dtype: two's complement wrap-around.
int64_t WrapToType(DataType dtype, int64_t v) {
  switch (dtype) {
    case DataType::kInt32:
      return static_cast<int32_t>(static_cast<uint32_t>(v));
    case DataType::kUInt8:
      return static_cast<uint8_t>(v);
    default:
      return v;
  }
}

}  // namespace

StatusOr<HostBuffer> HostBuffer::Allocate(size_t bytes) {
  const size_t rounded = std::max(kPage, (bytes + kPage - 1) / kPage * kPage);
  void* p = std::aligned_alloc(kPage, rounded);
  if (p == nullptr) {
    return InvalidArgument(
        "cannot allocate a {}-byte buffer: not enough memory for this size on "
        "this rank (lower --maxbytes or run fewer ranks per host)",
        bytes);
  }
  // Writing every byte (not one per page) also defeats the kernel's zero-page sharing.
  std::memset(p, 0, rounded);
  HostBuffer buffer;
  buffer.data_.reset(static_cast<uint8_t*>(p));
  buffer.size_ = bytes;
  return buffer;
}

void HostBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

void FillInput(DataType dtype, void* buf, size_t count, int rank) {
  const Formula f = FormulaFor(dtype);
  for (size_t i = 0; i < count; ++i)
    StoreElement(dtype, buf, i, static_cast<double>(Value(ClassOf(i, f), rank, f)));
}

CheckResult CheckOutput(DataType dtype, const void* out, size_t count, int size, ReduceOp op) {
  const Formula f = FormulaFor(dtype);
  // The expected value depends on i only through its residue class: one table entry per class.
  std::vector<double> expected(static_cast<size_t>(f.modulus));
  double max_abs_sum = 0;
  for (int64_t c = 0; c < f.modulus; ++c) {
    int64_t sum = 0;
    for (int r = 0; r < size; ++r) sum += Value(c, r, f);
    max_abs_sum = std::max(max_abs_sum, std::fabs(static_cast<double>(sum)));
    double e;
    if (IsFloat(dtype)) {
      e = static_cast<double>(sum);
      if (op == ReduceOp::kAverage) e /= size;
    } else {
      const int64_t wrapped = WrapToType(dtype, sum);
      e = static_cast<double>(wrapped);
      // As kernels::Scale does it: multiply by the rounded factor in double, truncate.
      if (op == ReduceOp::kAverage) e = std::trunc(e * (1.0 / size));
    }
    expected[static_cast<size_t>(c)] = e;
  }
  double tol = 0;
  if (IsFloat(dtype)) {
    const double eps = Epsilon(dtype);
    const double max_abs_input = static_cast<double>(f.modulus / 2);
    // Sums of small integers are exact while partial sums stay below the exact-integer limit;
    // beyond it every addition may round (bound: size additions of up to |max sum| each).
    if (max_abs_sum > ExactIntegerLimit(dtype) / 2) tol = eps * max_abs_input * size * size;
    // Scaling by 1/size rounds once more (and the factor itself is rounded).
    if (op == ReduceOp::kAverage) tol += 2 * eps * max_abs_input + eps * tol;
  }
  CheckResult result;
  for (size_t i = 0; i < count; ++i) {
    const double got = LoadElement(dtype, out, i);
    const double err = std::fabs(got - expected[static_cast<size_t>(ClassOf(i, f))]);
    if (!(err <= tol)) {  // NaN compares false
      ++result.wrong;
      result.max_error = std::isnan(err) ? std::numeric_limits<double>::infinity()
                                         : std::max(result.max_error, err);
    } else {
      result.max_error = std::max(result.max_error, err);
    }
  }
  return result;
}

}  // namespace kolo::bench
