// Softmax cross-entropy as host loops: batch x classes values, too few for a primitive to pay.
// Forward keeps the softmax for backward, whose gradient is weight / batch * (softmax - one-hot).
// The plain-sum test loss (LossParams::sum_of_inputs) is weight * the sum of every input value;
// its gradient is weight everywhere.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <variant>
#include <vector>

#include "models/compute/onednn/kernel.h"

namespace kolo::models::compute::onednn {
namespace {

class LossKernel final : public LayerKernel {
 public:
  LossKernel(Net& net, int l)
      : net_(net),
        l_(l),
        in_(net.layer(l).inputs[0]),
        classes_(static_cast<size_t>(net.layer(l).in.size())),
        weight_(std::get<LossParams>(net.layer(l).params).weight),
        sum_of_inputs_(std::get<LossParams>(net.layer(l).params).sum_of_inputs),
        softmax_(sum_of_inputs_ ? 0 : static_cast<size_t>(net.batch()) * classes_) {}

  Status Forward() override {
    const auto start = std::chrono::steady_clock::now();
    const auto* x = static_cast<const float*>(net_.value(in_).get_data_handle());
    if (sum_of_inputs_) {
      const size_t n = static_cast<size_t>(net_.batch()) * classes_;
      double total = 0;
      for (size_t i = 0; i < n; ++i) total += x[i];
      net_.losses()[static_cast<size_t>(l_)] = weight_ * total;
      net_.AddKernelTime(start);
      return Status::OK();
    }
    const std::vector<int32_t>& labels = net_.labels();
    double total = 0;
    for (size_t n = 0; n < labels.size(); ++n) {
      const float* row = x + n * classes_;
      float* p = softmax_.data() + n * classes_;
      const float max = *std::max_element(row, row + classes_);
      double sum = 0;
      for (size_t k = 0; k < classes_; ++k) {
        p[k] = std::exp(row[k] - max);
        sum += p[k];
      }
      const auto inv = static_cast<float>(1.0 / sum);
      for (size_t k = 0; k < classes_; ++k) p[k] *= inv;
      const auto label = static_cast<size_t>(labels[n]);
      total += std::log(sum) - static_cast<double>(row[label] - max);
    }
    net_.losses()[static_cast<size_t>(l_)] = weight_ * total / static_cast<double>(labels.size());
    net_.AddKernelTime(start);
    return Status::OK();
  }

  Status Backward(bool /*accumulate: no parameters*/) override {
    if (!net_.needs_grad(in_)) return Status::OK();
    const auto start = std::chrono::steady_clock::now();
    auto* dx = static_cast<float*>(net_.diff(in_).get_data_handle());
    const std::vector<int32_t>& labels = net_.labels();
    const auto scale = static_cast<float>(weight_ / static_cast<double>(labels.size()));
    const bool add = net_.adds_to_input(l_, 0);
    if (sum_of_inputs_) {
      const size_t n = static_cast<size_t>(net_.batch()) * classes_;
      const auto w = static_cast<float>(weight_);
      for (size_t i = 0; i < n; ++i) dx[i] = add ? dx[i] + w : w;
      net_.AddKernelTime(start);
      return Status::OK();
    }
    for (size_t n = 0; n < labels.size(); ++n) {
      const float* p = softmax_.data() + n * classes_;
      float* d = dx + n * classes_;
      const auto label = static_cast<size_t>(labels[n]);
      for (size_t k = 0; k < classes_; ++k) {
        const float g = scale * (p[k] - (k == label ? 1.0f : 0.0f));
        d[k] = add ? d[k] + g : g;
      }
    }
    net_.AddKernelTime(start);
    return Status::OK();
  }

 private:
  Net& net_;
  const int l_;
  const int in_;
  const size_t classes_;  // values per image (the plain sum reads any shape)
  const double weight_;
  const bool sum_of_inputs_;
  std::vector<float> softmax_;
};

}  // namespace

std::unique_ptr<LayerKernel> MakeLossKernel(Net& net, int l) {
  return std::make_unique<LossKernel>(net, l);
}

}  // namespace kolo::models::compute::onednn
