// Owning wrappers for cuDNN descriptors and CUDA objects: each destroys what it holds when it goes
// out of scope, so a backend that fails half-way through Prepare leaks nothing.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <utility>

namespace kolo::models::compute::cudnn {

// Holds one handle of type T created by the caller and destroyed with Destroy. Movable only.
template <typename T, auto Destroy>
class Owned {
 public:
  Owned() = default;
  ~Owned() { Reset(); }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Owned(Owned&& o) noexcept : h_(std::exchange(o.h_, T{})) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      Reset();
      h_ = std::exchange(o.h_, T{});
    }
    return *this;
  }

  T get() const { return h_; }
  // For the vendor's Create(&handle) calls. REQUIRES: empty.
  T* out() { return &h_; }
  explicit operator bool() const { return h_ != T{}; }
  void Reset() {
    if (h_ != T{}) Destroy(h_);
    h_ = T{};
  }

 private:
  T h_{};
};

using TensorDesc = Owned<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDesc = Owned<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvDesc = Owned<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;
using PoolDesc = Owned<cudnnPoolingDescriptor_t, cudnnDestroyPoolingDescriptor>;
using CudnnHandle = Owned<cudnnHandle_t, cudnnDestroy>;
using Stream = Owned<cudaStream_t, cudaStreamDestroy>;
using Event = Owned<cudaEvent_t, cudaEventDestroy>;
using DevicePtr = Owned<void*, cudaFree>;
using PinnedPtr = Owned<void*, cudaFreeHost>;  // cudaHostAlloc'd host memory

}  // namespace kolo::models::compute::cudnn
