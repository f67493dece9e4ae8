// `kolo-sim calibrate`: fitting the simulator's link and host parameters to allreduce times
// measured by kolo-allreduce-bench (its --json documents) on the user's own cluster.
//
// Each measured row (backend row "ring": kolo's engine ring; "link": the same ring's exchange
// without the reduction) is a ring allreduce of `bytes` over N ranks on H hosts, which the model
// (RingAllreduceTime) times as
//   t = start + 2(N-1) * latency + max(0, 2(N-1) * (bytes / N) - burst / R) / bandwidth
//       + [ring rows] ((N-1) * (bytes / N) / reduce + engine)
// (R: ranks per host; the latency, the bytes' and the reduction's times, and the engine's, slowed
// by the host share where ranks share one machine's cores, as a prediction has them;
// bandwidth: the bottleneck link's, the NIC's when H > 1, the intra-host link's otherwise;
// start: what every timed iteration of the bench spends before the ring, the ranks leaving the
// barrier that precedes it at different moments, which a training step does not have and so is
// not kept; engine: what a ring row spends in kolo's engine around the ring, kept as the
// calibration's engine_overhead_us. It includes the row's negotiation, which a prediction also
// charges on its own: one bit exchange counted twice.)
// A linear least-squares fit in (latency, 1 / bandwidth, 1 / reduce, engine, start) over every
// row, relative and robust (rows far off the model are down-weighted, Huber's weights), gives
// them, each clamped at zero cost where the data cannot see it. The start and the
// latency are told apart only by rows at two or more rank counts; with one, the start is folded
// into the latency.
// Within a host the bytes are copies by the ranks' own cores, which slow once a buffer no longer
// stays in the caches: with size regimes, the fit also tries, at each measured size T with two or
// more sizes on either side, a further cost per byte for buffers of at least T bytes (the
// large-buffer bandwidth), and keeps the T whose fit has the smallest mean residual, if that is
// clearly (by a tenth) smaller than with one bandwidth.
#pragma once

#include <string>
#include <vector>

#include "engine/common/status.h"

namespace kolo::sim {

struct BenchSample {
  int ranks = 2;
  int hosts = 1;
  double bytes = 0;
  bool reduces = true;  // a "ring" row (sums what it receives); false: a "link" row
  double seconds = 0;   // measured median
  std::string transport;
  std::string origin;  // file
  // How many times slower the host-bound costs run (the prediction's HostShare: ranks over the
  // calibration's host_cores where every rank shares them), 1 otherwise.
  double host_share = 1;
  // What the link passes unshaped before its rate applies, from idle: the emulated cluster's tbf
  // bucket (scripts/cluster status: "tbf burst"); 0 for a real NIC. A bench iteration starts from
  // an idle link, so the first this many bytes of each host's egress (shared by its ranks) cost no
  // bandwidth time.
  double burst_bytes = 0;
};

struct Fit {
  double latency_s = 0;
  double bytes_per_s = 0;         // the bottleneck link's achieved payload rate
  double reduce_bytes_per_s = 0;  // 0: no reduction cost seen
  double engine_s = 0;            // per ring row, around the ring (the engine's own work)
  double start_s = 0;             // per timed iteration of any row (the bench's barrier)
  // Buffers of at least large_bytes move at large_bytes_per_s instead of bytes_per_s (size
  // regimes); 0: one bandwidth for every size.
  double large_bytes = 0;
  double large_bytes_per_s = 0;
  std::vector<double> predicted_s;  // per sample
  std::vector<double> weights;      // per sample: the robust fit's weight, 1 = full
  double median_abs_error = 0;      // relative
  double worst_abs_error = 0;
};

// One training step's allreduces as kolo-allreduce-bench --tensors times them through kolo's
// engine (a "step" row): every gradient of `model` submitted at once, fusion off or on.
struct StepSample {
  int ranks = 2;
  int hosts = 1;
  std::string model;
  bool fused = true;
  double threshold_bytes = 0;
  double collectives = 0;  // per step, as the engine counted them
  double seconds = 0;      // measured median step
  std::string origin;
  double host_share = 1;  // as BenchSample's
};

// The engine's own time per collective (beyond its ring and the time per cycle), from pairs of
// step rows with fusion off and on at one rank count: the measured difference of the two steps
// less what the fitted ring model (`fit`) gives the difference of their collectives (each
// tensor's own ring against the fused groups' rings and their copies into and out of the fusion
// buffer), over the difference in collectives. The median over the pairs, each weighted by its
// difference in collectives, and at least 0; each pair's figure is appended to `lines`. NotFound
// if no pair is given.
StatusOr<double> FitPerCollective(const std::vector<StepSample>& steps, const Fit& fit,
                                  double fusion_copy_bytes_per_s, std::vector<std::string>* lines);

// Reads the step rows (backend ring) of a kolo-allreduce-bench --tensors --json document; none
// if it has none.
StatusOr<std::vector<StepSample>> ReadBenchSteps(const std::string& path);

// One rank's step-time coefficient of variation (the calibration's step_jitter) from a kolo-train
// --json run record of one rank: its images_per_sec_stddev over its images_per_sec_per_rank (the
// steps' images/sec vary as their times do, to first order). Errors name the file and what is
// wrong with it (not a run record, a failed run, more than one rank).
StatusOr<double> ReadStepJitter(const std::string& path);

// Reads every ring and link row of a kolo-allreduce-bench --json document.
StatusOr<std::vector<BenchSample>> ReadBenchJson(const std::string& path);
// The model's time for a sample under (latency, bandwidth, reduce).
double SampleTime(const BenchSample& s, double latency_s, double bytes_per_s,
                  double reduce_bytes_per_s, double engine_s = 0, double start_s = 0);
// The model's time for a sample under `fit` (its large-buffer bandwidth included).
double SampleTime(const BenchSample& s, const Fit& fit);
// Least squares over `samples` (at least 2, with two different sizes); `size_regimes` lets the
// fit give large buffers a bandwidth of their own (see above).
StatusOr<Fit> FitSamples(const std::vector<BenchSample>& samples, bool size_regimes = false);

}  // namespace kolo::sim
