// Whole-collective backends: what runs a (fused) buffer's collective once negotiation and fusion
// are done. The engine keeps an ordered list; the first backend whose Enabled() is true for a
// request runs it (the ring backend, last in the list, accepts everything).
//
// Called only from the engine's background thread; every rank calls the same backend with the
// same arguments in the same order. Buffers are host memory owned by the engine (the fusion
// buffer) or by the caller (a tensor run in place), valid for the duration of the call.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "engine/collectives/collectives.h"
#include "engine/collectives/plan.h"
#include "engine/common/dtype.h"
#include "engine/common/status.h"
#include "engine/coordinator/message.h"

namespace kolo::backends {

// Host memory of one tensor (or of the packed part of a fusion group), a whole number of elements.
struct HostBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // "ring", "mpi" — as in Options::backend and the timeline's activity names (upper-cased).
  virtual const char* name() const = 0;
  // True if this backend runs collectives of `type` on `dtype`. Safe default: nothing.
  virtual bool Enabled(coordinator::CollectiveType type, DataType dtype) const = 0;

  // Sum over ranks, in place on buf[0, count).
  virtual Status Allreduce(void* buf, size_t count, DataType dtype) = 0;

  // True if AllreduceScattered reduces all its pieces in one collective (zero-copy fusion: the
  // engine then leaves large tensors where they are instead of packing them). Default: false.
  virtual bool SupportsScattered() const { return false; }
  // Sum over ranks, in place, of the concatenation of `pieces` (all of `dtype`). The default runs
  // one Allreduce per piece, which is correct but gains nothing over not fusing.
  virtual Status AllreduceScattered(const std::vector<HostBuffer>& pieces, DataType dtype) {
    for (const HostBuffer& p : pieces) {
      KOLO_RETURN_IF_ERROR(Allreduce(p.data, p.bytes / DataTypeSize(dtype), dtype));
    }
    return Status::OK();
  }
  // buf[0, nbytes) from `root` to every rank.
  virtual Status Broadcast(void* buf, size_t nbytes, int root) = 0;
  // Rank r's block sits at the prefix sum of bytes_per_rank; each rank filled its own.
  virtual Status Allgatherv(void* buf, const std::vector<size_t>& bytes_per_rank) = 0;

  // The allreduce algorithm of the collectives from now on (Engine::Retune). Backends that run
  // their own (MPI) say so.
  virtual Status SetAllreduceAlgorithm(collectives::AllreduceAlgorithm /*algorithm*/) {
    return FailedPrecondition("backend '{}' runs its own allreduce algorithm", name());
  }
  // Hierarchical allreduce on or off from now on (Engine::Retune), where the backend holds the
  // host groups.
  virtual Status SetHierarchicalAllreduce(bool /*on*/) {
    return FailedPrecondition("backend '{}' has no hierarchical allreduce", name());
  }
};

// Collectives over the engine's transport device (engine/collectives). Each allreduce runs the
// algorithm `algorithm` names, or, for kAuto, the one collectives::ChooseAllreduceAlgorithm picks
// for its bytes, the job's ranks and `hosts`. With `hierarchical` set and `hierarchical_on`,
// allreduces that would run the ring run as collectives::HierarchicalAllreduce over those groups
// (SetHierarchicalAllreduce switches it); broadcast and allgather stay on the flat ring.
std::unique_ptr<Backend> MakeRingBackend(
    collectives::Comm* comm, std::optional<collectives::HostGroups> hierarchical = std::nullopt,
    collectives::AllreduceAlgorithm algorithm = collectives::AllreduceAlgorithm::kAuto,
    int hosts = 1, bool hierarchical_on = true);

// MPI_Allreduce / MPI_Bcast / MPI_Allgatherv on a duplicate of MPI_COMM_WORLD, watched: a call
// still blocked after `timeout` (the peer timeout: some rank stopped taking part) is logged and
// the MPI job aborted, since a blocking MPI collective cannot be given up. (Blocking calls keep
// MPI's own tuned algorithms; its non-blocking ones are other implementations that progress only
// inside MPI calls.) Null (with the reason in *why) when this build has no MPI or the process was
// not launched by mpirun.
// `idle_progress`: Options::mpi_idle_progress.
std::unique_ptr<Backend> MakeMpiBackend(std::chrono::milliseconds timeout, bool idle_progress,
                                        std::string* why);

}  // namespace kolo::backends
