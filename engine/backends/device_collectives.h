// Collectives on tensors in CUDA device memory: what moves a device tensor (or the device fusion
// buffer) once negotiation and fusion are done. The engine picks one by Options::backend: "nccl"
// (NCCL on its own stream) or "ring" (kolo's ring over the transport, through pinned host
// staging, engine/backends/ring/staged_ring.h). Other backends move host tensors only; a device
// tensor submitted to them is refused.
//
// Calls are stream-ordered on the engine's cuda::DeviceContext: a buffer's input is what the
// context's stream holds once the work already queued on it has run, and when a call returns OK
// the result is in the buffer for any work queued on that stream afterwards. Called only from the
// engine's background thread; every rank calls the same collective with the same arguments in the
// same order. Every wait is bounded by the context's timeout.
#pragma once

#include <cstddef>
#include <memory>

#include "engine/collectives/collectives.h"
#include "engine/common/dtype.h"
#include "engine/common/status.h"
#include "engine/cuda/device_context.h"

namespace kolo::backends {

class DeviceCollectives {
 public:
  virtual ~DeviceCollectives() = default;
  // "nccl", "ring": for the timeline's activity names (upper-cased).
  virtual const char* name() const = 0;
  // Sum over ranks, in place on buf[0, count) (device memory of the context's device).
  [[nodiscard]] virtual Status Allreduce(void* buf, size_t count, DataType dtype) = 0;
  // buf[0, nbytes) from `root` to every rank, in place.
  [[nodiscard]] virtual Status Broadcast(void* buf, size_t nbytes, int root) = 0;
};

// NCCL on a communicator of every rank, created through kolo's own rendezvous: rank 0 makes the
// ncclUniqueId and broadcasts it over `comm`. Collective: every rank calls it at the same point
// (Engine::Create). NCCL wants one GPU per rank; it refuses ranks that share one, and this fails
// with its reason. Initialisation and every collective are bounded by ctx.timeout(); on an error
// or a timeout the communicator is aborted (ncclCommAbort) so that no rank waits forever.
// `ctx` must outlive the result. Fails in a build without NCCL.
StatusOr<std::unique_ptr<DeviceCollectives>> MakeNcclCollectives(collectives::Comm& comm,
                                                                 cuda::DeviceContext& ctx);

}  // namespace kolo::backends
