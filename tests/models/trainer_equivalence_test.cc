// Data parallelism changes where the images of a step are processed, not what the step computes:
// 2 ranks x batch b train to the same weights as 1 rank x batch 2b, and N backward passes of b
// per step to the same weights as one pass of N*b. Real oneDNN, real engine over loopback TCP.
//
// Batch norm is left out on purpose: it normalises with each rank's (and each micro-batch's) own
// statistics, as Horovod does, so a model with it is not equivalent to one large batch. tiny-cnn
// (convolutions with bias, ReLU, max pooling, fully connected, softmax cross-entropy) has none,
// and no dropout, whose masks are drawn per rank.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kolo/config.h"
#include "models/compute/backend.h"
#include "models/graph/init.h"
#include "models/trainer/synthetic_data.h"
#include "models/trainer/trainer.h"
#include "models/zoo/zoo.h"
#include "tests/engine/engine_test_util.h"

namespace kolo::models::trainer {
namespace {

constexpr int64_t kClasses = 10;
constexpr int kSteps = 2;  // the second step exercises momentum

Graph TinyCnn() {
  zoo::ModelConfig c;
  c.num_classes = kClasses;
  auto g = zoo::BuildModel("tiny-cnn", c);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return std::move(g).value();
}

// Images [first, first + count) of one shared batch of `total`.
Batch Slice(const Batch& all, int64_t image_size, int64_t first, int64_t count) {
  Batch b;
  b.images.assign(all.images.begin() + first * image_size,
                  all.images.begin() + (first + count) * image_size);
  b.labels.assign(all.labels.begin() + first, all.labels.begin() + first + count);
  return b;
}

// Trains `ranks` ranks, each on `passes` micro-batches of `batch` images cut in rank order from
// one shared batch of ranks * passes * batch images, for kSteps steps. Returns rank 0's
// parameters (every rank's must agree, which is checked).
std::vector<std::vector<float>> Train(const Graph& graph, int ranks, int passes, int64_t batch,
                                      int ps_servers = 0) {
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
    auto made = compute::CreateComputeBackend("onednn");
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    compute::ComputeBackend& backend = **made;
    compute::BackendConfig bc;
    bc.batch = batch;
    ASSERT_TRUE(backend.Prepare(graph, bc).ok());
    for (size_t p = 0; p < initial.size(); ++p) {
      ASSERT_TRUE(backend.SetParameter(static_cast<int>(p), initial[p]).ok());
    }
    TrainerConfig tc;
    tc.backward_passes_per_step = passes;
    tc.sgd = {.learning_rate = 0.1, .momentum = 0.9, .weight_decay = 1e-3};
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

void ExpectClose(const Graph& graph, const std::vector<std::vector<float>>& a,
                 const std::vector<std::vector<float>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t p = 0; p < a.size(); ++p) {
    ASSERT_EQ(a[p].size(), b[p].size());
    for (size_t i = 0; i < a[p].size(); ++i) {
      // float32 sums in a different order: a few ulps of the values involved.
      ASSERT_NEAR(a[p][i], b[p][i], 2e-5 * (1.0 + std::fabs(b[p][i])))
          << graph.params()[p].name << "[" << i << "]";
    }
  }
}

TEST(TrainerEquivalenceTest, TwoRanksOfBatchBEqualOneRankOfBatch2B) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  const auto two = Train(g, 2, 1, 3);
  const auto one = Train(g, 1, 1, 6);
  ExpectClose(g, two, one);
}

TEST(TrainerEquivalenceTest, BackwardPassesPerStepEqualOnePassOfTheWholeBatch) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  const auto accumulated = Train(g, 1, 3, 2);
  const auto whole = Train(g, 1, 1, 6);
  ExpectClose(g, accumulated, whole);
}

TEST(TrainerEquivalenceTest, TwoRanksWithTwoPassesEqualOneRankOfTheWholeBatch) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  const auto both = Train(g, 2, 2, 2);
  const auto whole = Train(g, 1, 1, 8);
  ExpectClose(g, both, whole);
}

// Parameter servers average the pushed gradients and apply the same SGD: 2 workers and 1 server
// (as threads) train to the weights of 1 rank x 2b, with and without local aggregation.
TEST(TrainerEquivalenceTest, ParameterServersTrainLikeOneLargeBatch) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  const auto whole = Train(g, 1, 1, 8);
  ExpectClose(g, Train(g, 2, 1, 4, /*ps_servers=*/1), whole);
  ExpectClose(g, Train(g, 2, 2, 2, /*ps_servers=*/2), whole);
}

TEST(TrainerEquivalenceTest, SetDataNeedsOneBatchPerBackwardPass) {
  if (!KOLO_HAVE_ONEDNN) GTEST_SKIP() << "this build has no oneDNN backend";
  const Graph g = TinyCnn();
  kolo::testing::RunRanks(1, [&](int, Engine& engine) {
    auto made = compute::CreateComputeBackend("onednn");
    ASSERT_TRUE(made.ok());
    compute::BackendConfig bc;
    bc.batch = 2;
    ASSERT_TRUE((*made)->Prepare(g, bc).ok());
    TrainerConfig tc;
    tc.backward_passes_per_step = 2;
    Trainer trainer(g, **made, engine, tc);
    EXPECT_FALSE(trainer.Step().ok());
    Status s = trainer.SetData(MakeSyntheticBatches(g.input_shape(), 2, 1, kClasses, 1, 0));
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("backward_passes_per_step is 2"), std::string::npos) << s.message();
  });
}

}  // namespace
}  // namespace kolo::models::trainer
