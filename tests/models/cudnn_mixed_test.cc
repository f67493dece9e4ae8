// kolo-test-needs: CUDNN
// Mixed precision (fp16, bf16) in the cudnn backend against the same backend in strict fp32, with
// the same parameters and input batch, and fp16's dynamic loss scaling.
//
// Errors are relative L2 errors of each gradient tensor and of all gradients together (tensors
// whose exact gradient is tiny are judged against 1e-3 of the whole gradient's norm), and the
// loss's relative error. Half storage rounds every activation and activation gradient to 11
// significant bits (fp16, unit roundoff 2^-11 = 4.9e-4) or 8 (bf16, 2^-8 = 3.9e-3), and those
// roundings compound through the layers, so tiny nets must agree within 1e-2 overall and 3e-2 per
// tensor (fp16) and 6e-2 and 0.15 (bf16); the loss within 5e-3 and 3e-2. As in
// cudnn_backend_test.cc, a deep model at initialisation amplifies rounding far more: its
// gradients are also allowed 4x the error that perturbing fp32's input by a few half units
// (2e-3 for fp16, 1.6e-2 for bf16) causes by itself, per tensor and overall.
//
// fp16 starts at GradScaler's initial scale of 2^16 on the deep model and at 2^10 on the tiny nets:
// at batch 4 without batch norm their unscaled weight gradients reach O(1), which 2^16 would push
// past fp16's 65504 on the first step. Where a pass overflows anyway (ResNet-50's conv1 at
// initialisation did at 2^16 on an H100: 6,530 inf/NaN values), the scale is halved and the pass
// run again, as GradScaler's backoff does over the steps it skips, down to the first scale whose
// gradients are all finite; that pass is compared.
//
// The optimizer is checked against torch.optim.SGD's update computed here from the gradients the
// backend reports; fp16's skipping and scale schedule against the LossScaleOptions given. Every
// test skips, saying why, without a CUDA device (and bf16 ones without compute capability 8.0).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "models/compute/backend.h"
#include "models/compute/cudnn/cudnn_backend.h"
#include "models/graph/graph.h"
#include "models/graph/init.h"
#include "models/zoo/zoo.h"
#include "tests/models/gradient_agreement.h"

namespace kolo::models::compute {
namespace {

using ::testing::HasSubstr;

#define SKIP_WITHOUT(precision)                                                                \
  do {                                                                                         \
    if (cudnn::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device in this process";       \
    if ((precision) == Precision::kBf16) {                                                     \
      auto cc = cudnn::ComputeCapability(0);                                                   \
      ASSERT_TRUE(cc.ok()) << cc.status().ToString();                                          \
      if (*cc < 80) GTEST_SKIP() << "bf16 needs compute capability 8.0; device 0 has " << *cc; \
    }                                                                                          \
  } while (0)

Graph Model(const std::string& name, int64_t image_size = 0, int64_t classes = 10) {
  zoo::ModelConfig mc;
  mc.image_size = image_size;
  mc.num_classes = classes;
  auto g = zoo::BuildModel(name, mc);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? std::move(g).value() : Graph("failed");
}

// A prepared backend with InitialParameters(g, 5) and a fixed batch (input optionally perturbed
// by the relative amount `noise`).
StatusOr<std::unique_ptr<ComputeBackend>> Make(const Graph& g, Precision precision, int64_t batch,
                                               const cudnn::LossScaleOptions& ls = {},
                                               double noise = 0) {
  std::unique_ptr<ComputeBackend> b = cudnn::CreateCudnnBackend(ls);
  BackendConfig config;
  config.batch = batch;
  config.precision = precision;
  config.seed = 5;
  KOLO_RETURN_IF_ERROR(b->Prepare(g, config));
  const auto init = InitialParameters(g, 5);
  for (size_t p = 0; p < init.size(); ++p) {
    KOLO_RETURN_IF_ERROR(b->SetParameter(static_cast<int>(p), init[p]));
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<float> images(static_cast<size_t>(batch * g.input_shape().size()));
  for (float& v : images) v = static_cast<float>(u(rng));
  for (float& v : images) v = static_cast<float>(v * (1.0 + noise * u(rng)));
  int64_t classes = 1 << 30;
  for (int l : g.loss_layers()) {
    const auto& p = std::get<LossParams>(g.layer(l).params);
    if (!p.sum_of_inputs) classes = std::min(classes, p.num_classes);
  }
  std::vector<int32_t> labels;
  for (int64_t i = 0; i < batch; ++i) labels.push_back(static_cast<int32_t>((i * 7 + 3) % classes));
  KOLO_RETURN_IF_ERROR(b->SetInput(images, labels));
  return b;
}

// Forward, loss and backward of every layer; returns the loss.
StatusOr<double> Pass(ComputeBackend& b, const Graph& g, bool accumulate = false) {
  const int n = static_cast<int>(g.layers().size());
  for (int l = 0; l < n; ++l) KOLO_RETURN_IF_ERROR(b.Forward(l));
  KOLO_ASSIGN_OR_RETURN(double loss, b.Loss());
  for (int l = n - 1; l >= 0; --l) KOLO_RETURN_IF_ERROR(b.Backward(l, accumulate));
  return loss;
}

StatusOr<Grads> Gradients(ComputeBackend& b, const Graph& g) {
  KOLO_RETURN_IF_ERROR(b.Synchronize());
  Grads out;
  for (size_t p = 0; p < g.params().size(); ++p) {
    out.emplace_back(static_cast<size_t>(g.params()[p].numel));
    KOLO_RETURN_IF_ERROR(b.GetGradient(static_cast<int>(p), out.back()));
  }
  return out;
}

StatusOr<Grads> Parameters(ComputeBackend& b, const Graph& g) {
  Grads out;
  for (size_t p = 0; p < g.params().size(); ++p) {
    out.emplace_back(static_cast<size_t>(g.params()[p].numel));
    KOLO_RETURN_IF_ERROR(b.GetParameter(static_cast<int>(p), out.back()));
  }
  return out;
}

// Update of every parameter in backprop order, as the trainer does.
Status UpdateAll(ComputeBackend& b, const Graph& g, const SgdConfig& sgd, double grad_scale) {
  for (int p : g.BackpropOrder()) KOLO_RETURN_IF_ERROR(b.Update(p, sgd, grad_scale));
  return b.Synchronize();
}

// The tiny nets' fp16 loss scale (see the file comment).
cudnn::LossScaleOptions TinyScale() {
  cudnn::LossScaleOptions o;
  o.init_scale = 1024;
  return o;
}
constexpr Tolerance kTinyFp16{5e-3, 1e-2, 3e-2, 2e-3};
constexpr Tolerance kTinyBf16{3e-2, 6e-2, 0.15, 1.6e-2};
constexpr Tolerance kDeepFp16{1e-2, 5e-2, 0.2, 2e-3};
constexpr Tolerance kDeepBf16{5e-2, 0.2, 0.5, 1.6e-2};

void ExpectAgreement(const Graph& g, Precision precision, int64_t batch, const Tolerance& tol,
                     const cudnn::LossScaleOptions& ls) {
  auto ref = Make(g, Precision::kFp32, batch);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  auto want_loss = Pass(**ref, g);
  ASSERT_TRUE(want_loss.ok()) << want_loss.status().ToString();
  auto want = Gradients(**ref, g);
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto noisy = Make(g, Precision::kFp32, batch, {}, tol.input_noise);
  ASSERT_TRUE(noisy.ok()) << noisy.status().ToString();
  ASSERT_TRUE(Pass(**noisy, g).ok());
  auto perturbed = Gradients(**noisy, g);
  ASSERT_TRUE(perturbed.ok());
  // fp16: GradScaler's backoff, one halving per overflowing pass (at most 16: 2^16 down to 1).
  cudnn::LossScaleOptions scale = ls;
  StatusOr<double> got_loss = 0.0;
  StatusOr<Grads> got = Grads{};
  for (int attempt = 0;; ++attempt) {
    auto mixed = Make(g, precision, batch, scale);
    ASSERT_TRUE(mixed.ok()) << mixed.status().ToString();
    got_loss = Pass(**mixed, g);
    ASSERT_TRUE(got_loss.ok()) << got_loss.status().ToString();
    got = Gradients(**mixed, g);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    size_t first_bad = got->size();
    int64_t bad = 0;
    for (size_t p = 0; p < got->size(); ++p) {
      const auto& t = (*got)[p];
      const auto n = std::count_if(t.begin(), t.end(), [](float v) { return !std::isfinite(v); });
      if (n > 0 && first_bad == got->size()) first_bad = p;
      bad += n;
    }
    if (bad == 0) break;
    const bool backoff = precision == Precision::kFp16 && attempt < 16 && scale.init_scale > 1;
    ASSERT_TRUE(backoff) << g.name() << " " << g.params()[first_bad].name << ": " << bad
                         << " gradient values are inf/NaN in " << PrecisionName(precision)
                         << " (fp16 loss scale " << scale.init_scale << ")";
    std::printf("[ info ] %s fp16: %lld gradient values overflow at loss scale %g; halving it\n",
                g.name().c_str(), static_cast<long long>(bad),
                static_cast<double>(scale.init_scale));
    scale.init_scale /= 2;
  }

  ASSERT_TRUE(std::isfinite(*want_loss));
  double all = 0;
  for (const auto& w : *want) all += Norm(w);
  ASSERT_GT(all, 0) << g.name() << ": all reference gradients are zero; the test cannot fail";
  EXPECT_NEAR(*got_loss, *want_loss, tol.loss * std::max(1.0, std::fabs(*want_loss)))
      << g.name() << " loss (" << PrecisionName(precision) << ")";
  const GradErrors sensitivity = CompareGradients(*perturbed, *want);
  const GradErrors e = CompareGradients(*got, *want);
  for (size_t p = 0; p < e.per_tensor.size(); ++p) {
    EXPECT_TRUE(std::isfinite(e.per_tensor[p])) << g.params()[p].name;
  }
  const WorstTensor worst = ExpectGradientsAgree(g, e, sensitivity, tol, PrecisionName(precision));
  std::printf(
      "[ info ] %s %s batch %lld: loss %.6f vs fp32 %.6f; gradient error %.2e overall (fp32 "
      "input perturbed by %.0e alone: %.2e), worst tensor %.2e (%s)\n",
      g.name().c_str(), PrecisionName(precision), static_cast<long long>(batch), *got_loss,
      *want_loss, e.total, tol.input_noise, sensitivity.total, worst.error, worst.name.c_str());
}

struct ModelCase {
  std::string model;
  int64_t image_size;
  int64_t batch;
  int64_t classes;
};

class CudnnMixedModelTest : public ::testing::TestWithParam<std::tuple<ModelCase, Precision>> {};

TEST_P(CudnnMixedModelTest, AgreesWithFp32) {
  const auto& [c, precision] = GetParam();
  SKIP_WITHOUT(precision);
  const Graph g = Model(c.model, c.image_size, c.classes);
  const bool tiny = c.model.rfind("tiny", 0) == 0;
  const bool fp16 = precision == Precision::kFp16;
  ExpectAgreement(g, precision, c.batch,
                  tiny ? (fp16 ? kTinyFp16 : kTinyBf16) : (fp16 ? kDeepFp16 : kDeepBf16),
                  tiny ? TinyScale() : cudnn::LossScaleOptions{});
}

INSTANTIATE_TEST_SUITE_P(Models, CudnnMixedModelTest,
                         ::testing::Combine(::testing::Values(ModelCase{"tiny-mlp", 8, 4, 10},
                                                              ModelCase{"tiny-cnn", 8, 4, 10},
                                                              ModelCase{"tiny-resnet", 8, 4, 10},
                                                              ModelCase{"tiny-inception", 8, 4, 10},
                                                              ModelCase{"resnet50", 112, 8, 100}),
                                            ::testing::Values(Precision::kFp16, Precision::kBf16)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param).model + "_" +
                                           PrecisionName(std::get<1>(info.param));
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

class CudnnMixedTest : public ::testing::TestWithParam<Precision> {};

// Two passes with accumulate on the second hold twice one pass's gradients.
TEST_P(CudnnMixedTest, AccumulateAddsSecondPass) {
  SKIP_WITHOUT(GetParam());
  const Graph g = Model("tiny-resnet");
  auto b = Make(g, GetParam(), 4, TinyScale());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(Pass(**b, g).ok());
  auto once = Gradients(**b, g);
  ASSERT_TRUE(once.ok());
  ASSERT_TRUE(Pass(**b, g, /*accumulate=*/true).ok());
  auto twice = Gradients(**b, g);
  ASSERT_TRUE(twice.ok());
  Grads doubled = *once;
  for (auto& t : doubled) {
    for (float& v : t) v *= 2;
  }
  const GradErrors e = CompareGradients(*twice, doubled);
  // Convolution algorithms may sum in a different order from one pass to the next, and the weight
  // gradients pass through the half type before they are accumulated: the bound is two units in
  // its last place (fp16 2 x 2^-11, bf16 2 x 2^-8). An H200 measured 1.9e-3 in bf16, once.
  const double bound = GetParam() == Precision::kFp16 ? 2.0 / 2048 : 2.0 / 256;
  for (size_t p = 0; p < e.per_tensor.size(); ++p) {
    EXPECT_LE(e.per_tensor[p], bound) << g.params()[p].name;
  }
}

// One SGD step from the gradients the backend reports, against torch.optim.SGD's formula (momentum
// starts at zero: v = g * s + wd * w; w -= lr * v), and the half working copy follows: a second
// forward sees the new weights.
TEST_P(CudnnMixedTest, SgdStepMatchesHandComputed) {
  SKIP_WITHOUT(GetParam());
  const Graph g = Model("tiny-cnn");
  auto b = Make(g, GetParam(), 4, TinyScale());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto loss0 = Pass(**b, g);
  ASSERT_TRUE(loss0.ok());
  auto grads = Gradients(**b, g);
  ASSERT_TRUE(grads.ok());
  auto before = Parameters(**b, g);
  ASSERT_TRUE(before.ok());
  SgdConfig sgd;
  sgd.learning_rate = 0.05;
  sgd.momentum = 0.9;
  sgd.weight_decay = 1e-3;
  const double scale = 0.5;
  ASSERT_TRUE(UpdateAll(**b, g, sgd, scale).ok());
  auto after = Parameters(**b, g);
  ASSERT_TRUE(after.ok());
  for (size_t p = 0; p < before->size(); ++p) {
    ASSERT_GT(Norm((*grads)[p]), 0) << g.params()[p].name;
    for (size_t i = 0; i < (*before)[p].size(); ++i) {
      const double w = (*before)[p][i];
      const double want = w - sgd.learning_rate * ((*grads)[p][i] * scale + sgd.weight_decay * w);
      ASSERT_NEAR((*after)[p][i], want, 1e-5 * (1 + std::fabs(want)))
          << g.params()[p].name << "[" << i << "]";
    }
  }
  auto state = cudnn::ReadLossScale(**b);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->skipped_steps, 0);
  // The forward pass reads the refreshed working copies: the loss moves.
  auto loss1 = Pass(**b, g);
  ASSERT_TRUE(loss1.ok());
  EXPECT_NE(*loss1, *loss0);
}

// A tiny net learns a fixed batch under mixed precision about as well as under fp32.
TEST_P(CudnnMixedTest, TinyNetLearnsLikeFp32) {
  SKIP_WITHOUT(GetParam());
  const Graph g = Model("tiny-resnet");
  SgdConfig sgd;
  sgd.learning_rate = 0.05;
  constexpr int kSteps = 40;
  std::vector<double> first, last;
  for (Precision p : {Precision::kFp32, GetParam()}) {
    auto b = Make(g, p, 8, TinyScale());
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    double loss = 0;
    for (int step = 0; step < kSteps; ++step) {
      auto l = Pass(**b, g);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      ASSERT_TRUE(std::isfinite(*l)) << PrecisionName(p) << " step " << step;
      if (step == 0) first.push_back(*l);
      loss = *l;
      ASSERT_TRUE(UpdateAll(**b, g, sgd, 1.0).ok());
    }
    last.push_back(loss);
  }
  ASSERT_LT(last[0], 0.5 * first[0]) << "fp32 itself does not learn; the test cannot tell";
  EXPECT_LT(last[1], 0.5 * first[1]) << PrecisionName(GetParam());
  EXPECT_NEAR(last[1], last[0], 0.1 * first[0]) << PrecisionName(GetParam()) << " vs fp32";
}

TEST_P(CudnnMixedTest, GradientViewsStayFloat32) {
  SKIP_WITHOUT(GetParam());
  const Graph g = Model("tiny-inception");
  auto b = Make(g, GetParam(), 2);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  for (size_t p = 0; p < g.params().size(); ++p) {
    const GradientView v = (*b)->Gradient(static_cast<int>(p));
    EXPECT_NE(v.data, nullptr);
    EXPECT_EQ(v.dtype, DataType::kFloat32) << g.params()[p].name;
    EXPECT_EQ(v.numel, g.params()[p].numel);
    EXPECT_NE(v.ready_event, nullptr);
  }
  auto state = cudnn::ReadLossScale(**b);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->scale, GetParam() == Precision::kFp16 ? 65536.0f : 1.0f);
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudnnMixedTest,
                         ::testing::Values(Precision::kFp16, Precision::kBf16),
                         [](const auto& info) { return std::string(PrecisionName(info.param)); });

// A loss scale of 2^40 overflows fp16 (largest finite 65504) in the loss gradient itself: the step
// is skipped (no weight or momentum changes) and the scale halves; steps keep being skipped, one
// halving each, until the scaled gradients fit, and then the weights move.
TEST(CudnnFp16Test, OverflowSkipsTheStepAndBacksOff) {
  SKIP_WITHOUT(Precision::kFp16);
  const Graph g = Model("tiny-cnn");
  cudnn::LossScaleOptions ls;
  ls.init_scale = std::ldexp(1.0f, 40);
  auto b = Make(g, Precision::kFp16, 4, ls);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  auto init = Parameters(**b, g);
  ASSERT_TRUE(init.ok());
  SgdConfig sgd;
  ASSERT_TRUE(Pass(**b, g).ok());
  auto grads = Gradients(**b, g);
  ASSERT_TRUE(grads.ok());
  bool any_bad = false;
  for (const auto& t : *grads) {
    for (float v : t) any_bad |= !std::isfinite(v);
  }
  EXPECT_TRUE(any_bad) << "a scale of 2^40 should overflow fp16 gradients";
  ASSERT_TRUE(UpdateAll(**b, g, sgd, 1.0).ok());
  auto state = cudnn::ReadLossScale(**b);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->scale, std::ldexp(1.0f, 39));
  EXPECT_EQ(state->skipped_steps, 1);
  EXPECT_EQ(state->good_steps, 0);
  EXPECT_EQ(state->found_inf, 0);
  auto after = Parameters(**b, g);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, *init) << "a skipped step changes no parameter";

  int skipped = 1;
  bool moved = false;
  for (int step = 0; step < 40 && !moved; ++step) {
    ASSERT_TRUE(Pass(**b, g).ok());
    ASSERT_TRUE(UpdateAll(**b, g, sgd, 1.0).ok());
    auto s = cudnn::ReadLossScale(**b);
    ASSERT_TRUE(s.ok());
    auto p = Parameters(**b, g);
    ASSERT_TRUE(p.ok());
    moved = *p != *init;
    if (!moved) {
      ++skipped;
      EXPECT_EQ(s->scale, std::ldexp(1.0f, 40 - skipped));
    }
    EXPECT_EQ(s->skipped_steps, skipped);
  }
  EXPECT_TRUE(moved) << "the scale never came down far enough for a step to apply";
  EXPECT_GE(skipped, 20) << "2^" << 40 - skipped << " should still overflow fp16";
}

// With a growth interval of 3, the scale doubles on every third good step.
TEST(CudnnFp16Test, GoodStepsGrowTheScale) {
  SKIP_WITHOUT(Precision::kFp16);
  const Graph g = Model("tiny-mlp");
  cudnn::LossScaleOptions ls;
  ls.init_scale = 256;
  ls.growth_interval = 3;
  auto b = Make(g, Precision::kFp16, 4, ls);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  SgdConfig sgd;
  sgd.learning_rate = 0.01;
  const float want_scale[] = {256, 256, 512, 512, 512, 1024, 1024};
  const int want_good[] = {1, 2, 0, 1, 2, 0, 1};
  for (int step = 0; step < 7; ++step) {
    ASSERT_TRUE(Pass(**b, g).ok());
    ASSERT_TRUE(UpdateAll(**b, g, sgd, 1.0).ok());
    auto s = cudnn::ReadLossScale(**b);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->scale, want_scale[step]) << "after step " << step;
    EXPECT_EQ(s->good_steps, want_good[step]) << "after step " << step;
    EXPECT_EQ(s->skipped_steps, 0);
  }
}

// The gradients (unscaled) do not depend on the loss scale, up to fp16 rounding.
TEST(CudnnFp16Test, GradientsAreUnscaled) {
  SKIP_WITHOUT(Precision::kFp16);
  const Graph g = Model("tiny-resnet");
  Grads got[2];
  const float scales[] = {16.0f, 4096.0f};
  for (int i = 0; i < 2; ++i) {
    cudnn::LossScaleOptions ls;
    ls.init_scale = scales[i];
    auto b = Make(g, Precision::kFp16, 4, ls);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ASSERT_TRUE(Pass(**b, g).ok());
    auto grads = Gradients(**b, g);
    ASSERT_TRUE(grads.ok());
    got[i] = *grads;
  }
  const GradErrors e = CompareGradients(got[1], got[0]);
  EXPECT_LE(e.total, 2e-2) << "scales of 16 and 4096 should differ by rounding only";
}

TEST(CudnnFp16Test, RejectsMisuse) {
  SKIP_WITHOUT(Precision::kFp16);
  const Graph g = Model("tiny-mlp");
  auto b = Make(g, Precision::kFp16, 2);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_TRUE(Pass(**b, g).ok());
  SgdConfig sgd;
  ASSERT_TRUE((*b)->Update(0, sgd, 1.0).ok());
  Status twice = (*b)->Update(0, sgd, 1.0);
  EXPECT_EQ(twice.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.message(), HasSubstr(g.params()[0].name));
  SgdConfig other = sgd;
  other.learning_rate *= 2;
  Status differs = (*b)->Update(1, other, 1.0);
  EXPECT_EQ(differs.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(differs.message(), HasSubstr("learning rate"));

  cudnn::LossScaleOptions bad;
  bad.backoff_factor = 2;
  auto c = Make(g, Precision::kFp16, 2, bad);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("backoff_factor"));
}

// Without a GPU the mixed-precision backend still builds and fails cleanly.
TEST(CudnnFp16Test, NoDeviceIsAnError) {
  if (cudnn::CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  auto b = Make(Model("tiny-mlp"), Precision::kFp16, 2);
  ASSERT_FALSE(b.ok());
  EXPECT_THAT(b.status().message(), HasSubstr("sees no CUDA device"));
}

}  // namespace
}  // namespace kolo::models::compute
