// Helpers for the oneDNN backend's tests: a graph with its prepared backend, random parameters
// and inputs, whole forward and backward passes, and a central-difference gradient check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kolo/config.h"
#include "models/compute/backend.h"
#include "models/graph/graph.h"

namespace kolo::models::compute::testing {

class Runner {
 public:
  // Prepares the onednn backend for the finished `graph` at `batch` images.
  Runner(Graph graph, int64_t batch, uint64_t seed = 1)
      : graph_(std::make_unique<Graph>(std::move(graph))), batch_(batch) {
    auto made = CreateComputeBackend("onednn");
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return;
    backend_ = std::move(made).value();
    BackendConfig config;
    config.batch = batch;
    config.seed = seed;
    const Status s = backend_->Prepare(*graph_, config);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) backend_.reset();
  }

  bool ok() const { return backend_ != nullptr; }
  ComputeBackend& backend() { return *backend_; }
  const Graph& graph() const { return *graph_; }
  int64_t batch() const { return batch_; }

  // Parameters: weights uniform in [-a, a] with a = sqrt(3 / fan_in) (unit-variance outputs),
  // biases and shifts uniform in [-0.2, 0.2], batch-norm scales uniform in [0.5, 1.5].
  void RandomParameters(std::mt19937& rng) {
    for (size_t p = 0; p < graph_->params().size(); ++p) {
      const Parameter& param = graph_->params()[p];
      std::vector<float> v(static_cast<size_t>(param.numel));
      float lo = -0.2f, hi = 0.2f;
      if (param.init == Parameter::Init::kHeNormal) {
        const auto fan_in = static_cast<float>(param.numel / param.shape[0]);
        hi = std::sqrt(3.0f / fan_in);
        lo = -hi;
      } else if (param.init == Parameter::Init::kOnes) {
        lo = 0.5f;
        hi = 1.5f;
      }
      std::uniform_real_distribution<float> dist(lo, hi);
      for (float& x : v) x = dist(rng);
      SetParam(static_cast<int>(p), v);
    }
  }

  void SetParam(int p, const std::vector<float>& v) {
    const Status s = backend_->SetParameter(p, v);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }
  std::vector<float> Param(int p) {
    std::vector<float> v(static_cast<size_t>(graph_->params()[static_cast<size_t>(p)].numel));
    EXPECT_TRUE(backend_->GetParameter(p, v).ok());
    return v;
  }
  std::vector<float> Grad(int p) {
    std::vector<float> v(static_cast<size_t>(graph_->params()[static_cast<size_t>(p)].numel));
    EXPECT_TRUE(backend_->GetGradient(p, v).ok());
    return v;
  }

  // Normal images and uniform labels.
  void RandomInput(std::mt19937& rng, int64_t classes) {
    std::normal_distribution<float> pixel(0.0f, 1.0f);
    std::uniform_int_distribution<int32_t> label(0, static_cast<int32_t>(classes - 1));
    images_.resize(static_cast<size_t>(batch_ * graph_->input_shape().size()));
    labels_.resize(static_cast<size_t>(batch_));
    for (float& x : images_) x = pixel(rng);
    for (int32_t& y : labels_) y = label(rng);
    SetInput(images_, labels_);
  }
  void SetInput(const std::vector<float>& images, const std::vector<int32_t>& labels) {
    const Status s = backend_->SetInput(images, labels);
    ASSERT_TRUE(s.ok()) << s.ToString();
  }

  double ForwardLoss() {
    for (int l = 0; l < static_cast<int>(graph_->layers().size()); ++l) {
      const Status s = backend_->Forward(l);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    auto loss = backend_->Loss();
    EXPECT_TRUE(loss.ok()) << loss.status().ToString();
    return loss.ok() ? *loss : NAN;
  }
  void Backward(bool accumulate = false) {
    for (int l = static_cast<int>(graph_->layers().size()) - 1; l >= 0; --l) {
      const Status s = backend_->Backward(l, accumulate);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }
  // One SGD step of every parameter.
  void Update(const SgdConfig& sgd) {
    for (int p = 0; p < static_cast<int>(graph_->params().size()); ++p) {
      const Status s = backend_->Update(p, sgd, 1.0);
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }

 private:
  std::unique_ptr<Graph> graph_;
  int64_t batch_;
  std::unique_ptr<ComputeBackend> backend_;
  std::vector<float> images_;
  std::vector<int32_t> labels_;
};

// Compares the analytic gradient of every parameter with central differences of the loss, on at
// most `per_param` elements of each. An element next to a kink (ReLU, max pooling) is not judged:
// there the one-sided slopes over eps disagree, or the central differences over eps and eps / 2
// do. At most a fifth of the elements may be set aside. Forward passes without a backward reuse
// their dropout masks, so the differences all see the mask of the pass whose gradient is checked.
// `rtol` is the relative tolerance per element (deeper networks add float32 rounding and
// curvature).
inline void ExpectGradientsMatchDifferences(Runner& r, int per_param = 16, double eps = 2e-3,
                                            double rtol = 3e-2) {
  struct Probe {
    int param;
    size_t index;
    double numeric;
  };
  std::vector<Probe> probes;
  size_t unstable = 0;
  for (int p = 0; p < static_cast<int>(r.graph().params().size()); ++p) {
    std::vector<float> w = r.Param(p);
    const size_t n = w.size();
    const size_t count = std::min(n, static_cast<size_t>(per_param));
    for (size_t k = 0; k < count; ++k) {
      const size_t i = k * n / count;
      const float w0 = w[i];
      auto loss_at = [&](double delta) {
        w[i] = static_cast<float>(w0 + delta);
        r.SetParam(p, w);
        return r.ForwardLoss();
      };
      const double l0 = loss_at(0);
      const double up = loss_at(eps), down = loss_at(-eps);
      const double n1 = (up - down) / (2 * eps);
      const double n2 = (loss_at(eps / 2) - loss_at(-eps / 2)) / eps;
      const double right = (up - l0) / eps, left = (l0 - down) / eps;
      w[i] = w0;
      r.SetParam(p, w);
      const double tol = 5e-4 + 2e-2 * std::abs(n1);
      if (std::abs(n1 - n2) > tol || std::abs(right - left) > 4 * tol) {
        ++unstable;
        continue;
      }
      probes.push_back({p, i, n1});
    }
  }
  r.ForwardLoss();
  r.Backward();
  ASSERT_LE(unstable * 5, probes.size() + unstable) << "too many probes next to a kink";
  double diff2 = 0, ref2 = 0, max_ref = 0;
  std::vector<std::vector<float>> grads;
  for (int p = 0; p < static_cast<int>(r.graph().params().size()); ++p) grads.push_back(r.Grad(p));
  for (const Probe& pr : probes) {
    const double a = grads[static_cast<size_t>(pr.param)][pr.index];
    const std::string& name = r.graph().params()[static_cast<size_t>(pr.param)].name;
    EXPECT_NEAR(a, pr.numeric, 1e-3 + rtol * std::abs(pr.numeric))
        << name << "[" << pr.index << "]";
    diff2 += (a - pr.numeric) * (a - pr.numeric);
    ref2 += pr.numeric * pr.numeric;
    max_ref = std::max(max_ref, std::abs(pr.numeric));
  }
  // The check means something only if the gradients are well above the tolerances.
  EXPECT_GT(max_ref, 2e-2) << "gradients too small to check";
  EXPECT_LT(std::sqrt(diff2), 2e-2 * std::sqrt(ref2));
}

}  // namespace kolo::models::compute::testing
