#include "benchmarks/allreduce_bench/step_bench.h"

#include <chrono>
#include <cstring>

#include "benchmarks/allreduce_bench/engine_rows.h"
#include "benchmarks/allreduce_bench/reference.h"

namespace kolo::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds WaitTimeout(const Options& o) {
  return std::chrono::milliseconds(static_cast<int64_t>(o.peer_timeout_s * 2000.0) + 10000);
}

struct Measured {
  std::vector<double> step_us;
  std::vector<double> single_us;
  std::vector<double> coordination_us;  // this rank's time agreeing, per timed step
  // Over the timed steps (not the single allreduces between them).
  int64_t negotiations = 0, cache_hits = 0, collectives = 0;
  CheckResult check;
};

class StepRunner {
 public:
  StepRunner(const BenchConfig& config, const TensorSet& set, const Options& options,
             const HostBuffer& in, HostBuffer& buf)
      : config_(config), set_(set), timeout_(WaitTimeout(options)), in_(in), buf_(buf) {
    const size_t elem = DataTypeSize(config.dtype);
    size_t offset = 0;
    for (const TensorSpec& t : set.tensors) {
      offsets_.push_back(offset);
      offset += static_cast<size_t>(NumElements(t.shape)) * elem;
    }
    total_count_ = offset / elem;
  }

  // Every tensor in backprop order, then a wait for all of them. In place, as a trainer reduces
  // its gradients.
  Status Step(Engine& engine) {
    handles_.clear();
    for (size_t i = 0; i < set_.tensors.size(); ++i) {
      const TensorSpec& t = set_.tensors[i];
      uint8_t* grad = buf_.data() + offsets_[i];
      KOLO_ASSIGN_OR_RETURN(
          Handle h, engine.AllreduceAsync(t.name, grad, grad, config_.dtype, t.shape, config_.op));
      handles_.push_back(h);
    }
    for (Handle h : handles_) KOLO_RETURN_IF_ERROR(engine.Wait(h, timeout_));
    return Status::OK();
  }

  Status Single(Engine& engine) {
    KOLO_ASSIGN_OR_RETURN(
        Handle h,
        engine.AllreduceAsync(set_.model + "/single", buf_.data(), buf_.data(), config_.dtype,
                              {static_cast<int64_t>(total_count_)}, config_.op));
    return engine.Wait(h, timeout_);
  }

  // One run of `fn`, its time appended to *times (when not null: a warm-up run). Before it
  // (untimed), the gradients are restored from this rank's input and the ranks pass a barrier,
  // so that no rank's clock runs while another is still restoring; after it, another barrier, so
  // that no rank restores for the next run while another's clock still runs.
  template <typename F>
  Status RunOnce(Control& control, F&& fn, std::vector<double>* times) {
    std::memcpy(buf_.data(), in_.data(), buf_.size());
    KOLO_RETURN_IF_ERROR(control.Barrier());
    const auto t0 = Clock::now();
    KOLO_RETURN_IF_ERROR(fn());
    const auto t1 = Clock::now();
    KOLO_RETURN_IF_ERROR(control.Barrier());
    if (times != nullptr) {
      times->push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    return Status::OK();
  }

  void Check(int ranks, CheckResult* acc) {
    if (!config_.check) return;
    const CheckResult r = CheckOutput(config_.dtype, buf_.data(), total_count_, ranks, config_.op);
    acc->wrong += r.wrong;
    acc->max_error = std::max(acc->max_error, r.max_error);
  }

  // Steps and single allreduces take turns, warm-up and timed alike, so that the ratio between
  // them is taken under the same load (this host's load drifts from second to second).
  Status Measure(Engine& engine, Control& control, Measured* m) {
    KOLO_RETURN_IF_ERROR(control.Barrier());
    auto step = [&] { return Step(engine); };
    auto single = [&] { return Single(engine); };
    for (int i = 0; i < config_.warmup; ++i) {
      KOLO_RETURN_IF_ERROR(RunOnce(control, step, nullptr));
      KOLO_RETURN_IF_ERROR(RunOnce(control, single, nullptr));
    }
    for (int i = 0; i < config_.iters; ++i) {
      const bool last = i + 1 == config_.iters;
      // This rank's statistics around the step alone: the engine records a cycle's agreement
      // time before it completes the cycle's handles, so a step's share is in by the time its
      // last Wait returns.
      const Engine::Stats before = engine.stats();
      KOLO_RETURN_IF_ERROR(RunOnce(control, step, &m->step_us));
      const Engine::Stats after = engine.stats();
      m->coordination_us.push_back(after.coordination_us - before.coordination_us);
      m->negotiations += after.negotiations - before.negotiations;
      m->cache_hits += after.cache_hits - before.cache_hits;
      m->collectives += after.collectives - before.collectives;
      if (last) Check(control.size(), &m->check);
      KOLO_RETURN_IF_ERROR(RunOnce(control, single, &m->single_us));
      if (last) Check(control.size(), &m->check);
    }
    return Status::OK();
  }

 private:
  const BenchConfig& config_;
  const TensorSet& set_;
  std::chrono::milliseconds timeout_;
  const HostBuffer& in_;
  HostBuffer& buf_;
  std::vector<size_t> offsets_;
  size_t total_count_ = 0;
  std::vector<Handle> handles_;
};

StatusOr<StepRow> MeasureOne(const BenchConfig& config, const TensorSet& set, BackendEnv& env,
                             Control& control, BackendKind kind, int64_t threshold,
                             const HostBuffer& in, HostBuffer& buf) {
  KOLO_ASSIGN_OR_RETURN(StartedEngine started, StartEngine(env, kind, threshold));
  StepRunner runner(config, set, env.options, in, buf);
  Measured m;
  Status s = runner.Measure(*started.engine, control, &m);
  Status stop = StopEngine(started);
  KOLO_RETURN_IF_ERROR(s);
  KOLO_RETURN_IF_ERROR(stop);

  std::vector<double> mine = m.step_us;
  mine.insert(mine.end(), m.single_us.begin(), m.single_us.end());
  mine.push_back(static_cast<double>(m.check.wrong));
  mine.push_back(m.check.max_error);
  mine.insert(mine.end(), m.coordination_us.begin(), m.coordination_us.end());
  KOLO_ASSIGN_OR_RETURN(std::vector<double> all, control.AllgatherDoubles(mine));
  const size_t stride = mine.size();
  const int n = config.iters;
  std::vector<double> steps, singles;
  StepRow row;
  // Per step, the least coordination time over ranks and the most.
  std::vector<double> least(static_cast<size_t>(n), 0), most(static_cast<size_t>(n), 0);
  for (int r = 0; r < control.size(); ++r) {
    const double* base = all.data() + r * stride;
    steps.insert(steps.end(), base, base + n);
    singles.insert(singles.end(), base + n, base + 2 * n);
    row.wrong += static_cast<int64_t>(base[2 * n]);
    row.max_error = std::max(row.max_error, base[2 * n + 1]);
    for (int i = 0; i < n; ++i) {
      const double coord = base[2 * n + 2 + i];
      least[i] = r == 0 ? coord : std::min(least[i], coord);
      most[i] = std::max(most[i], coord);
    }
  }
  // The last rank to reach a step's exchange waits for nobody: its time is the protocol's own
  // cost. The others add the wait for it (skew, which the step's allreduce would wait out anyway).
  for (int i = 0; i < n; ++i) {
    row.coordination_us += least[i] / n;
    row.coordination_max_us += most[i] / n;
  }
  row.backend = BackendKindName(kind);
  row.fusion = threshold > 0;
  row.fusion_threshold_bytes = threshold;
  row.bytes = set.total_elements() * static_cast<int64_t>(DataTypeSize(config.dtype));
  row.step = Summarize(steps, control.size(), n);
  row.single = Summarize(singles, control.size(), n);
  row.ratio = row.single.median_us > 0 ? row.step.median_us / row.single.median_us : 0;
  row.step_busbw_gbs =
      BusBandwidth(AlgBandwidth(row.bytes, row.step.median_us * 1e-6), control.size());
  row.negotiations = static_cast<double>(m.negotiations) / n;
  row.cache_hits = static_cast<double>(m.cache_hits) / n;
  row.collectives = static_cast<double>(m.collectives) / n;
  row.checked = config.check;
  return row;
}

}  // namespace

StatusOr<std::vector<StepRow>> RunSteps(const BenchConfig& config, const TensorSet& set,
                                        BackendEnv& env, Control& control,
                                        const std::function<void(const StepRow&)>& on_row) {
  // main.cc has already applied --fusion-threshold-mb to the engine options.
  const int64_t on_threshold = env.options.fusion_threshold_bytes;
  if (config.fusion != FusionMode::kOff && on_threshold <= 0) {
    return InvalidArgument(
        "the fusion-on rows need a fusion threshold above 0 bytes, got {} (set "
        "--fusion-threshold-mb or KOLO_FUSION_THRESHOLD_BYTES above 0, or pass --fusion off)",
        on_threshold);
  }
  std::vector<int64_t> thresholds;
  if (config.fusion != FusionMode::kOff) thresholds.push_back(on_threshold);
  if (config.fusion != FusionMode::kOn) thresholds.push_back(0);

  const size_t bytes = static_cast<size_t>(set.total_elements()) * DataTypeSize(config.dtype);
  KOLO_ASSIGN_OR_RETURN(HostBuffer in, HostBuffer::Allocate(bytes));
  KOLO_ASSIGN_OR_RETURN(HostBuffer buf, HostBuffer::Allocate(bytes));
  FillInput(config.dtype, in.data(), static_cast<size_t>(set.total_elements()), control.rank());
  std::vector<StepRow> rows;
  for (BackendKind kind : config.backends) {
    for (int64_t threshold : thresholds) {
      KOLO_ASSIGN_OR_RETURN(StepRow row,
                            MeasureOne(config, set, env, control, kind, threshold, in, buf));
      on_row(row);
      rows.push_back(std::move(row));
    }
  }
  return rows;
}

}  // namespace kolo::bench
