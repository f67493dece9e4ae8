// The engine across real processes: launched by mpirun or kolo-run (see tests/CMakeLists.txt).
// Every rank runs every test; a failure on any rank fails the launch.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "engine/engine.h"
#include "tests/engine/engine_test_util.h"

namespace kolo {
namespace {

using testing::ExpectedSum;
using testing::MakeInput;

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

void CheckAllreduce(Engine& engine) {
  const int size = engine.size(), rank = engine.rank();
  for (DataType dtype : AllDataTypes()) {
    std::vector<size_t> counts = {0, 1, 7, 1000003};
    for (size_t extra : {static_cast<size_t>(size - 1), static_cast<size_t>(size + 1)}) {
      if (std::find(counts.begin(), counts.end(), extra) == counts.end()) counts.push_back(extra);
    }
    if (dtype == DataType::kFloat32) counts.push_back((64u << 20) / 4);
    std::vector<std::vector<uint8_t>> bufs;
    std::vector<Handle> hs;
    for (size_t c : counts) {
      bufs.push_back(MakeInput(dtype, c, rank));
      auto h = engine.AllreduceAsync(fmt::format("{}.{}", DataTypeName(dtype), c),
                                     bufs.back().data(), bufs.back().data(), dtype,
                                     {static_cast<int64_t>(c)}, ReduceOp::kSum);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      hs.push_back(*h);
    }
    for (size_t k = 0; k < counts.size(); ++k) {
      Status s = engine.Wait(hs[k]);
      ASSERT_TRUE(s.ok()) << s.ToString();
      size_t wrong = 0;
      for (size_t i = 0; i < counts[k]; ++i) {
        wrong += LoadElement(dtype, bufs[k].data(), i) != ExpectedSum(size, i);
      }
      EXPECT_EQ(wrong, 0u) << DataTypeName(dtype) << " count " << counts[k] << " rank " << rank;
    }
  }
}

void CheckBroadcastAndAllgather(Engine& engine) {
  const int size = engine.size(), rank = engine.rank();
  for (int root = 0; root < size; ++root) {
    std::vector<float> data(1000 + root, rank == root ? 7.0f + root : -1.0f);
    auto h = engine.BroadcastAsync(fmt::format("bcast{}", root), data.data(), DataType::kFloat32,
                                   {static_cast<int64_t>(data.size())}, root);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(engine.Wait(*h).ok());
    for (float v : data) ASSERT_EQ(v, 7.0f + root);
  }
  std::vector<int32_t> mine(static_cast<size_t>(rank) * 2, rank);
  auto h = engine.AllgatherAsync("gather", mine.data(), DataType::kInt32, {rank, 2});
  ASSERT_TRUE(h.ok());
  auto g = engine.TakeGathered(*h);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const auto* out = reinterpret_cast<const int32_t*>(g->data.data());
  size_t k = 0;
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < r * 2; ++i) ASSERT_EQ(out[k++], r);
  }
  EXPECT_EQ(g->shape[0], static_cast<int64_t>(size) * (size - 1) / 2);
}

TEST(MultiProcess, RingBackend) {
  auto engine = MakeEngine("ring");
  ASSERT_NE(engine, nullptr);
  // Launched on this one host (tests/CMakeLists.txt): the default transport, auto, connects every
  // pair over shared memory.
  auto options = OptionsFromEnvironment();
  ASSERT_TRUE(options.ok());
  const std::string pairs = engine->stats().transport_pairs;
  if (engine->size() == 1) {
    EXPECT_EQ(pairs, "none");
  } else if (options->transport == "auto" && options->host_name.empty()) {
    EXPECT_EQ(pairs, "shm");
  } else if (options->transport != "auto") {
    EXPECT_EQ(pairs, options->transport);
  }
  CheckAllreduce(*engine);
  CheckBroadcastAndAllgather(*engine);
  ASSERT_TRUE(engine->Barrier().ok());
  EXPECT_TRUE(engine->Shutdown().ok());
}

TEST(MultiProcess, MpiBackend) {
  auto options = OptionsFromEnvironment();
  ASSERT_TRUE(options.ok());
  if (!options->launched_by_mpirun) GTEST_SKIP() << "the mpi backend needs a launch by mpirun";
  auto engine = MakeEngine("mpi");
  ASSERT_NE(engine, nullptr);
  CheckAllreduce(*engine);
  CheckBroadcastAndAllgather(*engine);
  EXPECT_TRUE(engine->Shutdown().ok());
}

}  // namespace
}  // namespace kolo

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
