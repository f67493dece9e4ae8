// CUDA runtime error conversion and bounded waits, shared by the engine's CUDA sources (internal
// to engine/cuda and the backends that run on CUDA streams).
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <string>

#include "engine/common/status.h"

namespace kolo::cuda {

// "<call> failed: <description> (<cudaError name>, code <n>)".
Status CudaError(const char* call, cudaError_t code);

// Blocks until `event` has completed, sleeping between queries (no spinning): a few microseconds
// at first, backing off to 1 ms. DeadlineExceeded naming `what` once `timeout` has passed.
Status WaitForEvent(cudaEvent_t event, std::chrono::milliseconds timeout, const std::string& what);

// Restores the calling thread's current CUDA device when it goes out of scope, so that the
// engine's CUDA calls on a caller's thread (set-up, tear-down) leave the caller's device alone.
class CurrentDeviceGuard {
 public:
  CurrentDeviceGuard() { saved_ = cudaGetDevice(&previous_) == cudaSuccess; }
  ~CurrentDeviceGuard() {
    if (saved_) cudaSetDevice(previous_);
  }
  CurrentDeviceGuard(const CurrentDeviceGuard&) = delete;
  CurrentDeviceGuard& operator=(const CurrentDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool saved_ = false;
};

}  // namespace kolo::cuda

// Returns from the enclosing function with CudaError if `call` does not return cudaSuccess.
#define KOLO_CUDA_RETURN_IF_ERROR(call)                                                     \
  do {                                                                                      \
    const cudaError_t kolo_cuda_rc_ = (call);                                               \
    if (kolo_cuda_rc_ != cudaSuccess) return ::kolo::cuda::CudaError(#call, kolo_cuda_rc_); \
  } while (0)
