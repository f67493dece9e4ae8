// Where a rank is in its job, from the environment its launcher gives it. Read by
// OptionsFromEnvironment (options.h), first match wins:
// - Open MPI's mpirun: OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}. The rendezvous goes over
//   MPI (rendezvous.h).
// - kolo-run: KOLO_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}, with KOLO_STORE_ADDR and KOLO_JOB_SECRET.
// - Slurm's srun (a job step): SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, and the step's
//   tasks per node (SLURM_STEP_TASKS_PER_NODE, e.g. "4(x2),3", indexed by SLURM_NODEID) for the
//   local size. Rank 0 serves the rendezvous store at KOLO_STORE_ADDR, or else on the step's first
//   node (the first name of SLURM_STEP_NODELIST, e.g. "gpu[07-10]" gives gpu07) at port
//   KOLO_STORE_PORT, or else at a port derived from SLURM_JOB_ID and SLURM_STEP_ID (29400 to
//   31399). A batch script's own environment (no SLURM_STEP_NUM_TASKS) is not a launch.
// - MPICH's and Intel MPI's Hydra (mpiexec): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID,
//   MPI_LOCALNRANKS. Rank 0 serves the store at KOLO_STORE_ADDR, which is required (Hydra names no
//   first host).
// Under srun and Hydra every rank must be given the job's secret, KOLO_JOB_SECRET (both pass the
// launching shell's environment on): nothing else can carry it to the ranks safely.
#pragma once

#include <map>
#include <string>

#include "engine/common/status.h"

namespace kolo {

struct LaunchPlace {
  // "mpirun" (Open MPI), "kolo-run", "srun", "hydra" (MPICH / Intel MPI), or "" (no launcher: a
  // single rank).
  std::string launcher;
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  // srun and Hydra: "host:port" where rank 0 serves the rendezvous store (empty otherwise: then
  // KOLO_STORE_ADDR, if any, is read as before).
  std::string serve_store_addr;
};

// Reads the launch variables of `env` (the whole environment, or at least its KOLO_*, OMPI_*,
// SLURM_*, PMI_* and MPI_LOCAL* entries). InvalidArgument naming the variable, its value and what
// is allowed when one is malformed or missing.
StatusOr<LaunchPlace> ReadLaunchPlace(const std::map<std::string, std::string>& env);

// The number of tasks on node `node` of a Slurm tasks-per-node list ("4(x2),3": 4 on nodes 0 and
// 1, 3 on node 2). InvalidArgument when the list is malformed or has no such node.
StatusOr<int> SlurmTasksOnNode(const std::string& tasks_per_node, int node);

// The first host name of a Slurm host list: "gpu[07-10,12],cpu1" gives "gpu07", "a,b" gives "a".
// InvalidArgument when the list is empty or malformed.
StatusOr<std::string> FirstSlurmHost(const std::string& nodelist);

// Under srun and Hydra (a non-empty `serve_store_addr`) every rank must be given the job's secret:
// OK when `job_secret` is set or no store is served that way, else InvalidArgument saying how to
// give it.
Status RequireServedStoreSecret(const std::string& launcher, const std::string& serve_store_addr,
                                const std::string& job_secret);

// Whether `key` is a variable ReadLaunchPlace reads (for collecting the environment).
bool IsLaunchVariable(const std::string& key);

}  // namespace kolo
