#include "models/trainer/run_record.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/common/file.h"

namespace kolo::models::trainer {

std::string RunRecordToJson(const RunRecord& r) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["kolo_commit"] = r.kolo_commit;
  j["timestamp"] = r.timestamp;
  j["hosts"] = r.hosts;
  j["cpu_model"] = r.cpu_model;
  j["gpu_model"] = r.gpu_model;
  const RunSettings& s = r.settings;
  j["settings"] = {{"model", s.model},
                   {"batch_size", s.batch_size},
                   {"num_warmup_batches", s.num_warmup_batches},
                   {"num_batches", s.num_batches},
                   {"compute", s.compute},
                   {"profile", s.profile},
                   {"dilation", s.dilation},
                   {"backend", s.backend},
                   {"transport", s.transport},
                   {"allreduce_algorithm", s.allreduce_algorithm},
                   {"compression", s.compression},
                   {"tcp_streams", s.tcp_streams},
                   {"hierarchical_allreduce", s.hierarchical_allreduce},
                   {"precision", s.precision},
                   {"fusion_threshold_mb", s.fusion_threshold_mb},
                   {"cycle_time_ms", s.cycle_time_ms},
                   {"backward_passes_per_step", s.backward_passes_per_step},
                   {"image_size", s.image_size},
                   {"num_classes", s.num_classes},
                   {"ranks", s.ranks},
                   {"nodes", s.nodes},
                   {"ps_servers", s.ps_servers},
                   {"ps_placement", s.ps_placement},
                   {"ps_pacing", s.ps_pacing},
                   {"ps_staging", s.ps_staging},
                   {"autotune", s.autotune}};
  if (!r.autotune_trials.empty()) {
    Json trials = Json::array();
    for (const AutotuneTrial& t : r.autotune_trials) {
      trials.push_back({{"fusion_threshold_mb", t.fusion_threshold_mb},
                        {"cycle_time_ms", t.cycle_time_ms},
                        {"allreduce_algorithm", t.allreduce_algorithm},
                        {"hierarchical_allreduce", t.hierarchical_allreduce},
                        {"images_per_sec", t.images_per_sec},
                        {"kept", t.kept}});
    }
    j["autotune"] = {{"trials", std::move(trials)},
                     {"choice",
                      {{"fusion_threshold_mb", s.fusion_threshold_mb},
                       {"cycle_time_ms", s.cycle_time_ms},
                       {"allreduce_algorithm", s.allreduce_algorithm},
                       {"hierarchical_allreduce", s.hierarchical_allreduce}}}};
  }
  if (r.results) {
    const RunResults& x = *r.results;
    const Engine::Stats& e = x.engine_stats;
    Json results = {{"total_images_per_sec", x.total_images_per_sec},
                    {"images_per_sec_per_rank", x.images_per_sec_per_rank},
                    {"images_per_sec_stddev", x.images_per_sec_stddev},
                    {"step_time_ms_median", x.step_time_ms_median},
                    {"exposed_wait_ms_median", x.exposed_wait_ms_median}};
    const Breakdown& b = x.breakdown;
    results["step_time_ms_mean"] = b.step_time_ms_mean;
    results["forward_ms"] = b.forward_ms;
    results["backward_ms"] = b.backward_ms;
    results["exposed_comm_ms"] = b.exposed_comm_ms;
    results["update_ms"] = b.update_ms;
    results["comm_ms"] = b.comm_ms;
    results["hidden_comm_ms"] = b.hidden_comm_ms;
    results["negotiation_ms"] = b.negotiation_ms;
    results["comm_bytes_per_step"] = b.comm_bytes_per_step;
    results["comm_gbytes_per_sec"] = b.comm_gbytes_per_sec;
    results["collectives_per_step"] = b.collectives_per_step;
    results["cycles_per_step"] = b.cycles_per_step;
    results["cycle_hold_ms"] = b.cycle_hold_ms;
    results["final_loss"] = x.final_loss ? Json(*x.final_loss) : Json(nullptr);
    results["kernel_share"] = x.kernel_share;
    results["engine_stats"] = {{"cycles", e.cycles},
                               {"caller_cycles", e.caller_cycles},
                               {"negotiations", e.negotiations},
                               {"cache_hits", e.cache_hits},
                               {"collectives", e.collectives},
                               {"tensors", e.tensors},
                               {"fused_bytes", e.fused_bytes},
                               {"packed_bytes", e.packed_bytes},
                               {"coordination_us", e.coordination_us},
                               {"ps_bytes_sent", e.ps_bytes_sent},
                               {"ps_bytes_received", e.ps_bytes_received},
                               {"ps_updates", e.ps_updates},
                               {"ps_busy_us", e.ps_busy_us},
                               {"execute_us", e.execute_us},
                               {"allreduce_bytes", e.allreduce_bytes},
                               {"allreduce_wire_bytes", e.allreduce_wire_bytes},
                               {"gather_us", e.gather_us},
                               {"transport_bytes_sent", e.transport_bytes_sent},
                               {"transport_bytes_received", e.transport_bytes_received},
                               {"transport_pairs", e.transport_pairs},
                               {"transport_connections", e.transport_connections},
                               {"transport_memory_bytes", e.transport_memory_bytes},
                               {"tcp_streams", e.tcp_streams}};
    j["results"] = std::move(results);
  }
  j["status"] = r.ok ? "ok" : "failed";
  if (!r.ok) j["error"] = r.error;
  // Invalid UTF-8 (a host or CPU name) is replaced rather than making the dump throw.
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

Status WriteRunRecord(const RunRecord& record, const std::string& path) {
  return WriteFileAtomically(path, RunRecordToJson(record), 0644, "--json");
}

std::string UtcTimestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string CpuModel() {
  // Several KiB per processor: 4 MiB holds the first processor's lines on any host.
  auto text = ReadFileBounded("/proc/cpuinfo", 4 << 20, "/proc/cpuinfo");
  if (!text.ok()) return "unknown";
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown" : line.substr(start);
  }
  return "unknown";
}

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace kolo::models::trainer
