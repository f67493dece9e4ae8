#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "models/compute/cudnn/check.h"
#include "models/compute/cudnn/cudnn_backend.h"

namespace kolo::models::compute::cudnn {

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error for later callers
    return 0;
  }
  return count;
}

StatusOr<std::string> GpuName(int device) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device {} does not exist; this process sees {} device(s)", device,
                           count);
  }
  cudaDeviceProp prop{};
  KOLO_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return std::string(prop.name);
}

StatusOr<int> ComputeCapability(int device) {
  const int count = CudaDeviceCount();
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device {} does not exist; this process sees {} device(s)", device,
                           count);
  }
  int major = 0, minor = 0;
  KOLO_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KOLO_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return major * 10 + minor;
}

const char* CublasStatusName(cublasStatus_t s) {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "unknown cuBLAS status";
}

}  // namespace kolo::models::compute::cudnn
