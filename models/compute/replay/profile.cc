#include "models/compute/replay/profile.h"

#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/common/file.h"

namespace kolo::models::compute::replay {
namespace {

constexpr const char* kFormat = "kolo-replay-profile";
constexpr int kVersion = 1;

using Json = nlohmann::json;

// Reads field `key` of `obj` as T, with an error naming the field and the expected type.
template <typename T>
Status Field(const Json& obj, const char* key, const std::string& where, const char* type, T* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return InvalidArgument("{}: missing field '{}'", where, key);
  bool good = false;
  if constexpr (std::is_same_v<T, std::string>) {
    good = it->is_string();
  } else if constexpr (std::is_same_v<T, double>) {
    good = it->is_number();
  } else {
    good = it->is_number_integer();
  }
  if (!good)
    return InvalidArgument("{}: field '{}' must be {}, got {}", where, key, type, it->dump());
  *out = it->get<T>();
  return Status::OK();
}

Status CheckTime(double ms, const std::string& where, const char* key) {
  if (!std::isfinite(ms) || ms < 0 || ms > 3.6e6) {
    return InvalidArgument("{}: '{}' = {} is not a time in [0, 3600000] ms", where, key, ms);
  }
  return Status::OK();
}

}  // namespace

std::string ProfileToJson(const Profile& p) {
  // Written by hand, one layer per line, so that profiles diff well under version control.
  auto q = [](const std::string& s) { return Json(s).dump(); };
  std::string out = "{\n";
  out += fmt::format("  \"format\": {},\n  \"version\": {},\n", q(kFormat), kVersion);
  out += fmt::format("  \"model\": {},\n  \"image_size\": {},\n  \"num_classes\": {},\n",
                     q(p.model), p.image_size, p.num_classes);
  out += fmt::format("  \"batch_size\": {},\n  \"precision\": {},\n  \"compute\": {},\n",
                     p.batch_size, q(p.precision), q(p.compute));
  out += fmt::format("  \"device\": {},\n  \"kolo_commit\": {},\n  \"steps\": {},\n", q(p.device),
                     q(p.kolo_commit), p.steps);
  out += fmt::format("  \"update_ms\": {:.6g},\n  \"timing\": {},\n", p.update_ms, q(p.timing));
  if (p.step_ms > 0) out += fmt::format("  \"step_ms\": {:.6g},\n", p.step_ms);
  out += "  \"layers\": [";
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const LayerTiming& l = p.layers[i];
    out += fmt::format("{}\n    {{\"name\": {}, \"forward_ms\": {:.6g}, \"backward_ms\": {:.6g}",
                       i == 0 ? "" : ",", q(l.name), l.forward_ms, l.backward_ms);
    if (l.forward_issue_ms >= 0 && l.backward_issue_ms >= 0) {
      out += fmt::format(", \"forward_issue_ms\": {:.6g}, \"backward_issue_ms\": {:.6g}",
                         l.forward_issue_ms, l.backward_issue_ms);
    }
    out += "}";
  }
  out += "\n  ]\n}\n";
  return out;
}

StatusOr<Profile> ProfileFromJson(const std::string& text, const std::string& origin) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument("{}: not a JSON object (expected a kolo replay profile)", origin);
  }
  std::string format;
  KOLO_RETURN_IF_ERROR(Field(j, "format", origin, "a string", &format));
  if (format != kFormat) {
    return InvalidArgument("{}: 'format' is '{}', expected '{}'", origin, format, kFormat);
  }
  int64_t version = 0;
  KOLO_RETURN_IF_ERROR(Field(j, "version", origin, "an integer", &version));
  if (version != kVersion) {
    return InvalidArgument("{}: profile version {} is not supported (this build reads version {})",
                           origin, version, kVersion);
  }
  Profile p;
  KOLO_RETURN_IF_ERROR(Field(j, "model", origin, "a string", &p.model));
  KOLO_RETURN_IF_ERROR(Field(j, "image_size", origin, "an integer", &p.image_size));
  KOLO_RETURN_IF_ERROR(Field(j, "num_classes", origin, "an integer", &p.num_classes));
  KOLO_RETURN_IF_ERROR(Field(j, "batch_size", origin, "an integer", &p.batch_size));
  KOLO_RETURN_IF_ERROR(Field(j, "precision", origin, "a string", &p.precision));
  KOLO_RETURN_IF_ERROR(Field(j, "compute", origin, "a string", &p.compute));
  KOLO_RETURN_IF_ERROR(Field(j, "device", origin, "a string", &p.device));
  KOLO_RETURN_IF_ERROR(Field(j, "kolo_commit", origin, "a string", &p.kolo_commit));
  KOLO_RETURN_IF_ERROR(Field(j, "steps", origin, "an integer", &p.steps));
  KOLO_RETURN_IF_ERROR(Field(j, "update_ms", origin, "a number", &p.update_ms));
  KOLO_RETURN_IF_ERROR(CheckTime(p.update_ms, origin, "update_ms"));
  if (j.contains("timing")) {
    KOLO_RETURN_IF_ERROR(Field(j, "timing", origin, "a string", &p.timing));
    if (p.timing != "marks" && p.timing != "synchronised") {
      return InvalidArgument("{}: 'timing' is '{}': allowed are marks, synchronised", origin,
                             p.timing);
    }
  }
  if (j.contains("step_ms")) {
    KOLO_RETURN_IF_ERROR(Field(j, "step_ms", origin, "a number", &p.step_ms));
    KOLO_RETURN_IF_ERROR(CheckTime(p.step_ms, origin, "step_ms"));
  }
  if (p.batch_size <= 0) {
    return InvalidArgument("{}: 'batch_size' must be positive, got {}", origin, p.batch_size);
  }
  if (p.compute == "replay") {
    return InvalidArgument("{}: 'compute' is 'replay'; a profile must come from a timed backend",
                           origin);
  }
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array() || layers->empty()) {
    return InvalidArgument("{}: 'layers' must be a non-empty array", origin);
  }
  for (size_t i = 0; i < layers->size(); ++i) {
    const Json& l = (*layers)[i];
    const std::string where = fmt::format("{}: layers[{}]", origin, i);
    if (!l.is_object()) return InvalidArgument("{} is not an object", where);
    LayerTiming t;
    KOLO_RETURN_IF_ERROR(Field(l, "name", where, "a string", &t.name));
    KOLO_RETURN_IF_ERROR(Field(l, "forward_ms", where, "a number", &t.forward_ms));
    KOLO_RETURN_IF_ERROR(Field(l, "backward_ms", where, "a number", &t.backward_ms));
    KOLO_RETURN_IF_ERROR(CheckTime(t.forward_ms, where, "forward_ms"));
    KOLO_RETURN_IF_ERROR(CheckTime(t.backward_ms, where, "backward_ms"));
    if (l.contains("forward_issue_ms") || l.contains("backward_issue_ms")) {
      KOLO_RETURN_IF_ERROR(Field(l, "forward_issue_ms", where, "a number", &t.forward_issue_ms));
      KOLO_RETURN_IF_ERROR(Field(l, "backward_issue_ms", where, "a number", &t.backward_issue_ms));
      KOLO_RETURN_IF_ERROR(CheckTime(t.forward_issue_ms, where, "forward_issue_ms"));
      KOLO_RETURN_IF_ERROR(CheckTime(t.backward_issue_ms, where, "backward_issue_ms"));
    }
    p.layers.push_back(std::move(t));
  }
  return p;
}

StatusOr<Profile> LoadProfile(const std::string& path) {
  // A profile of the largest model is tens of kilobytes; 64 MiB bounds a wrong path (/dev/zero).
  KOLO_ASSIGN_OR_RETURN(std::string text, ReadFileBounded(path, 64 << 20, "replay profile"));
  return ProfileFromJson(text, path);
}

Status SaveProfile(const Profile& profile, const std::string& path) {
  return WriteFileAtomically(path, ProfileToJson(profile), 0644, "profile");
}

Status CheckProfileMatches(const Profile& profile, const Graph& graph, int64_t batch,
                           const std::string& precision, const std::string& origin) {
  auto mismatch = [&](const char* what, const std::string& recorded, const std::string& wanted) {
    return InvalidArgument(
        "replay profile '{}' does not match this run: {} is {} in the profile but {} here; record "
        "a profile for this configuration with --record-profile",
        origin, what, recorded, wanted);
  };
  if (profile.model != graph.name()) return mismatch("the model", profile.model, graph.name());
  if (profile.batch_size != batch) {
    return mismatch("the batch size", std::to_string(profile.batch_size), std::to_string(batch));
  }
  if (profile.precision != precision)
    return mismatch("the precision", profile.precision, precision);
  const ImageShape in = graph.input_shape();
  if (profile.image_size != in.h || profile.image_size != in.w) {
    return mismatch("the image size", std::to_string(profile.image_size), ToString(in));
  }
  for (int l : graph.loss_layers()) {
    const auto* loss = std::get_if<LossParams>(&graph.layer(l).params);
    if (loss != nullptr && loss->num_classes != profile.num_classes) {
      return mismatch("the number of classes", std::to_string(profile.num_classes),
                      std::to_string(loss->num_classes));
    }
  }
  const auto& layers = graph.layers();
  if (profile.layers.size() != layers.size()) {
    return mismatch("the number of layers", std::to_string(profile.layers.size()),
                    std::to_string(layers.size()));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    if (profile.layers[i].name != layers[i].name) {
      return mismatch(fmt::format("layer {}", i).c_str(), "'" + profile.layers[i].name + "'",
                      "'" + layers[i].name + "'");
    }
  }
  return Status::OK();
}

}  // namespace kolo::models::compute::replay
