// The transport registry: the one place that knows which transports exist and how each connects a
// rank to its peers: "auto" (the default: shm with the ranks of this host, TCP with the others),
// "shm" (a job on one host), "tcp" (every pair over TCP) and, in builds with rdma-core's headers,
// "rdma" (every pair over ibverbs RC queue pairs). Everything that needs connections (the
// engine, a parameter-server job, the benchmark's link row) asks here, by the name in
// Options::transport (KOLO_TRANSPORT,
// --transport). Adding a transport is its folder under engine/transport/ and one line in
// registry.cc.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/bootstrap/host_layout.h"
#include "engine/bootstrap/store.h"
#include "engine/common/options.h"
#include "engine/common/status.h"
#include "engine/transport/transport.h"

namespace kolo::transport {

// What every transport needs to connect one rank of a job to the others.
struct ConnectSettings {
  // IPv4 address to listen on (the rendezvous picks it from KOLO_IFACE, or loopback when every
  // rank is local).
  std::string listen_addr = "127.0.0.1";
  // Per-job secret every connection must prove it knows.
  std::string secret;
  // Bound on the whole connection set-up.
  std::chrono::milliseconds timeout{30000};
  // Options::socket_buffer_bytes (TCP), Options::shm_ring_bytes (shm), Options::busy_poll.
  int64_t socket_buffer_bytes = 2 << 20;
  int64_t shm_ring_bytes = 1 << 20;
  bool busy_poll = false;
  // Options::poll_spin_us: Device::SetPollSpin of the connected device.
  int64_t poll_spin_us = 0;
  // TCP: connections this rank opens to each peer it connects to (Options::tcp_streams resolved
  // for listen_addr), the smallest message striped across them, and the emulated cluster's
  // per-flow cap in bytes/s (0: none).
  int tcp_streams = 1;
  int64_t tcp_stripe_min_bytes = 256 << 10;
  double tcp_flow_cap_bytes_per_s = 0;
  // Options::ib_device, ib_port, ib_gid_index, ib_verbs (the rdma transport).
  std::string ib_device;
  int ib_port = 1;
  int ib_gid_index = -1;
  std::string ib_verbs = "libibverbs";
  // Which host each rank is on (bootstrap::ExchangeHostLayout). Unknown (empty): Connect
  // exchanges it through the store first, under this rank's `host_name`.
  bootstrap::HostLayout hosts;
  // Options::host_name, or empty for the system's host name.
  std::string host_name;
  // The ranks to connect to, from the job's connection plan (collectives::PlanConnections);
  // unset: every other rank (a full mesh). Must be symmetric across the job: rank a lists b
  // exactly when b lists a.
  std::optional<std::vector<int>> peers;
  // Of those, the peers whose pairs carry large buffers (the ring neighbours): shared memory
  // gives them shm_ring_bytes rings and the others smaller ones (ShmOptions::full_ring_peers).
  // Unset: every pair the full size. Must be symmetric like `peers`.
  std::optional<std::vector<int>> full_ring_peers;
};

// The settings an engine's options give, with the rendezvous's listen address and secret.
ConnectSettings SettingsFrom(const Options& options, const std::string& listen_addr,
                             const std::string& secret);

// The transports this build has, by name, in the order help texts list them.
std::vector<std::string> TransportNames();

// OK when `name` is a transport of this build; otherwise InvalidArgument naming it and the
// allowed names (and, for a transport kolo knows but this build lacks, why).
Status CheckTransport(const std::string& name);

// Whether this host can use the transport `name` at all (rdma: the verbs library loads and a
// device with an ACTIVE port exists; Unavailable or NotFound naming the host otherwise), checked
// before any exchange with the other ranks so that a host that cannot fails at start-up. OK for
// transports with nothing to check; fails as CheckTransport does for an unknown name.
Status ProbeTransport(const std::string& name, const ConnectSettings& settings);

// Connects `rank` of a job of `size` ranks to every other through the transport `name`, meeting
// the peers through `store` (each transport publishes its addresses under its own keys). Fails as
// CheckTransport does for an unknown name, before any connection is tried.
StatusOr<std::unique_ptr<Device>> Connect(const std::string& name, const ConnectSettings& settings,
                                          bootstrap::Store& store, int rank, int size);

}  // namespace kolo::transport
