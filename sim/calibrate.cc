#include "sim/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>

#include "engine/common/file.h"
#include "engine/common/tensor.h"
#include "engine/coordinator/message.h"
#include "engine/fusion/planner.h"
#include "models/zoo/zoo.h"
#include "sim/model.h"

namespace kolo::sim {
namespace {

using Json = nlohmann::json;

constexpr size_t kParams = 6;

// (latency, 1 / bandwidth, 1 / reduce, engine, start, the further cost per byte of a buffer of
// at least `large_bytes`, 0: none): see calibrate.h.
std::array<double, kParams> Features(const BenchSample& s, double large_bytes) {
  const double n = s.ranks;
  const double piece = s.bytes / n;
  const double k = s.host_share;
  // A host's bucket serves every rank of the host: each one's share of it.
  const double burst = s.burst_bytes * s.hosts / n;
  const double moved = std::max(0.0, 2 * (n - 1) * piece - burst) * k;
  return {2 * (n - 1) * k,     moved, s.reduces ? (n - 1) * piece * k : 0.0,
          s.reduces ? k : 0.0, 1.0,   large_bytes > 0 && s.bytes >= large_bytes ? moved : 0.0};
}

// Solves the k x k system a x = b (Gaussian elimination with partial pivoting); false if singular.
bool Solve(std::vector<std::vector<double>> a, std::vector<double> b, std::vector<double>* x) {
  const size_t k = b.size();
  for (size_t c = 0; c < k; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < k; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[p][c])) p = r;
    }
    if (std::abs(a[p][c]) < 1e-300) return false;
    std::swap(a[p], a[c]);
    std::swap(b[p], b[c]);
    for (size_t r = 0; r < k; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (size_t j = c; j < k; ++j) a[r][j] -= f * a[c][j];
      b[r] -= f * b[c];
    }
  }
  x->resize(k);
  for (size_t c = 0; c < k; ++c) (*x)[c] = b[c] / a[c][c];
  return true;
}

}  // namespace

namespace {

// `what` names the file in errors ("kolo-allreduce-bench document").
StatusOr<Json> ReadJsonFile(const std::string& path, std::string_view what) {
  KOLO_ASSIGN_OR_RETURN(std::string text, ReadFileBounded(path, kMaxInputFileBytes, what));
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    return InvalidArgument("{}: not valid JSON: {}", path, e.what());
  }
}

StatusOr<Json> ReadBenchDocument(const std::string& path) {
  KOLO_ASSIGN_OR_RETURN(Json j, ReadJsonFile(path, "kolo-allreduce-bench document"));
  if (!j.is_object() || !j.contains("rows") || !j.contains("ranks") || !j.contains("hosts")) {
    return InvalidArgument("{}: not a kolo-allreduce-bench --json document (no ranks, hosts, rows)",
                           path);
  }
  return j;
}

}  // namespace

StatusOr<double> ReadStepJitter(const std::string& path) {
  KOLO_ASSIGN_OR_RETURN(Json j, ReadJsonFile(path, "run record"));
  const auto number = [](const Json& o, const char* key) {
    return o.is_object() && o.contains(key) && o.at(key).is_number();
  };
  if (!j.is_object() || !j.contains("settings") || !number(j.at("settings"), "ranks")) {
    return InvalidArgument("{}: not a kolo-train --json run record (no settings.ranks)", path);
  }
  if (j.value("status", "") != "ok") {
    return InvalidArgument("{}: the run's status is '{}', not ok: it measured no steps", path,
                           j.value("status", ""));
  }
  const int ranks = j.at("settings").at("ranks").get<int>();
  if (ranks != 1) {
    return InvalidArgument(
        "{}: a run of {} ranks; allowed: 1 (a rank alone, whose steps vary only by its own "
        "compute)",
        path, ranks);
  }
  const Json& r = j.contains("results") ? j.at("results") : Json();
  if (!number(r, "images_per_sec_stddev") || !number(r, "images_per_sec_per_rank") ||
      r.at("images_per_sec_per_rank").get<double>() <= 0) {
    return InvalidArgument(
        "{}: no images_per_sec_stddev and positive images_per_sec_per_rank in its results", path);
  }
  return r.at("images_per_sec_stddev").get<double>() /
         r.at("images_per_sec_per_rank").get<double>();
}

StatusOr<std::vector<StepSample>> ReadBenchSteps(const std::string& path) {
  KOLO_ASSIGN_OR_RETURN(Json j, ReadBenchDocument(path));
  std::vector<StepSample> out;
  if (!j.contains("step")) return out;
  try {
    const Json& st = j.at("step");
    for (const Json& r : st.at("rows")) {
      if (r.value("backend", "") != "ring") continue;
      StepSample s;
      s.ranks = j.at("ranks").get<int>();
      s.hosts = std::max(1, static_cast<int>(j.at("hosts").size()));
      s.model = st.at("model").get<std::string>();
      s.fused = r.at("fusion").get<bool>();
      s.threshold_bytes = r.at("fusion_threshold_bytes").get<double>();
      s.collectives = r.at("per_step").at("collectives").get<double>();
      s.seconds = r.at("step").at("median_us").get<double>() * 1e-6;
      s.origin = path;
      out.push_back(s);
    }
  } catch (const Json::exception& e) {
    return InvalidArgument("{}: its step rows are not kolo-allreduce-bench's: {}", path, e.what());
  }
  return out;
}

StatusOr<double> FitPerCollective(const std::vector<StepSample>& steps, const Fit& fit,
                                  double fusion_copy_bytes_per_s, std::vector<std::string>* lines) {
  std::vector<std::pair<double, double>> figures;  // (seconds per collective, collectives apart)
  for (const StepSample& off : steps) {
    if (off.fused) continue;
    for (const StepSample& on : steps) {
      if (!on.fused || on.origin != off.origin || on.model != off.model) continue;
      if (on.collectives >= off.collectives) continue;
      models::zoo::ModelConfig config;
      KOLO_ASSIGN_OR_RETURN(models::Graph graph, models::zoo::BuildModel(off.model, config));
      // The model's gradients in backprop order, each its own ring (fusion off), and grouped by
      // the engine's own planner (fusion on), each fused group copied into and out of the fusion
      // buffer; copies run slower by the host share, as a prediction has them.
      BenchSample ring;
      ring.ranks = off.ranks;
      ring.hosts = off.hosts;
      ring.reduces = true;
      ring.host_share = off.host_share;
      // The step cycles through every gradient, each buffer used once a step: where they add up
      // to a large buffer, every collective's bytes come from beyond the caches.
      double step_bytes = 0;
      for (const models::Parameter& p : graph.params()) step_bytes += 4.0 * p.numel;
      const bool large = fit.large_bytes > 0 && step_bytes >= fit.large_bytes;
      auto ring_time = [&](double bytes) {
        ring.bytes = bytes;
        return SampleTime(ring, fit.latency_s, large ? fit.large_bytes_per_s : fit.bytes_per_s,
                          fit.reduce_bytes_per_s);
      };
      std::vector<coordinator::Response> responses;
      double unfused = 0, fused = 0;
      for (int id : graph.BackpropOrder()) {
        const models::Parameter& p = graph.params()[static_cast<size_t>(id)];
        coordinator::Response r;
        r.request.name = p.name;
        r.request.type = coordinator::CollectiveType::kAllreduce;
        r.request.dtype = DataType::kFloat32;
        r.request.reduce_op = static_cast<uint8_t>(ReduceOp::kAverage);
        r.request.shape = p.shape;
        unfused += ring_time(static_cast<double>(r.bytes()));
        responses.push_back(std::move(r));
      }
      const auto plan =
          fusion::PlanFusion(responses, static_cast<size_t>(std::max(0.0, on.threshold_bytes)));
      const int groups = static_cast<int>(plan.size());
      for (const fusion::Group& g : plan) {
        const double bytes = static_cast<double>(g.bytes);
        fused += ring_time(bytes);
        if (g.fused && fusion_copy_bytes_per_s > 0) {
          fused += 2 * bytes / fusion_copy_bytes_per_s * off.host_share;
        }
      }
      const double model_gap = unfused - fused;
      // One rank's own time per collective: what ranks sharing cores measured, over their share.
      const double figure = ((off.seconds - on.seconds) - model_gap) /
                            (off.collectives - on.collectives) / off.host_share;
      figures.push_back({figure, off.collectives - on.collectives});
      lines->push_back(
          fmt::format("{} {} ranks ({} hosts): fusion off {:.1f} ms ({:.0f} collectives), on "
                      "{:.1f} ms ({:.1f}); "
                      "the ring model's difference {:.1f} ms ({} groups): {:.1f} us per collective",
                      off.model, off.ranks, off.hosts, off.seconds * 1e3, off.collectives,
                      on.seconds * 1e3, on.collectives, model_gap * 1e3, groups, figure * 1e6));
    }
  }
  if (figures.empty()) return NotFound("no pair of step rows with fusion off and on");
  // The median weighted by how many collectives apart each pair is: a pair a few collectives
  // apart (VGG-16's 32 tensors) measures mostly the steps' noise.
  std::sort(figures.begin(), figures.end());
  double total = 0;
  for (const auto& f : figures) total += f.second;
  double seen = 0;
  for (const auto& [figure, weight] : figures) {
    seen += weight;
    if (seen >= total / 2) return std::max(0.0, figure);
  }
  return std::max(0.0, figures.back().first);
}

StatusOr<std::vector<BenchSample>> ReadBenchJson(const std::string& path) {
  KOLO_ASSIGN_OR_RETURN(Json j, ReadBenchDocument(path));
  std::vector<BenchSample> out;
  const int ranks = j.at("ranks").get<int>();
  const int hosts = static_cast<int>(j.at("hosts").size());
  for (const Json& r : j.at("rows")) {
    const std::string kind = r.value("kind", "");
    if (kind != "ring" && kind != "link") continue;
    if (!r.contains("time") || !r.at("time").contains("median_us")) continue;
    BenchSample s;
    s.ranks = ranks;
    s.hosts = std::max(1, hosts);
    s.bytes = r.at("bytes").get<double>();
    s.reduces = kind == "ring";
    s.seconds = r.at("time").at("median_us").get<double>() * 1e-6;
    s.transport = r.value("transport", "");
    s.origin = path;
    out.push_back(s);
  }
  if (out.empty()) return InvalidArgument("{}: no ring or link rows to fit", path);
  return out;
}

double SampleTime(const BenchSample& s, double latency_s, double bytes_per_s,
                  double reduce_bytes_per_s, double engine_s, double start_s) {
  const auto f = Features(s, 0);
  return f[0] * latency_s + (bytes_per_s > 0 ? f[1] / bytes_per_s : 0) +
         (reduce_bytes_per_s > 0 ? f[2] / reduce_bytes_per_s : 0) + f[3] * engine_s +
         f[4] * start_s;
}

double SampleTime(const BenchSample& s, const Fit& fit) {
  const bool large = fit.large_bytes > 0 && fit.large_bytes_per_s > 0 && s.bytes >= fit.large_bytes;
  return SampleTime(s, fit.latency_s, large ? fit.large_bytes_per_s : fit.bytes_per_s,
                    fit.reduce_bytes_per_s, fit.engine_s, fit.start_s);
}

namespace {

// The robust fit with buffers of at least `large_bytes` (> 0) given a further cost per byte.
StatusOr<Fit> FitWith(const std::vector<BenchSample>& samples, double large_bytes) {
  std::set<int> rank_counts;
  bool any_ring = false, any_link = false;
  for (const auto& s : samples) {
    rank_counts.insert(s.ranks);
    (s.reduces ? any_ring : any_link) = true;
  }
  // Relative least squares (each row weighted by 1 / measured time) so that small buffers count.
  // The reduction and the engine's time are seen only as the difference between ring and link
  // rows (the one growing with the buffer, the other not); with one kind alone both are folded
  // into the latency and the bandwidth. The start needs two rank counts (see calibrate.h).
  const bool fit_reduce = any_ring && any_link;
  const bool fit_start = rank_counts.size() > 1;
  const size_t k = kParams;
  std::vector<double> x;
  // Parameters the rows cannot see are held at zero.
  std::vector<bool> zero = {false, false, !fit_reduce, !fit_reduce, !fit_start, large_bytes <= 0};
  // The features span some twenty orders of magnitude (counts of steps against bytes), so each
  // column is scaled to unit weighted norm before the normal equations are solved: unscaled, the
  // elimination loses the small columns and can return a fit far from the least-squares one.
  std::vector<double> scale(k, 0);
  for (const auto& s : samples) {
    const auto f = Features(s, large_bytes);
    for (size_t i = 0; i < k; ++i) scale[i] += f[i] * f[i] / (s.seconds * s.seconds);
  }
  for (double& c : scale) c = c > 0 ? std::sqrt(c) : 1;
  // A robust fit (iteratively reweighted, Huber's weights on the relative residuals): rows far
  // off the model (a small buffer held up by the host's scheduler, a shaped link's burst) are
  // down-weighted instead of pulling every parameter towards them. Each row's weight is kept in
  // the fit and printed beside its residual.
  const std::vector<bool> held = zero;
  std::vector<double> robust(samples.size(), 1.0), used = robust;
  for (int round = 0; round < 30; ++round) {
    zero = held;
    used = robust;  // the weights of this round's solve, the last of which is the fit
    for (int pass = 0; pass < 6; ++pass) {
      std::vector<std::vector<double>> a(k, std::vector<double>(k, 0));
      std::vector<double> b(k, 0);
      for (size_t r = 0; r < samples.size(); ++r) {
        const auto& s = samples[r];
        auto f = Features(s, large_bytes);
        for (size_t i = 0; i < k; ++i) f[i] /= scale[i];
        const double w = robust[r] / (s.seconds * s.seconds);
        for (size_t i = 0; i < k; ++i) {
          for (size_t m = 0; m < k; ++m) a[i][m] += w * (zero[i] || zero[m] ? 0 : f[i] * f[m]);
          b[i] += w * (zero[i] ? 0 : f[i] * s.seconds);
        }
      }
      for (size_t i = 0; i < k; ++i) {
        if (zero[i]) a[i][i] = 1;
      }
      if (!Solve(a, b, &x)) return InvalidArgument("the rows do not determine the parameters");
      for (size_t i = 0; i < k; ++i) x[i] /= scale[i];
      bool again = false;
      for (size_t i = 0; i < k; ++i) {
        if (x[i] < 0) {
          zero[i] = true;
          x[i] = 0;
          again = true;
        }
      }
      if (!again) break;
    }
    std::vector<double> residual, magnitude;
    for (const auto& s : samples) {
      const auto f = Features(s, large_bytes);
      double p = 0;
      for (size_t i = 0; i < k; ++i) p += x[i] * f[i];
      residual.push_back((p - s.seconds) / s.seconds);
      magnitude.push_back(std::abs(residual.back()));
    }
    std::nth_element(magnitude.begin(), magnitude.begin() + magnitude.size() / 2, magnitude.end());
    const double sigma = std::max(1e-3, 1.4826 * magnitude[magnitude.size() / 2]);
    double change = 0;
    for (size_t r = 0; r < samples.size(); ++r) {
      const double w = std::min(1.0, 1.345 * sigma / std::max(1e-12, std::abs(residual[r])));
      change = std::max(change, std::abs(w - robust[r]));
      robust[r] = w;
    }
    if (change < 1e-4) break;
  }
  Fit fit;
  fit.latency_s = x[0];
  fit.bytes_per_s = x[1] > 0 ? 1.0 / x[1] : 0;
  fit.reduce_bytes_per_s = x[2] > 0 ? 1.0 / x[2] : 0;
  fit.engine_s = x[3];
  fit.start_s = x[4];
  if (fit.bytes_per_s <= 0) return InvalidArgument("the fit found no bandwidth cost in the rows");
  if (x[5] > 0) {
    fit.large_bytes = large_bytes;
    fit.large_bytes_per_s = 1.0 / (x[1] + x[5]);
  }
  std::vector<double> errors;
  for (const auto& s : samples) {
    const double p = SampleTime(s, fit);
    fit.predicted_s.push_back(p);
    fit.weights.push_back(used[fit.weights.size()]);
    errors.push_back(std::abs(p - s.seconds) / s.seconds);
  }
  std::sort(errors.begin(), errors.end());
  fit.median_abs_error = errors[errors.size() / 2];
  fit.worst_abs_error = errors.back();
  return fit;
}

}  // namespace

StatusOr<Fit> FitSamples(const std::vector<BenchSample>& samples, bool size_regimes) {
  std::set<double> sizes;
  for (const auto& s : samples) {
    if (s.ranks < 2)
      return InvalidArgument("{}: a sample of {} rank(s); a fit needs >= 2", s.origin, s.ranks);
    sizes.insert(s.bytes);
  }
  if (samples.size() < 2 || sizes.size() < 2) {
    return InvalidArgument("a fit needs rows at two or more buffer sizes (got {} size(s))",
                           sizes.size());
  }
  KOLO_ASSIGN_OR_RETURN(Fit one, FitWith(samples, 0));
  if (!size_regimes) return one;
  // Each measured size with two or more sizes below it and two or more at or above it. The mean
  // residual judges (a robust fit's median follows the many small sizes and hides a few large
  // ones it cannot fit): the best is kept if its mean is clearly (by a tenth) below one
  // bandwidth's, and that is above 0.1% (within it, one bandwidth already fits the rows).
  auto mean_error = [&](const Fit& f) {
    double sum = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      sum += std::abs(f.predicted_s[i] - samples[i].seconds) / samples[i].seconds;
    }
    return sum / static_cast<double>(samples.size());
  };
  const std::vector<double> ordered(sizes.begin(), sizes.end());
  std::optional<Fit> best;
  for (size_t i = 2; i + 2 <= ordered.size(); ++i) {
    auto regimes = FitWith(samples, ordered[i]);
    if (regimes.ok() && regimes->large_bytes > 0 &&
        (!best || mean_error(*regimes) < mean_error(*best))) {
      best = *std::move(regimes);
    }
  }
  const double one_error = mean_error(one);
  if (best && one_error > 1e-3 && mean_error(*best) < 0.9 * one_error) return *best;
  return one;
}

}  // namespace kolo::sim
