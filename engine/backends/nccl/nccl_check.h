// NCCL's return codes and types in kolo's terms, for the engine's NCCL backend and the benchmark's
// NCCL peer (internal to the folders that include <nccl.h>).
#pragma once

#include <nccl.h>

#include "engine/common/dtype.h"
#include "engine/common/status.h"

namespace kolo::backends {

// "<call> failed: <NCCL's text> (code <n>)[: <NCCL's last error>]": InvalidArgument for NCCL's
// invalid usage or argument (two ranks on one GPU among them), Unavailable for a remote or
// system error, Internal otherwise. `comm` may be null.
Status NcclError(const char* call, ncclResult_t rc, ncclComm_t comm);

// NCCL's type for `dtype`; InvalidArgument for one NCCL has not.
StatusOr<ncclDataType_t> NcclType(DataType dtype);

}  // namespace kolo::backends
