// The benchmark's MPI pieces: the control channel under mpirun and the `mpi-direct` peer.
//
// Compiled only in builds with MPI; this header does not include <mpi.h>. Every function here
// REQUIRES MPI to be initialised (kolo::bootstrap::mpi::EnsureInitialized) and not finalised, and
// every object must be destroyed before MPI_Finalize (they free their duplicated communicators).
#pragma once

#include <memory>
#include <string>

#include "benchmarks/allreduce_bench/backend.h"
#include "benchmarks/allreduce_bench/control.h"
#include "engine/common/status.h"

namespace kolo::bench::mpi {

// Barrier and gathers over a duplicate of MPI_COMM_WORLD.
StatusOr<std::unique_ptr<Control>> MakeMpiControl();

// `mpi-direct`: MPI_Allreduce(MPI_IN_PLACE, buf) on a duplicate of MPI_COMM_WORLD with MPI's
// built-in sum (float16/bfloat16 through a user op on kolo's reduction kernel, as MPI has no such
// types);
// `--op avg` scales the sum by 1/ranks afterwards, inside the timed call, as a trainer would.
StatusOr<std::unique_ptr<Backend>> MakeMpiDirect(const BenchConfig& config);

// Open MPI's "btl" control variable, read through the MPI tool interface: the byte transfer
// layers the job was told to use ("self,vader"), "default" if unset, "unknown" if it cannot be
// read.
std::string BtlSelection();

// MPI_Abort on MPI_COMM_WORLD if MPI is initialised and not finalised; otherwise returns.
void AbortWorld(int exit_code);

}  // namespace kolo::bench::mpi
