// kolo-sim: predicts a training configuration's images/sec on hosts x GPUs per host (predict), and
// fits the network and host parameters it predicts with to kolo-allreduce-bench JSON (calibrate).
// See sim/model.h for the model and README.md (kolo-sim) for its use in sweeps.
//
//   kolo-sim predict --model resnet101 --profile models/profiles/resnet101-h100-b64.json
//       --ranks 128 --ranks-per-host 4 --backend nccl --link 25gbit --gpu-rate 219
//       --calibration sim/calibrations/paper-25gbe.json [--json RECORD]
//   kolo-sim calibrate --link 1gbit [--burst BYTES] [--incast SUMMARY.json]... [--name NAME]
//       [--base CAL] [--out CAL] BENCH.json...
//
// predict prints one line; with --json it writes a record in kolo-train's --json format
// (models/trainer/run_record.h) with "compute": "simulated", so that the sweep runner
// ([launcher] kind = "sim") makes CSV rows of it as it does of measured runs.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/common/file.h"
#include "engine/common/options.h"
#include "sim/autotune.h"
#include "sim/calibrate.h"
#include "sim/model.h"

namespace {

using kolo::sim::Calibration;
using kolo::sim::Point;
using kolo::sim::Prediction;

void Say(const std::string& line) { std::fprintf(stderr, "kolo-sim: %s\n", line.c_str()); }

// "25gbit" -> 25 (Gbit/s); -1 when it is not a rate.
double RateGbit(const std::string& text) {
  auto bits = kolo::ParseBitRate("rate", text);
  return bits.ok() && *bits > 0 ? *bits / 1e9 : -1;
}

// --link (empty: the calibration's) into p->link_gbit; false (said) when it is not a rate.
bool ReadLink(const std::string& link, Point* p) {
  if (link.empty()) return true;
  p->link_gbit = RateGbit(link);
  if (p->link_gbit > 0) return true;
  Say(fmt::format("--link {} is not allowed; allowed: a rate like 25gbit, 100mbit", link));
  return false;
}

// --calibration (empty: the built-in one) into *cal; false (said) when it cannot be loaded.
bool ReadCalibration(const std::string& path, Calibration* cal) {
  if (path.empty()) return true;
  auto c = kolo::sim::LoadCalibration(path);
  if (!c.ok()) {
    Say(c.status().ToString());
    return false;
  }
  *cal = *c;
  return true;
}

std::string Utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

int Predict(int argc, char** argv) {
  CLI::App app{"kolo-sim predict: images/sec of one configuration, from a replay profile"};
  Point p;
  std::string link, calibration_path, json_path, compute = "replay", precision, allreduce = "flat";
  std::string ps_hosts = "dedicated", ps_pacing;
  int64_t image_size = 0, num_classes = 0;
  int warmup = 0, batches = 0;
  app.add_option("--model", p.model, "model (models/zoo)")->required();
  app.add_option("--profile", p.profile, "replay profile: layer times")->required();
  app.add_option("--batch-size", p.batch_size, "per rank; must be the profile's");
  app.add_option("--gpu-rate", p.gpu_rate,
                 "single-GPU images/sec to scale the profile to (0: the profile's own)")
      ->check(CLI::Range(0.0, 1e9));
  app.add_option("--ranks", p.ranks, "GPUs (training ranks)")->check(CLI::Range(1, 65536));
  app.add_option("--ranks-per-host", p.ranks_per_host, "GPUs per host")->check(CLI::Range(1, 1024));
  app.add_option("--backend", p.backend, "ring | nccl | mpi | ps | none")
      ->check(CLI::IsMember({"ring", "nccl", "mpi", "ps", "none"}));
  app.add_option("--allreduce", allreduce, "flat | hierarchical")
      ->check(CLI::IsMember({"flat", "hierarchical"}));
  app.add_option("--framework", p.framework,
                 "update semantics: kolo (each parameter once its collective is done) | horovod-tf "
                 "(every update after the step's last allreduce) | ddp (PyTorch DDP's 25 MiB "
                 "buckets, the optimizer after the last)")
      ->check(CLI::IsMember({"kolo", "horovod-tf", "ddp"}));
  app.add_option("--allreduce-algorithm", p.allreduce_algorithm,
                 "ring backend: auto | ring | recursive-doubling | halving-doubling | one-shot");
  app.add_option("--compression", p.compression,
                 "gradient compression: none | fp16 | bf16 (the engine's KOLO_COMPRESSION)")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}));
  std::string tcp_streams = "auto";
  app.add_option("--tcp-streams", tcp_streams,
                 "TCP connections per pair: 1-16, or auto (taken as 1) (the engine's "
                 "KOLO_TCP_STREAMS)");
  app.add_option("--transport", p.transport, "between hosts: tcp | rdma (auto = tcp)")
      ->check(CLI::IsMember({"tcp", "rdma", "auto", "shm"}));
  app.add_option("--link", link,
                 "NIC line rate per host, e.g. 25gbit (default: the calibration's)");
  app.add_option("--dilation", p.dilation, "the emulated cluster's time dilation (replay)")
      ->check(CLI::Range(1.0, 10000.0));
  app.add_option("--fusion-threshold-mb", p.fusion_threshold_mb, "Tensor Fusion buffer, MiB")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--cycle-time-ms", p.cycle_time_ms, "engine cycle time")
      ->check(CLI::Range(1e-6, 1e6));
  app.add_option("--backward-passes-per-step", p.backward_passes_per_step, "micro-batches")
      ->check(CLI::Range(1, 65536));
  app.add_option("--ps-servers", p.ps_servers, "parameter servers")->check(CLI::Range(1, 65536));
  app.add_option("--ps-placement", p.ps_placement, "greedy | split")
      ->check(CLI::IsMember({"greedy", "split"}));
  app.add_option("--ps-pacing", ps_pacing,
                 "each worker's pushes to each server at most this fast, e.g. 125mbit (on the "
                 "wire, like --link; default off)");
  app.add_option("--ps-hosts", ps_hosts,
                 "dedicated (servers on hosts of their own) | spread (one per worker host)")
      ->check(CLI::IsMember({"dedicated", "spread"}));
  app.add_option("--step-jitter", p.step_jitter,
                 "one rank's step-time coefficient of variation; each step waits for the slowest "
                 "rank (default: the calibration's step_jitter)")
      ->check(CLI::Range(0.0, 0.5));
  app.add_option("--steps", p.steps, "steps simulated (the last is reported)")
      ->check(CLI::Range(2, 100));
  bool autotune = false;
  app.add_flag("--autotune", autotune,
               "predict kolo-train --autotune: its coordinate search run on the model, then the "
               "choice predicted (trials in the record's \"autotune\")");
  app.add_option("--calibration", calibration_path, "calibration JSON (default: built in)");
  app.add_option("--json", json_path, "write a kolo-train-style run record here");
  // kolo-train's flags a sweep passes on; checked against the profile.
  app.add_option("--compute", compute, "must be replay (the profile's compute is simulated)");
  app.add_option("--precision", precision, "must be the profile's");
  app.add_option("--image-size", image_size, "must be the profile's");
  app.add_option("--num-classes", num_classes, "must be the profile's");
  app.add_option("--num-warmup-batches", warmup, "ignored (the simulation warms its caches)");
  app.add_option("--num-batches", batches, "ignored");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    Say(fmt::format("{}; see kolo-sim predict --help", e.what()));
    return 2;
  }
  if (compute != "replay") {
    Say(fmt::format("--compute {} is not allowed; allowed: replay (kolo-sim times the profile)",
                    compute));
    return 2;
  }
  if (!ReadLink(link, &p)) return 2;
  if (!ps_pacing.empty()) {
    auto rate = kolo::ParseBitRate("--ps-pacing", ps_pacing);
    if (!rate.ok()) {
      Say(rate.status().message());
      return 2;
    }
    p.ps_pacing_bits_per_s = *rate;
  }
  p.hierarchical = allreduce == "hierarchical";
  p.ps_on_worker_hosts = ps_hosts == "spread";
  p.shm_within_host = p.transport == "auto" || p.transport == "shm";
  if (p.shm_within_host) p.transport = "tcp";
  {
    auto streams = kolo::ParseTcpStreams("--tcp-streams", tcp_streams);
    if (!streams.ok()) {
      Say(streams.status().message());
      return 2;
    }
    p.tcp_streams = std::max(1, *streams);
  }
  Calibration cal;
  if (!ReadCalibration(calibration_path, &cal)) return 2;
  std::vector<kolo::sim::AutotuneTrialPrediction> trials;
  if (autotune) {
    if (p.backend == "ps" || p.backend == "none") {
      Say(
          fmt::format("--autotune tunes the allreduce engine; backend '{}' has none: allowed with "
                      "ring, mpi or nccl",
                      p.backend));
      return 2;
    }
    auto chosen = kolo::sim::AutotuneChoice(p, cal, &trials);
    if (chosen.ok()) p = *chosen;
  }
  p.exposed_by_cause = true;  // the record's exposed_*_ms columns
  auto pred = kolo::sim::Predict(p, cal);
  nlohmann::json record;
  record["kolo_commit"] = "unknown";
  record["timestamp"] = Utc();
  record["hosts"] = std::vector<std::string>{};
  record["cpu_model"] = "";
  record["gpu_model"] = "";
  nlohmann::json settings = {{"model", p.model},
                             {"batch_size", p.batch_size},
                             {"compute", "simulated"},
                             {"profile", p.profile},
                             {"calibration", cal.name},
                             {"backend", p.backend},
                             {"allreduce_algorithm", p.allreduce_algorithm},
                             {"compression", p.backend == "none" ? "" : p.compression},
                             {"tcp_streams", tcp_streams},
                             {"ranks", p.ranks},
                             {"fusion_threshold_mb", p.fusion_threshold_mb},
                             {"cycle_time_ms", p.cycle_time_ms},
                             {"backward_passes_per_step", p.backward_passes_per_step},
                             {"framework", p.framework}};
  if (!pred.ok()) {
    Say(pred.status().ToString());
    record["settings"] = settings;
    record["status"] = "failed";
    record["error"] = pred.status().ToString();
    if (!json_path.empty()) std::ofstream(json_path) << record.dump(2) << "\n";
    return 1;
  }
  const Prediction& r = *pred;
  settings["nodes"] = r.hosts;
  if (autotune) {
    settings["autotune"] = true;
    // The layout the search chose, as kolo-train's record has it (the rows' allreduce column).
    settings["hierarchical_allreduce"] = p.hierarchical;
    nlohmann::json list = nlohmann::json::array();
    for (const auto& t : trials) {
      list.push_back({{"fusion_threshold_mb", t.fusion_threshold_mb},
                      {"cycle_time_ms", t.cycle_time_ms},
                      {"allreduce_algorithm", t.allreduce_algorithm},
                      {"hierarchical_allreduce", t.hierarchical_allreduce},
                      {"images_per_sec", t.images_per_sec},
                      {"kept", t.kept}});
    }
    record["autotune"] = {{"trials", std::move(list)},
                          {"choice",
                           {{"fusion_threshold_mb", p.fusion_threshold_mb},
                            {"cycle_time_ms", p.cycle_time_ms},
                            {"allreduce_algorithm", p.allreduce_algorithm},
                            {"hierarchical_allreduce", p.hierarchical}}}};
  }
  settings["step_jitter"] = p.step_jitter >= 0 ? p.step_jitter : cal.step_jitter;
  record["settings"] = settings;
  record["results"] = {
      {"total_images_per_sec", r.total_images_per_sec},
      {"images_per_sec_per_rank", r.images_per_sec_per_rank},
      {"images_per_sec_stddev", 0.0},
      {"step_time_ms_median", r.step_ms},
      {"step_time_ms_mean", r.step_ms},
      {"forward_ms", r.forward_ms},
      {"backward_ms", r.backward_ms},
      {"exposed_comm_ms", r.exposed_comm_ms},
      {"interference_ms", r.interference_ms},
      {"update_ms", r.update_ms},
      {"comm_ms", r.comm_ms},
      {"hidden_comm_ms", std::max(0.0, r.comm_ms - r.exposed_comm_ms)},
      {"negotiation_ms", r.negotiation_ms},
      {"comm_bytes_per_step", r.comm_bytes_per_step},
      {"comm_gbytes_per_sec", r.comm_ms > 0 ? r.comm_bytes_per_step / (r.comm_ms * 1e6) : 0.0},
      {"collectives_per_step", r.collectives_per_step},
      {"cycles_per_step", r.cycles_per_step},
      {"cycle_hold_ms", r.cycle_hold_ms},
      {"exposed_coordination_ms", r.exposed_coordination_ms},
      {"exposed_latency_ms", r.exposed_latency_ms},
      {"exposed_host_ms", r.exposed_host_ms},
      {"exposed_wire_ms", r.exposed_wire_ms},
      {"final_loss", nullptr},
      {"kernel_share", 0.0}};
  record["status"] = "ok";
  std::printf(
      "kolo-sim: %s %d GPUs (%d hosts x %d) backend %s%s %s: %.1f images/sec (%.1f per GPU, "
      "single GPU %.1f), step %.2f ms, exposed comm %.2f ms (coordination %.2f, latency %.2f, "
      "host %.2f, wire %.2f), calibration %s\n",
      p.model.c_str(), p.ranks, r.hosts, p.ranks_per_host, p.backend.c_str(),
      p.hierarchical ? " hierarchical" : "", p.transport.c_str(), r.total_images_per_sec,
      r.images_per_sec_per_rank, r.single_gpu_images_per_sec, r.step_ms, r.exposed_comm_ms,
      r.exposed_coordination_ms, r.exposed_latency_ms, r.exposed_host_ms, r.exposed_wire_ms,
      cal.name.c_str());
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << record.dump(2) << "\n";
    if (!out) {
      Say(fmt::format("cannot write {}", json_path));
      return 1;
    }
  }
  return 0;
}

// kolo-sim allreduce: one allreduce's predicted time per algorithm and size, and what the
// engine's rule picks, for checking the model's crossovers against kolo-allreduce-bench's
// --algorithms rows (alone/<a>) measured on the same ranks.
int Allreduce(int argc, char** argv) {
  CLI::App app{"kolo-sim allreduce: one allreduce's time per algorithm, and the rule's choice"};
  Point p;
  p.model = "none";
  std::string calibration_path, sizes_text = "4K,16K,64K,256K,1M,4M", link, json_path;
  app.add_option("--ranks", p.ranks, "ranks")->check(CLI::Range(1, 65536));
  app.add_option("--ranks-per-host", p.ranks_per_host, "ranks per host (default: all on one)");
  app.add_option("--transport", p.transport,
                 "tcp | rdma between hosts; auto or shm: shared memory within a host (one host: "
                 "the one-shot allreduce too)");
  app.add_option("--link", link, "NIC line rate, e.g. 25gbit (default: the calibration's)");
  app.add_option("--sizes", sizes_text, "comma list of buffer sizes (K, M, G suffixes)");
  app.add_option("--calibration", calibration_path, "calibration JSON (default: built in)");
  app.add_option("--json", json_path, "write the table as JSON here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    Say(fmt::format("{}; see kolo-sim allreduce --help", e.what()));
    return 2;
  }
  if (p.ranks_per_host <= 1 && !app.count("--ranks-per-host")) p.ranks_per_host = p.ranks;
  if (p.ranks % p.ranks_per_host != 0) {
    Say(fmt::format("--ranks {} is not a multiple of --ranks-per-host {}", p.ranks,
                    p.ranks_per_host));
    return 2;
  }
  if (!ReadLink(link, &p)) return 2;
  p.shm_within_host = p.transport == "auto" || p.transport == "shm";
  if (p.shm_within_host) p.transport = "tcp";
  if (p.transport != "tcp" && p.transport != "rdma") {
    Say(fmt::format("--transport {} is not allowed; allowed: tcp, rdma, auto, shm", p.transport));
    return 2;
  }
  std::vector<double> sizes;
  {
    std::stringstream in(sizes_text);
    std::string item;
    while (std::getline(in, item, ',')) {
      auto b = kolo::ParseByteSize("--sizes", item);
      if (!b.ok() || *b <= 0) {
        Say(fmt::format("--sizes: '{}' is not a size; allowed: bytes with K, M, G suffixes", item));
        return 2;
      }
      sizes.push_back(static_cast<double>(*b));
    }
  }
  Calibration cal;
  if (!ReadCalibration(calibration_path, &cal)) return 2;
  std::vector<std::string> algorithms = {"ring", "recursive-doubling", "halving-doubling"};
  const kolo::sim::Network one = kolo::sim::MakeNetwork(p, cal, 0);
  if (one.host_area && one.hosts == 1) algorithms.push_back("one-shot");
  std::printf("# kolo-sim allreduce: %d ranks (%d per host), calibration %s; predicted us\n",
              p.ranks, p.ranks_per_host, cal.name.c_str());
  std::printf("#%11s", "size(B)");
  for (const std::string& a : algorithms) std::printf(" %20s", a.c_str());
  std::printf(" %20s %20s\n", "fastest", "auto runs");
  nlohmann::json rows = nlohmann::json::array();
  for (double bytes : sizes) {
    const kolo::sim::Network net = kolo::sim::MakeNetwork(p, cal, bytes);
    // As Predict costs it: the reduction slows with ranks sharing the host's cores.
    const double reduce = cal.reduce_gbytes_per_s * 1e9 / kolo::sim::HostShare(p, cal);
    nlohmann::json row = {{"bytes", bytes}};
    std::string fastest;
    double best = 0;
    std::vector<double> t;
    for (const std::string& a : algorithms) {
      t.push_back(kolo::sim::AllreduceTime(net, bytes, reduce, a, false) * 1e6);
      row[a] = t.back();
      if (fastest.empty() || t.back() < best) {
        best = t.back();
        fastest = a;
      }
    }
    std::string picked;
    kolo::sim::AllreduceTime(net, bytes, reduce, "auto", false, &picked);
    row["fastest"] = fastest;
    row["auto"] = picked;
    rows.push_back(row);
    std::printf(" %11.0f", bytes);
    for (double v : t) std::printf(" %20.1f", v);
    std::printf(" %20s %20s\n", fastest.c_str(), picked.c_str());
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << nlohmann::json{{"ranks", p.ranks},
                          {"ranks_per_host", p.ranks_per_host},
                          {"calibration", cal.name},
                          {"rows", rows}}
               .dump(2)
        << "\n";
    if (!out) {
      Say(fmt::format("cannot write {}", json_path));
      return 1;
    }
  }
  return 0;
}

int Calibrate(int argc, char** argv) {
  CLI::App app{"kolo-sim calibrate: fit link and host parameters to kolo-allreduce-bench JSON"};
  std::vector<std::string> files;
  std::string link, name = "fitted", base_path, out_path, transport = "tcp";
  app.add_option("files", files,
                 "kolo-allreduce-bench --json documents (buffer rows; --tensors step rows with "
                 "--fusion both give the engine's time per collective)")
      ->required();
  app.add_option("--link", link, "the measured hosts' NIC line rate, e.g. 1gbit")->required();
  app.add_option("--name", name, "the calibration's name (written into predicted rows)");
  app.add_option("--base", base_path, "calibration whose other parameters the result keeps");
  app.add_option("--transport", transport, "which transport the rows between hosts measured")
      ->check(CLI::IsMember({"tcp", "rdma"}));
  app.add_option("--out", out_path, "write the calibration JSON here");
  std::vector<std::string> incast_files;
  app.add_option("--incast", incast_files,
                 "scripts/cluster-incast summary.json: its ps_stream_spread at its worker count "
                 "(repeatable)");
  bool one_bandwidth = false;
  app.add_flag("--no-size-regimes", one_bandwidth,
               "within a host, fit one bandwidth for every buffer size (by default large buffers "
               "may get a bandwidth of their own)");
  std::vector<std::string> jitter_files;
  app.add_option("--jitter", jitter_files,
                 "kolo-train --json run record of one rank: its steps' spread sets step_jitter "
                 "(repeatable; the median is kept)");
  double burst_bytes = 0;
  app.add_option("--burst", burst_bytes,
                 "bytes each host's shaped link passes unshaped from idle (the emulated cluster's "
                 "tbf burst; 0 for a real NIC)")
      ->check(CLI::Range(0.0, 1e12));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    Say(fmt::format("{}; see kolo-sim calibrate --help", e.what()));
    return 2;
  }
  const double gbit = RateGbit(link);
  if (gbit <= 0) {
    Say(fmt::format("--link {} is not allowed; allowed: a rate like 25gbit, 100mbit", link));
    return 2;
  }
  std::vector<kolo::sim::BenchSample> inter, intra;
  std::vector<kolo::sim::StepSample> inter_steps, intra_steps;
  for (const auto& f : files) {
    auto steps = kolo::sim::ReadBenchSteps(f);
    if (!steps.ok()) {
      Say(steps.status().ToString());
      return 2;
    }
    for (const auto& x : *steps) (x.hosts > 1 ? inter_steps : intra_steps).push_back(x);
    auto s = kolo::sim::ReadBenchJson(f);
    if (!s.ok() && steps->empty()) {
      Say(s.status().ToString());
      return 2;
    }
    if (!s.ok()) continue;  // a --tensors run: step rows only
    for (auto x : *s) {
      if (x.hosts > 1) x.burst_bytes = burst_bytes;
      (x.hosts > 1 ? inter : intra).push_back(x);
    }
  }
  // Ranks that share one machine's cores (the base calibration's host_cores) run their copies and
  // sums slower, as a prediction has them; the fit undoes that to find one rank's own rates.
  auto share = [&](std::vector<kolo::sim::BenchSample>& samples, double cores) {
    if (cores <= 0) return;
    for (auto& x : samples) x.host_share = std::max(1.0, x.ranks / cores);
  };
  Calibration cal;
  if (!base_path.empty()) {
    auto c = kolo::sim::LoadCalibration(base_path);
    if (!c.ok()) {
      Say(c.status().ToString());
      return 2;
    }
    cal = *c;
  }
  share(intra, cal.host_cores);
  if (cal.host_cores > 0) {
    for (auto& x : intra_steps) x.host_share = std::max(1.0, x.ranks / cal.host_cores);
  }
  // The engine's time per collective, from step rows with fusion off and on, on the fit of the
  // same kind of rows (between hosts or within one).
  auto per_collective = [&](const std::vector<kolo::sim::StepSample>& steps,
                            const kolo::sim::Fit& fit) {
    if (steps.empty()) return;
    std::vector<std::string> lines;
    auto us = kolo::sim::FitPerCollective(steps, fit, cal.fusion_copy_gbytes_per_s * 1e9, &lines);
    for (const auto& l : lines) std::printf("  %s\n", l.c_str());
    if (!us.ok()) {
      std::printf("  engine time per collective: not fitted (%s)\n",
                  us.status().ToString().c_str());
      return;
    }
    cal.engine_collective_us = *us * 1e6;
    std::printf("  -> engine_collective_us %.1f (the pairs' weighted median, at least 0)\n",
                cal.engine_collective_us);
  };
  struct Incast {
    std::string file;
    int workers;
    double spread;
    double pace;  // bytes/s per worker; 0: unpaced
  };
  std::vector<Incast> incasts;
  for (const auto& f : incast_files) {
    auto text = kolo::ReadFileBounded(f, kolo::sim::kMaxInputFileBytes, "--incast");
    if (!text.ok()) {
      Say(text.status().message());
      return 2;
    }
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(*text);
    } catch (const nlohmann::json::exception& e) {
      Say(fmt::format("{}: not a scripts/cluster-incast summary.json: {}", f, e.what()));
      return 2;
    }
    if (!j.is_object() || !j.contains("workers") || !j.contains("ps_stream_spread") ||
        !j.at("workers").is_number_integer() || !j.at("ps_stream_spread").is_number()) {
      Say(
          fmt::format("{}: not a scripts/cluster-incast summary.json (no workers and "
                      "ps_stream_spread)",
                      f));
      return 2;
    }
    const int workers = j.at("workers").get<int>();
    if (workers < 1) {
      Say(fmt::format("{}: workers = {} is not allowed; allowed: 1 or more", f, workers));
      return 2;
    }
    const double measured = j.at("ps_stream_spread").get<double>();
    const double spread = std::clamp(measured, 0.0, 0.9);
    if (spread != measured) {
      std::printf("parameter-server streams: %s's spread %.3f taken as %.3f (allowed: 0 to 0.9)\n",
                  f.c_str(), measured, spread);
    }
    const double pace = j.contains("pace_bytes_per_s") && j.at("pace_bytes_per_s").is_number()
                            ? j.at("pace_bytes_per_s").get<double>()
                            : 0;
    incasts.push_back({f, workers, spread, pace});
  }
  // Unpaced first: a paced run's spread counts as a share of the unpaced one at its worker count.
  std::stable_sort(incasts.begin(), incasts.end(),
                   [](const Incast& a, const Incast& b) { return (a.pace > 0) < (b.pace > 0); });
  for (const Incast& x : incasts) {
    if (x.pace <= 0) {
      cal.ps_stream_spread[x.workers] = x.spread;
      std::printf(
          "parameter-server streams: %d into one link, the slowest at %.3f of a fair share "
          "(%s)\n",
          x.workers, 1 - x.spread, x.file.c_str());
      continue;
    }
    const auto unpaced = cal.ps_stream_spread.find(x.workers);
    if (unpaced == cal.ps_stream_spread.end() || unpaced->second <= 0) {
      Say(
          fmt::format("--incast {}: paced at {:g} B/s with {} workers, but no unpaced run of {} "
                      "workers (with a spread above 0) is given to compare it with",
                      x.file, x.pace, x.workers, x.workers));
      return 2;
    }
    const double ratio = x.pace * 8 * x.workers / (gbit * 1e9);
    if (ratio <= 1) {
      std::printf(
          "parameter-server streams: %s paced at %.2f of a fair share: at or below it "
          "the streams are taken as even (spread measured %.3f)\n",
          x.file.c_str(), ratio, x.spread);
      continue;
    }
    const double share = std::clamp(x.spread / unpaced->second, 0.0, 1.0);
    cal.ps_paced_spread_share[std::round(ratio * 1000) / 1000] = share;
    std::printf(
        "parameter-server streams: %d paced at %.3g times a fair share, the slowest at %.3f of "
        "it: %.3f of the unpaced spread (%s)\n",
        x.workers, ratio, 1 - x.spread, share, x.file.c_str());
  }
  if (!jitter_files.empty()) {
    std::vector<double> cvs;
    for (const auto& f : jitter_files) {
      auto cv = kolo::sim::ReadStepJitter(f);
      if (!cv.ok()) {
        Say(fmt::format("--jitter {}", cv.status().ToString()));
        return 2;
      }
      std::printf("step jitter: %s: one rank's steps vary by %.2f%% (coefficient of variation)\n",
                  f.c_str(), 100 * *cv);
      cvs.push_back(*cv);
    }
    std::sort(cvs.begin(), cvs.end());
    const size_t m = cvs.size();
    cal.step_jitter = std::min(0.5, m % 2 ? cvs[m / 2] : (cvs[m / 2 - 1] + cvs[m / 2]) / 2);
    std::printf("  -> step_jitter %.4f (the median; at most 0.5)\n", cal.step_jitter);
  }
  cal.name = name;
  cal.link_gbit = gbit;
  std::string source = "kolo-sim calibrate --link " + link +
                       (burst_bytes > 0 ? fmt::format(" --burst {:.0f}", burst_bytes) : "") +
                       " over";
  for (const auto& f : incast_files) source += " --incast " + f;
  for (const auto& f : jitter_files) source += " --jitter " + f;
  for (const auto& f : files) source += " " + f;
  cal.source = source;
  auto report = [](const char* what, const std::vector<kolo::sim::BenchSample>& samples,
                   const kolo::sim::Fit& fit) {
    std::printf(
        "%s: latency %.2f us, bandwidth %.4g GB/s, reduction %.4g GB/s, engine %.1f us per "
        "cycle; not kept: start %.1f us per timed iteration\n",
        what, fit.latency_s * 1e6, fit.bytes_per_s / 1e9, fit.reduce_bytes_per_s / 1e9,
        fit.engine_s * 1e6, fit.start_s * 1e6);
    if (fit.large_bytes > 0) {
      std::printf("  buffers of %.0f bytes and more: bandwidth %.4g GB/s (size regimes)\n",
                  fit.large_bytes, fit.large_bytes_per_s / 1e9);
    }
    std::printf("  %-6s %-5s %-5s %12s %12s %12s %9s %7s\n", "ranks", "hosts", "row", "bytes",
                "measured_us", "fitted_us", "residual", "weight");
    for (size_t i = 0; i < samples.size(); ++i) {
      const auto& s = samples[i];
      std::printf("  %-6d %-5d %-5s %12.0f %12.1f %12.1f %+8.1f%% %7.2f\n", s.ranks, s.hosts,
                  s.reduces ? "ring" : "link", s.bytes, s.seconds * 1e6, fit.predicted_s[i] * 1e6,
                  100 * (fit.predicted_s[i] - s.seconds) / s.seconds, fit.weights[i]);
    }
    std::printf("  residuals: median |%.1f%%|, worst |%.1f%%|\n", 100 * fit.median_abs_error,
                100 * fit.worst_abs_error);
  };
  if (inter.empty() && intra.empty()) {
    Say("no rows to fit");
    return 2;
  }
  kolo::sim::TransportCosts& t = transport == "rdma" ? cal.rdma : cal.tcp;
  if (!inter.empty()) {
    auto fit = kolo::sim::FitSamples(inter);
    if (!fit.ok()) {
      Say(fit.status().ToString());
      return 2;
    }
    report("between hosts", inter, *fit);
    t.latency_us = fit->latency_s * 1e6;
    t.efficiency = std::min(1.0, fit->bytes_per_s / (gbit * 1e9 / 8));
    t.copy_gbytes_per_s = 0;  // folded into the fitted bandwidth
    if (fit->reduce_bytes_per_s > 0) cal.reduce_gbytes_per_s = fit->reduce_bytes_per_s / 1e9;
    cal.engine_overhead_us = fit->engine_s * 1e6;
    std::printf("  -> %s: latency_us %.2f, efficiency %.3f of %s\n", transport.c_str(),
                t.latency_us, t.efficiency, link.c_str());
    per_collective(inter_steps, *fit);
  }
  if (!intra.empty()) {
    // Copies by the ranks' own cores: large buffers may move at a rate of their own.
    auto fit = kolo::sim::FitSamples(intra, /*size_regimes=*/!one_bandwidth);
    if (!fit.ok()) {
      Say(fit.status().ToString());
      return 2;
    }
    report("within a host", intra, *fit);
    cal.shm.latency_us = fit->latency_s * 1e6;
    cal.shm.efficiency = 1;
    cal.intra_gbytes_per_s = fit->bytes_per_s / 1e9;
    cal.intra_large_bytes = fit->large_bytes;
    cal.intra_large_gbytes_per_s = fit->large_bytes_per_s / 1e9;
    if (inter.empty() && fit->reduce_bytes_per_s > 0) {
      cal.reduce_gbytes_per_s = fit->reduce_bytes_per_s / 1e9;
    }
    if (inter.empty()) cal.engine_overhead_us = fit->engine_s * 1e6;
    if (inter.empty()) per_collective(intra_steps, *fit);
  }
  // Step rows are read on the fit of rows of their own kind (between hosts, or within one).
  if (!intra_steps.empty() && (!inter.empty() || intra.empty())) {
    std::printf(
        "step rows within a host ignored: they need buffer rows within a host and none "
        "between hosts\n");
  }
  if (!inter_steps.empty() && inter.empty()) {
    std::printf("step rows between hosts ignored: they need buffer rows between hosts\n");
  }
  const std::string text = kolo::sim::CalibrationToJson(cal);
  if (out_path.empty()) {
    std::fputs(text.c_str(), stdout);
  } else {
    std::ofstream out(out_path);
    out << text;
    if (!out) {
      Say(fmt::format("cannot write {}", out_path));
      return 1;
    }
    std::printf("wrote %s\n", out_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "usage: kolo-sim predict ARGS... | kolo-sim calibrate ARGS... | kolo-sim allreduce ARGS... "
      "(--help)";
  if (argc < 2) {
    Say(usage);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "predict") return Predict(argc - 1, argv + 1);
  if (cmd == "calibrate") return Calibrate(argc - 1, argv + 1);
  if (cmd == "allreduce") return Allreduce(argc - 1, argv + 1);
  if (cmd == "--help" || cmd == "-h") {
    std::printf("%s\n", usage.c_str());
    return 0;
  }
  Say(fmt::format("unknown command '{}'; {}", cmd, usage));
  return 2;
}
