// Tensor Fusion copy-in / copy-out over ResNet-101's gradient list (314 tensors, 44.5M
// parameters: many small batch-norm vectors and 1x1 convolutions, a few multi-MiB tensors), and
// over its small tensors alone (< 64 KiB each), where per-entry overhead dominates.
//
// - Pack: every tensor into one fusion buffer.
// - Unpack: back out, plain (scale 1) and with the average fused in (scale 1/6, six ranks: not a
//   power of two, so the products round and the check exercises the rounding).
// - UnpackThenScale: the unfused peer, a plain unpack followed by a separate Scale pass.
// Bytes processed counts tensor bytes copied. Each benchmark verifies its result once before
// timing; a mismatch is reported and the process exits 1, so the CTest smoke run fails.
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/fusion/fusion_buffer.h"
#include "engine/kernels/reduce.h"

namespace kolo {
namespace {

using fusion::CopyEntry;
using fusion::FusionBuffer;

std::atomic<int> g_failures{0};

// Element counts of ResNet-101's parameters (torchvision layout; creation order).
std::vector<size_t> ResNet101Elements() {
  std::vector<size_t> t = {64 * 3 * 7 * 7, 64, 64};  // conv1, bn1 gamma/beta
  const size_t blocks[] = {3, 4, 23, 3};
  size_t in = 64;
  for (size_t stage = 0; stage < 4; ++stage) {
    const size_t width = size_t{64} << stage;
    for (size_t b = 0; b < blocks[stage]; ++b) {
      t.insert(t.end(), {width * in, width, width});                          // 1x1 reduce + bn
      t.insert(t.end(), {width * width * 9, width, width});                   // 3x3 + bn
      t.insert(t.end(), {4 * width * width, 4 * width, 4 * width});           // 1x1 expand + bn
      if (b == 0) t.insert(t.end(), {4 * width * in, 4 * width, 4 * width});  // downsample + bn
      in = 4 * width;
    }
  }
  t.insert(t.end(), {size_t{1000} * 2048, 1000});  // fc
  return t;
}

// One tensor set laid out three times: sources, the fusion buffer, outputs (all pre-faulted).
struct Workload {
  std::vector<CopyEntry> pack, unpack;
  FusionBuffer sources, fused, outputs;
  size_t bytes = 0;
  DataType dtype = DataType::kFloat32;
};

Workload* MakeWorkload(DataType dtype, bool small_only) {
  auto* w = new Workload;
  w->dtype = dtype;
  const size_t elem = DataTypeSize(dtype);
  std::vector<size_t> sizes;
  for (size_t n : ResNet101Elements()) {
    if (!small_only || n * elem < (size_t{64} << 10)) sizes.push_back(n * elem);
  }
  size_t total = 0;
  for (size_t s : sizes) total += (s + 63) / 64 * 64;  // tensors start 64-byte aligned
  for (FusionBuffer* b : {&w->sources, &w->fused, &w->outputs}) {
    Status s = b->Reserve(total);
    if (!s.ok()) {
      std::fprintf(stderr, "fusion_bench: %s\n", s.ToString().c_str());
      std::exit(1);
    }
  }
  size_t src_off = 0, fused_off = 0;
  for (size_t s : sizes) {
    w->pack.push_back({w->sources.data() + src_off, w->fused.data() + fused_off, s});
    w->unpack.push_back({w->fused.data() + fused_off, w->outputs.data() + src_off, s});
    src_off += (s + 63) / 64 * 64;
    fused_off += s;  // packed back to back, as the engine does for one dtype
  }
  w->bytes = fused_off;
  // Inexact values below 14.
  for (size_t i = 0; i < src_off / elem; ++i) {
    const float v = static_cast<float>(i % 1000) * 0.0137f;
    if (dtype == DataType::kFloat32) {
      std::memcpy(w->sources.data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = FloatToHalf(v);
      std::memcpy(w->sources.data() + 2 * i, &h, 2);
    }
  }
  return w;
}

Workload& Get(DataType dtype, bool small_only) {
  static Workload* cache[2][2] = {};
  Workload*& w = cache[dtype == DataType::kFloat16][small_only];
  if (w == nullptr) w = MakeWorkload(dtype, small_only);
  return *w;
}

// Expected output element: src * scale computed one element at a time.
bool OutputsMatch(const Workload& w, double scale) {
  const float f = static_cast<float>(scale);
  for (size_t e = 0; e < w.pack.size(); ++e) {
    const auto* src = static_cast<const uint8_t*>(w.pack[e].src);
    const auto* out = static_cast<const uint8_t*>(w.unpack[e].dst);
    if (scale == 1.0) {
      if (std::memcmp(src, out, w.pack[e].bytes) != 0) return false;
      continue;
    }
    for (size_t i = 0; i < w.pack[e].bytes / DataTypeSize(w.dtype); ++i) {
      if (w.dtype == DataType::kFloat32) {
        float x, y;
        std::memcpy(&x, src + 4 * i, 4);
        std::memcpy(&y, out + 4 * i, 4);
        if (x * f != y) return false;
      } else {
        uint16_t x, y;
        std::memcpy(&x, src + 2 * i, 2);
        std::memcpy(&y, out + 2 * i, 2);
        if (FloatToHalf(HalfToFloat(x) * f) != y) return false;
      }
    }
  }
  return true;
}

void Fail(benchmark::State& state, const char* what) {
  ++g_failures;
  state.SkipWithError(what);
}

void Finish(benchmark::State& state, const Workload& w) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.bytes));
  state.counters["tensors"] = static_cast<double>(w.pack.size());
}

void BM_Pack(benchmark::State& state, DataType dtype, bool small_only) {
  Workload& w = Get(dtype, small_only);
  std::memset(w.fused.data(), 0, w.bytes);
  fusion::PackEntries(w.pack.data(), w.pack.size());
  for (const CopyEntry& e : w.pack) {
    if (std::memcmp(e.src, e.dst, e.bytes) != 0) return Fail(state, "packed bytes differ");
  }
  for (auto _ : state) {
    fusion::PackEntries(w.pack.data(), w.pack.size());
    benchmark::ClobberMemory();
  }
  Finish(state, w);
}

// fused == true: UnpackEntries with the scale; false: plain unpack, then Scale on every output.
void BM_Unpack(benchmark::State& state, DataType dtype, bool small_only, double scale, bool fused) {
  Workload& w = Get(dtype, small_only);
  fusion::PackEntries(w.pack.data(), w.pack.size());
  auto unpack = [&] {
    if (fused) {
      fusion::UnpackEntries(w.unpack.data(), w.unpack.size(), dtype, scale);
      return;
    }
    fusion::UnpackEntries(w.unpack.data(), w.unpack.size(), dtype, 1.0);
    for (const CopyEntry& e : w.unpack) {
      kernels::Scale(dtype, e.dst, e.bytes / DataTypeSize(dtype), scale);
    }
  };
  std::memset(w.outputs.data(), 0xff, w.outputs.capacity());
  unpack();
  if (!OutputsMatch(w, scale)) return Fail(state, "unpacked values differ from src * scale");
  for (auto _ : state) {
    unpack();
    benchmark::ClobberMemory();
  }
  Finish(state, w);
}

}  // namespace
}  // namespace kolo

int main(int argc, char** argv) {
  using kolo::DataType;
  const std::vector<size_t> tensors = kolo::ResNet101Elements();
  size_t params = 0;
  for (size_t n : tensors) params += n;
  if (tensors.size() != 314 || params != 44549160) {
    std::fprintf(stderr,
                 "fusion_bench: ResNet-101 list has %zu tensors / %zu parameters, want "
                 "314 / 44549160\n",
                 tensors.size(), params);
    return 1;
  }
  for (DataType dt : {DataType::kFloat32, DataType::kFloat16}) {
    for (bool small : {false, true}) {
      const std::string set =
          std::string(small ? "resnet101_small/" : "resnet101/") + kolo::DataTypeName(dt);
      auto reg = [&](const std::string& name, auto&&... args) {
        benchmark::RegisterBenchmark(name.c_str(), args...)->Unit(benchmark::kMicrosecond);
      };
      reg("BM_Pack/" + set, kolo::BM_Pack, dt, small);
      reg("BM_Unpack/" + set + "/scale:1", kolo::BM_Unpack, dt, small, 1.0, true);
      reg("BM_Unpack/" + set + "/scale:1/6", kolo::BM_Unpack, dt, small, 1.0 / 6, true);
      reg("BM_UnpackThenScale/" + set + "/scale:1/6", kolo::BM_Unpack, dt, small, 1.0 / 6, false);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (kolo::g_failures > 0) {
    std::fprintf(stderr, "fusion_bench: %d benchmark(s) failed verification\n",
                 kolo::g_failures.load());
    return 1;
  }
  return 0;
}
