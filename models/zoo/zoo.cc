#include "models/zoo/zoo.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "models/zoo/families.h"

namespace kolo::models::zoo {
namespace {

struct Entry {
  const char* name;
  int64_t default_size;
  int64_t min_size;        // without an auxiliary head
  int64_t min_size_aux;    // with one (models that have none: min_size)
  double default_dropout;  // -1: the model has no dropout layer
  Graph (*build)(const ModelConfig&);
};

constexpr double kNoDropout = -1;

const Entry kModels[] = {
    {"vgg16", 224, 224, 224, 0.5, BuildVgg16},
    {"resnet50", 224, 1, 1, kNoDropout,
     [](const ModelConfig& c) {
       return BuildResNet("resnet50", {3, 4, 6, 3}, c);
     }},
    {"resnet101", 224, 1, 1, kNoDropout,
     [](const ModelConfig& c) {
       return BuildResNet("resnet101", {3, 4, 23, 3}, c);
     }},
    {"resnet152", 224, 1, 1, kNoDropout,
     [](const ModelConfig& c) {
       return BuildResNet("resnet152", {3, 8, 36, 3}, c);
     }},
    {"inception3", 299, 75, 299, 0.5,
     [](const ModelConfig& c) {
       return BuildInception3(c.aux_logits ? "inception3" : "inception3-noaux", c);
     }},
    {"inception3-noaux", 299, 75, 75, 0.5,
     [](const ModelConfig& c) {
       ModelConfig noaux = c;
       noaux.aux_logits = false;
       return BuildInception3("inception3-noaux", noaux);
     }},
    {"tiny-mlp", 8, 1, 1, kNoDropout, BuildTinyMlp},
    {"tiny-cnn", 8, 4, 4, kNoDropout, BuildTinyCnn},
    {"tiny-resnet", 8, 1, 1, kNoDropout, BuildTinyResNet},
    {"tiny-inception", 8, 1, 1, 0.5, BuildTinyInception},
};

const Entry* Find(const std::string& name) {
  for (const Entry& e : kModels) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

int64_t MinSize(const Entry& e, const ModelConfig& config) {
  const bool aux = config.aux_logits && std::string(e.name) != "inception3-noaux";
  return aux ? e.min_size_aux : e.min_size;
}

Status CheckImageSize(const Entry& e, const ModelConfig& config, int64_t size) {
  const int64_t min = MinSize(e, config);
  if (size < min) {
    if (min != e.min_size) {
      return InvalidArgument(
          "model '{}' with its auxiliary head needs an image size of at least {} (got {}); "
          "without the head (aux_logits off, or model '{}-noaux') the smallest is {}",
          e.name, min, size, e.name, e.min_size);
    }
    return InvalidArgument("model '{}' needs an image size of at least {} (got {})", e.name, min,
                           size);
  }
  if (std::string(e.name) == "vgg16" && (size / 32) % 7 != 0) {
    // Only there is torchvision's adaptive 7x7 pooling a plain pooling the IR can express.
    const int64_t below = size / 32 / 7 * 7 * 32;
    const int64_t above = (size / 32 / 7 + 1) * 7 * 32;
    return InvalidArgument(
        "model 'vgg16' takes image sizes whose feature map (size / 32, rounded down) is a "
        "multiple of 7, such as 224..255 or 448..479; got {} (nearest allowed: {} or {}); the "
        "smallest is 224",
        size, below, above);
  }
  return Status::OK();
}

}  // namespace

std::vector<std::string> ModelNames() {
  std::vector<std::string> names;
  for (const Entry& e : kModels) names.emplace_back(e.name);
  return names;
}

int64_t DefaultImageSize(const std::string& name) {
  const Entry* e = Find(name);
  return e ? e->default_size : 0;
}

int64_t MinImageSize(const std::string& name, const ModelConfig& config) {
  const Entry* e = Find(name);
  return e ? MinSize(*e, config) : 0;
}

StatusOr<Graph> BuildModel(const std::string& name, const ModelConfig& config) {
  const Entry* e = Find(name);
  if (e == nullptr) {
    return InvalidArgument("unknown model '{}'; the models are {}", name,
                           fmt::join(ModelNames(), ", "));
  }
  ModelConfig resolved = config;
  if (resolved.image_size == 0) resolved.image_size = e->default_size;
  if (resolved.image_size < 0) {
    return InvalidArgument("model '{}': image size {} is negative; use 0 for the default {}", name,
                           resolved.image_size, e->default_size);
  }
  KOLO_RETURN_IF_ERROR(CheckImageSize(*e, resolved, resolved.image_size));
  if (resolved.num_classes <= 0) {
    return InvalidArgument("model '{}': num_classes is {}; it must be at least 1", name,
                           resolved.num_classes);
  }
  if (resolved.dropout == -1) {
    resolved.dropout = e->default_dropout;
  } else if (e->default_dropout == kNoDropout) {
    return InvalidArgument("model '{}' has no dropout layer; leave the dropout rate at -1 (got {})",
                           name, resolved.dropout);
  } else if (!(resolved.dropout >= 0 && resolved.dropout < 1)) {
    return InvalidArgument("model '{}': dropout rate {} is outside [0, 1) (-1 = the default {})",
                           name, resolved.dropout, e->default_dropout);
  }
  Graph graph = e->build(resolved);
  const Status s = graph.Finish();
  if (!s.ok()) {
    return s.WithContext(fmt::format("model '{}' at image size {}", name, resolved.image_size));
  }
  return graph;
}

}  // namespace kolo::models::zoo
