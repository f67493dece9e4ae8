// Device tensors through the engine: ranks as threads sharing one GPU over ring/TCP (every dtype,
// fused and unfused, sum and average, multi-chunk staging, ready events honoured, broadcast),
// NCCL at one rank, NCCL's refusal of two ranks on one GPU, and the errors for device tensors
// where they cannot go. Tests that need a GPU skip with the reason when there is none.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/cuda/device_context.h"
#include "engine/engine.h"
#include "engine/kernels/reduce.h"
#include "kolo/config.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/rank_threads.h"
#if KOLO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kolo {
namespace {

using testing::ExpectedSum;
using testing::InputValue;
using testing::RankOptions;
using testing::RunRanks;

// Runs anywhere: without CUDA, or without a GPU, or naming a device that does not exist, a device
// tensor is refused at submission with an error that names the tensor.
TEST(DeviceTensors, UnusableDeviceIsRefusedNamingTheTensor) {
  const int missing = cuda::DeviceCount();
  auto engine = Engine::Create(RankOptions(0, 1));
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  float x = 1;
  auto h = (*engine)->AllreduceAsync("layer3/weight", &x, &x, DataType::kFloat32, {1},
                                     ReduceOp::kSum, TensorPlace{missing, nullptr});
  ASSERT_FALSE(h.ok());
  EXPECT_NE(h.status().message().find("allreduce 'layer3/weight'"), std::string::npos)
      << h.status().ToString();
  EXPECT_NE(h.status().message().find(fmt::format("CUDA device {}", missing)), std::string::npos)
      << h.status().ToString();
  auto b = (*engine)->BroadcastAsync("layer3/bias", &x, DataType::kFloat32, {1}, 0,
                                     TensorPlace{missing, nullptr});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("broadcast 'layer3/bias'"), std::string::npos)
      << b.status().ToString();
  // The engine still moves host tensors.
  auto ok = (*engine)->AllreduceAsync("host", &x, &x, DataType::kFloat32, {1}, ReduceOp::kSum);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE((*engine)->Wait(*ok).ok());
  EXPECT_TRUE((*engine)->Shutdown().ok());
}

TEST(DeviceTensors, NcclBackendNeedsNcclAndADevice) {
  Options o = RankOptions(0, 1);
  o.backend = "nccl";
  std::string why;
  if (KOLO_HAVE_NCCL && cuda::DeviceCount(&why) > 0) {
    GTEST_SKIP() << "this host has NCCL and a GPU (covered by the NCCL tests)";
  }
  auto engine = Engine::Create(o);
  ASSERT_FALSE(engine.ok());
  const std::string& m = engine.status().message();
  EXPECT_TRUE(m.find("nccl") != std::string::npos || m.find("NCCL") != std::string::npos) << m;
}

#if KOLO_HAVE_CUDA

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call
#define EXPECT_CUDA(call) EXPECT_EQ((call), cudaSuccess) << #call

bool HaveGpu(std::string* why) { return cuda::DeviceCount(why) > 0; }

// One device tensor of a rank: input uploaded from MakeInput, result checked on the host.
struct DeviceTensor {
  DataType dtype = DataType::kFloat32;
  size_t count = 0;
  void* in = nullptr;
  void* out = nullptr;
  DeviceTensor(DataType d, size_t c, int rank, bool in_place) : dtype(d), count(c) {
    const auto host = testing::MakeInput(d, c, rank);
    EXPECT_CUDA(cudaMalloc(&in, std::max<size_t>(bytes(), 1)));
    EXPECT_CUDA(cudaMemcpy(in, host.data(), bytes(), cudaMemcpyHostToDevice));
    if (in_place) {
      out = in;
    } else {
      EXPECT_CUDA(cudaMalloc(&out, std::max<size_t>(bytes(), 1)));
      EXPECT_CUDA(cudaMemset(out, 0, bytes()));
    }
  }
  ~DeviceTensor() {
    if (out != in) cudaFree(out);
    cudaFree(in);
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  size_t bytes() const { return count * DataTypeSize(dtype); }
  std::vector<uint8_t> Result() const {
    std::vector<uint8_t> h(bytes() + 1);
    EXPECT_CUDA(cudaMemcpy(h.data(), out, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }
};

// Element i of the result: the sum over ranks, or the average as the engine computes it (the sum
// scaled by 1/size in the dtype's own arithmetic).
double Expected(DataType dtype, int size, size_t i, bool average) {
  const double sum = ExpectedSum(size, i);
  if (!average) return sum;
  uint8_t buf[8];
  StoreElement(dtype, buf, 0, sum);
  kernels::Scale(dtype, buf, 1, 1.0 / size);
  return LoadElement(dtype, buf, 0);
}

void CheckResult(const DeviceTensor& t, int size, bool average, const std::string& what) {
  const auto h = t.Result();
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < t.count; ++i) {
    if (LoadElement(t.dtype, h.data(), i) != Expected(t.dtype, size, i, average)) {
      if (wrong++ == 0) first = i;
    }
  }
  EXPECT_EQ(wrong, 0u) << what << ": first wrong element " << first << " = "
                       << LoadElement(t.dtype, h.data(), first) << ", expected "
                       << Expected(t.dtype, size, first, average);
}

struct RingCase {
  int ranks;
  bool fused;
};

class RingDevice : public ::testing::TestWithParam<RingCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// Every dtype, sum and average, in place and out of place, sizes from empty to several staging
// chunks (4 MiB each), all ranks on device 0.
TEST_P(RingDevice, AllreduceEveryDtype) {
  const RingCase c = GetParam();
  RunRanks(
      c.ranks,
      [&](int r) {
        Options o = RankOptions(r, c.ranks);
        o.fusion_threshold_bytes = c.fused ? 64 << 20 : 0;
        return o;
      },
      [&](int rank, Engine& engine) {
        ASSERT_CUDA(cudaSetDevice(0));
        for (DataType dtype : AllDataTypes()) {
          std::vector<size_t> counts = {0, 1, 7, 1000, 65537};
          if (dtype == DataType::kFloat32) counts.push_back((10u << 20) / 4 + 3);  // 3 chunks
          if (dtype == DataType::kUInt8) counts.push_back((9u << 20) + 1);
          for (bool average : {false, true}) {
            if (average && dtype == DataType::kUInt8) continue;
            std::vector<std::unique_ptr<DeviceTensor>> ts;
            std::vector<Handle> hs;
            for (size_t k = 0; k < counts.size(); ++k) {
              ts.push_back(std::make_unique<DeviceTensor>(dtype, counts[k], rank, k % 2 == 0));
              auto h = engine.AllreduceAsync(
                  fmt::format("{}.{}.{}", DataTypeName(dtype), counts[k], average), ts.back()->in,
                  ts.back()->out, dtype, {static_cast<int64_t>(counts[k])},
                  average ? ReduceOp::kAverage : ReduceOp::kSum, TensorPlace{0, nullptr});
              ASSERT_TRUE(h.ok()) << h.status().ToString();
              hs.push_back(*h);
            }
            for (size_t k = 0; k < hs.size(); ++k) {
              Status s = engine.Wait(hs[k], std::chrono::seconds(120));
              ASSERT_TRUE(s.ok()) << s.ToString();
              CheckResult(*ts[k], c.ranks, average,
                          fmt::format("rank {} {} count {} average {}", rank, DataTypeName(dtype),
                                      counts[k], average));
            }
          }
        }
        if (c.fused) {
          EXPECT_GT(engine.stats().fused_bytes, 0);
        }
      });
}

INSTANTIATE_TEST_SUITE_P(RanksAndFusion, RingDevice,
                         ::testing::Values(RingCase{1, true}, RingCase{2, false}, RingCase{2, true},
                                           RingCase{3, true}),
                         [](const auto& info) {
                           return fmt::format("ranks{}_{}", info.param.ranks,
                                              info.param.fused ? "fused" : "unfused");
                         });

// Compression of device tensors: each rank's float32 values are 1 + (rank + 1) * 2^-12, which
// both half types round to 1 (their spacing at 1 is 2^-10 and 2^-7), so a compressed sum is
// exactly the rank count (and an average exactly 1) where float32's would not be. Fused and
// unfused, the staged ring (2 ranks) and NCCL (1 rank), fp16 and bf16.
void CompressedDeviceAllreduce(const std::string& backend, int ranks,
                               const std::string& compression, bool fused) {
  RunRanks(
      ranks,
      [&](int r) {
        Options o = RankOptions(r, ranks);
        o.backend = backend;
        o.compression = compression;
        o.fusion_threshold_bytes = fused ? 64 << 20 : 0;
        return o;
      },
      [&](int rank, Engine& engine) {
        ASSERT_CUDA(cudaSetDevice(0));
        const std::vector<size_t> counts = {1, 1000, (6u << 20) / 4 + 5};
        std::vector<float*> bufs;
        std::vector<Handle> hs;
        for (size_t k = 0; k < counts.size(); ++k) {
          std::vector<float> host(counts[k], 1.0f + static_cast<float>(rank + 1) / 4096.0f);
          float* d = nullptr;
          ASSERT_CUDA(cudaMalloc(&d, counts[k] * 4));
          ASSERT_CUDA(cudaMemcpy(d, host.data(), counts[k] * 4, cudaMemcpyHostToDevice));
          bufs.push_back(d);
          auto h = engine.AllreduceAsync(
              fmt::format("c{}", k), d, d, DataType::kFloat32, {static_cast<int64_t>(counts[k])},
              k == 1 ? ReduceOp::kAverage : ReduceOp::kSum, TensorPlace{0, nullptr});
          ASSERT_TRUE(h.ok()) << h.status().ToString();
          hs.push_back(*h);
        }
        for (size_t k = 0; k < hs.size(); ++k) {
          ASSERT_TRUE(engine.Wait(hs[k], std::chrono::seconds(120)).ok());
          std::vector<float> got(counts[k]);
          ASSERT_CUDA(cudaMemcpy(got.data(), bufs[k], counts[k] * 4, cudaMemcpyDeviceToHost));
          const float want = k == 1 ? 1.0f : static_cast<float>(ranks);
          size_t wrong = 0;
          for (float v : got) wrong += v != want;
          EXPECT_EQ(wrong, 0u) << backend << " " << compression << " rank " << rank << " tensor "
                               << k << ": first " << got[0] << ", expected " << want;
          EXPECT_CUDA(cudaFree(bufs[k]));
        }
        EXPECT_EQ(engine.stats().allreduce_wire_bytes * 2, engine.stats().allreduce_bytes);
      });
}

TEST(DeviceTensors, CompressedRingAllreduce) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const char* c : {"fp16", "bf16"}) {
    for (bool fused : {false, true}) CompressedDeviceAllreduce("ring", 2, c, fused);
  }
}

TEST(DeviceTensors, CompressedNcclAllreduce) {
  if (!KOLO_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL";
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  for (const char* c : {"fp16", "bf16"}) {
    for (bool fused : {false, true}) CompressedDeviceAllreduce("nccl", 1, c, fused);
  }
}

void SleepOnStream(void* ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(reinterpret_cast<intptr_t>(ms)));
}

// The producer writes the tensor 300 ms after submission, on a stream of its own, and records the
// ready event after the write. An engine that read the tensor without waiting on the event would
// reduce zeros.
TEST(DeviceTensors, ReadyEventIsHonoured) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  constexpr int kRanks = 2;
  constexpr size_t kCount = 3 << 20;  // 12 MiB of float32: several staging chunks
  RunRanks(kRanks, [&](int rank, Engine& engine) {
    ASSERT_CUDA(cudaSetDevice(0));
    cudaStream_t producer;
    cudaEvent_t ready;
    ASSERT_CUDA(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
    ASSERT_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    void* pinned = nullptr;
    ASSERT_CUDA(cudaMallocHost(&pinned, kCount * 4));
    const auto input = testing::MakeInput(DataType::kFloat32, kCount, rank);
    std::memcpy(pinned, input.data(), kCount * 4);
    std::vector<std::unique_ptr<DeviceTensor>> ts;
    std::vector<Handle> hs;
    for (int k = 0; k < 3; ++k) {
      // Tensors 0 and 1 are small (fused together), tensor 2 is large; 2 is out of place.
      const size_t count = k < 2 ? 1000 : kCount;
      ts.push_back(std::make_unique<DeviceTensor>(DataType::kFloat32, count, rank, k != 2));
      ASSERT_CUDA(cudaMemset(ts.back()->in, 0, ts.back()->bytes()));
    }
    ASSERT_CUDA(cudaDeviceSynchronize());
    ASSERT_CUDA(cudaLaunchHostFunc(producer, SleepOnStream, reinterpret_cast<void*>(300)));
    for (auto& t : ts) {
      ASSERT_CUDA(cudaMemcpyAsync(t->in, pinned, t->bytes(), cudaMemcpyHostToDevice, producer));
    }
    ASSERT_CUDA(cudaEventRecord(ready, producer));
    for (size_t k = 0; k < ts.size(); ++k) {
      auto h = engine.AllreduceAsync(fmt::format("late.{}", k), ts[k]->in, ts[k]->out,
                                     DataType::kFloat32, {static_cast<int64_t>(ts[k]->count)},
                                     ReduceOp::kSum, TensorPlace{0, ready});
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      hs.push_back(*h);
    }
    for (size_t k = 0; k < hs.size(); ++k) {
      Status s = engine.Wait(hs[k], std::chrono::seconds(60));
      ASSERT_TRUE(s.ok()) << s.ToString();
      CheckResult(*ts[k], kRanks, false, fmt::format("rank {} tensor {}", rank, k));
    }
    ts.clear();
    cudaFreeHost(pinned);
    cudaEventDestroy(ready);
    cudaStreamDestroy(producer);
  });
}

TEST(DeviceTensors, BroadcastFromEveryRoot) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  constexpr int kRanks = 3;
  RunRanks(kRanks, [&](int rank, Engine& engine) {
    ASSERT_CUDA(cudaSetDevice(0));
    for (int root = 0; root < kRanks; ++root) {
      for (size_t count : {size_t{0}, size_t{5}, size_t{(9u << 20) / 8 + 1}}) {
        DeviceTensor t(DataType::kFloat64, count, rank, true);
        auto h = engine.BroadcastAsync(fmt::format("bcast.{}.{}", root, count), t.out,
                                       DataType::kFloat64, {static_cast<int64_t>(count)}, root,
                                       TensorPlace{0, nullptr});
        ASSERT_TRUE(h.ok()) << h.status().ToString();
        ASSERT_TRUE(engine.Wait(*h, std::chrono::seconds(60)).ok());
        const auto got = t.Result();
        size_t wrong = 0;
        for (size_t i = 0; i < count; ++i) {
          wrong += LoadElement(DataType::kFloat64, got.data(), i) != InputValue(root, i);
        }
        EXPECT_EQ(wrong, 0u) << "rank " << rank << " root " << root << " count " << count;
      }
    }
  });
}

// Host and device tensors in flight together: each goes its own way, both right.
TEST(DeviceTensors, HostAndDeviceTensorsTogether) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  constexpr int kRanks = 2;
  RunRanks(kRanks, [&](int rank, Engine& engine) {
    ASSERT_CUDA(cudaSetDevice(0));
    DeviceTensor dev(DataType::kFloat32, 5000, rank, true);
    auto host = testing::MakeInput(DataType::kFloat32, 5000, rank);
    auto hd = engine.AllreduceAsync("mixed.device", dev.in, dev.out, DataType::kFloat32, {5000},
                                    ReduceOp::kSum, TensorPlace{0, nullptr});
    auto hh = engine.AllreduceAsync("mixed.host", host.data(), host.data(), DataType::kFloat32,
                                    {5000}, ReduceOp::kSum);
    ASSERT_TRUE(hd.ok() && hh.ok());
    ASSERT_TRUE(engine.Wait(*hd).ok());
    ASSERT_TRUE(engine.Wait(*hh).ok());
    CheckResult(dev, kRanks, false, "device");
    size_t wrong = 0;
    for (size_t i = 0; i < 5000; ++i) {
      wrong += LoadElement(DataType::kFloat32, host.data(), i) != ExpectedSum(kRanks, i);
    }
    EXPECT_EQ(wrong, 0u);
  });
}

// Rank 0 submits a device tensor, rank 1 a host tensor of the same name: both fail, naming it.
TEST(DeviceTensors, PlaceMismatchAcrossRanksFailsOnEveryRank) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  RunRanks(2, [&](int rank, Engine& engine) {
    ASSERT_CUDA(cudaSetDevice(0));
    DeviceTensor dev(DataType::kFloat32, 10, rank, true);
    auto host = testing::MakeInput(DataType::kFloat32, 10, rank);
    auto h = rank == 0 ? engine.AllreduceAsync("split", dev.in, dev.out, DataType::kFloat32, {10},
                                               ReduceOp::kSum, TensorPlace{0, nullptr})
                       : engine.AllreduceAsync("split", host.data(), host.data(),
                                               DataType::kFloat32, {10}, ReduceOp::kSum);
    ASSERT_TRUE(h.ok());
    Status s = engine.Wait(*h, std::chrono::seconds(30));
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("'split'"), std::string::npos) << s.ToString();
    EXPECT_NE(s.message().find("on device"), std::string::npos) << s.ToString();
  });
}

class NcclDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!KOLO_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL";
    std::string why;
    if (!HaveGpu(&why)) GTEST_SKIP() << "no CUDA device: " << why;
  }
};

// NCCL at one rank: every dtype, fused and unfused, sum and average, and broadcast.
TEST_F(NcclDevice, OneRankEveryDtype) {
  for (bool fused : {false, true}) {
    Options o = RankOptions(0, 1);
    o.backend = "nccl";
    o.fusion_threshold_bytes = fused ? 64 << 20 : 0;
    auto engine = Engine::Create(o);
    ASSERT_TRUE(engine.ok()) << engine.status().ToString();
    ASSERT_CUDA(cudaSetDevice(0));
    for (DataType dtype : AllDataTypes()) {
      std::vector<std::unique_ptr<DeviceTensor>> ts;
      std::vector<Handle> hs;
      const std::vector<size_t> counts = {0, 3, 1000, (5u << 20) / DataTypeSize(dtype)};
      for (size_t k = 0; k < counts.size(); ++k) {
        ts.push_back(std::make_unique<DeviceTensor>(dtype, counts[k], 0, k % 2 == 1));
        auto h = (*engine)->AllreduceAsync(
            fmt::format("nccl.{}.{}", DataTypeName(dtype), k), ts.back()->in, ts.back()->out, dtype,
            {static_cast<int64_t>(counts[k])}, k == 2 ? ReduceOp::kAverage : ReduceOp::kSum,
            TensorPlace{0, nullptr});
        ASSERT_TRUE(h.ok()) << h.status().ToString();
        hs.push_back(*h);
      }
      for (size_t k = 0; k < hs.size(); ++k) {
        Status s = (*engine)->Wait(hs[k], std::chrono::seconds(60));
        ASSERT_TRUE(s.ok()) << s.ToString();
        CheckResult(*ts[k], 1, k == 2, fmt::format("{} tensor {}", DataTypeName(dtype), k));
      }
    }
    DeviceTensor b(DataType::kInt64, 777, 0, true);
    auto h = (*engine)->BroadcastAsync("nccl.bcast", b.out, DataType::kInt64, {777}, 0,
                                       TensorPlace{0, nullptr});
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE((*engine)->Wait(*h).ok());
    CheckResult(b, 1, false, "broadcast");
    EXPECT_TRUE((*engine)->Shutdown().ok());
  }
}

// NCCL wants one GPU per rank. Two ranks on the one GPU of this host: kolo reports NCCL's refusal
// on every rank, naming the call, instead of hanging.
TEST_F(NcclDevice, TwoRanksOnOneGpuAreRefusedClearly) {
  if (cuda::DeviceCount() != 1) {
    GTEST_SKIP() << "needs exactly one visible GPU (set CUDA_VISIBLE_DEVICES=0)";
  }
  bootstrap::InMemoryStore store;
  const auto statuses = testing::RunRankThreads(2, [&](int r) -> Status {
    Options o = RankOptions(r, 2);
    o.backend = "nccl";
    o.peer_timeout_s = 60;
    auto engine = Engine::Create(o, &store);
    if (engine.ok()) return Status::OK();
    return engine.status();
  });
  for (int r = 0; r < 2; ++r) {
    const Status& s = statuses[static_cast<size_t>(r)];
    ASSERT_FALSE(s.ok()) << "rank " << r << ": NCCL accepted two ranks on one GPU";
    EXPECT_NE(s.message().find("ncclCommInitRankConfig"), std::string::npos)
        << "rank " << r << ": " << s.ToString();
    std::printf("rank %d: %s\n", r, s.ToString().c_str());
  }
}

#endif  // KOLO_HAVE_CUDA

}  // namespace
}  // namespace kolo
