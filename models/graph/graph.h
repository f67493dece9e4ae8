// kolo's layer IR: a model as a list of layers in topological order, with shapes inferred per image
// (the batch size is chosen later, by the compute backend), the trainable parameters of every layer
// and the multiply-accumulates of the forward pass.
//
// A Graph is built once by a zoo function (models/zoo/zoo.h) and then read-only: compute backends
// (models/compute/backend.h) turn each layer into kernels, the trainer walks the layers forward
// and backward and hands each parameter's gradient to the engine the moment the backward of its
// layer has produced it.
//
// Conventions:
// - Activations are NCHW float32. A per-image shape is (C, H, W); a fully-connected layer's output
//   is (units, 1, 1), and a fully-connected layer reads its input flattened in C, H, W order.
// - Layers are stored in the order they were added, which must be a topological order (every
//   input is added before the layers that read it). Forward runs layers 0..n-1; backward runs
//   n-1..0.
// - Parameters are numbered in creation order (forward order). BackpropOrder() gives the order in
//   which a backward pass produces their gradients: layers last to first and, within a layer, the
//   parameters in creation order (weight before bias; batch norm scale before shift).
// - Batch-norm running statistics are state, not parameters: they are neither counted nor
//   allreduced (as in torchvision's parameters() and Horovod's examples).
//
// Thread-safety: a finished Graph is immutable and may be shared between threads.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "engine/common/status.h"

namespace kolo::models {

// Per-image activation shape.
struct ImageShape {
  int64_t c = 0;
  int64_t h = 1;
  int64_t w = 1;
  int64_t size() const { return c * h * w; }
  friend bool operator==(const ImageShape&, const ImageShape&) = default;
};
std::string ToString(const ImageShape& s);  // "64x56x56"

enum class LayerKind : uint8_t {
  kInput,           // the image batch; no inputs
  kConv,            // 2-D convolution, optional bias, optional groups
  kBatchNorm,       // training mode: normalises with the batch's statistics; scale + shift
  kRelu,            // max(x, 0)
  kMaxPool,         // padding counts as -infinity
  kAvgPool,         // count_include_pad as configured; global when kernel == input size
  kConcat,          // along channels; inputs must agree in H and W
  kAdd,             // elementwise sum of two inputs of equal shape (residual connection)
  kDropout,         // training mode: zero with probability `rate`, scale the rest by 1/(1-rate)
  kFullyConnected,  // y = x W^T + b, W of shape [units, in], x flattened
  kSoftmaxCrossEntropy,  // loss = weight * mean over the batch of -log softmax(x)[label]
};
const char* LayerKindName(LayerKind kind);  // "conv", "batch_norm", ...

struct ConvParams {
  int64_t out_channels = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;  // symmetric zero padding
  int64_t groups = 1;
  bool bias = false;
};
struct BatchNormParams {
  double epsilon = 1e-5;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch (torch's sense)
};
struct PoolParams {
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // average pooling only
};
struct DropoutParams {
  double rate = 0.5;
};
struct FullyConnectedParams {
  int64_t units = 0;
  bool bias = true;
  // Initial weights: 0 = He-normal (fan_in); > 0 = normal with this standard deviation
  // (torchvision's VGG classifier uses 0.01).
  double init_std = 0.0;
};
struct LossParams {
  int64_t num_classes = 0;
  double weight = 1.0;  // the auxiliary head of Inception V3 uses 0.4
  // Test loss (the textbook data-parallel example): when true the layer's value is weight * the
  // plain sum of its input over the batch and all units — no softmax, no mean, labels ignored — so
  // d loss / d input = weight for every element. Backends implement it beside softmax
  // cross-entropy; the zoo's models never set it.
  bool sum_of_inputs = false;
};
using LayerParams = std::variant<std::monostate, ConvParams, BatchNormParams, PoolParams,
                                 DropoutParams, FullyConnectedParams, LossParams>;

// A trainable parameter. Shapes follow torch's layout: conv weight [out, in/groups, kh, kw],
// fc weight [units, in], biases and batch-norm scale/shift [channels].
struct Parameter {
  std::string name;  // "<layer name>/weight", "/bias", "/gamma" (scale), "/beta" (shift)
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int layer = -1;  // index of the owning layer
  // Initialisation the trainer applies (models/graph/init.h): conv and fc weights He-normal
  // (fan_in), biases and beta zero, gamma one.
  // kNormal: zero-mean normal with standard deviation init_std.
  enum class Init : uint8_t { kHeNormal, kZeros, kOnes, kNormal } init = Init::kZeros;
  double init_std = 0.0;
};

struct Layer {
  std::string name;
  LayerKind kind = LayerKind::kInput;
  std::vector<int> inputs;  // producer layer indices
  // Filled by Graph as layers are added: the layers that read this layer's output, in increasing
  // order, each listed once (even a layer that reads it twice, as Add(x, x) does).
  std::vector<int> consumers;
  LayerParams params;
  ImageShape in;   // shape of inputs[0] (of the first input for concat; the logits for the loss)
  ImageShape out;  // the loss layer's out is (1, 1, 1)
  std::vector<int> param_ids;  // into Graph::params(), creation order
  int64_t macs = 0;            // forward multiply-accumulates per image (conv and fc only)
};

class Graph {
 public:
  explicit Graph(std::string name) : name_(std::move(name)) {}

  // Builders. Each returns the new layer's index. A builder given an impossible configuration
  // (an empty output, a pooling window larger than its padded input, a concat of different H/W,
  // an add of different shapes, an input index that does not exist) records the first such
  // error, naming the layer and the values; Finish() returns it.
  int Input(const std::string& name, ImageShape shape);
  int Conv(const std::string& name, int input, const ConvParams& p);
  int BatchNorm(const std::string& name, int input, const BatchNormParams& p = {});
  int Relu(const std::string& name, int input);
  int MaxPool(const std::string& name, int input, const PoolParams& p);
  int AvgPool(const std::string& name, int input, const PoolParams& p);
  // Average over the whole spatial extent (torch's adaptive_avg_pool2d to 1x1).
  int GlobalAvgPool(const std::string& name, int input);
  int Concat(const std::string& name, const std::vector<int>& inputs);
  int Add(const std::string& name, int a, int b);
  int Dropout(const std::string& name, int input, const DropoutParams& p);
  int FullyConnected(const std::string& name, int input, const FullyConnectedParams& p);
  // A loss layer; labels are int32 class indices in [0, num_classes). A graph may have several
  // (Inception V3's auxiliary head); the training loss is their sum.
  int SoftmaxCrossEntropy(const std::string& name, int logits, const LossParams& p);

  // Validates the graph (exactly one input layer, at least one loss, every non-loss layer's output
  // consumed, unique layer names) and fills consumers. REQUIRES: called once, after the builders.
  [[nodiscard]] Status Finish();

  const std::string& name() const { return name_; }
  const std::vector<Layer>& layers() const { return layers_; }
  const Layer& layer(int i) const { return layers_.at(static_cast<size_t>(i)); }
  const std::vector<Parameter>& params() const { return params_; }
  int input_layer() const { return input_; }
  // The index of the layer called `name`, or -1 if there is none.
  int FindLayer(const std::string& name) const;
  std::vector<int> loss_layers() const;
  ImageShape input_shape() const;

  // Parameter ids in the order a backward pass produces their gradients (see the file comment).
  std::vector<int> BackpropOrder() const;
  int64_t NumParameterElements() const;
  int64_t ForwardMacsPerImage() const;

 private:
  int AddLayer(Layer layer);
  int AddParam(int layer, const std::string& suffix, std::vector<int64_t> shape,
               Parameter::Init init);
  bool CheckInput(const std::string& layer, int input);
  void Fail(Status s);

  std::string name_;
  std::vector<Layer> layers_;
  std::vector<Parameter> params_;
  int input_ = -1;
  Status error_;
  bool finished_ = false;
};

// A table of the graph: a header line (name, layers, parameters, tensors, G MACs per image), then
// one line per layer with its name, kind, output shape, parameter elements and MACs per image.
std::string ToString(const Graph& graph);

}  // namespace kolo::models
