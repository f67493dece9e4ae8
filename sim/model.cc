#include "sim/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <queue>

#include "engine/backends/ps/placement.h"
#include "engine/collectives/plan.h"
#include "engine/common/file.h"
#include "engine/common/options.h"
#include "engine/common/tensor.h"
#include "engine/coordinator/controller.h"
#include "engine/fusion/planner.h"
#include "engine/transport/shm/host_area.h"
#include "models/compute/replay/profile.h"
#include "models/zoo/zoo.h"

namespace kolo::sim {
namespace {

using Json = nlohmann::json;
using coordinator::Request;
using coordinator::Response;

constexpr double kGiga = 1e9;
// A step-time coefficient of variation beyond this is no longer a jitter a normal law describes
// (it would give over 2% of steps no time at all).
constexpr double kMaxStepJitter = 0.5;

// ---- Calibration JSON ----

Json PacedShareJson(const Calibration& c) {
  Json m = Json::object();
  for (const auto& [ratio, share] : c.ps_paced_spread_share) m[fmt::format("{:g}", ratio)] = share;
  return m;
}

Json StreamSpreadJson(const Calibration& c) {
  Json m = Json::object();
  for (const auto& [streams, spread] : c.ps_stream_spread) m[std::to_string(streams)] = spread;
  return m;
}

Status ReadCosts(const Json& j, const char* key, TransportCosts* out, const std::string& origin) {
  if (!j.contains(key)) return Status::OK();
  const Json& t = j.at(key);
  if (!t.is_object()) return InvalidArgument("{}: \"{}\" must be an object", origin, key);
  for (auto [field, target] :
       {std::pair{"latency_us", &out->latency_us}, std::pair{"efficiency", &out->efficiency},
        std::pair{"copy_gbytes_per_s", &out->copy_gbytes_per_s},
        std::pair{"stream_gbit", &out->stream_gbit}}) {
    if (!t.contains(field)) continue;
    if (!t.at(field).is_number()) {
      return InvalidArgument("{}: {}.{} must be a number", origin, key, field);
    }
    *target = t.at(field).get<double>();
  }
  if (out->latency_us < 0 || out->copy_gbytes_per_s < 0 || out->stream_gbit < 0) {
    return InvalidArgument("{}: {}.latency_us, copy_gbytes_per_s and stream_gbit must be >= 0",
                           origin, key);
  }
  if (!(out->efficiency > 0 && out->efficiency <= 1)) {
    return InvalidArgument("{}: {}.efficiency = {} is not allowed; allowed: a fraction in (0, 1]",
                           origin, key, out->efficiency);
  }
  return Status::OK();
}

Json CostsJson(const TransportCosts& t) {
  Json j = {{"latency_us", t.latency_us},
            {"efficiency", t.efficiency},
            {"copy_gbytes_per_s", t.copy_gbytes_per_s}};
  if (t.stream_gbit > 0) j["stream_gbit"] = t.stream_gbit;  // a per-stream cap, where one is set
  return j;
}

// ---- The symmetric job the real Controller negotiates in ----

// Simulated time, as the controller reads it.
class SimClock final : public coordinator::Clock {
 public:
  coordinator::SteadyClock::time_point Now() override { return At(now_s); }
  static coordinator::SteadyClock::time_point At(double s) {
    return coordinator::SteadyClock::time_point(
        std::chrono::duration_cast<coordinator::SteadyClock::duration>(
            std::chrono::duration<double>(s + 1.0)));
  }
  double now_s = 0;
};

// Every rank runs the same profile, so every rank submits the same tensors at the same times and
// holds the same cache: the bit vectors every rank contributes are this rank's own, and rank 0
// gathers `size` copies of this rank's requests. The peers record what was exchanged, for the
// negotiation's time.
class SymmetricPeers final : public coordinator::Peers {
 public:
  explicit SymmetricPeers(int size) : size_(size) {}
  Status BitwiseAllreduce(uint64_t*, size_t and_words, size_t or_words) override {
    bit_words = and_words + or_words;
    ++bit_exchanges;
    return Status::OK();
  }
  StatusOr<std::vector<std::vector<uint8_t>>> GatherAtRoot(
      const std::vector<uint8_t>& mine) override {
    gathered_bytes = static_cast<double>(mine.size());
    ++rounds;
    return std::vector<std::vector<uint8_t>>(static_cast<size_t>(size_), mine);
  }
  StatusOr<std::vector<uint8_t>> BroadcastFromRoot(const std::vector<uint8_t>& message) override {
    broadcast_bytes = static_cast<double>(message.size());
    return message;
  }
  void Reset() {
    bit_words = 0;
    bit_exchanges = 0;
    rounds = 0;
    gathered_bytes = broadcast_bytes = 0;
  }
  size_t bit_words = 0;
  int bit_exchanges = 0;
  int rounds = 0;
  double gathered_bytes = 0, broadcast_bytes = 0;

 private:
  int size_;
};

struct Tensor {
  std::string name;
  Shape shape;
  double bytes = 0;
  double submit_s = 0;  // within the step
  double done_s = 0;
  double update_s = 0;  // this parameter's share of the optimizer's time
};

int CeilLog2(int n) {
  int r = 0;
  while ((1 << r) < n) ++r;
  return r;
}

}  // namespace

// ---- Calibration ----

StatusOr<Calibration> CalibrationFromJson(const std::string& text, const std::string& origin) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::parse_error& e) {
    return InvalidArgument("{}: not valid JSON: {}", origin, e.what());
  }
  if (!j.is_object() || j.value("format", "") != "kolo-sim-calibration") {
    return InvalidArgument("{}: not a kolo-sim calibration (\"format\": \"kolo-sim-calibration\")",
                           origin);
  }
  Calibration c;
  c.name = j.value("name", "");
  if (c.name.empty()) return InvalidArgument("{}: \"name\" must be a non-empty string", origin);
  c.source = j.value("source", "");
  KOLO_RETURN_IF_ERROR(ReadCosts(j, "tcp", &c.tcp, origin));
  KOLO_RETURN_IF_ERROR(ReadCosts(j, "rdma", &c.rdma, origin));
  KOLO_RETURN_IF_ERROR(ReadCosts(j, "shm", &c.shm, origin));
  for (auto [field, target] :
       {std::pair{"link_gbit", &c.link_gbit},
        std::pair{"intra_gbytes_per_s", &c.intra_gbytes_per_s},
        std::pair{"intra_latency_us", &c.intra_latency_us},
        std::pair{"intra_large_bytes", &c.intra_large_bytes},
        std::pair{"intra_large_gbytes_per_s", &c.intra_large_gbytes_per_s},
        std::pair{"reduce_gbytes_per_s", &c.reduce_gbytes_per_s},
        std::pair{"fusion_copy_gbytes_per_s", &c.fusion_copy_gbytes_per_s},
        std::pair{"host_cores", &c.host_cores},
        std::pair{"engine_overhead_us", &c.engine_overhead_us},
        std::pair{"engine_collective_us", &c.engine_collective_us},
        std::pair{"step_jitter", &c.step_jitter}, std::pair{"interference", &c.interference}}) {
    if (!j.contains(field)) continue;
    if (!j.at(field).is_number() || j.at(field).get<double>() < 0) {
      return InvalidArgument("{}: \"{}\" must be a number >= 0", origin, field);
    }
    *target = j.at(field).get<double>();
  }
  if (c.link_gbit <= 0 || c.intra_gbytes_per_s <= 0) {
    return InvalidArgument("{}: link_gbit and intra_gbytes_per_s must be > 0", origin);
  }
  if (c.step_jitter > kMaxStepJitter) {
    return InvalidArgument("{}: \"step_jitter\" {} is not allowed; allowed: 0 to {}", origin,
                           c.step_jitter, kMaxStepJitter);
  }
  if (c.interference > kMaxInterference) {
    return InvalidArgument("{}: \"interference\" {} is not allowed; allowed: 0 to {}", origin,
                           c.interference, kMaxInterference);
  }
  if (j.contains("ps_stream_spread")) {
    const Json& m = j.at("ps_stream_spread");
    if (!m.is_object()) {
      return InvalidArgument(
          "{}: \"ps_stream_spread\" must be an object of stream counts to spreads, e.g. {{\"8\": "
          "0.11}}",
          origin);
    }
    for (const auto& [key, value] : m.items()) {
      int streams = 0;
      if (!key.empty() && key.size() <= 6 && key[0] != '0' &&
          std::all_of(key.begin(), key.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
        streams = std::stoi(key);
      }
      if (streams < 1 || !value.is_number() || value.get<double>() < 0 ||
          value.get<double>() >= 1) {
        return InvalidArgument(
            "{}: \"ps_stream_spread\" entry \"{}\": {} is not allowed; allowed: a stream count "
            ">= 1 and a spread from 0 up to (not including) 1",
            origin, key, value.dump());
      }
      c.ps_stream_spread[streams] = value.get<double>();
    }
  }
  if (j.contains("ps_paced_spread_share")) {
    const Json& m = j.at("ps_paced_spread_share");
    if (!m.is_object()) {
      return InvalidArgument(
          "{}: \"ps_paced_spread_share\" must be an object of pace ratios to shares, e.g. "
          "{{\"2\": 0.68}}",
          origin);
    }
    for (const auto& [key, value] : m.items()) {
      char* end = nullptr;
      const double ratio = key.empty() ? 0 : std::strtod(key.c_str(), &end);
      const bool number = !key.empty() && end == key.c_str() + key.size() && std::isfinite(ratio);
      if (!number || ratio <= 1 || !value.is_number() || value.get<double>() < 0 ||
          value.get<double>() > 1) {
        return InvalidArgument(
            "{}: \"ps_paced_spread_share\" entry \"{}\": {} is not allowed; allowed: a pace "
            "ratio > 1 and a share from 0 to 1",
            origin, key, value.dump());
      }
      c.ps_paced_spread_share[ratio] = value.get<double>();
    }
  }
  if (j.contains("ps_full_duplex")) {
    if (!j.at("ps_full_duplex").is_boolean()) {
      return InvalidArgument("{}: \"ps_full_duplex\" must be true or false", origin);
    }
    c.ps_full_duplex = j.at("ps_full_duplex").get<bool>();
  }
  return c;
}

StatusOr<Calibration> LoadCalibration(const std::string& path) {
  KOLO_ASSIGN_OR_RETURN(std::string text, ReadFileBounded(path, kMaxInputFileBytes, "calibration"));
  return CalibrationFromJson(text, path);
}

std::string CalibrationToJson(const Calibration& c) {
  Json j = {{"format", "kolo-sim-calibration"},
            {"name", c.name},
            {"source", c.source},
            {"link_gbit", c.link_gbit},
            {"tcp", CostsJson(c.tcp)},
            {"rdma", CostsJson(c.rdma)},
            {"shm", CostsJson(c.shm)},
            {"intra_gbytes_per_s", c.intra_gbytes_per_s},
            {"intra_latency_us", c.intra_latency_us},
            {"reduce_gbytes_per_s", c.reduce_gbytes_per_s},
            {"fusion_copy_gbytes_per_s", c.fusion_copy_gbytes_per_s},
            {"ps_full_duplex", c.ps_full_duplex},
            {"ps_stream_spread", StreamSpreadJson(c)},
            {"ps_paced_spread_share", PacedShareJson(c)},
            {"host_cores", c.host_cores},
            {"engine_overhead_us", c.engine_overhead_us},
            {"engine_collective_us", c.engine_collective_us}};
  if (c.step_jitter > 0) j["step_jitter"] = c.step_jitter;
  if (c.interference > 0) j["interference"] = c.interference;
  if (c.intra_large_bytes > 0) {
    j["intra_large_bytes"] = c.intra_large_bytes;
    j["intra_large_gbytes_per_s"] = c.intra_large_gbytes_per_s;
  }
  return j.dump(2) + "\n";
}

// ---- The network ----

double PhaseTime(const Network& net, const std::vector<Flow>& flows) {
  const int n = net.hosts * net.per_host;
  std::vector<double> nic_out(static_cast<size_t>(net.hosts), 0), nic_in = nic_out;
  std::vector<double> gpu_out(static_cast<size_t>(n), 0), gpu_in = gpu_out;
  std::vector<double> copy_inter(static_cast<size_t>(n), 0), copy_intra = copy_inter;
  bool inter = false, intra = false;
  for (const Flow& f : flows) {
    if (f.bytes <= 0 || f.src == f.dst) continue;
    const int hs = f.src / net.per_host, hd = f.dst / net.per_host;
    if (hs != hd) {
      inter = true;
      nic_out[static_cast<size_t>(hs)] += f.bytes;
      nic_in[static_cast<size_t>(hd)] += f.bytes;
      copy_inter[static_cast<size_t>(f.src)] += f.bytes;
      copy_inter[static_cast<size_t>(f.dst)] += f.bytes;
    } else {
      intra = true;
      gpu_out[static_cast<size_t>(f.src)] += f.bytes;
      gpu_in[static_cast<size_t>(f.dst)] += f.bytes;
      copy_intra[static_cast<size_t>(f.src)] += f.bytes;
      copy_intra[static_cast<size_t>(f.dst)] += f.bytes;
    }
  }
  double latency = 0, wire = 0, host = 0;
  if (inter) {
    latency = std::max(latency, net.nic_latency_s);
    for (size_t h = 0; h < nic_out.size(); ++h) {
      wire = std::max(wire, std::max(nic_out[h], nic_in[h]) / net.nic_bytes_per_s);
    }
    if (net.nic_copy_bytes_per_s > 0) {
      for (double b : copy_inter) host = std::max(host, b / net.nic_copy_bytes_per_s);
    }
  }
  if (intra) {
    latency = std::max(latency, net.intra_latency_s);
    for (size_t r = 0; r < gpu_out.size(); ++r) {
      wire = std::max(wire, std::max(gpu_out[r], gpu_in[r]) / net.intra_bytes_per_s);
    }
    if (net.intra_copy_bytes_per_s > 0) {
      for (double b : copy_intra) host = std::max(host, b / net.intra_copy_bytes_per_s);
    }
  }
  return latency + wire + host;
}

double RingAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s) {
  const int n = net.hosts * net.per_host;
  if (n <= 1 || bytes <= 0) return 0;
  std::vector<Flow> step;
  step.reserve(static_cast<size_t>(n));
  const double piece = bytes / n;
  for (int r = 0; r < n; ++r) step.push_back({r, (r + 1) % n, piece});
  // The steps are not separated by barriers: a rank sends its next piece as soon as the piece
  // from its left neighbour has arrived and been summed, so what accumulates over the 2 (n - 1)
  // steps is the latency of the hops along the ring (one hop in per_host crosses a NIC, the rest
  // stay within a host), not the slowest hop's latency at every step. The bytes still go at the
  // most loaded link's pace.
  Network no_latency = net;
  no_latency.nic_latency_s = no_latency.intra_latency_s = 0;
  const double wire = PhaseTime(no_latency, step);
  const double nic_share = net.hosts > 1 ? static_cast<double>(net.hosts) / n : 0.0;
  const double hop = nic_share * net.nic_latency_s + (1 - nic_share) * net.intra_latency_s;
  const double reduce = reduce_bytes_per_s > 0 ? piece / reduce_bytes_per_s : 0;
  // Reduce-scatter: n - 1 steps that sum what arrives; allgather: n - 1 steps that copy it.
  return 2.0 * (n - 1) * (hop + wire) + (n - 1) * reduce;
}

double HierarchicalAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s) {
  const int p = net.per_host, h = net.hosts;
  if (p == 1 || h == 1) return RingAllreduceTime(net, bytes, reduce_bytes_per_s);
  // The engine cuts the buffer into chunks of about Comm::hierarchical_chunk_bytes (at most
  // kMaxHierarchicalChunks) and pipelines them: while one chunk crosses hosts, the next is reduced
  // within its host and the one before spread (engine/collectives/ring.cc).
  const collectives::Comm defaults;
  const double chunks =
      std::clamp(std::floor(bytes / static_cast<double>(defaults.hierarchical_chunk_bytes)), 1.0,
                 static_cast<double>(collectives::Comm::kMaxHierarchicalChunks));
  const double c = bytes / chunks;  // one chunk
  // 1. Reduce-scatter within each host (every host at once): p - 1 steps of c / p.
  std::vector<Flow> local;
  for (int host = 0; host < h; ++host) {
    for (int l = 0; l < p; ++l) {
      local.push_back({host * p + l, host * p + (l + 1) % p, c / p});
    }
  }
  const double local_phase = PhaseTime(net, local);
  const double reduce = reduce_bytes_per_s > 0 ? 1.0 / reduce_bytes_per_s : 0;
  // 2. Each local rank's shard allreduced across hosts: p rings at once, sharing each NIC.
  std::vector<Flow> across;
  const double piece = c / p / h;
  for (int host = 0; host < h; ++host) {
    for (int l = 0; l < p; ++l) across.push_back({host * p + l, ((host + 1) % h) * p + l, piece});
  }
  const double across_phase = PhaseTime(net, across);
  const double scatter = (p - 1) * (local_phase + c / p * reduce);
  const double cross = (h - 1) * (across_phase + piece * reduce) + (h - 1) * across_phase;
  // 3. Allgather within each host.
  const double gather = (p - 1) * local_phase;
  // A pipeline: the first chunk through every stage, then one chunk per step of the slowest
  // stage (the host's own links carry both local stages; the NICs the crossing).
  return scatter + cross + gather + (chunks - 1) * std::max(scatter + gather, cross);
}

namespace {

int LargestPowerOfTwo(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// The fold of ranks p..n-1 onto 0..n-p-1 (before), or its unfold (after): one phase of whole
// buffers.
double FoldTime(const Network& net, int n, int p, double bytes, bool before) {
  if (n == p) return 0;
  std::vector<Flow> flows;
  for (int i = 0; i + p < n; ++i) {
    flows.push_back(before ? Flow{p + i, i, bytes} : Flow{i, p + i, bytes});
  }
  return PhaseTime(net, flows);
}

}  // namespace

double RecursiveDoublingAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s) {
  const int n = net.hosts * net.per_host;
  if (n <= 1 || bytes <= 0) return 0;
  const int p = LargestPowerOfTwo(n);
  const double reduce = reduce_bytes_per_s > 0 ? bytes / reduce_bytes_per_s : 0;
  double t = FoldTime(net, n, p, bytes, true) + (n > p ? reduce : 0);
  for (int mask = 1; mask < p; mask <<= 1) {
    std::vector<Flow> flows;
    for (int r = 0; r < p; ++r) flows.push_back({r, r ^ mask, bytes});
    t += PhaseTime(net, flows) + reduce;
  }
  return t + FoldTime(net, n, p, bytes, false);
}

double HalvingDoublingAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s) {
  const int n = net.hosts * net.per_host;
  if (n <= 1 || bytes <= 0) return 0;
  const int p = LargestPowerOfTwo(n);
  const double per_byte = reduce_bytes_per_s > 0 ? 1.0 / reduce_bytes_per_s : 0;
  double t = FoldTime(net, n, p, bytes, true) + (n > p ? bytes * per_byte : 0);
  // Reduce-scatter: step k moves bytes / 2^(k+1) to the partner at distance p / 2^(k+1) and sums
  // it; the allgather moves the same amounts back, in reverse, without summing.
  double share = bytes;
  for (int mask = p / 2; mask >= 1; mask >>= 1) {
    share /= 2;
    std::vector<Flow> flows;
    for (int r = 0; r < p; ++r) flows.push_back({r, r ^ mask, share});
    const double phase = PhaseTime(net, flows);
    t += 2 * phase + share * per_byte;
  }
  return t + FoldTime(net, n, p, bytes, false);
}

double OneShotAllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s) {
  const int n = net.hosts * net.per_host;
  if (n <= 1 || bytes <= 0) return 0;
  const double pieces =
      std::ceil(bytes / static_cast<double>(transport::shm::HostArea::kDefaultSlotBytes));
  // In and out of the area: two copies of the buffer, then the N - 1 additions.
  const double copy = net.intra_copy_bytes_per_s > 0 ? 2 * bytes / net.intra_copy_bytes_per_s : 0;
  const double sum = reduce_bytes_per_s > 0 ? (n - 1) * bytes / reduce_bytes_per_s : 0;
  return pieces * net.intra_latency_s + copy + sum;
}

double AllreduceTime(const Network& net, double bytes, double reduce_bytes_per_s,
                     const std::string& algorithm, bool hierarchical, std::string* ran) {
  const int n = net.hosts * net.per_host;
  std::string run = algorithm;
  if (run == "auto") {
    run = collectives::AllreduceAlgorithmName(collectives::ChooseAllreduceAlgorithm(
        static_cast<size_t>(bytes), n, net.hosts, net.host_area));
  }
  // Hierarchical under auto with every host's area: small buffers one-shot within the host, then
  // recursive doubling across hosts (collectives::HierarchicalSmallAllreduce).
  if (hierarchical && algorithm == "auto" && net.host_area && net.hosts > 1 &&
      collectives::HierarchicalSmallFits(static_cast<size_t>(bytes), net.per_host)) {
    if (ran != nullptr) *ran = "one-shot+recursive-doubling";
    Network local = net;
    local.hosts = 1;
    Network across = net;
    across.per_host = 1;
    return OneShotAllreduceTime(local, bytes, reduce_bytes_per_s) +
           RecursiveDoublingAllreduceTime(across, bytes, reduce_bytes_per_s);
  }
  if (ran != nullptr) *ran = run;
  if (run == "one-shot") return OneShotAllreduceTime(net, bytes, reduce_bytes_per_s);
  if (run == "recursive-doubling") {
    return RecursiveDoublingAllreduceTime(net, bytes, reduce_bytes_per_s);
  }
  if (run == "halving-doubling")
    return HalvingDoublingAllreduceTime(net, bytes, reduce_bytes_per_s);
  return hierarchical ? HierarchicalAllreduceTime(net, bytes, reduce_bytes_per_s)
                      : RingAllreduceTime(net, bytes, reduce_bytes_per_s);
}

double StreamSpread(const Calibration& cal, int streams) {
  const auto& m = cal.ps_stream_spread;
  if (m.empty() || streams < 2) return 0;
  auto hi = m.lower_bound(streams);
  if (hi == m.end()) return std::prev(hi)->second;
  if (hi->first == streams || hi == m.begin()) return hi->second;
  auto lo = std::prev(hi);
  const double f =
      (std::log2(streams) - std::log2(lo->first)) / (std::log2(hi->first) - std::log2(lo->first));
  return lo->second + f * (hi->second - lo->second);
}

double PacedStreamSpread(const Calibration& cal, int streams, double ratio) {
  if (streams < 2 || ratio <= 1) return 0;
  const double bound = std::max(0.0, (streams - 1) * (ratio - 1));
  if (cal.ps_paced_spread_share.empty()) return std::min(StreamSpread(cal, streams), bound);
  // (log2 r, share): none at r = 1, the measured ones, all at r = streams.
  std::vector<std::pair<double, double>> at = {{0.0, 0.0}};
  for (const auto& [r, share] : cal.ps_paced_spread_share) {
    if (r < streams) at.push_back({std::log2(r), share});
  }
  at.push_back({std::log2(streams), 1.0});
  double share = 1;
  const double x = std::log2(ratio);
  for (size_t i = 1; i < at.size(); ++i) {
    if (x > at[i].first) continue;
    const auto& [x0, y0] = at[i - 1];
    const auto& [x1, y1] = at[i];
    share = x1 > x0 ? y0 + (x - x0) / (x1 - x0) * (y1 - y0) : y1;
    break;
  }
  return std::min(StreamSpread(cal, streams) * share, bound);
}

double ExpectedMaxOfNormals(int n) {
  if (n <= 1) return 0;
  // E[max] = integral of x n phi(x) Phi(x)^(n-1) dx, by Simpson's rule over [-9, 9] (the chance
  // that the largest of up to 2^20 draws lies beyond is below 1e-12), Phi^(n-1) in logs so that
  // it cannot underflow on the way.
  constexpr int kIntervals = 3600;
  constexpr double kLo = -9, kHi = 9, kH = (kHi - kLo) / kIntervals;
  const double inv_sqrt_2pi = 1 / std::sqrt(2 * std::numbers::pi);
  double sum = 0;
  for (int i = 0; i <= kIntervals; ++i) {
    const double x = kLo + i * kH;
    const double cdf = 0.5 * std::erfc(-x / std::sqrt(2.0));
    const double log_pow = cdf > 0 ? (n - 1) * std::log(cdf) : -INFINITY;
    const double f = x * n * inv_sqrt_2pi * std::exp(-0.5 * x * x + log_pow);
    sum += f * (i == 0 || i == kIntervals ? 1 : (i % 2 ? 4 : 2));
  }
  return sum * kH / 3;
}

double HostShare(const Point& point, const Calibration& cal) {
  if (cal.host_cores <= 0) return 1;
  return std::max(1.0, static_cast<double>(point.ranks) / cal.host_cores);
}

double NicRate(const Network& net, int streams) {
  const double link = net.nic_link_bytes_per_s > 0 ? net.nic_link_bytes_per_s : net.nic_bytes_per_s;
  if (net.nic_stream_bytes_per_s <= 0) return link;
  return std::min(link, std::max(1, streams) * net.nic_stream_bytes_per_s);
}

Network MakeNetwork(const Point& point, const Calibration& cal, double working_bytes) {
  const double k = point.dilation > 0 ? point.dilation : 1;
  Network net;
  net.per_host = std::max(1, point.ranks_per_host);
  net.hosts = std::max(1, (point.ranks + net.per_host - 1) / net.per_host);
  const TransportCosts& t = point.transport == "rdma" ? cal.rdma : cal.tcp;
  const double link_gbit = (point.link_gbit > 0 ? point.link_gbit : cal.link_gbit);
  // Under dilation K the emulated link stands for one K times faster (SCHEMA.md: link_represented).
  net.nic_bytes_per_s = link_gbit * k * kGiga / 8 * t.efficiency;
  net.nic_link_bytes_per_s = net.nic_bytes_per_s;
  // A TCP connection may carry less than the link (calibration stream_gbit, in payload): S
  // streams per pair fill the link only when S of them reach it.
  if (point.transport != "rdma" && t.stream_gbit > 0) {
    net.nic_stream_bytes_per_s = t.stream_gbit * k * kGiga / 8;
    net.nic_bytes_per_s = NicRate(net, std::max(1, point.tcp_streams));
  }
  net.nic_latency_s = t.latency_us * 1e-6 / k;
  net.nic_copy_bytes_per_s = t.copy_gbytes_per_s * kGiga * k;
  if (point.backend == "nccl") {
    net.intra_bytes_per_s = cal.intra_gbytes_per_s * kGiga;
    net.intra_latency_s = cal.intra_latency_us * 1e-6 / k;
    net.intra_copy_bytes_per_s = 0;
  } else {
    // kolo's ring within a host (shared memory, or TCP over loopback when transport is tcp):
    // copies by the ranks' own cores.
    const double share = HostShare(point, cal);
    const bool large = cal.intra_large_bytes > 0 && cal.intra_large_gbytes_per_s > 0 &&
                       working_bytes >= cal.intra_large_bytes;
    net.intra_bytes_per_s = (large ? cal.intra_large_gbytes_per_s : cal.intra_gbytes_per_s) *
                            kGiga * cal.shm.efficiency / share;
    net.intra_latency_s = cal.shm.latency_us * 1e-6 / k * share;
    net.intra_copy_bytes_per_s = cal.shm.copy_gbytes_per_s * kGiga * k / share;
    // One host over shared memory (transport auto or shm; tcp runs over loopback): the area.
    net.host_area = net.per_host > 1 && point.shm_within_host && point.backend != "ps" &&
                    point.backend != "mpi";
  }
  return net;
}

// ---- One prediction ----

namespace {

struct Costs {
  Network net;
  double reduce_bytes_per_s = 0;
  double fusion_copy_bytes_per_s = 0;
  bool no_coordination = false;  // Ablation::coordination
};

// The costs taken away to split exposed communication by cause (Prediction::exposed_*_ms).
struct Ablation {
  bool coordination = false;
  bool latency = false;
  bool host = false;
};

// A per-byte rate that makes the host's work free: bytes / rate is 0 to the model's precision.
constexpr double kFreeBytesPerS = 1e30;

// The time of one negotiation: the bit exchange and, when the controller held one, a coordinator
// round (every rank's requests gathered at rank 0, its responses broadcast).
double NegotiationTime(const Network& net, const SymmetricPeers& peers) {
  const int n = net.hosts * net.per_host;
  if (n <= 1) return 0;
  const double hop = net.hosts > 1 ? net.nic_latency_s : net.intra_latency_s;
  double t = 0;
  if (peers.bit_exchanges > 0) {
    // Up to 16 ranks one direct exchange; beyond, recursive doubling (collectives.h).
    const int rounds = n <= 16 ? 1 : CeilLog2(n) + ((n & (n - 1)) ? 2 : 0);
    std::vector<Flow> flows;
    const double b = 8.0 * static_cast<double>(peers.bit_words);
    if (net.host_area && net.hosts == 1 &&
        b <= static_cast<double>(transport::shm::HostArea::kDefaultSlotBytes)) {
      // One host with the area: the exchange is one step through it, no message
      // (collectives::BitExchangeThroughHostArea).
      t += OneShotAllreduceTime(net, b, 0);
    } else if (n <= 16) {
      for (int s = 0; s < n; ++s) {
        for (int d = 0; d < n; ++d) {
          if (s != d) flows.push_back({s, d, b});
        }
      }
      t += std::max(hop, PhaseTime(net, flows));
    } else {
      t += rounds * (hop + b / net.nic_bytes_per_s);
    }
  }
  if (peers.rounds > 0) {
    std::vector<Flow> gather;
    for (int s = 1; s < n; ++s) gather.push_back({s, 0, peers.gathered_bytes});
    t += PhaseTime(net, gather);
    t += CeilLog2(n) * (hop + peers.broadcast_bytes / net.nic_bytes_per_s);
  }
  return t;
}

}  // namespace

namespace {

// The stages of a prediction, in order: Check (the point's settings, before any work), Compute
// (what one step computes and when each gradient is ready), Costs (the network and the host's
// rates), then one communication stage, ParameterServers or Allreduce, which sets when each
// gradient's update can run, and Finish (the step from those times). A mechanism of the model
// lands as a stage, or inside the one whose times it changes.

// ---- Check ----

Status CheckPoint(const Point& point) {
  static const std::vector<std::string> kBackends = {"ring", "nccl", "mpi", "ps", "none"};
  if (std::find(kBackends.begin(), kBackends.end(), point.backend) == kBackends.end()) {
    return InvalidArgument("backend '{}' is not allowed; allowed: ring, nccl, mpi, ps, none",
                           point.backend);
  }
  if (point.transport != "tcp" && point.transport != "rdma" && point.transport != "auto") {
    return InvalidArgument("transport '{}' is not allowed; allowed: tcp, rdma, auto",
                           point.transport);
  }
  if (point.tcp_streams < 0 || point.tcp_streams > 16) {
    return InvalidArgument("tcp_streams {} is not allowed; allowed: 0 (auto) to 16",
                           point.tcp_streams);
  }
  if (point.ranks < 1 || point.ranks_per_host < 1 || point.ranks % point.ranks_per_host != 0) {
    return InvalidArgument(
        "ranks = {} and ranks_per_host = {}: ranks must be a positive multiple of ranks_per_host",
        point.ranks, point.ranks_per_host);
  }
  if (point.backend == "none" && point.ranks != 1) {
    return InvalidArgument("backend 'none' runs one rank; ranks = {} is not allowed", point.ranks);
  }
  {
    Options engine;
    engine.allreduce_algorithm = point.allreduce_algorithm;
    engine.compression = point.compression;
    engine.hierarchical_allreduce = point.hierarchical && point.backend == "ring";
    KOLO_RETURN_IF_ERROR(engine.Validate());  // the engine's own refusal, word for word
  }
  if (point.cycle_time_ms <= 0 || point.fusion_threshold_mb < 0 ||
      point.backward_passes_per_step < 1 || point.steps < 1 || point.ps_servers < 1) {
    return InvalidArgument(
        "cycle_time_ms must be > 0, fusion_threshold_mb >= 0, backward_passes_per_step, steps and "
        "ps_servers >= 1");
  }
  if (point.ps_placement != "greedy" && point.ps_placement != "split") {
    return InvalidArgument("ps_placement '{}' is not allowed; allowed: greedy, split",
                           point.ps_placement);
  }
  if (std::find(std::begin(kFrameworks), std::end(kFrameworks), point.framework) ==
      std::end(kFrameworks)) {
    return InvalidArgument("framework '{}' is not allowed; allowed: kolo, horovod-tf, ddp",
                           point.framework);
  }
  if (point.framework == "ddp" && point.backend == "ps") {
    return InvalidArgument(
        "framework 'ddp' has no parameter servers; allowed backends with it: ring, nccl, mpi, "
        "none");
  }
  return Status::OK();
}

// ---- Compute ----

// One step's compute on the slowest rank, and the gradients in the order backward makes them.
struct StepCompute {
  models::compute::replay::Profile profile;
  std::vector<VariableSpec> variables;     // every parameter, in registration (creation) order
  double forward_ms = 0, backward_ms = 0;  // the profile's sums over layers, per micro-batch
  double scale = 1;                        // profile times to the requested GPU's
  int micro = 1;                           // backward passes per step
  double backward_end = 0;                 // s into the step, when the last backward pass ends
  double backward_start = 0;               // s into the step, when the last backward pass starts
  std::vector<Tensor> tensors;
  // Set by the communication stage for the reported step: when something was in flight, s into
  // the step (the Interference stage measures their overlap with backward).
  std::vector<std::pair<double, double>> comm_spans;
};

// The point's replay profile and the model it was recorded for, read once per prediction.
struct LoadedModel {
  models::compute::replay::Profile profile;
  models::Graph graph{""};
};

StatusOr<LoadedModel> LoadStage(const Point& point) {
  LoadedModel m;
  KOLO_ASSIGN_OR_RETURN(m.profile, models::compute::replay::LoadProfile(point.profile));
  const auto& profile = m.profile;
  if (profile.model != point.model && !point.model.empty()) {
    return InvalidArgument("profile {} was recorded for model '{}', not '{}'", point.profile,
                           profile.model, point.model);
  }
  if (point.batch_size != 0 && point.batch_size != profile.batch_size) {
    return InvalidArgument("profile {} was recorded at batch {}, not {}", point.profile,
                           profile.batch_size, point.batch_size);
  }
  models::zoo::ModelConfig config;
  config.image_size = profile.image_size;
  config.num_classes = profile.num_classes;
  KOLO_ASSIGN_OR_RETURN(m.graph, models::zoo::BuildModel(profile.model, config));
  if (m.graph.layers().size() != profile.layers.size()) {
    return InvalidArgument("profile {} lists {} layers; model '{}' has {}", point.profile,
                           profile.layers.size(), profile.model, m.graph.layers().size());
  }
  return m;
}

// `backward_stretch`: the Interference stage's slowing of every backward layer (1: none).
StatusOr<StepCompute> ComputeStage(const Point& point, const Calibration& cal,
                                   const LoadedModel& model, double backward_stretch,
                                   Prediction* out) {
  StepCompute c;
  c.profile = model.profile;
  const auto& profile = c.profile;
  const models::Graph& graph = model.graph;
  for (const auto& p : graph.params()) {
    c.variables.push_back({p.name, DataType::kFloat32, p.shape});
  }

  // Compute, scaled to the requested GPU.
  double fwd = 0, bwd = 0;
  for (const auto& l : profile.layers) {
    fwd += l.forward_ms;
    bwd += l.backward_ms;
  }
  c.forward_ms = fwd;
  c.backward_ms = bwd;
  const double profile_step_s = (fwd + bwd + profile.update_ms) / 1e3;
  const double profile_rate = static_cast<double>(profile.batch_size) / profile_step_s;
  c.scale = point.gpu_rate > 0 ? profile_rate / point.gpu_rate : 1.0;
  c.micro = point.backward_passes_per_step;
  const int micro = c.micro;

  const double jitter = point.step_jitter >= 0 ? point.step_jitter : cal.step_jitter;
  if (jitter > kMaxStepJitter) {
    return InvalidArgument("step_jitter {} is not allowed; allowed: 0 to {}", jitter,
                           kMaxStepJitter);
  }
  // Every step waits for the slowest rank's compute, which sets the times below; the breakdown's
  // phases stay the mean rank's, the wait for the slowest shows as exposed communication.
  const double slowest_scale = c.scale * (1 + jitter * ExpectedMaxOfNormals(point.ranks));

  out->single_gpu_images_per_sec = profile_rate / c.scale;
  const double fwd_s = fwd / 1e3 * slowest_scale;
  const double bwd_s = bwd / 1e3 * slowest_scale * backward_stretch;
  const double update_s = profile.update_ms / 1e3 * slowest_scale;

  // Gradients in the order backward produces them, with the time each is submitted.
  const double total_elems = static_cast<double>(graph.NumParameterElements());
  double t = micro * fwd_s + (micro - 1) * bwd_s;
  std::vector<double> layer_end(graph.layers().size(), 0);
  c.backward_start = t;
  for (size_t i = graph.layers().size(); i-- > 0;) {
    t += profile.layers[i].backward_ms / 1e3 * slowest_scale * backward_stretch;
    layer_end[i] = t;
  }
  for (int id : graph.BackpropOrder()) {
    const models::Parameter& p = graph.params()[static_cast<size_t>(id)];
    Tensor tensor;
    tensor.name = p.name;
    tensor.shape = p.shape;
    tensor.bytes = 4.0 * static_cast<double>(p.numel);
    tensor.submit_s = layer_end[static_cast<size_t>(p.layer)];
    tensor.update_s = update_s * static_cast<double>(p.numel) / total_elems;
    c.tensors.push_back(std::move(tensor));
  }
  c.backward_end = micro * (fwd_s + bwd_s);
  out->forward_ms = micro * fwd * c.scale;
  out->backward_ms = micro * bwd * c.scale * backward_stretch;
  out->interference_ms = micro * bwd * c.scale * (backward_stretch - 1);
  out->hosts = std::max(1, point.ranks / point.ranks_per_host);
  return c;
}

// ---- Costs ----

Costs CostsStage(const Point& point, const Calibration& cal, const StepCompute& compute,
                 const Ablation& ablation) {
  Costs costs;
  // A step cycles through every gradient, each buffer used once: where they add up to a large
  // buffer (the calibration's intra_large_bytes), every collective's bytes within a host come from
  // beyond the caches, at the large-buffer rate, whatever its own size.
  double step_bytes = 0;
  for (const Tensor& t : compute.tensors) step_bytes += t.bytes;
  costs.net = MakeNetwork(point, cal, step_bytes);
  const double k = point.dilation > 0 ? point.dilation : 1;
  costs.reduce_bytes_per_s = cal.reduce_gbytes_per_s * kGiga * k / HostShare(point, cal);
  costs.fusion_copy_bytes_per_s = cal.fusion_copy_gbytes_per_s * kGiga * k / HostShare(point, cal);
  costs.no_coordination = ablation.coordination;
  if (ablation.latency) costs.net.nic_latency_s = costs.net.intra_latency_s = 0;
  if (ablation.host) {
    costs.reduce_bytes_per_s = costs.fusion_copy_bytes_per_s = kFreeBytesPerS;
    costs.net.nic_copy_bytes_per_s = costs.net.intra_copy_bytes_per_s = 0;  // 0: no host cost
  }
  return costs;
}

// ---- Finish ----

// When the step ends, from the compute and each gradient's done_s, by the framework's update
// semantics: kolo updates each parameter in backprop order once its collective is done (updates
// overlap the collectives still running); horovod-tf and ddp apply every update after the last
// collective of the step (TensorFlow's apply_gradients takes every allreduced gradient; DDP's
// optimizer step follows the backward's wait for every bucket).
double StepEnd(const Point& point, const StepCompute& compute) {
  double t = compute.backward_end;
  if (point.framework == "kolo") {
    for (const Tensor& tensor : compute.tensors) t = std::max(t, tensor.done_s) + tensor.update_s;
    return t;
  }
  double updates = 0;
  for (const Tensor& tensor : compute.tensors) {
    t = std::max(t, tensor.done_s);
    updates += tensor.update_s;
  }
  return t + updates;
}

// The step's figures from StepEnd. `comm_s`, `negotiation_s`, `bytes_sent`: the communication
// stage's totals for the breakdown.
void FinishStep(const Point& point, const StepCompute& compute, double comm_s, double negotiation_s,
                double bytes_sent, Prediction* out) {
  const double t = StepEnd(point, compute);
  out->step_ms = t * 1e3;
  out->update_ms = compute.profile.update_ms * compute.scale;
  out->exposed_comm_ms =
      std::max(0.0, out->step_ms - out->forward_ms - out->backward_ms - out->update_ms);
  out->comm_ms = comm_s * 1e3;
  out->negotiation_ms = negotiation_s * 1e3;
  out->comm_bytes_per_step = bytes_sent;
  out->images_per_sec_per_rank =
      static_cast<double>(compute.micro) * static_cast<double>(compute.profile.batch_size) / t;
  out->total_images_per_sec = out->images_per_sec_per_rank * point.ranks;
}

// ---- Parameter servers ----

Status ParameterServerStage(const Point& point, const Calibration& cal, const Costs& costs,
                            StepCompute& compute, Prediction* out) {
  std::vector<Tensor>& tensors = compute.tensors;
  const int n = point.ranks;
  const double k = point.dilation > 0 ? point.dilation : 1;
  // The real placement of every parameter (registration order = creation order).
  const std::vector<VariableSpec>& vars = compute.variables;
  KOLO_ASSIGN_OR_RETURN(backends::ps::PlacementPolicy policy,
                        backends::ps::ParsePlacementPolicy(point.ps_placement));
  const backends::ps::Placement placement = backends::ps::Place(vars, point.ps_servers, policy);
  std::map<std::string, int> var_index;
  for (size_t i = 0; i < vars.size(); ++i) var_index[vars[i].name] = static_cast<int>(i);

  const Network& net = costs.net;
  const int per_host = net.per_host;
  if (point.ps_pacing_bits_per_s > 0 && point.transport == "rdma") {
    return InvalidArgument("--ps-pacing {}: pacing needs transport tcp (rdma cannot pace)",
                           FormatBitRate(point.ps_pacing_bits_per_s));
  }
  // Each worker's pushes to one server at most this fast (bytes/s, as net.nic_bytes_per_s
  // counts them); 0: unpaced.
  const double pace = point.ps_pacing_bits_per_s * k / 8 * cal.tcp.efficiency;
  // The workers that reach a server over its host's own links (servers sharing worker hosts),
  // and the bytes its NIC carries for one shard of b bytes from every other worker.
  auto local_workers = [&](int server) {
    if (!point.ps_on_worker_hosts) return 0;
    const int host = server % net.hosts;
    return std::min(per_host, n - host * per_host);
  };
  auto server_load = [&](int server, double b) { return b * (n - local_workers(server)); };
  const double lat = net.nic_latency_s;
  const double copy = net.nic_copy_bytes_per_s;
  // The time a transfer of one shard takes on the server's link under incast (every worker's
  // piece) and on this worker's host link (every worker of the host sends its own). A paced
  // push goes no faster than the pace: n streams fill a link only if n paces do.
  auto paced_time = [&](double t, double b, bool paced) {
    return paced && pace > 0 ? std::max(t, lat + b / pace) : t;
  };
  // A server's link carries a stream from every worker that reaches it over the network; a
  // worker host's link one from each of its workers: where a stream is capped below the link
  // (calibration stream_gbit), the link fills only with enough of them (NicRate).
  auto srv_time = [&](int server, double b, bool paced) {
    const double load = server_load(server, b);
    const double rate = NicRate(net, n - local_workers(server));
    return paced_time(lat + load / rate + (copy > 0 ? load / copy : 0), b, paced);
  };
  auto host_time = [&](double b, bool paced) {
    return paced_time(lat + per_host * b / NicRate(net, per_host) + (copy > 0 ? b / copy : 0), b,
                      paced);
  };
  // Compression: pushes carry half precision, cast once per gradient on the worker (at the
  // fusion copy rate) before its first shard goes; pulls stay float32.
  const bool compressed = point.compression != "none";
  const double push_ratio = compressed ? 0.5 : 1.0;
  auto cast_s = [&](int ti) {
    return compressed ? tensors[static_cast<size_t>(ti)].bytes / costs.fusion_copy_bytes_per_s
                      : 0.0;
  };
  // Every shard of every gradient, in the order backward submits them (tensor index, shard).
  std::vector<std::pair<int, int>> shards_of;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const int v = var_index.at(tensors[ti].name);
    for (int shard : placement.variable_shards[static_cast<size_t>(v)]) {
      shards_of.push_back({static_cast<int>(ti), shard});
    }
    tensors[ti].done_s = tensors[ti].submit_s;
  }
  // The worker's communication time: how long something is in flight, the union of the
  // exchanges' spans.
  std::vector<std::pair<double, double>> spans;
  if (cal.ps_full_duplex) {
    // Pushes never wait for pulls (no window of outstanding shards; each direction of a link
    // on its own), so each direction is worked out in turn: every push first come first served
    // on its server's ingress and the worker's egress, then every pull, ready once its shard's
    // pushes are all in, on the server's egress and the worker's ingress.
    struct Transfer {
      double ready;
      int shard;
      int tensor;
      double since;  // when the shard's exchange began (its push was ready)
      double end = 0;
    };
    auto run = [&](std::vector<Transfer>& xs, bool paced, double ratio) {
      std::stable_sort(xs.begin(), xs.end(),
                       [](const Transfer& a, const Transfer& b) { return a.ready < b.ready; });
      std::vector<double> srv(static_cast<size_t>(point.ps_servers), 0);
      double host = 0;
      // Busy periods of each server's link: a transfer's start in one is when that link last
      // went from idle to busy; its end, when the link next goes idle.
      std::vector<double> period_end, from(xs.size()), srv_end(xs.size());
      std::vector<int> period(xs.size());
      std::vector<int> current(static_cast<size_t>(point.ps_servers), -1);
      std::vector<double> current_from(static_cast<size_t>(point.ps_servers), 0);
      for (size_t i = 0; i < xs.size(); ++i) {
        Transfer& x = xs[i];
        const auto& shard = placement.shards[static_cast<size_t>(x.shard)];
        const double b = static_cast<double>(shard.bytes) * ratio;
        const size_t s = static_cast<size_t>(shard.server);
        if (current[s] < 0 || x.ready > srv[s]) {
          current[s] = static_cast<int>(period_end.size());
          period_end.push_back(0);
          current_from[s] = x.ready;
        }
        srv[s] = std::max(x.ready, srv[s]) + srv_time(shard.server, b, paced);
        host = std::max(x.ready, host) + host_time(b, paced);
        period_end[static_cast<size_t>(current[s])] = srv[s];
        period[i] = current[s];
        from[i] = current_from[s];
        srv_end[i] = srv[s];
        x.end = std::max(srv[s], host);
      }
      // The slowest of the server's streams moves at (1 - spread) of a fair share while the
      // others still send, and catches up once they are done (the link stays busy): the last
      // of a shard's pieces is through at the busy period's start plus its fair-share time
      // stretched by 1 / (1 - spread), or at the period's end.
      for (size_t i = 0; i < xs.size(); ++i) {
        const auto& shard = placement.shards[static_cast<size_t>(xs[i].shard)];
        const int streams = n - local_workers(shard.server);
        // Paced pushes: their paces at r times a fair share of the link.
        const double u =
            paced && pace > 0
                ? PacedStreamSpread(cal, streams, pace * streams / NicRate(net, streams))
                : StreamSpread(cal, streams);
        if (u <= 0) continue;
        const double slow = std::min(from[i] + (srv_end[i] - from[i]) / (1 - u),
                                     period_end[static_cast<size_t>(period[i])]);
        xs[i].end = std::max(xs[i].end, slow);
      }
    };
    std::vector<Transfer> pushes;
    for (const auto& [ti, shard] : shards_of) {
      const double ready = tensors[static_cast<size_t>(ti)].submit_s + cast_s(ti);
      pushes.push_back({ready, shard, ti, ready});
    }
    run(pushes, pace > 0, push_ratio);
    std::vector<Transfer> pulls;
    for (const Transfer& x : pushes) pulls.push_back({x.end, x.shard, x.tensor, x.since});
    run(pulls, false, 1.0);
    for (const Transfer& x : pulls) {
      Tensor& t = tensors[static_cast<size_t>(x.tensor)];
      t.done_s = std::max(t.done_s, x.end);
      spans.push_back({x.since, x.end});
    }
  } else {
    // Half duplex: pushes and pulls take turns on one queue per server link.
    std::vector<double> srv(static_cast<size_t>(point.ps_servers), 0);
    double host_out = 0, host_in = 0;
    struct Op {
      double ready;
      int64_t seq;
      bool pull;
      int shard;
      int tensor;
    };
    auto later = [](const Op& a, const Op& b) {
      return a.ready != b.ready ? a.ready > b.ready : a.seq > b.seq;
    };
    std::priority_queue<Op, std::vector<Op>, decltype(later)> ops(later);
    int64_t seq = 0;
    for (const auto& [ti, shard] : shards_of) {
      ops.push({tensors[static_cast<size_t>(ti)].submit_s + cast_s(ti), seq++, false, shard, ti});
    }
    while (!ops.empty()) {
      const Op op = ops.top();
      ops.pop();
      const auto& shard = placement.shards[static_cast<size_t>(op.shard)];
      const double b = static_cast<double>(shard.bytes) * (op.pull ? 1.0 : push_ratio);
      const size_t s = static_cast<size_t>(shard.server);
      double& host = op.pull ? host_in : host_out;
      const double srv_end = std::max(op.ready, srv[s]) + srv_time(shard.server, b, !op.pull);
      const double host_end = std::max(op.ready, host) + host_time(b, !op.pull);
      srv[s] = srv_end;
      host = host_end;
      const double end = std::max(srv_end, host_end);
      spans.push_back({op.ready, end});
      if (!op.pull) {
        ops.push({end, seq++, true, op.shard, op.tensor});
      } else {
        Tensor& t = tensors[static_cast<size_t>(op.tensor)];
        t.done_s = std::max(t.done_s, end);
      }
    }
  }
  std::sort(spans.begin(), spans.end());
  double busy = 0, from = -1, until = 0;
  for (const auto& [a, b] : spans) {
    if (from < 0 || a > until) {
      if (from >= 0) busy += until - from;
      from = a;
    }
    until = std::max(until, b);
  }
  if (from >= 0) busy += until - from;
  // The worker copies each pulled value into its weights (instead of the optimizer).
  double bytes = 0;
  for (Tensor& t : tensors) {
    bytes += t.bytes * push_ratio;  // what the worker sends: its pushes
    t.update_s = t.bytes / costs.fusion_copy_bytes_per_s;
  }
  compute.comm_spans = spans;
  FinishStep(point, compute, busy, 0, bytes, out);
  double copy_total = 0;
  for (const Tensor& t : tensors) copy_total += t.update_s;
  out->update_ms = copy_total * 1e3;
  out->exposed_comm_ms =
      std::max(0.0, out->step_ms - out->forward_ms - out->backward_ms - out->update_ms);
  return Status::OK();
}

// ---- Allreduce ----

// What an allreduce backend pays per byte besides the wire. Compressed, a float32 byte travels as
// half a byte, and the reduction sums half elements at float32's rate per element: half the bytes
// per second. NCCL reduces on the GPU beside the transfer (no host reduction) and its casts and
// copies run at device memory's rate, which the model takes as free (0); host backends copy and
// cast at the fusion copy rate.
struct AllreduceRates {
  bool compressed = false;
  double wire_ratio = 1;
  double reduce_bytes_per_s = 0;  // 0: free
  double copy_bytes_per_s = 0;    // 0: free
};

AllreduceRates RatesFor(const Point& point, const Costs& costs) {
  AllreduceRates r;
  r.compressed = point.compression != "none";
  r.wire_ratio = r.compressed ? 0.5 : 1.0;
  const bool device = point.backend == "nccl";
  r.reduce_bytes_per_s = device ? 0.0 : costs.reduce_bytes_per_s * r.wire_ratio;
  r.copy_bytes_per_s = device ? 0.0 : costs.fusion_copy_bytes_per_s;
  return r;
}

// The engine thread with the real controller and fusion planner, for `point.steps` steps (the
// last one reported).
Status AllreduceStage(const Point& point, const Calibration& cal, const Costs& costs,
                      StepCompute& compute, Prediction* out) {
  std::vector<Tensor>& tensors = compute.tensors;
  const int n = point.ranks;
  const double k = point.dilation > 0 ? point.dilation : 1;
  // Allreduce backends: the engine thread with the real controller and fusion planner.
  const AllreduceRates rates = RatesFor(point, costs);
  const bool compressed = rates.compressed;
  const double wire_ratio = rates.wire_ratio;
  const double reduce = rates.reduce_bytes_per_s;
  const double cast_bytes_per_s = rates.copy_bytes_per_s;  // the casts in and out
  // The ring backend runs the point's algorithm (auto: the engine's rule per collective); NCCL
  // and MPI run their own, modelled as the ring.
  const std::string algorithm = point.backend == "ring" ? point.allreduce_algorithm : "ring";
  auto allreduce = [&](double bytes) {
    return AllreduceTime(costs.net, bytes, reduce, algorithm, point.hierarchical);
  };
  const bool coordinate = !costs.no_coordination;
  const double cycle = point.cycle_time_ms / 1e3;
  const double per_cycle =
      coordinate ? cal.engine_overhead_us * 1e-6 / k * HostShare(point, cal) : 0.0;
  const double per_collective =
      coordinate ? cal.engine_collective_us * 1e-6 / k * HostShare(point, cal) : 0.0;
  const size_t threshold = static_cast<size_t>(point.fusion_threshold_mb * (1 << 20));
  SimClock clock;
  SymmetricPeers peers(n);
  coordinator::ControllerSettings settings;
  settings.rank = 0;
  settings.size = n;
  coordinator::Controller controller(settings, peers, clock);
  std::map<std::string, size_t> by_name;
  for (size_t i = 0; i < tensors.size(); ++i) by_name[tensors[i].name] = i;

  double step_start = 0, last_start = -cycle;
  for (int step = 0; step < point.steps; ++step) {
    const bool report = step == point.steps - 1;
    double negotiation = 0, comm = 0, bytes_sent = 0, collectives = 0, cycles = 0, held = 0;
    double rounds = 0;
    size_t next = 0;  // tensors[next..] not yet submitted to the engine
    size_t done = 0;
    double free_at = step_start;  // when the engine thread is next idle
    while (done < tensors.size()) {
      // News: the engine has work once the next tensor is submitted or something is pending.
      double news = controller.pending() > 0
                        ? free_at
                        : std::max(free_at, step_start + tensors[next].submit_s);
      double tick_s = news;  // without coordination: no cycle grid to wait for
      if (coordinate) {
        const double ticks = std::max(1.0, std::ceil((news - last_start) / cycle - 1e-12));
        tick_s = last_start + ticks * cycle;
      }
      const double start = std::max(tick_s, news);
      held += start - news;
      last_start = start;
      clock.now_s = start;
      while (next < tensors.size() && step_start + tensors[next].submit_s <= start) {
        Request r;
        r.name = tensors[next].name;
        r.type = coordinator::CollectiveType::kAllreduce;
        r.dtype = DataType::kFloat32;
        r.reduce_op = static_cast<uint8_t>(ReduceOp::kAverage);
        r.shape = tensors[next].shape;
        controller.Add(r, SimClock::At(step_start + tensors[next].submit_s));
        ++next;
      }
      peers.Reset();
      std::vector<Response> responses;
      bool stop = false;
      coordinator::NegotiationStats stats;
      KOLO_RETURN_IF_ERROR(controller.Negotiate(false, &responses, &stop, &stats));
      const double neg = coordinate ? NegotiationTime(costs.net, peers) : 0.0;
      negotiation += neg;
      rounds += peers.rounds;
      // The engine's own work in a cycle that executes something (waking, handing over).
      double t = start + neg + (responses.empty() ? 0.0 : per_cycle);
      ++cycles;
      for (const fusion::Group& g : fusion::PlanFusion(responses, threshold)) {
        const double wire = static_cast<double>(g.bytes) * wire_ratio;
        double dt = allreduce(wire) + per_collective;
        if (compressed) {
          if (cast_bytes_per_s > 0) dt += 2.0 * static_cast<double>(g.bytes) / cast_bytes_per_s;
        } else if (g.fused) {
          dt += 2.0 * static_cast<double>(g.bytes) / costs.fusion_copy_bytes_per_s;
        }
        t += dt;
        collectives += 1;
        bytes_sent += 2.0 * (n - 1) / n * wire;
        for (size_t m : g.members) {
          const Response& resp = responses[m];
          if (resp.is_error()) return Internal("negotiation failed: {}", resp.error);
          tensors[by_name.at(resp.request.name)].done_s = t - step_start;
          ++done;
        }
      }
      comm += t - start;
      free_at = t;
      if (report && t > start) compute.comm_spans.push_back({start - step_start, t - step_start});
      if (next >= tensors.size() && controller.pending() == 0 && done < tensors.size()) {
        return Internal("every tensor was submitted but {} were never agreed",
                        tensors.size() - done);
      }
    }
    if (report) {
      FinishStep(point, compute, comm, negotiation, bytes_sent, out);
      out->collectives_per_step = collectives;
      out->cycles_per_step = cycles;
      out->cycle_hold_ms = cycles > 0 ? held / cycles * 1e3 : 0;
      out->coordinator_rounds = rounds;
    } else {
      step_start += StepEnd(point, compute);
    }
  }
  return Status::OK();
}

// ---- DDP ----

// PyTorch DistributedDataParallel's reducer: gradients go into buckets in the order backward
// makes them (DDP rebuilds its buckets in that order after the first iteration; the first bucket
// is capped at 1 MiB, the others at 25 MiB, and a bucket closes once it reaches its cap); a
// bucket's allreduce starts once every gradient in it is ready and every earlier bucket has
// started, and runs after the one before it on the one communication stream. No negotiation and no
// cycle: every rank registers the same parameters. Gradients are copied into the bucket and back
// (DDP's default, gradient_as_bucket_view off) at the fusion copy rate, on the host for host
// backends; on the GPU (nccl) taken as free, as the engine's fusion.
Status DdpStage(const Point& point, const Costs& costs, StepCompute& compute, Prediction* out) {
  std::vector<Tensor>& tensors = compute.tensors;
  const int n = point.ranks;
  const AllreduceRates rates = RatesFor(point, costs);
  const double wire_ratio = rates.wire_ratio;
  const double reduce = rates.reduce_bytes_per_s;
  const double copy = rates.copy_bytes_per_s;
  std::vector<std::vector<size_t>> buckets(1);
  double filled = 0;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {  // backprop order
    const double cap = buckets.size() == 1 ? kDdpFirstBucketBytes : kDdpBucketBytes;
    buckets.back().push_back(ti);
    filled += tensors[ti].bytes;
    if (filled >= cap) {
      buckets.emplace_back();
      filled = 0;
    }
  }
  if (buckets.back().empty()) buckets.pop_back();
  double free_at = 0, comm = 0, bytes_sent = 0;
  for (const auto& bucket : buckets) {
    double ready = 0, bytes = 0;
    for (size_t ti : bucket) {
      ready = std::max(ready, tensors[ti].submit_s);
      bytes += tensors[ti].bytes;
    }
    const double start = std::max(ready, free_at);
    double dt = AllreduceTime(costs.net, bytes * wire_ratio, reduce, "ring", point.hierarchical);
    if (copy > 0) dt += 2.0 * bytes / copy;
    free_at = start + dt;
    comm += dt;
    compute.comm_spans.push_back({start, free_at});
    bytes_sent += 2.0 * (n - 1) / n * bytes * wire_ratio;
    for (size_t ti : bucket) tensors[ti].done_s = free_at;
  }
  FinishStep(point, compute, comm, 0, bytes_sent, out);
  out->collectives_per_step = static_cast<double>(buckets.size());
  out->cycles_per_step = 0;
  out->cycle_hold_ms = 0;
  out->coordinator_rounds = 0;
  return Status::OK();
}

// ---- Interference ----

// The share of the last backward pass that communication overlapped: the union of the comm
// spans within [backward_start, backward_end], over the pass's length.
double OverlappedShare(const StepCompute& c) {
  std::vector<std::pair<double, double>> spans;
  for (auto [a, b] : c.comm_spans) {
    a = std::max(a, c.backward_start);
    b = std::min(b, c.backward_end);
    if (b > a) spans.emplace_back(a, b);
  }
  std::sort(spans.begin(), spans.end());
  double covered = 0, from = 0, until = -1;
  for (const auto& [a, b] : spans) {
    if (a > until) {
      if (until > from) covered += until - from;
      from = a;
      until = b;
    } else {
      until = std::max(until, b);
    }
  }
  if (until > from) covered += until - from;
  const double length = c.backward_end - c.backward_start;
  return length > 0 ? std::min(1.0, covered / length) : 0.0;
}

// One prediction with the backward pass stretched by `stretch`; `overlapped` gets the share of
// backward that communication overlapped.
StatusOr<Prediction> PredictOnce(const Point& point, const Calibration& cal,
                                 const LoadedModel& model, double stretch, double* overlapped,
                                 const Ablation& ablation = {}) {
  Prediction out;
  KOLO_ASSIGN_OR_RETURN(StepCompute compute, ComputeStage(point, cal, model, stretch, &out));
  const Costs costs = CostsStage(point, cal, compute, ablation);
  if (point.backend == "ps") {
    // Even one worker sends everything to its server(s).
    KOLO_RETURN_IF_ERROR(ParameterServerStage(point, cal, costs, compute, &out));
  } else if (point.backend == "none" || point.ranks == 1) {
    for (Tensor& tensor : compute.tensors) tensor.done_s = tensor.submit_s;
    FinishStep(point, compute, 0, 0, 0, &out);
  } else if (point.framework == "ddp") {
    KOLO_RETURN_IF_ERROR(DdpStage(point, costs, compute, &out));
  } else {
    KOLO_RETURN_IF_ERROR(AllreduceStage(point, cal, costs, compute, &out));
  }
  *overlapped = OverlappedShare(compute);
  return out;
}

}  // namespace

StatusOr<Prediction> Predict(const Point& point, const Calibration& cal) {
  KOLO_RETURN_IF_ERROR(CheckPoint(point));
  KOLO_ASSIGN_OR_RETURN(const LoadedModel model, LoadStage(point));
  double overlapped = 0, stretch = 1.0;
  KOLO_ASSIGN_OR_RETURN(Prediction out, PredictOnce(point, cal, model, 1.0, &overlapped));
  // Interference: backward slows by interference x the share communication overlaps, which in
  // turn moves when the gradients are ready: four rounds toward the fixed point. On the sim-paper
  // points at 128 GPUs the share moved by at most 0.003 in the last round, a 0.06% change of
  // backward at interference 0.189.
  if (cal.interference > 0) {
    for (int round = 0; round < 4; ++round) {
      stretch = 1.0 + cal.interference * overlapped;
      KOLO_ASSIGN_OR_RETURN(out, PredictOnce(point, cal, model, stretch, &overlapped));
    }
  }
  if (point.exposed_by_cause) {
    // The same compute (backward as interference stretched it), each cost taken away in turn.
    Ablation ablation;
    double unused = 0, before = out.exposed_comm_ms;
    const std::pair<bool Ablation::*, double*> causes[] = {
        {&Ablation::coordination, &out.exposed_coordination_ms},
        {&Ablation::latency, &out.exposed_latency_ms},
        {&Ablation::host, &out.exposed_host_ms}};
    for (const auto& [cost, part] : causes) {
      ablation.*cost = true;
      KOLO_ASSIGN_OR_RETURN(const Prediction without,
                            PredictOnce(point, cal, model, stretch, &unused, ablation));
      *part = before - without.exposed_comm_ms;
      before = without.exposed_comm_ms;
    }
    out.exposed_wire_ms = before;
  }
  return out;
}

}  // namespace kolo::sim
