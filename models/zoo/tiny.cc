// Tiny networks for tests: each exercises a few layer kinds on shapes small enough for
// finite-difference gradient checks (8x8 images, a handful of channels) and for a quick learning
// test. Between them they cover every layer kind the full-size models use.
#include "models/zoo/families.h"

namespace kolo::models::zoo {

Graph BuildTinyMlp(const ModelConfig& config) {
  Graph g("tiny-mlp");
  int x = g.Input("input", {3, config.image_size, config.image_size});
  x = g.FullyConnected("fc1", x, {.units = 16});
  x = g.Relu("relu1", x);
  ClassifierHead(g, x, "fc2", "loss", config.num_classes);
  return g;
}

Graph BuildTinyCnn(const ModelConfig& config) {
  Graph g("tiny-cnn");
  int x = g.Input("input", {3, config.image_size, config.image_size});
  x = g.Conv("conv1", x, ConvSpec(4, 3, 3, 1, 1, 1, /*bias=*/true));
  x = g.Relu("relu1", x);
  x = g.MaxPool("pool1", x, PoolSpec(2, 2));
  x = g.Conv("conv2", x, ConvSpec(8, 3, 3, 1, 1, 1, /*bias=*/true));
  x = g.Relu("relu2", x);
  x = g.MaxPool("pool2", x, PoolSpec(2, 2));
  ClassifierHead(g, x, "fc", "loss", config.num_classes);
  return g;
}

Graph BuildTinyResNet(const ModelConfig& config) {
  Graph g("tiny-resnet");
  int x = g.Input("input", {3, config.image_size, config.image_size});
  x = g.Conv("conv1", x, ConvSpec(8, 3, 3, 1, 1, 1));
  x = g.BatchNorm("bn1", x);
  x = g.Relu("relu", x);
  // A basic block that keeps the shape: the shortcut is the identity.
  int y = g.Conv("block1.conv1", x, ConvSpec(8, 3, 3, 1, 1, 1));
  y = g.BatchNorm("block1.bn1", y);
  y = g.Relu("block1.relu1", y);
  y = g.Conv("block1.conv2", y, ConvSpec(8, 3, 3, 1, 1, 1));
  y = g.BatchNorm("block1.bn2", y);
  y = g.Add("block1.add", y, x);
  x = g.Relu("block1", y);
  // A strided block that widens: the shortcut is a strided 1x1 convolution with batch norm.
  int shortcut = g.Conv("block2.downsample.0", x, ConvSpec(12, 1, 1, 2));
  shortcut = g.BatchNorm("block2.downsample.1", shortcut);
  y = g.Conv("block2.conv1", x, ConvSpec(12, 3, 3, 2, 1, 1));
  y = g.BatchNorm("block2.bn1", y);
  y = g.Relu("block2.relu1", y);
  y = g.Conv("block2.conv2", y, ConvSpec(12, 3, 3, 1, 1, 1));
  y = g.BatchNorm("block2.bn2", y);
  y = g.Add("block2.add", y, shortcut);
  x = g.Relu("block2", y);
  x = g.GlobalAvgPool("avgpool", x);
  ClassifierHead(g, x, "fc", "loss", config.num_classes);
  return g;
}

Graph BuildTinyInception(const ModelConfig& config) {
  Graph g("tiny-inception");
  int x = g.Input("input", {3, config.image_size, config.image_size});
  x = g.Conv("stem.conv", x, ConvSpec(6, 3, 3, 1, 1, 1));
  x = g.BatchNorm("stem.bn", x, {.epsilon = 0.001});
  const int stem = g.Relu("stem", x);
  if (config.aux_logits) {
    const int aux = g.GlobalAvgPool("aux.avgpool", stem);
    ClassifierHead(g, aux, "aux.fc", "aux.loss", config.num_classes, 0.4);
  }
  int b1 = g.Conv("block.branch1x1", stem, ConvSpec(4, 1, 1, 1, 0, 0, /*bias=*/true));
  b1 = g.Relu("block.branch1x1.relu", b1);
  int b2 = g.Conv("block.branch1x3_1", stem, ConvSpec(3, 1, 1, 1, 0, 0, /*bias=*/true));
  b2 = g.Relu("block.branch1x3_1.relu", b2);
  b2 = g.Conv("block.branch1x3_2", b2, ConvSpec(4, 1, 3, 1, 0, 1, /*bias=*/true));
  b2 = g.Relu("block.branch1x3_2.relu", b2);
  int b3 = g.AvgPool("block.avg_pool", stem, PoolSpec(3, 1, 1));
  b3 = g.Conv("block.branch_pool", b3, ConvSpec(4, 1, 1, 1, 0, 0, /*bias=*/true));
  b3 = g.Relu("block.branch_pool.relu", b3);
  const int b4 = g.MaxPool("block.max_pool", stem, PoolSpec(3, 1, 1));
  x = g.Concat("block", {b1, b2, b3, b4});  // 4 + 4 + 4 + 6 = 18 channels
  // Strided average pooling whose border windows hang over the padding, which they do not count.
  x = g.AvgPool("pool", x, PoolSpec(3, 2, 1, /*count_include_pad=*/false));
  x = g.GlobalAvgPool("avgpool", x);
  x = g.Dropout("dropout", x, {.rate = config.dropout});
  ClassifierHead(g, x, "fc", "loss", config.num_classes);
  return g;
}

}  // namespace kolo::models::zoo
