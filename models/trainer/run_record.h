// The JSON record kolo-train writes with --json FILE: one object per run that the sweep runner
// and the reports read.
//
//   {"kolo_commit": "<git sha or 'unknown'>", "timestamp": "<ISO 8601 UTC>",
//    "hosts": ["<hostname>", ...], "cpu_model": "...", "gpu_model": "<name or empty>",
//    "settings": {"model", "batch_size", "num_warmup_batches", "num_batches", "compute",
//                 "profile", "dilation", "backend", "transport", "hierarchical_allreduce",
//                 "precision", "fusion_threshold_mb", "cycle_time_ms", "backward_passes_per_step",
//                 "image_size", "num_classes", "ranks", "nodes", "ps_servers", "ps_placement",
//                 "ps_pacing", "ps_staging"},
//    "results": {"total_images_per_sec", "images_per_sec_per_rank", "images_per_sec_stddev",
//                "step_time_ms_median", "exposed_wait_ms_median", <the time breakdown>,
//                "final_loss", "kernel_share", "engine_stats": {..., "transport_pairs",
//                "transport_connections", "transport_memory_bytes"}},
//    "status": "ok" | "failed", "error": "<message when failed>"}
//
// The time breakdown (Breakdown's fields, each a mean per timed step over the steps and the ranks):
// "step_time_ms_mean", "forward_ms", "backward_ms", "exposed_comm_ms", "update_ms", "comm_ms",
// "hidden_comm_ms", "negotiation_ms", "comm_bytes_per_step", "comm_gbytes_per_sec",
// "collectives_per_step", "cycles_per_step", "cycle_hold_ms".
//
// With "dilation" K > 1 (replay only) every replayed time was slept K times over; every time and
// rate in "results" is the measured one divided by K (the pace the run stands for), bytes are as
// sent, and only "engine_stats" (the engine's raw counters) stay at the wall clock's pace.
//
// "ranks" counts training workers; parameter-server ranks are counted in "ps_servers". A failed
// run carries whatever settings were known and no "results". final_loss is null when the compute
// backend computes no loss (replay).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace kolo::models::trainer {

struct RunSettings {
  std::string model;
  int64_t batch_size = 0;  // per rank and micro-batch
  int num_warmup_batches = 0;
  int num_batches = 0;
  std::string compute;
  std::string profile;  // replay: the profile played; empty otherwise
  double dilation = 1;  // replay: time dilation (see the file comment)
  std::string backend;
  std::string transport;
  std::string allreduce_algorithm;  // ring backend: Options::allreduce_algorithm; else ""
  std::string compression;          // Options::compression; "" for backend none
  // Options::tcp_streams as given ("auto" or a count) for the backends on kolo's transports; ""
  // otherwise. The count each rank opened is engine_stats.tcp_streams.
  std::string tcp_streams;
  bool hierarchical_allreduce = false;
  std::string precision;
  double fusion_threshold_mb = 0;
  double cycle_time_ms = 0;
  int backward_passes_per_step = 1;
  int64_t image_size = 0;
  int64_t num_classes = 0;
  int ranks = 1;  // training workers
  int nodes = 1;  // distinct hosts
  int ps_servers = 0;
  std::string ps_placement;
  std::string ps_pacing;  // "125mbit", "off"; empty for other backends
  // "sync", "overlap" (--ps-staging; what applies to gradients that are not host float32, i.e.
  // on a GPU); empty for other backends
  std::string ps_staging;
  // --autotune: the search ran, and fusion_threshold_mb, cycle_time_ms and allreduce_algorithm
  // above are its choice (what the timed steps ran).
  bool autotune = false;
};

// One autotune trial: the settings and rank 0's images/sec over its measured steps (at the
// represented pace), and whether the search kept it.
struct AutotuneTrial {
  double fusion_threshold_mb = 0;
  double cycle_time_ms = 0;
  std::string allreduce_algorithm;
  bool hierarchical_allreduce = false;
  double images_per_sec = 0;
  bool kept = false;
};

// Where a step's time went, per rank and step, mean over the timed steps and the ranks.
struct Breakdown {
  double step_time_ms_mean = 0;
  // The step's consecutive phases (StepStats): they add up to step_time_ms_mean but for the
  // bookkeeping between them.
  double forward_ms = 0;
  double backward_ms = 0;
  double exposed_comm_ms = 0;  // blocked on collectives (or the servers) after backward
  double update_ms = 0;
  // Time the engine was communicating: negotiation plus executing collectives, or, with
  // parameter servers, time with a PushPull in flight. Overlaps backward where it can.
  double comm_ms = 0;
  double hidden_comm_ms = 0;  // comm_ms - exposed_comm_ms, at least 0: hidden under backward
  double negotiation_ms = 0;  // agreeing on ready tensors (the coordinator, the bit exchange)
  // Bytes this rank sent per step: measured on kolo's transport (ring, parameter server,
  // negotiation); for MPI and NCCL, which move bytes themselves, the bandwidth-optimal allreduce's
  // 2(N-1)/N of the payload added to it.
  double comm_bytes_per_step = 0;
  double comm_gbytes_per_sec = 0;  // comm_bytes_per_step / comm_ms, 1e9 bytes per second
  // The engine's own counters per step, which load does not move the way it moves time: backend
  // collectives (one per fused buffer: Tensor Fusion's work) and negotiation cycles (how often
  // the engine agreed on ready tensors: its cycle time's).
  double collectives_per_step = 0;
  double cycles_per_step = 0;
  // Per exchange, the time the engine held submitted work back for its cycle grid
  // (Stats::gather_us over the cycles): bounded by the cycle time whatever the host's load, so a
  // longer cycle shows here and a busy host hardly does.
  double cycle_hold_ms = 0;
};

struct RunResults {
  // Sum over ranks of each rank's images/sec over the timed steps.
  double total_images_per_sec = 0;
  double images_per_sec_per_rank = 0;  // total / ranks
  // Standard deviation of per-step images/sec, pooled over every rank's timed steps.
  double images_per_sec_stddev = 0;
  double step_time_ms_median = 0;     // mean over ranks of each rank's median step time
  double exposed_wait_ms_median = 0;  // the same for the time blocked on collectives after backward
  Breakdown breakdown;
  std::optional<double> final_loss;  // rank 0's loss of the last step; none for replay
  double kernel_share = 0;           // rank 0: time inside the backend's kernels / step time
  Engine::Stats engine_stats;        // rank 0's
};

struct RunRecord {
  std::string kolo_commit = "unknown";
  std::string timestamp;  // ISO 8601 UTC
  std::vector<std::string> hosts;
  std::string cpu_model;
  std::string gpu_model;
  RunSettings settings;
  std::optional<RunResults> results;
  std::vector<AutotuneTrial> autotune_trials;  // --autotune, in the order they ran
  bool ok = false;
  std::string error;
};

std::string RunRecordToJson(const RunRecord& record);
// Writes the record to `path` (replacing it atomically: a temporary file renamed over it).
[[nodiscard]] Status WriteRunRecord(const RunRecord& record, const std::string& path);

// "2024-05-01T12:34:56Z", now.
std::string UtcTimestamp();
// The first "model name" of /proc/cpuinfo, or "unknown".
std::string CpuModel();
// gethostname(), or "unknown".
std::string HostName();

}  // namespace kolo::models::trainer
