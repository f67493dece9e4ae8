// `--tensors NAME`: one training step's gradient allreduces through kolo's engine.
//
// Per engine backend (ring, mpi) and fusion setting (on: the configured threshold, default
// 64 MiB; off: threshold 0), an Engine is started and, for warmup + iters steps, every tensor of
// the set is submitted with AllreduceAsync (in place, as a trainer reduces its gradients) in
// backprop order, then all are waited for; the step time runs from the first submission to the
// last completion. The gradients are restored from the rank's input before each step, untimed.
// Each step is followed by a single allreduce of the same total bytes, timed the same way (steps
// and singles take turns, so both see the same load), for the ratio step / single (the cost of
// many tensors over one buffer; the project's goal for ResNet-101 with fusion is <= 1.15).
// Engine statistics are taken around the timed steps only and reported per step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "benchmarks/allreduce_bench/backend.h"
#include "benchmarks/allreduce_bench/control.h"
#include "benchmarks/allreduce_bench/sweep.h"
#include "benchmarks/allreduce_bench/tensor_sets.h"

namespace kolo::bench {

struct StepRow {
  std::string backend;  // "ring", "mpi"
  bool fusion = true;
  int64_t fusion_threshold_bytes = 0;
  int64_t bytes = 0;          // total bytes of the set
  TimeSummary step;           // per step, max over ranks
  TimeSummary single;         // one allreduce of `bytes`
  double ratio = 0;           // step.median / single.median
  double step_busbw_gbs = 0;  // bus bandwidth of the step
  // Engine statistics per timed step (rank 0's engine, but for coordination).
  double negotiations = 0;
  double cache_hits = 0;
  double collectives = 0;
  // Time agreeing per step, averaged over the timed steps: each step's least over ranks (the
  // protocol's own cost, paid by the rank that arrives last at that step's exchange) and each
  // step's most (adds waiting for that rank).
  double coordination_us = 0;
  double coordination_max_us = 0;
  bool checked = false;
  int64_t wrong = 0;  // over the last step and the last single allreduce, all ranks
  double max_error = 0;
};

// The goal for ResNet-101 with fusion: step time at most this multiple of the single allreduce.
inline constexpr double kResNet101FusedRatioGoal = 1.15;

// Runs the step benchmark for every engine backend in config.backends and the fusion settings of
// config.fusion. Collective. `on_row` is called on every rank as each row completes.
StatusOr<std::vector<StepRow>> RunSteps(const BenchConfig& config, const TensorSet& set,
                                        BackendEnv& env, Control& control,
                                        const std::function<void(const StepRow&)>& on_row);

}  // namespace kolo::bench
