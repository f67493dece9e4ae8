#include "engine/backends/ps/wire.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <unordered_set>

namespace kolo::backends::ps {

const char* KindName(uint32_t kind) {
  switch (static_cast<Kind>(kind)) {
    case Kind::kRegister:
      return "register";
    case Kind::kRegistered:
      return "registered";
    case Kind::kPush:
      return "push";
    case Kind::kPull:
      return "pull";
    case Kind::kBye:
      return "bye";
    case Kind::kInit:
      return "init";
  }
  return "unknown";
}

Status ValidateRegistration(const Registration& r) {
  std::unordered_set<std::string> names;
  for (size_t i = 0; i < r.vars.size(); ++i) {
    const VariableSpec& v = r.vars[i];
    if (v.name.empty()) return InvalidArgument("variable {} of the registration has no name", i);
    if (!names.insert(v.name).second) {
      return InvalidArgument("variable '{}' is registered twice: names must be distinct", v.name);
    }
    if (v.dtype != DataType::kFloat32) {
      return InvalidArgument(
          "variable '{}' is {}: parameter servers update float32 variables only (keep float32 "
          "master weights)",
          v.name, DataTypeName(v.dtype));
    }
    for (int64_t d : v.shape) {
      if (d < 0) {
        return InvalidArgument("variable '{}': shape {} has a negative dimension", v.name,
                               ShapeToString(v.shape));
      }
    }
  }
  return Status::OK();
}

std::vector<uint8_t> SerializeRegistration(const Registration& r) {
  nlohmann::json j;
  j["servers"] = r.servers;
  j["placement"] = PlacementPolicyName(r.policy);
  j["split_min_bytes"] = r.split_min_bytes;
  j["chunk_bytes"] = r.chunk_bytes;
  j["push_dtype"] = DataTypeName(r.push_dtype);
  nlohmann::json vars = nlohmann::json::array();
  for (const VariableSpec& v : r.vars) {
    vars.push_back({{"name", v.name}, {"dtype", DataTypeName(v.dtype)}, {"shape", v.shape}});
  }
  j["variables"] = std::move(vars);
  const std::string text = j.dump();
  return {text.begin(), text.end()};
}

StatusOr<Registration> ParseRegistration(const std::vector<uint8_t>& bytes) {
  try {
    const auto j = nlohmann::json::parse(bytes.begin(), bytes.end());
    Registration r;
    r.servers = j.at("servers").get<int>();
    KOLO_ASSIGN_OR_RETURN(r.policy, ParsePlacementPolicy(j.at("placement").get<std::string>()));
    r.split_min_bytes = j.at("split_min_bytes").get<int64_t>();
    r.chunk_bytes = j.at("chunk_bytes").get<int64_t>();
    KOLO_ASSIGN_OR_RETURN(r.push_dtype, ParseDataType(j.at("push_dtype").get<std::string>()));
    if (r.push_dtype != DataType::kFloat32 && r.push_dtype != DataType::kFloat16 &&
        r.push_dtype != DataType::kBFloat16) {
      return ProtocolError("registration pushes {}: allowed are float32, float16, bfloat16",
                           DataTypeName(r.push_dtype));
    }
    if (r.chunk_bytes < 4 || r.chunk_bytes % 4 != 0 || r.split_min_bytes < 1 || r.servers < 1) {
      return ProtocolError("registration has servers {}, chunk {} bytes, split minimum {} bytes",
                           r.servers, r.chunk_bytes, r.split_min_bytes);
    }
    for (const auto& v : j.at("variables")) {
      VariableSpec spec;
      spec.name = v.at("name").get<std::string>();
      KOLO_ASSIGN_OR_RETURN(spec.dtype, ParseDataType(v.at("dtype").get<std::string>()));
      spec.shape = v.at("shape").get<Shape>();
      r.vars.push_back(std::move(spec));
    }
    KOLO_RETURN_IF_ERROR(ValidateRegistration(r));
    return r;
  } catch (const nlohmann::json::exception& e) {
    return ProtocolError("malformed registration: {}", e.what());
  }
}

std::string DescribeDifference(const Registration& mine, const Registration& theirs) {
  if (mine.servers != theirs.servers) {
    return fmt::format("servers: {} vs {}", mine.servers, theirs.servers);
  }
  if (mine.policy != theirs.policy) {
    return fmt::format("placement: {} vs {}", PlacementPolicyName(mine.policy),
                       PlacementPolicyName(theirs.policy));
  }
  if (mine.chunk_bytes != theirs.chunk_bytes) {
    return fmt::format("chunk bytes (KOLO_RING_CHUNK_BYTES): {} vs {}", mine.chunk_bytes,
                       theirs.chunk_bytes);
  }
  if (mine.push_dtype != theirs.push_dtype) {
    return fmt::format("push dtype (KOLO_COMPRESSION): {} vs {}", DataTypeName(mine.push_dtype),
                       DataTypeName(theirs.push_dtype));
  }
  if (mine.split_min_bytes != theirs.split_min_bytes) {
    return fmt::format("split minimum: {} vs {} bytes", mine.split_min_bytes,
                       theirs.split_min_bytes);
  }
  const size_t n = std::min(mine.vars.size(), theirs.vars.size());
  for (size_t i = 0; i < n; ++i) {
    const VariableSpec& a = mine.vars[i];
    const VariableSpec& b = theirs.vars[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape) {
      return fmt::format("variable {}: '{}' {} {} vs '{}' {} {}", i, a.name, DataTypeName(a.dtype),
                         ShapeToString(a.shape), b.name, DataTypeName(b.dtype),
                         ShapeToString(b.shape));
    }
  }
  if (mine.vars.size() != theirs.vars.size()) {
    return fmt::format("{} vs {} variables", mine.vars.size(), theirs.vars.size());
  }
  return "";
}

}  // namespace kolo::backends::ps
