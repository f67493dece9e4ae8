// Throughput of the oneDNN backend on the full-size zoo models: images/sec of forward, backward
// and SGD update at batch 16 in one process, and the share of that time spent inside kernels. A
// measurement, not a check: disabled by default, run with
//   kolo_onednn_throughput_test --gtest_also_run_disabled_tests [--gtest_filter=*resnet101*]
// It asserts only that the steps ran and the loss is finite.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "models/graph/init.h"
#include "models/zoo/zoo.h"
#include "tests/models/onednn_test_util.h"

#if KOLO_HAVE_ONEDNN

namespace kolo::models::compute::testing {
namespace {

constexpr int64_t kBatch = 16;
constexpr int kWarmup = 1;
constexpr int kSteps = 3;

class OneDnnThroughputTest : public ::testing::TestWithParam<const char*> {};

TEST_P(OneDnnThroughputTest, DISABLED_ImagesPerSecond) {
  auto graph = zoo::BuildModel(GetParam());
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  Runner r(std::move(graph).value(), kBatch);
  ASSERT_TRUE(r.ok());
  const auto values = InitialParameters(r.graph(), 1);
  for (size_t p = 0; p < values.size(); ++p) r.SetParam(static_cast<int>(p), values[p]);
  std::mt19937 rng(1);
  r.RandomInput(rng, 1000);
  const SgdConfig sgd;
  double seconds = 0, kernel = 0, loss = 0;
  for (int s = 0; s < kWarmup + kSteps; ++s) {
    r.backend().TakeKernelSeconds();
    const auto start = std::chrono::steady_clock::now();
    loss = r.ForwardLoss();
    r.Backward();
    r.Update(sgd);
    const double step =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double k = r.backend().TakeKernelSeconds();
    std::printf("%s step %d: %.3f s, kernels %.1f%%, loss %.4f\n", GetParam(), s, step,
                100 * k / step, loss);
    if (s >= kWarmup) {
      seconds += step;
      kernel += k;
    }
  }
  EXPECT_TRUE(std::isfinite(loss));
  std::printf("%s batch %lld: %.2f images/sec, %.1f%% of the step inside kernels\n", GetParam(),
              static_cast<long long>(kBatch), kBatch * kSteps / seconds, 100 * kernel / seconds);
}

INSTANTIATE_TEST_SUITE_P(Zoo, OneDnnThroughputTest,
                         ::testing::Values("resnet101", "inception3", "vgg16"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace kolo::models::compute::testing

#endif
