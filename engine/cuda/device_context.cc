#include "engine/cuda/device_context.h"

#include <algorithm>
#include <vector>

#include "engine/common/logging.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels.h"
#include "engine/kernels/reduce.h"

namespace kolo::cuda {
namespace {

static_assert(sizeof(CopyDesc) == sizeof(fusion::CopyEntry), "descriptor layouts must match");

ElementKind KindOf(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return ElementKind::kFloat32;
    case DataType::kFloat64:
      return ElementKind::kFloat64;
    case DataType::kFloat16:
      return ElementKind::kFloat16;
    case DataType::kBFloat16:
      return ElementKind::kBFloat16;
    case DataType::kInt32:
      return ElementKind::kInt32;
    case DataType::kInt64:
      return ElementKind::kInt64;
    case DataType::kUInt8:
      return ElementKind::kUInt8;
  }
  return ElementKind::kUInt8;
}

class CudaDeviceContext final : public DeviceContext {
 public:
  CudaDeviceContext(int device, std::chrono::milliseconds timeout)
      : device_(device), timeout_(timeout) {}

  ~CudaDeviceContext() override {
    CurrentDeviceGuard guard;
    if (cudaSetDevice(device_) != cudaSuccess) return;
    if (stream_ != nullptr) {
      // Work may still read the buffers below after a failed collective: let it drain first.
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (done_ != nullptr) cudaEventDestroy(done_);
    cudaFree(fusion_);
    cudaFree(descs_);
  }

  Status Init() {
    CurrentDeviceGuard guard;
    KOLO_RETURN_IF_ERROR(Activate());
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KOLO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    return Status::OK();
  }

  int device() const override { return device_; }
  void* stream() const override { return stream_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  Status Activate() override {
    KOLO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    return Status::OK();
  }

  Status WaitEvent(void* event) override {
    if (event == nullptr) return Status::OK();
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0));
    return Status::OK();
  }

  StatusOr<uint8_t*> FusionBuffer(size_t bytes) override {
    if (bytes <= fusion_bytes_) return fusion_;
    KOLO_RETURN_IF_ERROR(Synchronize());
    KOLO_CUDA_RETURN_IF_ERROR(cudaFree(fusion_));
    fusion_ = nullptr;
    fusion_bytes_ = 0;
    // Whole MiB, so that a slowly growing group does not reallocate every step.
    const size_t rounded = (bytes + (1u << 20) - 1) & ~size_t{(1u << 20) - 1};
    void* p = nullptr;
    KOLO_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, rounded));
    fusion_ = static_cast<uint8_t*>(p);
    fusion_bytes_ = rounded;
    KOLO_LOG(kDebug, "device fusion buffer: {} bytes on CUDA device {}", rounded, device_);
    return fusion_;
  }

  Status Pack(const fusion::CopyEntry* entries, size_t n) override {
    size_t max_bytes = 0;
    KOLO_RETURN_IF_ERROR(Upload(entries, n, &max_bytes));
    // Only the non-empty entries were uploaded: launching for all n would read descriptors that
    // are stale (pointers to freed tensors) or, before the first upload, a null descs_.
    if (host_.empty()) return Status::OK();
    KOLO_CUDA_RETURN_IF_ERROR(
        LaunchBatchedCopy(descs_, static_cast<int>(host_.size()), max_bytes, stream_));
    return Status::OK();
  }

  Status Unpack(const fusion::CopyEntry* entries, size_t n, DataType dtype, double scale) override {
    if (scale == 1.0) return Pack(entries, n);
    size_t max_bytes = 0;
    KOLO_RETURN_IF_ERROR(Upload(entries, n, &max_bytes));
    if (host_.empty()) return Status::OK();
    KOLO_CUDA_RETURN_IF_ERROR(LaunchBatchedScaleCopy(descs_, static_cast<int>(host_.size()),
                                                     max_bytes, KindOf(dtype), scale, stream_));
    return Status::OK();
  }

  Status Convert(const fusion::CopyEntry* entries, size_t n, DataType from, DataType to,
                 double scale) override {
    if (!kernels::CanConvert(from, to)) {
      return InvalidArgument(
          "no conversion from {} to {} (compression casts float32 to "
          "float16 or bfloat16 and back)",
          DataTypeName(from), DataTypeName(to));
    }
    size_t max_bytes = 0;
    KOLO_RETURN_IF_ERROR(Upload(entries, n, &max_bytes));
    if (host_.empty()) return Status::OK();
    KOLO_CUDA_RETURN_IF_ERROR(LaunchBatchedConvert(descs_, static_cast<int>(host_.size()),
                                                   max_bytes / DataTypeSize(from), KindOf(from),
                                                   KindOf(to), scale, stream_));
    return Status::OK();
  }

  Status Synchronize() override {
    KOLO_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
    return WaitForEvent(done_, timeout_,
                        fmt::format("waiting for the engine's stream on CUDA device {}", device_));
  }

 private:
  // Copies the descriptors of the non-empty entries to device memory (into host_ first, so that
  // host_.size() is how many there are), in stream order. The source is pageable memory,
  // which cudaMemcpyAsync stages before it returns, so host_ may be refilled at once; the device
  // copy is overwritten only by later work on the same stream, after the kernel that read it.
  Status Upload(const fusion::CopyEntry* entries, size_t n, size_t* max_bytes) {
    host_.clear();
    for (size_t i = 0; i < n; ++i) {
      if (entries[i].bytes == 0) continue;
      host_.push_back(CopyDesc{entries[i].src, entries[i].dst, entries[i].bytes});
      *max_bytes = std::max(*max_bytes, entries[i].bytes);
    }
    if (host_.empty()) return Status::OK();
    if (host_.size() > descs_capacity_) {
      KOLO_RETURN_IF_ERROR(Synchronize());
      KOLO_CUDA_RETURN_IF_ERROR(cudaFree(descs_));
      descs_ = nullptr;
      descs_capacity_ = 0;
      const size_t capacity = std::max<size_t>(host_.size() * 2, 256);
      void* p = nullptr;
      KOLO_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, capacity * sizeof(CopyDesc)));
      descs_ = static_cast<CopyDesc*>(p);
      descs_capacity_ = capacity;
    }
    KOLO_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(descs_, host_.data(), host_.size() * sizeof(CopyDesc),
                                              cudaMemcpyHostToDevice, stream_));
    return Status::OK();
  }

  const int device_;
  const std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  uint8_t* fusion_ = nullptr;
  size_t fusion_bytes_ = 0;
  CopyDesc* descs_ = nullptr;
  size_t descs_capacity_ = 0;
  std::vector<CopyDesc> host_;
};

}  // namespace

int DeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    if (why != nullptr) *why = CudaError("cudaGetDeviceCount", rc).message();
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "no CUDA device is visible to this process";
  return count;
}

StatusOr<std::unique_ptr<DeviceContext>> CreateDeviceContext(int device,
                                                             std::chrono::milliseconds timeout) {
  std::string why;
  const int count = DeviceCount(&why);
  if (device < 0 || device >= count) {
    return InvalidArgument("CUDA device {} does not exist: this process sees {} device(s){}",
                           device, count, why.empty() ? "" : " (" + why + ")");
  }
  auto ctx = std::make_unique<CudaDeviceContext>(device, timeout);
  Status s = ctx->Init();
  if (!s.ok()) return s.WithContext(fmt::format("setting up CUDA device {}", device));
  return std::unique_ptr<DeviceContext>(std::move(ctx));
}

}  // namespace kolo::cuda
