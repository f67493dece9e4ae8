// ReduceSum throughput per dtype and size, for the kernels the CPU dispatches to ("active") and
// for the portable baseline; float32 also against a plain scalar loop, so the vector speed-up is a
// ratio measured in the same run. Bytes processed counts tensor bytes (one operand): the kernel
// itself moves three times that (two reads, one write).
//
// Every benchmark first checks one ReduceSum against a scalar reference and reports an error on a
// mismatch; the process then exits 1, so the CTest smoke run fails.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include "engine/fusion/fusion_buffer.h"
#include "engine/kernels/reduce.h"
#include "engine/kernels/reduce_kernels.h"

namespace kolo {
namespace {

using kernels::cpu::ReduceKernels;

std::atomic<int> g_failures{0};

constexpr size_t kSizes[] = {size_t{4} << 10, size_t{1} << 20, size_t{64} << 20};
constexpr size_t kMaxBytes = size_t{64} << 20;

// Pre-faulted buffers shared by every benchmark, so no page fault lands in a timed loop.
struct Buffers {
  fusion::FusionBuffer dst, src, want;
};

Buffers& Shared() {
  static Buffers* b = [] {
    auto* buffers = new Buffers;
    for (fusion::FusionBuffer* f : {&buffers->dst, &buffers->src, &buffers->want}) {
      Status s = f->Reserve(kMaxBytes);
      if (!s.ok()) {
        std::fprintf(stderr, "reduce_bench: %s\n", s.ToString().c_str());
        std::exit(1);
      }
    }
    return buffers;
  }();
  return *b;
}

// Inexact values below 14, so that sums round (the check exercises rounding), while repeated
// accumulation in the timed loop stays finite and normal (no denormal slow paths; float16 sums
// stop growing below 65504 once the addend is under half an ulp).
void Fill(DataType dt, uint8_t* p, size_t count, int seed) {
  for (size_t i = 0; i < count; ++i) {
    const float v = static_cast<float>((i * 7 + seed) % 1000) * 0.0137f;
    switch (dt) {
      case DataType::kFloat32:
        std::memcpy(p + 4 * i, &v, 4);
        break;
      case DataType::kFloat64: {
        const double d = v;
        std::memcpy(p + 8 * i, &d, 8);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t h = FloatToHalf(v);
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t h = FloatToBFloat16(v);
        std::memcpy(p + 2 * i, &h, 2);
        break;
      }
      case DataType::kInt32: {
        const auto x = static_cast<uint32_t>(i * 2654435761u + seed);
        std::memcpy(p + 4 * i, &x, 4);
        break;
      }
      case DataType::kInt64: {
        const uint64_t x = i * 0x9e3779b97f4a7c15ull + seed;
        std::memcpy(p + 8 * i, &x, 8);
        break;
      }
      case DataType::kUInt8:
        p[i] = static_cast<uint8_t>(i * 31 + seed);
        break;
    }
  }
}

template <typename T>
T At(const uint8_t* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

// want[i] = a[i] + b[i], one element at a time.
void ScalarSum(DataType dt, uint8_t* want, const uint8_t* a, const uint8_t* b, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    switch (dt) {
      case DataType::kFloat32: {
        const float r = At<float>(a, i) + At<float>(b, i);
        std::memcpy(want + 4 * i, &r, 4);
        break;
      }
      case DataType::kFloat64: {
        const double r = At<double>(a, i) + At<double>(b, i);
        std::memcpy(want + 8 * i, &r, 8);
        break;
      }
      case DataType::kFloat16: {
        const uint16_t r =
            FloatToHalf(HalfToFloat(At<uint16_t>(a, i)) + HalfToFloat(At<uint16_t>(b, i)));
        std::memcpy(want + 2 * i, &r, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t r = FloatToBFloat16(BFloat16ToFloat(At<uint16_t>(a, i)) +
                                           BFloat16ToFloat(At<uint16_t>(b, i)));
        std::memcpy(want + 2 * i, &r, 2);
        break;
      }
      case DataType::kInt32: {
        const uint32_t r = At<uint32_t>(a, i) + At<uint32_t>(b, i);
        std::memcpy(want + 4 * i, &r, 4);
        break;
      }
      case DataType::kInt64: {
        const uint64_t r = At<uint64_t>(a, i) + At<uint64_t>(b, i);
        std::memcpy(want + 8 * i, &r, 8);
        break;
      }
      case DataType::kUInt8:
        want[i] = static_cast<uint8_t>(a[i] + b[i]);
        break;
    }
  }
}

// The scalar peer: one float at a time, auto-vectorisation disabled (GCC by attribute, clang by
// a loop pragma).
#if defined(__clang__)
#define KOLO_NO_TREE_VECTORIZE
#else
#define KOLO_NO_TREE_VECTORIZE __attribute__((optimize("no-tree-vectorize")))
#endif
KOLO_NO_TREE_VECTORIZE void ScalarLoopSumFloat32(float* dst, const float* src, size_t count) {
#if defined(__clang__)
#pragma clang loop vectorize(disable) interleave(disable)
#endif
  for (size_t i = 0; i < count; ++i) dst[i] += src[i];
}

using SumFn = void (*)(DataType, void*, const void*, size_t);

void ActiveSum(DataType dt, void* dst, const void* src, size_t count) {
  kernels::ReduceSum(dt, dst, src, count);
}
void BaselineSum(DataType dt, void* dst, const void* src, size_t count) {
  kernels::cpu::Baseline().sum3(dt, dst, dst, src, count);
}
void ScalarLoopSum(DataType, void* dst, const void* src, size_t count) {
  ScalarLoopSumFloat32(static_cast<float*>(dst), static_cast<const float*>(src), count);
}

void BM_ReduceSum(benchmark::State& state, DataType dt, SumFn sum) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / DataTypeSize(dt);
  Buffers& b = Shared();
  Fill(dt, b.dst.data(), count, 1);
  Fill(dt, b.src.data(), count, 5);
  ScalarSum(dt, b.want.data(), b.dst.data(), b.src.data(), count);
  sum(dt, b.dst.data(), b.src.data(), count);
  if (std::memcmp(b.dst.data(), b.want.data(), bytes) != 0) {
    ++g_failures;
    state.SkipWithError("ReduceSum result differs from the scalar reference");
    return;
  }
  for (auto _ : state) {
    sum(dt, b.dst.data(), b.src.data(), count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}

// Compression's casts (kernels::Convert): float32 -> `half` and back, `bytes` of float32 each way
// per iteration; bytes processed counts the float32 side of both casts. Checked against the
// scalar converters first.
void BM_Convert(benchmark::State& state, DataType half) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / sizeof(float);
  Buffers& b = Shared();
  auto* f = reinterpret_cast<float*>(b.src.data());
  for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(i % 1000) * 0.37f - 100.0f;
  kernels::Convert(DataType::kFloat32, half, b.dst.data(), f, count, 1.0);
  kernels::Convert(half, DataType::kFloat32, b.want.data(), b.dst.data(), count, 0.5);
  const auto* back = reinterpret_cast<const float*>(b.want.data());
  for (size_t i = 0; i < count; ++i) {
    const uint16_t h = half == DataType::kFloat16 ? FloatToHalf(f[i]) : FloatToBFloat16(f[i]);
    const float want = (half == DataType::kFloat16 ? HalfToFloat(h) : BFloat16ToFloat(h)) * 0.5f;
    if (back[i] != want) {
      ++g_failures;
      state.SkipWithError("Convert differs from the scalar converters");
      return;
    }
  }
  for (auto _ : state) {
    kernels::Convert(DataType::kFloat32, half, b.dst.data(), f, count, 1.0);
    kernels::Convert(half, DataType::kFloat32, b.want.data(), b.dst.data(), count, 0.5);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes) *
                          2);
}

void Register(const std::string& name, DataType dt, SumFn sum) {
  auto* bench = benchmark::RegisterBenchmark(name.c_str(), BM_ReduceSum, dt, sum);
  for (size_t bytes : kSizes) bench->Arg(static_cast<int64_t>(bytes));
  bench->Unit(benchmark::kMicrosecond);
}

}  // namespace
}  // namespace kolo

int main(int argc, char** argv) {
  using kolo::DataType;
  const char* active = kolo::kernels::cpu::Active().name;
  for (DataType dt : kolo::AllDataTypes()) {
    const std::string base = std::string("BM_ReduceSum/") + kolo::DataTypeName(dt);
    kolo::Register(base + "/active:" + active, dt, kolo::ActiveSum);
    kolo::Register(base + "/baseline", dt, kolo::BaselineSum);
    if (dt == DataType::kFloat32) kolo::Register(base + "/scalar_loop", dt, kolo::ScalarLoopSum);
  }
  for (DataType half : {DataType::kFloat16, DataType::kBFloat16}) {
    const std::string name = std::string("BM_Convert/float32<->") + kolo::DataTypeName(half);
    auto* bench = benchmark::RegisterBenchmark(name.c_str(), kolo::BM_Convert, half);
    for (size_t bytes : kolo::kSizes) bench->Arg(static_cast<int64_t>(bytes));
    bench->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (kolo::g_failures > 0) {
    std::fprintf(stderr, "reduce_bench: %d benchmark(s) failed verification\n",
                 kolo::g_failures.load());
    return 1;
  }
  return 0;
}
