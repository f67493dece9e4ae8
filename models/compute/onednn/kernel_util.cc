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

}  // namespace kolo::models::compute::onednn
