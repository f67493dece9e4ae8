#include "engine/common/launch_env.h"

#include <cctype>
#include <cstdint>

#include "engine/common/options.h"

namespace kolo {
namespace {

constexpr int64_t kMaxRanks = 1 << 20;

const std::string* Find(const std::map<std::string, std::string>& env, const char* key) {
  auto it = env.find(key);
  return it == env.end() ? nullptr : &it->second;
}

// Reads env[key] into *out, a whole number in [min, max]; `required` says whether its absence is
// an error, and `launch` names the launcher for that error.
Status ReadNumber(const std::map<std::string, std::string>& env, const char* key, int64_t min,
                  int64_t max, bool required, const char* launch, int* out) {
  const std::string* v = Find(env, key);
  if (v == nullptr) {
    if (!required) return Status::OK();
    return InvalidArgument("{} sets no {}: this process cannot tell where it is in the job", launch,
                           key);
  }
  KOLO_ASSIGN_OR_RETURN(const int64_t n, ParseInt(key, *v, min, max));
  *out = static_cast<int>(n);
  return Status::OK();
}

Status CheckPlace(const LaunchPlace& p, const char* launch) {
  if (p.rank >= p.size) {
    return InvalidArgument("{}: rank {} is outside [0, {}) for a job of {} ranks", launch, p.rank,
                           p.size, p.size);
  }
  if (p.local_size > p.size || p.local_rank >= p.local_size) {
    return InvalidArgument("{}: local rank {} of {} on this host does not fit a job of {} ranks",
                           launch, p.local_rank, p.local_size, p.size);
  }
  return Status::OK();
}

// The variables a launcher names its ranks by: the job's size and this rank, required (the rank
// only where `rank_required`), and this host's share, which defaults to the whole job.
struct PlaceNames {
  const char* size;
  const char* rank;
  bool rank_required;
  const char* local_size;
  const char* local_rank;
};

Status ReadPlace(const std::map<std::string, std::string>& env, const PlaceNames& names,
                 const char* launch, LaunchPlace* p) {
  KOLO_RETURN_IF_ERROR(ReadNumber(env, names.size, 1, kMaxRanks, true, launch, &p->size));
  KOLO_RETURN_IF_ERROR(
      ReadNumber(env, names.rank, 0, kMaxRanks, names.rank_required, launch, &p->rank));
  p->local_size = p->size;
  p->local_rank = p->rank;
  KOLO_RETURN_IF_ERROR(
      ReadNumber(env, names.local_size, 1, kMaxRanks, false, launch, &p->local_size));
  return ReadNumber(env, names.local_rank, 0, kMaxRanks, false, launch, &p->local_rank);
}

StatusOr<LaunchPlace> ReadSrun(const std::map<std::string, std::string>& env) {
  const char* launch = "srun (a Slurm job step)";
  LaunchPlace p;
  p.launcher = "srun";
  KOLO_RETURN_IF_ERROR(
      ReadNumber(env, "SLURM_STEP_NUM_TASKS", 1, kMaxRanks, true, launch, &p.size));
  KOLO_RETURN_IF_ERROR(ReadNumber(env, "SLURM_PROCID", 0, kMaxRanks, true, launch, &p.rank));
  KOLO_RETURN_IF_ERROR(ReadNumber(env, "SLURM_LOCALID", 0, kMaxRanks, true, launch, &p.local_rank));
  int node = 0;
  KOLO_RETURN_IF_ERROR(ReadNumber(env, "SLURM_NODEID", 0, kMaxRanks, true, launch, &node));
  const std::string* per_node = Find(env, "SLURM_STEP_TASKS_PER_NODE");
  if (per_node == nullptr) {
    return InvalidArgument(
        "{} sets no SLURM_STEP_TASKS_PER_NODE: cannot tell how many ranks share "
        "this node",
        launch);
  }
  KOLO_ASSIGN_OR_RETURN(p.local_size, SlurmTasksOnNode(*per_node, node));
  KOLO_RETURN_IF_ERROR(CheckPlace(p, launch));
  if (const std::string* addr = Find(env, "KOLO_STORE_ADDR")) {
    p.serve_store_addr = *addr;
    return p;
  }
  const std::string* nodes = Find(env, "SLURM_STEP_NODELIST");
  if (nodes == nullptr) {
    return InvalidArgument(
        "{} sets no SLURM_STEP_NODELIST: cannot tell which node serves the "
        "rendezvous; set KOLO_STORE_ADDR=host:port",
        launch);
  }
  KOLO_ASSIGN_OR_RETURN(const std::string first, FirstSlurmHost(*nodes));
  int port = 0;
  if (Find(env, "KOLO_STORE_PORT") != nullptr) {
    KOLO_RETURN_IF_ERROR(ReadNumber(env, "KOLO_STORE_PORT", 1, 65535, true, launch, &port));
  } else {
    int job = 0, step = 0;
    KOLO_RETURN_IF_ERROR(ReadNumber(env, "SLURM_JOB_ID", 0, INT32_MAX, true, launch, &job));
    KOLO_RETURN_IF_ERROR(ReadNumber(env, "SLURM_STEP_ID", 0, INT32_MAX, false, launch, &step));
    port = 29400 + static_cast<int>((static_cast<int64_t>(job) * 31 + step) % 2000);
  }
  p.serve_store_addr = first + ":" + std::to_string(port);
  return p;
}

StatusOr<LaunchPlace> ReadHydra(const std::map<std::string, std::string>& env) {
  const char* launch = "mpiexec (MPICH or Intel MPI, PMI_RANK set)";
  LaunchPlace p;
  p.launcher = "hydra";
  KOLO_RETURN_IF_ERROR(ReadPlace(
      env, {"PMI_SIZE", "PMI_RANK", true, "MPI_LOCALNRANKS", "MPI_LOCALRANKID"}, launch, &p));
  KOLO_RETURN_IF_ERROR(CheckPlace(p, launch));
  const std::string* addr = Find(env, "KOLO_STORE_ADDR");
  if (addr == nullptr) {
    return InvalidArgument(
        "{}: set KOLO_STORE_ADDR=host:port, the address where rank 0 serves the rendezvous (its "
        "host and a free port), and KOLO_JOB_SECRET for every rank (e.g. mpiexec -genv "
        "KOLO_STORE_ADDR node01:29400 -genv KOLO_JOB_SECRET $(head -c16 /dev/urandom | od -An "
        "-tx1 | tr -d ' \\n') ...)",
        launch);
  }
  p.serve_store_addr = *addr;
  return p;
}

}  // namespace

StatusOr<int> SlurmTasksOnNode(const std::string& tasks_per_node, int node) {
  // Entries "N" or "N(xR)", comma-separated.
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(
        "SLURM_STEP_TASKS_PER_NODE='{}' is malformed ({}): allowed is a comma-separated list of "
        "N or N(xR), e.g. 4(x2),3",
        tasks_per_node, why);
  };
  if (node < 0) return bad("negative node index");
  size_t i = 0;
  int64_t first_node = 0;
  const std::string& s = tasks_per_node;
  const auto number = [&](int64_t* out) {
    size_t start = i;
    int64_t v = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])) && i - start < 9) {
      v = v * 10 + (s[i++] - '0');
    }
    *out = v;
    return i > start;
  };
  int found = 0;  // the tasks on `node`, once the whole list has been read and checked
  for (;;) {
    int64_t tasks = 0, repeat = 1;
    if (!number(&tasks) || tasks < 1) return bad("a task count must be a whole number >= 1");
    if (i < s.size() && s[i] == '(') {
      if (s.compare(i, 2, "(x") != 0) return bad("a repeat is written (xR)");
      i += 2;
      if (!number(&repeat) || repeat < 1 || i >= s.size() || s[i] != ')') {
        return bad("a repeat is written (xR) with R >= 1");
      }
      ++i;
    }
    if (found == 0 && node < first_node + repeat) found = static_cast<int>(tasks);
    first_node += repeat;
    if (i == s.size()) break;
    if (s[i] != ',') return bad(fmt::format("unexpected '{}'", s[i]));
    ++i;
  }
  if (found > 0) return found;
  return InvalidArgument("SLURM_STEP_TASKS_PER_NODE='{}' lists {} node(s), but SLURM_NODEID is {}",
                         tasks_per_node, first_node, node);
}

StatusOr<std::string> FirstSlurmHost(const std::string& nodelist) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(
        "SLURM_STEP_NODELIST='{}' is malformed ({}): allowed are host names and ranges such as "
        "gpu[07-10,12],cpu1",
        nodelist, why);
  };
  size_t end = 0;
  while (end < nodelist.size() && nodelist[end] != ',' && nodelist[end] != '[') ++end;
  const std::string prefix = nodelist.substr(0, end);
  if (end == nodelist.size() || nodelist[end] == ',') {
    if (prefix.empty()) return bad("no host name");
    return prefix;
  }
  // A bracketed range: the first entry's first value, with its zero padding.
  size_t j = end + 1;
  size_t digits = j;
  while (digits < nodelist.size() && std::isdigit(static_cast<unsigned char>(nodelist[digits]))) {
    ++digits;
  }
  if (digits == j) return bad("a range must start with a number");
  if (digits >= nodelist.size() ||
      (nodelist[digits] != '-' && nodelist[digits] != ',' && nodelist[digits] != ']')) {
    return bad("unterminated range");
  }
  if (nodelist.find(']', digits) == std::string::npos) return bad("no closing ]");
  if (prefix.empty()) return bad("a range needs a host name before it");
  return prefix + nodelist.substr(j, digits - j);
}

Status RequireServedStoreSecret(const std::string& launcher, const std::string& serve_store_addr,
                                const std::string& job_secret) {
  if (serve_store_addr.empty() || !job_secret.empty()) return Status::OK();
  return InvalidArgument(
      "launched by {} with rank 0 serving the rendezvous at {}, but KOLO_JOB_SECRET is not set: "
      "every rank must know the job's secret; export it before launching (e.g. export "
      "KOLO_JOB_SECRET=$(head -c16 /dev/urandom | od -An -tx1 | tr -d ' \\n'); srun and mpiexec "
      "pass the environment on)",
      launcher, serve_store_addr);
}

bool IsLaunchVariable(const std::string& key) {
  return key.rfind("KOLO_", 0) == 0 || key.rfind("OMPI_COMM_WORLD_", 0) == 0 ||
         key.rfind("SLURM_", 0) == 0 || key.rfind("PMI_", 0) == 0 || key.rfind("MPI_LOCAL", 0) == 0;
}

StatusOr<LaunchPlace> ReadLaunchPlace(const std::map<std::string, std::string>& env) {
  LaunchPlace p;
  if (Find(env, "OMPI_COMM_WORLD_SIZE") != nullptr) {
    p.launcher = "mpirun";
    KOLO_RETURN_IF_ERROR(ReadPlace(env,
                                   {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", true,
                                    "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
                                   "mpirun (Open MPI)", &p));
    return p;
  }
  if (Find(env, "KOLO_SIZE") != nullptr) {
    p.launcher = "kolo-run";
    KOLO_RETURN_IF_ERROR(
        ReadPlace(env, {"KOLO_SIZE", "KOLO_RANK", false, "KOLO_LOCAL_SIZE", "KOLO_LOCAL_RANK"},
                  "kolo-run (KOLO_SIZE set)", &p));
    return p;
  }
  if (Find(env, "SLURM_STEP_NUM_TASKS") != nullptr && Find(env, "SLURM_PROCID") != nullptr) {
    return ReadSrun(env);
  }
  if (Find(env, "PMI_RANK") != nullptr && Find(env, "PMI_SIZE") != nullptr) return ReadHydra(env);
  return p;
}

}  // namespace kolo
