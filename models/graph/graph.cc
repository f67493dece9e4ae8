#include "models/graph/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <utility>

namespace kolo::models {
namespace {

// torch's floor-mode output size; 0 or less means the window does not fit.
int64_t WindowOutput(int64_t in, int64_t kernel, int64_t stride, int64_t pad) {
  const int64_t span = in + 2 * pad - kernel;
  if (span < 0) return 0;
  return span / stride + 1;
}

}  // namespace

void Graph::Fail(Status s) {
  if (error_.ok()) error_ = std::move(s);
}

bool Graph::CheckInput(const std::string& layer, int input) {
  if (input < 0 || static_cast<size_t>(input) >= layers_.size()) {
    Fail(InvalidArgument("graph '{}': layer '{}' reads layer index {}, but only {} layers exist",
                         name_, layer, input, layers_.size()));
    return false;
  }
  const Layer& producer = layers_[static_cast<size_t>(input)];
  if (producer.kind == LayerKind::kSoftmaxCrossEntropy) {
    Fail(InvalidArgument("graph '{}': layer '{}' reads loss layer '{}'; a loss has no consumers",
                         name_, layer, producer.name));
    return false;
  }
  if (producer.out.size() <= 0) return false;  // its own error is already recorded
  return true;
}

int Graph::AddLayer(Layer layer) {
  if (finished_) {
    Fail(FailedPrecondition("graph '{}': layer '{}' added after Finish()", name_, layer.name));
  }
  const int index = static_cast<int>(layers_.size());
  // A layer that reads the same producer twice (Add(x, x)) is listed once among its consumers.
  std::vector<int> producers = layer.inputs;
  std::sort(producers.begin(), producers.end());
  producers.erase(std::unique(producers.begin(), producers.end()), producers.end());
  for (int p : producers) {
    if (p >= 0 && p < index) layers_[static_cast<size_t>(p)].consumers.push_back(index);
  }
  layers_.push_back(std::move(layer));
  return index;
}

int Graph::AddParam(int layer, const std::string& suffix, std::vector<int64_t> shape,
                    Parameter::Init init) {
  Parameter p;
  p.name = layers_[static_cast<size_t>(layer)].name + "/" + suffix;
  p.numel = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  p.shape = std::move(shape);
  p.layer = layer;
  p.init = init;
  const int id = static_cast<int>(params_.size());
  params_.push_back(std::move(p));
  layers_[static_cast<size_t>(layer)].param_ids.push_back(id);
  return id;
}

int Graph::Input(const std::string& name, ImageShape shape) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kInput;
  if (input_ >= 0) {
    Fail(InvalidArgument("graph '{}': second input layer '{}' (the first is '{}'); a graph has one",
                         name_, name, layers_[static_cast<size_t>(input_)].name));
  } else if (shape.c <= 0 || shape.h <= 0 || shape.w <= 0) {
    Fail(InvalidArgument("graph '{}': input '{}' has shape {}; every dimension must be positive",
                         name_, name, ToString(shape)));
  } else {
    l.out = shape;
  }
  const int index = AddLayer(std::move(l));
  if (input_ < 0) input_ = index;
  return index;
}

int Graph::Conv(const std::string& name, int input, const ConvParams& p) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kConv;
  l.inputs = {input};
  l.params = p;
  if (CheckInput(name, input)) {
    const ImageShape in = layers_[static_cast<size_t>(input)].out;
    l.in = in;
    if (p.out_channels <= 0 || p.kernel_h <= 0 || p.kernel_w <= 0 || p.stride_h <= 0 ||
        p.stride_w <= 0 || p.pad_h < 0 || p.pad_w < 0 || p.groups <= 0) {
      Fail(InvalidArgument(
          "graph '{}': conv '{}' has out_channels {}, kernel {}x{}, stride {}x{}, padding {}x{}, "
          "groups {}; channels, kernel, stride and groups must be positive, padding >= 0",
          name_, name, p.out_channels, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h,
          p.pad_w, p.groups));
    } else if (in.c % p.groups != 0 || p.out_channels % p.groups != 0) {
      Fail(InvalidArgument(
          "graph '{}': conv '{}' has {} input and {} output channels, not both divisible by "
          "groups {}",
          name_, name, in.c, p.out_channels, p.groups));
    } else if (WindowOutput(in.h, p.kernel_h, p.stride_h, p.pad_h) <= 0 ||
               WindowOutput(in.w, p.kernel_w, p.stride_w, p.pad_w) <= 0) {
      Fail(InvalidArgument(
          "graph '{}': conv '{}' kernel {}x{} does not fit its input {} padded by {}x{}", name_,
          name, p.kernel_h, p.kernel_w, ToString(in), p.pad_h, p.pad_w));
    } else {
      const int64_t oh = WindowOutput(in.h, p.kernel_h, p.stride_h, p.pad_h);
      const int64_t ow = WindowOutput(in.w, p.kernel_w, p.stride_w, p.pad_w);
      l.out = {p.out_channels, oh, ow};
      l.macs = p.out_channels * oh * ow * (in.c / p.groups) * p.kernel_h * p.kernel_w;
    }
  }
  const bool ok = l.out.size() > 0;
  const int index = AddLayer(std::move(l));
  if (ok) {
    const Layer& me = layers_[static_cast<size_t>(index)];
    AddParam(index, "weight", {p.out_channels, me.in.c / p.groups, p.kernel_h, p.kernel_w},
             Parameter::Init::kHeNormal);
    if (p.bias) AddParam(index, "bias", {p.out_channels}, Parameter::Init::kZeros);
  }
  return index;
}

int Graph::BatchNorm(const std::string& name, int input, const BatchNormParams& p) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kBatchNorm;
  l.inputs = {input};
  l.params = p;
  if (CheckInput(name, input)) {
    l.in = layers_[static_cast<size_t>(input)].out;
    if (!(p.epsilon > 0) || !(p.momentum >= 0 && p.momentum <= 1)) {
      Fail(InvalidArgument(
          "graph '{}': batch norm '{}' has epsilon {} and momentum {}; epsilon must be > 0 and "
          "momentum in [0, 1]",
          name_, name, p.epsilon, p.momentum));
    } else {
      l.out = l.in;
    }
  }
  const bool ok = l.out.size() > 0;
  const int64_t channels = l.out.c;
  const int index = AddLayer(std::move(l));
  if (ok) {
    AddParam(index, "gamma", {channels}, Parameter::Init::kOnes);
    AddParam(index, "beta", {channels}, Parameter::Init::kZeros);
  }
  return index;
}

int Graph::Relu(const std::string& name, int input) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kRelu;
  l.inputs = {input};
  if (CheckInput(name, input)) {
    l.in = layers_[static_cast<size_t>(input)].out;
    l.out = l.in;
  }
  return AddLayer(std::move(l));
}

namespace {

// Shared by max and average pooling; returns an error message or the output shape.
StatusOr<ImageShape> PoolOutput(const std::string& graph, const char* what, const std::string& name,
                                ImageShape in, const PoolParams& p) {
  if (p.kernel_h <= 0 || p.kernel_w <= 0 || p.stride_h <= 0 || p.stride_w <= 0 || p.pad_h < 0 ||
      p.pad_w < 0) {
    return InvalidArgument(
        "graph '{}': {} '{}' has kernel {}x{}, stride {}x{}, padding {}x{}; kernel and stride "
        "must be positive, padding >= 0",
        graph, what, name, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w);
  }
  // torch's rule: a window must never lie wholly inside the padding.
  if (2 * p.pad_h > p.kernel_h || 2 * p.pad_w > p.kernel_w) {
    return InvalidArgument(
        "graph '{}': {} '{}' has padding {}x{} for kernel {}x{}; padding may be at most half "
        "the kernel",
        graph, what, name, p.pad_h, p.pad_w, p.kernel_h, p.kernel_w);
  }
  const int64_t oh = WindowOutput(in.h, p.kernel_h, p.stride_h, p.pad_h);
  const int64_t ow = WindowOutput(in.w, p.kernel_w, p.stride_w, p.pad_w);
  if (oh <= 0 || ow <= 0) {
    return InvalidArgument(
        "graph '{}': {} '{}' window {}x{} is larger than its input {} padded by {}x{}", graph, what,
        name, p.kernel_h, p.kernel_w, ToString(in), p.pad_h, p.pad_w);
  }
  return ImageShape{in.c, oh, ow};
}

}  // namespace

int Graph::MaxPool(const std::string& name, int input, const PoolParams& p) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kMaxPool;
  l.inputs = {input};
  l.params = p;
  if (CheckInput(name, input)) {
    l.in = layers_[static_cast<size_t>(input)].out;
    StatusOr<ImageShape> out = PoolOutput(name_, "max pool", name, l.in, p);
    if (out.ok()) {
      l.out = *out;
    } else {
      Fail(out.status());
    }
  }
  return AddLayer(std::move(l));
}

int Graph::AvgPool(const std::string& name, int input, const PoolParams& p) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kAvgPool;
  l.inputs = {input};
  l.params = p;
  if (CheckInput(name, input)) {
    l.in = layers_[static_cast<size_t>(input)].out;
    StatusOr<ImageShape> out = PoolOutput(name_, "avg pool", name, l.in, p);
    if (out.ok()) {
      l.out = *out;
    } else {
      Fail(out.status());
    }
  }
  return AddLayer(std::move(l));
}

int Graph::GlobalAvgPool(const std::string& name, int input) {
  PoolParams p;
  if (input >= 0 && static_cast<size_t>(input) < layers_.size()) {
    const ImageShape in = layers_[static_cast<size_t>(input)].out;
    p.kernel_h = std::max<int64_t>(in.h, 1);
    p.kernel_w = std::max<int64_t>(in.w, 1);
  }
  return AvgPool(name, input, p);
}

int Graph::Concat(const std::string& name, const std::vector<int>& inputs) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kConcat;
  l.inputs = inputs;
  bool ok = !inputs.empty();
  if (inputs.empty()) {
    Fail(InvalidArgument("graph '{}': concat '{}' has no inputs", name_, name));
  }
  for (int i : inputs) ok = CheckInput(name, i) && ok;
  if (ok) {
    const ImageShape first = layers_[static_cast<size_t>(inputs[0])].out;
    ImageShape out = first;
    out.c = 0;
    for (int i : inputs) {
      const Layer& src = layers_[static_cast<size_t>(i)];
      if (src.out.h != first.h || src.out.w != first.w) {
        Fail(InvalidArgument(
            "graph '{}': concat '{}' joins '{}' ({}) and '{}' ({}); inputs must agree in H and W",
            name_, name, layers_[static_cast<size_t>(inputs[0])].name, ToString(first), src.name,
            ToString(src.out)));
        ok = false;
        break;
      }
      out.c += src.out.c;
    }
    l.in = first;
    if (ok) l.out = out;
  }
  return AddLayer(std::move(l));
}

int Graph::Add(const std::string& name, int a, int b) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kAdd;
  l.inputs = {a, b};
  const bool a_ok = CheckInput(name, a);
  const bool b_ok = CheckInput(name, b);
  if (a_ok && b_ok) {
    const Layer& la = layers_[static_cast<size_t>(a)];
    const Layer& lb = layers_[static_cast<size_t>(b)];
    l.in = la.out;
    if (la.out == lb.out) {
      l.out = la.out;
    } else {
      Fail(InvalidArgument("graph '{}': add '{}' sums '{}' ({}) and '{}' ({}); shapes must match",
                           name_, name, la.name, ToString(la.out), lb.name, ToString(lb.out)));
    }
  }
  return AddLayer(std::move(l));
}

int Graph::Dropout(const std::string& name, int input, const DropoutParams& p) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kDropout;
  l.inputs = {input};
  l.params = p;
  if (CheckInput(name, input)) {
    l.in = layers_[static_cast<size_t>(input)].out;
    if (p.rate >= 0 && p.rate < 1) {
      l.out = l.in;
    } else {
      Fail(InvalidArgument("graph '{}': dropout '{}' has rate {}; it must be in [0, 1)", name_,
                           name, p.rate));
    }
  }
  return AddLayer(std::move(l));
}

int Graph::FullyConnected(const std::string& name, int input, const FullyConnectedParams& p) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kFullyConnected;
  l.inputs = {input};
  l.params = p;
  if (CheckInput(name, input)) {
    l.in = layers_[static_cast<size_t>(input)].out;
    if (p.units > 0) {
      l.out = {p.units, 1, 1};
      l.macs = l.in.size() * p.units;
    } else {
      Fail(InvalidArgument("graph '{}': fully connected '{}' has {} units; it needs at least 1",
                           name_, name, p.units));
    }
  }
  const bool ok = l.out.size() > 0;
  const int64_t in_features = l.in.size();
  const int index = AddLayer(std::move(l));
  if (ok) {
    const int w = AddParam(index, "weight", {p.units, in_features},
                           p.init_std > 0 ? Parameter::Init::kNormal : Parameter::Init::kHeNormal);
    params_[static_cast<size_t>(w)].init_std = p.init_std;
    if (p.bias) AddParam(index, "bias", {p.units}, Parameter::Init::kZeros);
  }
  return index;
}

int Graph::SoftmaxCrossEntropy(const std::string& name, int logits, const LossParams& p) {
  Layer l;
  l.name = name;
  l.kind = LayerKind::kSoftmaxCrossEntropy;
  l.inputs = {logits};
  l.params = p;
  if (CheckInput(name, logits)) {
    l.in = layers_[static_cast<size_t>(logits)].out;
    const ImageShape want{p.num_classes, 1, 1};
    if (p.sum_of_inputs && p.weight >= 0) {
      l.out = {1, 1, 1};  // a plain sum reads any shape; num_classes is not used
    } else if (p.num_classes <= 0 || !(p.weight >= 0)) {
      Fail(InvalidArgument(
          "graph '{}': loss '{}' has num_classes {} and weight {}; num_classes must be positive "
          "and weight >= 0",
          name_, name, p.num_classes, p.weight));
    } else if (l.in != want) {
      Fail(InvalidArgument(
          "graph '{}': loss '{}' over {} classes reads '{}' of shape {}; logits must be {}", name_,
          name, p.num_classes, layers_[static_cast<size_t>(logits)].name, ToString(l.in),
          ToString(want)));
    } else {
      l.out = {1, 1, 1};
    }
  }
  return AddLayer(std::move(l));
}

}  // namespace kolo::models
