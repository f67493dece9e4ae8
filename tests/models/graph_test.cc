// The layer IR: shape inference against hand-computed torch shapes, every builder error, the
// consumer lists, the backprop order, and the deterministic parameter initialisation.
#include "models/graph/graph.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "models/graph/init.h"

namespace kolo::models {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ConvParams Conv(int64_t out, int64_t k, int64_t stride = 1, int64_t pad = 0, bool bias = false) {
  ConvParams p;
  p.out_channels = out;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.bias = bias;
  return p;
}

PoolParams Pool(int64_t k, int64_t stride, int64_t pad = 0) {
  PoolParams p;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  return p;
}

// A graph that is complete apart from the layers under test: `tail` is wired to fc + loss.
Status FinishWithHead(Graph& g, int tail, int64_t classes = 3) {
  const int fc = g.FullyConnected("head_fc", tail, {.units = classes});
  g.SoftmaxCrossEntropy("head_loss", fc, {.num_classes = classes});
  return g.Finish();
}

TEST(GraphTest, ConvAndPoolShapesFollowTorchFloorRule) {
  Graph g("shapes");
  const int x = g.Input("input", {3, 224, 224});
  const int c1 = g.Conv("conv1", x, Conv(64, 7, 2, 3));
  const int p1 = g.MaxPool("pool1", c1, Pool(3, 2, 1));
  const int c2 = g.Conv("conv2", p1, Conv(8, 3, 2, 0, true));  // (56 - 3) / 2 + 1 = 27
  const int a = g.AvgPool("avg", c2, Pool(5, 3));              // (27 - 5) / 3 + 1 = 8
  const int gp = g.GlobalAvgPool("gap", a);
  ASSERT_TRUE(FinishWithHead(g, gp).ok());
  EXPECT_EQ(g.layer(c1).out, (ImageShape{64, 112, 112}));
  EXPECT_EQ(g.layer(p1).out, (ImageShape{64, 56, 56}));
  EXPECT_EQ(g.layer(c2).out, (ImageShape{8, 27, 27}));
  EXPECT_EQ(g.layer(a).out, (ImageShape{8, 8, 8}));
  EXPECT_EQ(g.layer(gp).out, (ImageShape{8, 1, 1}));
  EXPECT_EQ(g.layer(c2).in, (ImageShape{64, 56, 56}));
  EXPECT_EQ(ToString(g.layer(c1).out), "64x112x112");
  EXPECT_EQ(g.input_shape(), (ImageShape{3, 224, 224}));
  EXPECT_EQ(g.FindLayer("pool1"), p1);
  EXPECT_EQ(g.FindLayer("nope"), -1);
}

TEST(GraphTest, AsymmetricKernelAndGroups) {
  Graph g("asym");
  const int x = g.Input("input", {8, 17, 17});
  ConvParams p;
  p.out_channels = 12;
  p.kernel_h = 1;
  p.kernel_w = 7;
  p.pad_w = 3;
  p.groups = 4;
  const int c = g.Conv("c", x, p);
  ASSERT_TRUE(FinishWithHead(g, c).ok());
  EXPECT_EQ(g.layer(c).out, (ImageShape{12, 17, 17}));
  const Parameter& w = g.params()[static_cast<size_t>(g.layer(c).param_ids[0])];
  EXPECT_EQ(w.name, "c/weight");
  EXPECT_THAT(w.shape, ElementsAre(12, 2, 1, 7));
  EXPECT_EQ(w.numel, 12 * 2 * 7);
  EXPECT_EQ(g.layer(c).macs, 12 * 17 * 17 * 2 * 1 * 7);
}

TEST(GraphTest, ParametersMacsAndBackpropOrder) {
  Graph g("params");
  const int x = g.Input("input", {3, 8, 8});
  const int c = g.Conv("conv", x, Conv(4, 3, 1, 1, true));
  const int bn = g.BatchNorm("bn", c);
  const int r = g.Relu("relu", bn);
  const int fc1 = g.FullyConnected("fc1", r, {.units = 5});
  const int fc2 = g.FullyConnected("fc2", fc1, {.units = 3, .bias = false});
  g.SoftmaxCrossEntropy("loss", fc2, {.num_classes = 3});
  ASSERT_TRUE(g.Finish().ok());

  std::vector<std::string> names;
  for (const Parameter& p : g.params()) names.push_back(p.name);
  EXPECT_THAT(names, ElementsAre("conv/weight", "conv/bias", "bn/gamma", "bn/beta", "fc1/weight",
                                 "fc1/bias", "fc2/weight"));
  EXPECT_THAT(g.params()[4].shape, ElementsAre(5, 4 * 8 * 8));
  EXPECT_EQ(g.params()[2].init, Parameter::Init::kOnes);
  EXPECT_EQ(g.params()[3].init, Parameter::Init::kZeros);
  EXPECT_EQ(g.params()[1].init, Parameter::Init::kZeros);
  EXPECT_EQ(g.params()[0].init, Parameter::Init::kHeNormal);
  EXPECT_EQ(g.params()[6].layer, fc2);
  EXPECT_EQ(g.NumParameterElements(), 4 * 3 * 9 + 4 + 4 + 4 + 5 * 256 + 5 + 3 * 5);
  EXPECT_EQ(g.layer(c).macs, 4 * 8 * 8 * 3 * 9);
  EXPECT_EQ(g.layer(fc1).macs, 256 * 5);
  EXPECT_EQ(g.layer(bn).macs, 0);
  EXPECT_EQ(g.ForwardMacsPerImage(), 4 * 64 * 27 + 256 * 5 + 5 * 3);
  // Layers last to first, within a layer creation order.
  EXPECT_THAT(g.BackpropOrder(), ElementsAre(6, 4, 5, 2, 3, 0, 1));
  EXPECT_THAT(g.loss_layers(), ElementsAre(6));
  EXPECT_EQ(g.layer(6).out, (ImageShape{1, 1, 1}));
}

TEST(GraphTest, ConsumersConcatAddAndTwoLosses) {
  Graph g("branches");
  const int x = g.Input("input", {2, 6, 6});
  const int a = g.Conv("a", x, Conv(3, 1));
  const int b = g.Conv("b", x, Conv(5, 3, 1, 1));
  const int cat = g.Concat("cat", {a, b});
  const int c = g.Conv("c", cat, Conv(8, 1));
  const int sum = g.Add("sum", cat, c);
  const int twice = g.Add("twice", sum, sum);
  const int fc_aux = g.FullyConnected("fc_aux", cat, {.units = 4});
  const int aux = g.SoftmaxCrossEntropy("aux", fc_aux, {.num_classes = 4, .weight = 0.4});
  const int fc = g.FullyConnected("fc", twice, {.units = 4});
  const int loss = g.SoftmaxCrossEntropy("loss", fc, {.num_classes = 4});
  ASSERT_TRUE(g.Finish().ok());
  EXPECT_EQ(g.layer(cat).out, (ImageShape{8, 6, 6}));
  EXPECT_EQ(g.layer(cat).in, (ImageShape{3, 6, 6}));
  EXPECT_THAT(g.layer(x).consumers, ElementsAre(a, b));
  EXPECT_THAT(g.layer(cat).consumers, ElementsAre(c, sum, fc_aux));
  EXPECT_THAT(g.layer(sum).consumers, ElementsAre(twice));
  EXPECT_THAT(g.layer(twice).inputs, ElementsAre(sum, sum));
  EXPECT_TRUE(g.layer(loss).consumers.empty());
  EXPECT_THAT(g.loss_layers(), ElementsAre(aux, loss));
  EXPECT_STREQ(LayerKindName(g.layer(cat).kind), "concat");
  EXPECT_STREQ(LayerKindName(LayerKind::kSoftmaxCrossEntropy), "softmax_cross_entropy");
  EXPECT_STREQ(LayerKindName(LayerKind::kBatchNorm), "batch_norm");
}

// Builds a graph whose first error is made by `build` and returns Finish()'s status.
template <typename F>
Status BuildError(F build) {
  Graph g("bad");
  const int x = g.Input("input", {4, 8, 8});
  const int last = build(g, x);
  return FinishWithHead(g, last);
}

struct ErrorCase {
  const char* name;
  int (*build)(Graph&, int);
  const char* message;
};

const ErrorCase kErrorCases[] = {
    {"conv_zero_channels", [](Graph& g, int x) { return g.Conv("c", x, Conv(0, 3)); },
     "conv 'c' has out_channels 0"},
    {"conv_zero_stride", [](Graph& g, int x) { return g.Conv("c", x, Conv(4, 3, 0)); },
     "stride 0x0"},
    {"conv_negative_pad", [](Graph& g, int x) { return g.Conv("c", x, Conv(4, 3, 1, -1)); },
     "padding >= 0"},
    {"conv_kernel_too_big", [](Graph& g, int x) { return g.Conv("c", x, Conv(4, 11, 1, 1)); },
     "kernel 11x11 does not fit its input 4x8x8 padded by 1x1"},
    {"conv_groups",
     [](Graph& g, int x) {
       ConvParams p = Conv(6, 1);
       p.groups = 4;
       return g.Conv("c", x, p);
     },
     "not both divisible by groups 4"},
    {"bn_epsilon", [](Graph& g, int x) { return g.BatchNorm("bn", x, {.epsilon = 0}); },
     "epsilon must be > 0"},
    {"maxpool_window", [](Graph& g, int x) { return g.MaxPool("p", x, Pool(9, 1)); },
     "max pool 'p' window 9x9 is larger than its input 4x8x8"},
    {"avgpool_pad", [](Graph& g, int x) { return g.AvgPool("p", x, Pool(3, 1, 2)); },
     "padding may be at most half"},
    {"pool_stride", [](Graph& g, int x) { return g.AvgPool("p", x, Pool(2, 0)); },
     "kernel and stride must be positive"},
    {"concat_hw",
     [](Graph& g, int x) {
       const int a = g.Conv("a", x, Conv(2, 3));
       return g.Concat("cat", {x, a});
     },
     "concat 'cat' joins 'input' (4x8x8) and 'a' (2x6x6)"},
    {"concat_empty", [](Graph& g, int) { return g.Concat("cat", {}); }, "has no inputs"},
    {"add_shapes",
     [](Graph& g, int x) {
       const int a = g.Conv("a", x, Conv(2, 1));
       return g.Add("sum", x, a);
     },
     "add 'sum' sums 'input' (4x8x8) and 'a' (2x8x8)"},
    {"bad_index", [](Graph& g, int) { return g.Relu("r", 42); },
     "layer 'r' reads layer index 42, but only 1 layers exist"},
    {"negative_index", [](Graph& g, int) { return g.Relu("r", -1); }, "reads layer index -1"},
    {"dropout_rate", [](Graph& g, int x) { return g.Dropout("d", x, {.rate = 1.0}); },
     "dropout 'd' has rate 1"},
    {"fc_units", [](Graph& g, int x) { return g.FullyConnected("f", x, {.units = 0}); },
     "fully connected 'f' has 0 units"},
    {"loss_shape",
     [](Graph& g, int x) {
       g.SoftmaxCrossEntropy("l", x, {.num_classes = 3});
       return x;
     },
     "loss 'l' over 3 classes reads 'input' of shape 4x8x8; logits must be 3x1x1"},
    {"reads_loss",
     [](Graph& g, int x) {
       const int f = g.FullyConnected("f", x, {.units = 2});
       const int l = g.SoftmaxCrossEntropy("l", f, {.num_classes = 2});
       return g.Relu("r", l);
     },
     "reads loss layer 'l'"},
    {"second_input",
     [](Graph& g, int x) {
       g.Input("input2", {1, 1, 1});
       return x;
     },
     "second input layer 'input2'"},
    {"conv_zero_kernel", [](Graph& g, int x) { return g.Conv("c", x, Conv(4, 0)); }, "kernel 0x0"},
    {"duplicate_name", [](Graph& g, int x) { return g.Relu("input", x); },
     "two layers are named 'input'"},
    {"unconsumed",
     [](Graph& g, int x) {
       g.Relu("dangling", x);
       return x;
     },
     "relu layer 'dangling' is never read"},
};

class GraphErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(GraphErrorTest, FinishReturnsTheFirstError) {
  const Status s = BuildError(GetParam().build);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr(GetParam().message));
  EXPECT_THAT(s.message(), HasSubstr("graph 'bad'"));
}

INSTANTIATE_TEST_SUITE_P(Builders, GraphErrorTest, ::testing::ValuesIn(kErrorCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(GraphTest, FirstErrorWinsAndLaterLayersStillGetIndices) {
  Graph g("chain");
  const int x = g.Input("input", {1, 4, 4});
  const int bad = g.Conv("first", x, Conv(2, 9));
  const int later = g.Conv("second", bad, Conv(0, 1));
  EXPECT_EQ(later, bad + 1);
  const Status s = FinishWithHead(g, later);
  EXPECT_THAT(s.message(), HasSubstr("conv 'first'"));
  EXPECT_TRUE(g.params().empty());  // failed layers own no parameters
}

TEST(GraphTest, ToStringListsEveryLayer) {
  Graph g("table");
  const int x = g.Input("input", {3, 4, 4});
  const int c = g.Conv("conv", x, Conv(2, 3, 1, 1, true));
  ASSERT_TRUE(FinishWithHead(g, c, 5).ok());
  const std::string text = ToString(g);
  EXPECT_THAT(text, HasSubstr("table: 4 layers, 221 parameters in 4 tensors"));
  EXPECT_THAT(text, ::testing::ContainsRegex("conv +conv +2x4x4 +56 +864\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex("head_fc +fully_connected +5x1x1 +165 +160\n"));
  EXPECT_THAT(text, ::testing::ContainsRegex("head_loss +softmax_cross_entropy +1x1x1 +0 +0\n"));
}

TEST(GraphTest, SumOfInputsLossReadsAnyShape) {
  Graph g("sum");
  const int x = g.Input("input", {2, 1, 1});
  const int fc = g.FullyConnected("dense", x, {.units = 3, .bias = false});
  g.SoftmaxCrossEntropy("loss", fc, {.num_classes = 0, .sum_of_inputs = true});
  ASSERT_TRUE(g.Finish().ok());
  EXPECT_EQ(g.layer(2).out, (ImageShape{1, 1, 1}));
  EXPECT_EQ(g.layer(2).in, (ImageShape{3, 1, 1}));
}

TEST(GraphTest, InputShapeMustBePositive) {
  Graph g("in");
  const int x = g.Input("input", {3, 0, 8});
  g.SoftmaxCrossEntropy("loss", g.FullyConnected("fc", x, {.units = 2}), {.num_classes = 2});
  EXPECT_THAT(g.Finish().message(),
              HasSubstr("input 'input' has shape 3x0x8; every dimension must be positive"));
}

TEST(GraphTest, MissingInputOrLossAndFinishTwice) {
  Graph none("empty");
  EXPECT_THAT(none.Finish().message(), HasSubstr("graph 'empty' has no input layer"));
  EXPECT_EQ(none.Finish().code(), StatusCode::kFailedPrecondition);
  Graph noloss("noloss");
  noloss.FullyConnected("fc", noloss.Input("input", {2, 1, 1}), {.units = 2});
  const Status s = noloss.Finish();
  EXPECT_THAT(s.message(), HasSubstr("has no loss layer"));
}

TEST(InitTest, DeterministicPerSeedAndIndependentOfOtherParameters) {
  Graph g("init");
  const int x = g.Input("input", {3, 8, 8});
  const int c = g.Conv("conv", x, Conv(16, 3, 1, 1, true));
  const int bn = g.BatchNorm("bn", c);
  ASSERT_TRUE(FinishWithHead(g, bn, 10).ok());
  const auto a = InitialParameters(g, 7);
  const auto b = InitialParameters(g, 7);
  const auto other = InitialParameters(g, 8);
  ASSERT_EQ(a.size(), g.params().size());
  EXPECT_EQ(a, b);
  EXPECT_NE(a[0], other[0]);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(static_cast<int64_t>(a[i].size()), g.params()[i].numel) << g.params()[i].name;
  }
  EXPECT_EQ(a[1], std::vector<float>(16, 0.0f));  // conv bias
  EXPECT_EQ(a[2], std::vector<float>(16, 1.0f));  // gamma
  EXPECT_EQ(a[3], std::vector<float>(16, 0.0f));  // beta
  std::vector<float> single(static_cast<size_t>(g.params()[4].numel));
  InitialParameter(g.params()[4], 4, 7, single);
  EXPECT_EQ(single, a[4]);
  // Golden values (splitmix64 + Box-Muller, seed 7, parameter 0 of shape [4, 3, 3, 3]): the same
  // on every machine; a change to the generator must be deliberate.
  Parameter p{.name = "w", .shape = {4, 3, 3, 3}, .numel = 108, .layer = 0};
  p.init = Parameter::Init::kHeNormal;
  std::vector<float> golden(108);
  InitialParameter(p, 0, 7, golden);
  EXPECT_FLOAT_EQ(golden[0], -0.129585937f);
  EXPECT_FLOAT_EQ(golden[1], -0.177664727f);
  EXPECT_FLOAT_EQ(golden[2], -0.236252531f);
  EXPECT_FLOAT_EQ(golden[3], -0.181443691f);
}

// A fully-connected layer given init_std draws from N(0, init_std), whatever its fan-in (VGG's
// classifier, as torchvision initialises it).
TEST(InitTest, FixedStdNormal) {
  Graph g("fixed_std");
  const int x = g.Input("input", {64, 3, 3});
  const int fc = g.FullyConnected("fc", x, {.units = 512, .init_std = 0.01});
  g.SoftmaxCrossEntropy("loss", fc, {.num_classes = 512});
  ASSERT_TRUE(g.Finish().ok());
  EXPECT_EQ(g.params()[0].init, Parameter::Init::kNormal);
  EXPECT_EQ(g.params()[1].init, Parameter::Init::kZeros);
  const std::vector<float> w = InitialParameters(g, 3)[0];
  double sum = 0, sq = 0;
  for (float v : w) {
    sum += v;
    sq += double{v} * v;
  }
  const double n = static_cast<double>(w.size());
  EXPECT_NEAR(sum / n, 0.0, 5 * 0.01 / 543);
  EXPECT_NEAR(std::sqrt(sq / n - (sum / n) * (sum / n)), 0.01, 0.0002);
}

TEST(InitTest, HeNormalStatistics) {
  Graph g("stats");
  const int x = g.Input("input", {64, 3, 3});
  const int fc = g.FullyConnected("fc", x, {.units = 512});  // fan_in 576: std 0.0589
  g.SoftmaxCrossEntropy("loss", fc, {.num_classes = 512});
  ASSERT_TRUE(g.Finish().ok());
  const std::vector<float> w = InitialParameters(g, 1)[0];
  ASSERT_EQ(w.size(), 512u * 576u);
  double sum = 0, sq = 0, cube = 0, quad = 0;
  int64_t beyond2 = 0;
  const double sd = std::sqrt(2.0 / 576.0);
  for (float v : w) {
    sum += v;
    sq += double{v} * v;
  }
  const double n = static_cast<double>(w.size());
  const double mean = sum / n;
  const double var = sq / n - mean * mean;
  for (float v : w) {
    const double z = (v - mean) / std::sqrt(var);
    cube += z * z * z;
    quad += z * z * z * z;
    if (std::fabs(v) > 2 * sd) ++beyond2;
  }
  // 294,912 samples: the standard error of the mean is sd / 543; of the std about 0.13%.
  EXPECT_NEAR(mean, 0.0, 5 * sd / 543);
  EXPECT_NEAR(std::sqrt(var), sd, 0.01 * sd);
  EXPECT_NEAR(cube / n, 0.0, 0.03);         // skewness of a normal
  EXPECT_NEAR(quad / n, 3.0, 0.06);         // kurtosis of a normal
  EXPECT_NEAR(beyond2 / n, 0.0455, 0.003);  // P(|z| > 2)
}

}  // namespace
}  // namespace kolo::models
