// Dropout in training mode, as host loops (memory-bound and small next to the convolutions).
// The mask is a pure function of (seed, layer, number of backward passes this layer has run), so
// runs with one seed repeat exactly, forwards without a backward (finite differences) reuse one
// mask, and each backward pass moves the next forward to a fresh mask.
#include <chrono>
#include <cstdint>
#include <variant>
#include <vector>

#include "engine/common/random.h"
#include "models/compute/onednn/kernel.h"

namespace kolo::models::compute::onednn {
namespace {

uint64_t Mix(uint64_t x) { return SplitMix64(x); }

class DropoutKernel final : public LayerKernel {
 public:
  DropoutKernel(Net& net, int l)
      : net_(net),
        l_(l),
        in_(net.layer(l).inputs[0]),
        rate_(std::get<DropoutParams>(net.layer(l).params).rate),
        mask_(static_cast<size_t>(net.batch() * net.layer(l).out.size())) {}

  Status Forward() override {
    const auto start = std::chrono::steady_clock::now();
    if (!mask_drawn_) DrawMask();
    const auto* x = static_cast<const float*>(net_.value(in_).get_data_handle());
    auto* y = static_cast<float*>(net_.value(l_).get_data_handle());
    for (size_t i = 0; i < mask_.size(); ++i) y[i] = x[i] * mask_[i];
    net_.AddKernelTime(start);
    return Status::OK();
  }

  Status Backward(bool /*accumulate: no parameters*/) override {
    const auto start = std::chrono::steady_clock::now();
    if (net_.needs_grad(in_)) {
      const auto* dy = static_cast<const float*>(net_.diff(l_).get_data_handle());
      auto* dx = static_cast<float*>(net_.diff(in_).get_data_handle());
      if (net_.adds_to_input(l_, 0)) {
        for (size_t i = 0; i < mask_.size(); ++i) dx[i] += dy[i] * mask_[i];
      } else {
        for (size_t i = 0; i < mask_.size(); ++i) dx[i] = dy[i] * mask_[i];
      }
    }
    ++passes_;
    mask_drawn_ = false;
    net_.AddKernelTime(start);
    return Status::OK();
  }

 private:
  void DrawMask() {
    const uint64_t key = Mix(net_.seed() ^ Mix(static_cast<uint64_t>(l_) ^ Mix(passes_)));
    const float keep_scale = rate_ < 1.0 ? static_cast<float>(1.0 / (1.0 - rate_)) : 0.0f;
    // Keep an element when its uniform draw in [0, 1), in 2^-24 steps, is at least `rate`.
    const auto threshold = static_cast<uint64_t>(rate_ * 16777216.0);
    for (size_t i = 0; i < mask_.size(); ++i) {
      const uint64_t u = Mix(key + i) >> 40;
      mask_[i] = u >= threshold ? keep_scale : 0.0f;
    }
    mask_drawn_ = true;
  }

  Net& net_;
  const int l_;
  const int in_;
  const double rate_;
  std::vector<float> mask_;  // 0 or 1 / (1 - rate) per element
  uint64_t passes_ = 0;
  bool mask_drawn_ = false;
};

}  // namespace

std::unique_ptr<LayerKernel> MakeDropoutKernel(Net& net, int l) {
  return std::make_unique<DropoutKernel>(net, l);
}

}  // namespace kolo::models::compute::onednn
