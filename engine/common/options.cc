#include "engine/common/options.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "engine/common/fault_inject.h"
#include "engine/common/file.h"
#include "engine/common/launch_env.h"

extern char** environ;

namespace kolo {
namespace {

const std::string* Find(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return nullptr;
  return &it->second;
}

// A numeric variable set to nothing is a mistake (a script's unset shell variable), not "default".
Status RefuseEmpty(const std::map<std::string, std::string>& env, const char* name,
                   const std::string& allowed) {
  auto it = env.find(name);
  if (it != env.end() && it->second.empty()) {
    return InvalidArgument("{} is set but empty; allowed: {}, or leave it unset for the default",
                           name, allowed);
  }
  return Status::OK();
}

// Reads an int variable into *out if present.
Status ReadInt(const std::map<std::string, std::string>& env, const char* name, int64_t min,
               int64_t max, int64_t* out) {
  KOLO_RETURN_IF_ERROR(RefuseEmpty(env, name, fmt::format("an integer in [{}, {}]", min, max)));
  if (const std::string* v = Find(env, name)) {
    KOLO_ASSIGN_OR_RETURN(*out, ParseInt(name, *v, min, max));
  }
  return Status::OK();
}

Status ReadInt32(const std::map<std::string, std::string>& env, const char* name, int64_t min,
                 int64_t max, int* out) {
  int64_t v = *out;
  KOLO_RETURN_IF_ERROR(ReadInt(env, name, min, max, &v));
  *out = static_cast<int>(v);
  return Status::OK();
}

Status ReadDouble(const std::map<std::string, std::string>& env, const char* name, double min,
                  double max, double* out) {
  KOLO_RETURN_IF_ERROR(RefuseEmpty(env, name, fmt::format("a number in [{}, {}]", min, max)));
  if (const std::string* v = Find(env, name)) {
    KOLO_ASSIGN_OR_RETURN(*out, ParseDouble(name, *v, min, max));
  }
  return Status::OK();
}

// Every KOLO_* variable kolo reads, in this file or in the tools' launch scripts.
const char* const kKnownVariables[] = {
    "KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE", "KOLO_STORE_ADDR",
    "KOLO_STORE_PORT", "KOLO_JOB_SECRET", "KOLO_IFACE", "KOLO_HOST_NAME",
    "KOLO_HIERARCHICAL_ALLREDUCE", "KOLO_ALLREDUCE_ALGORITHM", "KOLO_BACKEND", "KOLO_TRANSPORT",
    "KOLO_TIMELINE", "KOLO_LOG_LEVEL", "KOLO_BUSY_POLL", "KOLO_POLL_SPIN_US",
    "KOLO_RIDING_MAX_BYTES", "KOLO_ENGINE_SCHED", "KOLO_SOCKET_BUFFER_BYTES", "KOLO_SHM_RING_BYTES",
    "KOLO_RING_CHUNK_BYTES", "KOLO_FUSION_THRESHOLD_BYTES", "KOLO_CACHE_CAPACITY",
    "KOLO_CYCLE_TIME_MS", "KOLO_PEER_TIMEOUT_SECONDS", "KOLO_START_TIMEOUT_SECONDS",
    "KOLO_FAULT_INJECT", "KOLO_STALL_CHECK_SECONDS", "KOLO_STALL_SHUTDOWN_SECONDS",
    "KOLO_MPI_IDLE_PROGRESS", "KOLO_CALLER_PROGRESS", "KOLO_SKIP_BOOTSTRAP", "KOLO_PS_SERVERS",
    "KOLO_PS_SERVER_RANKS", "KOLO_PS_PLACEMENT", "KOLO_PS_PACING", "KOLO_COMPRESSION",
    "KOLO_TCP_STREAMS", "KOLO_TCP_STRIPE_MIN_BYTES", "KOLO_EMULATED_FLOW_CAP", "KOLO_IB_DEVICE",
    "KOLO_IB_PORT", "KOLO_IB_GID_INDEX", "KOLO_IB_VERBS",
    // Read by scripts/ (and exported to the ranks they start).
    "KOLO_ROOT", "KOLO_VENV", "KOLO_OUT", "KOLO_BIN_DIR", "KOLO_SKIP_BUILD", "KOLO_RECONFIGURE",
    "KOLO_MPIRUN_ARGS", "KOLO_MAIN_TIMEOUT"};

}  // namespace

std::vector<std::string> UnknownKoloVariables(const std::map<std::string, std::string>& env) {
  std::vector<std::string> unknown;
  for (const auto& [key, value] : env) {
    if (key.rfind("KOLO_", 0) != 0) continue;
    bool known = false;
    for (const char* k : kKnownVariables) known = known || key == k;
    if (!known) unknown.push_back(key);
  }
  return unknown;
}

StatusOr<int64_t> ParseInt(const std::string& what, const std::string& value, int64_t min,
                           int64_t max) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno == ERANGE) {
    return InvalidArgument("{}='{}' is not an integer: allowed are integers in [{}, {}]", what,
                           value, min, max);
  }
  if (v < min || v > max) {
    return InvalidArgument("{}={} is out of range: allowed are integers in [{}, {}]", what, v, min,
                           max);
  }
  return static_cast<int64_t>(v);
}

StatusOr<double> ParseDouble(const std::string& what, const std::string& value, double min,
                             double max) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) {
    return InvalidArgument("{}='{}' is not a number: allowed are numbers in [{}, {}]", what, value,
                           min, max);
  }
  if (v < min || v > max) {
    return InvalidArgument("{}={} is out of range: allowed are numbers in [{}, {}]", what, v, min,
                           max);
  }
  return v;
}

StatusOr<bool> ParseBool(const std::string& what, const std::string& value) {
  if (value == "1" || value == "true" || value == "yes" || value == "on") return true;
  if (value == "0" || value == "false" || value == "no" || value == "off") return false;
  return InvalidArgument("{}='{}' is not a boolean: allowed are 1/0, true/false, yes/no, on/off",
                         what, value);
}

StatusOr<LogLevel> ParseLogLevel(const std::string& value) {
  if (value == "trace") return LogLevel::kTrace;
  if (value == "debug") return LogLevel::kDebug;
  if (value == "info") return LogLevel::kInfo;
  if (value == "warning" || value == "warn") return LogLevel::kWarning;
  if (value == "error") return LogLevel::kError;
  return InvalidArgument(
      "KOLO_LOG_LEVEL='{}' is not a log level: allowed are trace, debug, info, warning, error",
      value);
}

StatusOr<std::vector<int>> ParseRankList(const std::string& what, const std::string& value) {
  std::vector<int> ranks;
  size_t start = 0;
  while (start <= value.size() && !value.empty()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    const std::string item = value.substr(start, comma - start);
    auto r = ParseInt(what, item, 0, 1 << 20);
    if (!r.ok()) {
      return InvalidArgument(
          "{}='{}': item '{}' is not a rank: allowed is a comma-separated list "
          "of ranks such as 8,17",
          what, value, item);
    }
    ranks.push_back(static_cast<int>(*r));
    start = comma + 1;
  }
  return ranks;
}

namespace {

Status ValidateParameterServers(const Options& o) {
  if (o.ps_placement != "greedy" && o.ps_placement != "split") {
    return InvalidArgument("parameter-server placement '{}' is unknown: allowed are greedy, split",
                           o.ps_placement);
  }
  if (!(o.ps_pacing_bits_per_s >= 0) || o.ps_pacing_bits_per_s > 1e13) {
    return InvalidArgument(
        "parameter-server pacing {} bit/s is outside what is allowed: 0 (off) up to 10000gbit",
        o.ps_pacing_bits_per_s);
  }
  if (o.backend != "ps") return Status::OK();
  if (o.ps_servers < 1 || o.ps_servers >= o.size) {
    return InvalidArgument(
        "{} parameter server(s) in a job of {} rank(s): backend 'ps' needs at least one server and "
        "one worker, so allowed are 1 to size - 1 = {} servers (KOLO_PS_SERVERS / --ps-servers)",
        o.ps_servers, o.size, o.size - 1);
  }
  if (!o.ps_server_ranks.empty()) {
    if (static_cast<int>(o.ps_server_ranks.size()) != o.ps_servers) {
      return InvalidArgument(
          "the parameter-server rank list names {} rank(s) but {} server(s) were asked for: "
          "give KOLO_PS_SERVERS equal to the list's length, or leave it unset",
          o.ps_server_ranks.size(), o.ps_servers);
    }
    std::vector<bool> seen(static_cast<size_t>(o.size), false);
    for (int r : o.ps_server_ranks) {
      if (r < 0 || r >= o.size) {
        return InvalidArgument("parameter-server rank {} is outside [0, {}) for a job of {} ranks",
                               r, o.size, o.size);
      }
      if (seen[static_cast<size_t>(r)]) {
        return InvalidArgument(
            "parameter-server rank {} is listed twice: every server rank must be distinct", r);
      }
      seen[static_cast<size_t>(r)] = true;
    }
  }
  return Status::OK();
}

}  // namespace

StatusOr<int64_t> ParseByteSize(const std::string& what, const std::string& value) {
  if (value.empty())
    return InvalidArgument("{} is empty: expected a size such as 4096, 64K, 1M", what);
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  std::string suffix(end);
  double mult = 1;
  if (suffix == "" || suffix == "B") {
    mult = 1;
  } else if (suffix == "K" || suffix == "k" || suffix == "KiB") {
    mult = 1024.0;
  } else if (suffix == "M" || suffix == "m" || suffix == "MiB") {
    mult = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "g" || suffix == "GiB") {
    mult = 1024.0 * 1024 * 1024;
  } else {
    return InvalidArgument("{}='{}' is not a size: allowed are a number with an optional K, M or G",
                           what, value);
  }
  if (errno == ERANGE || !std::isfinite(v) || v < 0 || v * mult > 9.0e18 || end == value.c_str()) {
    return InvalidArgument("{}='{}' is not a non-negative size", what, value);
  }
  return static_cast<int64_t>(std::llround(v * mult));
}

StatusOr<double> ParseBitRate(const std::string& what, const std::string& value) {
  if (value == "off" || value == "0") return 0.0;
  static const std::pair<const char*, double> kUnits[] = {
      {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}};
  for (const auto& [unit, mult] : kUnits) {
    const size_t n = std::strlen(unit);
    if (value.size() <= n || value.compare(value.size() - n, n, unit) != 0) continue;
    const std::string number = value.substr(0, value.size() - n);
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(number.c_str(), &end);
    const bool digits = number.find_first_not_of("0123456789.") == std::string::npos;
    if (digits && end == number.c_str() + number.size() && errno != ERANGE && std::isfinite(v) &&
        v > 0 && v * mult <= 1e13) {
      return v * mult;
    }
    break;
  }
  return InvalidArgument(
      "{}='{}' is not a rate: allowed are a positive number and kbit, mbit or gbit per second "
      "(for example 125mbit, 1.5gbit; at most 10000gbit), or off",
      what, value);
}

std::string FormatBitRate(double bits_per_s) {
  if (bits_per_s <= 0) return "off";
  const double g = bits_per_s / 1e9, m = bits_per_s / 1e6;
  if (g >= 1) return fmt::format("{:g}gbit", g);
  if (m >= 1) return fmt::format("{:g}mbit", m);
  return fmt::format("{:g}kbit", bits_per_s / 1e3);
}

Status Options::Validate() const {
  if (size < 1) return InvalidArgument("size={} must be at least 1", size);
  if (rank < 0 || rank >= size) {
    return InvalidArgument("rank={} is outside [0, {}) for size {}", rank, size, size);
  }
  if (local_size < 1 || local_size > size) {
    return InvalidArgument("local_size={} must be in [1, size={}]", local_size, size);
  }
  if (local_rank < 0 || local_rank >= local_size) {
    return InvalidArgument("local_rank={} is outside [0, local_size={})", local_rank, local_size);
  }
  if (backend != "ring" && backend != "mpi" && backend != "ps" && backend != "nccl" &&
      backend != "none") {
    return InvalidArgument("backend '{}' is unknown: allowed are ring, mpi, ps, nccl, none",
                           backend);
  }
  if (backend == "none" && size != 1) {
    return InvalidArgument(
        "backend 'none' (one rank without distributed communication, the single-rank baseline) "
        "runs alone, but this job has {} ranks: launch one rank, or use ring, mpi, ps or nccl",
        size);
  }
  // Which names exist is the transport registry's to say (transport::CheckTransport), checked
  // before the engine connects; an empty name is wrong whatever the registry holds.
  if (transport.empty()) {
    return InvalidArgument("transport '' is empty: name one, e.g. auto, shm or tcp");
  }
  const auto& algorithms = AllreduceAlgorithmNames();
  if (std::find(algorithms.begin(), algorithms.end(), allreduce_algorithm) == algorithms.end()) {
    return InvalidArgument("allreduce algorithm '{}' is unknown: allowed are {}",
                           allreduce_algorithm, fmt::join(algorithms, ", "));
  }
  KOLO_RETURN_IF_ERROR(CompressionDataType(compression).status());
  if (allreduce_algorithm == "one-shot" && transport != "auto" && transport != "shm") {
    return InvalidArgument(
        "allreduce algorithm 'one-shot' runs through a host-wide shared-memory area, which "
        "transport '{}' does not make: use transport auto or shm with every rank on one host, or "
        "one of auto, ring, recursive-doubling, halving-doubling",
        transport);
  }
  if (hierarchical_allreduce && allreduce_algorithm != "auto" && allreduce_algorithm != "ring") {
    return InvalidArgument(
        "allreduce algorithm '{}' cannot run a hierarchical allreduce (its rings within and "
        "across hosts): with hierarchical allreduce allowed are auto, ring",
        allreduce_algorithm);
  }
  KOLO_RETURN_IF_ERROR(RequireServedStoreSecret(launcher, serve_store_addr, job_secret));
  KOLO_RETURN_IF_ERROR(ValidateParameterServers(*this));
  if (backend == "mpi" && !launched_by_mpirun && size > 1) {
    return InvalidArgument("backend 'mpi' needs a launch by mpirun (OMPI_COMM_WORLD_SIZE unset)");
  }
  if (fusion_threshold_bytes < 0) {
    return InvalidArgument("fusion threshold {} bytes is negative: allowed are >= 0 (0 disables)",
                           fusion_threshold_bytes);
  }
  if (!(cycle_time_ms > 0 && cycle_time_ms <= 10000)) {
    return InvalidArgument("cycle time {} ms is outside (0, 10000]", cycle_time_ms);
  }
  if (cache_capacity < 0 || cache_capacity > (1 << 20)) {
    return InvalidArgument("cache capacity {} is outside [0, 1048576]", cache_capacity);
  }
  if (stall_warning_s < 0) return InvalidArgument("stall check {} s is negative", stall_warning_s);
  if (stall_shutdown_s < 0) {
    return InvalidArgument("stall shutdown {} s is negative", stall_shutdown_s);
  }
  if (!(peer_timeout_s > 0)) {
    return InvalidArgument("peer timeout {} s must be positive", peer_timeout_s);
  }
  if (!(start_timeout_s > 0)) {
    return InvalidArgument("start timeout {} s must be positive", start_timeout_s);
  }
  if (socket_buffer_bytes < 4096 || socket_buffer_bytes > (1ll << 30)) {
    return InvalidArgument("socket buffer {} bytes is outside [4096, 1 GiB]", socket_buffer_bytes);
  }
  if (shm_ring_bytes < (64 << 10) || shm_ring_bytes > (1ll << 30) ||
      (shm_ring_bytes & (shm_ring_bytes - 1)) != 0) {
    return InvalidArgument(
        "shared-memory ring {} bytes: must be a power of two from 64 KiB to 1 GiB", shm_ring_bytes);
  }
  if (ib_port < 1 || ib_port > 255) {
    return InvalidArgument("RDMA port {} is outside [1, 255]", ib_port);
  }
  if (ib_gid_index < -1 || ib_gid_index > 255) {
    return InvalidArgument("RDMA GID index {} is outside [0, 255] (or -1: automatic)",
                           ib_gid_index);
  }
  if (ib_verbs != "libibverbs" && ib_verbs != "soft") {
    return InvalidArgument(
        "verbs '{}' (KOLO_IB_VERBS) is unknown: allowed are libibverbs (rdma-core) and soft (the "
        "in-process software verbs device, for tests)",
        ib_verbs);
  }
  if (ring_chunk_bytes < 4096 || ring_chunk_bytes > (1ll << 30)) {
    return InvalidArgument("ring chunk {} bytes is outside [4096, 1 GiB]", ring_chunk_bytes);
  }
  if (engine_sched != "auto" && engine_sched != "batch" && engine_sched != "normal") {
    return InvalidArgument("engine scheduling '{}' is unknown: allowed are auto, batch, normal",
                           engine_sched);
  }
  if (!job_secret.empty() && job_secret.size() < 16) {
    return InvalidArgument("KOLO_JOB_SECRET has {} characters: at least 16 are required",
                           job_secret.size());
  }
  return Status::OK();
}

int64_t AutoSocketBufferBytes(int local_size, int64_t cache_bytes, int cpus) {
  constexpr int64_t kMin = 512 << 10, kMax = 4 << 20;
  if (cache_bytes <= 0) return 2 << 20;
  const int64_t ranks = std::max(local_size, 1);
  const int64_t per_cpu = (ranks + std::max(cpus, 1) - 1) / std::max(cpus, 1);
  const int64_t share = cache_bytes / (8 * ranks * per_cpu);
  int64_t bytes = kMin;
  while (bytes * 2 <= std::min(share, kMax)) bytes *= 2;
  return bytes;
}

bool EngineThreadIsBatch(const std::string& engine_sched, int local_size, int cpus) {
  return engine_sched == "batch" || (engine_sched == "auto" && local_size > cpus);
}

int OnlineCpus() {
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

int64_t LastLevelCacheBytes() {
  // sysfs describes the cache a core actually shares (on AMD, its CCX's L3); glibc's sysconf may
  // report the whole package's, which is several times more than any rank can use.
  // A sysfs attribute is at most a page (and says so in its size).
  constexpr size_t kAttributeBytes = 4096;
  int best_level = 0;
  int64_t best_bytes = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i);
    auto level_text = ReadFileBounded(dir + "/level", kAttributeBytes, "cache level");
    auto size_text = ReadFileBounded(dir + "/size", kAttributeBytes, "cache size");
    if (!level_text.ok() || !size_text.ok()) continue;
    int level = 0;
    long long value = 0;
    char unit = 0;
    if (std::sscanf(level_text->c_str(), "%d", &level) != 1 ||
        std::sscanf(size_text->c_str(), "%lld%c", &value, &unit) < 1 || value <= 0) {
      continue;
    }
    const int64_t bytes = unit == 'K' ? value << 10 : unit == 'M' ? value << 20 : value;
    if (level > best_level) {
      best_level = level;
      best_bytes = bytes;
    }
  }
  if (best_bytes > 0) return best_bytes;
  const long l3 = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? l3 : 0;
}

StatusOr<int> ParseTcpStreams(const std::string& what, const std::string& value) {
  if (value == "auto") return 0;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || end != value.c_str() + value.size() || errno == ERANGE || v < 1 || v > 16) {
    return InvalidArgument("{}='{}': allowed are auto or a number of streams from 1 to 16", what,
                           value);
  }
  return static_cast<int>(v);
}

std::string TcpStreamsName(int tcp_streams) {
  return tcp_streams == 0 ? "auto" : fmt::format("{}", tcp_streams);
}

int AutoTcpStreams(const std::string& listen_addr) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return 1;
  std::string iface;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) != nullptr && listen_addr == text) {
      if ((a->ifa_flags & IFF_LOOPBACK) == 0) iface = a->ifa_name;
      break;
    }
  }
  ::freeifaddrs(list);
  if (iface.empty()) return 1;
  // Mbit/s; virtual links (veth, bridges) report none or a nominal 10000.
  std::ifstream speed_file("/sys/class/net/" + iface + "/speed");
  long mbit = 0;
  if (!(speed_file >> mbit) || mbit <= 0) return 1;
  return static_cast<int>(std::clamp<long>((mbit + 9999) / 10000, 1, 8));
}

namespace {

// Options::compression's names and the dtype each makes float32 tensors travel in.
constexpr std::pair<const char*, DataType> kCompressions[] = {
    {"none", DataType::kFloat32}, {"fp16", DataType::kFloat16}, {"bf16", DataType::kBFloat16}};

}  // namespace

const std::vector<std::string>& CompressionNames() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const auto& [name, dtype] : kCompressions) names.emplace_back(name);
    return names;
  }();
  return kNames;
}

StatusOr<DataType> CompressionDataType(const std::string& name) {
  for (const auto& [known, dtype] : kCompressions) {
    if (name == known) return dtype;
  }
  return InvalidArgument("compression '{}' is unknown: allowed are {}", name,
                         fmt::join(CompressionNames(), ", "));
}

const std::vector<std::string>& AllreduceAlgorithmNames() {
  static const std::vector<std::string> kNames = {"auto", "ring", "recursive-doubling",
                                                  "halving-doubling", "one-shot"};
  return kNames;
}

std::vector<MatchedSetting> MustMatch(const Options& o) {
  std::vector<MatchedSetting> out = {
      {"size", fmt::format("{}", o.size)},
      {"backend", o.backend},
      {"transport", o.transport},
      {"fusion_threshold_bytes", fmt::format("{}", o.fusion_threshold_bytes)},
      {"cache_capacity", fmt::format("{}", o.cache_capacity)},
      {"hierarchical_allreduce", o.hierarchical_allreduce ? "true" : "false"},
      {"hierarchical_switchable", o.hierarchical_switchable ? "true" : "false"},
      {"allreduce_algorithm", o.allreduce_algorithm},
      {"compression", o.compression},
      {"tcp_streams", TcpStreamsName(o.tcp_streams)},
      {"tcp_stripe_min_bytes", fmt::format("{}", o.tcp_stripe_min_bytes)},
      {"ring_chunk_bytes", fmt::format("{}", o.ring_chunk_bytes)},
      {"riding_max_bytes", fmt::format("{}", o.riding_max_bytes)},
  };
  if (o.backend == "ps") {
    out.push_back({"ps_servers", fmt::format("{}", o.ps_servers)});
    out.push_back({"ps_server_ranks", fmt::format("{}", fmt::join(o.ps_server_ranks, ","))});
    out.push_back({"ps_placement", o.ps_placement});
  }
  out.insert(out.end(), o.app_settings.begin(), o.app_settings.end());
  return out;
}

StatusOr<Options> OptionsFromEnvironment(const std::map<std::string, std::string>& env) {
  Options o;
  // Where this rank is: Open MPI's mpirun, kolo-run, srun or Hydra (launch_env.h).
  KOLO_ASSIGN_OR_RETURN(const LaunchPlace place, ReadLaunchPlace(env));
  o.launcher = place.launcher;
  o.launched_by_mpirun = place.launcher == "mpirun";
  o.rank = place.rank;
  o.size = place.size;
  o.local_rank = place.local_rank;
  o.local_size = place.local_size;
  o.serve_store_addr = place.serve_store_addr;
  if (const std::string* v = Find(env, "KOLO_STORE_ADDR")) o.store_addr = *v;
  if (const std::string* v = Find(env, "KOLO_JOB_SECRET")) o.job_secret = *v;
  if (const std::string* v = Find(env, "KOLO_IFACE")) o.iface = *v;
  KOLO_RETURN_IF_ERROR(RefuseEmpty(env, "KOLO_HOST_NAME", "a host name"));
  if (const std::string* v = Find(env, "KOLO_HOST_NAME")) o.host_name = *v;
  if (const std::string* v = Find(env, "KOLO_HIERARCHICAL_ALLREDUCE")) {
    KOLO_ASSIGN_OR_RETURN(o.hierarchical_allreduce, ParseBool("KOLO_HIERARCHICAL_ALLREDUCE", *v));
  }
  if (const std::string* v = Find(env, "KOLO_ALLREDUCE_ALGORITHM")) o.allreduce_algorithm = *v;
  if (const std::string* v = Find(env, "KOLO_COMPRESSION")) o.compression = *v;
  KOLO_RETURN_IF_ERROR(
      RefuseEmpty(env, "KOLO_TCP_STREAMS", "auto or a number of streams from 1 to 16"));
  if (const std::string* v = Find(env, "KOLO_TCP_STREAMS")) {
    KOLO_ASSIGN_OR_RETURN(o.tcp_streams, ParseTcpStreams("KOLO_TCP_STREAMS", *v));
  }
  KOLO_RETURN_IF_ERROR(
      ReadInt(env, "KOLO_TCP_STRIPE_MIN_BYTES", 4096, 1ll << 40, &o.tcp_stripe_min_bytes));
  if (const std::string* v = Find(env, "KOLO_EMULATED_FLOW_CAP")) {
    KOLO_ASSIGN_OR_RETURN(o.emulated_flow_cap_bits_per_s,
                          ParseBitRate("KOLO_EMULATED_FLOW_CAP", *v));
  }
  if (const std::string* v = Find(env, "KOLO_BACKEND")) o.backend = *v;
  if (const std::string* v = Find(env, "KOLO_TRANSPORT")) o.transport = *v;
  if (const std::string* v = Find(env, "KOLO_TIMELINE")) o.timeline_path = *v;
  if (const std::string* v = Find(env, "KOLO_LOG_LEVEL")) {
    KOLO_ASSIGN_OR_RETURN(o.log_level, ParseLogLevel(*v));
  }
  if (const std::string* v = Find(env, "KOLO_ENGINE_SCHED")) o.engine_sched = *v;
  KOLO_RETURN_IF_ERROR(ReadInt(env, "KOLO_POLL_SPIN_US", 0, 1000000, &o.poll_spin_us));
  KOLO_RETURN_IF_ERROR(ReadInt(env, "KOLO_RIDING_MAX_BYTES", 0, 1 << 20, &o.riding_max_bytes));
  if (const std::string* v = Find(env, "KOLO_CALLER_PROGRESS")) {
    KOLO_ASSIGN_OR_RETURN(o.caller_progress, ParseBool("KOLO_CALLER_PROGRESS", *v));
  }
  if (const std::string* v = Find(env, "KOLO_MPI_IDLE_PROGRESS")) {
    KOLO_ASSIGN_OR_RETURN(o.mpi_idle_progress, ParseBool("KOLO_MPI_IDLE_PROGRESS", *v));
  }
  if (const std::string* v = Find(env, "KOLO_BUSY_POLL")) {
    KOLO_ASSIGN_OR_RETURN(o.busy_poll, ParseBool("KOLO_BUSY_POLL", *v));
  }
  o.socket_buffer_bytes = AutoSocketBufferBytes(o.local_size, LastLevelCacheBytes(), OnlineCpus());
  KOLO_RETURN_IF_ERROR(
      ReadInt(env, "KOLO_SOCKET_BUFFER_BYTES", 4096, 1ll << 30, &o.socket_buffer_bytes));
  KOLO_RETURN_IF_ERROR(ReadInt(env, "KOLO_SHM_RING_BYTES", 64 << 10, 1ll << 30, &o.shm_ring_bytes));
  if (const std::string* v = Find(env, "KOLO_IB_DEVICE")) o.ib_device = *v;
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_IB_PORT", 1, 255, &o.ib_port));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_IB_GID_INDEX", -1, 255, &o.ib_gid_index));
  if (const std::string* v = Find(env, "KOLO_IB_VERBS")) o.ib_verbs = *v;
  KOLO_RETURN_IF_ERROR(ReadInt(env, "KOLO_RING_CHUNK_BYTES", 4096, 1ll << 30, &o.ring_chunk_bytes));
  KOLO_RETURN_IF_ERROR(
      ReadInt(env, "KOLO_FUSION_THRESHOLD_BYTES", 0, 1ll << 40, &o.fusion_threshold_bytes));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_CACHE_CAPACITY", 0, 1 << 20, &o.cache_capacity));
  KOLO_RETURN_IF_ERROR(ReadDouble(env, "KOLO_CYCLE_TIME_MS", 1e-3, 10000, &o.cycle_time_ms));
  KOLO_RETURN_IF_ERROR(ReadDouble(env, "KOLO_PEER_TIMEOUT_SECONDS", 1e-3, 1e6, &o.peer_timeout_s));
  KOLO_RETURN_IF_ERROR(
      ReadDouble(env, "KOLO_START_TIMEOUT_SECONDS", 1e-3, 1e6, &o.start_timeout_s));
  if (const std::string* v = Find(env, "KOLO_FAULT_INJECT")) {
    KOLO_RETURN_IF_ERROR(ConfigureFaultInjection(*v));
  }
  if (const std::string* v = Find(env, "KOLO_FAULT_SLOW_RING")) {
    KOLO_RETURN_IF_ERROR(ConfigureRingSlowdown(*v));
  }
  KOLO_RETURN_IF_ERROR(ReadDouble(env, "KOLO_STALL_CHECK_SECONDS", 0, 1e6, &o.stall_warning_s));
  KOLO_RETURN_IF_ERROR(ReadDouble(env, "KOLO_STALL_SHUTDOWN_SECONDS", 0, 1e6, &o.stall_shutdown_s));
  if (const std::string* v = Find(env, "KOLO_PS_SERVER_RANKS")) {
    KOLO_ASSIGN_OR_RETURN(o.ps_server_ranks, ParseRankList("KOLO_PS_SERVER_RANKS", *v));
    o.ps_servers = static_cast<int>(o.ps_server_ranks.size());
  }
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_PS_SERVERS", 0, 1 << 20, &o.ps_servers));
  if (const std::string* v = Find(env, "KOLO_PS_PLACEMENT")) o.ps_placement = *v;
  if (const std::string* v = Find(env, "KOLO_PS_PACING")) {
    KOLO_ASSIGN_OR_RETURN(o.ps_pacing_bits_per_s, ParseBitRate("KOLO_PS_PACING", *v));
  }
  KOLO_RETURN_IF_ERROR(o.Validate());
  SetLogLevel(o.log_level);
  for (const std::string& key : UnknownKoloVariables(env)) {
    KOLO_LOG(kWarning, "ignoring unknown environment variable {} (see README for the KOLO_* list)",
             key);
  }
  return o;
}

StatusOr<Options> OptionsFromEnvironment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = kv.substr(0, eq);
    if (IsLaunchVariable(key)) env[key] = kv.substr(eq + 1);
  }
  return OptionsFromEnvironment(env);
}

}  // namespace kolo
