// The benchmark's CUDA pieces (--device cuda). Compiled only in builds with CUDA; this header does
// not include a CUDA header.
#pragma once

#include <cstddef>
#include <memory>

#include "benchmarks/allreduce_bench/backend.h"
#include "engine/common/status.h"

namespace kolo::bench::cuda {

// cudaMalloc'd memory on device `local_rank` modulo the devices visible (ranks that outnumber the
// GPUs share them, as kolo-train's do).
StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDeviceBuffer(size_t bytes, int local_rank);

}  // namespace kolo::bench::cuda
