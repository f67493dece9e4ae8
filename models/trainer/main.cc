// kolo-train: see models/trainer/train_run.h and `kolo-train --help`.
#include <csignal>
#include <cstring>

#include "models/trainer/train_flags.h"
#include "models/trainer/train_run.h"

#ifndef KOLO_GIT_COMMIT
#define KOLO_GIT_COMMIT "unknown"
#endif

namespace {

std::atomic<bool> g_stop{false};

// The first SIGINT/SIGTERM asks every phase to stop after its current step; a second one restores
// the default action and re-raises, for a user who does not want to wait.
void OnSignal(int sig) {
  if (g_stop.exchange(true)) {
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
  return kolo::models::trainer::RunTraining(*flags.options, g_stop, KOLO_GIT_COMMIT);
}
