// Gradient copies to host for the parameter servers, overlapped with backward: each copy is queued
// on a side stream behind its layer's grads_ready event, so neither the host thread nor the compute
// stream waits for it. The gradient buffers are float32 at every precision (mixed precision
// unscales half gradients into them during backward), so a copy never needs a cast.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "models/compute/cudnn/backend_impl.h"
#include "models/compute/cudnn/check.h"

namespace kolo::models::compute::cudnn {
namespace {

class DeviceGradientCopy final : public GradientCopy {
 public:
  DeviceGradientCopy(cudaEvent_t copied, int device, std::string name)
      : copied_(copied), device_(device), name_(std::move(name)) {}

  Status Wait(std::chrono::milliseconds timeout) override {
    // Polled rather than cudaEventSynchronize'd so that the wait has a bound.
    KOLO_CUDA_CHECK(cudaSetDevice(device_));
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(10);
    for (;;) {
      const cudaError_t e = cudaEventQuery(copied_);
      if (e == cudaSuccess) return Status::OK();
      if (e != cudaErrorNotReady) {
        return Internal("cudnn backend: the copy of the gradient of '{}' to host failed: {} ({})",
                        name_, cudaGetErrorString(e), cudaGetErrorName(e));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return DeadlineExceeded(
            "cudnn backend: the copy of the gradient of '{}' to host has not completed after {} "
            "ms (is the device stuck?)",
            name_, timeout.count());
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(2 * pause, std::chrono::microseconds(200));
    }
  }

 private:
  cudaEvent_t copied_;  // owned by the backend
  int device_;
  std::string name_;
};

}  // namespace

StatusOr<std::span<float>> CudnnBackend::HostStagingBuffer(int param) {
  KOLO_RETURN_IF_ERROR(CheckReady("HostStagingBuffer"));
  if (param < 0 || param >= static_cast<int>(params_.size())) {
    return InvalidArgument(
        "cudnn backend: HostStagingBuffer: parameter {} does not exist; the graph has {}", param,
        params_.size());
  }
  if (staging_.empty()) staging_.resize(params_.size());
  ParamStaging& s = staging_[static_cast<size_t>(param)];
  const int64_t numel = params_[static_cast<size_t>(param)].numel;
  if (!s.host) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(numel, 1)) * sizeof(float);
    KOLO_CUDA_CHECK(cudaHostAlloc(s.host.out(), bytes, cudaHostAllocDefault));
  }
  return std::span<float>(static_cast<float*>(s.host.get()), static_cast<size_t>(numel));
}

StatusOr<std::unique_ptr<GradientCopy>> CudnnBackend::StartGradientCopy(int param,
                                                                        std::span<float> out) {
  KOLO_RETURN_IF_ERROR(CheckParam(param, out.size(), "StartGradientCopy"));
  if (!copy_stream_) {
    KOLO_CUDA_CHECK(cudaStreamCreateWithFlags(copy_stream_.out(), cudaStreamNonBlocking));
  }
  if (staging_.empty()) staging_.resize(params_.size());
  ParamStaging& s = staging_[static_cast<size_t>(param)];
  if (!s.copied) KOLO_CUDA_CHECK(cudaEventCreateWithFlags(s.copied.out(), cudaEventDisableTiming));
  const Parameter& meta = graph_->params()[static_cast<size_t>(param)];
  const ParamState& p = params_[static_cast<size_t>(param)];
  cudaStream_t cs = copy_stream_.get();
  // grads_ready was recorded at the end of the layer's latest Backward: the copy starts once the
  // device has run it, and whatever the compute stream queues afterwards runs alongside.
  KOLO_CUDA_CHECK(
      cudaStreamWaitEvent(cs, layers_[static_cast<size_t>(meta.layer)].grads_ready.get(), 0));
  // Into pinned memory (HostStagingBuffer) this is a DMA that returns at once; into pageable
  // memory CUDA copies synchronously, which is correct but blocks this thread.
  KOLO_CUDA_CHECK(cudaMemcpyAsync(out.data(), p.g, out.size_bytes(), cudaMemcpyDeviceToHost, cs));
  KOLO_CUDA_CHECK(cudaEventRecord(s.copied.get(), cs));
  return std::unique_ptr<GradientCopy>(
      std::make_unique<DeviceGradientCopy>(s.copied.get(), config_.device, meta.name));
}

}  // namespace kolo::models::compute::cudnn
