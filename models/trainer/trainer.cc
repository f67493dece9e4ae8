#include "models/trainer/trainer.h"

#include <fmt/format.h>

#include <string>
#include <utility>

namespace kolo::models::trainer {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

const char* PsStagingName(PsStaging s) {
  switch (s) {
    case PsStaging::kSync:
      return "sync";
    case PsStaging::kOverlap:
      return "overlap";
  }
  return "unknown";
}

StatusOr<PsStaging> ParsePsStaging(const std::string& name) {
  for (PsStaging s : {PsStaging::kSync, PsStaging::kOverlap}) {
    if (name == PsStagingName(s)) return s;
  }
  return InvalidArgument("--ps-staging '{}' is not one of sync, overlap", name);
}

Trainer::Trainer(const Graph& graph, compute::ComputeBackend& backend, Engine& engine,
                 TrainerConfig config)
    : Trainer(graph, backend, &engine, config) {}

Trainer::Trainer(const Graph& graph, compute::ComputeBackend& backend, TrainerConfig config)
    : Trainer(graph, backend, nullptr, config) {}

Trainer::Trainer(const Graph& graph, compute::ComputeBackend& backend, Engine* engine,
                 TrainerConfig config)
    : graph_(graph),
      backend_(backend),
      engine_(engine),
      config_(config),
      backprop_order_(graph.BackpropOrder()),
      pending_(graph.params().size()),
      on_servers_(engine != nullptr && engine->updates_on_servers()) {}

Status Trainer::BroadcastParameters() {
  if (engine_ == nullptr) return Status::OK();
  const auto& params = graph_.params();
  std::vector<std::vector<float>> values(params.size());
  // Parameters go in batches of about config_.broadcast_batch_bytes, each freed once set, so that
  // start-up holds one batch beside the model rather than a second copy of it (VGG-16: 528 MB a
  // rank). With parameter servers every value is kept: it becomes the servers' initial value.
  size_t begin = 0;
  while (begin < params.size()) {
    std::vector<Handle> handles;
    Status first;
    size_t end = begin, bytes = 0;
    while (end < params.size() &&
           (end == begin || on_servers_ || bytes < config_.broadcast_batch_bytes)) {
      values[end].resize(static_cast<size_t>(params[end].numel));
      bytes += values[end].size() * sizeof(float);
      first = backend_.GetParameter(static_cast<int>(end), values[end]);
      if (!first.ok()) break;
      auto h = engine_->BroadcastAsync("broadcast/" + params[end].name, values[end].data(),
                                       DataType::kFloat32, params[end].shape, /*root=*/0);
      if (!h.ok()) {
        first = h.status();
        break;
      }
      handles.push_back(*h);
      ++end;
    }
    // Every submitted broadcast is waited for, even after an error, so that no buffer is freed
    // while the engine may still write it.
    for (size_t i = 0; i < handles.size(); ++i) {
      Status s = engine_->Wait(handles[i], config_.wait_timeout);
      if (first.ok() && !s.ok()) {
        first = s.WithContext("broadcast of '" + params[begin + i].name + "'");
      }
    }
    if (!first.ok()) return first;
    for (size_t p = begin; p < end; ++p) {
      if (engine_->rank() != 0) {
        KOLO_RETURN_IF_ERROR(backend_.SetParameter(static_cast<int>(p), values[p]));
      }
      if (!on_servers_) std::vector<float>().swap(values[p]);
    }
    begin = end;
  }
  if (!on_servers_) return Status::OK();
  if (!registered_) {
    std::vector<VariableSpec> vars;
    for (const Parameter& p : params) vars.push_back({p.name, DataType::kFloat32, p.shape});
    KOLO_RETURN_IF_ERROR(engine_->RegisterVariables(vars));
    registered_ = true;
  }
  // The first PushPull of each variable carries worker 0's weights as the servers' initial value.
  pulled_ = std::move(values);
  return Status::OK();
}

Status Trainer::SetData(std::vector<Batch> micro_batches) {
  if (static_cast<int>(micro_batches.size()) != config_.backward_passes_per_step) {
    return InvalidArgument("trainer: {} micro-batches given, backward_passes_per_step is {}",
                           micro_batches.size(), config_.backward_passes_per_step);
  }
  data_ = std::move(micro_batches);
  // With one micro-batch the input never changes, so it is copied in once, outside the timed loop.
  if (data_.size() == 1) return backend_.SetInput(data_[0].images, data_[0].labels);
  return Status::OK();
}

Status Trainer::RunMicroBatch(int m, bool last, StepStats* stats) {
  const auto& layers = graph_.layers();
  const int n = static_cast<int>(layers.size());
  const bool timed = config_.record_layer_times;
  // With timed: the layer after each mark but the first (its index; backward as -1 - index).
  std::vector<int> marked;
  const auto forward_start = Clock::now();
  if (data_.size() > 1) {
    const Batch& b = data_[static_cast<size_t>(m)];
    KOLO_RETURN_IF_ERROR(backend_.SetInput(b.images, b.labels));
  }
  if (timed) {
    marked.reserve(2 * static_cast<size_t>(n));
    KOLO_RETURN_IF_ERROR(backend_.TimeMark());
  }
  for (int l = 0; l < n; ++l) {
    const auto t0 = timed ? Clock::now() : Clock::time_point{};
    KOLO_RETURN_IF_ERROR(
        backend_.Forward(l).WithContext("forward of layer '" + layers[l].name + "'"));
    if (timed) {
      stats->forward_issue_ms[static_cast<size_t>(l)] += 1e3 * Seconds(t0, Clock::now());
      KOLO_RETURN_IF_ERROR(backend_.TimeMark());
      marked.push_back(l);
    }
  }
  const auto backward_start = Clock::now();
  stats->forward_seconds += Seconds(forward_start, backward_start);
  const auto& params = graph_.params();
  for (int l = n - 1; l >= 0; --l) {
    const Layer& layer = layers[static_cast<size_t>(l)];
    if (layer.kind == LayerKind::kInput) continue;
    const auto t0 = timed ? Clock::now() : Clock::time_point{};
    KOLO_RETURN_IF_ERROR(backend_.Backward(l, /*accumulate=*/m > 0)
                             .WithContext("backward of layer '" + layer.name + "'"));
    if (timed) {
      stats->backward_issue_ms[static_cast<size_t>(l)] += 1e3 * Seconds(t0, Clock::now());
      KOLO_RETURN_IF_ERROR(backend_.TimeMark());
      marked.push_back(-1 - l);
    }
    if (!last) continue;
    for (int p : layer.param_ids) {
      const Parameter& param = params[static_cast<size_t>(p)];
      const compute::GradientView g = backend_.Gradient(p);
      if (g.data == nullptr || g.numel != param.numel) {
        return Internal("backend '{}' has no gradient buffer of {} values for '{}'",
                        backend_.name(), param.numel, param.name);
      }
      if (engine_ == nullptr) continue;  // updated after backward, from its own gradient
      if (on_servers_) {
        KOLO_RETURN_IF_ERROR(PushPull(p, g));
        continue;
      }
      TensorPlace place;
      place.device = g.device;
      place.ready_event = g.ready_event;
      KOLO_ASSIGN_OR_RETURN(
          Handle h, engine_->AllreduceAsync(param.name, g.data, g.data, g.dtype, param.shape,
                                            ReduceOp::kAverage, place));
      pending_[static_cast<size_t>(p)] = h;
    }
  }
  if (timed) {
    KOLO_ASSIGN_OR_RETURN(std::vector<double> at, backend_.TakeMarkTimesMs());
    if (at.size() != marked.size() + 1) {
      return Internal("backend '{}' returned {} time marks, {} were made", backend_.name(),
                      at.size(), marked.size() + 1);
    }
    for (size_t i = 0; i < marked.size(); ++i) {
      const double ms = at[i + 1] - at[i];
      if (marked[i] >= 0) {
        stats->forward_ms[static_cast<size_t>(marked[i])] += ms;
      } else {
        stats->backward_ms[static_cast<size_t>(-1 - marked[i])] += ms;
      }
    }
  }
  KOLO_ASSIGN_OR_RETURN(double loss, backend_.Loss());
  stats->loss += loss / config_.backward_passes_per_step;
  stats->backward_seconds += Seconds(backward_start, Clock::now());
  return Status::OK();
}

StatusOr<StepStats> Trainer::Step() {
  if (data_.empty()) return FailedPrecondition("trainer: Step before SetData");
  StepStats stats;
  if (config_.record_layer_times) {
    stats.forward_ms.assign(graph_.layers().size(), 0.0);
    stats.backward_ms.assign(graph_.layers().size(), 0.0);
    stats.forward_issue_ms.assign(graph_.layers().size(), 0.0);
    stats.backward_issue_ms.assign(graph_.layers().size(), 0.0);
  }
  backend_.TakeKernelSeconds();  // drop whatever ran between steps
  const auto start = Clock::now();
  const int passes = config_.backward_passes_per_step;
  for (int m = 0; m < passes; ++m) {
    Status s = RunMicroBatch(m, m == passes - 1, &stats);
    if (!s.ok()) {
      Drain();
      return s;
    }
  }
  if (stager_ != nullptr) {
    // Every push must have been submitted before its handle is waited on.
    const auto t0 = Clock::now();
    Status s = CollectStaged();
    stats.wait_seconds += Seconds(t0, Clock::now());
    if (!s.ok()) {
      Drain();
      return s;
    }
  }
  const auto& params = graph_.params();
  const double grad_scale = 1.0 / passes;
  double update_s = 0;
  if (config_.record_layer_times) KOLO_RETURN_IF_ERROR(backend_.TimeMark());
  for (int p : backprop_order_) {
    Handle& h = pending_[static_cast<size_t>(p)];
    const auto t0 = Clock::now();
    Status s = engine_ == nullptr ? Status::OK() : engine_->Wait(h, config_.wait_timeout);
    h = Handle{};
    const auto t1 = Clock::now();
    stats.wait_seconds += Seconds(t0, t1);
    if (s.ok()) {
      s = on_servers_ ? backend_.SetParameter(p, pulled_[static_cast<size_t>(p)])
                      : backend_.Update(p, config_.sgd, grad_scale);
    }
    if (!s.ok()) {
      Drain();
      return s.WithContext("parameter '" + params[static_cast<size_t>(p)].name + "'");
    }
    update_s += Seconds(t1, Clock::now());
  }
  if (config_.record_layer_times) {
    const auto t0 = Clock::now();
    KOLO_RETURN_IF_ERROR(backend_.TimeMark());
    KOLO_ASSIGN_OR_RETURN(std::vector<double> at, backend_.TakeMarkTimesMs());
    update_s += Seconds(t0, Clock::now());
    if (at.size() != 2) {
      return Internal("backend '{}' returned {} time marks around the updates, 2 were made",
                      backend_.name(), at.size());
    }
    stats.update_ms = at[1] - at[0];
    for (auto* v : {&stats.forward_ms, &stats.backward_ms, &stats.forward_issue_ms,
                    &stats.backward_issue_ms}) {
      for (double& t : *v) t /= passes;
    }
  }
  stats.update_seconds = update_s;
  stats.seconds = Seconds(start, Clock::now());
  stats.kernel_seconds = backend_.TakeKernelSeconds();
  return stats;
}

Status Trainer::PushPull(int p, const compute::GradientView& g) {
  const Parameter& param = graph_.params()[static_cast<size_t>(p)];
  if (pulled_.size() != graph_.params().size()) {
    return FailedPrecondition("trainer: BroadcastParameters must run before the first step");
  }
  Handle& pending = pending_[static_cast<size_t>(p)];
  if (g.device < 0 && g.dtype == DataType::kFloat32) {
    KOLO_ASSIGN_OR_RETURN(pending, SubmitPushPull(p, g.data));
    return Status::OK();
  }
  // Parameter servers keep float32 master values in host memory: a gradient elsewhere (on a GPU,
  // or in another type) is staged into a host float32 buffer of this parameter's, which stays
  // untouched until the push completes (the step waits for it). The pulled weights go back
  // through SetParameter (which also refreshes the half copies of mixed precision).
  const std::string what =
      fmt::format("staging the gradient of '{}' for the parameter servers", param.name);
  if (config_.ps_staging == PsStaging::kSync) {
    // The copy waits for this layer's backward on the device, so the next layer's backward is
    // launched only after it.
    if (staged_.size() != graph_.params().size()) staged_.resize(graph_.params().size());
    std::vector<float>& host = staged_[static_cast<size_t>(p)];
    host.resize(static_cast<size_t>(param.numel));
    KOLO_RETURN_IF_ERROR(backend_.GetGradient(p, host).WithContext(what));
    KOLO_ASSIGN_OR_RETURN(pending, SubmitPushPull(p, host.data()));
    return Status::OK();
  }
  auto buffer = StagingBuffer(p);
  if (!buffer.ok()) return buffer.status().WithContext(what);
  auto copy = backend_.StartGradientCopy(p, *buffer);
  if (!copy.ok()) return copy.status().WithContext(what);
  if (stager_ == nullptr) {
    stager_ = std::make_unique<GradientStager>(
        [this](int q, const float* host) { return SubmitPushPull(q, host); }, config_.wait_timeout);
  }
  stager_->Add(p, &param.name, std::move(copy).value(), buffer->data());
  return Status::OK();
}

StatusOr<Handle> Trainer::SubmitPushPull(int p, const void* grad) {
  const Parameter& param = graph_.params()[static_cast<size_t>(p)];
  SgdSettings sgd;
  sgd.learning_rate = config_.sgd.learning_rate;
  sgd.momentum = config_.sgd.momentum;
  sgd.weight_decay = config_.sgd.weight_decay;
  sgd.grad_scale = 1.0 / config_.backward_passes_per_step;
  return engine_->PushPullAsync(param.name, grad, pulled_[static_cast<size_t>(p)].data(),
                                DataType::kFloat32, param.shape, sgd);
}

StatusOr<std::span<float>> Trainer::StagingBuffer(int p) {
  const size_t n = graph_.params().size();
  if (staging_buffers_.size() != n) staging_buffers_.resize(n);
  std::span<float>& buffer = staging_buffers_[static_cast<size_t>(p)];
  const auto numel = static_cast<size_t>(graph_.params()[static_cast<size_t>(p)].numel);
  if (buffer.size() == numel) return buffer;
  // The backend's own memory (pinned on a GPU) also outlives a copy left running by a failed step.
  KOLO_ASSIGN_OR_RETURN(buffer, backend_.HostStagingBuffer(p));
  if (buffer.size() != numel) {
    if (staged_.size() != n) staged_.resize(n);
    staged_[static_cast<size_t>(p)].resize(numel);
    buffer = staged_[static_cast<size_t>(p)];
  }
  return buffer;
}

Status Trainer::CollectStaged() {
  if (stager_ == nullptr) return Status::OK();
  std::vector<GradientStager::Submitted> submitted;
  Status s = stager_->Finish(&submitted);
  for (const auto& x : submitted) pending_[static_cast<size_t>(x.param)] = x.handle;
  return s;
}

void Trainer::Drain() {
  if (engine_ == nullptr) return;
  CollectStaged().IgnoreError();
  for (Handle& h : pending_) {
    if (h.id < 0) continue;
    engine_->Wait(h, config_.wait_timeout).IgnoreError();
    h = Handle{};
  }
}

}  // namespace kolo::models::trainer
