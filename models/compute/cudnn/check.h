// One checking macro per vendor library of the GPU backend: each converts a failed call into a
// kolo Status that names the call and the vendor's code, and returns it from the enclosing
// function. Only for functions that return Status (or StatusOr).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "engine/common/status.h"

namespace kolo::models::compute::cudnn {

const char* CublasStatusName(cublasStatus_t s);

}  // namespace kolo::models::compute::cudnn

#define KOLO_CUDA_CHECK(call)                                                                      \
  do {                                                                                             \
    cudaError_t kolo_cuda_err_ = (call);                                                           \
    if (kolo_cuda_err_ != cudaSuccess) {                                                           \
      return ::kolo::Internal("{} failed: {} ({}, code {})", #call,                                \
                              cudaGetErrorString(kolo_cuda_err_),                                  \
                              cudaGetErrorName(kolo_cuda_err_), static_cast<int>(kolo_cuda_err_)); \
    }                                                                                              \
  } while (0)

#define KOLO_CUDNN_CHECK(call)                                     \
  do {                                                             \
    cudnnStatus_t kolo_cudnn_st_ = (call);                         \
    if (kolo_cudnn_st_ != CUDNN_STATUS_SUCCESS) {                  \
      return ::kolo::Internal("{} failed: {} (code {})", #call,    \
                              cudnnGetErrorString(kolo_cudnn_st_), \
                              static_cast<int>(kolo_cudnn_st_));   \
    }                                                              \
  } while (0)

#define KOLO_CUBLAS_CHECK(call)                                                                  \
  do {                                                                                           \
    cublasStatus_t kolo_cublas_st_ = (call);                                                     \
    if (kolo_cublas_st_ != CUBLAS_STATUS_SUCCESS) {                                              \
      return ::kolo::Internal("{} failed: {} (code {})", #call,                                  \
                              ::kolo::models::compute::cudnn::CublasStatusName(kolo_cublas_st_), \
                              static_cast<int>(kolo_cublas_st_));                                \
    }                                                                                            \
  } while (0)
