// The `gloo` peer: Gloo's ring allreduce over Gloo's own TCP transport, measured as two rows,
// gloo-ring (gloo::AllreduceRing) and gloo-ring-chunked (gloo::AllreduceRingChunked).
//
// Compiled only in builds with Gloo; this header does not include Gloo's. Gloo's rendezvous runs
// through an adapter over kolo's bootstrap Store (keys under "gloo/"), so the peer needs no
// launcher of its own. Gloo's algorithms reduce in place, as every row does (backend.h); one
// algorithm object per size is built in Bind (it allocates Gloo's inboxes). `--op avg` scales the
// sum by 1/ranks inside the timed call. Gloo exceptions become Status (kUnavailable).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/allreduce_bench/backend.h"
#include "engine/bootstrap/store.h"
#include "engine/common/status.h"

namespace kolo::bench::gloo {

struct GlooSetup {
  int rank = 0;
  int size = 1;
  std::string listen_addr;  // IPv4 address Gloo's device binds (the port is ephemeral)
  std::chrono::milliseconds timeout{30000};  // connection set-up and every operation
};

// Connects a Gloo context to every rank (collective) and returns the two rows, which share it.
// float16 uses Gloo's own float16 sum; bfloat16, which Gloo lacks, a custom reduction function
// over kolo's kernel.
StatusOr<std::vector<std::unique_ptr<Backend>>> MakeGlooPeers(const BenchConfig& config,
                                                              bootstrap::Store& store,
                                                              const GlooSetup& setup);

}  // namespace kolo::bench::gloo
