// kolo-allreduce-bench's settings: the command line, parsed and checked once.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/status.h"
#include "engine/engine.h"

namespace kolo::bench {

// What one `--backend` name measures.
enum class BackendKind {
  kRing,        // kolo Engine, ring backend over kolo's transport (--transport)
  kRingHier,    // the same with hierarchical allreduce (within hosts, across, within)
  kMpi,         // kolo Engine, MPI backend (MPI_Allreduce on the fusion buffer)
  kMpiDirect,   // peer: plain MPI_Allreduce on a buffer allocated once
  kGloo,        // peer: gloo::AllreduceRing and gloo::AllreduceRingChunked over Gloo's TCP
  kLink,        // ceiling: collectives::RingExchangeNoReduce on a kolo Device (--transport)
  kNccl,        // kolo Engine, NCCL backend on device buffers (--device cuda)
  kNcclDirect,  // peer: plain ncclAllReduce on the same device buffer, nccl-tests style
};
// "ring", "ring-hier", "mpi", "mpi-direct", "gloo", "link", "nccl", "nccl-direct".
const char* BackendKindName(BackendKind kind);
// True for the backends that run through kolo::Engine (ring, ring-hier, mpi, nccl).
bool IsEngineBackend(BackendKind kind);
// True for the backends that can reduce a buffer in CUDA device memory (--device cuda): the
// engine's ring (staged through pinned host buffers) and hierarchical ring, and the NCCL rows.
bool RunsOnDevice(BackendKind kind);
// True for the backends that need --device cuda (nccl, nccl-direct).
bool NeedsCudaBuffers(BackendKind kind);

// Where the reduced buffer lives.
enum class BufferPlace { kHost, kCuda };

enum class FusionMode { kOn, kOff, kBoth };

// A --transport item: a transport's name, with "*N" for TCP with N streams per pair ("tcp*4",
// "auto*2"; KOLO_TCP_STREAMS); streams 0 when none is given (the engine's setting holds).
struct TransportSpec {
  std::string name;
  int streams = 0;
};
StatusOr<TransportSpec> ParseTransportSpec(const std::string& item);

struct BenchConfig {
  // Size sweep: min_bytes, min_bytes * step_factor, ... up to max_bytes (inclusive).
  int64_t min_bytes = 8;
  int64_t max_bytes = 256LL << 20;
  int64_t step_factor = 2;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int iters = 20;  // timed iterations per (size, backend)
  int warmup = 5;  // untimed iterations before them
  // In the order given on the command line, without duplicates.
  std::vector<BackendKind> backends = {BackendKind::kRing};
  // --transport: kolo's transports the ring and link rows run over, one row of each per transport
  // (labelled "ring-shm", "link-tcp", ... when there are several; plain "ring", "link" for one).
  // Empty: the engine's (Options::transport, KOLO_TRANSPORT). Checked against the registry when
  // the options are configured.
  std::vector<std::string> transports;
  // --algorithms: allreduce algorithms (Options::allreduce_algorithm's names) to measure side by
  // side: for each, the ring row becomes "ring/<algorithm>" (through the engine with that
  // algorithm) beside "alone/<algorithm>" (the algorithm called directly on the benchmark's own
  // connections), and the report adds the engine's overhead per size. Empty: one ring row with
  // the engine's setting (KOLO_ALLREDUCE_ALGORITHM, --allreduce-algorithm).
  std::vector<std::string> algorithms;
  // Engine settings from flags; unset means the environment's value (or the default).
  std::optional<double> fusion_threshold_mb;  // MiB; 0 disables fusion
  std::optional<double> cycle_time_ms;
  std::optional<std::string> compression;  // --compression: Options::compression
  std::string json_path;                   // written by rank 0; empty = no JSON
  bool check = true;      // verify every backend's result against the local reference
  bool gloo_all = false;  // also Gloo's oldest, unpipelined AllreduceRing
  // Step mode instead of the size sweep: one step's gradients of this model (tensor_sets.h).
  std::string tensors;
  FusionMode fusion = FusionMode::kBoth;
  // --device: host memory, or CUDA device memory (device KOLO_LOCAL_RANK modulo the GPUs visible)
  // for the rows that reduce device buffers (RunsOnDevice).
  BufferPlace place = BufferPlace::kHost;
  // The command line as given, for the report.
  std::vector<std::string> argv;
};

struct ParsedFlags {
  BenchConfig config;
  bool help = false;  // --help was given: print help_text and exit 0
  std::string help_text;
};

// Parses and validates the command line. Errors (InvalidArgument) name the flag, the value and
// what is allowed. Does not check what this build or launch supports (see backends.h).
StatusOr<ParsedFlags> ParseBenchFlags(int argc, char** argv);

// The buffer sizes of the sweep, in bytes: each a whole number of `dtype` elements (rounded
// down, at least one element), increasing, without duplicates.
std::vector<int64_t> SweepSizes(const BenchConfig& config);

}  // namespace kolo::bench
