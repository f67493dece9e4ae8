// kolo-run: starts N local ranks of a kolo program without MPI.
//
//   kolo-run -np N [--timeout-s S] [--iface X] [--bind-to none|core|hwthread]
//            [--report-bindings] [--] CMD ARGS...
//
// The launcher hosts the rendezvous store (a TcpStoreServer on 127.0.0.1 with a fresh job secret)
// and starts every rank with KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE,
// KOLO_STORE_ADDR and KOLO_JOB_SECRET set (KOLO_IFACE too with --iface). Ranks inherit stdin,
// stdout and stderr unchanged. When a rank fails (non-zero exit or a signal), the launcher says
// which, gives the others a few seconds to fail on their own (so that each reports the loss it saw,
// not the launcher's signal), then sends SIGTERM and SIGKILL after a grace period (a stopped rank,
// which cannot act on SIGTERM, gets SIGKILL at once), and exits non-zero; the exit code is the
// failing rank's code (128 + signal if it was killed), 124 on --timeout-s, or 128 + signal when the
// launcher itself was interrupted. Each rank runs in its own process group, which is killed as a
// whole, and dies with the launcher (PR_SET_PDEATHSIG).
//
// --bind-to core binds rank r to the r-th core of the launcher's own CPU set (all of that core's
// hardware threads), hwthread to the r-th hardware thread; with more ranks than cores they wrap
// round, sharing cores (said on stderr). none (the default) leaves the ranks to the scheduler.
// mpirun binds to cores by default for up to 2 ranks; on a small host, where the ring's copies on
// loopback are all CPU work, bound ranks train a few percent faster (README, kolo-run).
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/bootstrap/rendezvous.h"
#include "engine/bootstrap/tcp_store.h"
#include "engine/common/file.h"

extern char** environ;

namespace {

// A number from a sysfs file (a CPU's package or core id), or -1 when it cannot be read.
long ReadSysfsNumber(const std::string& path) {
  auto text = kolo::ReadFileBounded(path, 64, "CPU topology");
  if (!text.ok()) return -1;
  try {
    return std::stol(*text);
  } catch (const std::exception&) {
    return -1;
  }
}

using kolo::bootstrap::Clock;
constexpr auto kSettle = std::chrono::seconds(3);      // a rank failed -> SIGTERM to the rest
constexpr auto kKillGrace = std::chrono::seconds(5);   // SIGTERM -> SIGKILL
constexpr auto kReapBound = std::chrono::seconds(10);  // SIGKILL -> give up waiting

void Say(const std::string& text) {
  const std::string line = "kolo-run: " + text + "\n";
  [[maybe_unused]] ssize_t w = ::write(STDERR_FILENO, line.data(), line.size());
}

bool IsLauncherOption(const std::string& a) {
  return a == "-n" || a == "--np" || a == "--timeout-s" || a == "--iface" || a == "--bind-to" ||
         a == "-H" || a == "--host" || a == "--hosts" || a == "--hostfile";
}

// Splits argv into the launcher's own arguments (with "-np" spelled "--np", which CLI11 accepts)
// and the command, which starts at the first word that is not an option or an option's value.
void SplitArgs(int argc, char** argv, std::vector<std::string>* own,
               std::vector<std::string>* command) {
  own->push_back(argv[0]);
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.size() < 2 || a[0] != '-') break;
    if (a == "-np") a = "--np";
    if (a.rfind("-np=", 0) == 0) a = "-" + a;
    own->push_back(a);
    if (IsLauncherOption(a) && i + 1 < argc) own->push_back(argv[++i]);
  }
  for (; i < argc; ++i) command->push_back(argv[i]);
}

// The executable that execve should run: `name` itself if it has a slash, else the first match on
// PATH. Resolved before fork, because only async-signal-safe calls may follow fork.
std::string FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

bool IsRankVariable(const std::string& name) {
  static const char* kNames[] = {"KOLO_RANK",       "KOLO_SIZE",       "KOLO_LOCAL_RANK",
                                 "KOLO_LOCAL_SIZE", "KOLO_STORE_ADDR", "KOLO_JOB_SECRET"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  // A kolo-run started under mpirun must not let its ranks believe mpirun launched them.
  return name.rfind("OMPI_COMM_WORLD_", 0) == 0;
}

// The CPUs of this process's affinity mask in binding units: one per core (the hardware threads
// sharing it, by topology/{physical_package_id,core_id} in sysfs; a CPU whose topology cannot be
// read counts as a core of its own) or one per hardware thread. Empty with `error` set on failure.
std::vector<std::vector<int>> BindingUnits(const std::string& bind_to, std::string* error) {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (::sched_getaffinity(0, sizeof(mine), &mine) != 0) {
    *error = fmt::format("sched_getaffinity failed: {}", std::strerror(errno));
    return {};
  }
  std::vector<std::vector<int>> units;
  std::map<std::pair<long, long>, size_t> core_unit;  // (package, core) -> index in units
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mine)) continue;
    long package = -1, core = -1;
    if (bind_to == "core") {
      const std::string topo = fmt::format("/sys/devices/system/cpu/cpu{}/topology/", cpu);
      package = ReadSysfsNumber(topo + "physical_package_id");
      core = ReadSysfsNumber(topo + "core_id");
    }
    if (core < 0) {
      units.push_back({cpu});
      continue;
    }
    auto [it, fresh] = core_unit.emplace(std::make_pair(package, core), units.size());
    if (fresh) units.emplace_back();
    units[it->second].push_back(cpu);
  }
  if (units.empty()) *error = "the launcher's CPU affinity mask is empty";
  return units;
}

std::string CpuList(const std::vector<int>& cpus) {
  return fmt::format("{}", fmt::join(cpus, ","));
}

class Launcher {
 public:
  // `binding` holds each rank's CPUs (empty: no binding).
  Launcher(int np, double timeout_s, std::vector<std::vector<int>> binding)
      : np_(np), timeout_s_(timeout_s), binding_(std::move(binding)) {}

  // Runs the job to completion and returns the launcher's exit code.
  int Run(const std::string& exe, const std::vector<std::string>& command,
          const std::vector<std::string>& base_env, const std::string& store_addr,
          const std::string& secret, int signal_fd);

 private:
  bool Spawn(int rank, const std::string& exe, const std::vector<std::string>& command,
             const std::vector<std::string>& env, const cpu_set_t* cpus);
  void Reap();
  void SignalAll(int sig);
  // SIGTERM to every rank, SIGKILL to a stopped one (it cannot act on SIGTERM).
  void TerminateAll();
  // Stops the job with `exit_code`: SIGTERM to every rank after `settle` (a rank failed: the rest
  // may notice by themselves first), SIGKILL kKillGrace later.
  void BeginTermination(int exit_code, Clock::duration settle = Clock::duration::zero());
  void OnSignal(int sig);

  const int np_;
  const double timeout_s_;
  const std::vector<std::vector<int>> binding_;
  std::map<pid_t, int> alive_;  // pid (= its process group) -> rank
  std::vector<pid_t> groups_;   // every rank's process group, alive or not
  bool terminating_ = false;
  int exit_code_ = 0;
  Clock::time_point term_at_ = Clock::time_point::max();  // SIGTERM not sent yet while set
  Clock::time_point kill_at_ = Clock::time_point::max();
  Clock::time_point give_up_at_ = Clock::time_point::max();
};

bool Launcher::Spawn(int rank, const std::string& exe, const std::vector<std::string>& command,
                     const std::vector<std::string>& env, const cpu_set_t* cpus) {
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  // The child reports a failed execve (errno) or binding (-errno) through this pipe; a successful
  // execve closes it (CLOEXEC).
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    Say(fmt::format("rank {}: pipe2 failed: {}", rank, std::strerror(errno)));
    return false;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    Say(fmt::format("rank {}: fork failed: {}", rank, std::strerror(errno)));
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    return false;
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::close(pipe_fds[0]);
    int err = 0;
    if (cpus != nullptr && ::sched_setaffinity(0, sizeof(*cpus), cpus) != 0) {
      err = -errno;
    } else {
      ::execve(exe.c_str(), argv.data(), envp.data());
      err = errno;
    }
    [[maybe_unused]] ssize_t w = ::write(pipe_fds[1], &err, sizeof(err));
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before we might signal it
  ::close(pipe_fds[1]);
  alive_[pid] = rank;
  groups_.push_back(pid);
  int err = 0;
  ssize_t r;
  do {
    r = ::read(pipe_fds[0], &err, sizeof(err));
  } while (r < 0 && errno == EINTR);
  ::close(pipe_fds[0]);
  if (r == static_cast<ssize_t>(sizeof(err))) {
    if (err < 0) {
      Say(fmt::format("rank {}: cannot bind to CPUs {}: {}", rank,
                      CpuList(binding_[static_cast<size_t>(rank)]), std::strerror(-err)));
    } else {
      Say(fmt::format("rank {}: cannot execute '{}': {}", rank, exe, std::strerror(err)));
    }
    return false;
  }
  return true;
}

void Launcher::SignalAll(int sig) {
  for (const auto& [pid, rank] : alive_) ::kill(-pid, sig);
}

// True when the process is stopped (SIGSTOP, or a tracer's stop): it cannot act on SIGTERM.
bool IsStopped(pid_t pid) {
  auto stat = kolo::ReadFileBounded(fmt::format("/proc/{}/stat", pid), 4096, "process status");
  if (!stat.ok()) return false;
  // "pid (comm) S ...": the state follows the last ')' (comm may hold parentheses).
  const size_t close = stat->rfind(')');
  return close != std::string::npos && close + 2 < stat->size() && (*stat)[close + 1] == ' ' &&
         ((*stat)[close + 2] == 'T' || (*stat)[close + 2] == 't');
}

void Launcher::TerminateAll() {
  for (const auto& [pid, rank] : alive_) {
    if (IsStopped(pid)) {
      // A stopped rank would sit on SIGTERM until the grace period ends; it cannot shut down
      // cleanly anyway.
      Say(fmt::format("rank {} is stopped (SIGSTOP or a debugger); sending SIGKILL", rank));
      ::kill(-pid, SIGKILL);
    } else {
      ::kill(-pid, SIGTERM);
    }
  }
}

void Launcher::BeginTermination(int exit_code, Clock::duration settle) {
  if (terminating_) return;
  terminating_ = true;
  exit_code_ = exit_code;
  if (settle > Clock::duration::zero()) {
    term_at_ = Clock::now() + settle;
    kill_at_ = term_at_ + kKillGrace;
    return;
  }
  TerminateAll();
  kill_at_ = Clock::now() + kKillGrace;
}

void Launcher::Reap() {
  for (;;) {
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    if (pid <= 0) return;
    auto it = alive_.find(pid);
    if (it == alive_.end()) continue;
    const int rank = it->second;
    alive_.erase(it);
    if (terminating_) continue;  // stopped by us; the cause was already reported
    if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
      Say(
          fmt::format("rank {} exited with code {}; stopping the other {} ranks ({} s to stop on "
                      "their own, then SIGTERM)",
                      rank, WEXITSTATUS(st), alive_.size(), kSettle.count()));
      BeginTermination(WEXITSTATUS(st), kSettle);
    } else if (WIFSIGNALED(st)) {
      Say(
          fmt::format("rank {} killed by signal {} ({}); stopping the other {} ranks ({} s to stop "
                      "on their own, then SIGTERM)",
                      rank, WTERMSIG(st), strsignal(WTERMSIG(st)), alive_.size(), kSettle.count()));
      BeginTermination(128 + WTERMSIG(st), kSettle);
    }
  }
}

void Launcher::OnSignal(int sig) {
  // (While the ranks are given time to stop on their own, an interrupt is forwarded at once.)
  if (terminating_ && term_at_ == Clock::time_point::max()) {
    // A second interrupt while the ranks are being stopped: stop waiting for them.
    Say(fmt::format("received {} again; sending SIGKILL to {} ranks", strsignal(sig),
                    alive_.size()));
    SignalAll(SIGKILL);
    kill_at_ = Clock::now();
    return;
  }
  Say(fmt::format("received {}; forwarding it to {} ranks", strsignal(sig), alive_.size()));
  SignalAll(sig);
  term_at_ = Clock::time_point::max();
  if (!terminating_) exit_code_ = 128 + sig;  // a rank's failure, when there was one, stays first
  terminating_ = true;
  kill_at_ = Clock::now() + kKillGrace;
}

int Launcher::Run(const std::string& exe, const std::vector<std::string>& command,
                  const std::vector<std::string>& base_env, const std::string& store_addr,
                  const std::string& secret, int signal_fd) {
  for (int rank = 0; rank < np_; ++rank) {
    std::vector<std::string> env = base_env;
    env.push_back(fmt::format("KOLO_RANK={}", rank));
    env.push_back(fmt::format("KOLO_SIZE={}", np_));
    env.push_back(fmt::format("KOLO_LOCAL_RANK={}", rank));
    env.push_back(fmt::format("KOLO_LOCAL_SIZE={}", np_));
    env.push_back("KOLO_STORE_ADDR=" + store_addr);
    env.push_back("KOLO_JOB_SECRET=" + secret);
    cpu_set_t set;
    CPU_ZERO(&set);
    if (!binding_.empty()) {
      for (int cpu : binding_[static_cast<size_t>(rank)]) CPU_SET(cpu, &set);
    }
    if (!Spawn(rank, exe, command, env, binding_.empty() ? nullptr : &set)) {
      BeginTermination(127);
      break;
    }
  }
  const auto job_deadline =
      timeout_s_ > 0
          ? Clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeout_s_ * 1e6))
          : Clock::time_point::max();
  while (!alive_.empty()) {
    const auto now = Clock::now();
    if (!terminating_ && now >= job_deadline) {
      Say(fmt::format("timed out after {} s (--timeout-s); stopping all {} ranks", timeout_s_,
                      alive_.size()));
      BeginTermination(124);
    }
    if (terminating_ && now >= term_at_) {
      Say(fmt::format("{} ranks still running {} s after the failure; sending SIGTERM",
                      alive_.size(), kSettle.count()));
      TerminateAll();
      term_at_ = Clock::time_point::max();
    }
    if (terminating_ && now >= kill_at_ && give_up_at_ == Clock::time_point::max()) {
      Say(fmt::format("{} ranks still running {} s after SIGTERM; sending SIGKILL", alive_.size(),
                      kKillGrace.count()));
      SignalAll(SIGKILL);
      give_up_at_ = now + kReapBound;
    }
    if (now >= give_up_at_) {
      Say(fmt::format("{} ranks did not exit after SIGKILL (uninterruptible?); giving up",
                      alive_.size()));
      break;
    }
    auto next = std::min({job_deadline, terminating_ ? kill_at_ : Clock::time_point::max(),
                          terminating_ ? term_at_ : Clock::time_point::max(), give_up_at_});
    int wait_ms = -1;
    if (next != Clock::time_point::max()) {
      wait_ms = static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1, 0,
          1 << 30));
    }
    pollfd p{signal_fd, POLLIN, 0};
    const int rc = ::poll(&p, 1, wait_ms);
    if (rc > 0) {
      signalfd_siginfo info;
      while (::read(signal_fd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
        if (info.ssi_signo != SIGCHLD) OnSignal(static_cast<int>(info.ssi_signo));
      }
    }
    Reap();  // SIGCHLDs coalesce, so reap whatever has exited on every wake-up
  }
  // Whatever a rank left behind in its process group goes with it.
  for (pid_t g : groups_) ::kill(-g, SIGKILL);
  return exit_code_;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> own;
  std::vector<std::string> command;
  SplitArgs(argc, argv, &own, &command);

  CLI::App app{"kolo-run: start N local ranks of a kolo program without MPI"};
  app.footer(
      "Usage: kolo-run -np N [--timeout-s S] [--iface X] [--bind-to none|core|hwthread] "
      "[--report-bindings] [--] CMD ARGS...");
  int np = 0;
  double timeout_s = 0;
  std::string iface;
  std::string bind_to = "none";
  bool report_bindings = false;
  app.add_option("-n,--np", np, "number of ranks to start (also -np)")
      ->required()
      ->check(CLI::Range(1, 4096));
  auto* timeout = app.add_option("--timeout-s", timeout_s,
                                 "stop every rank after this many seconds, in (0, 10000000]");
  app.add_option("--iface", iface, "interface or IPv4 address the ranks listen on (KOLO_IFACE)");
  app.add_option("--bind-to", bind_to,
                 "bind each rank to a core or a hardware thread of the launcher's CPUs, in rank "
                 "order, wrapping round when ranks outnumber them: none (default), core, hwthread");
  app.add_flag("--report-bindings", report_bindings, "print each rank's CPUs on stderr");
  // Cluster launchers' host options, accepted only to say that kolo-run is not one.
  std::string hosts;
  app.add_option("-H,--host,--hosts,--hostfile", hosts,
                 "refused: kolo-run starts ranks on this host only")
      ->group("");
  std::vector<const char*> own_argv;
  for (const auto& a : own) own_argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(own_argv.size()), own_argv.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // A bad command line exits 2, as every kolo tool does (CLI11's own codes are 100 and up).
    Say(fmt::format("{}; see kolo-run --help", e.what()));
    return 2;
  }
  if (!hosts.empty()) {
    Say(fmt::format(
        "kolo-run starts every rank on this host; it is not a cluster launcher and takes no host "
        "list ('{}'). Across hosts use mpirun (mpirun -np N -H h1:4,h2:4 ...), srun, or mpiexec "
        "(MPICH, Intel MPI): kolo's ranks find their place under each",
        hosts));
    return 2;
  }
  if (timeout->count() > 0 && !(timeout_s > 0 && timeout_s <= 1e7)) {
    Say(fmt::format("--timeout-s {} is not allowed; allowed: seconds in (0, 10000000]", timeout_s));
    return 2;
  }
  if (bind_to != "none" && bind_to != "core" && bind_to != "hwthread") {
    Say(fmt::format("--bind-to '{}' is not allowed; allowed: none, core, hwthread", bind_to));
    return 2;
  }
  if (command.empty()) {
    Say("no command given. Usage: kolo-run -np N [--timeout-s S] [--iface X] [--bind-to B] [--] "
        "CMD ARGS...");
    return 2;
  }
  std::vector<std::vector<int>> binding;
  if (bind_to != "none") {
    std::string error;
    const auto units = BindingUnits(bind_to, &error);
    if (units.empty()) {
      Say(fmt::format("--bind-to {}: {}", bind_to, error));
      return 1;
    }
    for (int r = 0; r < np; ++r) binding.push_back(units[static_cast<size_t>(r) % units.size()]);
    if (static_cast<size_t>(np) > units.size()) {
      Say(fmt::format("{} ranks on {} {}s: bound round-robin, so ranks share them", np,
                      units.size(), bind_to));
    }
  }
  if (report_bindings) {
    for (int r = 0; r < np; ++r) {
      Say(binding.empty() ? fmt::format("rank {}: not bound", r)
                          : fmt::format("rank {} bound to CPU(s) {}", r,
                                        CpuList(binding[static_cast<size_t>(r)])));
    }
  }
  const std::string exe = FindExecutable(command[0]);
  if (exe.empty()) {
    Say(fmt::format("command '{}' not found or not executable", command[0]));
    return 127;
  }

  // Signals are handled synchronously through a signalfd; block them before any thread starts so
  // that the store's thread inherits the mask and never takes them.
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&mask, s);
  ::sigprocmask(SIG_BLOCK, &mask, nullptr);
  const int signal_fd = ::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) {
    Say(fmt::format("signalfd failed: {}", std::strerror(errno)));
    return 1;
  }

  kolo::bootstrap::TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  so.secret = kolo::bootstrap::GenerateSecret();
  auto server = kolo::bootstrap::TcpStoreServer::Start(so);
  if (!server.ok()) {
    Say("cannot start the rendezvous store: " + server.status().ToString());
    return 1;
  }

  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    const std::string name = kv.substr(0, kv.find('='));
    if (IsRankVariable(name) || (!iface.empty() && name == "KOLO_IFACE")) continue;
    env.push_back(kv);
  }
  if (!iface.empty()) env.push_back("KOLO_IFACE=" + iface);

  Launcher launcher(np, timeout_s, std::move(binding));
  const int code = launcher.Run(exe, command, env, (*server)->address(), so.secret, signal_fd);
  (*server)->Stop();
  return code;
}
