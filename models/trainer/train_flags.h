// kolo-train's command line: every flag, its default and the checks made before any work starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/common/options.h"
#include "models/compute/backend.h"
#include "models/trainer/trainer.h"

namespace kolo::models::trainer {

struct TrainOptions {
  std::string model;
  int64_t batch_size = 32;  // images per rank per micro-batch
  int num_warmup_batches = 10;
  int num_batches = 100;
  std::string compute;         // default: the first of AvailableComputeBackends()
  std::string profile;         // --profile: replay's input
  std::string record_profile;  // --record-profile: written by rank 0 after the timed steps
  // --dilation K (replay only, K >= 1): every replayed time is slept K times over, and every time
  // and rate kolo-train reports is the measured one divided by K (the represented pace), so that
  // a network slowed K times (an emulated 1 Gbit/s link, K = 25) stands for one K times faster.
  double dilation = 1;
  compute::Precision precision = compute::Precision::kFp32;  // cudnn defaults to tf32
  int backward_passes_per_step = 1;
  int64_t image_size = 0;  // 0: the model's default
  int64_t num_classes = 1000;
  // learning_rate is used as given with --learning-rate; otherwise RunTraining sets it to
  // 0.1 per 256 images of the global batch (the linear scaling rule), which keeps the full-size
  // models from diverging at small per-rank batches.
  compute::SgdConfig sgd;
  bool learning_rate_given = false;
  std::string json;  // --json: the run record, written by rank 0
  // --json-stdout: rank 0 also prints the record on stdout as one line "kolo-record: {...}", so
  // that a launcher on another host gets it with the output (no shared filesystem needed).
  bool json_stdout = false;
  int display_every = 10;
  uint64_t seed = 1;
  // --ps-staging (backend ps): how gradients that are not host float32 (on a GPU) reach the
  // servers: `overlap` copies them on a side stream while backward goes on, `sync` one blocking
  // copy per parameter on the training thread (TrainerConfig::ps_staging).
  PsStaging ps_staging = PsStaging::kOverlap;
  // --autotune: before the timed steps, a coordinate search over the fusion threshold, the cycle
  // time and (ring backend) the allreduce algorithm, each trial `autotune_trial_steps` steps (the
  // first of each not measured), every rank switching at the same step (Engine::Retune); the
  // timed steps run the best. --autotune-log: a CSV of the trials, written by rank 0.
  bool autotune = false;
  int autotune_trial_steps = 3;
  std::string autotune_log;
  Options engine;  // KOLO_* from the environment, then the engine flags
};

// The outcome of parsing: options to run with, or an exit code with what was printed (--help
// prints usage and exits 0; any invalid flag prints an error naming the value and what is allowed
// to stderr and exits 2).
struct ParsedFlags {
  std::optional<TrainOptions> options;
  int exit_code = 0;
};

// Parses and validates argv, reading the engine's KOLO_* environment first. Prints nothing on
// success.
ParsedFlags ParseTrainFlags(int argc, char** argv);

}  // namespace kolo::models::trainer
