// ResNet-50/101/152 as torchvision builds them (v1.5: a downsampling bottleneck strides its 3x3
// convolution, not its first 1x1). Convolutions have no bias; every one is followed by batch norm
// (epsilon 1e-5). Layer names are torchvision's module paths ("layer2.0.conv2",
// "layer2.0.downsample.0"); the ReLUs torchvision shares per block are named relu1..relu3 here,
// and the block's output (its last ReLU) carries the block's own name ("layer2.0").
#include <fmt/format.h>

#include "models/zoo/families.h"

namespace kolo::models::zoo {
namespace {

constexpr int64_t kExpansion = 4;

int ConvBn(Graph& g, const std::string& prefix, const std::string& conv, const std::string& bn,
           int x, const ConvParams& p) {
  x = g.Conv(prefix + conv, x, p);
  return g.BatchNorm(prefix + bn, x);
}

int Bottleneck(Graph& g, const std::string& name, int x, int64_t width, int64_t stride) {
  const std::string p = name + ".";
  const int64_t out_channels = width * kExpansion;
  int identity = x;
  if (stride != 1 || g.layer(x).out.c != out_channels) {
    identity =
        ConvBn(g, p, "downsample.0", "downsample.1", x, ConvSpec(out_channels, 1, 1, stride));
  }
  int y = ConvBn(g, p, "conv1", "bn1", x, ConvSpec(width, 1, 1));
  y = g.Relu(p + "relu1", y);
  y = ConvBn(g, p, "conv2", "bn2", y, ConvSpec(width, 3, 3, stride, 1, 1));
  y = g.Relu(p + "relu2", y);
  y = ConvBn(g, p, "conv3", "bn3", y, ConvSpec(out_channels, 1, 1));
  y = g.Add(p + "add", y, identity);
  return g.Relu(name, y);
}

}  // namespace

Graph BuildResNet(const std::string& name, const std::vector<int>& blocks,
                  const ModelConfig& config) {
  Graph g(name);
  int x = g.Input("input", {3, config.image_size, config.image_size});
  x = ConvBn(g, "", "conv1", "bn1", x, ConvSpec(64, 7, 7, 2, 3, 3));
  x = g.Relu("relu", x);
  x = g.MaxPool("maxpool", x, PoolSpec(3, 2, 1));
  int64_t width = 64;
  for (size_t stage = 0; stage < blocks.size(); ++stage) {
    for (int b = 0; b < blocks[stage]; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      x = Bottleneck(g, fmt::format("layer{}.{}", stage + 1, b), x, width, stride);
    }
    width *= 2;
  }
  x = g.GlobalAvgPool("avgpool", x);
  ClassifierHead(g, x, "fc", "loss", config.num_classes);
  return g;
}

}  // namespace kolo::models::zoo
