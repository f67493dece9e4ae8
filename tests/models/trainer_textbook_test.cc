// The textbook data-parallel example on the real oneDNN backend and the real engine (two ranks as
// threads, TCP over loopback): one dense layer y = x W^T + b with 3 units on a 4x2 input per rank,
// loss = sum of all outputs, learning rate 1, plain SGD. Rank 0 starts from ones, rank 1 from
// zeros, and their inputs differ. The gradient of the sum loss is known by hand: dL/dW[j][k] is
// the sum over the batch of x[., k] for every unit j, and dL/db[j] is the batch size.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "kolo/config.h"
#include "models/compute/backend.h"
#include "models/trainer/trainer.h"
#include "tests/engine/engine_test_util.h"

namespace kolo::models::trainer {
namespace {

constexpr int kBatch = 4;
constexpr int kIn = 2;
constexpr int kUnits = 3;

Graph TextbookGraph() {
  Graph g("textbook");
  const int x = g.Input("input", {kIn, 1, 1});
  const int y = g.FullyConnected("dense", x, {.units = kUnits, .bias = true});
  LossParams loss;
  loss.num_classes = kUnits;
  loss.sum_of_inputs = true;
  g.SoftmaxCrossEntropy("loss", y, loss);
  EXPECT_TRUE(g.Finish().ok());
  return g;
}

// Rank r's 4x2 input, row-major: rows (1, 2), (3, 4), ... for rank 0, shifted by 10 for rank 1.
std::array<float, kBatch * kIn> Input(int rank) {
  std::array<float, kBatch * kIn> x{};
  for (int i = 0; i < kBatch * kIn; ++i) x[static_cast<size_t>(i)] = 1.0f + i + 10.0f * rank;
  return x;
}

// dL/dW of the sum loss on rank r's input: row j = column sums of x, for each unit j.
std::vector<float> LocalWeightGradient(int rank) {
  const auto x = Input(rank);
  std::vector<float> g(kUnits * kIn, 0.0f);
  for (int j = 0; j < kUnits; ++j) {
    for (int i = 0; i < kBatch; ++i) {
      for (int k = 0; k < kIn; ++k)
        g[static_cast<size_t>(j * kIn + k)] += x[static_cast<size_t>(i * kIn + k)];
    }
  }
  return g;
}

std::vector<float> Get(compute::ComputeBackend& b, int param, bool gradient) {
  std::vector<float> v(param == 0 ? kUnits * kIn : kUnits);
  Status s = gradient ? b.GetGradient(param, v) : b.GetParameter(param, v);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return v;
}

TEST(TrainerTextbookTest, TwoRanksAverageGradientsAndBroadcastEqualises) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph graph = TextbookGraph();
  std::array<std::vector<float>, 2> grad_w, grad_b, weights_after_step, weights_after_bcast;
  kolo::testing::RunRanks(2, [&](int rank, Engine& engine) {
    auto made = compute::CreateComputeBackend("onednn");
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    compute::ComputeBackend& backend = **made;
    compute::BackendConfig bc;
    bc.batch = kBatch;
    ASSERT_TRUE(backend.Prepare(graph, bc).ok());
    const float init = rank == 0 ? 1.0f : 0.0f;
    ASSERT_TRUE(backend.SetParameter(0, std::vector<float>(kUnits * kIn, init)).ok());
    ASSERT_TRUE(backend.SetParameter(1, std::vector<float>(kUnits, init)).ok());

    TrainerConfig tc;
    tc.sgd = {.learning_rate = 1.0, .momentum = 0.0, .weight_decay = 0.0};
    // One parameter per broadcast batch: the batches' path, each freed once set.
    tc.broadcast_batch_bytes = 1;
    Trainer trainer(graph, backend, engine, tc);
    const auto x = Input(rank);
    Batch batch{std::vector<float>(x.begin(), x.end()), std::vector<int32_t>(kBatch, 0)};
    ASSERT_TRUE(trainer.SetData({batch}).ok());
    auto step = trainer.Step();
    ASSERT_TRUE(step.ok()) << step.status().ToString();
    // The loss is the plain sum of the outputs: check it against this rank's own forward pass.
    double expected_loss = 0;
    for (int i = 0; i < kBatch; ++i) {
      for (int j = 0; j < kUnits; ++j) {
        expected_loss += init;
        for (int k = 0; k < kIn; ++k) expected_loss += init * x[static_cast<size_t>(i * kIn + k)];
      }
    }
    EXPECT_NEAR(step->loss, expected_loss, 1e-4 * (1 + expected_loss));
    grad_w[static_cast<size_t>(rank)] = Get(backend, 0, true);
    grad_b[static_cast<size_t>(rank)] = Get(backend, 1, true);
    weights_after_step[static_cast<size_t>(rank)] = Get(backend, 0, false);
    ASSERT_TRUE(trainer.BroadcastParameters().ok());
    weights_after_bcast[static_cast<size_t>(rank)] = Get(backend, 0, false);
  });
  if (HasFatalFailure()) return;

  const auto g0 = LocalWeightGradient(0);
  const auto g1 = LocalWeightGradient(1);
  for (size_t i = 0; i < g0.size(); ++i) {
    const float mean = 0.5f * (g0[i] + g1[i]);
    EXPECT_FLOAT_EQ(grad_w[0][i], mean) << "element " << i;
    EXPECT_FLOAT_EQ(grad_w[1][i], mean) << "element " << i;
    // Plain SGD at learning rate 1 from each rank's own start.
    EXPECT_FLOAT_EQ(weights_after_step[0][i], 1.0f - mean);
    EXPECT_FLOAT_EQ(weights_after_step[1][i], 0.0f - mean);
    EXPECT_NE(weights_after_step[0][i], weights_after_step[1][i]);
  }
  for (int j = 0; j < kUnits; ++j) {
    EXPECT_FLOAT_EQ(grad_b[0][static_cast<size_t>(j)], kBatch);
    EXPECT_FLOAT_EQ(grad_b[1][static_cast<size_t>(j)], kBatch);
  }
  EXPECT_EQ(weights_after_bcast[0], weights_after_step[0]);
  EXPECT_EQ(weights_after_bcast[1], weights_after_step[0]);
}

}  // namespace
// The single-rank baseline (kolo-train --backend none): no engine, each parameter updated from its
// own local gradient, the step's phases timed and adding up to the step.
TEST(TrainerTextbookTest, WithoutAnEngineTheLocalGradientIsApplied) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph graph = TextbookGraph();
  auto made = compute::CreateComputeBackend("onednn");
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  compute::ComputeBackend& backend = **made;
  compute::BackendConfig bc;
  bc.batch = kBatch;
  ASSERT_TRUE(backend.Prepare(graph, bc).ok());
  ASSERT_TRUE(backend.SetParameter(0, std::vector<float>(kUnits * kIn, 1.0f)).ok());
  ASSERT_TRUE(backend.SetParameter(1, std::vector<float>(kUnits, 1.0f)).ok());
  TrainerConfig tc;
  tc.sgd = {.learning_rate = 1.0, .momentum = 0.0, .weight_decay = 0.0};
  Trainer trainer(graph, backend, tc);
  ASSERT_TRUE(trainer.BroadcastParameters().ok());  // nothing to do, and no engine to ask
  const auto x = Input(1);
  Batch batch{std::vector<float>(x.begin(), x.end()), std::vector<int32_t>(kBatch, 0)};
  ASSERT_TRUE(trainer.SetData({batch}).ok());
  auto step = trainer.Step();
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  const auto g = LocalWeightGradient(1);
  const auto w = Get(backend, 0, false);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(w[i], 1.0f - g[i]) << "element " << i;
  EXPECT_LT(step->wait_seconds, 0.01) << "nothing to wait for";
  EXPECT_GT(step->forward_seconds, 0);
  EXPECT_GT(step->backward_seconds, 0);
  EXPECT_GT(step->update_seconds, 0);
  const double phases =
      step->forward_seconds + step->backward_seconds + step->wait_seconds + step->update_seconds;
  EXPECT_LE(phases, step->seconds);
  EXPECT_GT(phases, 0.5 * step->seconds) << "the phases should cover the step";
}

}  // namespace kolo::models::trainer
