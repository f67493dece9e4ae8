// Inception V3 as torchvision's Inception3 builds it (transform_input off). Every convolution is a
// BasicConv2d: conv without bias, batch norm with epsilon 0.001, ReLU. Layer names follow
// torchvision's module paths: "Mixed_6b.branch7x7_2.conv" and ".bn" for the parts of a
// BasicConv2d, the BasicConv2d's own name for its ReLU, the Inception block's name for its concat.
// InceptionE's nested concatenations (branch3x3, branch3x3dbl) are flattened into the block's one
// concat: the channel order, and so every value, is the same.
#include <fmt/format.h>

#include "models/zoo/families.h"

namespace kolo::models::zoo {
namespace {

class Builder {
 public:
  explicit Builder(Graph& g) : g_(g) {}

  // BasicConv2d with a square kernel.
  int Conv(const std::string& name, int x, int64_t out, int64_t k, int64_t stride = 1,
           int64_t pad = 0) {
    x = g_.Conv(name + ".conv", x, ConvSpec(out, k, k, stride, pad, pad));
    x = g_.BatchNorm(name + ".bn", x, {.epsilon = 0.001});
    return g_.Relu(name, x);
  }
  // BasicConv2d with a kh x kw kernel (1x7, 7x1, 1x3, 3x1), stride 1, padding ph x pw.
  int ConvHW(const std::string& name, int x, int64_t out, int64_t kh, int64_t kw, int64_t ph,
             int64_t pw) {
    x = g_.Conv(name + ".conv", x, ConvSpec(out, kh, kw, 1, ph, pw));
    x = g_.BatchNorm(name + ".bn", x, {.epsilon = 0.001});
    return g_.Relu(name, x);
  }

  // avg_pool2d(kernel_size=3, stride=1, padding=1) (count_include_pad, torch's default), then a
  // 1x1 BasicConv2d: the pooling branch of InceptionA, C and E.
  int PoolBranch(const std::string& block, int x, int64_t out) {
    x = g_.AvgPool(block + ".avg_pool", x, PoolSpec(3, 1, 1));
    return Conv(block + ".branch_pool", x, out, 1);
  }

  int InceptionA(const std::string& n, int x, int64_t pool_features) {
    const int b1 = Conv(n + ".branch1x1", x, 64, 1);
    int b5 = Conv(n + ".branch5x5_1", x, 48, 1);
    b5 = Conv(n + ".branch5x5_2", b5, 64, 5, 1, 2);
    int b3 = Conv(n + ".branch3x3dbl_1", x, 64, 1);
    b3 = Conv(n + ".branch3x3dbl_2", b3, 96, 3, 1, 1);
    b3 = Conv(n + ".branch3x3dbl_3", b3, 96, 3, 1, 1);
    const int bp = PoolBranch(n, x, pool_features);
    return g_.Concat(n, {b1, b5, b3, bp});
  }

  int InceptionB(const std::string& n, int x) {
    const int b3 = Conv(n + ".branch3x3", x, 384, 3, 2);
    int bd = Conv(n + ".branch3x3dbl_1", x, 64, 1);
    bd = Conv(n + ".branch3x3dbl_2", bd, 96, 3, 1, 1);
    bd = Conv(n + ".branch3x3dbl_3", bd, 96, 3, 2);
    const int bp = g_.MaxPool(n + ".max_pool", x, PoolSpec(3, 2));
    return g_.Concat(n, {b3, bd, bp});
  }

  int InceptionC(const std::string& n, int x, int64_t c7) {
    const int b1 = Conv(n + ".branch1x1", x, 192, 1);
    int b7 = Conv(n + ".branch7x7_1", x, c7, 1);
    b7 = ConvHW(n + ".branch7x7_2", b7, c7, 1, 7, 0, 3);
    b7 = ConvHW(n + ".branch7x7_3", b7, 192, 7, 1, 3, 0);
    int bd = Conv(n + ".branch7x7dbl_1", x, c7, 1);
    bd = ConvHW(n + ".branch7x7dbl_2", bd, c7, 7, 1, 3, 0);
    bd = ConvHW(n + ".branch7x7dbl_3", bd, c7, 1, 7, 0, 3);
    bd = ConvHW(n + ".branch7x7dbl_4", bd, c7, 7, 1, 3, 0);
    bd = ConvHW(n + ".branch7x7dbl_5", bd, 192, 1, 7, 0, 3);
    const int bp = PoolBranch(n, x, 192);
    return g_.Concat(n, {b1, b7, bd, bp});
  }

  int InceptionD(const std::string& n, int x) {
    int b3 = Conv(n + ".branch3x3_1", x, 192, 1);
    b3 = Conv(n + ".branch3x3_2", b3, 320, 3, 2);
    int b7 = Conv(n + ".branch7x7x3_1", x, 192, 1);
    b7 = ConvHW(n + ".branch7x7x3_2", b7, 192, 1, 7, 0, 3);
    b7 = ConvHW(n + ".branch7x7x3_3", b7, 192, 7, 1, 3, 0);
    b7 = Conv(n + ".branch7x7x3_4", b7, 192, 3, 2);
    const int bp = g_.MaxPool(n + ".max_pool", x, PoolSpec(3, 2));
    return g_.Concat(n, {b3, b7, bp});
  }

  int InceptionE(const std::string& n, int x) {
    const int b1 = Conv(n + ".branch1x1", x, 320, 1);
    const int b3 = Conv(n + ".branch3x3_1", x, 384, 1);
    const int b3a = ConvHW(n + ".branch3x3_2a", b3, 384, 1, 3, 0, 1);
    const int b3b = ConvHW(n + ".branch3x3_2b", b3, 384, 3, 1, 1, 0);
    int bd = Conv(n + ".branch3x3dbl_1", x, 448, 1);
    bd = Conv(n + ".branch3x3dbl_2", bd, 384, 3, 1, 1);
    const int bda = ConvHW(n + ".branch3x3dbl_3a", bd, 384, 1, 3, 0, 1);
    const int bdb = ConvHW(n + ".branch3x3dbl_3b", bd, 384, 3, 1, 1, 0);
    const int bp = PoolBranch(n, x, 192);
    return g_.Concat(n, {b1, b3a, b3b, bda, bdb, bp});
  }

  // InceptionAux: avg_pool2d(5, stride 3), 1x1 BasicConv2d(128), 5x5 BasicConv2d(768), adaptive
  // average pooling to 1x1, fc; its loss is weighted 0.4.
  void AuxHead(int x, int64_t num_classes) {
    x = g_.AvgPool("AuxLogits.avg_pool", x, PoolSpec(5, 3));
    x = Conv("AuxLogits.conv0", x, 128, 1);
    x = Conv("AuxLogits.conv1", x, 768, 5);
    x = g_.GlobalAvgPool("AuxLogits.avgpool", x);
    ClassifierHead(g_, x, "AuxLogits.fc", "AuxLogits.loss", num_classes, 0.4);
  }

 private:
  Graph& g_;
};

}  // namespace

Graph BuildInception3(const std::string& name, const ModelConfig& config) {
  Graph g(name);
  Builder b(g);
  int x = g.Input("input", {3, config.image_size, config.image_size});
  x = b.Conv("Conv2d_1a_3x3", x, 32, 3, 2);
  x = b.Conv("Conv2d_2a_3x3", x, 32, 3);
  x = b.Conv("Conv2d_2b_3x3", x, 64, 3, 1, 1);
  x = g.MaxPool("maxpool1", x, PoolSpec(3, 2));
  x = b.Conv("Conv2d_3b_1x1", x, 80, 1);
  x = b.Conv("Conv2d_4a_3x3", x, 192, 3);
  x = g.MaxPool("maxpool2", x, PoolSpec(3, 2));
  x = b.InceptionA("Mixed_5b", x, 32);
  x = b.InceptionA("Mixed_5c", x, 64);
  x = b.InceptionA("Mixed_5d", x, 64);
  x = b.InceptionB("Mixed_6a", x);
  x = b.InceptionC("Mixed_6b", x, 128);
  x = b.InceptionC("Mixed_6c", x, 160);
  x = b.InceptionC("Mixed_6d", x, 160);
  x = b.InceptionC("Mixed_6e", x, 192);
  if (config.aux_logits) b.AuxHead(x, config.num_classes);
  x = b.InceptionD("Mixed_7a", x);
  x = b.InceptionE("Mixed_7b", x);
  x = b.InceptionE("Mixed_7c", x);
  x = g.GlobalAvgPool("avgpool", x);
  x = g.Dropout("dropout", x, {.rate = config.dropout});
  ClassifierHead(g, x, "fc", "loss", config.num_classes);
  return g;
}

}  // namespace kolo::models::zoo
