// Dispatch of the public reduction API to the kernel table chosen for this CPU.
#include "engine/kernels/reduce.h"

#include "engine/kernels/reduce_kernels.h"

namespace kolo::kernels {

namespace cpu {

const ReduceKernels& Active() {
  static const ReduceKernels& active = Avx2() != nullptr ? *Avx2() : Baseline();
  return active;
}

}  // namespace cpu

void ReduceSum(DataType dtype, void* dst, const void* src, size_t count) {
  cpu::Active().sum3(dtype, dst, dst, src, count);
}

void ReduceSum3(DataType dtype, void* dst, const void* a, const void* b, size_t count) {
  cpu::Active().sum3(dtype, dst, a, b, count);
}

void Scale(DataType dtype, void* data, size_t count, double factor) {
  cpu::Active().scale_copy(dtype, data, data, count, factor);
}

void ScaleCopy(DataType dtype, void* dst, const void* src, size_t count, double factor) {
  cpu::Active().scale_copy(dtype, dst, src, count, factor);
}

bool CanConvert(DataType from, DataType to) {
  const auto half = [](DataType d) { return d == DataType::kFloat16 || d == DataType::kBFloat16; };
  return (from == DataType::kFloat32 && half(to)) || (half(from) && to == DataType::kFloat32);
}

void Convert(DataType from, DataType to, void* dst, const void* src, size_t count, double factor) {
  cpu::Active().convert(from, to, dst, src, count, factor);
}

void BitAnd(uint64_t* dst, const uint64_t* src, size_t words) {
  cpu::Active().bit_and(dst, src, words);
}

void BitOr(uint64_t* dst, const uint64_t* src, size_t words) {
  cpu::Active().bit_or(dst, src, words);
}

}  // namespace kolo::kernels
