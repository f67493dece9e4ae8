// NCCL for device tensors. The communicator is non-blocking (ncclConfig_t::blocking = 0): set-up
// and every call return at once and are then polled with ncclCommGetAsyncError, so that a peer
// that never arrives ends in a timeout and ncclCommAbort instead of a hang.
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/backends/device_collectives.h"
#include "engine/backends/nccl/nccl_check.h"
#include "engine/common/logging.h"
#include "engine/cuda/cuda_check.h"

namespace kolo::backends {
namespace {

using Clock = std::chrono::steady_clock;

class NcclCollectives final : public DeviceCollectives {
 public:
  NcclCollectives(collectives::Comm& comm, cuda::DeviceContext& ctx) : comm_(comm), ctx_(ctx) {}

  ~NcclCollectives() override {
    cuda::CurrentDeviceGuard guard;
    if (cudaSetDevice(ctx_.device()) != cudaSuccess) return;
    if (nccl_ != nullptr) {
      // After a failure the communicator was aborted already (and is null); a healthy one has no
      // operation in flight, so destroying it does not wait on peers.
      ncclCommDestroy(nccl_);
    }
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (start_ != nullptr) cudaEventDestroy(start_);
  }

  Status Init() {
    KOLO_RETURN_IF_ERROR(ctx_.Activate());
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    KOLO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming));
    KOLO_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));

    // Rank 0 makes the id; an empty message tells the others that it could not.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    std::vector<uint8_t> message;
    Status made;
    if (comm_.rank() == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&id);
      if (rc == ncclSuccess) {
        const auto* p = reinterpret_cast<const uint8_t*>(&id);
        message.assign(p, p + sizeof id);
      } else {
        made = NcclError("ncclGetUniqueId", rc, nullptr);
      }
    }
    KOLO_ASSIGN_OR_RETURN(message, collectives::BroadcastMessage(comm_, 0, message));
    KOLO_RETURN_IF_ERROR(made);
    if (message.size() != sizeof id) {
      return Unavailable("rank 0 could not create the NCCL unique id (see rank 0's error)");
    }
    std::memcpy(&id, message.data(), sizeof id);

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&nccl_, comm_.size(), id, comm_.rank(), &config);
    Status s = rc == ncclSuccess || rc == ncclInProgress
                   ? AwaitComm("ncclCommInitRankConfig")
                   : NcclError("ncclCommInitRankConfig", rc, nccl_);
    if (!s.ok()) {
      Abort();
      if (s.code() == StatusCode::kInvalidArgument) {
        return s.WithContext(fmt::format(
            "NCCL refused rank {} of {} on CUDA device {} (NCCL needs one GPU per rank; ranks that "
            "share a GPU must use backend ring)",
            comm_.rank(), comm_.size(), ctx_.device()));
      }
      return s;
    }
    KOLO_LOG(kInfo, "nccl: rank {}/{} on CUDA device {}", comm_.rank(), comm_.size(),
             ctx_.device());
    return Status::OK();
  }

  const char* name() const override { return "nccl"; }

  Status Allreduce(void* buf, size_t count, DataType dtype) override {
    KOLO_ASSIGN_OR_RETURN(ncclDataType_t type, NcclType(dtype));
    return Launch("ncclAllReduce",
                  [&] { return ncclAllReduce(buf, buf, count, type, ncclSum, nccl_, stream_); });
  }

  Status Broadcast(void* buf, size_t nbytes, int root) override {
    return Launch("ncclBroadcast",
                  [&] { return ncclBroadcast(buf, buf, nbytes, ncclUint8, root, nccl_, stream_); });
  }

 private:
  // Runs one NCCL call on the NCCL stream, ordered after the context's stream, and waits until it
  // has completed on the device, watching the communicator for asynchronous errors meanwhile.
  template <typename Call>
  Status Launch(const char* what, const Call& call) {
    if (nccl_ == nullptr) return FailedPrecondition("{}: the NCCL communicator was aborted", what);
    KOLO_RETURN_IF_ERROR(ctx_.Activate());
    const auto stream = static_cast<cudaStream_t>(ctx_.stream());
    KOLO_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream));
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream_, start_, 0));
    const ncclResult_t rc = call();
    Status s =
        rc == ncclSuccess || rc == ncclInProgress ? AwaitComm(what) : NcclError(what, rc, nccl_);
    if (s.ok()) s = AwaitDevice(what);
    if (!s.ok()) {
      Abort();
      return s;
    }
    // Later work on the context's stream sees the result.
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, done_, 0));
    return Status::OK();
  }

  // Waits until the communicator leaves ncclInProgress (a non-blocking call was enqueued).
  Status AwaitComm(const char* what) {
    const auto deadline = Clock::now() + ctx_.timeout();
    auto nap = std::chrono::microseconds(5);
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(nccl_, &state);
      if (rc != ncclSuccess) return NcclError("ncclCommGetAsyncError", rc, nccl_);
      if (state == ncclSuccess) return Status::OK();
      if (state != ncclInProgress) return NcclError(what, state, nccl_);
      if (Clock::now() > deadline) return Timeout(what);
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
    }
  }

  // Waits until the collective has run on the device; a peer's failure shows up as an
  // asynchronous error of the communicator.
  Status AwaitDevice(const char* what) {
    KOLO_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_, stream_));
    const auto deadline = Clock::now() + ctx_.timeout();
    auto nap = std::chrono::microseconds(5);
    while (true) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) return Status::OK();
      if (q != cudaErrorNotReady) return cuda::CudaError("cudaEventQuery", q);
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(nccl_, &state);
      if (rc != ncclSuccess) return NcclError("ncclCommGetAsyncError", rc, nccl_);
      if (state != ncclSuccess && state != ncclInProgress) return NcclError(what, state, nccl_);
      if (Clock::now() > deadline) return Timeout(what);
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
    }
  }

  Status Timeout(const char* what) const {
    return DeadlineExceeded(
        "{} on rank {} did not complete within {} ms (a peer may be gone); the NCCL communicator "
        "is aborted",
        what, comm_.rank(), ctx_.timeout().count());
  }

  void Abort() {
    if (nccl_ == nullptr) return;
    const ncclResult_t rc = ncclCommAbort(nccl_);
    if (rc != ncclSuccess) KOLO_LOG(kWarning, "ncclCommAbort: {}", ncclGetErrorString(rc));
    nccl_ = nullptr;
  }

  collectives::Comm& comm_;
  cuda::DeviceContext& ctx_;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t done_ = nullptr;
};

}  // namespace

StatusOr<std::unique_ptr<DeviceCollectives>> MakeNcclCollectives(collectives::Comm& comm,
                                                                 cuda::DeviceContext& ctx) {
  cuda::CurrentDeviceGuard guard;  // set-up runs on the caller's thread
  auto nccl = std::make_unique<NcclCollectives>(comm, ctx);
  Status s = nccl->Init();
  if (!s.ok()) return s.WithContext(fmt::format("rank {}: setting up NCCL", comm.rank()));
  return std::unique_ptr<DeviceCollectives>(std::move(nccl));
}

}  // namespace kolo::backends
