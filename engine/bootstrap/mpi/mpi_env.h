// MPI start-up for kolo, and the conversion of MPI error codes into Status.
//
// Compiled only in builds with MPI (KOLO_HAVE_MPI). This header does not include <mpi.h>, so that
// code outside engine/**/mpi/ can call it; only the .cc files of mpi/ folders include the vendor
// header.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/status.h"

namespace kolo::bootstrap::mpi {

// Initialises MPI with MPI_THREAD_MULTIPLE unless it is already initialised (by the application or
// an earlier call). Fails if MPI was finalised, or if the thread level MPI provides is lower than
// MPI_THREAD_SERIALIZED (the error names the level). Thread-safe; cheap after the first success.
Status EnsureInitialized();

// Registers, once, an exit handler that calls MPI_Finalize at normal process exit if kolo
// initialised MPI (EnsureInitialized did the MPI_Init_thread) and nobody has finalised it.
void FinalizeAtExit();

// Ends the whole MPI job with `code` (MPI_Abort on MPI_COMM_WORLD) when MPI is initialised and not
// finalised; returns otherwise. For a rank that failed for good: MPI_Finalize would wait for the
// peer that stopped answering, perhaps for ever. Flushes stdout and stderr first.
void AbortWorldIfInitialized(int code);

// Bounds MPI's start-up, which has no timeout of its own: MPI_Init and the collectives right after
// it block until every rank takes part, so a rank that never starts, or stops there, would hold
// the others for ever. If the watchdog is still alive `timeout` after it was made, it logs that
// `what` did not finish (MPI does not say which rank is missing) and ends this rank: MPI_Abort
// once MPI is initialised, otherwise an immediate exit with status 1, which mpirun reports and
// answers by stopping the job.
class StartupWatchdog {
 public:
  StartupWatchdog(std::chrono::milliseconds timeout, int rank, std::string what);
  ~StartupWatchdog();
  StartupWatchdog(const StartupWatchdog&) = delete;
  StartupWatchdog& operator=(const StartupWatchdog&) = delete;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// True if EnsureInitialized performed the initialisation.
bool InitializedByKolo();

// Checks that MPI_COMM_WORLD's rank and size are `rank` and `size` (the values kolo read from the
// launch environment). REQUIRES: EnsureInitialized().ok().
Status CheckWorld(int rank, int size);

// Broadcasts `*data` (any bytes, any length up to 2 GiB) from `root` to every rank of
// MPI_COMM_WORLD; on the other ranks *data is replaced. Collective: every rank must call it.
// REQUIRES: EnsureInitialized().ok().
Status BroadcastString(std::string* data, int root);

// Gathers `mine` (the same number of bytes on every rank) to `root`, which gets every rank's bytes
// in rank order in *all; the other ranks get *all empty. Collective: every rank must call it.
// REQUIRES: EnsureInitialized().ok().
Status GatherFixed(const std::string& mine, int root, std::vector<std::string>* all);

// "<call>: <MPI_Error_string(code)> (MPI error <code>)", as kInternal.
Status MpiErrorStatus(const char* call, int code);

}  // namespace kolo::bootstrap::mpi

// Runs an MPI call; if it does not return MPI_SUCCESS (which the standard fixes at 0), returns a
// Status naming the call and MPI's description of the code from the enclosing function.
#define KOLO_MPI_CHECK(call)                                              \
  do {                                                                    \
    const int kolo_mpi_rc_ = (call);                                      \
    if (kolo_mpi_rc_ != 0) {                                              \
      return ::kolo::bootstrap::mpi::MpiErrorStatus(#call, kolo_mpi_rc_); \
    }                                                                     \
  } while (0)
