// One kolo-train run of one rank: builds the model and the compute backend, starts the engine,
// broadcasts rank 0's initial weights, trains warm-up and timed steps on synthetic data, prints
// progress and results (rank 0), and writes the JSON record and the replay profile (rank 0).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "models/trainer/train_flags.h"

namespace kolo::models::trainer {

// Exit codes of kolo-train.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadFlags = 2;
inline constexpr int kExitInterrupted = 130;

// Runs training with `options`. `stop` is polled between steps (and between set-up phases): once it
// is true the rank finishes its current step, shuts the engine down and returns kExitInterrupted,
// with a record saying status=failed, error="interrupted". `kolo_commit` goes into the record and
// the profile. Errors are printed to stderr by the rank that sees them.
// `stop_ns`, when given, holds the steady clock's time (ns since its epoch) of the signal that set
// `stop` (0 before one): an engine failure from before it is the run's error, not "interrupted".
int RunTraining(const TrainOptions& options, const std::atomic<bool>& stop,
                const std::string& kolo_commit, const std::atomic<int64_t>* stop_ns = nullptr);

// Where this process's RunTraining is, for a message after a signal: "start-up (...)", "step N of
// M", "shutting down". Thread-safe.
std::string CurrentPhase();
// "rank N" once the rank is known ("worker N", "server N" under parameter servers), else "rank ?".
std::string WhoForSignals();

}  // namespace kolo::models::trainer
