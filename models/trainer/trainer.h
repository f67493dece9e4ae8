// The data-parallel training loop of one rank: forward, backward layer by layer with each
// gradient handed to the engine the moment its layer's backward returns, and an update of each
// parameter as soon as its own allreduce has completed (Horovod's DistributedOptimizer, natively).
//
// One step, with N = backward_passes_per_step micro-batches:
//   for m in 0..N-1:    SetInput(micro-batch m) (only when N > 1; once at SetData otherwise)
//                       Forward(l) for every layer l, first to last
//                       Backward(l, accumulate = m > 0) for every layer but the input, last to
//                       first; on the last micro-batch, right after Backward(l) returns,
//                       AllreduceAsync(kAverage, in place) of each parameter of l
//   for p in backprop order: Wait(allreduce of p), then Update(p, grad_scale = 1/N)
// The gradient each rank applies is therefore the mean over ranks of the sum over its micro-batches
// of each micro-batch's mean-loss gradient, scaled by 1/N: the gradient of the mean loss over all
// N * batch * ranks images (exactly so for models without batch norm; batch norm normalises with
// each rank's own micro-batch statistics, as Horovod does).
//
// With a parameter-server engine (Engine::updates_on_servers()), each gradient is pushed with
// Engine::PushPullAsync right after its layer's backward instead of allreduced, the servers apply
// SGD, and "update" means copying the pulled weights into the backend (SetParameter) once that
// parameter's PushPull has completed. The backend's own Update is then not used. The servers
// take host float32 gradients; a gradient elsewhere (on a GPU, or of another type) is staged to
// host first, as TrainerConfig::ps_staging says: `sync` copies it on the training thread
// (GetGradient, which waits for the layer's backward to finish on the device), `overlap` starts
// the copy (StartGradientCopy, into the backend's HostStagingBuffer where it has one) and hands
// it to a staging thread (gradient_stager.h) that pushes each gradient once its copy has landed,
// in backprop order, while the training thread launches the next layers' backward. Step waits for
// the staging thread to have submitted every push before it waits on them; the host buffers stay
// untouched until then.
//
// Without an engine (the single-rank baseline, kolo-train --backend none) nothing is submitted:
// every parameter is updated from its own gradient after backward, with no distributed
// communication at all.
//
// Thread-safety: a Trainer is used by one thread (it runs a staging thread of its own under
// parameter servers with `overlap`). The backend and engine must outlive it; the engine must be
// shut down before the backend is destroyed if a step failed.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "models/compute/backend.h"
#include "models/graph/graph.h"
#include "models/trainer/gradient_stager.h"

namespace kolo::models::trainer {

// One micro-batch of input: batch * C * H * W float32 NCHW images and batch int32 labels.
struct Batch {
  std::vector<float> images;
  std::vector<int32_t> labels;
};

// How gradients that are not host float32 reach the parameter servers (see the file comment).
enum class PsStaging : uint8_t { kSync, kOverlap };
const char* PsStagingName(PsStaging s);  // "sync", "overlap"
// Errors: a name that is neither, InvalidArgument naming it and the allowed ones.
StatusOr<PsStaging> ParsePsStaging(const std::string& name);

struct TrainerConfig {
  // Micro-batches accumulated locally per step (local gradient aggregation); >= 1.
  int backward_passes_per_step = 1;
  compute::SgdConfig sgd;
  // Time every layer (for --record-profile) with the backend's time marks (TimeMark: events on a
  // GPU, so the device's queue is not drained between layers; the host clock after a synchronise
  // on a CPU), and the host's time to issue each call. The marks are read, which waits for the
  // device, once per micro-batch and once after the updates. Off in normal runs.
  bool record_layer_times = false;
  // Longest wait for one collective. The engine fails a collective whose peer is gone after its
  // own peer timeout; this bounds the trainer's wait even so.
  // Also bounds each wait for a staged gradient copy.
  std::chrono::milliseconds wait_timeout{std::chrono::minutes(10)};
  // BroadcastParameters moves the parameters in batches of about this many bytes, each freed once
  // set, so that start-up holds one batch beside the model rather than a second copy of it.
  size_t broadcast_batch_bytes = 64 << 20;
  // Parameter servers only: staging of gradients that are not host float32.
  PsStaging ps_staging = PsStaging::kOverlap;
};

// What one step measured.
struct StepStats {
  double seconds = 0;         // wall time of the whole step
  double loss = 0;            // mean over the micro-batches of the backend's Loss()
  double kernel_seconds = 0;  // inside the backend's kernels (ComputeBackend::TakeKernelSeconds)
  // Blocked in Wait after backward (communication not hidden); with ps_staging `overlap`, also
  // waiting for the staging thread to submit the last pushes.
  double wait_seconds = 0;
  // The step's consecutive phases, as the host's clock sees them (on a GPU, kernels queued in one
  // phase may run in the next): input and forward of every micro-batch; backward of every layer
  // with the gradients' submission and the loss; then wait_seconds; then the updates. With
  // seconds, they leave out only the bookkeeping between them.
  double forward_seconds = 0;
  double backward_seconds = 0;
  double update_seconds = 0;
  // Only with record_layer_times: per layer (graph order), the mean over the micro-batches, and
  // the time of all updates of the step (between time marks); the host's time inside each layer's
  // call, not waiting for the device.
  std::vector<double> forward_ms;
  std::vector<double> backward_ms;
  double update_ms = 0;
  std::vector<double> forward_issue_ms;
  std::vector<double> backward_issue_ms;
};

class Trainer {
 public:
  // REQUIRES: backend.Prepare(graph, ...) succeeded with config.batch = the micro-batch size.
  // `engine` may have any size, 1 included.
  Trainer(const Graph& graph, compute::ComputeBackend& backend, Engine& engine,
          TrainerConfig config);
  // A single rank without distribution: no engine, no collective (see the file comment).
  Trainer(const Graph& graph, compute::ComputeBackend& backend, TrainerConfig config);
  // Not movable: the staging thread calls back into it.
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Copies rank 0's parameters (as the backend holds them) to every rank (nothing to do without
  // an engine): each parameter is
  // broadcast from rank 0 under the name "broadcast/<parameter>" and set on the other ranks.
  // Every rank must call it. With parameter servers the first call also registers every parameter
  // with the servers (float32 host gradients only) and keeps a host copy of the weights that
  // PushPull writes into.
  [[nodiscard]] Status BroadcastParameters();

  // The micro-batches every later step trains on: exactly backward_passes_per_step of them, each
  // of the backend's batch size and the graph's input shape. Labels must lie in [0, classes).
  [[nodiscard]] Status SetData(std::vector<Batch> micro_batches);

  // One synchronous training step (see the file comment). Every rank must call it the same number
  // of times. On error the step's collectives are drained (bounded by wait_timeout) before it
  // returns, so the engine no longer touches the backend's buffers unless it has hung.
  StatusOr<StepStats> Step();

  const TrainerConfig& config() const { return config_; }

 private:
  // Collects the staging thread's pushes (Finish) and waits for every handle still pending in
  // pending_, dropping their statuses.
  void Drain();
  [[nodiscard]] Status RunMicroBatch(int m, bool last, StepStats* stats);
  // Parameter servers: pushes gradient `g` of `param` (its handle into pending_ at once, or, when
  // staged with `overlap`, once CollectStaged has run).
  [[nodiscard]] Status PushPull(int param, const compute::GradientView& g);
  // Starts the PushPull of `param` from host float32 `grad` (the staging thread calls it too).
  StatusOr<Handle> SubmitPushPull(int param, const void* grad);
  // Host memory `overlap` stages `param`'s gradient into: the backend's, or staged_.
  StatusOr<std::span<float>> StagingBuffer(int param);
  // Waits for the staging thread to have submitted (or dropped) every push and moves their
  // handles into pending_. Returns its first failure.
  [[nodiscard]] Status CollectStaged();

  const Graph& graph_;
  compute::ComputeBackend& backend_;
  Trainer(const Graph& graph, compute::ComputeBackend& backend, Engine* engine,
          TrainerConfig config);

  Engine* engine_;  // null: no distribution
  TrainerConfig config_;
  std::vector<Batch> data_;
  std::vector<int> backprop_order_;
  std::vector<Handle> pending_;  // per parameter; id -1 when nothing is in flight
  // Parameter servers only: the weights each PushPull writes, per parameter.
  bool on_servers_ = false;
  bool registered_ = false;
  std::vector<std::vector<float>> pulled_;
  // Parameter servers: host float32 copies of gradients that are not float32 host memory
  // (`sync`, and `overlap` with a backend without HostStagingBuffer).
  std::vector<std::vector<float>> staged_;
  // `overlap`: per parameter, where its gradient is staged (empty until first used).
  std::vector<std::span<float>> staging_buffers_;
  // `overlap`: started with the first staged gradient; declared last so that it stops (and no
  // longer calls SubmitPushPull) before the fields above go.
  std::unique_ptr<GradientStager> stager_;
};

}  // namespace kolo::models::trainer
