#include "models/compute/onednn/kernel_util.h"

#include <fmt/format.h>

namespace kolo::models::compute::onednn {

using dnnl::memory;

memory Reshaped(const Net& net, const memory& m, const memory::desc& md) {
  return memory(md, net.engine(), m.get_data_handle());
}

memory ParamValue(Net& net, int id, const memory::desc& md) {
  return Reshaped(net, net.param(id).value, md);
}

memory ParamGrad(Net& net, int id, const memory::desc& md) {
  return Reshaped(net, net.param(id).grad, md);
}

WeightsIn::WeightsIn(const Net& net, const memory& user, const memory::desc& wanted)
    : user_(user), reordered_(wanted != user.get_desc()) {
  if (!reordered_) return;
  internal_ = memory(wanted, net.engine());
  reorder_ = dnnl::reorder(user_, internal_);
  args_ = {{DNNL_ARG_FROM, user_}, {DNNL_ARG_TO, internal_}};
}

Status WeightsIn::Refresh(Net& net, const std::string& context) const {
  if (!reordered_) return Status::OK();
  return net.Run(context, "weights reorder", reorder_, args_);
}

GradOutput ParamGradOutput(Net& net, int id, const memory::desc& user_md,
                           const memory::desc& natural, size_t* offset) {
  const memory target = ParamGrad(net, id, user_md);
  // A primitive that produces the plain layout writes the gradient buffer itself and needs the
  // staging only to accumulate; one with its own layout always stages.
  const memory staging = net.ParamStaging(natural, *offset, natural != user_md);
  *offset += (natural.get_size() + 63) / 64 * 64;
  return GradOutput(net, natural, target, staging);
}

GradOutput InputGradOutput(Net& net, int l, int slot, const memory::desc& natural,
                           const memory::desc& target_md) {
  const int in = net.layer(l).inputs[static_cast<size_t>(slot)];
  const memory staging = net.ActivationStaging(natural);
  if (!net.needs_grad(in)) return GradOutput(staging);
  return GradOutput(net, natural, Reshaped(net, net.diff(in), target_md), staging);
}

std::string LayerContext(const Layer& layer) {
  return fmt::format("{} '{}'", LayerKindName(layer.kind), layer.name);
}

WeightGradients::WeightGradients(Net& net, const Layer& layer, bool bias,
                                 const dnnl::memory::desc& user_w_md,
                                 const dnnl::memory::desc& diff_w_md,
                                 const dnnl::memory::desc& user_bias_md,
                                 const dnnl::memory::desc& diff_bias_md, const dnnl::memory& src,
                                 const dnnl::memory& diff_dst)
    : bias_(bias) {
  size_t offset = 0;
  weight_ = ParamGradOutput(net, layer.param_ids[0], user_w_md, diff_w_md, &offset);
  if (bias_)
    bias_grad_ = ParamGradOutput(net, layer.param_ids[1], user_bias_md, diff_bias_md, &offset);
  for (int acc = 0; acc < 2; ++acc) {
    Args& a = args_[acc];
    a = {{DNNL_ARG_SRC, src},
         {DNNL_ARG_DIFF_DST, diff_dst},
         {DNNL_ARG_DIFF_WEIGHTS, weight_.Dest(acc == 1)}};
    if (bias_) a[DNNL_ARG_DIFF_BIAS] = bias_grad_.Dest(acc == 1);
  }
}

Status WeightGradients::Run(Net& net, const std::string& context,
                            const dnnl::primitive& backward_weights, bool accumulate) const {
  KOLO_RETURN_IF_ERROR(
      net.Run(context, "backward weights", backward_weights, args_[accumulate ? 1 : 0]));
  KOLO_RETURN_IF_ERROR(weight_.Finish(net, context, accumulate));
  if (bias_) KOLO_RETURN_IF_ERROR(bias_grad_.Finish(net, context, accumulate));
  return Status::OK();
}

}  // namespace kolo::models::compute::onednn
