// Validation, queries and printing of a Graph; the builders and shape inference are in graph.cc.
#include <fmt/format.h>

#include <unordered_set>

#include "models/graph/graph.h"

namespace kolo::models {

std::string ToString(const ImageShape& s) { return fmt::format("{}x{}x{}", s.c, s.h, s.w); }

const char* LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kInput:
      return "input";
    case LayerKind::kConv:
      return "conv";
    case LayerKind::kBatchNorm:
      return "batch_norm";
    case LayerKind::kRelu:
      return "relu";
    case LayerKind::kMaxPool:
      return "max_pool";
    case LayerKind::kAvgPool:
      return "avg_pool";
    case LayerKind::kConcat:
      return "concat";
    case LayerKind::kAdd:
      return "add";
    case LayerKind::kDropout:
      return "dropout";
    case LayerKind::kFullyConnected:
      return "fully_connected";
    case LayerKind::kSoftmaxCrossEntropy:
      return "softmax_cross_entropy";
  }
  return "unknown";
}

Status Graph::Finish() {
  if (finished_) return FailedPrecondition("graph '{}': Finish() called twice", name_);
  finished_ = true;
  if (!error_.ok()) return error_;
  if (input_ < 0) return InvalidArgument("graph '{}' has no input layer", name_);
  std::unordered_set<std::string> names;
  for (const Layer& l : layers_) {
    if (!names.insert(l.name).second) {
      return InvalidArgument("graph '{}': two layers are named '{}'; names must be unique", name_,
                             l.name);
    }
  }
  if (loss_layers().empty()) {
    return InvalidArgument("graph '{}' has no loss layer; add SoftmaxCrossEntropy", name_);
  }
  for (const Layer& l : layers_) {
    if (l.kind != LayerKind::kSoftmaxCrossEntropy && l.consumers.empty()) {
      return InvalidArgument(
          "graph '{}': the output of {} layer '{}' is never read; every layer but a loss needs a "
          "consumer",
          name_, LayerKindName(l.kind), l.name);
    }
  }
  return Status::OK();
}

std::vector<int> Graph::loss_layers() const {
  std::vector<int> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].kind == LayerKind::kSoftmaxCrossEntropy) out.push_back(static_cast<int>(i));
  }
  return out;
}

int Graph::FindLayer(const std::string& name) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

ImageShape Graph::input_shape() const {
  if (input_ < 0) return {};
  return layers_[static_cast<size_t>(input_)].out;
}

std::vector<int> Graph::BackpropOrder() const {
  std::vector<int> order;
  order.reserve(params_.size());
  for (auto it = layers_.rbegin(); it != layers_.rend(); ++it) {
    order.insert(order.end(), it->param_ids.begin(), it->param_ids.end());
  }
  return order;
}

int64_t Graph::NumParameterElements() const {
  int64_t n = 0;
  for (const Parameter& p : params_) n += p.numel;
  return n;
}

int64_t Graph::ForwardMacsPerImage() const {
  int64_t n = 0;
  for (const Layer& l : layers_) n += l.macs;
  return n;
}

std::string ToString(const Graph& graph) {
  std::string out = fmt::format("{}: {} layers, {} parameters in {} tensors, {:.3f} G MACs/image\n",
                                graph.name(), graph.layers().size(), graph.NumParameterElements(),
                                graph.params().size(), graph.ForwardMacsPerImage() / 1e9);
  for (const Layer& l : graph.layers()) {
    int64_t params = 0;
    for (int id : l.param_ids) params += graph.params()[static_cast<size_t>(id)].numel;
    out += fmt::format("  {:<40} {:<22} {:>14} {:>10} {:>14}\n", l.name, LayerKindName(l.kind),
                       ToString(l.out), params, l.macs);
  }
  return out;
}

}  // namespace kolo::models
