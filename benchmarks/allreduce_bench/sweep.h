// The size sweep: for each buffer size, the rows take turns iteration by iteration (so that
// drifting machine load hits every backend alike), with the timing and checking rules of the
// benchmark.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/allreduce_bench/backend.h"
#include "benchmarks/allreduce_bench/control.h"

namespace kolo::bench {

// Per-iteration times (microseconds) reduced over ranks: iteration i's time is the largest any
// rank measured for it; median, min and max are over iterations.
struct TimeSummary {
  double median_us = 0;
  double min_us = 0;
  double max_us = 0;
  // The slowest rank's time of each timed iteration, in order. Rows of one size run their
  // iterations in turn, so iteration i of two rows ran moments apart, under the same load: their
  // ratio, iteration by iteration, is what a loaded host moves least.
  std::vector<double> iters_us;
};
TimeSummary Summarize(const std::vector<double>& per_rank_times, int ranks, int iters);

struct SweepRow {
  int64_t bytes = 0;
  int64_t count = 0;
  DataType dtype = DataType::kFloat32;
  std::string backend;  // row label
  BackendKind kind = BackendKind::kRing;
  // Backend::transport() and Backend::pairs(): the kolo transport the row ran over and which
  // transports carried its pairs ("" for rows that move their payload otherwise).
  std::string transport;
  std::string pairs;
  TimeSummary time;
  // CPU time (user and system, every thread) the ranks spent in each timed iteration, summed over
  // the ranks, in order: the work an iteration costs, which other load on the host moves far less
  // than it moves the time.
  std::vector<double> cpu_iters_us;
  double algbw_gbs = 0;       // bytes / median time, GB/s (1e9 bytes per second)
  double busbw_gbs = 0;       // algbw * 2 (ranks - 1) / ranks
  bool checked = false;       // false for link and with --check 0
  int64_t wrong = 0;          // summed over ranks
  double max_error = 0;       // largest over ranks
  bool best_of_kind = false;  // the fastest of several rows of one kind (gloo's two algorithms)
  // Rows through the engine: rank 0's Backend::EngineParts (negotiation, execution, hold, us per
  // call); empty otherwise.
  std::vector<double> engine_parts_us;
};

// algbw and busbw in GB/s for `bytes` moved in `seconds` by `ranks` ranks.
double AlgBandwidth(int64_t bytes, double seconds);
double BusBandwidth(double algbw, int ranks);

// Runs the sweep of `config` over `rows`. Collective. `on_size` is called on every rank after each
// size with that size's rows (rank 0 prints them). Allocates this rank's input and the working
// buffer once per size (pre-faulted; with --device cuda the working buffer is on CUDA device
// `local_rank` modulo the devices, restored from the host input by a synchronous copy, and each
// row's last result is copied back to be checked). At each size every row is bound, then the rows
// take turns iteration by iteration; each reduces the working buffer in place, restored from the
// input and followed by a barrier before every iteration (untimed), and each row's last result is
// checked.
StatusOr<std::vector<SweepRow>> RunSweep(
    const BenchConfig& config, std::vector<std::unique_ptr<Backend>>& rows, Control& control,
    int local_rank, const std::function<void(const std::vector<SweepRow>&)>& on_size);

}  // namespace kolo::bench
