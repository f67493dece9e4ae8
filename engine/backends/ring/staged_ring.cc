#include "engine/backends/ring/staged_ring.h"

#include <algorithm>
#include <array>
#include <functional>
#include <vector>

#include "engine/cuda/cuda_check.h"

namespace kolo::backends {
namespace {

using cuda::CurrentDeviceGuard;
using cuda::DeviceContext;
using cuda::WaitForEvent;

class StagedRing final : public DeviceCollectives {
 public:
  StagedRing(collectives::Comm* comm, DeviceContext* ctx, collectives::AllreduceAlgorithm algorithm,
             int hosts)
      : comm_(comm), ctx_(ctx), algorithm_(algorithm), hosts_(hosts) {}

  ~StagedRing() override {
    CurrentDeviceGuard guard;
    if (cudaSetDevice(ctx_->device()) != cudaSuccess) return;
    // Copies may still be in flight after a failed collective: drain them before freeing.
    for (cudaStream_t s : {d2h_, h2d_}) {
      if (s != nullptr) {
        cudaStreamSynchronize(s);
        cudaStreamDestroy(s);
      }
    }
    for (cudaEvent_t e : events_) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    regions_ = {};
    for (void* p : slots_) {
      if (p != nullptr) cudaFreeHost(p);
    }
  }

  const char* name() const override { return "ring"; }

  Status Allreduce(void* buf, size_t count, DataType dtype) override {
    const size_t elem = DataTypeSize(dtype);
    // One choice for the whole tensor, so that every chunk of it runs the same algorithm.
    const collectives::AllreduceAlgorithm algorithm =
        algorithm_ == collectives::AllreduceAlgorithm::kAuto
            ? collectives::ChooseAllreduceAlgorithm(count * elem, comm_->size(), hosts_,
                                                    comm_->host_area != nullptr)
            : algorithm_;
    return Run(buf, count * elem, kStagingChunkBytes / elem * elem, /*download=*/true,
               /*upload=*/true, [&](transport::Region& slot, size_t nbytes) {
                 return collectives::AllreduceWith(algorithm, hosts_, *comm_, slot, 0,
                                                   nbytes / elem, dtype, scratch_);
               });
  }

  Status Broadcast(void* buf, size_t nbytes, int root) override {
    const bool is_root = comm_->rank() == root;
    return Run(buf, nbytes, kStagingChunkBytes, /*download=*/is_root, /*upload=*/!is_root,
               [&](transport::Region& slot, size_t n) {
                 return collectives::RingBroadcast(*comm_, slot, 0, n, root);
               });
  }

 private:
  using Wire = std::function<Status(transport::Region&, size_t)>;

  Status Setup() {
    KOLO_RETURN_IF_ERROR(ctx_->Activate());
    if (d2h_ != nullptr) return Status::OK();
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&d2h_, cudaStreamNonBlocking));
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&h2d_, cudaStreamNonBlocking));
    for (cudaEvent_t& e : events_) {
      KOLO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
    for (int s = 0; s < kStagingSlots; ++s) {
      KOLO_CUDA_RETURN_IF_ERROR(
          cudaHostAlloc(&slots_[s], kStagingChunkBytes, cudaHostAllocDefault));
      KOLO_ASSIGN_OR_RETURN(regions_[s], comm_->device->Register(slots_[s], kStagingChunkBytes));
    }
    return Status::OK();
  }

  cudaEvent_t started() const { return events_[0]; }
  cudaEvent_t uploaded_all() const { return events_[1]; }
  cudaEvent_t downloaded(int s) const { return events_[2 + s]; }
  cudaEvent_t uploaded(int s) const { return events_[2 + kStagingSlots + s]; }

  // Moves buf[0, total) through the slots chunk by chunk: download (device to slot), `wire` on the
  // slot, upload (slot to device), as each direction requires.
  Status Run(void* buf, size_t total, size_t chunk, bool download, bool upload, const Wire& wire) {
    // Alone, a rank's buffer already holds the result.
    if (total == 0 || comm_->size() == 1) return Status::OK();
    KOLO_RETURN_IF_ERROR(Setup());
    auto* dev = static_cast<uint8_t*>(buf);
    const size_t chunks = (total + chunk - 1) / chunk;
    auto length = [&](size_t i) { return std::min(chunk, total - i * chunk); };
    const auto stream = static_cast<cudaStream_t>(ctx_->stream());
    // Neither copy may start before the engine's stream has produced the input.
    KOLO_CUDA_RETURN_IF_ERROR(cudaEventRecord(started(), stream));
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(d2h_, started(), 0));
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(h2d_, started(), 0));

    // A slot is refilled only after its previous chunk is back on the device (an event never
    // recorded counts as complete).
    auto queue_download = [&](size_t i) -> Status {
      const int s = static_cast<int>(i % kStagingSlots);
      KOLO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(d2h_, uploaded(s), 0));
      KOLO_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(slots_[s], dev + i * chunk, length(i), cudaMemcpyDeviceToHost, d2h_));
      KOLO_CUDA_RETURN_IF_ERROR(cudaEventRecord(downloaded(s), d2h_));
      return Status::OK();
    };
    if (download) {
      for (size_t i = 0; i < std::min<size_t>(chunks, kStagingSlots); ++i) {
        KOLO_RETURN_IF_ERROR(queue_download(i));
      }
    }
    for (size_t i = 0; i < chunks; ++i) {
      const int s = static_cast<int>(i % kStagingSlots);
      KOLO_RETURN_IF_ERROR(WaitForEvent(
          download ? downloaded(s) : uploaded(s), ctx_->timeout(),
          fmt::format("staging chunk {} of {} on CUDA device {}", i, chunks, ctx_->device())));
      KOLO_RETURN_IF_ERROR(wire(*regions_[s], length(i)));
      if (upload) {
        KOLO_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dev + i * chunk, slots_[s], length(i), cudaMemcpyHostToDevice, h2d_));
        KOLO_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded(s), h2d_));
      }
      if (download && i + kStagingSlots < chunks) {
        KOLO_RETURN_IF_ERROR(queue_download(i + kStagingSlots));
      }
    }
    if (upload) {
      KOLO_CUDA_RETURN_IF_ERROR(cudaEventRecord(uploaded_all(), h2d_));
      KOLO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, uploaded_all(), 0));
    }
    return Status::OK();
  }

  collectives::Comm* const comm_;
  DeviceContext* const ctx_;
  const collectives::AllreduceAlgorithm algorithm_;
  const int hosts_;
  collectives::Scratch scratch_;
  cudaStream_t d2h_ = nullptr;
  cudaStream_t h2d_ = nullptr;
  // started, uploaded_all, downloaded[kStagingSlots], uploaded[kStagingSlots].
  std::array<cudaEvent_t, 2 + 2 * kStagingSlots> events_{};
  std::array<void*, kStagingSlots> slots_{};
  std::array<std::unique_ptr<transport::Region>, kStagingSlots> regions_;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceCollectives>> MakeStagedRing(
    collectives::Comm* comm, cuda::DeviceContext* ctx, collectives::AllreduceAlgorithm algorithm,
    int hosts) {
  return std::unique_ptr<DeviceCollectives>(
      std::make_unique<StagedRing>(comm, ctx, algorithm, hosts));
}

}  // namespace kolo::backends
