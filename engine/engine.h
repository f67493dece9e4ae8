// kolo's communication engine: the public API.
//
// An Engine is one rank of a data-parallel job. Collectives are submitted asynchronously by name:
// every rank submits the same names (in any order); a background thread negotiates which tensors
// are ready on every rank (rank 0 coordinates; a response cache lets steady-state steps agree with
// one bit-vector exchange), fuses compatible ready tensors into one buffer up to the fusion
// threshold (Tensor Fusion), runs the collective on the selected backend (ring over TCP, or MPI),
// and completes the handles. See ../shared/DESIGN.md for the data flow.
//
// Usage:
//   KOLO_ASSIGN_OR_RETURN(auto engine, kolo::Engine::Create(options));
//   KOLO_ASSIGN_OR_RETURN(auto h, engine->AllreduceAsync("fc/weight", grad, grad,
//   DataType::kFloat32,
//                                                        {1000, 2048}, ReduceOp::kAverage));
//   ... more work ...
//   KOLO_RETURN_IF_ERROR(engine->Wait(h));
//   KOLO_RETURN_IF_ERROR(engine->Shutdown());
//
// Thread-safety: every method may be called from any thread. Buffers passed to *Async belong to
// the engine until the handle completes: they must stay valid and unchanged (inputs) or untouched
// (outputs) until Wait returns or Poll reports completion.
//
// Errors: a failed collective completes its handle with a Status naming the tensor, the ranks
// involved and the cause, on every rank. The background thread's first fatal error (a lost peer,
// a protocol violation) is sticky: every pending and later operation fails with it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/options.h"
#include "engine/common/status.h"

namespace kolo {

namespace bootstrap {
class Store;
}

enum class ReduceOp : uint8_t { kSum = 0, kAverage = 1 };
const char* ReduceOpName(ReduceOp op);

// Identifies one submitted operation. Cheap to copy.
struct Handle {
  int64_t id = -1;
};

// Where a tensor's memory lives and when it is ready to be read.
struct TensorPlace {
  // -1: host memory. >= 0: memory on this CUDA device (needs a build with CUDA and a backend that
  // moves device tensors; otherwise submission fails naming the tensor).
  int device = -1;
  // For device tensors: a cudaEvent_t recorded after the producer's last write. The engine waits
  // on this event (not on the whole device) before it reads the tensor. nullptr: ready now.
  // The event must stay valid until the handle completes.
  void* ready_event = nullptr;
  bool on_device() const { return device >= 0; }
};

// The result of an allgather: the concatenation of every rank's tensor along the first dimension.
struct GatheredTensor {
  std::vector<uint8_t> data;
  Shape shape;
  std::vector<int64_t> first_dims;  // each rank's first dimension, in rank order
};

class Engine {
 public:
  // Starts one rank: connects to every peer (address exchange through the store at
  // options.store_addr, over MPI when launched by mpirun, or in-process when `store` is given),
  // checks that every rank uses the same settings, and starts the background thread.
  // `store` (optional) overrides the rendezvous: ranks running as threads of one process share one
  // bootstrap::InMemoryStore. Fails if any rank's options differ in a setting that must agree.
  static StatusOr<std::unique_ptr<Engine>> Create(const Options& options,
                                                  bootstrap::Store* store = nullptr);
  // Shuts down (as Shutdown) if that was not done.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  const Options& options() const;

  // Allreduce: out = sum (or mean) over ranks of `in`. `in` may equal `out` (in place).
  // Errors at submission: a name already in flight; an engine that has shut down.
  StatusOr<Handle> AllreduceAsync(const std::string& name, const void* in, void* out,
                                  DataType dtype, const Shape& shape, ReduceOp op,
                                  const TensorPlace& place = {});

  // Broadcast `data` (in place) from rank `root` to every rank.
  StatusOr<Handle> BroadcastAsync(const std::string& name, void* data, DataType dtype,
                                  const Shape& shape, int root, const TensorPlace& place = {});

  // Allgather: every rank's tensor concatenated along the first dimension, which may differ per
  // rank (the other dimensions must agree). Fetch the result with TakeGathered after Wait.
  StatusOr<Handle> AllgatherAsync(const std::string& name, const void* in, DataType dtype,
                                  const Shape& shape);

  // Blocks until `handle` completes and returns its status; DeadlineExceeded if `timeout` passes
  // first (the operation continues). A handle can be waited on once; afterwards it is unknown.
  Status Wait(Handle handle, std::chrono::milliseconds timeout = std::chrono::hours(24));
  // True if `handle` has completed (then Wait returns at once).
  StatusOr<bool> Poll(Handle handle);
  // The gathered tensor of a completed allgather `handle` (call before or instead of Wait; the
  // handle is then consumed).
  StatusOr<GatheredTensor> TakeGathered(Handle handle);

  // Returns once every rank has called Barrier (negotiated like any collective).
  Status Barrier();

  // Stops the background thread after the current cycle. Operations still pending fail with
  // "shut down". Any rank's shutdown ends the job's engine on every rank. Idempotent.
  Status Shutdown();

  // Statistics since Create, for benchmarks and tests.
  struct Stats {
    int64_t cycles = 0;
    int64_t negotiations = 0;  // cycles that went through the coordinator
    int64_t cache_hits = 0;    // tensors agreed through the response cache
    int64_t collectives = 0;   // backend calls (one per fused buffer)
    int64_t tensors = 0;       // completed operations
    int64_t fused_bytes = 0;   // bytes of tensors reduced in fused groups
    int64_t packed_bytes = 0;  // of those, bytes copied through the fusion buffer
    // Time spent agreeing (bit-vector exchange and coordinator rounds) in cycles that released
    // work; includes waiting inside the exchange for ranks that arrive later.
    double coordination_us = 0;
  };
  Stats stats() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolo
