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

double LoadElement(DataType dtype, const void* data, size_t i) {
  switch (dtype) {
    case DataType::kFloat32:
      return static_cast<const float*>(data)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(data)[i];
    case DataType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(data)[i]);
    case DataType::kBFloat16:
      return BFloat16ToFloat(static_cast<const uint16_t*>(data)[i]);
    case DataType::kInt32:
      return static_cast<const int32_t*>(data)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    case DataType::kUInt8:
      return static_cast<const uint8_t*>(data)[i];
  }
  return 0;
}

void StoreElement(DataType dtype, void* data, size_t i, double value) {
  // Integers go through int64 first: a direct double -> uint8 conversion of a value out of range
  // is undefined, while int64 -> narrower integer wraps (C++20).
  switch (dtype) {
    case DataType::kFloat32:
      static_cast<float*>(data)[i] = static_cast<float>(value);
      break;
    case DataType::kFloat64:
      static_cast<double*>(data)[i] = value;
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToHalf(static_cast<float>(value));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(data)[i] = FloatToBFloat16(static_cast<float>(value));
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(data)[i] = static_cast<int32_t>(static_cast<int64_t>(value));
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(data)[i] = static_cast<int64_t>(value);
      break;
    case DataType::kUInt8:
      static_cast<uint8_t*>(data)[i] = static_cast<uint8_t>(static_cast<int64_t>(value));
      break;
  }
}

}  // namespace kolo
