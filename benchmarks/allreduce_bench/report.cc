#include "benchmarks/allreduce_bench/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <map>

#include "engine/collectives/plan.h"
#include "engine/common/file.h"

namespace kolo::bench {
namespace {

std::string Bytes(int64_t b) {
  if (b >= (1LL << 30) && b % (1LL << 30) == 0) return fmt::format("{} GiB", b >> 30);
  if (b >= (1LL << 20) && b % (1LL << 20) == 0) return fmt::format("{} MiB", b >> 20);
  if (b >= (1LL << 10) && b % (1LL << 10) == 0) return fmt::format("{} KiB", b >> 10);
  return fmt::format("{} B", b);
}

std::string Ratio(const std::optional<double>& r) {
  return r ? fmt::format("{:.3f}", *r) : std::string("-");
}

nlohmann::json OptionalJson(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

nlohmann::json TimeJson(const TimeSummary& t) {
  return {{"median_us", t.median_us},
          {"min_us", t.min_us},
          {"max_us", t.max_us},
          {"iters_us", t.iters_us}};
}

}  // namespace

std::vector<RatioRow> ComputeRatios(const std::vector<SweepRow>& rows) {
  struct AtSize {
    std::vector<const SweepRow*> rings;
    std::map<std::string, double> link;  // by transport
    std::optional<double> gloo, mpi_direct;
  };
  std::map<int64_t, AtSize> by_size;
  for (const SweepRow& r : rows) {
    AtSize& a = by_size[r.bytes];
    switch (r.kind) {
      case BackendKind::kRing:
        a.rings.push_back(&r);
        break;
      case BackendKind::kLink:
        a.link[r.transport] = r.busbw_gbs;
        break;
      case BackendKind::kMpiDirect:
        a.mpi_direct = r.busbw_gbs;
        break;
      case BackendKind::kGloo:
        a.gloo = std::max(a.gloo.value_or(0.0), r.busbw_gbs);
        break;
      case BackendKind::kMpi:
      case BackendKind::kRingHier:
      case BackendKind::kNccl:
      case BackendKind::kNcclDirect:
        break;
    }
  }
  auto ratio = [](const std::optional<double>& a,
                  const std::optional<double>& b) -> std::optional<double> {
    if (!a || !b || *b <= 0) return std::nullopt;
    return *a / *b;
  };
  std::vector<RatioRow> out;
  for (const auto& [bytes, a] : by_size) {
    for (const SweepRow* ring : a.rings) {
      RatioRow r;
      r.bytes = bytes;
      r.ring = ring->backend;
      r.transport = ring->transport;
      const auto link = a.link.find(ring->transport);
      r.ring_link =
          ratio(ring->busbw_gbs,
                link == a.link.end() ? std::nullopt : std::optional<double>(link->second));
      r.ring_gloo_best = ratio(ring->busbw_gbs, a.gloo);
      r.ring_mpi_direct = ratio(ring->busbw_gbs, a.mpi_direct);
      if (r.ring_link || r.ring_gloo_best || r.ring_mpi_direct) out.push_back(r);
    }
  }
  return out;
}

std::vector<AlgorithmRow> ComputeAlgorithmRows(const std::vector<SweepRow>& rows, int ranks,
                                               const std::set<std::string>& area_transports) {
  std::vector<AlgorithmRow> out;
  for (const SweepRow& alone : rows) {
    if (alone.backend.rfind("alone/", 0) != 0) continue;
    const std::string rest = alone.backend.substr(6);  // "<algorithm>[-<transport>]"
    for (const SweepRow& engine : rows) {
      if (engine.bytes != alone.bytes || engine.backend != "ring/" + rest) continue;
      AlgorithmRow a;
      a.bytes = alone.bytes;
      a.transport = alone.transport;
      a.algorithm = rest;
      if (!alone.transport.empty() && rest.size() > alone.transport.size() + 1 &&
          rest.compare(rest.size() - alone.transport.size() - 1, std::string::npos,
                       "-" + alone.transport) == 0) {
        a.algorithm = rest.substr(0, rest.size() - alone.transport.size() - 1);
      }
      a.picked = a.algorithm;
      if (a.algorithm == "auto") {
        a.picked = collectives::AllreduceAlgorithmName(
            collectives::ChooseAllreduceAlgorithm(static_cast<size_t>(alone.bytes), ranks, 1,
                                                  area_transports.count(alone.transport) > 0));
      }
      a.alone_us = alone.time.median_us;
      a.engine_us = engine.time.median_us;
      a.overhead_us = a.engine_us - a.alone_us;
      if (engine.engine_parts_us.size() >= 3) {
        a.negotiate_us = engine.engine_parts_us[0];
        a.execute_us = engine.engine_parts_us[1];
        a.hold_us = engine.engine_parts_us[2];
      }
      if (engine.engine_parts_us.size() >= 4) a.riding_share = engine.engine_parts_us[3];
      if (engine.engine_parts_us.size() >= 5) a.caller_share = engine.engine_parts_us[4];
      out.push_back(a);
    }
  }
  return out;
}

std::string FormatAlgorithmRows(const std::vector<AlgorithmRow>& rows) {
  if (rows.empty()) return "";
  std::string s =
      "#\n# algorithms: alone (on the benchmark's connections) and through the engine\n";
  s += "# engine parts, rank 0, median per call: negotiate (agreeing), execute (the collective "
       "inside "
       "the engine), hold (waiting for the cycle grid); the rest of the overhead is the queue, the "
       "wake-ups and the completion; rode: the share of calls whose data rode the negotiation "
       "(KOLO_RIDING_MAX_BYTES: then negotiate holds the collective and execute only the copy "
       "out); caller: the share of calls whose cycles the waiting caller ran itself "
       "(KOLO_CALLER_PROGRESS)\n";
  s += fmt::format(
      "#{:>12} {:>20} {:>10} {:>20} {:>11} {:>11} {:>12} {:>12} {:>11} {:>9} {:>6} {:>6}\n",
      "size(B)", "algorithm", "transport", "runs", "alone(us)", "engine(us)", "overhead(us)",
      "negotiate(us)", "execute(us)", "hold(us)", "rode", "caller");
  auto part = [](double v) { return v < 0 ? std::string("-") : fmt::format("{:.1f}", v); };
  auto share = [](double v) { return v < 0 ? std::string("-") : fmt::format("{:.0f}%", 100 * v); };
  for (const AlgorithmRow& r : rows) {
    s += fmt::format(
        " {:>12} {:>20} {:>10} {:>20} {:>11.2f} {:>11.2f} {:>12.2f} {:>12} {:>11} {:>9} {:>6} "
        "{:>6}\n",
        r.bytes, r.algorithm, r.transport, r.picked, r.alone_us, r.engine_us, r.overhead_us,
        part(r.negotiate_us), part(r.execute_us), part(r.hold_us), share(r.riding_share),
        share(r.caller_share));
  }
  return s;
}

std::string FormatResources(const std::vector<RankResources>& ranks) {
  if (ranks.empty()) return "";
  auto line = [&](const char* what, auto get, double scale, const char* unit) {
    std::vector<double> v;
    for (const RankResources& r : ranks) v.push_back(static_cast<double>(get(r)) / scale);
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    return fmt::format("#   {:<34} rank 0 {:>9.1f}{}, min {:.1f}, median {:.1f}, max {:.1f}\n",
                       what, v.front(), unit, sorted.front(), sorted[sorted.size() / 2],
                       sorted.back());
  };
  constexpr double kMiB = 1 << 20;
  std::string s = "#\n# per rank:\n";
  s += line(
      "connections (benchmark's device)", [](const RankResources& r) { return r.connections; }, 1,
      "");
  s += line(
      "connections (engine)", [](const RankResources& r) { return r.engine_connections; }, 1, "");
  s += line(
      "transport memory, engine (MiB)",
      [](const RankResources& r) { return r.engine_transport_memory_bytes; }, kMiB, "");
  s += line(
      "transport memory, benchmark (MiB)",
      [](const RankResources& r) { return r.transport_memory_bytes; }, kMiB, "");
  s += line(
      "peak RSS (MiB)", [](const RankResources& r) { return r.peak_rss_bytes; }, kMiB, "");
  s += line(
      "peak RSS less buffers (MiB)",
      [](const RankResources& r) {
        return std::max<int64_t>(0, r.peak_rss_bytes - r.buffer_bytes);
      },
      kMiB, "");
  s += line(
      "first collective after start (s)",
      [](const RankResources& r) { return r.first_collective_s; }, 1, "");
  return s;
}

std::vector<std::string> DistinctHosts(const std::vector<std::string>& hosts) {
  std::vector<std::string> out;
  for (const std::string& h : hosts) {
    if (std::find(out.begin(), out.end(), h) == out.end()) out.push_back(h);
  }
  return out;
}

std::string FormatHeader(const RunInfo& info) {
  const BenchConfig& c = *info.config;
  const Options& o = info.options;
  const auto hosts = DistinctHosts(info.hosts);
  std::string s;
  s += fmt::format("# kolo-allreduce-bench: {} ranks on {} host(s) ({}), launcher {}, control {}\n",
                   info.hosts.size(), hosts.size(), fmt::join(hosts, ", "), info.launcher,
                   info.control);
  s += fmt::format("# dtype {}, op {}, iters {}, warmup {}, check {}, buffers in {} memory\n",
                   DataTypeName(c.dtype), c.op == ReduceOp::kSum ? "sum" : "avg", c.iters, c.warmup,
                   c.check ? "on" : "off", c.place == BufferPlace::kCuda ? "CUDA device" : "host");
  if (c.tensors.empty()) {
    s += fmt::format("# sizes {} .. {}, step factor {}; rows: {}\n", Bytes(c.min_bytes),
                     Bytes(c.max_bytes), c.step_factor, fmt::join(info.rows, ", "));
  } else {
    s += fmt::format(
        "# tensors {}, fusion {}; backends: {}; each step and a single allreduce of the same "
        "bytes take turns\n",
        c.tensors,
        c.fusion == FusionMode::kBoth ? "both" : (c.fusion == FusionMode::kOn ? "on" : "off"),
        fmt::join(info.rows, ", "));
  }
  s += fmt::format(
      "# engine: fusion threshold {} bytes, cycle time {} ms, cache {}, ring chunk {} bytes, "
      "socket buffer {} bytes, shm ring {} bytes, listen {}, compression {}\n",
      o.fusion_threshold_bytes, o.cycle_time_ms, o.cache_capacity, o.ring_chunk_bytes,
      o.socket_buffer_bytes, o.shm_ring_bytes, o.iface.empty() ? "auto" : o.iface, o.compression);
  s += fmt::format(
      "# kolo transport{} of the ring and link rows: {}{}\n", info.transports.size() > 1 ? "s" : "",
      fmt::join(info.transports, ", "),
      info.mpi_btl.empty() ? "" : fmt::format("; MPI (mpi, mpi-direct): btl {}", info.mpi_btl));
  s += "# time: median over iterations of the slowest rank's time; busbw = algbw * 2(n-1)/n\n";
  s += "# every row reduces in place; untimed around each iteration: the input is restored, the "
       "ranks pass a barrier before it and another after it\n";
  return s;
}

std::string FormatSweepColumns() {
  return fmt::format("#{:>12} {:>11} {:>9} {:>19} {:>11} {:>12} {:>12} {:>7} {:>10}\n", "size(B)",
                     "count", "type", "backend", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong",
                     "max_err");
}

std::string FormatSweepRows(const std::vector<SweepRow>& rows) {
  std::string s;
  for (const SweepRow& r : rows) {
    const std::string label = r.backend + (r.best_of_kind ? "*" : "");
    s += fmt::format(" {:>12} {:>11} {:>9} {:>19} {:>11.2f} {:>12.3f} {:>12.3f} {:>7} {:>10}\n",
                     r.bytes, r.count, DataTypeName(r.dtype), label, r.time.median_us, r.algbw_gbs,
                     r.busbw_gbs, r.checked ? fmt::format("{}", r.wrong) : std::string("n/a"),
                     r.checked ? fmt::format("{:.3g}", r.max_error) : std::string("n/a"));
  }
  return s;
}

std::string FormatRatios(const std::vector<RatioRow>& ratios) {
  if (ratios.empty()) return "# ratios: no size has ring and a peer (link, gloo, mpi-direct)\n";
  std::string s = "#\n# bus bandwidth ratios (ring / peer)\n";
  s += fmt::format("#{:>12} {:>10} {:>10} {:>16} {:>16}\n", "size(B)", "ring", "ring/link",
                   "ring/gloo(best)", "ring/mpi-direct");
  for (const RatioRow& r : ratios) {
    s += fmt::format(" {:>12} {:>10} {:>10} {:>16} {:>16}\n", r.bytes, r.ring, Ratio(r.ring_link),
                     Ratio(r.ring_gloo_best), Ratio(r.ring_mpi_direct));
  }
  return s;
}

std::string FormatStepColumns(const TensorSet& set, DataType dtype) {
  std::string s = fmt::format("# model {}: {} tensors, {} parameters, {} bytes of {}\n", set.model,
                              set.tensors.size(), set.total_elements(),
                              set.total_elements() * static_cast<int64_t>(DataTypeSize(dtype)),
                              DataTypeName(dtype));
  s += fmt::format(
      "#{:>7} {:>6} {:>13} {:>11} {:>11} {:>7} {:>12} {:>9} {:>9} {:>8} {:>9} {:>9} {:>7}\n",
      "backend", "fusion", "threshold(B)", "step(us)", "single(us)", "ratio", "busbw(GB/s)",
      "negot/st", "hits/st", "coll/st", "coord_us", "coord_max", "#wrong");
  return s;
}

std::string FormatStepRow(const StepRow& r) {
  return fmt::format(
      " {:>7} {:>6} {:>13} {:>11.1f} {:>11.1f} {:>7.3f} {:>12.3f} {:>9.2f} {:>9.1f} "
      "{:>8.2f} {:>9.1f} {:>9.1f} {:>7}\n",
      r.backend, r.fusion ? "on" : "off", r.fusion_threshold_bytes, r.step.median_us,
      r.single.median_us, r.ratio, r.step_busbw_gbs, r.negotiations, r.cache_hits, r.collectives,
      r.coordination_us, r.coordination_max_us,
      r.checked ? fmt::format("{}", r.wrong) : std::string("n/a"));
}

std::string FormatStepGoal(const TensorSet& set, const std::vector<StepRow>& rows) {
  if (set.model != "resnet101") return "";
  std::string s;
  for (const StepRow& r : rows) {
    if (!r.fusion) continue;
    s += fmt::format(
        "# goal ({}): ResNet-101 fused step / single allreduce = {:.3f} (goal <= {}): "
        "{}\n",
        r.backend, r.ratio, kResNet101FusedRatioGoal,
        r.ratio <= kResNet101FusedRatioGoal ? "met" : "NOT met");
  }
  return s;
}

nlohmann::json ToJson(const RunInfo& info, const std::vector<SweepRow>& sweep,
                      const std::vector<RatioRow>& ratios, const TensorSet* set,
                      const std::vector<StepRow>& steps,
                      const std::vector<AlgorithmRow>& algorithms,
                      const std::vector<RankResources>& resources) {
  const BenchConfig& c = *info.config;
  const Options& o = info.options;
  nlohmann::json doc;
  std::vector<std::string> backends;
  for (BackendKind k : c.backends) backends.emplace_back(BackendKindName(k));
  doc["settings"] = {
      {"minbytes", c.min_bytes},
      {"maxbytes", c.max_bytes},
      {"stepfactor", c.step_factor},
      {"dtype", DataTypeName(c.dtype)},
      {"op", c.op == ReduceOp::kSum ? "sum" : "avg"},
      {"iters", c.iters},
      {"warmup", c.warmup},
      {"backends", backends},
      {"row_labels", info.rows},
      {"check", c.check},
      {"tensors", c.tensors},
      {"device", c.place == BufferPlace::kCuda ? "cuda" : "host"},
      {"fusion",
       c.fusion == FusionMode::kBoth ? "both" : (c.fusion == FusionMode::kOn ? "on" : "off")},
      {"fusion_threshold_bytes", o.fusion_threshold_bytes},
      {"cycle_time_ms", o.cycle_time_ms},
      {"compression", o.compression},
      {"cache_capacity", o.cache_capacity},
      {"ring_chunk_bytes", o.ring_chunk_bytes},
      {"socket_buffer_bytes", o.socket_buffer_bytes},
      {"peer_timeout_s", o.peer_timeout_s},
      {"iface", o.iface},
      {"shm_ring_bytes", o.shm_ring_bytes},
      {"transports", info.transports},
      {"mpi_btl", info.mpi_btl},
      {"argv", c.argv},
  };
  doc["ranks"] = info.hosts.size();
  doc["hosts"] = DistinctHosts(info.hosts);
  doc["rank_hosts"] = info.hosts;
  doc["launcher"] = info.launcher;
  doc["control"] = info.control;
  nlohmann::json rows = nlohmann::json::array();
  for (const SweepRow& r : sweep) {
    nlohmann::json j = {{"bytes", r.bytes},
                        {"count", r.count},
                        {"dtype", DataTypeName(r.dtype)},
                        {"backend", r.backend},
                        {"kind", BackendKindName(r.kind)},
                        {"transport", r.transport},
                        {"pairs", r.pairs},
                        {"time", TimeJson(r.time)},
                        {"cpu_iters_us", r.cpu_iters_us},
                        {"algbw_gbs", r.algbw_gbs},
                        {"busbw_gbs", r.busbw_gbs},
                        {"best_of_kind", r.best_of_kind},
                        {"checked", r.checked}};
    j["wrong"] = r.checked ? nlohmann::json(r.wrong) : nlohmann::json(nullptr);
    j["max_error"] = r.checked ? nlohmann::json(r.max_error) : nlohmann::json(nullptr);
    rows.push_back(std::move(j));
  }
  doc["rows"] = std::move(rows);
  nlohmann::json rj = nlohmann::json::array();
  for (const RatioRow& r : ratios) {
    rj.push_back({{"bytes", r.bytes},
                  {"ring", r.ring},
                  {"transport", r.transport},
                  {"ring_link", OptionalJson(r.ring_link)},
                  {"ring_gloo_best", OptionalJson(r.ring_gloo_best)},
                  {"ring_mpi_direct", OptionalJson(r.ring_mpi_direct)}});
  }
  doc["ratios"] = std::move(rj);
  nlohmann::json aj = nlohmann::json::array();
  for (const AlgorithmRow& a : algorithms) {
    aj.push_back({{"bytes", a.bytes},
                  {"algorithm", a.algorithm},
                  {"transport", a.transport},
                  {"picked", a.picked},
                  {"alone_us", a.alone_us},
                  {"engine_us", a.engine_us},
                  {"overhead_us", a.overhead_us},
                  {"negotiate_us", a.negotiate_us},
                  {"execute_us", a.execute_us},
                  {"hold_us", a.hold_us},
                  {"riding_share", a.riding_share},
                  {"caller_share", a.caller_share}});
  }
  doc["algorithms"] = std::move(aj);
  nlohmann::json res = nlohmann::json::array();
  for (const RankResources& r : resources) {
    res.push_back({{"connections", r.connections},
                   {"transport_memory_bytes", r.transport_memory_bytes},
                   {"engine_connections", r.engine_connections},
                   {"engine_transport_memory_bytes", r.engine_transport_memory_bytes},
                   {"rss_bytes", r.rss_bytes},
                   {"peak_rss_bytes", r.peak_rss_bytes},
                   {"buffer_bytes", r.buffer_bytes},
                   {"first_collective_s", r.first_collective_s}});
  }
  doc["rank_resources"] = std::move(res);
  if (set != nullptr) {
    nlohmann::json sj = {{"model", set->model},
                         {"tensors", set->tensors.size()},
                         {"parameters", set->total_elements()}};
    nlohmann::json sr = nlohmann::json::array();
    for (const StepRow& r : steps) {
      sr.push_back(
          {{"backend", r.backend},
           {"fusion", r.fusion},
           {"fusion_threshold_bytes", r.fusion_threshold_bytes},
           {"bytes", r.bytes},
           {"step", TimeJson(r.step)},
           {"single", TimeJson(r.single)},
           {"ratio", r.ratio},
           {"step_busbw_gbs", r.step_busbw_gbs},
           {"per_step",
            {{"negotiations", r.negotiations},
             {"cache_hits", r.cache_hits},
             {"collectives", r.collectives},
             {"coordination_us", r.coordination_us},
             {"coordination_max_us", r.coordination_max_us}}},
           {"checked", r.checked},
           {"wrong", r.checked ? nlohmann::json(r.wrong) : nlohmann::json(nullptr)},
           {"max_error", r.checked ? nlohmann::json(r.max_error) : nlohmann::json(nullptr)}});
    }
    sj["rows"] = std::move(sr);
    if (set->model == "resnet101") sj["fused_ratio_goal"] = kResNet101FusedRatioGoal;
    doc["step"] = std::move(sj);
  }
  return doc;
}

Status WriteJson(const std::string& path, const nlohmann::json& doc) {
  return WriteFileAtomically(path, doc.dump(2) + "\n", 0644, "--json");
}

}  // namespace kolo::bench
