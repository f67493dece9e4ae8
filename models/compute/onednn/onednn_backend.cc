// The oneDNN backend: a Net of buffers and one LayerKernel per layer, built in Prepare; the
// trainer's calls dispatch to the kernels. SGD runs as a host loop over the plain buffers.
#include "models/compute/onednn/onednn_backend.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <variant>

#include "models/compute/onednn/dnnl_check.h"
#include "models/compute/onednn/kernel.h"
#include "models/compute/onednn/kernel_util.h"
#include "models/compute/onednn/net.h"

namespace kolo::models::compute::onednn {
namespace {

class OneDnnBackend final : public ComputeBackend {
 public:
  const char* name() const override { return "onednn"; }
  Status Prepare(const Graph& graph, const BackendConfig& config) override;
  Status SetParameter(int param, std::span<const float> values) override;
  Status GetParameter(int param, std::span<float> out) override;
  Status GetGradient(int param, std::span<float> out) override;
  Status SetInput(std::span<const float> images, std::span<const int32_t> labels) override;
  Status Forward(int layer) override;
  StatusOr<double> Loss() override;
  Status Backward(int layer, bool accumulate) override;
  GradientView Gradient(int param) override;
  Status Update(int param, const SgdConfig& sgd, double grad_scale) override;
  Status Synchronize() override { return Status::OK(); }
  double TakeKernelSeconds() override { return net_ ? net_->TakeKernelSeconds() : 0.0; }

 private:
  Status CheckParamIndex(int param, const char* op) const;
  Status CheckParam(int param, size_t size, const char* op) const;
  Status CheckLayer(int layer, const char* op) const;

  std::unique_ptr<Net> net_;
  std::vector<std::unique_ptr<LayerKernel>> kernels_;  // null for the input layer
  std::vector<int> losses_;
  bool have_input_ = false;
};

std::unique_ptr<LayerKernel> MakeKernel(Net& net, int l) {
  switch (net.layer(l).kind) {
    case LayerKind::kInput:
      return nullptr;
    case LayerKind::kConv:
      return MakeConvKernel(net, l);
    case LayerKind::kBatchNorm:
      return MakeBatchNormKernel(net, l);
    case LayerKind::kRelu:
      return MakeReluKernel(net, l);
    case LayerKind::kMaxPool:
    case LayerKind::kAvgPool:
      return MakePoolKernel(net, l);
    case LayerKind::kConcat:
      return MakeConcatKernel(net, l);
    case LayerKind::kAdd:
      return MakeAddKernel(net, l);
    case LayerKind::kDropout:
      return MakeDropoutKernel(net, l);
    case LayerKind::kFullyConnected:
      return MakeFullyConnectedKernel(net, l);
    case LayerKind::kSoftmaxCrossEntropy:
      return MakeLossKernel(net, l);
  }
  return nullptr;
}

// What the kernels take for granted of a layer; the graph builders guarantee most of it, and a
// graph assembled by hand is checked here before any primitive sees it.
Status CheckLayerShape(const Graph& graph, const Layer& layer) {
  if (layer.kind == LayerKind::kSoftmaxCrossEntropy) {
    const auto& p = std::get<LossParams>(layer.params);
    if (!p.sum_of_inputs && layer.in.size() != p.num_classes) {
      return InvalidArgument("loss layer '{}' reads {} logits per image, but has {} classes",
                             layer.name, layer.in.size(), p.num_classes);
    }
  }
  if (layer.kind == LayerKind::kConv) {
    const auto& p = std::get<ConvParams>(layer.params);
    if (p.groups < 1 || layer.in.c % p.groups != 0 || p.out_channels % p.groups != 0) {
      return InvalidArgument(
          "conv layer '{}': groups {} must divide its {} input and {} output channels", layer.name,
          p.groups, layer.in.c, p.out_channels);
    }
  }
  if (layer.kind != LayerKind::kInput && layer.inputs.empty()) {
    return InvalidArgument("layer '{}' of graph '{}' has no input", layer.name, graph.name());
  }
  return Status::OK();
}

// Refuses a batch whose activations alone (every layer's output and its gradient, float32) exceed
// the host's memory, before oneDNN fails to allocate it; the net needs more than this (scratch,
// weights, workspaces), so the bound only catches what can never fit.
Status CheckMemory(const Graph& graph, int64_t batch) {
  double per_image = 0;
  for (const Layer& layer : graph.layers())
    per_image += 2.0 * 4.0 * static_cast<double>(layer.out.size());
  const double need = per_image * static_cast<double>(batch);
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return Status::OK();
  const double have = static_cast<double>(pages) * static_cast<double>(page);
  if (need <= have) return Status::OK();
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  return InvalidArgument(
      "onednn backend: batch {} of '{}' needs at least {:.1f} GiB for activations and their "
      "gradients ({:.1f} MiB per image), more than this host's {:.1f} GiB of memory; allowed "
      "here: a batch of at most {}",
      batch, graph.name(), need / kGiB, per_image / (1024.0 * 1024.0), have / kGiB,
      static_cast<int64_t>(have / per_image));
}

Status OneDnnBackend::Prepare(const Graph& graph, const BackendConfig& config) {
  if (net_) return FailedPrecondition("onednn backend: Prepare was already called");
  if (config.dilation != 1) {
    return InvalidArgument(
        "onednn backend: dilation {} is not allowed; it stretches recorded times, which only "
        "compute 'replay' plays (allowed here: 1)",
        config.dilation);
  }
  if (config.batch <= 0) {
    return InvalidArgument("onednn backend: batch size {} must be positive", config.batch);
  }
  if (config.precision != Precision::kFp32) {
    return InvalidArgument("onednn backend: precision {} is not supported; only fp32",
                           PrecisionName(config.precision));
  }
  if (graph.layers().empty() || graph.input_layer() < 0 || graph.loss_layers().empty()) {
    return InvalidArgument("onednn backend: graph '{}' is not finished (no input or loss layer)",
                           graph.name());
  }
  for (const Layer& layer : graph.layers()) KOLO_RETURN_IF_ERROR(CheckLayerShape(graph, layer));
  KOLO_RETURN_IF_ERROR(CheckMemory(graph, config.batch));

  std::unique_ptr<Net> net;
  KOLO_DNNL_CHECK("graph '" + graph.name() + "' buffers",
                  net = std::make_unique<Net>(graph, config));
  std::vector<std::unique_ptr<LayerKernel>> kernels(graph.layers().size());
  for (size_t l = 0; l < kernels.size(); ++l) {
    const int li = static_cast<int>(l);
    KOLO_DNNL_CHECK(LayerContext(graph.layer(li)), kernels[l] = MakeKernel(*net, li));
  }
  KOLO_DNNL_CHECK("graph '" + graph.name() + "' scratch", net->AttachScratch());
  net_ = std::move(net);
  kernels_ = std::move(kernels);
  losses_ = graph.loss_layers();
  return Status::OK();
}

Status OneDnnBackend::CheckParamIndex(int param, const char* op) const {
  if (!net_) return FailedPrecondition("onednn backend: {} before Prepare", op);
  if (param < 0 || param >= net_->num_params()) {
    return InvalidArgument("onednn backend: {}: parameter {} does not exist (the graph has {})", op,
                           param, net_->num_params());
  }
  return Status::OK();
}

Status OneDnnBackend::CheckParam(int param, size_t size, const char* op) const {
  KOLO_RETURN_IF_ERROR(CheckParamIndex(param, op));
  const Parameter& p = net_->graph().params()[static_cast<size_t>(param)];
  if (size != static_cast<size_t>(p.numel)) {
    return InvalidArgument("onednn backend: {} '{}': {} values given, the parameter has {}", op,
                           p.name, size, p.numel);
  }
  return Status::OK();
}

Status OneDnnBackend::CheckLayer(int layer, const char* op) const {
  if (!net_) return FailedPrecondition("onednn backend: {} before Prepare", op);
  if (layer < 0 || static_cast<size_t>(layer) >= kernels_.size()) {
    return InvalidArgument("onednn backend: {}: layer {} does not exist (the graph has {})", op,
                           layer, kernels_.size());
  }
  return Status::OK();
}

Status OneDnnBackend::SetParameter(int param, std::span<const float> values) {
  KOLO_RETURN_IF_ERROR(CheckParam(param, values.size(), "SetParameter"));
  std::memcpy(net_->param(param).value.get_data_handle(), values.data(), values.size_bytes());
  return Status::OK();
}

Status OneDnnBackend::GetParameter(int param, std::span<float> out) {
  KOLO_RETURN_IF_ERROR(CheckParam(param, out.size(), "GetParameter"));
  std::memcpy(out.data(), net_->param(param).value.get_data_handle(), out.size_bytes());
  return Status::OK();
}

Status OneDnnBackend::GetGradient(int param, std::span<float> out) {
  KOLO_RETURN_IF_ERROR(CheckParam(param, out.size(), "GetGradient"));
  std::memcpy(out.data(), net_->param(param).grad.get_data_handle(), out.size_bytes());
  return Status::OK();
}

Status OneDnnBackend::SetInput(std::span<const float> images, std::span<const int32_t> labels) {
  if (!net_) return FailedPrecondition("onednn backend: SetInput before Prepare");
  const Graph& g = net_->graph();
  const auto batch = static_cast<size_t>(net_->batch());
  const size_t want = batch * static_cast<size_t>(g.input_shape().size());
  if (images.size() != want || labels.size() != batch) {
    return InvalidArgument(
        "onednn backend: SetInput got {} image values and {} labels; batch {} of {} images "
        "needs {} and {}",
        images.size(), labels.size(), batch, ToString(g.input_shape()), want, batch);
  }
  for (int l : losses_) {
    const auto& loss = std::get<LossParams>(g.layer(l).params);
    if (loss.sum_of_inputs) continue;  // labels unused
    const int64_t classes = loss.num_classes;
    for (size_t i = 0; i < batch; ++i) {
      if (labels[i] < 0 || labels[i] >= classes) {
        return InvalidArgument("onednn backend: label {} of image {} is outside [0, {}) of '{}'",
                               labels[i], i, classes, g.layer(l).name);
      }
    }
  }
  std::memcpy(net_->value(g.input_layer()).get_data_handle(), images.data(), images.size_bytes());
  std::copy(labels.begin(), labels.end(), net_->labels().begin());
  have_input_ = true;
  return Status::OK();
}

Status OneDnnBackend::Forward(int layer) {
  KOLO_RETURN_IF_ERROR(CheckLayer(layer, "Forward"));
  if (!have_input_) return FailedPrecondition("onednn backend: Forward before SetInput");
  LayerKernel* k = kernels_[static_cast<size_t>(layer)].get();
  return k ? k->Forward() : Status::OK();
}

StatusOr<double> OneDnnBackend::Loss() {
  if (!net_) return FailedPrecondition("onednn backend: Loss before Prepare");
  double sum = 0;
  for (int l : losses_) sum += net_->losses()[static_cast<size_t>(l)];
  return sum;
}

Status OneDnnBackend::Backward(int layer, bool accumulate) {
  KOLO_RETURN_IF_ERROR(CheckLayer(layer, "Backward"));
  LayerKernel* k = kernels_[static_cast<size_t>(layer)].get();
  return k ? k->Backward(accumulate) : Status::OK();
}

GradientView OneDnnBackend::Gradient(int param) {
  if (!net_ || param < 0 || param >= net_->num_params()) return {};
  ParamState& p = net_->param(param);
  return GradientView{p.grad.get_data_handle(), DataType::kFloat32, p.numel, -1, nullptr};
}

Status OneDnnBackend::Update(int param, const SgdConfig& sgd, double grad_scale) {
  KOLO_RETURN_IF_ERROR(CheckParamIndex(param, "Update"));
  ParamState& p = net_->param(param);
  const auto start = std::chrono::steady_clock::now();
  auto* w = static_cast<float*>(p.value.get_data_handle());
  const auto* g = static_cast<const float*>(p.grad.get_data_handle());
  auto* v = static_cast<float*>(p.momentum.get_data_handle());
  const auto lr = static_cast<float>(sgd.learning_rate);
  const auto mu = static_cast<float>(sgd.momentum);
  const auto wd = static_cast<float>(sgd.weight_decay);
  const auto scale = static_cast<float>(grad_scale);
  for (int64_t i = 0; i < p.numel; ++i) {
    const float d = g[i] * scale + wd * w[i];
    v[i] = mu * v[i] + d;
    w[i] -= lr * v[i];
  }
  net_->AddKernelTime(start);
  return Status::OK();
}

}  // namespace

std::unique_ptr<ComputeBackend> CreateOneDnnBackend() { return std::make_unique<OneDnnBackend>(); }

}  // namespace kolo::models::compute::onednn
