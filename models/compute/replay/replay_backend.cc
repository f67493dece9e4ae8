#include "models/compute/replay/replay_backend.h"

#include <sys/prctl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <ctime>
#include <new>

#include "models/compute/replay/profile.h"

namespace kolo::models::compute::replay {
namespace {

// Sleeps for `seconds` on CLOCK_MONOTONIC without spinning. `carry` holds how far the previous
// sleep overshot its deadline; it is taken off this one so that wake-up latency does not pile up
// over the hundreds of layers of a step, while time the caller spends between calls still counts.
void PreciseSleep(double seconds, double* carry) {
  const double want = seconds - *carry;
  timespec start{};
  clock_gettime(CLOCK_MONOTONIC, &start);
  if (want <= 0) {
    *carry = -want;
    return;
  }
  const auto ns = static_cast<int64_t>(want * 1e9);
  timespec due = start;
  due.tv_sec += static_cast<time_t>(ns / 1000000000);
  due.tv_nsec += static_cast<long>(ns % 1000000000);
  if (due.tv_nsec >= 1000000000) {
    due.tv_nsec -= 1000000000;
    ++due.tv_sec;
  }
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, nullptr) == EINTR) {
  }
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  const double late = static_cast<double>(now.tv_sec - due.tv_sec) +
                      static_cast<double>(now.tv_nsec - due.tv_nsec) * 1e-9;
  *carry = std::clamp(late, 0.0, seconds);
}

// Mixed precision keeps float32 master weights, so the gradients allreduced are float32 at every
// precision, as the cudnn backend (and PyTorch AMP) hands them to the engine.
DataType GradientType(Precision) { return DataType::kFloat32; }

constexpr size_t kAnySize = ~size_t{0};

class ReplayBackend final : public ComputeBackend {
 public:
  const char* name() const override { return "replay"; }
  std::string DeviceName() const override { return profile_.device; }

  Status Prepare(const Graph& graph, const BackendConfig& config) override {
    if (graph_ != nullptr) return FailedPrecondition("replay backend: Prepare called twice");
    if (config.batch <= 0) {
      return InvalidArgument("replay backend: batch {} must be positive", config.batch);
    }
    if (!(config.dilation >= 1) || !std::isfinite(config.dilation)) {
      return InvalidArgument("replay backend: dilation {} is not allowed; allowed: a number >= 1",
                             config.dilation);
    }
    if (config.profile_path.empty()) {
      return InvalidArgument(
          "compute 'replay' needs a profile (--profile FILE; record one with --record-profile)");
    }
    KOLO_ASSIGN_OR_RETURN(profile_, LoadProfile(config.profile_path));
    KOLO_RETURN_IF_ERROR(CheckProfileMatches(profile_, graph, config.batch,
                                             PrecisionName(config.precision), config.profile_path));
    dtype_ = GradientType(config.precision);
    dilation_ = config.dilation;
    const auto& params = graph.params();
    try {
      values_.resize(params.size());
      grads_.resize(params.size());
      for (size_t p = 0; p < params.size(); ++p) {
        // Values are kept only once one is set to something other than zero (see values_).
        // Whole float32 words even for half types, zero-filled: a zero bit pattern is 0.0 in all.
        grads_[p].assign(static_cast<size_t>(params[p].numel * DataTypeSize(dtype_) + 3) / 4, 0.0f);
        total_numel_ += params[p].numel;
      }
    } catch (const std::bad_alloc&) {
      return Internal("replay backend: out of memory for the parameters of '{}' ({} values)",
                      graph.name(), graph.NumParameterElements());
    }
    // The default 50 us timer slack of a normal thread would add up over hundreds of layers.
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    graph_ = &graph;
    return Status::OK();
  }

  Status SetParameter(int param, std::span<const float> values) override {
    KOLO_RETURN_IF_ERROR(CheckParam(param, values.size(), "SetParameter"));
    std::vector<float>& kept = values_[static_cast<size_t>(param)];
    if (kept.empty()) {
      // Zeros (what replay's parameters are, and what a broadcast of them brings) stay unkept.
      if (std::all_of(values.begin(), values.end(), [](float v) { return v == 0.0f; })) {
        return Status::OK();
      }
      try {
        kept.resize(values.size());
      } catch (const std::bad_alloc&) {
        return Internal("replay backend: out of memory for the {} values of parameter '{}'",
                        values.size(), graph_->params()[static_cast<size_t>(param)].name);
      }
    }
    std::copy(values.begin(), values.end(), kept.begin());
    return Status::OK();
  }
  Status GetParameter(int param, std::span<float> out) override {
    KOLO_RETURN_IF_ERROR(CheckParam(param, out.size(), "GetParameter"));
    const std::vector<float>& kept = values_[static_cast<size_t>(param)];
    if (kept.empty()) {
      std::fill(out.begin(), out.end(), 0.0f);
    } else {
      std::copy(kept.begin(), kept.end(), out.begin());
    }
    return Status::OK();
  }
  Status GetGradient(int param, std::span<float> out) override {
    KOLO_RETURN_IF_ERROR(CheckParam(param, out.size(), "GetGradient"));
    const void* data = grads_[static_cast<size_t>(param)].data();
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = static_cast<float>(LoadElement(dtype_, data, i));
    }
    return Status::OK();
  }

  Status SetInput(std::span<const float> images, std::span<const int32_t> labels) override {
    if (graph_ == nullptr) return FailedPrecondition("replay backend: SetInput before Prepare");
    const auto batch = static_cast<size_t>(profile_.batch_size);
    const auto image = static_cast<size_t>(graph_->input_shape().size());
    if (images.size() != batch * image || labels.size() != batch) {
      return InvalidArgument(
          "replay backend: SetInput got {} image values and {} labels, expected {} and {}",
          images.size(), labels.size(), batch * image, batch);
    }
    return Status::OK();
  }

  Status Forward(int layer) override {
    KOLO_RETURN_IF_ERROR(CheckLayer(layer, "Forward"));
    Sleep(profile_.layers[static_cast<size_t>(layer)].forward_ms);
    return Status::OK();
  }
  StatusOr<double> Loss() override { return 0.0; }
  Status Backward(int layer, bool /*accumulate*/) override {
    KOLO_RETURN_IF_ERROR(CheckLayer(layer, "Backward"));
    Sleep(profile_.layers[static_cast<size_t>(layer)].backward_ms);
    return Status::OK();
  }

  GradientView Gradient(int param) override {
    GradientView v;
    if (param < 0 || static_cast<size_t>(param) >= grads_.size()) return v;
    v.data = grads_[static_cast<size_t>(param)].data();
    v.dtype = dtype_;
    v.numel = graph_->params()[static_cast<size_t>(param)].numel;
    return v;
  }

  // Parameters stay as they are (the gradients are zeros by construction); the update's recorded
  // time is spread over the parameters by size.
  Status Update(int param, const SgdConfig& /*sgd*/, double /*grad_scale*/) override {
    KOLO_RETURN_IF_ERROR(CheckParam(param, kAnySize, "Update"));
    if (total_numel_ > 0) {
      const double share = static_cast<double>(graph_->params()[static_cast<size_t>(param)].numel) /
                           static_cast<double>(total_numel_);
      Sleep(profile_.update_ms * share);
    }
    return Status::OK();
  }

  Status Synchronize() override { return Status::OK(); }

  double TakeKernelSeconds() override {
    const double s = slept_s_;
    slept_s_ = 0;
    return s;
  }

 private:
  Status CheckParam(int param, size_t size, const char* call) const {
    if (graph_ == nullptr) return FailedPrecondition("replay backend: {} before Prepare", call);
    if (param < 0 || static_cast<size_t>(param) >= values_.size()) {
      return InvalidArgument("replay backend: {}: parameter {} does not exist (model has {})", call,
                             param, values_.size());
    }
    const auto numel = static_cast<size_t>(graph_->params()[static_cast<size_t>(param)].numel);
    if (size != kAnySize && size != numel) {
      return InvalidArgument("replay backend: {} '{}': {} values given, the parameter has {}", call,
                             graph_->params()[static_cast<size_t>(param)].name, size, numel);
    }
    return Status::OK();
  }
  Status CheckLayer(int layer, const char* call) const {
    if (graph_ == nullptr) return FailedPrecondition("replay backend: {} before Prepare", call);
    if (layer < 0 || static_cast<size_t>(layer) >= profile_.layers.size()) {
      return InvalidArgument("replay backend: {}: layer {} does not exist (model has {})", call,
                             layer, profile_.layers.size());
    }
    return Status::OK();
  }
  // Sleeps the recorded `ms`, stretched by the dilation.
  void Sleep(double ms) {
    const auto start = std::chrono::steady_clock::now();
    PreciseSleep(ms * dilation_ * 1e-3, &carry_s_);
    slept_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  const Graph* graph_ = nullptr;
  Profile profile_;
  DataType dtype_ = DataType::kFloat32;
  // Each parameter's values; empty while they are all zero (replay's parameters start at zero and
  // its updates leave them there), so that a rank holds the gradients and not a second copy of
  // the model (VGG-16: 553 MB a rank) unless something sets other values.
  std::vector<std::vector<float>> values_;
  std::vector<std::vector<float>> grads_;  // raw storage of dtype_ elements
  int64_t total_numel_ = 0;
  double dilation_ = 1;
  double carry_s_ = 0;
  double slept_s_ = 0;
};

}  // namespace

std::unique_ptr<ComputeBackend> CreateReplayBackend() { return std::make_unique<ReplayBackend>(); }

}  // namespace kolo::models::compute::replay
