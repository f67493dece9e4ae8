// What rank 0 prints and writes: the nccl-tests-style table, the ratio summary, the step table of
// `--tensors`, and the JSON document of `--json`. Pure formatting; no communication.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "benchmarks/allreduce_bench/bench_config.h"
#include "benchmarks/allreduce_bench/step_bench.h"
#include "benchmarks/allreduce_bench/sweep.h"
#include "benchmarks/allreduce_bench/tensor_sets.h"
#include "engine/common/options.h"

namespace kolo::bench {

struct RunInfo {
  const BenchConfig* config = nullptr;
  Options options;                      // the engine settings every engine row starts from
  std::vector<std::string> hosts;       // host name of each rank, in rank order
  std::string launcher;                 // "mpirun", "kolo-run" or "none" (single rank)
  std::string control;                  // what carried control messages: "mpi", "tcp", "local"
  std::vector<std::string> rows;        // the row labels measured, in order
  std::vector<std::string> transports;  // kolo's transports of the ring and link rows
  std::string mpi_btl;  // Open MPI's btl selection under mpirun ("self,vader"), else ""
};

// A ring row's bus bandwidth over each peer's at one size (link: the link row of the same
// transport); unset where either is missing. One per ring row and size.
struct RatioRow {
  int64_t bytes = 0;
  std::string ring;  // the ring row's label
  std::string transport;
  std::optional<double> ring_link;
  std::optional<double> ring_gloo_best;
  std::optional<double> ring_mpi_direct;
};
std::vector<RatioRow> ComputeRatios(const std::vector<SweepRow>& rows);

// With --algorithms: per size and algorithm, the algorithm alone (alone/<a>) beside the engine
// running it (ring/<a>), and the engine's overhead, the difference of their median times; `auto`
// names what the rule picked for the size.
struct AlgorithmRow {
  int64_t bytes = 0;
  std::string algorithm;
  std::string transport;
  std::string picked;  // the algorithm run: the rule's choice for auto, else `algorithm`
  double alone_us = 0;
  double engine_us = 0;
  double overhead_us = 0;  // engine_us - alone_us
  // Rank 0's engine per call (medians over the timed calls): agreeing on the collective, executing
  // it (the algorithm's own time inside the engine), holding it for the cycle grid; -1: unknown.
  double negotiate_us = -1;
  double execute_us = -1;
  double hold_us = -1;
  // The share of the timed calls whose allreduce rode the negotiation's exchange (then `execute`
  // is only the copy out of the sum); -1: unknown.
  double riding_share = -1;
  // The share of the timed calls in which the waiting caller ran the engine's cycles itself
  // (KOLO_CALLER_PROGRESS; Engine::Stats::caller_cycles); -1: unknown.
  double caller_share = -1;
};
// `area_transports`: the transports (rows' transport names) whose devices had a host-wide
// shared-memory area, where the rule may pick one-shot.
std::vector<AlgorithmRow> ComputeAlgorithmRows(const std::vector<SweepRow>& rows, int ranks,
                                               const std::set<std::string>& area_transports = {});
// "" when there is none.
std::string FormatAlgorithmRows(const std::vector<AlgorithmRow>& rows);

// What each rank holds: the connections and transport memory of the benchmark's own device and
// of the engines its rows started (the same connection plan), its resident memory, and how long
// after its process started it finished its first collective (the control channel's first
// gather).
struct RankResources {
  int connections = 0;
  int64_t transport_memory_bytes = 0;
  int engine_connections = 0;
  int64_t engine_transport_memory_bytes = 0;
  int64_t rss_bytes = 0;       // VmRSS at the end of the run
  int64_t peak_rss_bytes = 0;  // VmHWM
  // The benchmark's own buffers (input, work, reference) and the engine's fusion buffer at its
  // threshold: RSS less these is kolo's own memory.
  int64_t buffer_bytes = 0;
  double first_collective_s = 0;
};
// One line per quantity: rank 0, then min / median / max over the ranks.
std::string FormatResources(const std::vector<RankResources>& ranks);

// Distinct host names, in order of first appearance.
std::vector<std::string> DistinctHosts(const std::vector<std::string>& hosts);

// "# ..." lines: ranks, hosts, dtype, op and every setting.
std::string FormatHeader(const RunInfo& info);
// The column titles, then one line per row. The best of several rows of one kind ends in '*'.
std::string FormatSweepColumns();
std::string FormatSweepRows(const std::vector<SweepRow>& rows);
// The ratio table, or a line saying no size had both rows.
std::string FormatRatios(const std::vector<RatioRow>& ratios);

std::string FormatStepColumns(const TensorSet& set, DataType dtype);
std::string FormatStepRow(const StepRow& row);
// The verdict on the ResNet-101 fused-step goal, if `rows` has such a row; else empty.
std::string FormatStepGoal(const TensorSet& set, const std::vector<StepRow>& rows);

nlohmann::json ToJson(const RunInfo& info, const std::vector<SweepRow>& sweep,
                      const std::vector<RatioRow>& ratios, const TensorSet* set,
                      const std::vector<StepRow>& steps,
                      const std::vector<AlgorithmRow>& algorithms = {},
                      const std::vector<RankResources>& resources = {});
// Writes `doc` to `path` (pretty-printed); the error names the path and errno.
Status WriteJson(const std::string& path, const nlohmann::json& doc);

}  // namespace kolo::bench
