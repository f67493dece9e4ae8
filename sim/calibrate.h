// `kolo-sim calibrate`: fitting the simulator's link and host parameters to allreduce times
// measured by kolo-allreduce-bench (its --json documents) on the user's own cluster.
//
// Each measured row (backend row "ring": kolo's engine ring; "link": the same ring's exchange
// without the reduction) is a ring allreduce of `bytes` over N ranks on H hosts, which the model
// (RingAllreduceTime) times as
//   t = 2(N-1) * latency + 2(N-1) * (bytes / N) / bandwidth + [ring rows] (N-1) * (bytes / N) /
//   reduce
// (bandwidth: the bottleneck link's, the NIC's when H > 1, the intra-host link's otherwise).
// A linear least-squares fit in (latency, 1 / bandwidth, 1 / reduce) over every row gives the
// three, each clamped at zero cost where the data cannot see it.
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
};

struct Fit {
  double latency_s = 0;
  double bytes_per_s = 0;           // the bottleneck link's achieved payload rate
  double reduce_bytes_per_s = 0;    // 0: no reduction cost seen
  std::vector<double> predicted_s;  // per sample
  double median_abs_error = 0;      // relative
  double worst_abs_error = 0;
};

// Reads every ring and link row of a kolo-allreduce-bench --json document.
StatusOr<std::vector<BenchSample>> ReadBenchJson(const std::string& path);
// The model's time for a sample under (latency, bandwidth, reduce).
double SampleTime(const BenchSample& s, double latency_s, double bytes_per_s,
                  double reduce_bytes_per_s);
// Least squares over `samples` (at least 2, with two different sizes).
StatusOr<Fit> FitSamples(const std::vector<BenchSample>& samples);

}  // namespace kolo::sim
