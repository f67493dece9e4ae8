// kolo-allreduce-bench: allreduce bus bandwidth of kolo's engine and its peers, nccl-tests style.
//
// Exit status: 0 success; 2 a configuration error (bad flag, unknown or unavailable backend),
// found before any rank connects; 1 a failure while running (named on stderr by the failing rank);
// 3 every row ran but some result was wrong (every rank agrees, from the gathered check counts).
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "benchmarks/allreduce_bench/backend.h"
#include "benchmarks/allreduce_bench/bench_config.h"
#include "benchmarks/allreduce_bench/control.h"
#include "benchmarks/allreduce_bench/report.h"
#include "benchmarks/allreduce_bench/step_bench.h"
#include "benchmarks/allreduce_bench/sweep.h"
#include "engine/bootstrap/rendezvous.h"
#include "engine/collectives/plan.h"
#include "engine/common/file.h"
#include "engine/common/logging.h"
#include "engine/common/options.h"
#include "engine/transport/registry.h"
#include "engine/transport/shm/host_area.h"

namespace kolo::bench {
namespace {

constexpr int kExitRunFailed = 1;
constexpr int kExitBadConfig = 2;
constexpr int kExitWrongResults = 3;

std::string HostName() {
  char buf[HOST_NAME_MAX + 1] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

void Print(bool rank0, const std::string& text) {
  if (!rank0) return;
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

// Engine flags override the environment; then every requested backend must be runnable here.
Status Configure(const BenchConfig& config, Options* options) {
  if (config.fusion_threshold_mb) {
    options->fusion_threshold_bytes =
        static_cast<int64_t>(*config.fusion_threshold_mb * 1024.0 * 1024.0);
  }
  if (config.cycle_time_ms) options->cycle_time_ms = *config.cycle_time_ms;
  if (config.compression) options->compression = *config.compression;
  // The engines of every row start from the first transport; ring and link rows take their own.
  if (!config.transports.empty()) {
    KOLO_ASSIGN_OR_RETURN(const TransportSpec first, ParseTransportSpec(config.transports.front()));
    options->transport = first.name;
    if (first.streams > 0) options->tcp_streams = first.streams;
  }
  KOLO_RETURN_IF_ERROR(options->Validate());
  for (const std::string& spec : config.transports) {
    KOLO_ASSIGN_OR_RETURN(const TransportSpec ts, ParseTransportSpec(spec));
    const std::string& t = ts.name;
    Status s = transport::CheckTransport(t);
    // A transport this host cannot use (rdma without a device) fails now, naming the host.
    if (s.ok()) s = transport::ProbeTransport(t, transport::SettingsFrom(*options, "", ""));
    if (!s.ok()) return s.WithContext("--transport");
  }
  KOLO_RETURN_IF_ERROR(transport::CheckTransport(options->transport));
  // One-shot runs through the host area, which only shared memory on one host makes: refused
  // here for any other transport (across hosts, when the ranks find out, in Run).
  if (std::find(config.algorithms.begin(), config.algorithms.end(), "one-shot") !=
      config.algorithms.end()) {
    const std::vector<std::string> named = config.transports.empty()
                                               ? std::vector<std::string>{options->transport}
                                               : config.transports;
    for (const std::string& spec : named) {
      KOLO_ASSIGN_OR_RETURN(const TransportSpec ts, ParseTransportSpec(spec));
      if (ts.name != "auto" && ts.name != "shm") {
        return InvalidArgument(
            "--algorithms one-shot needs every rank on one host over shared memory (transport "
            "auto or shm), where the ranks map a host-wide area; transport '{}' has none: allowed "
            "with it are auto, ring, recursive-doubling, halving-doubling",
            spec);
      }
    }
  }
  KOLO_RETURN_IF_ERROR(CheckPlaceAvailable(config.place));
  const int64_t max_count = config.max_bytes / static_cast<int64_t>(DataTypeSize(config.dtype));
  for (BackendKind kind : config.backends) {
    KOLO_RETURN_IF_ERROR(CheckBackendAvailable(kind, *options));
    if ((kind == BackendKind::kGloo || kind == BackendKind::kMpiDirect) && config.tensors.empty() &&
        max_count > INT_MAX) {
      return InvalidArgument(
          "--maxbytes={} is {} elements of {}: backend {} counts in int (at most "
          "{} elements)",
          config.max_bytes, max_count, DataTypeName(config.dtype), BackendKindName(kind), INT_MAX);
    }
  }
  return Status::OK();
}

// The most read of a /proc file (its size says 0; /proc/self/status is about 1.5 KiB).
constexpr size_t kProcFileBytes = 64 << 10;

// Sets *wrong_rows to the number of checked rows with a wrong element (the same on every rank).
// Seconds since this process started (its start time in /proc/self/stat against the boot
// clock); 0 when unreadable.
double SecondsSinceProcessStart() {
  auto text = ReadFileBounded("/proc/self/stat", kProcFileBytes, "/proc/self/stat");
  if (!text.ok()) return 0;
  const std::string& stat = *text;
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream in(stat.substr(close + 2));
  std::string field;
  unsigned long long start_ticks = 0;
  for (int i = 3; i <= 22 && in >> field; ++i) {
    if (i == 22) start_ticks = std::strtoull(field.c_str(), nullptr, 10);
  }
  timespec now{};
  ::clock_gettime(CLOCK_BOOTTIME, &now);
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  if (start_ticks == 0 || ticks <= 0) return 0;
  return static_cast<double>(now.tv_sec) + now.tv_nsec * 1e-9 - start_ticks / ticks;
}

struct ProcessMemory {
  int64_t rss_bytes = 0;
  int64_t peak_rss_bytes = 0;
};

// VmRSS and VmHWM of /proc/self/status.
ProcessMemory ReadProcessMemory() {
  ProcessMemory m;
  auto text = ReadFileBounded("/proc/self/status", kProcFileBytes, "/proc/self/status");
  if (!text.ok()) return m;
  std::istringstream in(*text);
  std::string line;
  while (std::getline(in, line)) {
    long long kb = 0;
    if (std::sscanf(line.c_str(), "VmRSS: %lld kB", &kb) == 1) m.rss_bytes = kb * 1024;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kb) == 1) m.peak_rss_bytes = kb * 1024;
  }
  return m;
}

Status Run(const BenchConfig& config, Options options, int* wrong_rows) {
  SetLogLevel(options.log_level);
  if (options.size > 1) SetLogRank(options.rank);
  const bool rank0 = options.rank == 0;
  bool need_store = false;
  bool need_device = ControlNeedsDevice(options);
  for (BackendKind kind : config.backends) {
    need_store = need_store || NeedsStore(kind);
    need_device = need_device || NeedsDevice(kind);
  }
  need_device = need_device || !config.algorithms.empty();

  // Declared before everything that uses the store or the device, so destroyed after them.
  bootstrap::Rendezvous rv;
  if (need_store || need_device) {
    KOLO_ASSIGN_OR_RETURN(rv, bootstrap::StartRendezvous(options));
    // Engines started later join through this store; they must present the same secret.
    options.job_secret = rv.secret;
  }
  const std::vector<std::string> transports =
      config.transports.empty() ? std::vector<std::string>{options.transport} : config.transports;
  // The benchmark's own devices: one per transport for the link rows, and the first for control
  // under kolo-run.
  bool link = false;
  for (BackendKind kind : config.backends) link = link || NeedsDevice(kind);
  link = link || !config.algorithms.empty();  // the alone rows run on the benchmark's devices
  std::vector<std::unique_ptr<bootstrap::PrefixStore>> link_stores;
  std::vector<std::unique_ptr<transport::Device>> devices;
  std::map<std::string, transport::Device*> device_of;
  for (size_t i = 0; need_device && i < (link ? transports.size() : 1); ++i) {
    const std::string& t = transports[i];
    link_stores.push_back(std::make_unique<bootstrap::PrefixStore>(
        transports.size() > 1 ? fmt::format("bench/link/{}/", t) : std::string("bench/link/"),
        *rv.store));
    KOLO_ASSIGN_OR_RETURN(const TransportSpec spec, ParseTransportSpec(t));
    transport::ConnectSettings settings =
        transport::SettingsFrom(options, rv.listen_addr, rv.secret);
    if (spec.streams > 0) settings.tcp_streams = spec.streams;
    // The control channel's barrier and allgather and the link row's ring use only the peers of
    // the job's connection plan.
    settings.peers = collectives::PlanConnections(
        options.rank, options.size, collectives::Comm{}.bitwise_direct_max_ranks, nullptr);
    settings.full_ring_peers = collectives::PlanFullRingPeers(options.rank, options.size, nullptr);
    auto connected =
        transport::Connect(spec.name, settings, *link_stores.back(), options.rank, options.size);
    if (!connected.ok()) {
      return connected.status().WithContext(
          fmt::format("rank {}: connecting the benchmark's {} device", options.rank, t));
    }
    devices.push_back(std::move(connected).value());
    device_of[t] = devices.back().get();
  }
  transport::Device* control_device = devices.empty() ? nullptr : devices.front().get();
  KOLO_ASSIGN_OR_RETURN(std::unique_ptr<Control> control, MakeControl(options, control_device));
  for (BackendKind kind : config.backends) KOLO_RETURN_IF_ERROR(PrepareBackend(kind, options));

  RunInfo info;
  info.config = &config;
  info.options = options;
  KOLO_ASSIGN_OR_RETURN(info.hosts, control->AllgatherStrings(HostName()));
  const double first_collective_s = SecondsSinceProcessStart();
  info.launcher = options.launcher.empty() ? "none" : options.launcher;
  info.control = control->name();
  info.transports = transports;
  info.mpi_btl = MpiBtl(options);

  // Every rank on one host: a host-wide shared-memory area for each device whose pairs are all
  // shared memory, for the one-shot rows (collective, in device order).
  std::vector<std::unique_ptr<transport::shm::HostArea>> host_areas;
  std::map<const transport::Device*, transport::shm::HostArea*> area_of;
  const bool one_host = std::all_of(info.hosts.begin(), info.hosts.end(),
                                    [&](const std::string& h) { return h == info.hosts.front(); });
  for (size_t i = 0; link && one_host && options.size > 1 && i < devices.size(); ++i) {
    if (transport::PairTransports(*devices[i]) != "shm") continue;
    collectives::Comm comm;
    comm.device = devices[i].get();
    comm.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.peer_timeout_s * 1000.0));
    collectives::Scratch scratch;
    KOLO_ASSIGN_OR_RETURN(auto area, collectives::AttachHostArea(
                                         comm, *link_stores[i], "host-area", rv.secret,
                                         std::chrono::microseconds(options.poll_spin_us), scratch));
    if (area) {
      area_of[devices[i].get()] = area.get();
      host_areas.push_back(std::move(area));
    }
  }

  BackendEnv env;
  env.host_areas = area_of;
  env.config = &config;
  env.options = options;
  env.store = rv.store;
  env.listen_addr = rv.listen_addr;
  env.transports = transports;
  env.devices = device_of;
  env.control = control.get();

  std::vector<SweepRow> sweep;
  std::vector<RatioRow> ratios;
  std::vector<StepRow> steps;
  std::vector<AlgorithmRow> algorithms;
  std::vector<RankResources> resources;
  std::optional<TensorSet> set;
  if (!config.tensors.empty()) {
    KOLO_ASSIGN_OR_RETURN(set, MakeTensorSet(config.tensors));
    for (BackendKind k : config.backends) info.rows.emplace_back(BackendKindName(k));
    Print(rank0, FormatHeader(info) + FormatStepColumns(*set, config.dtype));
    KOLO_ASSIGN_OR_RETURN(steps, RunSteps(config, *set, env, *control, [&](const StepRow& row) {
                            Print(rank0, FormatStepRow(row));
                          }));
    // One rank moves nothing: its single allreduce is free and the ratio says nothing.
    if (options.size > 1) Print(rank0, FormatStepGoal(*set, steps));
  } else {
    std::vector<std::unique_ptr<Backend>> rows;
    for (BackendKind kind : config.backends) {
      KOLO_ASSIGN_OR_RETURN(auto made, MakeBackends(kind, env));
      for (auto& row : made) {
        info.rows.push_back(row->name());
        rows.push_back(std::move(row));
      }
    }
    Print(rank0, FormatHeader(info) + FormatSweepColumns());
    KOLO_ASSIGN_OR_RETURN(sweep, RunSweep(config, rows, *control, options.local_rank,
                                          [&](const std::vector<SweepRow>& at_size) {
                                            Print(rank0, FormatSweepRows(at_size));
                                          }));
    ratios = ComputeRatios(sweep);
    Print(rank0, FormatRatios(ratios));
    std::set<std::string> area_transports;
    for (const auto& [device, area] : area_of) area_transports.insert(device->name());
    algorithms = ComputeAlgorithmRows(sweep, options.size, area_transports);
    Print(rank0, FormatAlgorithmRows(algorithms));
  }
  // What every rank holds, gathered (untimed, after the measurements).
  {
    const auto sizes = SweepSizes(config);
    const int64_t largest =
        config.tensors.empty() || sizes.empty() ? (sizes.empty() ? 0 : sizes.back()) : 0;
    int connections = 0;
    int64_t memory = 0;
    for (const auto& d : devices) {
      connections = std::max(connections, d->connections());
      memory += static_cast<int64_t>(d->transport_memory_bytes());
    }
    for (const auto& a : host_areas) memory += static_cast<int64_t>(a->mapped_bytes());
    const ProcessMemory mem = ReadProcessMemory();
    const std::vector<double> mine = {static_cast<double>(connections),
                                      static_cast<double>(memory),
                                      static_cast<double>(env.engine_connections),
                                      static_cast<double>(env.engine_transport_memory_bytes),
                                      static_cast<double>(mem.rss_bytes),
                                      static_cast<double>(mem.peak_rss_bytes),
                                      static_cast<double>(2 * largest),
                                      first_collective_s};
    KOLO_ASSIGN_OR_RETURN(const std::vector<double> all, control->AllgatherDoubles(mine));
    for (size_t r = 0; r + mine.size() <= all.size(); r += mine.size()) {
      RankResources rr;
      rr.connections = static_cast<int>(all[r]);
      rr.transport_memory_bytes = static_cast<int64_t>(all[r + 1]);
      rr.engine_connections = static_cast<int>(all[r + 2]);
      rr.engine_transport_memory_bytes = static_cast<int64_t>(all[r + 3]);
      rr.rss_bytes = static_cast<int64_t>(all[r + 4]);
      rr.peak_rss_bytes = static_cast<int64_t>(all[r + 5]);
      rr.buffer_bytes = static_cast<int64_t>(all[r + 6]);
      rr.first_collective_s = all[r + 7];
      resources.push_back(rr);
    }
    Print(rank0, FormatResources(resources));
  }
  for (const SweepRow& r : sweep) *wrong_rows += r.checked && r.wrong != 0;
  for (const StepRow& r : steps) *wrong_rows += r.checked && r.wrong != 0;
  if (config.check) {
    Print(rank0, *wrong_rows == 0 ? std::string("# check: every result matches the reference\n")
                                  : fmt::format("# check: FAILED: {} row(s) have wrong elements\n",
                                                *wrong_rows));
  }
  if (rank0 && !config.json_path.empty()) {
    KOLO_RETURN_IF_ERROR(WriteJson(
        config.json_path,
        ToJson(info, sweep, ratios, set ? &*set : nullptr, steps, algorithms, resources)));
  }
  // Rank 0 serves the store: nobody may tear down while another rank still talks to it.
  return control->Barrier();
}

// Configuration errors are the same on every rank, but every rank reports its own: a launcher
// stops the others when the first one exits, possibly before rank 0 has printed anything.
void ConfigError(const StatusOr<Options>& env_options, const Status& s) {
  const int size = env_options.ok() ? env_options->size : 1;
  const std::string who = size > 1 ? fmt::format(" (rank {})", env_options->rank) : "";
  std::fprintf(stderr, "kolo-allreduce-bench%s: %s\n", who.c_str(), s.ToString().c_str());
  std::fflush(stderr);
}

int Main(int argc, char** argv) {
  auto env_options = OptionsFromEnvironment();
  const bool rank0 = !env_options.ok() || env_options->rank == 0;
  auto parsed = ParseBenchFlags(argc, argv);
  if (!parsed.ok()) {
    ConfigError(env_options, parsed.status());
    return kExitBadConfig;
  }
  if (parsed->help) {
    Print(rank0, parsed->help_text);
    return 0;
  }
  if (!env_options.ok()) {
    ConfigError(env_options, env_options.status().WithContext("environment"));
    return kExitBadConfig;
  }
  Options options = *env_options;
  Status s = Configure(parsed->config, &options);
  if (!s.ok()) {
    ConfigError(env_options, s);
    return kExitBadConfig;
  }
  int wrong_rows = 0;
  s = Run(parsed->config, options, &wrong_rows);
  if (!s.ok()) {
    std::fprintf(stderr, "kolo-allreduce-bench: rank %d failed: %s\n", options.rank,
                 s.ToString().c_str());
    std::fflush(stderr);
    AbortJobAfterError(options, kExitRunFailed);
    return kExitRunFailed;
  }
  return wrong_rows == 0 ? 0 : kExitWrongResults;
}

}  // namespace
}  // namespace kolo::bench

int main(int argc, char** argv) { return kolo::bench::Main(argc, argv); }
