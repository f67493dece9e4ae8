// kolo-test-needs: CUDNN
// Parameter servers with gradients on a GPU: the trainer stages each device gradient to host
// float32 for the servers and writes the pulled weights back to the device. 2 workers on cuDNN
// and 1 server (as threads, one GPU shared) must train tiny-cnn to the weights of 1 rank of
// batch 2b over the ring, in strict fp32 and, with a looser bound, in fp16 mixed precision
// (float32 master values on the servers). Skips without a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "models/compute/backend.h"
#include "models/compute/cudnn/cudnn_backend.h"
#include "models/graph/init.h"
#include "models/trainer/synthetic_data.h"
#include "models/trainer/trainer.h"
#include "models/zoo/zoo.h"
#include "tests/engine/engine_test_util.h"

namespace kolo::models::trainer {
namespace {

constexpr int64_t kClasses = 10;
constexpr int kSteps = 2;

using compute::Precision;

Graph TinyCnn() {
  zoo::ModelConfig c;
  c.num_classes = kClasses;
  auto g = zoo::BuildModel("tiny-cnn", c);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::move(g).value();
}

// `workers` ranks on cuDNN at `precision`, each training on its slice of one shared batch of
// workers * batch images for kSteps steps, over the ring (ps_servers 0) or parameter servers.
// Returns worker 0's parameters.
std::vector<std::vector<float>> Train(const Graph& graph, int workers, int64_t batch,
                                      Precision precision, int ps_servers) {
  const int64_t image = graph.input_shape().size();
  const Batch all =
      MakeSyntheticBatches(graph.input_shape(), workers * batch, 1, kClasses, 7, 0)[0];
  const auto initial = InitialParameters(graph, 3);
  std::vector<std::vector<std::vector<float>>> result(static_cast<size_t>(workers));
  auto options = [&](int r) {
    Options o = kolo::testing::RankOptions(r, workers + ps_servers);
    if (ps_servers > 0) {
      o.backend = "ps";
      o.ps_servers = ps_servers;
    }
    return o;
  };
  kolo::testing::RunRanks(workers + ps_servers, options, [&](int, Engine& engine) {
    if (engine.role() == Role::kServer) {
      Status s = engine.Serve();
      EXPECT_TRUE(s.ok()) << s.ToString();
      return;
    }
    const int rank = engine.rank();
    std::unique_ptr<compute::ComputeBackend> backend = compute::cudnn::CreateCudnnBackend({});
    compute::BackendConfig bc;
    bc.batch = batch;
    bc.precision = precision;
    Status prepared = backend->Prepare(graph, bc);
    ASSERT_TRUE(prepared.ok()) << prepared.ToString();
    for (size_t p = 0; p < initial.size(); ++p) {
      ASSERT_TRUE(backend->SetParameter(static_cast<int>(p), initial[p]).ok());
    }
    TrainerConfig tc;
    tc.sgd = {.learning_rate = 0.1, .momentum = 0.9, .weight_decay = 1e-3};
    Trainer trainer(graph, *backend, engine, tc);
    ASSERT_TRUE(trainer.BroadcastParameters().ok());
    Batch mine;
    mine.images.assign(all.images.begin() + rank * batch * image,
                       all.images.begin() + (rank + 1) * batch * image);
    mine.labels.assign(all.labels.begin() + rank * batch, all.labels.begin() + (rank + 1) * batch);
    std::vector<Batch> micro;
    micro.push_back(std::move(mine));
    ASSERT_TRUE(trainer.SetData(std::move(micro)).ok());
    for (int s = 0; s < kSteps; ++s) {
      auto st = trainer.Step();
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      EXPECT_TRUE(std::isfinite(st->loss));
    }
    auto& out = result[static_cast<size_t>(rank)];
    for (size_t p = 0; p < graph.params().size(); ++p) {
      out.emplace_back(static_cast<size_t>(graph.params()[p].numel));
      ASSERT_TRUE(backend->GetParameter(static_cast<int>(p), out.back()).ok());
    }
  });
  double moved = 0;
  for (size_t p = 0; p < initial.size() && !result[0].empty(); ++p) {
    for (size_t i = 0; i < initial[p].size(); ++i)
      moved += std::fabs(result[0][p][i] - initial[p][i]);
  }
  EXPECT_GT(moved, 1e-3) << "the run did not move the weights";
  return result[0];
}

void ExpectClose(const Graph& graph, const std::vector<std::vector<float>>& a,
                 const std::vector<std::vector<float>>& b, double rel) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t p = 0; p < a.size(); ++p) {
    ASSERT_EQ(a[p].size(), b[p].size());
    for (size_t i = 0; i < a[p].size(); ++i) {
      ASSERT_NEAR(a[p][i], b[p][i], rel * (1.0 + std::fabs(b[p][i])))
          << graph.params()[p].name << "[" << i << "]";
    }
  }
}

TEST(CudnnParameterServerTest, GpuGradientsTrainLikeTheRing) {
  if (compute::cudnn::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device in this process";
  const Graph g = TinyCnn();
  const auto ring = Train(g, 2, 4, Precision::kFp32, 0);
  ExpectClose(g, Train(g, 2, 4, Precision::kFp32, 1), ring, 1e-4);
}

TEST(CudnnParameterServerTest, MixedPrecisionKeepsFloat32MastersOnTheServers) {
  if (compute::cudnn::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device in this process";
  const Graph g = TinyCnn();
  const auto ring = Train(g, 2, 4, Precision::kFp16, 0);
  ExpectClose(g, Train(g, 2, 4, Precision::kFp16, 1), ring, 1e-2);
}

}  // namespace
}  // namespace kolo::models::trainer
