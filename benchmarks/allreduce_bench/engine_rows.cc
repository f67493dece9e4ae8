#include "benchmarks/allreduce_bench/engine_rows.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>

#include "engine/collectives/collectives.h"
#include "engine/collectives/plan.h"
#include "engine/common/options.h"
#include "engine/kernels/reduce.h"
#include "engine/transport/transport.h"

namespace kolo::bench {
namespace {

// A collective that stalls fails inside the engine after the peer timeout; the extra margin only
// matters if the engine itself is stuck.
std::chrono::milliseconds WaitTimeout(const Options& o) {
  return std::chrono::milliseconds(static_cast<int64_t>(o.peer_timeout_s * 2000.0) + 10000);
}

class EngineRow final : public Backend {
 public:
  EngineRow(BackendKind kind, BackendEnv& env, std::string transport, std::string label,
            std::string algorithm)
      : kind_(kind),
        env_(env),
        transport_(std::move(transport)),
        label_(std::move(label)),
        algorithm_(std::move(algorithm)) {}

  std::string name() const override { return label_; }
  BackendKind kind() const override { return kind_; }
  // The mpi and nccl backends move the payload themselves; the engine's transport only
  // negotiates.
  std::string transport() const override { return MovesOverTransport() ? transport_ : ""; }
  std::string pairs() const override { return MovesOverTransport() ? pairs_ : ""; }

  Status Bind(const BenchBuffer& buf, size_t count) override {
    KOLO_ASSIGN_OR_RETURN(started_, StartEngine(env_, kind_, std::nullopt, transport_, algorithm_));
    const Engine::Stats stats = started_.engine->stats();
    pairs_ = stats.transport_pairs;
    env_.engine_connections = std::max(env_.engine_connections, stats.transport_connections);
    env_.engine_transport_memory_bytes =
        std::max(env_.engine_transport_memory_bytes, stats.transport_memory_bytes);
    buf_ = buf.data;
    place_ = TensorPlace{};
    place_.device = buf.device;
    count_ = count;
    tensor_ = fmt::format("bench/allreduce/{}", count);
    return Status::OK();
  }

  Status RunOnce() override {
    const Engine::Stats before = started_.engine->stats();
    KOLO_ASSIGN_OR_RETURN(Handle h, started_.engine->AllreduceAsync(
                                        tensor_, buf_, buf_, env_.config->dtype,
                                        {static_cast<int64_t>(count_)}, env_.config->op, place_));
    KOLO_RETURN_IF_ERROR(started_.engine->Wait(h, WaitTimeout(env_.options)));
    // The engine counts a cycle's parts before it completes the cycle's tensors.
    const Engine::Stats after = started_.engine->stats();
    calls_.push_back({after.coordination_us - before.coordination_us,
                      after.execute_us - before.execute_us, after.gather_us - before.gather_us,
                      static_cast<double>(after.riding_collectives - before.riding_collectives),
                      static_cast<double>(after.caller_cycles - before.caller_cycles)});
    return Status::OK();
  }

  void Unbind() override {
    if (!started_.engine) return;
    // Medians over the timed calls (the last `iters`), as the row's time is.
    parts_.clear();
    const size_t timed = std::min(calls_.size(), static_cast<size_t>(env_.config->iters));
    for (size_t part = 0; timed > 0 && part < 3; ++part) {
      std::vector<double> v;
      for (size_t i = calls_.size() - timed; i < calls_.size(); ++i) v.push_back(calls_[i][part]);
      std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
      parts_.push_back(v[v.size() / 2]);
    }
    // The share of the timed calls that rode the negotiation (KOLO_RIDING_MAX_BYTES).
    if (timed > 0) {
      double rode = 0;
      for (size_t i = calls_.size() - timed; i < calls_.size(); ++i) rode += calls_[i][3] > 0;
      parts_.push_back(rode / static_cast<double>(timed));
      double by_caller = 0;
      for (size_t i = calls_.size() - timed; i < calls_.size(); ++i) by_caller += calls_[i][4] > 0;
      parts_.push_back(by_caller / static_cast<double>(timed));
    }
    calls_.clear();
    StopEngine(started_).IgnoreError();  // a failure already surfaced in RunOnce
  }
  std::vector<double> EngineParts() const override { return parts_; }

 private:
  bool MovesOverTransport() const {
    return kind_ == BackendKind::kRing || kind_ == BackendKind::kRingHier;
  }

  BackendKind kind_;
  BackendEnv& env_;
  const std::string transport_;
  const std::string label_;
  const std::string algorithm_;  // "" : the engine options'
  std::string pairs_;
  // Per call: negotiation, execution, hold (us), allreduces that rode the negotiation.
  std::vector<std::array<double, 5>> calls_;
  std::vector<double> parts_;
  StartedEngine started_;
  TensorPlace place_;  // host, or the CUDA device of --device cuda
  void* buf_ = nullptr;
  size_t count_ = 0;
  std::string tensor_;
};

constexpr sched_param kNoPriority{};  // SCHED_BATCH and SCHED_OTHER take priority 0

class LinkRow final : public Backend {
 public:
  LinkRow(BackendEnv& env, transport::Device& device, std::string label)
      : env_(env),
        device_(device),
        label_(std::move(label)),
        batch_(
            EngineThreadIsBatch(env.options.engine_sched, env.options.local_size, OnlineCpus())) {
    // The calling thread's own policy, restored after each exchange.
    caller_policy_ = ::sched_getscheduler(0);
    if (caller_policy_ < 0 || ::sched_getparam(0, &caller_param_) != 0) batch_ = false;
    comm_.device = &device;
    comm_.chunk_bytes = static_cast<size_t>(env.options.ring_chunk_bytes);
    comm_.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(env.options.peer_timeout_s * 1000.0));
  }

  std::string name() const override { return label_; }
  BackendKind kind() const override { return BackendKind::kLink; }
  bool reduces() const override { return false; }
  std::string transport() const override { return device_.name(); }
  std::string pairs() const override { return transport::PairTransports(device_); }

  Status Bind(const BenchBuffer& buf, size_t count) override {
    KOLO_ASSIGN_OR_RETURN(region_, device_.Register(buf.data, buf.size));
    count_ = count;
    return Status::OK();
  }

  // The exchange runs under the scheduling policy the engine's background thread has for the
  // ring row (EngineThreadIsBatch), so that the ceiling is measured in the same conditions.
  Status RunOnce() override {
    const bool switched = batch_ && ::sched_setscheduler(0, SCHED_BATCH, &kNoPriority) == 0;
    Status s = collectives::RingExchangeNoReduce(comm_, *region_, 0, count_, env_.config->dtype);
    if (switched) ::sched_setscheduler(0, caller_policy_, &caller_param_);
    return s;
  }

  void Unbind() override { region_.reset(); }

 private:
  BackendEnv& env_;
  transport::Device& device_;
  const std::string label_;
  bool batch_;
  int caller_policy_ = SCHED_OTHER;
  sched_param caller_param_{};
  collectives::Comm comm_;
  std::unique_ptr<transport::Region> region_;
  size_t count_ = 0;
};

class AloneRow final : public Backend {
 public:
  AloneRow(BackendEnv& env, transport::Device& device, collectives::AllreduceAlgorithm algorithm,
           std::string label, std::shared_ptr<collectives::Scratch> scratch)
      : env_(env),
        device_(device),
        algorithm_(algorithm),
        label_(std::move(label)),
        scratch_(std::move(scratch)) {
    comm_.device = &device;
    comm_.chunk_bytes = static_cast<size_t>(env.options.ring_chunk_bytes);
    comm_.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(env.options.peer_timeout_s * 1000.0));
    const auto area = env.host_areas.find(&device);
    if (area != env.host_areas.end()) comm_.host_area = area->second;
  }

  std::string name() const override { return label_; }
  BackendKind kind() const override { return BackendKind::kRing; }
  std::string transport() const override { return device_.name(); }
  std::string pairs() const override { return transport::PairTransports(device_); }

  Status Bind(const BenchBuffer& buf, size_t count) override {
    if (buf.on_device()) {
      return InvalidArgument("row {} reduces host memory only; run --algorithms with --device host",
                             label_);
    }
    KOLO_ASSIGN_OR_RETURN(region_, device_.Register(buf.data, buf.size));
    count_ = count;
    return Status::OK();
  }

  Status RunOnce() override {
    const DataType dtype = env_.config->dtype;
    // hosts: the rule picks one-shot only with a host area, which exists only on one host.
    KOLO_RETURN_IF_ERROR(collectives::AllreduceWith(algorithm_, /*hosts=*/1, comm_, *region_, 0,
                                                    count_, dtype, *scratch_));
    if (env_.config->op == ReduceOp::kAverage) {
      kernels::Scale(dtype, region_->data(), count_, 1.0 / comm_.size());
    }
    return Status::OK();
  }

  void Unbind() override { region_.reset(); }

 private:
  BackendEnv& env_;
  transport::Device& device_;
  const collectives::AllreduceAlgorithm algorithm_;
  const std::string label_;
  collectives::Comm comm_;
  std::shared_ptr<collectives::Scratch> scratch_;
  std::unique_ptr<transport::Region> region_;
  size_t count_ = 0;
};

}  // namespace

StatusOr<StartedEngine> StartEngine(BackendEnv& env, BackendKind kind,
                                    std::optional<int64_t> fusion_threshold_bytes,
                                    const std::string& transport, const std::string& algorithm) {
  Options o = env.options;
  if (!algorithm.empty()) o.allreduce_algorithm = algorithm;
  o.backend = kind == BackendKind::kMpi ? "mpi" : (kind == BackendKind::kNccl ? "nccl" : "ring");
  o.hierarchical_allreduce = kind == BackendKind::kRingHier;
  if (!transport.empty()) {
    KOLO_ASSIGN_OR_RETURN(const TransportSpec spec, ParseTransportSpec(transport));
    o.transport = spec.name;
    if (spec.streams > 0) o.tcp_streams = spec.streams;
  }
  if (fusion_threshold_bytes) o.fusion_threshold_bytes = *fusion_threshold_bytes;
  StartedEngine started;
  started.store = std::make_unique<bootstrap::PrefixStore>(
      fmt::format("bench/engine/{}/", env.engine_starts++), *env.store);
  auto engine = Engine::Create(o, started.store.get());
  if (!engine.ok()) {
    return engine.status().WithContext(
        fmt::format("starting the engine for backend '{}'", BackendKindName(kind)));
  }
  started.engine = std::move(engine).value();
  return started;
}

Status StopEngine(StartedEngine& started) {
  Status s = started.engine->Shutdown();
  started.engine.reset();
  started.store.reset();
  return s;
}

std::unique_ptr<Backend> MakeEngineRow(BackendKind kind, BackendEnv& env,
                                       const std::string& transport, const std::string& label,
                                       const std::string& algorithm) {
  return std::make_unique<EngineRow>(kind, env, transport, label, algorithm);
}

std::unique_ptr<Backend> MakeAloneRow(BackendEnv& env, transport::Device& device,
                                      const std::string& algorithm, const std::string& label,
                                      std::shared_ptr<collectives::Scratch> scratch) {
  auto parsed = collectives::ParseAllreduceAlgorithm(algorithm);
  return std::make_unique<AloneRow>(env, device,
                                    parsed.ok() ? *parsed : collectives::AllreduceAlgorithm::kRing,
                                    label, std::move(scratch));
}

std::unique_ptr<Backend> MakeLinkRow(BackendEnv& env, transport::Device& device,
                                     const std::string& label) {
  return std::make_unique<LinkRow>(env, device, label);
}

}  // namespace kolo::bench
