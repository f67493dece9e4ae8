// kolo-train: see models/trainer/train_run.h and `kolo-train --help`.
#include <semaphore.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
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
// Posted by the first signal (sem_post is async-signal-safe) for the stop deadline's thread.
sem_t g_signalled;
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
    sem_post(&g_signalled);
  }
  if (g_stop.exchange(true) && g_first_signal.load() == sig) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

// A rank ends within a second of the first signal, whatever it is doing. A step finishes and the
// engine shuts down in far less when all is well (the record then says "interrupted"), but a rank
// blocked in start-up (waiting for a peer that never comes, or was killed) or in a collective whose
// peer stopped (an MPI call has no way out) would otherwise wait out the peer timeout, or for ever.
// In start-up no step has run and nothing is lost: that rank ends sooner.
constexpr std::chrono::milliseconds kStopDeadline(600);
constexpr std::chrono::milliseconds kStartUpStopDeadline(250);

// Waits for the first signal, then until the deadline; if the process is still here then, says
// where it was and ends it (without MPI_Finalize, which would wait for peers, and without
// destructors, which may block on them too).
void EnforceStopDeadline() {
  while (sem_wait(&g_signalled) != 0 && errno == EINTR) {
  }
  const auto signalled = std::chrono::steady_clock::now();
  std::string where;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    where = kolo::models::trainer::CurrentPhase();
    const auto waited = std::chrono::steady_clock::now() - signalled;
    if (waited >= kStopDeadline ||
        (where.rfind("start-up", 0) == 0 && waited >= kStartUpStopDeadline)) {
      break;
    }
  }
  const int sig = g_first_signal.load();
  std::fprintf(stderr, "kolo-train %s: %s during %s; ending now\n",
               kolo::models::trainer::WhoForSignals().c_str(), sig == SIGINT ? "SIGINT" : "SIGTERM",
               where.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  ::_exit(128 + sig);
}

void InstallHandlers() {
  sem_init(&g_signalled, 0, 0);
  std::thread(EnforceStopDeadline).detach();
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
