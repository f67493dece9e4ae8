// The rows measured through kolo itself: `ring` and `mpi` (kolo::Engine with that backend) and
// `link` (collectives::RingExchangeNoReduce on the benchmark's own kolo Device: the same ring
// moving the same bytes in the same order with no reduction, each piece received into its place
// in the buffer, the ceiling the ring's bus bandwidth is read against). Ring and link rows run
// over one kolo transport each (--transport).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "benchmarks/allreduce_bench/backend.h"
#include "engine/bootstrap/store.h"
#include "engine/collectives/collectives.h"
#include "engine/engine.h"

namespace kolo::bench {

// An Engine joined to the job through the rendezvous store, under a key prefix of its own.
// Members are declared so that the engine goes before the store view it was created with.
struct StartedEngine {
  std::unique_ptr<bootstrap::PrefixStore> store;
  std::unique_ptr<Engine> engine;
};

// Starts an Engine with env.options, the backend of `kind` (ring or mpi), and, if given, another
// transport and fusion threshold. Collective: every rank calls it in the same order (the n-th call
// of each rank joins the same key prefix). REQUIRES: env.store != nullptr; IsEngineBackend(kind).
StatusOr<StartedEngine> StartEngine(BackendEnv& env, BackendKind kind,
                                    std::optional<int64_t> fusion_threshold_bytes = std::nullopt,
                                    const std::string& transport = "",
                                    const std::string& algorithm = "");

// Shuts the engine down (collectively) and releases it; returns the shutdown's status.
Status StopEngine(StartedEngine& started);

// `ring` or `mpi`: an Engine per buffer size, started in Bind and shut down in Unbind, so that no
// idle engine's background cycle (one bit-vector exchange per cycle time) runs while another row
// is measured. One allreduce of the whole buffer per RunOnce, submitted and waited for. The
// engine connects through `transport` under the row label `label`.
std::unique_ptr<Backend> MakeEngineRow(BackendKind kind, BackendEnv& env,
                                       const std::string& transport, const std::string& label,
                                       const std::string& algorithm = "");

// `alone/<algorithm>` (--algorithms): the allreduce algorithm `algorithm` (Options'
// allreduce_algorithm names; auto picks by collectives::ChooseAllreduceAlgorithm) called
// directly on `device`, one of env.devices, with no engine around it: what the engine row of the
// same algorithm costs less the engine's own queue, wake-up, negotiation and completion. Host
// buffers only.
// Rows of one device share `scratch` (they run one at a time), as one engine's collectives do.
std::unique_ptr<Backend> MakeAloneRow(BackendEnv& env, transport::Device& device,
                                      const std::string& algorithm, const std::string& label,
                                      std::shared_ptr<collectives::Scratch> scratch);

// `link` over `device` (one of env.devices), labelled `label`.
std::unique_ptr<Backend> MakeLinkRow(BackendEnv& env, transport::Device& device,
                                     const std::string& label);

}  // namespace kolo::bench
