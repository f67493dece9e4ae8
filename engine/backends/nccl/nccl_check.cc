#include "engine/backends/nccl/nccl_check.h"

#include <fmt/format.h>

#include <string>

namespace kolo::backends {

Status NcclError(const char* call, ncclResult_t rc, ncclComm_t comm) {
  std::string detail = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  const StatusCode code =
      rc == ncclInvalidUsage || rc == ncclInvalidArgument
          ? StatusCode::kInvalidArgument
          : (rc == ncclRemoteError || rc == ncclSystemError ? StatusCode::kUnavailable
                                                            : StatusCode::kInternal);
  return Status(code, fmt::format("{} failed: {} (code {}){}", call, ncclGetErrorString(rc),
                                  static_cast<int>(rc), detail.empty() ? "" : ": " + detail));
}

StatusOr<ncclDataType_t> NcclType(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kUInt8:
      return ncclUint8;
  }
  return InvalidArgument("dtype {} has no NCCL equivalent", DataTypeName(dtype));
}

}  // namespace kolo::backends
