#include "models/trainer/train_flags.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/bootstrap/host_layout.h"
#include "engine/common/file.h"
#include "engine/common/flags.h"
#include "engine/engine.h"
#include "models/compute/replay/profile.h"
#include "models/zoo/zoo.h"

namespace kolo::models::trainer {
namespace {

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// fp16's dynamic loss scaling skips a step whose reduced gradients overflowed, on every rank
// alike, and backs the scale off; parameter servers apply every push, so an overflowing step would
// write inf/NaN into their float32 masters (measured on an H100: tiny-cnn's weights all NaN after
// 4 steps) and the scale would never back off.
Status CheckPsPrecision(const std::string& backend, compute::Precision precision) {
  if (backend == "ps" && precision == compute::Precision::kFp16) {
    return InvalidArgument(
        "--precision fp16 with --backend ps: the parameter servers cannot skip the steps whose "
        "gradients overflow under fp16's loss scaling; allowed with ps: fp32, tf32, bf16 (no loss "
        "scaling), or fp16 with an allreduce backend");
  }
  return Status::OK();
}

// Checks that need more than one flag, or the model zoo, after parsing.
Status Validate(TrainOptions& o, const std::optional<std::string>& precision_flag,
                const std::string& ps_staging) {
  // Before the model: a bad value is named whatever else is missing.
  KOLO_ASSIGN_OR_RETURN(o.ps_staging, ParsePsStaging(ps_staging));
  if (precision_flag && *precision_flag == "fp16") {
    KOLO_RETURN_IF_ERROR(CheckPsPrecision(o.engine.backend, compute::Precision::kFp16));
  }
  const auto models = zoo::ModelNames();
  if (!Contains(models, o.model)) {
    return InvalidArgument("--model '{}' is not a model kolo knows; allowed: {}", o.model,
                           fmt::join(models, ", "));
  }
  // CLI11's range checks let NaN through (every comparison with it is false).
  for (const auto& [flag, value] :
       {std::pair{"--learning-rate", o.sgd.learning_rate}, std::pair{"--momentum", o.sgd.momentum},
        std::pair{"--weight-decay", o.sgd.weight_decay}, std::pair{"--dilation", o.dilation}}) {
    if (!std::isfinite(value)) {
      return InvalidArgument("{} {} is not a number; allowed: a finite number in its range", flag,
                             value);
    }
  }
  // Only rank 0 writes them; an unwritable one is said now, not after the whole run.
  if (o.engine.rank == 0) {
    if (!o.json.empty()) KOLO_RETURN_IF_ERROR(CheckWritable(o.json, "--json"));
    if (!o.record_profile.empty()) {
      KOLO_RETURN_IF_ERROR(CheckWritable(o.record_profile, "--record-profile"));
    }
    if (!o.autotune_log.empty()) {
      KOLO_RETURN_IF_ERROR(CheckWritable(o.autotune_log, "--autotune-log"));
    }
  }
  if (o.autotune && (o.engine.backend == "ps" || o.engine.backend == "none")) {
    return InvalidArgument(
        "--autotune tunes the allreduce engine (fusion threshold, cycle time, algorithm); backend "
        "'{}' has none: allowed with ring, mpi or nccl",
        o.engine.backend);
  }
  if (!o.autotune_log.empty() && !o.autotune) {
    return InvalidArgument("--autotune-log is written by --autotune, which is not given");
  }
  const auto computes = compute::AvailableComputeBackends();
  if (o.compute.empty()) o.compute = computes.front();
  if (o.dilation != 1 && o.compute != "replay") {
    return InvalidArgument(
        "--dilation {} stretches replayed layer times; it is allowed only with --compute replay "
        "(compute is '{}')",
        o.dilation, o.compute);
  }
  if (!Contains(computes, o.compute)) {
    return InvalidArgument("--compute '{}' is not available in this build; allowed: {}", o.compute,
                           fmt::join(computes, ", "));
  }
  if (Status s = CheckTransportName(o.engine.transport); !s.ok()) {
    return s.WithContext("--transport");
  }
  if (Status s = CheckTransportUsable(o.engine); !s.ok()) return s.WithContext("--transport");
  if (o.compute == "replay") {
    if (o.profile.empty()) {
      return InvalidArgument(
          "--compute replay needs --profile FILE (a profile written by --record-profile; "
          "models/profiles/ has some)");
    }
    if (!o.record_profile.empty()) {
      return InvalidArgument("--record-profile needs a timed backend, not --compute replay");
    }
    auto profile = compute::replay::LoadProfile(o.profile);
    if (!profile.ok()) return profile.status().WithContext("--profile");
    if (!precision_flag) {
      KOLO_ASSIGN_OR_RETURN(o.precision, compute::ParsePrecision(profile->precision));
    }
  } else if (!o.profile.empty()) {
    return InvalidArgument("--profile '{}' is read only with --compute replay (compute is '{}')",
                           o.profile, o.compute);
  }
  if (precision_flag) {
    auto p = compute::ParsePrecision(*precision_flag);
    if (!p.ok()) {
      return InvalidArgument("--precision '{}' is not one of fp32, tf32, fp16, bf16",
                             *precision_flag);
    }
    o.precision = *p;
  } else if (o.compute == "cudnn") {
    o.precision = compute::Precision::kTf32;
  }
  // A replay profile recorded in fp16 asks for it too.
  KOLO_RETURN_IF_ERROR(CheckPsPrecision(o.engine.backend, o.precision));
  if (o.compute == "onednn" && o.precision != compute::Precision::kFp32) {
    return InvalidArgument("--precision {} with --compute onednn: oneDNN computes in fp32 only",
                           compute::PrecisionName(o.precision));
  }
  zoo::ModelConfig config;
  config.image_size = o.image_size;
  config.num_classes = o.num_classes;
  auto graph = zoo::BuildModel(o.model, config);
  if (!graph.ok()) return graph.status().WithContext("--model/--image-size/--num-classes");
  o.image_size = graph->input_shape().h;
  if (o.compute == "replay") {
    KOLO_ASSIGN_OR_RETURN(auto profile, compute::replay::LoadProfile(o.profile));
    KOLO_RETURN_IF_ERROR(compute::replay::CheckProfileMatches(
        profile, *graph, o.batch_size, compute::PrecisionName(o.precision), o.profile));
  }
  return Status::OK();
}

}  // namespace

ParsedFlags ParseTrainFlags(int argc, char** argv) {
  TrainOptions o;
  CLI::App app{
      "kolo-train: synchronous data-parallel training of a model on synthetic data; prints "
      "images/sec (launch with mpirun or kolo-run for several ranks)"};
  app.set_help_all_flag("--help-all");
  std::optional<std::string> precision;
  app.add_option(
      "--model", o.model,
      "model to train (required): " + fmt::format("{}", fmt::join(zoo::ModelNames(), ", ")));
  app.add_option("--batch-size", o.batch_size, "images per rank per micro-batch")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--num-warmup-batches", o.num_warmup_batches, "untimed steps first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--num-batches", o.num_batches, "timed steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_flag("--autotune", o.autotune,
               "before the timed steps, search the fusion threshold, cycle time and (ring) "
               "allreduce algorithm by coordinate search, every rank switching at the same step; "
               "the timed steps run the best (trials in the run record)");
  app.add_option("--autotune-trial-steps", o.autotune_trial_steps,
                 "steps per autotune trial, the first of each not measured")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000));
  app.add_option("--autotune-log", o.autotune_log, "write the autotune trials as CSV (rank 0)");
  app.add_option("--compute", o.compute,
                 "compute backend: " +
                     fmt::format("{}", fmt::join(compute::AvailableComputeBackends(), " | ")));
  app.add_option("--profile", o.profile, "replay profile to play (--compute replay)");
  app.add_option("--record-profile", o.record_profile,
                 "write each layer's median forward/backward time to this file (rank 0)");
  app.add_option("--dilation", o.dilation,
                 "time dilation K >= 1, --compute replay only: every replayed layer time is slept "
                 "K times over and every reported time and rate is the measured one / K (an "
                 "emulated 1 Gbit/s network with K = 25 stands for 25 Gbit/s)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 10000.0));
  app.add_option("--precision", precision,
                 "fp32 | tf32 | fp16 | bf16 (default: fp32; tf32 with cudnn; the profile's with "
                 "replay). fp16 and bf16 (cudnn): mixed precision with float32 master weights "
                 "and gradients; fp16 with dynamic loss scaling");
  app.add_option("--backward-passes-per-step", o.backward_passes_per_step,
                 "micro-batches accumulated locally per step (one allreduce per step)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  app.add_option("--image-size", o.image_size, "input height and width (0: the model's default)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{4096}));
  app.add_option("--num-classes", o.num_classes, "classes of the synthetic labels")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto* lr = app.add_option("--learning-rate", o.sgd.learning_rate,
                            "SGD learning rate (default: 0.1 x global batch / 256)")
                 ->check(CLI::Range(0.0, 1e6));
  app.add_option("--momentum", o.sgd.momentum)->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--weight-decay", o.sgd.weight_decay)
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--json", o.json, "write the run record (JSON) to this file (rank 0)");
  app.add_flag("--json-stdout", o.json_stdout,
               "also print the run record on stdout as one line 'kolo-record: {...}' (rank 0), for "
               "launchers on another host");
  std::string ps_staging = PsStagingName(o.ps_staging);
  app.add_option("--ps-staging", ps_staging,
                 "sync | overlap, with --backend ps: how gradients on a GPU reach the servers; "
                 "overlap copies each to pinned host memory on a side stream and pushes it from a "
                 "staging thread while backward goes on, sync copies it on the training thread")
      ->capture_default_str();
  app.add_option("--display-every", o.display_every, "print a line every N steps")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--seed", o.seed, "seed of the initial weights and the synthetic data")
      ->capture_default_str();
  bool check_transport = false;
  app.add_flag("--check-transport", check_transport,
               "only check that this host can use --transport (rdma: a device with an ACTIVE "
               "port), print the verdict naming the host, and exit 0 (usable) or 2");
  EngineFlags engine_flags;
  engine_flags.Add(app);

  ParsedFlags out;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    out.exit_code = app.exit(e);
    return out;
  } catch (const CLI::CallForAllHelp& e) {
    out.exit_code = app.exit(e);
    return out;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kolo-train: %s\n", e.what());
    out.exit_code = 2;
    return out;
  }
  o.learning_rate_given = lr->count() > 0;
  auto env = OptionsFromEnvironment();
  Status s = env.status();
  if (s.ok()) {
    o.engine = *env;
    s = engine_flags.Apply(&o.engine);
  }
  if (s.ok() && check_transport) {
    // Nothing else is needed or checked: a sweep asks every host this before its first point.
    s = CheckTransportName(o.engine.transport);
    if (s.ok()) s = CheckTransportUsable(o.engine);
    auto host = bootstrap::ThisHostName(o.engine.host_name);
    const std::string name = host.ok() ? *host : "?";
    if (s.ok()) {
      std::printf("kolo-train: host %s can use transport %s\n", name.c_str(),
                  o.engine.transport.c_str());
      out.exit_code = 0;
    } else {
      std::fprintf(stderr, "kolo-train: host %s cannot use transport %s: %s\n", name.c_str(),
                   o.engine.transport.c_str(), s.message().c_str());
      out.exit_code = 2;
    }
    return out;
  }
  if (s.ok() && o.model.empty()) s = InvalidArgument("--model is required");
  if (s.ok()) s = Validate(o, precision, ps_staging);
  if (!s.ok()) {
    std::fprintf(stderr, "kolo-train: %s\n", s.message().c_str());
    out.exit_code = 2;
    return out;
  }
  // What every rank must share for the job to run in step (MustMatch): a rank that trains
  // another model or stops after fewer batches would leave the others waiting for tensors it never
  // submits, so the engine refuses such a job at start-up, naming the setting and the ranks.
  o.engine.app_settings = {
      {"model", o.model},
      {"batch_size", fmt::format("{}", o.batch_size)},
      {"num_warmup_batches", fmt::format("{}", o.num_warmup_batches)},
      {"num_batches", fmt::format("{}", o.num_batches)},
      {"backward_passes_per_step", fmt::format("{}", o.backward_passes_per_step)},
      {"compute", o.compute},
      {"precision", compute::PrecisionName(o.precision)},
      {"image_size", fmt::format("{}", o.image_size)},
      {"num_classes", fmt::format("{}", o.num_classes)},
      {"dilation", fmt::format("{}", o.dilation)},
      {"learning_rate", o.learning_rate_given ? fmt::format("{}", o.sgd.learning_rate) : "auto"},
      {"momentum", fmt::format("{}", o.sgd.momentum)},
      {"weight_decay", fmt::format("{}", o.sgd.weight_decay)},
      {"seed", fmt::format("{}", o.seed)},
      {"ps_staging", PsStagingName(o.ps_staging)},
  };
  out.options = std::move(o);
  return out;
}

}  // namespace kolo::models::trainer
