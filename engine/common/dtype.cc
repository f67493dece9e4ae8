#include "engine/common/dtype.h"

#include <fmt/format.h>

namespace kolo {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kFloat16:
      return 2;
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
    case DataType::kUInt8:
      return 1;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUInt8:
      return "uint8";
  }
  return "unknown";
}

StatusOr<DataType> ParseDataType(std::string_view name) {
  for (DataType d : AllDataTypes()) {
    if (name == DataTypeName(d)) return d;
  }
  if (name == "fp32" || name == "f32" || name == "float") return DataType::kFloat32;
  if (name == "fp64" || name == "f64" || name == "double") return DataType::kFloat64;
  if (name == "fp16" || name == "half") return DataType::kFloat16;
  if (name == "bf16") return DataType::kBFloat16;
  return InvalidArgument(
      "unknown dtype '{}': allowed are float32, float64, float16, bfloat16, int32, int64, uint8",
      name);
}

const std::vector<DataType>& AllDataTypes() {
  static const std::vector<DataType> kAll = {
      DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
      DataType::kInt32,   DataType::kInt64,   DataType::kUInt8};
  return kAll;
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ",")); }

}  // namespace kolo
