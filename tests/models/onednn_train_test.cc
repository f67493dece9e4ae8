// The oneDNN backend in training: local gradient aggregation adds, SGD matches torch's update on
// a hand-computed example, zoo networks learn a learnable synthetic task, runs repeat exactly
// under one seed, whole tiny zoo networks pass the gradient check, and bad calls are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "models/graph/init.h"
#include "models/zoo/zoo.h"
#include "tests/models/onednn_test_util.h"

#if KOLO_HAVE_ONEDNN

namespace kolo::models::compute::testing {
namespace {

Graph Zoo(const std::string& name, int64_t classes, int64_t image = 8, double dropout = -1) {
  zoo::ModelConfig config;
  config.image_size = image;
  config.num_classes = classes;
  config.dropout = dropout;
  auto g = zoo::BuildModel(name, config);
  if (!g.ok()) {
    ADD_FAILURE() << g.status().ToString();
    return Graph("unbuilt");
  }
  return std::move(g).value();
}

void InitFromZoo(Runner& r, uint64_t seed) {
  const auto values = InitialParameters(r.graph(), seed);
  for (size_t p = 0; p < values.size(); ++p) r.SetParam(static_cast<int>(p), values[p]);
}

// conv (bias) - batch norm - relu - fc: every kind of parameter.
Graph SmallNet() {
  Graph g("small");
  const int x = g.Input("input", {2, 5, 5});
  ConvParams c;
  c.out_channels = 3;
  c.kernel_h = c.kernel_w = 3;
  c.pad_h = c.pad_w = 1;
  c.bias = true;
  const int conv = g.Conv("conv", x, c);
  const int bn = g.BatchNorm("bn", conv);
  const int relu = g.Relu("relu", bn);
  const int fc = g.FullyConnected("fc", relu, {.units = 4});
  g.SoftmaxCrossEntropy("loss", fc, {.num_classes = 4});
  EXPECT_TRUE(g.Finish().ok());
  return g;
}

std::vector<std::vector<float>> AllGrads(Runner& r) {
  std::vector<std::vector<float>> g;
  for (int p = 0; p < static_cast<int>(r.graph().params().size()); ++p) g.push_back(r.Grad(p));
  return g;
}

TEST(OneDnnTrainTest, AccumulateAddsToTheGradientBuffers) {
  Runner r(SmallNet(), 4);
  ASSERT_TRUE(r.ok());
  std::mt19937 rng(3);
  r.RandomParameters(rng);
  std::mt19937 batch_a(11), batch_b(12);

  r.RandomInput(batch_a, 4);
  r.ForwardLoss();
  r.Backward(false);
  const auto ga = AllGrads(r);
  r.RandomInput(batch_b, 4);
  r.ForwardLoss();
  r.Backward(false);
  const auto gb = AllGrads(r);

  batch_a.seed(11);
  r.RandomInput(batch_a, 4);
  r.ForwardLoss();
  r.Backward(false);
  batch_b.seed(12);
  r.RandomInput(batch_b, 4);
  r.ForwardLoss();
  r.Backward(true);
  const auto sum = AllGrads(r);

  double largest = 0;
  for (size_t p = 0; p < sum.size(); ++p) {
    for (size_t i = 0; i < sum[p].size(); ++i) {
      EXPECT_NEAR(sum[p][i], ga[p][i] + gb[p][i], 1e-5 + 1e-5 * std::abs(sum[p][i]))
          << r.graph().params()[p].name << "[" << i << "]";
      largest = std::max(largest, static_cast<double>(std::abs(gb[p][i])));
    }
  }
  EXPECT_GT(largest, 1e-2);  // the second batch contributes something to see
}

TEST(OneDnnTrainTest, UpdateFollowsTorchSgdWithMomentumAndWeightDecay) {
  Runner r(SmallNet(), 2);
  ASSERT_TRUE(r.ok());
  const int p = 4;  // fc/weight: 4 x 75
  ASSERT_EQ(r.graph().params()[p].name, "fc/weight");
  std::vector<float> w(static_cast<size_t>(r.graph().params()[p].numel), 1.0f);
  w[1] = -2.0f;
  r.SetParam(p, w);
  const GradientView view = r.backend().Gradient(p);
  ASSERT_NE(view.data, nullptr);
  ASSERT_EQ(view.numel, static_cast<int64_t>(w.size()));
  auto* g = static_cast<float*>(view.data);
  const SgdConfig sgd{.learning_rate = 0.1, .momentum = 0.9, .weight_decay = 0.01};

  // Step 1, grad_scale 0.5 (an average over two ranks): g' = 0.5 * 0.5 + 0.01 * 1 = 0.26,
  // v = 0.26, w = 1 - 0.1 * 0.26 = 0.974. Element 1: g = -1, w = -2: g' = -0.5 - 0.02 = -0.52,
  // v = -0.52, w = -2 + 0.052 = -1.948.
  std::fill_n(g, view.numel, 0.5f);
  g[1] = -1.0f;
  ASSERT_TRUE(r.backend().Update(p, sgd, 0.5).ok());
  auto after = r.Param(p);
  EXPECT_NEAR(after[0], 0.974, 1e-6);
  EXPECT_NEAR(after[1], -1.948, 1e-6);

  // Step 2, same gradients: g' = 0.25 + 0.00974 = 0.25974, v = 0.9 * 0.26 + 0.25974 = 0.49374,
  // w = 0.974 - 0.049374 = 0.924626. Element 1: g' = -0.5 - 0.01948 = -0.51948,
  // v = 0.9 * -0.52 - 0.51948 = -0.98748, w = -1.948 + 0.098748 = -1.849252.
  ASSERT_TRUE(r.backend().Update(p, sgd, 0.5).ok());
  after = r.Param(p);
  EXPECT_NEAR(after[0], 0.924626, 1e-6);
  EXPECT_NEAR(after[1], -1.849252, 1e-6);
  // Other parameters are untouched.
  EXPECT_EQ(r.Param(0), std::vector<float>(r.Param(0).size(), 0.0f));
}

// Per-class mean images plus noise: learnable, with chance-level loss ln(classes). Each class
// mean is a per-channel level plus a pattern, so that networks that pool globally early (the
// auxiliary head of tiny-inception) see the class as well as those that look at every pixel.
struct Task {
  std::vector<float> images;
  std::vector<int32_t> labels;
};
Task MakeTask(const Graph& g, int64_t batch, int64_t classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto size = static_cast<size_t>(g.input_shape().size());
  const auto plane = static_cast<size_t>(g.input_shape().h * g.input_shape().w);
  std::vector<std::vector<float>> means(static_cast<size_t>(classes), std::vector<float>(size));
  for (auto& m : means) {
    for (size_t c = 0; c < size / plane; ++c) {
      const float level = normal(rng);
      for (size_t i = 0; i < plane; ++i) m[c * plane + i] = level + normal(rng);
    }
  }
  Task t;
  for (int64_t n = 0; n < batch; ++n) {
    const auto label = static_cast<int32_t>(n % classes);
    t.labels.push_back(label);
    for (size_t i = 0; i < size; ++i) {
      t.images.push_back(means[static_cast<size_t>(label)][i] + 0.5f * normal(rng));
    }
  }
  return t;
}

// Trains `steps` SGD steps on fresh batches of the task; returns the losses.
std::vector<double> Train(Runner& r, int64_t classes, int steps, double lr) {
  std::vector<double> losses;
  const SgdConfig sgd{.learning_rate = lr, .momentum = 0.9, .weight_decay = 1e-4};
  for (int s = 0; s < steps; ++s) {
    // The class means stay (seed 5); only the noise draws differ between batches.
    Task t = MakeTask(r.graph(), r.batch(), classes, 5);
    std::mt19937 noise(static_cast<uint32_t>(100 + s));
    std::normal_distribution<float> normal(0.0f, 0.3f);
    for (float& x : t.images) x += normal(noise);
    r.SetInput(t.images, t.labels);
    losses.push_back(r.ForwardLoss());
    r.Backward();
    r.Update(sgd);
  }
  return losses;
}

struct LearnCase {
  const char* model;
  double dropout;  // -1: the model's default
  double learning_rate;
};

void PrintTo(const LearnCase& c, std::ostream* os) {
  *os << c.model << " dropout " << c.dropout << " lr " << c.learning_rate;
}

class OneDnnLearnTest : public ::testing::TestWithParam<LearnCase> {};

TEST_P(OneDnnLearnTest, LossFallsWellBelowChance) {
  constexpr int64_t kClasses = 6;
  const LearnCase& c = GetParam();
  Runner r(Zoo(c.model, kClasses, 8, c.dropout), 24);
  ASSERT_TRUE(r.ok());
  InitFromZoo(r, 1);
  const auto losses = Train(r, kClasses, 80, c.learning_rate);
  // Chance: every loss layer at ln(classes), times its weight.
  double weights = 0;
  for (int l : r.graph().loss_layers()) {
    weights += std::get<LossParams>(r.graph().layer(l).params).weight;
  }
  const double chance = weights * std::log(static_cast<double>(kClasses));
  EXPECT_GT(losses.front(), 0.5 * chance);
  double tail = 0;
  for (size_t i = losses.size() - 5; i < losses.size(); ++i) tail += losses[i] / 5;
  EXPECT_LT(tail, 0.2 * chance) << "first loss " << losses.front();
}

INSTANTIATE_TEST_SUITE_P(Zoo, OneDnnLearnTest,
                         ::testing::Values(LearnCase{"tiny-mlp", -1, 0.02},
                                           LearnCase{"tiny-cnn", -1, 0.02},
                                           LearnCase{"tiny-resnet", -1, 0.02},
                                           LearnCase{"tiny-inception", 0.1, 0.05}),
                         [](const auto& info) {
                           std::string name = info.param.model;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

std::vector<double> RunWithSeed(uint64_t seed) {
  Runner r(Zoo("tiny-inception", 5), 6, seed);
  EXPECT_TRUE(r.ok());
  if (!r.ok()) return {};
  InitFromZoo(r, 1);
  return Train(r, 5, 4, 0.05);
}

TEST(OneDnnTrainTest, SameSeedSameLossesOtherSeedOtherDropoutMasks) {
  const auto a = RunWithSeed(7);
  const auto b = RunWithSeed(7);
  const auto c = RunWithSeed(8);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a, b);
  // The first forward already draws dropout masks from the seed.
  EXPECT_NE(a[0], c[0]);
}

TEST(OneDnnTrainTest, ZooTinyNetworksPassTheGradientCheck) {
  for (const char* name : {"tiny-cnn", "tiny-resnet", "tiny-inception"}) {
    SCOPED_TRACE(name);
    const double dropout = std::string(name) == "tiny-inception" ? 0.25 : -1;
    Runner r(Zoo(name, 4, 6, dropout), 3);
    ASSERT_TRUE(r.ok());
    std::mt19937 rng(9);
    r.RandomParameters(rng);
    r.RandomInput(rng, 4);
    ExpectGradientsMatchDifferences(r, 6, 2e-3, 8e-2);
  }
}

// The full-size architectures at small images, checked as a whole along their gradient: moving
// the parameters to w +- d with d = eta * gradient changes the loss by 2 * gradient . d to first
// order. d is rounded to what float32 parameters can hold before the prediction is formed, and
// eta lowers the loss by about 1%: smaller steps drown in that rounding (most weights would not
// move at all), larger ones in curvature.
TEST(OneDnnTrainTest, ZooModelsChangeTheirLossAsTheirGradientPredicts) {
  struct Case {
    const char* model;
    int64_t image;
    double dropout;
  };
  for (const Case& c : {Case{"resnet50", 32, -1}, Case{"inception3", 75, 0.0}}) {
    SCOPED_TRACE(c.model);
    zoo::ModelConfig config;
    config.image_size = c.image;
    config.num_classes = 10;
    config.aux_logits = false;
    config.dropout = c.dropout;
    auto g = zoo::BuildModel(c.model, config);
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    Runner r(std::move(g).value(), 4);
    ASSERT_TRUE(r.ok());
    InitFromZoo(r, 1);
    std::mt19937 rng(2);
    r.RandomInput(rng, 10);
    const double loss = r.ForwardLoss();
    r.Backward();
    const auto grads = AllGrads(r);
    std::vector<std::vector<float>> w0;
    double norm2 = 0;
    for (size_t p = 0; p < grads.size(); ++p) {
      w0.push_back(r.Param(static_cast<int>(p)));
      for (float x : grads[p]) norm2 += static_cast<double>(x) * x;
    }
    ASSERT_GT(norm2, 0.0);
    const double eta = 0.01 * loss / norm2;
    double moved[2] = {0, 0};
    double predicted = 0;
    for (int side = 0; side < 2; ++side) {
      const double sign = side == 0 ? 1.0 : -1.0;
      for (size_t p = 0; p < grads.size(); ++p) {
        std::vector<float> w = w0[p];
        for (size_t i = 0; i < w.size(); ++i) {
          w[i] = static_cast<float>(w[i] + sign * eta * grads[p][i]);
          predicted += sign * grads[p][i] * (static_cast<double>(w[i]) - w0[p][i]);
        }
        r.SetParam(static_cast<int>(p), w);
      }
      moved[side] = r.ForwardLoss();
    }
    EXPECT_NEAR((moved[0] - moved[1]) / predicted, 1.0, 0.1)
        << "loss " << loss << ": " << moved[0] << " at +d, " << moved[1] << " at -d, predicted "
        << "difference " << predicted;
  }
}

TEST(OneDnnTrainTest, KernelTimeIsCountedAndTaken) {
  Runner r(SmallNet(), 4);
  ASSERT_TRUE(r.ok());
  std::mt19937 rng(1);
  r.RandomParameters(rng);
  r.RandomInput(rng, 4);
  r.backend().TakeKernelSeconds();
  r.ForwardLoss();
  r.Backward();
  EXPECT_GT(r.backend().TakeKernelSeconds(), 0.0);
  EXPECT_EQ(r.backend().TakeKernelSeconds(), 0.0);
}

TEST(OneDnnTrainTest, RefusesBadCalls) {
  auto made = CreateComputeBackend("onednn");
  ASSERT_TRUE(made.ok());
  ComputeBackend& b = **made;
  EXPECT_STREQ(b.name(), "onednn");
  EXPECT_EQ(b.Forward(0).code(), StatusCode::kFailedPrecondition);
  const Graph g = SmallNet();
  BackendConfig config;
  config.batch = 2;
  config.precision = Precision::kFp16;
  EXPECT_EQ(b.Prepare(g, config).code(), StatusCode::kInvalidArgument);
  config.precision = Precision::kFp32;
  config.batch = 0;
  EXPECT_EQ(b.Prepare(g, config).code(), StatusCode::kInvalidArgument);
  config.batch = 2;
  ASSERT_TRUE(b.Prepare(g, config).ok());
  EXPECT_EQ(b.Prepare(g, config).code(), StatusCode::kFailedPrecondition);

  EXPECT_EQ(b.Forward(1).code(), StatusCode::kFailedPrecondition);  // no input yet
  std::vector<float> images(2 * 50, 0.0f);
  const Status bad_label = b.SetInput(images, std::vector<int32_t>{0, 4});
  EXPECT_EQ(bad_label.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_label.message().find("label 4"), std::string::npos) << bad_label.message();
  EXPECT_EQ(b.SetInput(std::vector<float>(99), std::vector<int32_t>{0, 1}).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(b.SetInput(images, std::vector<int32_t>{0, 3}).ok());
  EXPECT_EQ(b.Forward(99).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Backward(-1, false).code(), StatusCode::kInvalidArgument);
  std::vector<float> wrong(3);
  EXPECT_EQ(b.SetParameter(0, wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.GetParameter(17, wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Update(17, SgdConfig{}, 1.0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(b.Gradient(17).data, nullptr);
}

TEST(OneDnnTrainTest, RefusesABatchLargerThanMemoryNamingWhatItNeeds) {
  auto made = CreateComputeBackend("onednn");
  ASSERT_TRUE(made.ok());
  const Graph g = Zoo("resnet101", 1000, 224);
  BackendConfig config;
  config.batch = 100000;  // about 10 TB of activations
  const Status s = (*made)->Prepare(g, config);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("batch 100000"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("GiB"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("at most"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kolo::models::compute::testing

#else
TEST(OneDnnTrainTest, Unavailable) { GTEST_SKIP() << "this build has no oneDNN"; }
#endif
