// Pieces the layer kernels share: views of parameter buffers, parameters in the layout a
// primitive wants, and the outputs of input and parameter gradients. All builders throw
// dnnl::error.
#pragma once

#include <cstddef>
#include <dnnl.hpp>
#include <string>

#include "engine/common/status.h"
#include "models/compute/onednn/net.h"

namespace kolo::models::compute::onednn {

// Parameter `id`'s value or gradient buffer seen through `md` (a plain desc of numel elements).
dnnl::memory ParamValue(Net& net, int id, const dnnl::memory::desc& md);
dnnl::memory ParamGrad(Net& net, int id, const dnnl::memory::desc& md);

// A parameter as a primitive reads it: the plain buffer itself when the primitive takes the plain
// layout, else a copy in the primitive's layout that Refresh() brings up to date.
class WeightsIn {
 public:
  WeightsIn() = default;
  WeightsIn(const Net& net, const dnnl::memory& user, const dnnl::memory::desc& wanted);
  const dnnl::memory& mem() const { return reordered_ ? internal_ : user_; }
  [[nodiscard]] Status Refresh(Net& net, const std::string& context) const;

 private:
  dnnl::memory user_;
  dnnl::memory internal_;
  dnnl::reorder reorder_;
  Args args_;
  bool reordered_ = false;
};

// The gradient of parameter `id` as a primitive produces it (`natural`), delivered to the plain
// gradient buffer seen through `user_md`. Staging lies at *offset bytes into the parameter scratch
// (advanced past it) so that a layer's parameters can be staged together.
GradOutput ParamGradOutput(Net& net, int id, const dnnl::memory::desc& user_md,
                           const dnnl::memory::desc& natural, size_t* offset);

// The weight gradient (layer.param_ids[0]) and, with `bias`, the bias gradient (param_ids[1]) of a
// conv or fully connected layer's backward-weights primitive, staged together, with the
// primitive's arguments for writing them and for adding to them.
class WeightGradients {
 public:
  WeightGradients() = default;
  WeightGradients(Net& net, const Layer& layer, bool bias, const dnnl::memory::desc& user_w_md,
                  const dnnl::memory::desc& diff_w_md, const dnnl::memory::desc& user_bias_md,
                  const dnnl::memory::desc& diff_bias_md, const dnnl::memory& src,
                  const dnnl::memory& diff_dst);
  // Runs `backward_weights` and delivers the gradients, added to the buffers when `accumulate`.
  [[nodiscard]] Status Run(Net& net, const std::string& context,
                           const dnnl::primitive& backward_weights, bool accumulate) const;

 private:
  bool bias_ = false;
  GradOutput weight_;
  GradOutput bias_grad_;
  Args args_[2];  // [accumulate]
};

// The gradient layer `l` computes (`natural`) for its input `slot`, delivered to that input's
// gradient buffer seen through `target_md` (written or added as the Net says), or dropped when the
// input needs none.
GradOutput InputGradOutput(Net& net, int l, int slot, const dnnl::memory::desc& natural,
                           const dnnl::memory::desc& target_md);

// `m`'s buffer seen through `md` (same bytes, another shape).
dnnl::memory Reshaped(const Net& net, const dnnl::memory& m, const dnnl::memory::desc& md);

// "conv 'conv1'": a layer named for messages.
std::string LayerContext(const Layer& layer);

}  // namespace kolo::models::compute::onednn
