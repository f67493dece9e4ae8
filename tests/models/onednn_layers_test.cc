// Gradient checks of every layer kind of the oneDNN backend against central differences, on tiny
// graphs: a 1x1 convolution before the layer under test carries its input gradient into a
// parameter gradient, and a fully-connected head and a softmax cross-entropy follow it.
#include <gtest/gtest.h>

#include <random>

#include "tests/models/onednn_test_util.h"

#if KOLO_HAVE_ONEDNN

namespace kolo::models::compute::testing {
namespace {

constexpr int64_t kClasses = 5;
constexpr int64_t kBatch = 3;

ConvParams Conv(int64_t out, int64_t k, int64_t stride = 1, int64_t pad = 0, bool bias = true,
                int64_t groups = 1) {
  ConvParams p;
  p.out_channels = out;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.bias = bias;
  p.groups = groups;
  return p;
}

PoolParams Pool(int64_t k, int64_t stride, int64_t pad = 0, bool include_pad = true) {
  PoolParams p;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.count_include_pad = include_pad;
  return p;
}

// input (c x size x size) -> 1x1 conv "pre" with bias; returns the pre layer.
int Stem(Graph& g, int64_t c = 3, int64_t size = 6) {
  const int x = g.Input("input", {c, size, size});
  return g.Conv("pre", x, Conv(c, 1));
}

// tail -> fc -> loss; finishes the graph.
Graph Head(Graph g, int tail) {
  const int fc = g.FullyConnected("head", tail, {.units = kClasses});
  g.SoftmaxCrossEntropy("loss", fc, {.num_classes = kClasses});
  const Status s = g.Finish();
  EXPECT_TRUE(s.ok()) << s.ToString();
  return g;
}

void CheckGraph(Graph g, uint32_t seed = 7) {
  Runner r(std::move(g), kBatch);
  ASSERT_TRUE(r.ok());
  std::mt19937 rng(seed);
  r.RandomParameters(rng);
  r.RandomInput(rng, kClasses);
  ExpectGradientsMatchDifferences(r);
}

TEST(OneDnnLayersTest, ConvStridedPaddedWithBias) {
  Graph g("conv");
  const int pre = Stem(g);
  CheckGraph(Head(std::move(g), g.Conv("conv", pre, Conv(4, 3, 2, 1))));
}

TEST(OneDnnLayersTest, ConvGroupedWithoutBias) {
  Graph g("grouped");
  const int pre = Stem(g, 4, 5);
  CheckGraph(Head(std::move(g), g.Conv("conv", pre, Conv(6, 3, 1, 1, false, 2))));
}

TEST(OneDnnLayersTest, ConvRectangularKernel) {
  Graph g("rect");
  const int pre = Stem(g);
  ConvParams p = Conv(4, 1, 1, 0);
  p.kernel_w = 3;
  p.pad_w = 1;
  CheckGraph(Head(std::move(g), g.Conv("conv", pre, p)));
}

TEST(OneDnnLayersTest, ConvOnTheInputNeedsNoDataGradient) {
  Graph g("first");
  const int x = g.Input("input", {3, 6, 6});
  CheckGraph(Head(std::move(g), g.Conv("conv", x, Conv(4, 3, 2, 1))));
}

TEST(OneDnnLayersTest, BatchNorm) {
  Graph g("bn");
  const int pre = Stem(g);
  CheckGraph(Head(std::move(g), g.BatchNorm("bn", pre, {.epsilon = 1e-3})));
}

TEST(OneDnnLayersTest, BatchNormOnTheInput) {
  Graph g("bn_first");
  const int x = g.Input("input", {3, 4, 4});
  CheckGraph(Head(std::move(g), g.BatchNorm("bn", x)));
}

TEST(OneDnnLayersTest, Relu) {
  Graph g("relu");
  const int pre = Stem(g);
  CheckGraph(Head(std::move(g), g.Relu("relu", pre)));
}

TEST(OneDnnLayersTest, MaxPoolPadded) {
  Graph g("maxpool");
  const int pre = Stem(g, 3, 7);
  CheckGraph(Head(std::move(g), g.MaxPool("pool", pre, Pool(3, 2, 1))));
}

TEST(OneDnnLayersTest, AvgPoolIncludingPadding) {
  Graph g("avgpool_in");
  const int pre = Stem(g, 3, 7);
  CheckGraph(Head(std::move(g), g.AvgPool("pool", pre, Pool(3, 2, 1, true))));
}

TEST(OneDnnLayersTest, AvgPoolExcludingPadding) {
  Graph g("avgpool_ex");
  const int pre = Stem(g, 3, 7);
  CheckGraph(Head(std::move(g), g.AvgPool("pool", pre, Pool(3, 2, 1, false))));
}

TEST(OneDnnLayersTest, GlobalAvgPool) {
  Graph g("gap");
  const int pre = Stem(g, 4, 5);
  CheckGraph(Head(std::move(g), g.GlobalAvgPool("gap", pre)));
}

// The stem feeds both branches, so its gradient is the sum of two deliveries.
TEST(OneDnnLayersTest, ConcatOfBranchesSharingAnInput) {
  Graph g("concat");
  const int pre = Stem(g);
  const int a = g.Conv("a", pre, Conv(2, 1));
  const int b = g.Conv("b", pre, Conv(3, 3, 1, 1));
  CheckGraph(Head(std::move(g), g.Concat("cat", {a, pre, b})));
}

// Residual: the stem feeds the convolution and the add.
TEST(OneDnnLayersTest, ResidualAdd) {
  Graph g("add");
  const int pre = Stem(g);
  const int c = g.Conv("c", pre, Conv(3, 3, 1, 1));
  CheckGraph(Head(std::move(g), g.Add("add", pre, c)));
}

TEST(OneDnnLayersTest, AddOfALayerToItself) {
  Graph g("add_self");
  const int pre = Stem(g);
  CheckGraph(Head(std::move(g), g.Add("add", pre, pre)));
}

TEST(OneDnnLayersTest, Dropout) {
  Graph g("dropout");
  const int pre = Stem(g);
  CheckGraph(Head(std::move(g), g.Dropout("drop", pre, {.rate = 0.3})));
}

TEST(OneDnnLayersTest, FullyConnectedWithAndWithoutBias) {
  Graph g("fc");
  const int pre = Stem(g, 3, 3);
  const int fc = g.FullyConnected("fc", pre, {.units = 6, .bias = false});
  const int relu = g.Relu("relu", fc);
  CheckGraph(Head(std::move(g), g.FullyConnected("fc2", relu, {.units = 7})));
}

// Two losses (an auxiliary head of weight 0.4) sum; the stem feeds both heads.
TEST(OneDnnLayersTest, WeightedSecondLoss) {
  Graph g("two_losses");
  const int pre = Stem(g, 3, 3);
  const int aux = g.FullyConnected("aux_fc", pre, {.units = kClasses});
  g.SoftmaxCrossEntropy("aux_loss", aux, {.num_classes = kClasses, .weight = 0.4});
  CheckGraph(Head(std::move(g), pre));
}

TEST(OneDnnLayersTest, SumOfInputsLoss) {
  Graph g("sum_loss");
  const int pre = Stem(g, 2, 3);
  const int fc = g.FullyConnected("fc", pre, {.units = 3});
  const int relu = g.Relu("relu", fc);
  g.SoftmaxCrossEntropy("loss", relu, {.weight = 0.5, .sum_of_inputs = true});
  ASSERT_TRUE(g.Finish().ok());
  CheckGraph(std::move(g));
}

// A deeper mix: conv-bn-relu, max pooling, a residual block, concat, average pooling, dropout.
TEST(OneDnnLayersTest, MixedNetwork) {
  Graph g("mixed");
  const int x = g.Input("input", {3, 8, 8});
  const int c1 = g.Conv("c1", x, Conv(4, 3, 1, 1, false));
  const int bn1 = g.BatchNorm("bn1", c1);
  const int r1 = g.Relu("r1", bn1);
  const int p1 = g.MaxPool("p1", r1, Pool(2, 2));
  const int c2 = g.Conv("c2", p1, Conv(4, 3, 1, 1, false));
  const int bn2 = g.BatchNorm("bn2", c2);
  const int add = g.Add("add", bn2, p1);
  const int r2 = g.Relu("r2", add);
  const int b1 = g.Conv("b1", r2, Conv(2, 1));
  const int b2 = g.AvgPool("b2", r2, Pool(3, 1, 1, false));
  const int cat = g.Concat("cat", {b1, b2});
  const int gap = g.GlobalAvgPool("gap", cat);
  CheckGraph(Head(std::move(g), g.Dropout("drop", gap, {.rate = 0.2})));
}

// The same kinds on 8- and 16-channel tensors, which the backend keeps channel-blocked: batch
// norm, ReLU in place, pooling, a residual add, a concat whose slices start on block boundaries,
// dropout, and a fully-connected layer reading a blocked input with H, W > 1.
TEST(OneDnnLayersTest, BlockedLayouts) {
  Graph g("blocked");
  const int x = g.Input("input", {3, 6, 6});
  const int c1 = g.Conv("c1", x, Conv(8, 3, 1, 1, false));
  const int bn1 = g.BatchNorm("bn1", c1);
  const int r1 = g.Relu("r1", bn1);
  const int c2 = g.Conv("c2", r1, Conv(8, 3, 1, 1));
  const int add = g.Add("add", c2, r1);
  const int p1 = g.MaxPool("p1", add, Pool(3, 2, 1));
  const int b1 = g.Conv("b1", p1, Conv(8, 1));
  const int b2 = g.AvgPool("b2", p1, Pool(3, 1, 1, false));
  const int cat = g.Concat("cat", {b1, b2});
  const int drop = g.Dropout("drop", cat, {.rate = 0.25});
  CheckGraph(Head(std::move(g), drop));
}

}  // namespace
}  // namespace kolo::models::compute::testing

#else
TEST(OneDnnLayersTest, Unavailable) { GTEST_SKIP() << "this build has no oneDNN"; }
#endif
