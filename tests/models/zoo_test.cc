// The zoo against torchvision: trainable parameter counts and tensor counts as torchvision's
// models report them (sum(p.numel() for p in model.parameters()), len(list(model.parameters()))),
// forward multiply-accumulates per image, torchvision's documented activation shapes, parameter
// names and layouts, the backprop order, and the image sizes each model accepts or rejects.
#include "models/zoo/zoo.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace kolo::models::zoo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Graph Build(const std::string& name, const ModelConfig& config = {}) {
  StatusOr<Graph> g = BuildModel(name, config);
  EXPECT_TRUE(g.ok()) << name << ": " << g.status().ToString();
  if (!g.ok()) return Graph("failed");
  return std::move(g).value();
}

const Parameter* FindParam(const Graph& g, const std::string& name) {
  for (const Parameter& p : g.params()) {
    if (p.name == name) return &p;
  }
  ADD_FAILURE() << "no parameter '" << name << "' in " << g.name();
  return nullptr;
}

ImageShape Out(const Graph& g, const std::string& layer) {
  const int i = g.FindLayer(layer);
  EXPECT_GE(i, 0) << "no layer '" << layer << "' in " << g.name();
  return i >= 0 ? g.layer(i).out : ImageShape{};
}

struct Expected {
  const char* model;
  int64_t params;
  size_t tensors;
  // Forward multiply-accumulates per image at the default size, in G = 1e9, rounded to two
  // decimals: the sum over conv layers of out_c * out_h * out_w * (in_c / groups) * kh * kw and
  // over fully-connected layers of in * units. Batch norm, ReLU, pooling, adds and the loss are not
  // counted (the convention behind torchvision's published GFLOPS figures).
  double gmacs;
};

// torchvision's figures. Inception V3's 5.71 G is torchvision's (inference, no auxiliary head);
// the auxiliary head adds 5.7 M MACs (two BasicConv2d and an fc on a 5x5 map) and gives 5.72 G.
const Expected kExpected[] = {
    {"vgg16", 138'357'544, 32, 15.47},     {"resnet50", 25'557'032, 161, 4.09},
    {"resnet101", 44'549'160, 314, 7.80},  {"resnet152", 60'192'808, 467, 11.51},
    {"inception3", 27'161'264, 292, 5.72}, {"inception3-noaux", 23'834'568, 284, 5.71},
};

class ZooCountsTest : public ::testing::TestWithParam<Expected> {};

TEST_P(ZooCountsTest, MatchesTorchvision) {
  const Expected& e = GetParam();
  const Graph g = Build(e.model);
  EXPECT_EQ(g.NumParameterElements(), e.params);
  EXPECT_EQ(g.params().size(), e.tensors);
  EXPECT_DOUBLE_EQ(std::round(static_cast<double>(g.ForwardMacsPerImage()) / 1e7) / 100, e.gmacs)
      << g.ForwardMacsPerImage();
  EXPECT_EQ(g.input_shape(), (ImageShape{3, DefaultImageSize(e.model), DefaultImageSize(e.model)}));
  std::set<std::string> names;
  for (const Parameter& p : g.params()) EXPECT_TRUE(names.insert(p.name).second) << p.name;
}

INSTANTIATE_TEST_SUITE_P(Models, ZooCountsTest, ::testing::ValuesIn(kExpected),
                         [](const auto& info) {
                           std::string n = info.param.model;
                           for (char& c : n) c = (c == '-') ? '_' : c;
                           return n;
                         });

TEST(ZooTest, ResNetShapesAndV15Stride) {
  const Graph g = Build("resnet50");
  EXPECT_EQ(Out(g, "maxpool"), (ImageShape{64, 56, 56}));
  EXPECT_EQ(Out(g, "layer1.2"), (ImageShape{256, 56, 56}));
  EXPECT_EQ(Out(g, "layer2.3"), (ImageShape{512, 28, 28}));
  EXPECT_EQ(Out(g, "layer3.5"), (ImageShape{1024, 14, 14}));
  EXPECT_EQ(Out(g, "layer4.2"), (ImageShape{2048, 7, 7}));
  EXPECT_EQ(Out(g, "avgpool"), (ImageShape{2048, 1, 1}));
  // v1.5: the 3x3 convolution strides, the first 1x1 does not.
  const auto& conv1 = std::get<ConvParams>(g.layer(g.FindLayer("layer2.0.conv1")).params);
  const auto& conv2 = std::get<ConvParams>(g.layer(g.FindLayer("layer2.0.conv2")).params);
  EXPECT_EQ(conv1.stride_h, 1);
  EXPECT_EQ(conv2.stride_h, 2);
  EXPECT_FALSE(conv2.bias);
  EXPECT_EQ(Out(g, "layer2.0.conv1"), (ImageShape{128, 56, 56}));
  EXPECT_THAT(FindParam(g, "conv1/weight")->shape, ElementsAre(64, 3, 7, 7));
  EXPECT_THAT(FindParam(g, "layer1.0.downsample.0/weight")->shape, ElementsAre(256, 64, 1, 1));
  EXPECT_THAT(FindParam(g, "layer4.0.conv2/weight")->shape, ElementsAre(512, 512, 3, 3));
  EXPECT_THAT(FindParam(g, "layer4.2.bn3/gamma")->shape, ElementsAre(2048));
  EXPECT_THAT(FindParam(g, "fc/weight")->shape, ElementsAre(1000, 2048));
  EXPECT_EQ(g.FindLayer("layer1.1.downsample.0"), -1);  // identity shortcut
  EXPECT_EQ(Out(Build("resnet101"), "layer3.22"), (ImageShape{1024, 14, 14}));
}

TEST(ZooTest, VggShapesAndClassifier) {
  const Graph g = Build("vgg16");
  EXPECT_EQ(Out(g, "features.29"), (ImageShape{512, 14, 14}));
  EXPECT_EQ(Out(g, "features.30"), (ImageShape{512, 7, 7}));
  EXPECT_EQ(g.FindLayer("avgpool"), -1);  // adaptive 7x7 pooling of a 7x7 map: the identity
  EXPECT_THAT(FindParam(g, "features.0/weight")->shape, ElementsAre(64, 3, 3, 3));
  EXPECT_THAT(FindParam(g, "features.0/bias")->shape, ElementsAre(64));
  EXPECT_THAT(FindParam(g, "classifier.0/weight")->shape, ElementsAre(4096, 25088));
  EXPECT_THAT(FindParam(g, "classifier.6/weight")->shape, ElementsAre(1000, 4096));
  const Layer& drop = g.layer(g.FindLayer("classifier.5"));
  EXPECT_EQ(drop.kind, LayerKind::kDropout);
  EXPECT_DOUBLE_EQ(std::get<DropoutParams>(drop.params).rate, 0.5);
}

TEST(ZooTest, InceptionShapesAuxHeadAndBatchNormEpsilon) {
  const Graph g = Build("inception3");
  // The shapes torchvision's Inception3._forward documents.
  EXPECT_EQ(Out(g, "Conv2d_1a_3x3"), (ImageShape{32, 149, 149}));
  EXPECT_EQ(Out(g, "Conv2d_2b_3x3"), (ImageShape{64, 147, 147}));
  EXPECT_EQ(Out(g, "maxpool1"), (ImageShape{64, 73, 73}));
  EXPECT_EQ(Out(g, "Conv2d_4a_3x3"), (ImageShape{192, 71, 71}));
  EXPECT_EQ(Out(g, "maxpool2"), (ImageShape{192, 35, 35}));
  EXPECT_EQ(Out(g, "Mixed_5b"), (ImageShape{256, 35, 35}));
  EXPECT_EQ(Out(g, "Mixed_5d"), (ImageShape{288, 35, 35}));
  EXPECT_EQ(Out(g, "Mixed_6a"), (ImageShape{768, 17, 17}));
  EXPECT_EQ(Out(g, "Mixed_6e"), (ImageShape{768, 17, 17}));
  EXPECT_EQ(Out(g, "Mixed_7a"), (ImageShape{1280, 8, 8}));
  EXPECT_EQ(Out(g, "Mixed_7b"), (ImageShape{2048, 8, 8}));
  EXPECT_EQ(Out(g, "Mixed_7c"), (ImageShape{2048, 8, 8}));
  EXPECT_EQ(Out(g, "AuxLogits.avg_pool"), (ImageShape{768, 5, 5}));
  EXPECT_EQ(Out(g, "AuxLogits.conv1"), (ImageShape{768, 1, 1}));
  EXPECT_THAT(FindParam(g, "Mixed_6b.branch7x7_2.conv/weight")->shape, ElementsAre(128, 128, 1, 7));
  EXPECT_THAT(FindParam(g, "Mixed_7b.branch3x3_2b.conv/weight")->shape,
              ElementsAre(384, 384, 3, 1));
  EXPECT_THAT(FindParam(g, "AuxLogits.fc/weight")->shape, ElementsAre(1000, 768));
  EXPECT_THAT(FindParam(g, "fc/weight")->shape, ElementsAre(1000, 2048));
  for (const Layer& l : g.layers()) {
    if (l.kind == LayerKind::kBatchNorm) {
      EXPECT_DOUBLE_EQ(std::get<BatchNormParams>(l.params).epsilon, 0.001) << l.name;
    }
    if (l.kind == LayerKind::kConv) {
      EXPECT_FALSE(std::get<ConvParams>(l.params).bias) << l.name;
    }
  }
  // Two losses: the main one and the auxiliary head's, weighted 0.4, fed from Mixed_6e.
  const std::vector<int> losses = g.loss_layers();
  ASSERT_EQ(losses.size(), 2u);
  EXPECT_EQ(g.layer(losses[0]).name, "AuxLogits.loss");
  EXPECT_DOUBLE_EQ(std::get<LossParams>(g.layer(losses[0]).params).weight, 0.4);
  EXPECT_DOUBLE_EQ(std::get<LossParams>(g.layer(losses[1]).params).weight, 1.0);
  const Layer& mixed_6e = g.layer(g.FindLayer("Mixed_6e"));
  // Mixed_7a's three branches (1x1, 1x1, max pooling) and the auxiliary head's pooling.
  std::vector<std::string> readers;
  for (int c : mixed_6e.consumers) readers.push_back(g.layer(c).name);
  EXPECT_THAT(readers, ElementsAre("AuxLogits.avg_pool", "Mixed_7a.branch3x3_1.conv",
                                   "Mixed_7a.branch7x7x3_1.conv", "Mixed_7a.max_pool"));
  EXPECT_LT(g.FindLayer("Mixed_6e"), g.FindLayer("AuxLogits.fc"));
  EXPECT_LT(g.FindLayer("AuxLogits.loss"), g.FindLayer("Mixed_7a.branch3x3_1.conv"));
  EXPECT_DOUBLE_EQ(std::get<DropoutParams>(g.layer(g.FindLayer("dropout")).params).rate, 0.5);

  const Graph noaux = Build("inception3", {.aux_logits = false});
  EXPECT_EQ(noaux.loss_layers().size(), 1u);
  EXPECT_EQ(noaux.FindLayer("AuxLogits.fc"), -1);
  EXPECT_EQ(noaux.NumParameterElements(), 23'834'568);
}

TEST(ZooTest, BackpropOrderStartsAtTheClassifierAndEndsAtTheFirstConv) {
  for (const char* name : {"vgg16", "resnet50", "inception3", "tiny-cnn", "tiny-inception"}) {
    SCOPED_TRACE(name);
    const Graph g = Build(name);
    const std::vector<int> order = g.BackpropOrder();
    ASSERT_EQ(order.size(), g.params().size());
    EXPECT_EQ(std::set<int>(order.begin(), order.end()).size(), order.size());
    const Parameter& first = g.params()[static_cast<size_t>(order.front())];
    EXPECT_THAT(first.name, ::testing::EndsWith("/weight"));
    EXPECT_EQ(g.layer(first.layer).kind, LayerKind::kFullyConnected);
    EXPECT_EQ(g.params()[static_cast<size_t>(order[1])].name, g.layer(first.layer).name + "/bias");
    // The last gradients are the first convolution's.
    const Parameter& last = g.params()[static_cast<size_t>(order.back())];
    EXPECT_EQ(g.layer(last.layer).kind, LayerKind::kConv);
    EXPECT_EQ(g.layer(last.layer).inputs, std::vector<int>{g.input_layer()});
    EXPECT_EQ(last.layer, g.layer(g.input_layer()).consumers.front());
  }
  const Graph r = Build("resnet50");
  const std::vector<int> order = r.BackpropOrder();
  EXPECT_EQ(r.params()[static_cast<size_t>(order[0])].name, "fc/weight");
  EXPECT_EQ(r.params()[static_cast<size_t>(order[2])].name, "layer4.2.bn3/gamma");
  EXPECT_EQ(r.params()[static_cast<size_t>(order.back())].name, "conv1/weight");
  EXPECT_EQ(r.params()[static_cast<size_t>(order[order.size() - 2])].name, "bn1/beta");
}

TEST(ZooTest, SmallerAndLargerImagesWhereTheArchitectureAllows) {
  const Graph r = Build("resnet50", {.image_size = 64});
  EXPECT_EQ(Out(r, "layer4.2"), (ImageShape{2048, 2, 2}));
  EXPECT_EQ(r.NumParameterElements(), 25'557'032);
  EXPECT_EQ(Out(Build("resnet101", {.image_size = 1}), "layer4.2"), (ImageShape{2048, 1, 1}));

  const Graph i75 = Build("inception3-noaux", {.image_size = 75});
  EXPECT_EQ(Out(i75, "Mixed_6e"), (ImageShape{768, 3, 3}));
  EXPECT_EQ(Out(i75, "Mixed_7c"), (ImageShape{2048, 1, 1}));
  EXPECT_EQ(i75.NumParameterElements(), 23'834'568);
  // Larger than 299 the auxiliary 5x5 convolution leaves more than 1x1, pooled globally.
  const Graph i400 = Build("inception3", {.image_size = 400});
  EXPECT_EQ(Out(i400, "AuxLogits.conv1"), (ImageShape{768, 3, 3}));
  EXPECT_EQ(i400.NumParameterElements(), 27'161'264);

  const Graph v448 = Build("vgg16", {.image_size = 448});
  EXPECT_EQ(Out(v448, "features.30"), (ImageShape{512, 14, 14}));
  EXPECT_EQ(Out(v448, "avgpool"), (ImageShape{512, 7, 7}));
  EXPECT_EQ(v448.NumParameterElements(), 138'357'544);
  EXPECT_EQ(Out(Build("vgg16", {.image_size = 255}), "features.30"), (ImageShape{512, 7, 7}));
  EXPECT_EQ(Out(Build("tiny-cnn", {.image_size = 4}), "pool2"), (ImageShape{8, 1, 1}));
}

Status BuildStatus(const std::string& name, const ModelConfig& config) {
  return BuildModel(name, config).status();
}

TEST(ZooTest, ImageSizesTheArchitectureCannotTakeAreRejected) {
  Status s = BuildStatus("inception3-noaux", {.image_size = 74});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("model 'inception3-noaux' needs an image size of at least 75 "
                                     "(got 74)"));
  s = BuildStatus("inception3", {.image_size = 298});
  EXPECT_THAT(s.message(), HasSubstr("model 'inception3' with its auxiliary head needs an image "
                                     "size of at least 299 (got 298)"));
  EXPECT_THAT(s.message(), HasSubstr("the smallest is 75"));
  EXPECT_TRUE(BuildModel("inception3", {.image_size = 75, .aux_logits = false}).ok());
  s = BuildStatus("vgg16", {.image_size = 160});
  EXPECT_THAT(s.message(), HasSubstr("model 'vgg16' needs an image size of at least 224"));
  s = BuildStatus("vgg16", {.image_size = 256});
  EXPECT_THAT(s.message(), HasSubstr("model 'vgg16' takes image sizes whose feature map"));
  EXPECT_THAT(s.message(), HasSubstr("nearest allowed: 224 or 448"));
  s = BuildStatus("tiny-cnn", {.image_size = 3});
  EXPECT_THAT(s.message(), HasSubstr("model 'tiny-cnn' needs an image size of at least 4"));
  s = BuildStatus("resnet50", {.image_size = -5});
  EXPECT_THAT(s.message(), HasSubstr("image size -5 is negative"));
}

TEST(ZooTest, SizesAndNames) {
  EXPECT_THAT(ModelNames(), ElementsAre("vgg16", "resnet50", "resnet101", "resnet152", "inception3",
                                        "inception3-noaux", "tiny-mlp", "tiny-cnn", "tiny-resnet",
                                        "tiny-inception"));
  EXPECT_EQ(DefaultImageSize("vgg16"), 224);
  EXPECT_EQ(DefaultImageSize("inception3"), 299);
  EXPECT_EQ(DefaultImageSize("tiny-cnn"), 8);
  EXPECT_EQ(DefaultImageSize("alexnet"), 0);
  EXPECT_EQ(MinImageSize("inception3"), 299);
  EXPECT_EQ(MinImageSize("inception3", {.aux_logits = false}), 75);
  EXPECT_EQ(MinImageSize("inception3-noaux"), 75);
  EXPECT_EQ(MinImageSize("vgg16"), 224);
  EXPECT_EQ(MinImageSize("resnet50"), 1);
  EXPECT_EQ(MinImageSize("alexnet"), 0);
  // The smallest size each model admits really builds; one less does not.
  for (const std::string& name : ModelNames()) {
    const int64_t min = MinImageSize(name);
    EXPECT_TRUE(BuildModel(name, {.image_size = min}).ok()) << name;
    if (min > 1) {
      EXPECT_FALSE(BuildModel(name, {.image_size = min - 1}).ok()) << name;
    }
  }
}

TEST(ZooTest, UnknownModelListsTheValidOnes) {
  const Status s = BuildStatus("resnet18", {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("unknown model 'resnet18'"));
  for (const std::string& name : ModelNames()) EXPECT_THAT(s.message(), HasSubstr(name));
}

TEST(ZooTest, NumClassesAndDropout) {
  const Graph r = Build("resnet50", {.num_classes = 10});
  EXPECT_THAT(FindParam(r, "fc/weight")->shape, ElementsAre(10, 2048));
  EXPECT_EQ(r.NumParameterElements(), 25'557'032 - 990 * 2048 - 990);
  const Graph v = Build("vgg16", {.num_classes = 10, .dropout = 0.25});
  EXPECT_DOUBLE_EQ(std::get<DropoutParams>(v.layer(v.FindLayer("classifier.2")).params).rate, 0.25);
  EXPECT_TRUE(BuildModel("inception3", {.dropout = 0}).ok());
  EXPECT_THAT(BuildStatus("resnet50", {.num_classes = 0}).message(), HasSubstr("num_classes is 0"));
  EXPECT_THAT(BuildStatus("resnet50", {.dropout = 0.2}).message(),
              HasSubstr("model 'resnet50' has no dropout layer"));
  EXPECT_THAT(BuildStatus("vgg16", {.dropout = 1.0}).message(),
              HasSubstr("dropout rate 1 is outside [0, 1)"));
}

std::set<LayerKind> Kinds(const Graph& g) {
  std::set<LayerKind> kinds;
  for (const Layer& l : g.layers()) kinds.insert(l.kind);
  return kinds;
}

TEST(ZooTest, TinyNetsAreSmallAndCoverEveryLayerKind) {
  using K = LayerKind;
  const ModelConfig ten{.num_classes = 10};
  EXPECT_EQ(Kinds(Build("tiny-mlp", ten)),
            (std::set<K>{K::kInput, K::kFullyConnected, K::kRelu, K::kSoftmaxCrossEntropy}));
  EXPECT_EQ(Kinds(Build("tiny-cnn", ten)),
            (std::set<K>{K::kInput, K::kConv, K::kRelu, K::kMaxPool, K::kFullyConnected,
                         K::kSoftmaxCrossEntropy}));
  const Graph resnet = Build("tiny-resnet", ten);
  EXPECT_TRUE(Kinds(resnet).contains(K::kAdd));
  EXPECT_TRUE(Kinds(resnet).contains(K::kBatchNorm));
  EXPECT_EQ(Out(resnet, "block2"), (ImageShape{12, 4, 4}));
  const Graph inception = Build("tiny-inception", ten);
  EXPECT_EQ(Out(inception, "block"), (ImageShape{18, 8, 8}));
  EXPECT_EQ(Out(inception, "pool"), (ImageShape{18, 4, 4}));
  EXPECT_FALSE(
      std::get<PoolParams>(inception.layer(inception.FindLayer("pool")).params).count_include_pad);
  EXPECT_EQ(inception.loss_layers().size(), 2u);
  EXPECT_EQ(Build("tiny-inception", {.num_classes = 10, .aux_logits = false}).loss_layers().size(),
            1u);

  std::set<K> all;
  for (const char* name : {"tiny-mlp", "tiny-cnn", "tiny-resnet", "tiny-inception"}) {
    const Graph g = Build(name, ten);
    EXPECT_LT(g.NumParameterElements(), 5000) << name;  // cheap finite differences
    EXPECT_EQ(g.input_shape(), (ImageShape{3, 8, 8})) << name;
    const std::set<K> kinds = Kinds(g);
    all.insert(kinds.begin(), kinds.end());
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(K::kSoftmaxCrossEntropy) + 1);
}

}  // namespace
}  // namespace kolo::models::zoo
