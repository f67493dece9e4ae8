#include "benchmarks/allreduce_bench/nccl/nccl_peer.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <cstring>
#include <thread>

#include "engine/backends/nccl/nccl_check.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_context.h"

namespace kolo::bench::nccl {
namespace {

using Clock = std::chrono::steady_clock;
using backends::NcclError;
using backends::NcclType;

class NcclDirect final : public Backend {
 public:
  NcclDirect(const BenchConfig& config, const NcclSetup& setup)
      : dtype_(config.dtype), op_(config.op), setup_(setup) {}

  ~NcclDirect() override {
    kolo::cuda::CurrentDeviceGuard guard;
    if (cudaSetDevice(device_) != cudaSuccess) return;
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Status Init(bootstrap::Store& store) {
    StatusOr<ncclDataType_t> type = NcclType(dtype_);
    if (!type.ok()) return type.status().WithContext("nccl-direct: --dtype");
    type_ = *type;
    std::string why;
    const int n = kolo::cuda::DeviceCount(&why);
    if (n == 0) return FailedPrecondition("nccl-direct: no CUDA device ({})", why);
    device_ = setup_.local_rank % n;
    KOLO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    KOLO_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));

    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (setup_.rank == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&id);
      // An empty value tells the others that rank 0 could not make one.
      std::vector<uint8_t> value;
      if (rc == ncclSuccess) {
        const auto* p = reinterpret_cast<const uint8_t*>(&id);
        value.assign(p, p + sizeof id);
      }
      KOLO_RETURN_IF_ERROR(store.Set("nccl-direct/id", value));
      if (rc != ncclSuccess) return NcclError("ncclGetUniqueId", rc, nullptr);
    } else {
      KOLO_ASSIGN_OR_RETURN(std::vector<uint8_t> value,
                            store.Get("nccl-direct/id", setup_.timeout));
      if (value.size() != sizeof id) {
        return Unavailable("nccl-direct: rank 0 could not create the NCCL unique id");
      }
      std::memcpy(&id, value.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t rc = ncclCommInitRankConfig(&comm_, setup_.size, id, setup_.rank, &config);
    Status s = rc == ncclSuccess || rc == ncclInProgress
                   ? AwaitComm("ncclCommInitRankConfig")
                   : NcclError("ncclCommInitRankConfig", rc, comm_);
    if (!s.ok()) {
      Abort();
      return s.WithContext(
          fmt::format("nccl-direct: rank {} of {} on CUDA device {} (NCCL needs one GPU per rank)",
                      setup_.rank, setup_.size, device_));
    }
    return Status::OK();
  }

  std::string name() const override { return "nccl-direct"; }
  BackendKind kind() const override { return BackendKind::kNcclDirect; }

  Status Bind(const BenchBuffer& buf, size_t count) override {
    if (!buf.on_device()) return InvalidArgument("nccl-direct reduces device buffers only");
    buf_ = buf.data;
    count_ = count;
    return Status::OK();
  }

  Status RunOnce() override {
    if (comm_ == nullptr) return FailedPrecondition("nccl-direct: the communicator was aborted");
    KOLO_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    const ncclRedOp_t op = op_ == ReduceOp::kAverage ? ncclAvg : ncclSum;
    const ncclResult_t rc = ncclAllReduce(buf_, buf_, count_, type_, op, comm_, stream_);
    Status s = rc == ncclSuccess || rc == ncclInProgress ? AwaitComm("ncclAllReduce")
                                                         : NcclError("ncclAllReduce", rc, comm_);
    if (s.ok()) s = AwaitStream();
    if (!s.ok()) Abort();
    return s;
  }

 private:
  Status AwaitComm(const char* what) {
    const auto deadline = Clock::now() + setup_.timeout;
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) return NcclError("ncclCommGetAsyncError", rc, comm_);
      if (state == ncclSuccess) return Status::OK();
      if (state != ncclInProgress) return NcclError(what, state, comm_);
      if (Clock::now() > deadline) return Timeout(what);
      std::this_thread::yield();
    }
  }

  // Spins on the stream as nccl-tests does, watching the communicator for a peer's failure.
  Status AwaitStream() {
    const auto deadline = Clock::now() + setup_.timeout;
    while (true) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return Status::OK();
      if (q != cudaErrorNotReady) return kolo::cuda::CudaError("cudaStreamQuery", q);
      ncclResult_t state = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) return NcclError("ncclCommGetAsyncError", rc, comm_);
      if (state != ncclSuccess && state != ncclInProgress) {
        return NcclError("ncclAllReduce", state, comm_);
      }
      if (Clock::now() > deadline) return Timeout("ncclAllReduce");
    }
  }

  Status Timeout(const char* what) const {
    return DeadlineExceeded(
        "nccl-direct: {} on rank {} did not complete within {} ms (a peer may be gone); the "
        "communicator is aborted",
        what, setup_.rank, setup_.timeout.count());
  }

  void Abort() {
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  DataType dtype_;
  ReduceOp op_;
  NcclSetup setup_;
  int device_ = 0;
  ncclDataType_t type_ = ncclFloat32;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* buf_ = nullptr;
  size_t count_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> MakeNcclDirect(const BenchConfig& config,
                                                  bootstrap::Store& store, const NcclSetup& setup) {
  auto peer = std::make_unique<NcclDirect>(config, setup);
  KOLO_RETURN_IF_ERROR(peer->Init(store));
  return std::unique_ptr<Backend>(std::move(peer));
}

}  // namespace kolo::bench::nccl
