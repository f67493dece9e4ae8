// Training the same batch split different ways, for tests that compare the weights: ranks as
// threads over the real engine, each on its slice of one shared synthetic batch, on any compute
// backend (trainer_equivalence_test: oneDNN; cudnn_ps_test: cuDNN; trainer_ps_staging_test:
// oneDNN behind a stand-in for device gradients).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include "models/compute/backend.h"
#include "models/graph/init.h"
#include "models/trainer/synthetic_data.h"
#include "models/trainer/trainer.h"
#include "models/zoo/zoo.h"
#include "tests/engine/engine_test_util.h"

namespace kolo::models::trainer {

using MakeBackend = std::function<StatusOr<std::unique_ptr<compute::ComputeBackend>>()>;

inline StatusOr<std::unique_ptr<compute::ComputeBackend>> MakeOneDnn() {
  return compute::CreateComputeBackend("onednn");
}

inline constexpr int64_t kClasses = 10;
inline constexpr int kSteps = 2;  // the second step exercises momentum

inline Graph TinyCnn() {
  zoo::ModelConfig c;
  c.num_classes = kClasses;
  auto g = zoo::BuildModel("tiny-cnn", c);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::move(g).value();
}

// Images [first, first + count) of one shared batch of `total`.
inline Batch Slice(const Batch& all, int64_t image_size, int64_t first, int64_t count) {
  Batch b;
  b.images.assign(all.images.begin() + first * image_size,
                  all.images.begin() + (first + count) * image_size);
  b.labels.assign(all.labels.begin() + first, all.labels.begin() + first + count);
  return b;
}

// Trains `ranks` ranks, each on `passes` micro-batches of `batch` images cut in rank order from
// one shared batch of ranks * passes * batch images, for kSteps steps. Returns rank 0's
// parameters (every rank's must agree, which is checked). `staging` applies with ps_servers > 0.
inline std::vector<std::vector<float>> Train(
    const Graph& graph, int ranks, int passes, int64_t batch, int ps_servers = 0,
    const MakeBackend& make = MakeOneDnn, compute::Precision precision = compute::Precision::kFp32,
    PsStaging staging = PsStaging::kOverlap) {
  const int64_t image = graph.input_shape().size();
  const Batch all =
      MakeSyntheticBatches(graph.input_shape(), ranks * passes * batch, 1, kClasses, 7, 0)[0];
  const auto initial = InitialParameters(graph, 3);
  std::vector<std::vector<std::vector<float>>> result(static_cast<size_t>(ranks));
  auto options = [&](int r) {
    Options o = kolo::testing::RankOptions(r, ranks + ps_servers);
    if (ps_servers > 0) {
      o.backend = "ps";
      o.ps_servers = ps_servers;
    }
    return o;
  };
  kolo::testing::RunRanks(ranks + ps_servers, options, [&](int, Engine& engine) {
    if (engine.role() == Role::kServer) {
      Status s = engine.Serve();
      EXPECT_TRUE(s.ok()) << s.ToString();
      return;
    }
    const int rank = engine.rank();  // the worker index
    auto made = make();
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    compute::ComputeBackend& backend = **made;
    compute::BackendConfig bc;
    bc.batch = batch;
    bc.precision = precision;
    Status prepared = backend.Prepare(graph, bc);
    ASSERT_TRUE(prepared.ok()) << prepared.ToString();
    for (size_t p = 0; p < initial.size(); ++p) {
      ASSERT_TRUE(backend.SetParameter(static_cast<int>(p), initial[p]).ok());
    }
    TrainerConfig tc;
    tc.backward_passes_per_step = passes;
    tc.sgd = {.learning_rate = 0.1, .momentum = 0.9, .weight_decay = 1e-3};
    tc.ps_staging = staging;
    Trainer trainer(graph, backend, engine, tc);
    ASSERT_TRUE(trainer.BroadcastParameters().ok());
    std::vector<Batch> micro;
    for (int m = 0; m < passes; ++m) {
      micro.push_back(Slice(all, image, (static_cast<int64_t>(rank) * passes + m) * batch, batch));
    }
    ASSERT_TRUE(trainer.SetData(std::move(micro)).ok());
    for (int s = 0; s < kSteps; ++s) {
      auto st = trainer.Step();
      ASSERT_TRUE(st.ok()) << st.status().ToString();
      EXPECT_TRUE(std::isfinite(st->loss));
    }
    auto& mine = result[static_cast<size_t>(rank)];
    for (size_t p = 0; p < graph.params().size(); ++p) {
      mine.emplace_back(static_cast<size_t>(graph.params()[p].numel));
      ASSERT_TRUE(backend.GetParameter(static_cast<int>(p), mine.back()).ok());
    }
  });
  for (int r = 1; r < ranks; ++r)
    EXPECT_EQ(result[static_cast<size_t>(r)], result[0]) << "rank " << r;
  // The run must have moved the weights, or the comparisons below would prove nothing.
  double moved = 0;
  for (size_t p = 0; p < initial.size() && !result[0].empty(); ++p) {
    for (size_t i = 0; i < initial[p].size(); ++i)
      moved += std::fabs(result[0][p][i] - initial[p][i]);
  }
  EXPECT_GT(moved, 1e-3);
  return result[0];
}

// `rel`: float32 sums in a different order differ by a few ulps of the values involved (2e-5).
inline void ExpectClose(const Graph& graph, const std::vector<std::vector<float>>& a,
                        const std::vector<std::vector<float>>& b, double rel = 2e-5) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t p = 0; p < a.size(); ++p) {
    ASSERT_EQ(a[p].size(), b[p].size());
    for (size_t i = 0; i < a[p].size(); ++i) {
      ASSERT_NEAR(a[p][i], b[p][i], rel * (1.0 + std::fabs(b[p][i])))
          << graph.params()[p].name << "[" << i << "]";
    }
  }
}

}  // namespace kolo::models::trainer
