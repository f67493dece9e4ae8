// Layers that merge several inputs: concat along channels (a oneDNN concat forward; backward
// hands each input its channel slice of the gradient, viewed in place and copied or added by a
// reorder) and the residual add (a oneDNN binary add; backward hands both inputs the gradient).
#include <vector>

#include "models/compute/onednn/kernel.h"
#include "models/compute/onednn/kernel_util.h"

namespace kolo::models::compute::onednn {
namespace {

using dnnl::memory;

// Backward of both: one transfer per input that needs a gradient.
class MergeKernel : public LayerKernel {
 public:
  Status Backward(bool /*accumulate: no parameters*/) override {
    for (const Delivery& d : deliveries_) {
      KOLO_RETURN_IF_ERROR(d.transfer.Run(net_, context_, d.add));
    }
    return Status::OK();
  }

 protected:
  MergeKernel(Net& net, int l) : net_(net), context_(LayerContext(net.layer(l))) {}

  // Sends `grad` (a view of this layer's gradient) to input `slot`, if it needs a gradient.
  void Deliver(int l, int slot, const memory& grad) {
    const int in = net_.layer(l).inputs[static_cast<size_t>(slot)];
    if (!net_.needs_grad(in)) return;
    deliveries_.push_back({Transfer(net_, grad, net_.diff(in)), net_.adds_to_input(l, slot)});
  }

  struct Delivery {
    Transfer transfer;
    bool add;
  };
  Net& net_;
  const std::string context_;
  std::vector<Delivery> deliveries_;
};

class ConcatKernel final : public MergeKernel {
 public:
  ConcatKernel(Net& net, int l) : MergeKernel(net, l) {
    const Layer& layer = net.layer(l);
    std::vector<memory::desc> srcs;
    for (int in : layer.inputs) srcs.push_back(net.OutputDesc(in));
    const memory::desc dst_md = net.OutputDesc(l);
    fwd_ = dnnl::concat(dnnl::concat::primitive_desc(dst_md, 1, srcs, net.engine()));
    fwd_args_ = {{DNNL_ARG_DST, net.value(l)}};
    for (size_t i = 0; i < layer.inputs.size(); ++i) {
      fwd_args_[DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i)] = net.value(layer.inputs[i]);
    }
    if (!net.needs_grad(l)) return;
    memory::dim offset = 0;
    for (size_t i = 0; i < layer.inputs.size(); ++i) {
      const memory::dims& dims = srcs[i].dims();
      const memory slice(dst_md.submemory_desc(dims, {0, offset, 0, 0}), net.engine(),
                         net.diff(l).get_data_handle());
      Deliver(l, static_cast<int>(i), slice);
      offset += dims[1];
    }
  }
  Status Forward() override { return net_.Run(context_, "forward", fwd_, fwd_args_); }

 private:
  dnnl::concat fwd_;
  Args fwd_args_;
};

class AddKernel final : public MergeKernel {
 public:
  AddKernel(Net& net, int l) : MergeKernel(net, l) {
    const Layer& layer = net.layer(l);
    const memory::desc md = net.OutputDesc(l);
    fwd_ = dnnl::binary(dnnl::binary::primitive_desc(
        dnnl::binary::desc(dnnl::algorithm::binary_add, md, md, md), net.engine()));
    fwd_args_ = {{DNNL_ARG_SRC_0, net.value(layer.inputs[0])},
                 {DNNL_ARG_SRC_1, net.value(layer.inputs[1])},
                 {DNNL_ARG_DST, net.value(l)}};
    if (!net.needs_grad(l)) return;
    for (int slot = 0; slot < 2; ++slot) Deliver(l, slot, net.diff(l));
  }
  Status Forward() override { return net_.Run(context_, "forward", fwd_, fwd_args_); }

 private:
  dnnl::binary fwd_;
  Args fwd_args_;
};

}  // namespace

std::unique_ptr<LayerKernel> MakeConcatKernel(Net& net, int l) {
  return std::make_unique<ConcatKernel>(net, l);
}

std::unique_ptr<LayerKernel> MakeAddKernel(Net& net, int l) {
  return std::make_unique<AddKernel>(net, l);
}

}  // namespace kolo::models::compute::onednn
