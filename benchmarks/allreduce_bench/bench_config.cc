#include "benchmarks/allreduce_bench/bench_config.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <sstream>

#include "benchmarks/allreduce_bench/tensor_sets.h"
#include "engine/common/options.h"
#include "engine/transport/registry.h"

namespace kolo::bench {
namespace {

constexpr BackendKind kAllBackends[] = {
    BackendKind::kRing, BackendKind::kRingHier, BackendKind::kMpi,  BackendKind::kMpiDirect,
    BackendKind::kGloo, BackendKind::kLink,     BackendKind::kNccl, BackendKind::kNcclDirect};
constexpr const char* kBackendList =
    "ring, ring-hier, mpi, mpi-direct, gloo, link, nccl, nccl-direct";

StatusOr<std::vector<BackendKind>> ParseBackends(const std::string& list) {
  std::vector<BackendKind> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    bool found = false;
    for (BackendKind k : kAllBackends) {
      if (item == BackendKindName(k)) {
        if (std::find(out.begin(), out.end(), k) == out.end()) out.push_back(k);
        found = true;
      }
    }
    if (!found) {
      return InvalidArgument("--backend '{}' is unknown: allowed are a comma list of {}", item,
                             kBackendList);
    }
  }
  if (out.empty()) {
    return InvalidArgument("--backend '{}' names no backend: allowed are a comma list of {}", list,
                           kBackendList);
  }
  return out;
}

// Everything is taken as text and converted by kolo's parsers, so that every error has the same
// shape: the flag, the value, what is allowed.
struct RawFlags {
  std::string minbytes = "8", maxbytes = "256M", stepfactor = "2", dtype = "float32", op = "sum";
  std::string iters = "20", warmup = "5", backend = "ring", check = "1", fusion = "both";
  std::string device = "host";
  std::string fusion_threshold_mb, cycle_time_ms, json, tensors, transport, algorithms;
  std::string compression;
  bool gloo_all = false;
};

Status Convert(const RawFlags& raw, BenchConfig* c) {
  KOLO_ASSIGN_OR_RETURN(c->min_bytes, ParseByteSize("--minbytes", raw.minbytes));
  KOLO_ASSIGN_OR_RETURN(c->max_bytes, ParseByteSize("--maxbytes", raw.maxbytes));
  KOLO_ASSIGN_OR_RETURN(c->step_factor, ParseInt("--stepfactor", raw.stepfactor, 2, 1 << 20));
  auto dtype = ParseDataType(raw.dtype);
  if (!dtype.ok()) return dtype.status().WithContext("--dtype");
  c->dtype = *dtype;
  if (raw.op == "sum") {
    c->op = ReduceOp::kSum;
  } else if (raw.op == "avg" || raw.op == "average") {
    c->op = ReduceOp::kAverage;
  } else {
    return InvalidArgument("--op '{}' is unknown: allowed are sum, avg", raw.op);
  }
  KOLO_ASSIGN_OR_RETURN(int64_t iters, ParseInt("--iters", raw.iters, 1, 1000000));
  KOLO_ASSIGN_OR_RETURN(int64_t warmup, ParseInt("--warmup", raw.warmup, 0, 1000000));
  c->iters = static_cast<int>(iters);
  c->warmup = static_cast<int>(warmup);
  KOLO_ASSIGN_OR_RETURN(c->backends, ParseBackends(raw.backend));
  if (!raw.algorithms.empty()) {
    const auto& allowed = AllreduceAlgorithmNames();
    std::stringstream in(raw.algorithms);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (std::find(allowed.begin(), allowed.end(), item) == allowed.end()) {
        return InvalidArgument("--algorithms '{}': '{}' is unknown: allowed are a comma list of {}",
                               raw.algorithms, item, fmt::join(allowed, ", "));
      }
      if (std::find(c->algorithms.begin(), c->algorithms.end(), item) == c->algorithms.end()) {
        c->algorithms.push_back(item);
      }
    }
    if (c->algorithms.empty()) {
      return InvalidArgument("--algorithms '{}' names no algorithm: allowed are a comma list of {}",
                             raw.algorithms, fmt::join(allowed, ", "));
    }
    if (std::find(c->backends.begin(), c->backends.end(), BackendKind::kRing) ==
        c->backends.end()) {
      return InvalidArgument(
          "--algorithms measures the ring backend's algorithms: add ring to "
          "--backend (given: '{}')",
          raw.backend);
    }
  }
  if (!raw.transport.empty()) {
    std::stringstream in(raw.transport);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (item.empty()) {
        return InvalidArgument(
            "--transport '{}' has an empty name: give a comma list of "
            "transports, e.g. shm,tcp",
            raw.transport);
      }
      KOLO_RETURN_IF_ERROR(ParseTransportSpec(item).status().WithContext("--transport"));
      if (std::find(c->transports.begin(), c->transports.end(), item) == c->transports.end()) {
        c->transports.push_back(item);
      }
    }
  }
  KOLO_ASSIGN_OR_RETURN(c->check, ParseBool("--check", raw.check));
  c->gloo_all = raw.gloo_all;
  if (raw.fusion == "on") {
    c->fusion = FusionMode::kOn;
  } else if (raw.fusion == "off") {
    c->fusion = FusionMode::kOff;
  } else if (raw.fusion == "both") {
    c->fusion = FusionMode::kBoth;
  } else {
    return InvalidArgument("--fusion '{}' is unknown: allowed are on, off, both", raw.fusion);
  }
  if (!raw.fusion_threshold_mb.empty()) {
    KOLO_ASSIGN_OR_RETURN(c->fusion_threshold_mb, ParseDouble("--fusion-threshold-mb",
                                                              raw.fusion_threshold_mb, 0, 1 << 20));
  }
  if (!raw.compression.empty()) c->compression = raw.compression;
  if (!raw.cycle_time_ms.empty()) {
    KOLO_ASSIGN_OR_RETURN(c->cycle_time_ms,
                          ParseDouble("--cycle-time-ms", raw.cycle_time_ms, 1e-3, 10000));
  }
  c->json_path = raw.json;
  c->tensors = raw.tensors;
  if (raw.device == "host") {
    c->place = BufferPlace::kHost;
  } else if (raw.device == "cuda") {
    c->place = BufferPlace::kCuda;
  } else {
    return InvalidArgument("--device '{}' is unknown: allowed are host, cuda", raw.device);
  }
  for (BackendKind k : c->backends) {
    if (c->place == BufferPlace::kCuda && !RunsOnDevice(k)) {
      return InvalidArgument(
          "--backend '{}' reduces host memory only: with --device cuda allowed are ring, "
          "ring-hier, nccl, nccl-direct",
          BackendKindName(k));
    }
    if (c->place == BufferPlace::kHost && NeedsCudaBuffers(k)) {
      return InvalidArgument(
          "--backend '{}' reduces CUDA device memory: pass --device cuda (with --device host "
          "allowed are ring, ring-hier, mpi, mpi-direct, gloo, link)",
          BackendKindName(k));
    }
  }
  if (!c->algorithms.empty() && (c->place == BufferPlace::kCuda || !c->tensors.empty())) {
    return InvalidArgument(
        "--algorithms compares algorithms on the size sweep of host buffers: it is not allowed "
        "with {}",
        c->place == BufferPlace::kCuda ? "--device cuda" : "--tensors");
  }
  if (c->place == BufferPlace::kCuda && !c->tensors.empty()) {
    return InvalidArgument(
        "--tensors '{}' with --device cuda: the step mode measures host gradients; allowed is "
        "--device host with --tensors, or --device cuda with the size sweep",
        c->tensors);
  }

  if (c->min_bytes < 1) return InvalidArgument("--minbytes={} must be at least 1", c->min_bytes);
  const int64_t elem = static_cast<int64_t>(DataTypeSize(c->dtype));
  for (const auto& [flag, bytes] :
       {std::pair{"--minbytes", c->min_bytes}, std::pair{"--maxbytes", c->max_bytes}}) {
    if (bytes % elem != 0) {
      return InvalidArgument(
          "{}={} is not a whole number of {} elements ({} bytes each); allowed: a multiple of {}",
          flag, bytes, DataTypeName(c->dtype), elem, elem);
    }
  }
  if (c->max_bytes < c->min_bytes) {
    return InvalidArgument("--maxbytes={} is below --minbytes={}: allowed is maxbytes >= minbytes",
                           c->max_bytes, c->min_bytes);
  }
  if (!c->tensors.empty()) {
    // Fails early, before any rank connects, for an unknown model name.
    KOLO_RETURN_IF_ERROR(MakeTensorSet(c->tensors).status());
    // A zero threshold would make the "fusion on" rows run unfused under the wrong label.
    if (c->fusion != FusionMode::kOff && c->fusion_threshold_mb &&
        static_cast<int64_t>(*c->fusion_threshold_mb * 1024.0 * 1024.0) <= 0) {
      return InvalidArgument(
          "--fusion-threshold-mb={} with --tensors leaves no fusion for the fusion-on rows: "
          "allowed is at least 1 byte (1e-6 MiB), or pass --fusion off",
          *c->fusion_threshold_mb);
    }
    if (c->transports.size() > 1) {
      return InvalidArgument(
          "--transport '{}' names several transports: with --tensors give one (the step mode "
          "measures one engine per backend)",
          raw.transport);
    }
    for (BackendKind k : c->backends) {
      if (!IsEngineBackend(k)) {
        return InvalidArgument(
            "--tensors measures kolo's engine: --backend '{}' is not allowed with it (allowed are "
            "ring, ring-hier, mpi)",
            BackendKindName(k));
      }
    }
  }
  return Status::OK();
}

}  // namespace

const char* BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kRing:
      return "ring";
    case BackendKind::kRingHier:
      return "ring-hier";
    case BackendKind::kMpi:
      return "mpi";
    case BackendKind::kMpiDirect:
      return "mpi-direct";
    case BackendKind::kGloo:
      return "gloo";
    case BackendKind::kLink:
      return "link";
    case BackendKind::kNccl:
      return "nccl";
    case BackendKind::kNcclDirect:
      return "nccl-direct";
  }
  return "unknown";
}

bool IsEngineBackend(BackendKind kind) {
  return kind == BackendKind::kRing || kind == BackendKind::kRingHier ||
         kind == BackendKind::kMpi || kind == BackendKind::kNccl;
}

bool RunsOnDevice(BackendKind kind) {
  return kind == BackendKind::kRing || kind == BackendKind::kRingHier ||
         kind == BackendKind::kNccl || kind == BackendKind::kNcclDirect;
}

bool NeedsCudaBuffers(BackendKind kind) {
  return kind == BackendKind::kNccl || kind == BackendKind::kNcclDirect;
}

StatusOr<ParsedFlags> ParseBenchFlags(int argc, char** argv) {
  ParsedFlags parsed;
  RawFlags raw;
  CLI::App app(
      "kolo-allreduce-bench: allreduce bus bandwidth of kolo's engine and its peers (MPI, Gloo, "
      "the link ceiling), nccl-tests style. Launch with mpirun or kolo-run.");
  app.add_option("-b,--minbytes", raw.minbytes, "smallest buffer (bytes; K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", raw.maxbytes, "largest buffer (bytes; K, M, G suffixes)")
      ->capture_default_str();
  app.add_option("-f,--stepfactor", raw.stepfactor, "size multiplier between rows (integer >= 2)")
      ->capture_default_str();
  app.add_option("--dtype", raw.dtype, "element type (any kolo dtype)")->capture_default_str();
  app.add_option("--op", raw.op, "reduction: sum or avg")->capture_default_str();
  app.add_option("-n,--iters", raw.iters, "timed iterations per row")->capture_default_str();
  app.add_option("-w,--warmup", raw.warmup, "untimed iterations before them")
      ->capture_default_str();
  app.add_option("--backend", raw.backend, std::string("comma list of: ") + kBackendList)
      ->capture_default_str();
  app.add_option("--transport", raw.transport,
                 "comma list of kolo transports for the ring and link rows, a row of each per "
                 "transport: " +
                     fmt::format("{}", fmt::join(transport::TransportNames(), ", ")) +
                     " (default: KOLO_TRANSPORT, else auto)");
  app.add_option("--algorithms", raw.algorithms,
                 "comma list of allreduce algorithms to compare, each as ring/<name> (engine) "
                 "beside alone/<name> (the algorithm alone): " +
                     fmt::format("{}", fmt::join(AllreduceAlgorithmNames(), ", ")));
  app.add_option("--fusion-threshold-mb", raw.fusion_threshold_mb,
                 "engine fusion threshold (MiB; overrides KOLO_FUSION_THRESHOLD_BYTES)");
  app.add_option("--compression", raw.compression,
                 "gradient compression of the engine's rows (ring, ring-hier, mpi, nccl; the "
                 "direct rows never compress): none, fp16, bf16 (overrides KOLO_COMPRESSION); "
                 "busbw counts the float32 payload");
  app.add_option("--cycle-time-ms", raw.cycle_time_ms,
                 "engine cycle time (ms; overrides KOLO_CYCLE_TIME_MS)");
  app.add_option("--json", raw.json, "write every setting and row as JSON to this file (rank 0)");
  app.add_option("--check", raw.check, "verify results against a local reference (1 or 0)")
      ->capture_default_str();
  app.add_flag("--gloo-all", raw.gloo_all,
               "with gloo: also Gloo's oldest AllreduceRing (slow with more ranks than cores)");
  app.add_option(
      "--tensors", raw.tensors,
      std::string("one step's gradients of a model instead of the sweep: ") + TensorSetNames());
  app.add_option("--fusion", raw.fusion, "with --tensors: on, off or both")->capture_default_str();
  app.add_option("--device", raw.device,
                 "where the buffer lives: host, or cuda (GPU KOLO_LOCAL_RANK modulo the GPUs "
                 "visible; rows ring, ring-hier, nccl, nccl-direct)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    parsed.help = true;
    parsed.help_text = app.help();
    return parsed;
  } catch (const CLI::ParseError& e) {
    return InvalidArgument("{} (see --help)", e.what());
  }
  KOLO_RETURN_IF_ERROR(Convert(raw, &parsed.config));
  for (int i = 0; i < argc; ++i) parsed.config.argv.emplace_back(argv[i]);
  return parsed;
}

std::vector<int64_t> SweepSizes(const BenchConfig& config) {
  const int64_t elem = static_cast<int64_t>(DataTypeSize(config.dtype));
  std::vector<int64_t> sizes;
  for (int64_t s = config.min_bytes; s <= config.max_bytes;) {
    const int64_t rounded = std::max<int64_t>(elem, s / elem * elem);
    if (sizes.empty() || rounded > sizes.back()) sizes.push_back(rounded);
    if (s > config.max_bytes / config.step_factor) break;  // next step would pass max (or wrap)
    s *= config.step_factor;
  }
  return sizes;
}

StatusOr<TransportSpec> ParseTransportSpec(const std::string& item) {
  TransportSpec spec;
  const size_t star = item.find('*');
  spec.name = item.substr(0, star);
  if (star == std::string::npos) return spec;
  if (spec.name != "tcp" && spec.name != "auto") {
    return InvalidArgument("'{}': streams (*N) are for tcp and auto only", item);
  }
  KOLO_ASSIGN_OR_RETURN(spec.streams, ParseTcpStreams(item, item.substr(star + 1)));
  if (spec.streams == 0) return InvalidArgument("'{}': give a number of streams, 1 to 16", item);
  return spec;
}

}  // namespace kolo::bench
