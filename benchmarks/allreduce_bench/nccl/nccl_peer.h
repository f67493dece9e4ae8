// `nccl-direct`: the peer kolo's device rows are read against, as nccl-tests' all_reduce_perf
// measures NCCL: ncclAllReduce in place on the device buffer, on a stream of its own, waited for
// by spinning on the stream (no sleeping between queries). Compiled only in builds with NCCL; this
// header does not include <nccl.h>.
#pragma once

#include <chrono>
#include <memory>

#include "benchmarks/allreduce_bench/backend.h"
#include "engine/bootstrap/store.h"
#include "engine/common/status.h"

namespace kolo::bench::nccl {

struct NcclSetup {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  // Every wait (the communicator's set-up, each collective) ends after this with an error and the
  // communicator aborted, so that a peer that died cannot hang the others.
  std::chrono::milliseconds timeout{30000};
};

// Makes one communicator of every rank: rank 0 creates the ncclUniqueId and publishes it in
// `store` (key "nccl-direct/id"), the others read it. Collective. NCCL refuses two ranks on one
// GPU; the error then says so.
StatusOr<std::unique_ptr<Backend>> MakeNcclDirect(const BenchConfig& config,
                                                  bootstrap::Store& store, const NcclSetup& setup);

}  // namespace kolo::bench::nccl
