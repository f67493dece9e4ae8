// The model zoo: the networks kolo trains, built as Graphs (models/graph/graph.h) that mirror
// torchvision's architectures layer for layer — the same parameter tensors with the same shapes and
// the same names (torchvision's state_dict keys with "/weight", "/bias", "/gamma", "/beta" in place
// of ".weight", ".bias", ".weight", ".bias") — plus tiny networks for gradient checks and tests.
//
// Models and the image sizes they accept (ModelConfig::image_size; 0 picks the default):
//   vgg16              default 224. torchvision's adaptive average pooling to 7x7 before the
//                      classifier is kept exact by accepting only sizes whose feature map
//                      floor(size / 32) is a multiple of 7 (224..255: identity; 448..479: 2x2
//                      average pooling; ...). Other sizes are rejected; the smallest is 224.
//   resnet50/101/152   default 224, any size >= 1 (ResNet v1.5: the stride of a downsampling
//                      bottleneck is on its 3x3 convolution).
//   inception3         default 299. With the auxiliary head (aux_logits, the default) at least 299:
//                      the head's 5x5 convolution needs Mixed_6e at 17x17 or larger, as in
//                      torchvision's training mode. Without it at least 75.
//   inception3-noaux   inception3 without the auxiliary head, whatever aux_logits says; >= 75.
//   tiny-mlp           default 8, >= 1: fc(16) - relu - fc(num_classes).
//   tiny-cnn           default 8, >= 4: conv(4, bias) - relu - maxpool - conv(8, bias) - relu -
//                      maxpool - fc.
//   tiny-resnet        default 8, >= 1: conv-bn-relu stem, a basic residual block, a strided
//                      block with a 1x1 downsampling shortcut, global average pooling, fc.
//   tiny-inception     default 8, >= 1: a block of four concatenated branches (1x1; 1x1 then 1x3;
//                      3x3 average pooling with padding then 1x1; 3x3 max pooling with padding),
//                      average pooling that excludes padding, global average pooling, dropout, fc;
//                      with aux_logits an auxiliary head (global pooling, fc, loss weight 0.4).
//
// Every model ends in softmax cross-entropy over num_classes; Inception V3's auxiliary head adds a
// second loss of weight 0.4 after Mixed_6e. Batch norm uses torchvision's settings (epsilon 1e-5,
// Inception V3's BasicConv2d 0.001; momentum 0.1).
//
// Thread-safety: all functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "models/graph/graph.h"

namespace kolo::models::zoo {

struct ModelConfig {
  int64_t image_size = 0;      // square input side in pixels; 0 = the model's default
  int64_t num_classes = 1000;  // > 0
  bool aux_logits = true;      // Inception V3 (and tiny-inception): build the auxiliary head
  double dropout = -1;  // dropout rate in [0, 1); -1 = the model's default (0.5 where it has one).
                        // Models without dropout layers accept only -1.
};

// Builds and finishes the graph of model `name`. Errors (InvalidArgument): an unknown name (the
// message lists ModelNames()), an image size the model cannot take (the message names the model
// and the smallest allowed size), num_classes <= 0, a dropout rate outside [0, 1).
StatusOr<Graph> BuildModel(const std::string& name, const ModelConfig& config = {});

// Every name BuildModel accepts, the full-size models first.
std::vector<std::string> ModelNames();

// The image size model `name` is built at when ModelConfig::image_size is 0; 0 for unknown names.
int64_t DefaultImageSize(const std::string& name);

// The smallest image size model `name` accepts with `config` (aux_logits matters for
// inception3); 0 for unknown names. vgg16 accepts only some sizes above it (see above).
int64_t MinImageSize(const std::string& name, const ModelConfig& config = {});

}  // namespace kolo::models::zoo
