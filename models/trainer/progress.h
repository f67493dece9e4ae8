// kolo-train's console output: a header with the settings, a table line per display window (warm-up
// included, with elapsed time and ETA) and the final "total images/sec" line.
//
//   Step    Img/sec                                 total_loss
//   w10     images/sec: 21.3 +/- 0.4 (jitter = 0.3)  6.9312   elapsed 0:05 eta 0:48
//   10      images/sec: 21.5 +/- 0.2 (jitter = 0.1)  6.9021   elapsed 0:10 eta 0:43
//   ...
//   ----------------------------------------------------------------
//   total images/sec: 43.02
//   ----------------------------------------------------------------
//
// Img/sec is this rank's images per second over the window's steps (mean +/- standard deviation
// of the per-step rates; jitter is the median absolute deviation); the total is the sum of every
// rank's measured rate. Warm-up steps are numbered w1, w2, ... With compute=replay every line says
// so and the loss column reads n/a. With time dilation K (--dilation) the rates are at the
// represented pace (measured / K) and the lines say dilation=K; elapsed and ETA are wall time.
#pragma once

#include <atomic>
#include <cstdio>
#include <vector>

#include "models/compute/backend.h"
#include "models/graph/graph.h"
#include "models/trainer/run_record.h"

namespace kolo::models::trainer {

class Progress {
 public:
  // `out` nullptr: prints nothing (ranks other than 0).
  // `dilation` > 1: the rates given to Add are at the represented pace, and lines say so.
  // `stop` (may be null): once it is set, a line whose output blocks (a terminal or pipe nobody
  // drains any more, as mpirun's after Ctrl-C) is dropped instead of blocking the rank, which must
  // reach its next step to stop.
  Progress(std::FILE* out, int warmup_steps, int timed_steps, int display_every, bool replay,
           double dilation = 1, const std::atomic<bool>* stop = nullptr);

  // Records step `step` (0-based over warm-up then timed steps) and prints a line at the end of
  // each display window and at the last step of each phase. `wall_seconds` is the step's wall
  // time, for the elapsed time and the ETA.
  void Add(int step, double images_per_sec, double wall_seconds, double loss);

 private:
  std::FILE* out_;
  int warmup_, timed_, every_;
  bool replay_;
  double dilation_;
  const std::atomic<bool>* stop_;
  double elapsed_ = 0;
  std::vector<double> window_;
};

void PrintHeader(std::FILE* out, const RunSettings& s, const Graph& graph, int ranks, int nodes,
                 const compute::SgdConfig& sgd);
void PrintTotal(std::FILE* out, const RunResults& r, bool replay, double dilation = 1);

}  // namespace kolo::models::trainer
