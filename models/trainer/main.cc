// kolo-train: see models/trainer/train_run.h and `kolo-train --help`.
#include <time.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <thread>

#include "kolo/config.h"
#include "kolo/git_commit.h"  // generated at build time (cmake/GitCommit.cmake)
#if KOLO_HAVE_MPI
#include "engine/bootstrap/mpi/mpi_env.h"
#endif
#include "models/trainer/train_flags.h"
#include "models/trainer/train_run.h"

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_first_signal{0};
// When the first signal came, on the steady clock (CLOCK_MONOTONIC, ns); 0 before one.
std::atomic<int64_t> g_stop_ns{0};

// The first SIGINT/SIGTERM asks every phase to stop after its current step; the same signal again
// restores the default action and re-raises, for a user who does not want to wait. A different one
// is not a repeat: a terminal's Ctrl-C reaches the ranks under mpirun as SIGINT and, forwarded by
// mpirun, as SIGTERM.
void OnSignal(int sig) {
  int none = 0;
  if (g_first_signal.compare_exchange_strong(none, sig)) {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe; steady_clock's clock on Linux
    g_stop_ns.store(static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec);
  }
  if (g_stop.exchange(true) && g_first_signal.load() == sig) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

void InstallHandlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace

int main(int argc, char** argv) {
  InstallHandlers();
  kolo::models::trainer::ParsedFlags flags = kolo::models::trainer::ParseTrainFlags(argc, argv);
  if (!flags.options) return flags.exit_code;
  const int code =
      kolo::models::trainer::RunTraining(*flags.options, g_stop, KOLO_GIT_COMMIT, &g_stop_ns);
#if KOLO_HAVE_MPI
  // Under mpirun a failed rank ends the job: MPI_Finalize would wait for a peer that stopped
  // answering, for ever if it never resumes. Rank 0 has written the record by now; the others give
  // it a moment to, since the abort takes every rank down.
  if (code == kolo::models::trainer::kExitFailed) {
    if (flags.options->engine.rank != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    kolo::bootstrap::mpi::AbortWorldIfInitialized(code);
  }
#endif
  return code;
}
