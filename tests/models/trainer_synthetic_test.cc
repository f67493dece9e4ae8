// Synthetic input: the shapes asked for, reproducible, different per rank and per micro-batch,
// pixels within the truncation and roughly standard normal, labels in range and spread out.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "models/trainer/synthetic_data.h"

namespace kolo::models::trainer {
namespace {

TEST(SyntheticDataTest, ShapesAndRanges) {
  const ImageShape shape{3, 16, 16};
  const auto batches = MakeSyntheticBatches(shape, 8, 2, 5, 42, 0);
  ASSERT_EQ(batches.size(), 2u);
  for (const Batch& b : batches) {
    ASSERT_EQ(b.images.size(), 8u * 3 * 16 * 16);
    ASSERT_EQ(b.labels.size(), 8u);
    double sum = 0, sq = 0;
    for (float x : b.images) {
      ASSERT_LE(std::fabs(x), 2.0f);
      sum += x;
      sq += static_cast<double>(x) * x;
    }
    const double n = static_cast<double>(b.images.size());
    EXPECT_NEAR(sum / n, 0.0, 0.05);
    // A standard normal truncated to [-2, 2] has variance about 0.774.
    EXPECT_NEAR(sq / n, 0.774, 0.05);
    for (int32_t l : b.labels) {
      EXPECT_GE(l, 0);
      EXPECT_LT(l, 5);
    }
  }
}

TEST(SyntheticDataTest, ReproducibleAndDifferentPerRankAndMicroBatch) {
  const ImageShape shape{1, 4, 4};
  const auto a = MakeSyntheticBatches(shape, 64, 2, 1000, 7, 0);
  const auto again = MakeSyntheticBatches(shape, 64, 2, 1000, 7, 0);
  const auto other_rank = MakeSyntheticBatches(shape, 64, 2, 1000, 7, 1);
  const auto other_seed = MakeSyntheticBatches(shape, 64, 2, 1000, 8, 0);
  EXPECT_EQ(a[0].images, again[0].images);
  EXPECT_EQ(a[1].labels, again[1].labels);
  EXPECT_NE(a[0].images, a[1].images);
  EXPECT_NE(a[0].images, other_rank[0].images);
  EXPECT_NE(a[0].labels, other_rank[0].labels);
  EXPECT_NE(a[0].images, other_seed[0].images);
  std::set<int32_t> distinct(a[0].labels.begin(), a[0].labels.end());
  EXPECT_GT(distinct.size(), 50u) << "64 labels out of 1000 classes should rarely repeat";
}

}  // namespace
}  // namespace kolo::models::trainer
