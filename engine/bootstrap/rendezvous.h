// Rendezvous: how the ranks of one job find a common store, agree on a job secret and choose the
// address their transport listens on.
#pragma once

#include <memory>
#include <string>

#include "engine/bootstrap/store.h"
#include "engine/bootstrap/tcp_store.h"
#include "engine/common/options.h"
#include "engine/common/status.h"

namespace kolo::bootstrap {

// What a rank needs to connect its transport. Move-only. Keep it alive as long as the store may be
// used: on the rank that hosts the server (rank 0 under mpirun), destroying it stops the store for
// every rank.
struct Rendezvous {
  Store* store = nullptr;   // what the transport uses for address exchange; never null once started
  std::string secret;       // the job secret every connection proves it knows
  std::string listen_addr;  // IPv4 address this rank's transport binds
  // Owned pieces, as the launch needs them. Declared in this order so that the client is destroyed
  // before the server it talks to.
  std::unique_ptr<TcpStoreServer> server;
  std::unique_ptr<Store> owned_store;
};

// Starts the rendezvous for this rank. REQUIRES: options.Validate().ok().
// Chooses, in this order:
// - `external` given (ranks as threads of one process sharing an in-process store): use it. The
//   secret is options.job_secret, or else a value fixed per store and process, so that every
//   thread sharing `external` agrees on it.
// - options.serve_store_addr set (a launch by srun or Hydra, launch_env.h): rank 0 starts a
//   TcpStoreServer there (an address of its own host), presenting options.job_secret, which is
//   required; every rank connects a TcpStoreClient, retrying until the start or peer timeout.
// - options.store_addr set (a launch by kolo-run): a TcpStoreClient to it, presenting
//   options.job_secret, which is then required.
// - options.launched_by_mpirun: initialises MPI if nobody has (MPI_THREAD_MULTIPLE); rank 0 starts
//   a TcpStoreServer on its listen address with a fresh secret and broadcasts address and secret
//   over MPI_COMM_WORLD; every rank connects a TcpStoreClient. Needs a build with MPI. The
//   broadcast is an MPI collective and cannot time out; mpirun ends the job if a rank dies.
// - options.size == 1: an InMemoryStore and a fresh secret (or options.job_secret).
// - otherwise: InvalidArgument explaining how to launch several ranks.
// Connecting to a store is bounded by options.peer_timeout_s.
StatusOr<Rendezvous> StartRendezvous(const Options& options, Store* external = nullptr);

// 32 lowercase hex characters (128 bits) from the kernel's random source (getrandom).
std::string GenerateSecret();

// The IPv4 address this rank's transport should bind:
// - options.iface an IPv4 address: that address;
// - options.iface an interface name: its IPv4 address (error naming the interface and listing the
//   interfaces that have one);
// - options.iface empty: "127.0.0.1" when every rank runs on this host (local_size == size), else
//   the address the host name resolves to; if that is a loopback address (common in /etc/hosts),
//   the first non-loopback IPv4 address of an interface that is up, since a loopback address is
//   unreachable from other hosts. Error if there is none.
StatusOr<std::string> ResolveListenAddress(const Options& options);

}  // namespace kolo::bootstrap
