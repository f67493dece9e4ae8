// The state the layer kernels of one oneDNN backend share: the CPU engine and its stream, every
// layer's output and output-gradient buffers, the parameters with their gradients and momentum,
// the scratch buffers, and the clock that sums the time spent inside kernels.
//
// Layouts: activations and their gradients are float32 {batch, C, H, W}, channel-blocked where
// the channels allow it and plain NCHW elsewhere (the input images, fully-connected outputs
// {batch, units, 1, 1}); parameters, gradients and momentum are contiguous float32 in torch's
// layout (graph.h). Kernels that prefer other layouts convert at their own boundaries.
//
// Thread-safety: none; one Net is used by the one thread that drives its backend.
#pragma once

#include <chrono>
#include <cstdint>
#include <dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/common/status.h"
#include "models/compute/backend.h"
#include "models/graph/graph.h"

namespace kolo::models::compute::onednn {

using Args = std::unordered_map<int, dnnl::memory>;

// One trainable parameter's buffers, each `numel` floats in torch's layout, as 1-D memories.
struct ParamState {
  dnnl::memory value;
  dnnl::memory grad;      // what the engine reduces in place
  dnnl::memory momentum;  // SGD velocity, zero until the first Update
  int64_t numel = 0;
};

class Net {
 public:
  // Builds the engine and stream and allocates every activation, gradient and parameter buffer
  // for `graph` at `config.batch` images. Throws dnnl::error (callers convert it). REQUIRES:
  // graph finished and outliving the Net; config.batch > 0.
  Net(const Graph& graph, const BackendConfig& config);

  const Graph& graph() const { return graph_; }
  const Layer& layer(int l) const { return graph_.layer(l); }
  int64_t batch() const { return batch_; }
  uint64_t seed() const { return seed_; }
  const dnnl::engine& engine() const { return engine_; }

  // {batch, C, H, W} float32 descriptor of layer `l`'s output and its gradient: plain NCHW, or
  // channel-blocked (see ChooseLayouts in net.cc). Layers that read a buffer element by element
  // (dropout, the losses) see the same layout on their input and output.
  dnnl::memory::desc OutputDesc(int l) const;
  // Layer `l`'s output (none for loss layers) and the gradient of the loss with respect to it
  // (none when no parameter lies upstream of `l`, see needs_grad). A ReLU's output may share its
  // input's buffer (when it is that input's only reader), and gradients share buffers with others
  // that are never live at the same time during backward: a gradient holds its value from the
  // backward of its layer's last consumer to the backward of the layer itself.
  const dnnl::memory& value(int l) const { return value_[static_cast<size_t>(l)]; }
  const dnnl::memory& diff(int l) const { return diff_[static_cast<size_t>(l)]; }
  // Whether any parameter lies at or upstream of layer `l`, so that a gradient must reach it.
  bool needs_grad(int l) const { return needs_grad_[static_cast<size_t>(l)]; }
  // Whether the gradient layer `l` sends to its input `slot` is added to what that input's
  // gradient buffer holds (another consumer, run earlier in backward, wrote it first) rather than
  // overwriting it.
  bool adds_to_input(int l, int slot) const;

  ParamState& param(int id) { return params_.at(static_cast<size_t>(id)); }
  int num_params() const { return static_cast<int>(params_.size()); }

  // A view of `desc` on the shared activation scratch buffer. Every kernel uses it for at most one
  // tensor at a time, within one call. The storage is attached by AttachScratch().
  dnnl::memory ActivationStaging(const dnnl::memory::desc& desc);
  // A view of `desc` at `offset_bytes` into the shared parameter-gradient scratch buffer (a
  // layer's staged gradients lie side by side). The storage is attached by AttachScratch() when
  // `eager`, else on the first call of UseParamScratch() (only local gradient aggregation needs
  // it, and for VGG-16 it is a 400 MB buffer).
  dnnl::memory ParamStaging(const dnnl::memory::desc& desc, size_t offset_bytes, bool eager);
  // Allocates the scratch buffers requested so far. REQUIRES: after every kernel is built.
  void AttachScratch();
  void UseParamScratch();

  // Runs `p` on the stream with `args`, waits, and adds the time to the kernel clock. `context`
  // names the layer and the step for a failure.
  [[nodiscard]] Status Run(const std::string& context, const char* step, const dnnl::primitive& p,
                           const Args& args);
  // Adds the seconds since `start` to the kernel clock (host-loop kernels time themselves).
  void AddKernelTime(std::chrono::steady_clock::time_point start);
  double TakeKernelSeconds();

  // Loss layer values of the last forward pass, by layer index (0 for other layers).
  std::vector<double>& losses() { return losses_; }
  // The batch's class labels (batch values, in range for every loss layer).
  std::vector<int32_t>& labels() { return labels_; }

 private:
  void ChooseLayouts();
  void AllocateValues();
  void AllocateDiffs();

  const Graph& graph_;
  int64_t batch_;
  uint64_t seed_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::vector<dnnl::memory> value_;
  std::vector<dnnl::memory> diff_;       // views of diff_pool_
  std::vector<dnnl::memory> diff_pool_;  // owns the gradient buffers
  std::vector<bool> needs_grad_;
  std::vector<bool> blocked_;  // per layer: output in block_tag_ rather than NCHW
  dnnl::memory::format_tag block_tag_ = dnnl::memory::format_tag::nChw8c;
  std::vector<std::vector<bool>> adds_;  // [layer][slot]
  std::vector<ParamState> params_;
  std::vector<double> losses_;
  std::vector<int32_t> labels_;

  std::vector<dnnl::memory> act_views_;
  size_t act_scratch_bytes_ = 0;
  dnnl::memory act_scratch_;
  std::vector<dnnl::memory> param_views_;
  std::vector<size_t> param_offsets_;  // of param_views_, in bytes
  size_t param_scratch_bytes_ = 0;
  bool param_scratch_eager_ = false;
  dnnl::memory param_scratch_;

  double kernel_seconds_ = 0;
};

// A prebuilt `dst = src` and its accumulating twin `dst += src` (a reorder with a sum post-op),
// between any two layouts of the same dims.
class Transfer {
 public:
  Transfer() = default;
  // Throws dnnl::error.
  Transfer(const Net& net, const dnnl::memory& src, const dnnl::memory& dst);
  [[nodiscard]] Status Run(Net& net, const std::string& context, bool add) const;

 private:
  dnnl::reorder copy_;
  dnnl::reorder add_;
  Args args_;
};

// Where a kernel puts a gradient it computes in its own layout (`natural`), and how the gradient
// reaches its plain `target` buffer: written there directly, copied from staging, or added to it
// from staging.
class GradOutput {
 public:
  GradOutput() = default;
  // A gradient that reaches `target`; `staging` is a scratch view of `natural`. Throws dnnl::error.
  GradOutput(const Net& net, const dnnl::memory::desc& natural, const dnnl::memory& target,
             const dnnl::memory& staging);
  // A gradient nobody needs (a batch norm's input gradient when only the input lies upstream):
  // written to `staging` and dropped.
  explicit GradOutput(const dnnl::memory& staging) : staging_(staging), discard_(true) {}

  // The buffer the kernel writes, when the result is to be added (`add`) or to overwrite.
  const dnnl::memory& Dest(bool add) const { return direct_ && !add ? target_ : staging_; }
  // Brings what the kernel wrote into Dest(add) to the target.
  [[nodiscard]] Status Finish(Net& net, const std::string& context, bool add) const;

 private:
  dnnl::memory target_;
  dnnl::memory staging_;
  bool direct_ = false;
  bool discard_ = false;
  Transfer transfer_;
};

}  // namespace kolo::models::compute::onednn
