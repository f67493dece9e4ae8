#include "engine/cuda/cuda_check.h"

#include <algorithm>
#include <thread>

namespace kolo::cuda {

Status CudaError(const char* call, cudaError_t code) {
  // Out of memory and a missing device are the caller's to fix; the rest are unexpected.
  const StatusCode kind = code == cudaErrorMemoryAllocation || code == cudaErrorInvalidDevice ||
                                  code == cudaErrorNoDevice || code == cudaErrorInsufficientDriver
                              ? StatusCode::kFailedPrecondition
                              : StatusCode::kInternal;
  return Status(kind, fmt::format("{} failed: {} ({}, code {})", call, cudaGetErrorString(code),
                                  cudaGetErrorName(code), static_cast<int>(code)));
}

Status WaitForEvent(cudaEvent_t event, std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::microseconds(5);
  while (true) {
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaSuccess) return Status::OK();
    if (rc != cudaErrorNotReady) return CudaError("cudaEventQuery", rc).WithContext(what);
    if (std::chrono::steady_clock::now() > deadline) {
      return DeadlineExceeded("{}: the GPU work did not finish within {} ms", what,
                              timeout.count());
    }
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
  }
}

}  // namespace kolo::cuda
