#include "benchmarks/allreduce_bench/tensor_sets.h"

#include <algorithm>
#include <utility>

namespace kolo::bench {
namespace {

// Collects parameters in creation (forward) order, as torchvision registers them.
class Builder {
 public:
  void Param(const std::string& name, Shape shape) { tensors_.push_back({name, std::move(shape)}); }
  // Conv2d without bias followed by BatchNorm2d with affine parameters.
  void ConvBn(const std::string& conv, const std::string& bn, int64_t in, int64_t out, int64_t kh,
              int64_t kw) {
    Param(conv + ".weight", {out, in, kh, kw});
    Param(bn + ".weight", {out});
    Param(bn + ".bias", {out});
  }
  // torchvision's BasicConv2d: "<prefix>.conv" (no bias) + "<prefix>.bn".
  void Basic(const std::string& prefix, int64_t in, int64_t out, int64_t kh, int64_t kw) {
    ConvBn(prefix + ".conv", prefix + ".bn", in, out, kh, kw);
  }
  void Linear(const std::string& prefix, int64_t in, int64_t out) {
    Param(prefix + ".weight", {out, in});
    Param(prefix + ".bias", {out});
  }
  // Backprop order: the last layer's gradients are ready first.
  TensorSet Finish(const std::string& model) {
    std::reverse(tensors_.begin(), tensors_.end());
    for (TensorSpec& t : tensors_) t.name = model + "/" + t.name;
    return TensorSet{model, std::move(tensors_)};
  }

 private:
  std::vector<TensorSpec> tensors_;
};

TensorSet ResNet101() {
  Builder b;
  b.ConvBn("conv1", "bn1", 3, 64, 7, 7);
  const int blocks[4] = {3, 4, 23, 3};
  int64_t in = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const int64_t width = 64LL << stage;
    for (int i = 0; i < blocks[stage]; ++i) {
      const std::string p = "layer" + std::to_string(stage + 1) + "." + std::to_string(i);
      b.ConvBn(p + ".conv1", p + ".bn1", in, width, 1, 1);
      b.ConvBn(p + ".conv2", p + ".bn2", width, width, 3, 3);
      b.ConvBn(p + ".conv3", p + ".bn3", width, width * 4, 1, 1);
      if (i == 0) b.ConvBn(p + ".downsample.0", p + ".downsample.1", in, width * 4, 1, 1);
      in = width * 4;
    }
  }
  b.Linear("fc", 2048, 1000);
  return b.Finish("resnet101");
}

TensorSet Vgg16() {
  Builder b;
  // torchvision's "D" configuration; 0 is a max pool, which occupies an index in `features`.
  const int cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};
  int64_t in = 3;
  int index = 0;
  for (int c : cfg) {
    if (c == 0) {
      index += 1;
      continue;
    }
    const std::string p = "features." + std::to_string(index);
    b.Param(p + ".weight", {c, in, 3, 3});
    b.Param(p + ".bias", {c});
    in = c;
    index += 2;  // conv, relu
  }
  b.Linear("classifier.0", 512 * 7 * 7, 4096);
  b.Linear("classifier.3", 4096, 4096);
  b.Linear("classifier.6", 4096, 1000);
  return b.Finish("vgg16");
}

void InceptionA(Builder& b, const std::string& p, int64_t in, int64_t pool_features) {
  b.Basic(p + ".branch1x1", in, 64, 1, 1);
  b.Basic(p + ".branch5x5_1", in, 48, 1, 1);
  b.Basic(p + ".branch5x5_2", 48, 64, 5, 5);
  b.Basic(p + ".branch3x3dbl_1", in, 64, 1, 1);
  b.Basic(p + ".branch3x3dbl_2", 64, 96, 3, 3);
  b.Basic(p + ".branch3x3dbl_3", 96, 96, 3, 3);
  b.Basic(p + ".branch_pool", in, pool_features, 1, 1);
}

void InceptionB(Builder& b, const std::string& p, int64_t in) {
  b.Basic(p + ".branch3x3", in, 384, 3, 3);
  b.Basic(p + ".branch3x3dbl_1", in, 64, 1, 1);
  b.Basic(p + ".branch3x3dbl_2", 64, 96, 3, 3);
  b.Basic(p + ".branch3x3dbl_3", 96, 96, 3, 3);
}

void InceptionC(Builder& b, const std::string& p, int64_t in, int64_t c7) {
  b.Basic(p + ".branch1x1", in, 192, 1, 1);
  b.Basic(p + ".branch7x7_1", in, c7, 1, 1);
  b.Basic(p + ".branch7x7_2", c7, c7, 1, 7);
  b.Basic(p + ".branch7x7_3", c7, 192, 7, 1);
  b.Basic(p + ".branch7x7dbl_1", in, c7, 1, 1);
  b.Basic(p + ".branch7x7dbl_2", c7, c7, 7, 1);
  b.Basic(p + ".branch7x7dbl_3", c7, c7, 1, 7);
  b.Basic(p + ".branch7x7dbl_4", c7, c7, 7, 1);
  b.Basic(p + ".branch7x7dbl_5", c7, 192, 1, 7);
  b.Basic(p + ".branch_pool", in, 192, 1, 1);
}

void InceptionD(Builder& b, const std::string& p, int64_t in) {
  b.Basic(p + ".branch3x3_1", in, 192, 1, 1);
  b.Basic(p + ".branch3x3_2", 192, 320, 3, 3);
  b.Basic(p + ".branch7x7x3_1", in, 192, 1, 1);
  b.Basic(p + ".branch7x7x3_2", 192, 192, 1, 7);
  b.Basic(p + ".branch7x7x3_3", 192, 192, 7, 1);
  b.Basic(p + ".branch7x7x3_4", 192, 192, 3, 3);
}

void InceptionE(Builder& b, const std::string& p, int64_t in) {
  b.Basic(p + ".branch1x1", in, 320, 1, 1);
  b.Basic(p + ".branch3x3_1", in, 384, 1, 1);
  b.Basic(p + ".branch3x3_2a", 384, 384, 1, 3);
  b.Basic(p + ".branch3x3_2b", 384, 384, 3, 1);
  b.Basic(p + ".branch3x3dbl_1", in, 448, 1, 1);
  b.Basic(p + ".branch3x3dbl_2", 448, 384, 3, 3);
  b.Basic(p + ".branch3x3dbl_3a", 384, 384, 1, 3);
  b.Basic(p + ".branch3x3dbl_3b", 384, 384, 3, 1);
  b.Basic(p + ".branch_pool", in, 192, 1, 1);
}

TensorSet InceptionV3() {
  Builder b;
  b.Basic("Conv2d_1a_3x3", 3, 32, 3, 3);
  b.Basic("Conv2d_2a_3x3", 32, 32, 3, 3);
  b.Basic("Conv2d_2b_3x3", 32, 64, 3, 3);
  b.Basic("Conv2d_3b_1x1", 64, 80, 1, 1);
  b.Basic("Conv2d_4a_3x3", 80, 192, 3, 3);
  InceptionA(b, "Mixed_5b", 192, 32);
  InceptionA(b, "Mixed_5c", 256, 64);
  InceptionA(b, "Mixed_5d", 288, 64);
  InceptionB(b, "Mixed_6a", 288);
  InceptionC(b, "Mixed_6b", 768, 128);
  InceptionC(b, "Mixed_6c", 768, 160);
  InceptionC(b, "Mixed_6d", 768, 160);
  InceptionC(b, "Mixed_6e", 768, 192);
  // The auxiliary classifier is registered between Mixed_6e and Mixed_7a.
  b.Basic("AuxLogits.conv0", 768, 128, 1, 1);
  b.Basic("AuxLogits.conv1", 128, 768, 5, 5);
  b.Linear("AuxLogits.fc", 768, 1000);
  InceptionD(b, "Mixed_7a", 768);
  InceptionE(b, "Mixed_7b", 1280);
  InceptionE(b, "Mixed_7c", 2048);
  b.Linear("fc", 2048, 1000);
  return b.Finish("inception3");
}

struct Published {
  const char* model;
  TensorSet (*make)();
  size_t tensors;
  int64_t elements;
};

constexpr Published kModels[] = {
    {"resnet101", &ResNet101, 314, 44549160},
    {"vgg16", &Vgg16, 32, 138357544},
    {"inception3", &InceptionV3, 292, 27161264},
};

}  // namespace

int64_t TensorSet::total_elements() const {
  int64_t n = 0;
  for (const TensorSpec& t : tensors) n += NumElements(t.shape);
  return n;
}

const char* TensorSetNames() { return "resnet101, vgg16, inception3"; }

StatusOr<TensorSet> MakeTensorSet(const std::string& model) {
  for (const Published& p : kModels) {
    if (model != p.model) continue;
    TensorSet set = p.make();
    if (set.tensors.size() != p.tensors || set.total_elements() != p.elements) {
      return Internal("tensor set '{}' has {} tensors with {} parameters; the model has {} with {}",
                      model, set.tensors.size(), set.total_elements(), p.tensors, p.elements);
    }
    return set;
  }
  return InvalidArgument("--tensors '{}' is unknown: allowed are {}", model, TensorSetNames());
}

}  // namespace kolo::bench
