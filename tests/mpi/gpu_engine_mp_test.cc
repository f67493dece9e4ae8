// Device tensors across real processes (mpirun or kolo-run): ranks sharing this host's GPUs
// allreduce device tensors over ring/TCP through pinned staging, NCCL where every rank has a GPU
// of its own, and the mpi backend refuses device tensors. GPU tests skip without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/cuda/device_context.h"
#include "engine/engine.h"
#include "kolo/config.h"
#include "tests/engine/engine_test_util.h"
#if KOLO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kolo {
namespace {

std::unique_ptr<Engine> MakeEngine(const std::string& backend) {
  auto options = OptionsFromEnvironment();
  EXPECT_TRUE(options.ok()) << options.status().ToString();
  if (!options.ok()) return nullptr;
  options->backend = backend;
  auto engine = Engine::Create(*options);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return nullptr;
  return std::move(engine).value();
}

// Needs no GPU: the refusal comes before any CUDA call.
TEST(GpuMultiProcess, MpiBackendRefusesDeviceTensors) {
  auto options = OptionsFromEnvironment();
  ASSERT_TRUE(options.ok());
  if (!options->launched_by_mpirun) GTEST_SKIP() << "the mpi backend needs a launch by mpirun";
  auto engine = MakeEngine("mpi");
  ASSERT_NE(engine, nullptr);
  float x = 0;
  auto h = engine->AllreduceAsync("conv1/weight", &x, &x, DataType::kFloat32, {1}, ReduceOp::kSum,
                                  TensorPlace{0, nullptr});
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("allreduce 'conv1/weight'"), std::string::npos)
      << h.status().ToString();
  EXPECT_NE(h.status().message().find("backend 'mpi' moves host tensors only"), std::string::npos)
      << h.status().ToString();
  EXPECT_TRUE(engine->Shutdown().ok());
}

#if KOLO_HAVE_CUDA

void CheckDeviceAllreduce(Engine& engine, int device) {
  ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
  const int size = engine.size(), rank = engine.rank();
  for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64}) {
    const std::vector<size_t> counts = {1, 1000, 77777, (6u << 20) / DataTypeSize(dtype) + 1};
    std::vector<void*> bufs;
    std::vector<Handle> hs;
    for (size_t c : counts) {
      const auto host = testing::MakeInput(dtype, c, rank);
      void* d = nullptr;
      ASSERT_EQ(cudaMalloc(&d, c * DataTypeSize(dtype)), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(d, host.data(), c * DataTypeSize(dtype), cudaMemcpyHostToDevice),
                cudaSuccess);
      bufs.push_back(d);
      auto h = engine.AllreduceAsync(fmt::format("dev.{}.{}", DataTypeName(dtype), c), d, d, dtype,
                                     {static_cast<int64_t>(c)}, ReduceOp::kSum,
                                     TensorPlace{device, nullptr});
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      hs.push_back(*h);
    }
    for (size_t k = 0; k < counts.size(); ++k) {
      Status s = engine.Wait(hs[k], std::chrono::seconds(120));
      ASSERT_TRUE(s.ok()) << s.ToString();
      std::vector<uint8_t> got(counts[k] * DataTypeSize(dtype));
      ASSERT_EQ(cudaMemcpy(got.data(), bufs[k], got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
      size_t wrong = 0;
      for (size_t i = 0; i < counts[k]; ++i) {
        wrong += LoadElement(dtype, got.data(), i) != testing::ExpectedSum(size, i);
      }
      EXPECT_EQ(wrong, 0u) << DataTypeName(dtype) << " count " << counts[k] << " rank " << rank;
      cudaFree(bufs[k]);
    }
  }
}

TEST(GpuMultiProcess, RingMovesDeviceTensorsOfRanksSharingGpus) {
  std::string why;
  const int gpus = cuda::DeviceCount(&why);
  if (gpus == 0) GTEST_SKIP() << "no CUDA device: " << why;
  auto engine = MakeEngine("ring");
  ASSERT_NE(engine, nullptr);
  CheckDeviceAllreduce(*engine, engine->local_rank() % gpus);
  EXPECT_TRUE(engine->Shutdown().ok());
}

TEST(GpuMultiProcess, NcclWithOneGpuPerRank) {
  if (!KOLO_HAVE_NCCL) GTEST_SKIP() << "this build has no NCCL";
  auto options = OptionsFromEnvironment();
  ASSERT_TRUE(options.ok());
  std::string why;
  const int gpus = cuda::DeviceCount(&why);
  if (gpus < options->local_size) {
    GTEST_SKIP() << "NCCL needs one GPU per rank: " << options->local_size << " local ranks, "
                 << gpus << " GPU(s)" << (why.empty() ? "" : " (" + why + ")");
  }
  auto engine = MakeEngine("nccl");
  ASSERT_NE(engine, nullptr);
  CheckDeviceAllreduce(*engine, engine->local_rank() % gpus);
  EXPECT_TRUE(engine->Shutdown().ok());
}

#endif  // KOLO_HAVE_CUDA

}  // namespace
}  // namespace kolo

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
