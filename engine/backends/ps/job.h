// A parameter-server job: which launch ranks serve and which train, and the connections between
// them. See Options (ps_servers, ps_server_ranks) for how ranks map to roles.
//
// Joining (Join) connects every launch rank of the job to every other over kolo's TCP transport,
// with the job's secret and handshake, on a mesh of its own ("ps/" keys in the rendezvous store);
// worker <-> server traffic uses it, worker <-> worker collectives keep the engine's own mesh of
// the workers only ("workers/" keys). Join also checks that every rank agrees on the settings
// that shape the job, and gives each worker its rank, size and local rank among the workers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/backends/ps/placement.h"
#include "engine/backends/ps/types.h"
#include "engine/bootstrap/host_layout.h"
#include "engine/bootstrap/rendezvous.h"
#include "engine/common/options.h"
#include "engine/common/status.h"
#include "engine/transport/transport.h"

namespace kolo::backends::ps {

struct Roles {
  std::vector<int> server_ranks;  // server index -> launch rank
  std::vector<int> worker_ranks;  // worker index -> launch rank, ascending
  std::vector<Role> role;         // launch rank -> role
  std::vector<int> index;         // launch rank -> worker or server index

  int workers() const { return static_cast<int>(worker_ranks.size()); }
  int servers() const { return static_cast<int>(server_ranks.size()); }
  // "server 1 (rank 5)", "worker 0 (rank 0)".
  std::string Describe(int launch_rank) const;
};

// REQUIRES: options.Validate().ok() and options.backend == "ps". The servers are
// options.ps_server_ranks in the order given (server j = the j-th listed), or else the last
// ps_servers ranks in ascending order; the workers are every other rank, in ascending order.
Roles AssignRoles(const Options& options);

// The peers launch rank `rank` of a parameter-server job connects to (sorted, without itself):
// every worker to every server (its pushes and pulls; no worker to another worker, no server to
// another server: the workers' own engine connects them by its plan), and the pairs of start-up's
// gather and broadcast at rank 0 (collectives::GatherMessages: rank 0 to every rank up to
// `direct_max_ranks` ranks, the binomial tree's r XOR 2^k beyond). Symmetric: a lists b exactly
// when b lists a. A worker holds servers + 1 connections up to direct_max_ranks ranks, against
// N - 1 for a full mesh.
std::vector<int> PlanJobConnections(int rank, const Roles& roles, int direct_max_ranks);

struct Job {
  Options options;  // as launched: rank and size count every process of the job
  Roles roles;
  Role role = Role::kWorker;
  int index = 0;  // this rank's worker or server index
  PlacementPolicy policy = PlacementPolicy::kGreedy;
  // Workers: options for the engine among the workers (rank, size, local_rank, local_size
  // counted over workers only).
  Options worker_options;
  // Declared before what uses the store, so that it is destroyed last.
  bootstrap::Rendezvous rendezvous;
  // The store the workers' own mesh exchanges addresses through; null on servers.
  std::unique_ptr<bootstrap::Store> worker_store;
  // Every launch rank of the job, by launch rank. Driven by one thread (the worker's
  // parameter-server thread, or the server's Serve).
  std::unique_ptr<transport::Device> device;
  // Which host each launch rank is on.
  bootstrap::HostLayout hosts;
};

// Starts the rendezvous (bootstrap::StartRendezvous, with `external` as there), connects the
// job's mesh and checks the settings every rank must share (servers, server ranks, placement,
// chunk size); the error names the first rank that differs. Bounded by options.peer_timeout_s.
// REQUIRES: options.Validate().ok() and options.backend == "ps".
StatusOr<Job> Join(const Options& options, bootstrap::Store* external);

}  // namespace kolo::backends::ps
