// Internal to the zoo: one builder per model family and the small functions they share. zoo.cc
// validates and resolves the ModelConfig (image size, dropout) before calling a builder and
// finishes the graph after it; a builder only adds layers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/graph/graph.h"
#include "models/zoo/zoo.h"

namespace kolo::models::zoo {

// REQUIRES for every builder: config.image_size >= the model's minimum, config.dropout in [0, 1)
// for models with dropout, config.num_classes > 0.
Graph BuildVgg16(const ModelConfig& config);
// blocks: bottlenecks per stage, {3, 4, 6, 3} for ResNet-50.
Graph BuildResNet(const std::string& name, const std::vector<int>& blocks,
                  const ModelConfig& config);
Graph BuildInception3(const std::string& name, const ModelConfig& config);
Graph BuildTinyMlp(const ModelConfig& config);
Graph BuildTinyCnn(const ModelConfig& config);
Graph BuildTinyResNet(const ModelConfig& config);
Graph BuildTinyInception(const ModelConfig& config);

// A convolution of `out` channels, kernel kh x kw, the same stride both ways, padding ph x pw.
inline ConvParams ConvSpec(int64_t out, int64_t kh, int64_t kw, int64_t stride = 1, int64_t ph = 0,
                           int64_t pw = 0, bool bias = false) {
  ConvParams p;
  p.out_channels = out;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = p.stride_w = stride;
  p.pad_h = ph;
  p.pad_w = pw;
  p.bias = bias;
  return p;
}

// A square pooling window.
inline PoolParams PoolSpec(int64_t kernel, int64_t stride, int64_t pad = 0,
                           bool count_include_pad = true) {
  PoolParams p;
  p.kernel_h = p.kernel_w = kernel;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.count_include_pad = count_include_pad;
  return p;
}

// The classifier every model ends with: fc(num_classes) named `fc_name`, then the loss.
inline int ClassifierHead(Graph& g, int input, const std::string& fc_name,
                          const std::string& loss_name, int64_t num_classes, double weight = 1.0,
                          double init_std = 0.0) {
  const int fc =
      g.FullyConnected(fc_name, input, {.units = num_classes, .bias = true, .init_std = init_std});
  return g.SoftmaxCrossEntropy(loss_name, fc, {.num_classes = num_classes, .weight = weight});
}

}  // namespace kolo::models::zoo
