#include "benchmarks/allreduce_bench/cuda/device_buffer.h"

#include <cuda_runtime.h>

#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_context.h"

namespace kolo::bench::cuda {
namespace {

class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {}
  ~CudaBuffer() override {
    if (data_ == nullptr) return;
    kolo::cuda::CurrentDeviceGuard guard;
    if (cudaSetDevice(device_) == cudaSuccess) cudaFree(data_);
  }

  Status Allocate() {
    KOLO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, bytes_);
    if (rc != cudaSuccess) {
      return kolo::cuda::CudaError("cudaMalloc", rc)
          .WithContext(fmt::format("--device cuda: {} bytes on CUDA device {}", bytes_, device_));
    }
    data_ = static_cast<uint8_t*>(p);
    // Never time or check an uninitialised buffer: every byte is written before the first row.
    KOLO_CUDA_RETURN_IF_ERROR(cudaMemset(data_, 0xff, bytes_));
    KOLO_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return Status::OK();
  }

  BenchBuffer view() const override { return BenchBuffer{data_, bytes_, device_}; }

  // Synchronous copies (the default stream synchronises with the engine's non-blocking streams
  // only through the device sync below, so that no row starts on a half-copied input).
  Status CopyFromHost(const void* src) override {
    KOLO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KOLO_CUDA_RETURN_IF_ERROR(cudaMemcpy(data_, src, bytes_, cudaMemcpyHostToDevice));
    KOLO_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    return Status::OK();
  }

  Status CopyToHost(void* dst) override {
    KOLO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KOLO_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    KOLO_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, data_, bytes_, cudaMemcpyDeviceToHost));
    return Status::OK();
  }

 private:
  int device_;
  size_t bytes_;
  uint8_t* data_ = nullptr;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDeviceBuffer(size_t bytes, int local_rank) {
  std::string why;
  const int n = kolo::cuda::DeviceCount(&why);
  if (n == 0) return FailedPrecondition("--device cuda: no CUDA device ({})", why);
  auto buf = std::make_unique<CudaBuffer>(local_rank % n, bytes);
  KOLO_RETURN_IF_ERROR(buf->Allocate());
  return std::unique_ptr<DeviceBuffer>(std::move(buf));
}

}  // namespace kolo::bench::cuda
