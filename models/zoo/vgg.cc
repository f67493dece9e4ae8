// VGG-16 (torchvision's vgg16, configuration "D", no batch norm). Layer names are torchvision's
// module paths: features.N for the N-th module of the feature extractor, classifier.N likewise.
#include <fmt/format.h>

#include "models/zoo/families.h"

namespace kolo::models::zoo {

Graph BuildVgg16(const ModelConfig& config) {
  // Channels per 3x3 convolution; 0 is a 2x2 max pooling of stride 2.
  static constexpr int64_t kPlan[] = {64, 64,  0,   128, 128, 0,   256, 256, 256,
                                      0,  512, 512, 512, 0,   512, 512, 512, 0};
  Graph g("vgg16");
  int x = g.Input("input", {3, config.image_size, config.image_size});
  int module = 0;
  for (int64_t channels : kPlan) {
    if (channels == 0) {
      x = g.MaxPool(fmt::format("features.{}", module++), x, PoolSpec(2, 2));
      continue;
    }
    x = g.Conv(fmt::format("features.{}", module++), x,
               ConvSpec(channels, 3, 3, 1, 1, 1, /*bias=*/true));
    x = g.Relu(fmt::format("features.{}", module++), x);
  }
  // torchvision's AdaptiveAvgPool2d((7, 7)): the identity on a 7x7 map, and a plain k x k pooling
  // of stride k on a 7k x 7k map (zoo.cc admits only those sizes).
  const int64_t side = g.layer(x).out.h;
  if (side > 7) x = g.AvgPool("avgpool", x, PoolSpec(side / 7, side / 7));

  const DropoutParams dropout{.rate = config.dropout};
  // torchvision initialises VGG's linear layers from N(0, 0.01); with He-normal ones the logits of
  // the 138 M-parameter net start large enough to diverge at the usual learning rates.
  x = g.FullyConnected("classifier.0", x, {.units = 4096, .init_std = 0.01});
  x = g.Relu("classifier.1", x);
  x = g.Dropout("classifier.2", x, dropout);
  x = g.FullyConnected("classifier.3", x, {.units = 4096, .init_std = 0.01});
  x = g.Relu("classifier.4", x);
  x = g.Dropout("classifier.5", x, dropout);
  ClassifierHead(g, x, "classifier.6", "loss", config.num_classes, 1.0, 0.01);
  return g;
}

}  // namespace kolo::models::zoo
