// The compute-backend interface: what the trainer needs from oneDNN (CPU), cuDNN (GPU) or replay
// (recorded timings) to run a Graph forward and backward, layer by layer, and to update it.
//
// The trainer drives the layers itself (Forward(l) for l = 0..n-1, Backward(l) for l = n-1..0) so
// that it can hand each parameter's gradient to the engine the moment Backward of its layer
// returns, time every layer for --record-profile, and stay the same for every backend. A backend
// owns all memory: parameters, gradients, momentum, activations and their gradients, workspaces.
//
// Gradient buffers are where the engine reduces in place: after Backward(l) the trainer passes
// Gradient(p) of each parameter of l to Engine::AllreduceAsync (in == out), waits for that handle
// and then calls Update(p). Between Backward(l) and the completion of that allreduce the trainer
// calls nothing that touches the gradient of p.
//
// Thread-safety: one backend is used by one thread (the trainer's), except GradientCopy::Wait
// (see below).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/status.h"
#include "models/graph/graph.h"

namespace kolo::models::compute {

// Arithmetic of the GPU backend's convolutions and matrix products. fp32: strict IEEE float32;
// tf32: float32 storage, TF32 tensor-core math (the default on GPUs); fp16 / bf16: mixed precision
// (half activations and gradients, float32 master weights, loss scaling). oneDNN accepts fp32 only
// (it computes in float32 on CPUs); replay plays the precision its profile was recorded at and,
// like cudnn, hands the engine float32 gradients at every precision. The cudnn backend implements
// all four; under fp16 and
// bf16 its gradient buffers stay float32 and hold true gradients (divided by the loss scale before
// the engine sees them), fp16's optimizer step applies to every parameter at once when the step's
// last Update is made, and a step whose reduced gradients hold an inf or NaN is skipped (see
// models/compute/cudnn/cudnn_backend.h).
enum class Precision : uint8_t { kFp32, kTf32, kFp16, kBf16 };
const char* PrecisionName(Precision p);  // "fp32", "tf32", "fp16", "bf16"
StatusOr<Precision> ParsePrecision(const std::string& name);

struct BackendConfig {
  int64_t batch = 0;  // images per micro-batch on this rank; > 0
  Precision precision = Precision::kFp32;
  uint64_t seed =
      1;  // dropout masks (each backward pass draws new masks from it deterministically)
  // cudnn: the CUDA device ordinal; -1 picks local_rank modulo the devices this process sees, the
  // device the engine uses for this rank's tensors.
  int device = 0;
  int local_rank = 0;
  // replay: the profile to play (models/compute/replay/profile.h). Others ignore it.
  std::string profile_path;
  // replay: time dilation, >= 1. Every recorded time (each layer's forward and backward, the
  // update) is slept `dilation` times over, so that a network slowed by the same factor (an
  // emulated 1 Gbit/s link with dilation 25 standing for 25 Gbit/s) keeps its true ratio to the
  // compute. The caller divides what it measures by `dilation` to report the represented pace.
  // Other backends refuse anything but 1.
  double dilation = 1;
};

// torch.optim.SGD semantics: g' = g * grad_scale + weight_decay * w; v = momentum * v + g';
// w -= learning_rate * v. Momentum starts at zero.
struct SgdConfig {
  double learning_rate = 0.1;
  double momentum = 0.9;
  double weight_decay = 1e-4;
};

// A parameter's gradient buffer as the engine sees it.
struct GradientView {
  void* data = nullptr;  // numel elements of dtype, contiguous, in the parameter's layout
  DataType dtype = DataType::kFloat32;
  int64_t numel = 0;
  int device = -1;              // -1: host memory; else the CUDA device holding it
  void* ready_event = nullptr;  // device buffers: cudaEvent_t recorded after the write
};

// A gradient copy to host memory started by ComputeBackend::StartGradientCopy.
//
// Thread-safety: Wait may be called from a thread other than the backend's while that thread
// keeps using the backend; one thread at a time per copy.
class GradientCopy {
 public:
  virtual ~GradientCopy() = default;
  // Blocks until the copy has landed in its host memory (OK), failed (its error), or `timeout`
  // passed (DeadlineExceeded; the copy goes on and Wait may be called again). Destroying a copy
  // that has not completed does not stop it: its host memory may still be written until the next
  // copy of the same parameter completes or the backend is destroyed.
  [[nodiscard]] virtual Status Wait(std::chrono::milliseconds timeout) = 0;
};

class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;

  // "onednn", "cudnn" or "replay" (what rows and records call compute=).
  virtual const char* name() const = 0;

  // The accelerator this backend computes on, for records and profiles ("NVIDIA H100 80GB HBM3");
  // empty for CPU backends (the record then names the CPU). Replay returns the device its profile
  // was recorded on. Valid after Prepare.
  virtual std::string DeviceName() const { return {}; }

  // Creates every kernel and buffer for `graph` at config.batch images per micro-batch. Called
  // once. Parameters start at zero; the trainer sets them. `graph` must outlive the backend.
  // Errors: an unsupported precision or layer, out of memory, a profile that does not match.
  [[nodiscard]] virtual Status Prepare(const Graph& graph, const BackendConfig& config) = 0;

  // Host float32 copies in and out of parameter `param` (graph.params()[param].numel values).
  [[nodiscard]] virtual Status SetParameter(int param, std::span<const float> values) = 0;
  [[nodiscard]] virtual Status GetParameter(int param, std::span<float> out) = 0;
  // The gradient buffer's current contents, as float32 (tests, gradient checks).
  [[nodiscard]] virtual Status GetGradient(int param, std::span<float> out) = 0;

  // The input batch: batch * C * H * W float32 NCHW images and batch int32 labels. Copied; the
  // same batch is used by every later step until SetInput is called again.
  [[nodiscard]] virtual Status SetInput(std::span<const float> images,
                                        std::span<const int32_t> labels) = 0;

  // Forward of one layer. REQUIRES: its inputs' Forward ran in this pass.
  [[nodiscard]] virtual Status Forward(int layer) = 0;
  // Sum of the loss layers' values of the last forward pass (waits for the device if needed).
  virtual StatusOr<double> Loss() = 0;

  // Backward of one layer: the gradient with respect to its inputs (summed over consumers) and,
  // for layers with parameters, the parameter gradients. `accumulate` adds the parameter
  // gradients to what the buffers hold (local gradient aggregation) instead of overwriting them.
  // REQUIRES: the Forward of this pass and the Backward of every consumer ran.
  [[nodiscard]] virtual Status Backward(int layer, bool accumulate) = 0;

  // Where parameter `param`'s gradient lives (stable from Prepare on).
  virtual GradientView Gradient(int param) = 0;

  // --- Optional capability: copying gradients to host while the device computes on (parameter
  // servers take host float32). The defaults are safe for every backend: no staging memory of
  // the backend's own, and a synchronous GetGradient.

  // Host memory that StartGradientCopy of `param` fills fastest (pinned memory on a GPU):
  // numel float32 values owned by the backend, the same span on every call, valid until the
  // backend is destroyed. Empty (the default): the backend has none; any host memory serves.
  // Errors: allocation failure, a parameter that does not exist.
  virtual StatusOr<std::span<float>> HostStagingBuffer(int /*param*/) { return std::span<float>(); }

  // Starts copying the gradient of `param`, as float32, into `out` (numel values of host memory
  // that must stay valid until the copy completes). Call it right after Backward of the
  // parameter's layer: the copy reads the gradient as that backward leaves it, after whatever was
  // queued before, and the host thread returns without waiting for the device. The gradient must
  // not be written again before the copy completes. REQUIRES: the previous copy of `param` has
  // completed. The default copies synchronously (GetGradient) and returns a completed copy.
  // Errors: those of GetGradient, or a copy that could not be started.
  virtual StatusOr<std::unique_ptr<GradientCopy>> StartGradientCopy(int param,
                                                                    std::span<float> out);

  // One SGD step of parameter `param` from its gradient buffer (see SgdConfig).
  [[nodiscard]] virtual Status Update(int param, const SgdConfig& sgd, double grad_scale) = 0;

  // Waits until all queued work is done (GPU); returns at once on CPU.
  [[nodiscard]] virtual Status Synchronize() = 0;

  // Time marks, for --record-profile's per-layer times. TimeMark() records a point after the work
  // issued so far without waiting for it, so that marking every layer leaves the device's queue
  // as full as in an unmarked step; TakeMarkTimesMs() waits for the last mark and returns every
  // mark since the previous Take, in ms after the first of them, then forgets them. On a GPU the
  // marks are events on the compute stream: the time between two is the device time of the work
  // between them, idle gaps included where the host issued it more slowly than the device ran it.
  // The default, for backends whose work is done when a call returns (oneDNN, replay), reads the
  // host clock after Synchronize().
  [[nodiscard]] virtual Status TimeMark();
  virtual StatusOr<std::vector<double>> TakeMarkTimesMs();

  // Seconds spent inside the backend's kernels (oneDNN primitives, cuDNN/cuBLAS calls as seen by
  // the host, replay sleeps: wall-clock, dilated ones included) since the previous call. Used to
  // report the trainer's own overhead.
  virtual double TakeKernelSeconds() = 0;

 private:
  std::vector<std::chrono::steady_clock::time_point> host_marks_;  // the default TimeMark's
};

// The backends this build has, by name, in the order `--compute` lists them.
std::vector<std::string> AvailableComputeBackends();
// Creates the backend `name`; an unknown or unavailable name is an error listing those available.
StatusOr<std::unique_ptr<ComputeBackend>> CreateComputeBackend(const std::string& name);

}  // namespace kolo::models::compute
