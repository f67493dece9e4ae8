// The gradient tensors of one training step of the paper's models, for `--tensors NAME`.
//
// Each set lists every trainable parameter of the torchvision layout of the model, in backprop
// order (the reverse of creation order), with its name and shape:
// - resnet101: ResNet-101 v1.5 (stride on the 3x3 conv), bottleneck stages [3, 4, 23, 3]; conv
//   weights without bias, batch norm gamma and beta, fc weight and bias.
//   314 tensors, 44,549,160 parameters.
// - vgg16: 13 convolutions (weight, bias) and 3 fully connected layers (weight, bias).
//   32 tensors, 138,357,544 parameters.
// - inception3: Inception V3 with the auxiliary head; every BasicConv2d is a conv without bias and
//   a batch norm (gamma, beta). 292 tensors, 27,161,264 parameters.
//
// The generators are checked against these counts: MakeTensorSet fails (Internal) if a generator
// disagrees, so a benchmark never runs on a wrong model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/status.h"

namespace kolo::bench {

struct TensorSpec {
  std::string name;  // torchvision-style parameter name, "layer1.0.conv1.weight"
  Shape shape;
};

struct TensorSet {
  std::string model;                // "resnet101", "vgg16", "inception3"
  std::vector<TensorSpec> tensors;  // backprop order
  int64_t total_elements() const;
};

// "resnet101, vgg16, inception3": the names MakeTensorSet accepts.
const char* TensorSetNames();

// The tensor set of `model`; InvalidArgument naming the value and the allowed ones for an unknown
// model; Internal if the generated set does not match the published count and total.
StatusOr<TensorSet> MakeTensorSet(const std::string& model);

}  // namespace kolo::bench
