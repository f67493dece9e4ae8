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
#include "tests/models/trainer_test_util.h"

namespace kolo::models::trainer {
namespace {

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
