#include "models/trainer/train_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/common/fault_inject.h"
#include "engine/common/file.h"
#include "engine/engine.h"
#include "models/compute/replay/profile.h"
#include "models/graph/init.h"
#include "models/trainer/progress.h"
#include "models/trainer/run_record.h"
#include "models/trainer/synthetic_data.h"
#include "models/trainer/trainer.h"
#include "models/zoo/zoo.h"

namespace kolo::models::trainer {
namespace {

// Where the run is and who it is, for the stop deadline's message (main.cc): read from another
// thread, so behind a mutex (never touched from a signal handler).
struct Whereabouts {
  std::mutex mu;
  std::string phase = "start-up (parsing flags)";
  std::string who = "rank ?";
};
Whereabouts& Where() {
  static Whereabouts w;
  return w;
}
void SetPhase(std::string phase) {
  std::lock_guard<std::mutex> lock(Where().mu);
  Where().phase = std::move(phase);
}
void SetWho(std::string who) {
  std::lock_guard<std::mutex> lock(Where().mu);
  Where().who = std::move(who);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

RunSettings SettingsFrom(const TrainOptions& o) {
  RunSettings s;
  s.model = o.model;
  s.batch_size = o.batch_size;
  s.num_warmup_batches = o.num_warmup_batches;
  s.num_batches = o.num_batches;
  s.compute = o.compute;
  s.profile = o.profile;
  s.dilation = o.dilation;
  s.backend = o.engine.backend;
  s.transport = o.engine.backend == "none" ? "" : o.engine.transport;
  // The allreduce algorithm is the ring backend's (NCCL, MPI and parameter servers run their own).
  s.allreduce_algorithm = o.engine.backend == "ring" ? o.engine.allreduce_algorithm : "";
  s.compression = o.engine.backend == "none" ? "" : o.engine.compression;
  s.autotune = false;  // set once the search has run (Run::Autotune)
  s.tcp_streams = o.engine.backend == "ring" || o.engine.backend == "ps"
                      ? TcpStreamsName(o.engine.tcp_streams)
                      : "";
  s.hierarchical_allreduce = o.engine.hierarchical_allreduce;
  s.precision = compute::PrecisionName(o.precision);
  s.fusion_threshold_mb = static_cast<double>(o.engine.fusion_threshold_bytes) / (1 << 20);
  s.cycle_time_ms = o.engine.cycle_time_ms;
  s.backward_passes_per_step = o.backward_passes_per_step;
  s.image_size = o.image_size;
  s.num_classes = o.num_classes;
  s.ranks = o.engine.size;
  if (o.engine.backend == "ps") {
    s.ps_servers = o.engine.ps_server_ranks.empty()
                       ? o.engine.ps_servers
                       : static_cast<int>(o.engine.ps_server_ranks.size());
    s.ps_placement = o.engine.ps_placement;
    s.ps_pacing = FormatBitRate(o.engine.ps_pacing_bits_per_s);
    s.ps_staging = PsStagingName(o.ps_staging);
    s.ranks = o.engine.size - s.ps_servers;
  }
  return s;
}

// Every rank's host name, in rank order, through the engine.
StatusOr<std::vector<std::string>> GatherHostNames(Engine& engine) {
  const std::string mine = HostName();
  KOLO_ASSIGN_OR_RETURN(Handle h, engine.AllgatherAsync("hosts", mine.data(), DataType::kUInt8,
                                                        {static_cast<int64_t>(mine.size())}));
  KOLO_ASSIGN_OR_RETURN(GatheredTensor g, engine.TakeGathered(h));
  std::vector<std::string> hosts;
  size_t offset = 0;
  for (int64_t n : g.first_dims) {
    hosts.emplace_back(reinterpret_cast<const char*>(g.data.data()) + offset,
                       static_cast<size_t>(n));
    offset += static_cast<size_t>(n);
  }
  return hosts;
}

// The engine's communication over the timed steps, per rank and step (see Breakdown).
struct CommPerStep {
  double comm_ms = 0, negotiation_ms = 0, bytes = 0, collectives = 0, cycles = 0, hold_ms = 0;
};

CommPerStep CommBetween(const Engine::Stats& a, const Engine::Stats& b, const std::string& backend,
                        int size, int steps) {
  CommPerStep c;
  if (steps <= 0) return c;
  const double n = steps;
  c.negotiation_ms = (b.coordination_us - a.coordination_us) / 1e3 / n;
  c.collectives = static_cast<double>(b.collectives - a.collectives) / n;
  c.cycles = static_cast<double>(b.cycles - a.cycles) / n;
  if (b.cycles > a.cycles) {
    c.hold_ms = (b.gather_us - a.gather_us) / 1e3 / static_cast<double>(b.cycles - a.cycles);
  }
  if (backend == "ps") {
    c.comm_ms = (b.ps_busy_us - a.ps_busy_us) / 1e3 / n;
    c.bytes = static_cast<double>(b.ps_bytes_sent - a.ps_bytes_sent) / n;
    return c;
  }
  c.comm_ms = c.negotiation_ms + (b.execute_us - a.execute_us) / 1e3 / n;
  c.bytes = static_cast<double>(b.transport_bytes_sent - a.transport_bytes_sent) / n;
  if (backend != "ring" && size > 1) {
    // MPI and NCCL move the payload themselves: a bandwidth-optimal allreduce sends 2(N-1)/N of it
    // (as it travelled: half of float32's under compression).
    c.bytes += 2.0 * (size - 1) / size *
               static_cast<double>(b.allreduce_wire_bytes - a.allreduce_wire_bytes) / n;
  }
  return c;
}

// With time dilation K every replayed time was slept K times over: the step's measured times are
// divided by K, the pace the run stands for (kernel_seconds too, so that shares stay the same).
void Represent(StepStats* st, double dilation) {
  if (dilation == 1) return;
  st->seconds /= dilation;
  st->kernel_seconds /= dilation;
  st->wait_seconds /= dilation;
  st->forward_seconds /= dilation;
  st->backward_seconds /= dilation;
  st->update_seconds /= dilation;
  for (double& t : st->forward_ms) t /= dilation;
  for (double& t : st->backward_ms) t /= dilation;
  for (double& t : st->forward_issue_ms) t /= dilation;
  for (double& t : st->backward_issue_ms) t /= dilation;
  st->update_ms /= dilation;
}

// State of one run, so that every exit path can fill and write the record.
class Run {
 public:
  Run(const TrainOptions& o, const std::atomic<bool>& stop, const std::string& commit,
      const std::atomic<int64_t>* stop_ns)
      : o_(o), stop_(stop), stop_ns_(stop_ns) {
    record_.kolo_commit = commit;
    record_.timestamp = UtcTimestamp();
    record_.cpu_model = CpuModel();
    record_.hosts = {HostName()};
    record_.settings = SettingsFrom(o);
    rank_ = o.engine.rank;
    SetWho(fmt::format("rank {}", rank_));
  }

  int Execute() {
    Status s = Train();
    SetPhase("shutting down the engine");
    // A rank stopped by a signal may see its peers' shutdown as a failed collective: then the
    // signal is the cause. An engine that failed before the signal (a peer lost, after which the
    // launcher stops every rank) keeps its own error as the cause.
    const bool failed_first = !s.ok() && FailedBeforeSignal();
    if (!failed_first) Stopping();
    if (s.ok() && interrupted_) s = Aborted("interrupted");
    if (engine_) {
      Status down = engine_->Shutdown();
      if (s.ok() && !down.ok()) s = down;
    }
    if (!s.ok() && !failed_first && stop_.load()) interrupted_ = true;
    record_.ok = s.ok();
    if (interrupted_) {
      record_.error = "interrupted";
      record_.results.reset();
      if (steps_done_ == 0) {
        std::fprintf(stderr, "kolo-train %s: interrupted during start-up, before any step\n",
                     Who().c_str());
      } else {
        std::fprintf(stderr, "kolo-train %s: interrupted; stopped after step %d\n", Who().c_str(),
                     steps_done_);
      }
    } else if (!s.ok()) {
      record_.error = s.message();
      std::fprintf(stderr, "kolo-train %s: error: %s\n", Who().c_str(), s.message().c_str());
    }
    if (rank_ == 0 && !serving_ && !o_.json.empty()) {
      Status w = WriteRunRecord(record_, o_.json);
      if (!w.ok()) {
        std::fprintf(stderr, "kolo-train rank 0: %s\n", w.message().c_str());
        if (record_.ok) return kExitFailed;
      }
    }
    if (rank_ == 0 && !serving_ && o_.json_stdout) {
      // Pretty-printed JSON has its line breaks between tokens only (strings escape theirs).
      std::string line = RunRecordToJson(record_);
      std::replace(line.begin(), line.end(), '\n', ' ');
      std::fflush(stderr);
      std::printf("kolo-record: %s\n", line.c_str());
      std::fflush(stdout);
    }
    if (interrupted_) return kExitInterrupted;
    if (!record_.ok && bad_setting_) return kExitBadFlags;
    return record_.ok ? kExitOk : kExitFailed;
  }

 private:
  bool distributed() const { return engine_ != nullptr; }
  int size() const { return engine_ ? engine_->size() : 1; }
  std::string Who() const {
    return serving_ ? fmt::format("server {}", engine_->rank()) : fmt::format("rank {}", rank_);
  }
  bool Stopping() {
    if (stop_.load()) interrupted_ = true;
    return interrupted_;
  }
  // Whether this rank's engine failed before any stop signal arrived.
  bool FailedBeforeSignal() const {
    if (!engine_) return false;
    const auto failed = engine_->failed_at();
    if (!failed) return false;
    const int64_t signalled = stop_ns_ != nullptr ? stop_ns_->load() : 0;
    if (signalled == 0) return !stop_.load();
    return failed->time_since_epoch() < std::chrono::nanoseconds(signalled);
  }

  Status Train();
  Status Setup();
  Status Loop(Trainer& trainer, const compute::SgdConfig& sgd);
  // --autotune: the coordinate search, between the warm-up and the timed steps (see TrainOptions).
  Status Autotune(Trainer& trainer);
  // Every rank switches to rank 0's `t` (broadcast first), at the same step.
  Status SwitchTo(Engine::Tunables* t, int trial);
  // Runs o_.autotune_trial_steps steps and returns this rank's images/sec over all but the first
  // (the median step, at the represented pace).
  StatusOr<double> Trial(Trainer& trainer);
  Status Finish(const Trainer& trainer);

  const TrainOptions& o_;
  const std::atomic<bool>& stop_;
  const std::atomic<int64_t>* stop_ns_;
  RunRecord record_;
  int rank_ = 0;
  int steps_done_ = 0;  // steps run, warm-up included
  bool interrupted_ = false;
  bool bad_setting_ = false;  // the compute refused a setting at set-up: exit as for a bad flag
  bool serving_ = false;      // a parameter-server rank
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<compute::ComputeBackend> backend_;
  std::unique_ptr<Engine> engine_;
  // Per timed step.
  std::vector<double> step_s_, wait_s_, kernel_s_, forward_s_, backward_s_, update_s_;
  Engine::Stats timed_start_, timed_end_;  // the engine's counters around the timed steps
  std::vector<std::vector<double>> fwd_ms_, bwd_ms_;              // [layer][timed step]
  std::vector<std::vector<double>> fwd_issue_ms_, bwd_issue_ms_;  // host time inside each call
  std::vector<double> update_ms_;
  double last_loss_ = 0;
};

Status Run::Setup() {
  // --backend none: one rank with no engine at all (the single-rank baseline).
  if (o_.engine.backend != "none") {
    SetPhase("start-up (rendezvous and connecting to the other ranks; no step has run)");
    Options engine_options = o_.engine;
    // Autotune may switch hierarchical allreduce (where the hosts allow): its rings' peers are
    // connected from the start.
    if (o_.autotune) engine_options.hierarchical_switchable = true;
    KOLO_ASSIGN_OR_RETURN(engine_, Engine::Create(engine_options));
    if (engine_->role() == Role::kServer) {
      serving_ = true;
      SetWho(Who());
      SetPhase("serving parameters");
      return Status::OK();
    }
    rank_ = engine_->rank();  // the worker index under parameter servers
    SetWho(Who());
  }
  SetPhase("start-up (building the model and the compute; no step has run)");
  if (Stopping()) return Status::OK();
  zoo::ModelConfig mc;
  mc.image_size = o_.image_size;
  mc.num_classes = o_.num_classes;
  KOLO_ASSIGN_OR_RETURN(Graph g, zoo::BuildModel(o_.model, mc));
  graph_ = std::make_unique<Graph>(std::move(g));
  KOLO_ASSIGN_OR_RETURN(backend_, compute::CreateComputeBackend(o_.compute));
  compute::BackendConfig bc;
  bc.batch = o_.batch_size;
  bc.precision = o_.precision;
  bc.seed = o_.seed + static_cast<uint64_t>(rank_);
  bc.device = -1;  // local_rank modulo the visible GPUs, as the engine picks
  bc.local_rank = o_.engine.local_rank;
  bc.profile_path = o_.profile;
  bc.dilation = o_.dilation;
  Status prepared = backend_->Prepare(*graph_, bc);
  // A setting the compute refuses (a batch that cannot fit, a precision it lacks) is a bad flag.
  bad_setting_ = prepared.code() == StatusCode::kInvalidArgument;
  KOLO_RETURN_IF_ERROR(prepared.WithContext(
      fmt::format("compute '{}', model '{}', batch {}", o_.compute, o_.model, o_.batch_size)));
  record_.gpu_model = backend_->DeviceName();
  if (!distributed()) {
    record_.settings.nodes = record_.settings.ranks = 1;
    return Status::OK();
  }
  KOLO_ASSIGN_OR_RETURN(record_.hosts, GatherHostNames(*engine_));
  std::vector<std::string> distinct = record_.hosts;
  std::sort(distinct.begin(), distinct.end());
  record_.settings.nodes =
      static_cast<int>(std::unique(distinct.begin(), distinct.end()) - distinct.begin());
  record_.settings.ranks = engine_->size();
  return Status::OK();
}

Status Run::Train() {
  KOLO_RETURN_IF_ERROR(Setup());
  // A parameter server serves until every worker has shut down, interrupted or not.
  if (serving_) return engine_->Serve();
  if (Stopping()) return Status::OK();
  TrainerConfig tc;
  tc.backward_passes_per_step = o_.backward_passes_per_step;
  tc.sgd = o_.sgd;
  if (!o_.learning_rate_given) {
    tc.sgd.learning_rate =
        0.1 * static_cast<double>(o_.batch_size * o_.backward_passes_per_step * size()) / 256.0;
  }
  tc.record_layer_times = !o_.record_profile.empty();
  tc.ps_staging = o_.ps_staging;
  Trainer trainer =
      distributed() ? Trainer(*graph_, *backend_, *engine_, tc) : Trainer(*graph_, *backend_, tc);
  if (rank_ == 0) {
    // Only the root's values matter: the broadcast overwrites everyone else's.
    const auto& params = graph_->params();
    std::vector<float> values;
    for (size_t p = 0; p < params.size(); ++p) {
      values.resize(static_cast<size_t>(params[p].numel));
      InitialParameter(params[p], static_cast<int>(p), o_.seed, values);
      KOLO_RETURN_IF_ERROR(backend_->SetParameter(static_cast<int>(p), values));
    }
  }
  SetPhase("start-up (broadcasting the initial parameters; no step has run)");
  KOLO_RETURN_IF_ERROR(trainer.BroadcastParameters());
  KOLO_RETURN_IF_ERROR(trainer.SetData(MakeSyntheticBatches(graph_->input_shape(), o_.batch_size,
                                                            o_.backward_passes_per_step,
                                                            o_.num_classes, o_.seed, rank_)));
  if (Stopping()) return Status::OK();
  KOLO_RETURN_IF_ERROR(Loop(trainer, tc.sgd));
  if (interrupted_) return Status::OK();
  return Finish(trainer);
}

Status Run::Loop(Trainer& trainer, const compute::SgdConfig& sgd) {
  const bool replay = o_.compute == "replay";
  const int64_t images_per_step = o_.batch_size * o_.backward_passes_per_step;
  if (rank_ == 0) {
    PrintHeader(stdout, record_.settings, *graph_, size(), record_.settings.nodes, sgd);
  }
  Progress progress(rank_ == 0 ? stdout : nullptr, o_.num_warmup_batches, o_.num_batches,
                    o_.display_every, replay, o_.dilation, &stop_);
  const int total = o_.num_warmup_batches + o_.num_batches;
  if (!o_.record_profile.empty()) {
    fwd_ms_.assign(graph_->layers().size(), {});
    bwd_ms_.assign(graph_->layers().size(), {});
    fwd_issue_ms_.assign(graph_->layers().size(), {});
    bwd_issue_ms_.assign(graph_->layers().size(), {});
  }
  for (int step = 0; step < total; ++step) {
    if (Stopping()) return Status::OK();
    if (step == o_.num_warmup_batches && o_.autotune && distributed()) {
      KOLO_RETURN_IF_ERROR(Autotune(trainer));
      if (Stopping()) return Status::OK();
    }
    // Tests only (KOLO_FAULT_INJECT=R:EXIT:step:N): this rank finishes early.
    if (FaultPoint(FaultPointId::kStep, rank_)) break;
    const bool timed = step >= o_.num_warmup_batches;
    if (step == o_.num_warmup_batches && distributed()) timed_start_ = engine_->stats();
    SetPhase(fmt::format("step {} of {}{}", step + 1, total, timed ? "" : " (warm-up)"));
    KOLO_ASSIGN_OR_RETURN(StepStats st, trainer.Step());
    ++steps_done_;
    last_loss_ = st.loss;
    const double wall_s = st.seconds;
    Represent(&st, o_.dilation);
    if (timed) {
      step_s_.push_back(st.seconds);
      wait_s_.push_back(st.wait_seconds);
      kernel_s_.push_back(st.kernel_seconds);
      forward_s_.push_back(st.forward_seconds);
      backward_s_.push_back(st.backward_seconds);
      update_s_.push_back(st.update_seconds);
      for (size_t l = 0; l < fwd_ms_.size(); ++l) {
        fwd_ms_[l].push_back(st.forward_ms[l]);
        bwd_ms_[l].push_back(st.backward_ms[l]);
        fwd_issue_ms_[l].push_back(st.forward_issue_ms[l]);
        bwd_issue_ms_[l].push_back(st.backward_issue_ms[l]);
      }
      if (!fwd_ms_.empty()) update_ms_.push_back(st.update_ms);
    }
    progress.Add(step, static_cast<double>(images_per_step) / st.seconds, wall_s, st.loss);
  }
  // Every collective of the timed steps has completed: Step waits for all of its own.
  if (distributed()) timed_end_ = engine_->stats();
  return Status::OK();
}

Status Run::SwitchTo(Engine::Tunables* t, int trial) {
  // Rank 0's values for every rank: fusion threshold, cycle time, algorithm index, hierarchical.
  const auto& names = AllreduceAlgorithmNames();
  double v[4] = {static_cast<double>(t->fusion_threshold_bytes), t->cycle_time_ms, 0,
                 t->hierarchical_allreduce ? 1.0 : 0.0};
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == t->allreduce_algorithm) v[2] = static_cast<double>(i);
  }
  KOLO_ASSIGN_OR_RETURN(Handle h,
                        engine_->BroadcastAsync(fmt::format("kolo.autotune.values.{}", trial), v,
                                                DataType::kFloat64, {4}, 0));
  KOLO_RETURN_IF_ERROR(engine_->Wait(h));
  const size_t algorithm = static_cast<size_t>(v[2]);
  if (algorithm >= names.size()) return Internal("autotune: algorithm index {} from rank 0", v[2]);
  t->fusion_threshold_bytes = static_cast<int64_t>(v[0]);
  t->cycle_time_ms = v[1];
  t->allreduce_algorithm = names[algorithm];
  t->hierarchical_allreduce = v[3] != 0;
  return engine_->Retune(fmt::format("kolo.autotune.switch.{}", trial), *t);
}

StatusOr<double> Run::Trial(Trainer& trainer) {
  const int64_t images_per_step = o_.batch_size * o_.backward_passes_per_step;
  std::vector<double> seconds;
  for (int k = 0; k < o_.autotune_trial_steps; ++k) {
    if (Stopping()) return 0.0;
    KOLO_ASSIGN_OR_RETURN(StepStats st, trainer.Step());
    ++steps_done_;
    last_loss_ = st.loss;
    Represent(&st, o_.dilation);
    if (k > 0) seconds.push_back(st.seconds);  // the first runs across the switch
  }
  std::sort(seconds.begin(), seconds.end());
  return static_cast<double>(images_per_step) / seconds[seconds.size() / 2];
}

// Coordinate search (one knob at a time, each over its values, keeping a value only when it is
// faster than the best so far): fusion threshold, then cycle time, then (ring) the allreduce
// algorithm, then (ring, where the engine can switch it) hierarchical allreduce. Rank 0 measures
// and decides; every rank switches with it (SwitchTo).
Status Run::Autotune(Trainer& trainer) {
  SetPhase("autotune");
  const bool ring = o_.engine.backend == "ring";
  const bool hierarchical = ring && engine_->CanSwitchHierarchical();
  Engine::Tunables best = engine_->tunables();
  const std::vector<double> fusion_mb = {4, 16, 64, 128};
  const std::vector<double> cycles_ms = {0.5, 1, 2.5, 5};
  // The rule (auto) or the ring for every size; hierarchical allreduce allows only those two.
  const std::vector<std::string> algorithms = {"auto", "ring"};
  int trial = 0;
  double best_rate = 0;
  auto run = [&](Engine::Tunables t, bool baseline) -> Status {
    KOLO_RETURN_IF_ERROR(SwitchTo(&t, trial));
    KOLO_ASSIGN_OR_RETURN(double rate, Trial(trainer));
    // Rank 0's measurement decides for every rank.
    KOLO_ASSIGN_OR_RETURN(
        Handle h, engine_->BroadcastAsync(fmt::format("kolo.autotune.rate.{}", trial), &rate,
                                          DataType::kFloat64, {1}, 0));
    KOLO_RETURN_IF_ERROR(engine_->Wait(h));
    const bool kept = baseline || rate > best_rate;
    if (kept) {
      best = t;
      best_rate = rate;
    }
    record_.autotune_trials.push_back(
        AutotuneTrial{static_cast<double>(t.fusion_threshold_bytes) / (1 << 20), t.cycle_time_ms,
                      ring ? t.allreduce_algorithm : "", t.hierarchical_allreduce, rate, kept});
    if (rank_ == 0) {
      std::printf("autotune trial %d: fusion %g MiB, cycle %g ms%s%s: %.1f images/sec (rank 0)%s\n",
                  trial + 1, static_cast<double>(t.fusion_threshold_bytes) / (1 << 20),
                  t.cycle_time_ms, ring ? (", " + t.allreduce_algorithm).c_str() : "",
                  t.hierarchical_allreduce ? ", hierarchical" : "", rate, kept ? " (kept)" : "");
      std::fflush(stdout);
    }
    ++trial;
    return Status::OK();
  };
  KOLO_RETURN_IF_ERROR(run(best, /*baseline=*/true));
  // Each knob's values but the one it had when its turn came (already measured).
  const int64_t fusion_before = best.fusion_threshold_bytes;
  for (double mb : fusion_mb) {
    Engine::Tunables t = best;
    t.fusion_threshold_bytes = static_cast<int64_t>(mb * (1 << 20));
    if (t.fusion_threshold_bytes == fusion_before || Stopping()) continue;
    KOLO_RETURN_IF_ERROR(run(t, false));
  }
  const double cycle_before = best.cycle_time_ms;
  for (double ms : cycles_ms) {
    Engine::Tunables t = best;
    t.cycle_time_ms = ms;
    if (t.cycle_time_ms == cycle_before || Stopping()) continue;
    KOLO_RETURN_IF_ERROR(run(t, false));
  }
  if (ring) {
    const std::string algorithm_before = best.allreduce_algorithm;
    for (const std::string& a : algorithms) {
      Engine::Tunables t = best;
      t.allreduce_algorithm = a;
      if (t.allreduce_algorithm == algorithm_before || Stopping()) continue;
      KOLO_RETURN_IF_ERROR(run(t, false));
    }
  }
  if (hierarchical) {
    const bool before = best.hierarchical_allreduce;
    Engine::Tunables t = best;
    t.hierarchical_allreduce = !before;
    // Hierarchical runs under auto or ring only; the algorithm knob tried just those two.
    if (t.hierarchical_allreduce && t.allreduce_algorithm != "auto" &&
        t.allreduce_algorithm != "ring") {
      t.allreduce_algorithm = "auto";
    }
    if (!Stopping()) KOLO_RETURN_IF_ERROR(run(t, false));
  }
  if (Stopping()) return Status::OK();
  KOLO_RETURN_IF_ERROR(SwitchTo(&best, trial));
  record_.settings.autotune = true;
  record_.settings.fusion_threshold_mb =
      static_cast<double>(best.fusion_threshold_bytes) / (1 << 20);
  record_.settings.cycle_time_ms = best.cycle_time_ms;
  if (ring) record_.settings.allreduce_algorithm = best.allreduce_algorithm;
  record_.settings.hierarchical_allreduce = best.hierarchical_allreduce;
  if (rank_ == 0) {
    std::printf("autotune: %d trials; timed steps run fusion %g MiB, cycle %g ms%s%s\n", trial,
                record_.settings.fusion_threshold_mb, best.cycle_time_ms,
                ring ? (", " + best.allreduce_algorithm).c_str() : "",
                best.hierarchical_allreduce ? ", hierarchical" : "");
    std::fflush(stdout);
    if (!o_.autotune_log.empty()) {
      std::string csv =
          "trial,fusion_threshold_mb,cycle_time_ms,allreduce_algorithm,hierarchical_allreduce,"
          "images_per_sec,kept\n";
      for (size_t i = 0; i < record_.autotune_trials.size(); ++i) {
        const AutotuneTrial& t = record_.autotune_trials[i];
        csv += fmt::format("{},{},{},{},{},{:.3f},{}\n", i + 1, t.fusion_threshold_mb,
                           t.cycle_time_ms, t.allreduce_algorithm, t.hierarchical_allreduce ? 1 : 0,
                           t.images_per_sec, t.kept ? 1 : 0);
      }
      KOLO_RETURN_IF_ERROR(WriteFileAtomically(o_.autotune_log, csv, 0644, "--autotune-log"));
    }
  }
  SetPhase("timed steps");
  return Status::OK();
}

Status Run::Finish(const Trainer& trainer) {
  const int64_t images_per_step = o_.batch_size * o_.backward_passes_per_step;
  double seconds = 0, sum_rate = 0, sum_sq = 0, kernel = 0, forward = 0, backward = 0, wait = 0,
         update = 0;
  for (size_t i = 0; i < step_s_.size(); ++i) {
    seconds += step_s_[i];
    kernel += kernel_s_[i];
    forward += forward_s_[i];
    backward += backward_s_[i];
    wait += wait_s_[i];
    update += update_s_[i];
    const double r = static_cast<double>(images_per_step) / step_s_[i];
    sum_rate += r;
    sum_sq += r * r;
  }
  const double my_rate = static_cast<double>(images_per_step) * step_s_.size() / seconds;
  const double steps = static_cast<double>(step_s_.size());
  CommPerStep comm = distributed() ? CommBetween(timed_start_, timed_end_, o_.engine.backend,
                                                 size(), static_cast<int>(step_s_.size()))
                                   : CommPerStep{};
  // The engine's clock runs at the wall's pace: its times too are reported at the represented one.
  comm.comm_ms /= o_.dilation;
  comm.negotiation_ms /= o_.dilation;
  comm.hold_ms /= o_.dilation;
  const double exposed_ms = 1e3 * wait / steps;
  // Each rank's own measurement, summed: never rank 0's rate times the number of ranks.
  double v[] = {my_rate,
                sum_rate,
                sum_sq,
                steps,
                1e3 * Median(step_s_),
                1e3 * Median(wait_s_),
                1e3 * seconds / steps,
                1e3 * forward / steps,
                1e3 * backward / steps,
                exposed_ms,
                1e3 * update / steps,
                comm.comm_ms,
                std::max(0.0, comm.comm_ms - exposed_ms),
                comm.negotiation_ms,
                comm.bytes,
                comm.collectives,
                comm.cycles,
                comm.hold_ms};
  constexpr int64_t kValues = sizeof v / sizeof v[0];
  if (distributed()) {
    KOLO_ASSIGN_OR_RETURN(Handle h, engine_->AllreduceAsync("results", v, v, DataType::kFloat64,
                                                            {kValues}, ReduceOp::kSum));
    KOLO_RETURN_IF_ERROR(engine_->Wait(h, trainer.config().wait_timeout));
  }
  const int ranks = size();
  RunResults res;
  res.total_images_per_sec = v[0];
  res.images_per_sec_per_rank = v[0] / ranks;
  const double mean = v[1] / v[3];
  res.images_per_sec_stddev = std::sqrt(std::max(0.0, v[2] / v[3] - mean * mean));
  res.step_time_ms_median = v[4] / ranks;
  res.exposed_wait_ms_median = v[5] / ranks;
  Breakdown& b = res.breakdown;
  b.step_time_ms_mean = v[6] / ranks;
  b.forward_ms = v[7] / ranks;
  b.backward_ms = v[8] / ranks;
  b.exposed_comm_ms = v[9] / ranks;
  b.update_ms = v[10] / ranks;
  b.comm_ms = v[11] / ranks;
  b.hidden_comm_ms = v[12] / ranks;
  b.negotiation_ms = v[13] / ranks;
  b.comm_bytes_per_step = v[14] / ranks;
  b.comm_gbytes_per_sec = b.comm_ms > 0 ? b.comm_bytes_per_step / b.comm_ms / 1e6 : 0;
  b.collectives_per_step = v[15] / ranks;
  b.cycles_per_step = v[16] / ranks;
  b.cycle_hold_ms = v[17] / ranks;
  if (o_.compute != "replay") res.final_loss = last_loss_;
  res.kernel_share = seconds > 0 ? kernel / seconds : 0;
  if (distributed()) res.engine_stats = engine_->stats();
  record_.results = res;
  if (rank_ == 0) PrintTotal(stdout, res, o_.compute == "replay", o_.dilation);
  if (rank_ == 0 && !o_.record_profile.empty()) {
    compute::replay::Profile p;
    p.model = graph_->name();
    p.image_size = graph_->input_shape().h;
    p.num_classes = o_.num_classes;
    p.batch_size = o_.batch_size;
    p.precision = compute::PrecisionName(o_.precision);
    p.compute = o_.compute;
    p.device = record_.gpu_model.empty() ? record_.cpu_model : record_.gpu_model;
    p.kolo_commit = record_.kolo_commit;
    p.steps = static_cast<int64_t>(step_s_.size());
    p.update_ms = Median(update_ms_);
    p.timing = "marks";
    p.step_ms = 1e3 * Median(step_s_);
    for (size_t l = 0; l < fwd_ms_.size(); ++l) {
      p.layers.push_back({graph_->layers()[l].name, Median(fwd_ms_[l]), Median(bwd_ms_[l]),
                          Median(fwd_issue_ms_[l]), Median(bwd_issue_ms_[l])});
    }
    KOLO_RETURN_IF_ERROR(compute::replay::SaveProfile(p, o_.record_profile));
    std::printf("profile of %zu layers written to %s\n", p.layers.size(),
                o_.record_profile.c_str());
  }
  return Status::OK();
}

}  // namespace

std::string CurrentPhase() {
  std::lock_guard<std::mutex> lock(Where().mu);
  return Where().phase;
}

std::string WhoForSignals() {
  std::lock_guard<std::mutex> lock(Where().mu);
  return Where().who;
}

int RunTraining(const TrainOptions& options, const std::atomic<bool>& stop,
                const std::string& kolo_commit, const std::atomic<int64_t>* stop_ns) {
  Run run(options, stop, kolo_commit, stop_ns);
  return run.Execute();
}

}  // namespace kolo::models::trainer
