#include "engine/transport/registry.h"

#include <fmt/format.h>

#include "engine/transport/auto_device.h"
#include "engine/transport/shm/device.h"
#include "engine/transport/tcp/device.h"
#include "kolo/config.h"
#if KOLO_HAVE_IBVERBS
#include "engine/transport/rdma/device.h"
#endif

namespace kolo::transport {
namespace {

using ConnectFn = StatusOr<std::unique_ptr<Device>> (*)(const ConnectSettings&, bootstrap::Store&,
                                                        int, int);

tcp::TcpOptions TcpOptionsFrom(const ConnectSettings& s) {
  tcp::TcpOptions tcp;
  tcp.listen_addr = s.listen_addr;
  tcp.secret = s.secret;
  tcp.timeout = s.timeout;
  tcp.socket_buffer_bytes = s.socket_buffer_bytes;
  tcp.busy_poll = s.busy_poll;
  tcp.streams = s.tcp_streams;
  tcp.stripe_min_bytes = static_cast<size_t>(s.tcp_stripe_min_bytes);
  tcp.flow_cap_bytes_per_s = s.tcp_flow_cap_bytes_per_s;
  return tcp;
}

shm::ShmOptions ShmOptionsFrom(const ConnectSettings& s) {
  shm::ShmOptions shm;
  shm.secret = s.secret;
  shm.timeout = s.timeout;
  shm.ring_bytes = static_cast<uint64_t>(s.shm_ring_bytes);
  shm.busy_poll = s.busy_poll;
  shm.full_ring_peers = s.full_ring_peers;
  return shm;
}

// The planned peers (every other rank without a plan) of `rank`'s host, and those of the
// other hosts.
void SplitPeers(const ConnectSettings& s, int rank, std::vector<int>* local,
                std::vector<int>* remote) {
  const bootstrap::HostLayout& hosts = s.hosts;
  std::vector<bool> planned(static_cast<size_t>(hosts.size()), !s.peers.has_value());
  if (s.peers) {
    for (int p : *s.peers) {
      if (p >= 0 && p < hosts.size()) planned[static_cast<size_t>(p)] = true;
    }
  }
  for (int r = 0; r < hosts.size(); ++r) {
    if (r == rank || !planned[static_cast<size_t>(r)]) continue;
    (hosts.same_host(r, rank) ? local : remote)->push_back(r);
  }
}

// Whether some rank of the job is on another host than `rank`.
bool SpansHosts(const bootstrap::HostLayout& hosts, int rank) {
  for (int r = 0; r < hosts.size(); ++r) {
    if (!hosts.same_host(r, rank)) return true;
  }
  return false;
}

StatusOr<std::unique_ptr<Device>> ConnectTcp(const ConnectSettings& s, bootstrap::Store& store,
                                             int rank, int size) {
  tcp::TcpOptions options = TcpOptionsFrom(s);
  options.peers = s.peers;
  KOLO_ASSIGN_OR_RETURN(auto device, tcp::Connect(options, store, rank, size));
  return std::unique_ptr<Device>(std::move(device));
}

StatusOr<std::unique_ptr<Device>> ConnectShm(const ConnectSettings& s, bootstrap::Store& store,
                                             int rank, int size) {
  std::vector<int> local, remote;
  SplitPeers(s, rank, &local, &remote);
  if (SpansHosts(s.hosts, rank)) {
    return FailedPrecondition(
        "transport 'shm' connects the ranks of one host, but this job's ranks are on {} hosts "
        "({}); use --transport auto (shared memory within a host, TCP between hosts) or tcp",
        s.hosts.num_hosts(), s.hosts.Summary());
  }
  KOLO_ASSIGN_OR_RETURN(auto device, shm::Connect(ShmOptionsFrom(s), store, rank, size, local));
  return std::unique_ptr<Device>(std::move(device));
}

// Shared memory with the ranks of this host first, then TCP with the others: every rank does the
// two set-ups in that order, and each involves only peers doing the same one, so neither waits
// on the other.
StatusOr<std::unique_ptr<Device>> ConnectAuto(const ConnectSettings& s, bootstrap::Store& store,
                                              int rank, int size) {
  std::vector<int> local, remote;
  SplitPeers(s, rank, &local, &remote);
  std::vector<std::unique_ptr<PollableDevice>> parts;
  if (!local.empty() || remote.empty()) {
    KOLO_ASSIGN_OR_RETURN(auto shm, shm::Connect(ShmOptionsFrom(s), store, rank, size, local));
    parts.push_back(std::move(shm));
  }
  if (!remote.empty()) {
    tcp::TcpOptions options = TcpOptionsFrom(s);
    options.peers = remote;
    KOLO_ASSIGN_OR_RETURN(auto tcp, tcp::Connect(options, store, rank, size));
    parts.push_back(std::move(tcp));
  }
  return CombineDevices(rank, size, std::move(parts), s.busy_poll);
}

#if KOLO_HAVE_IBVERBS
rdma::RdmaOptions RdmaOptionsFrom(const ConnectSettings& s) {
  rdma::RdmaOptions options;
  options.secret = s.secret;
  options.timeout = s.timeout;
  options.device = s.ib_device;
  options.port = s.ib_port;
  options.gid_index = s.ib_gid_index;
  options.verbs = s.ib_verbs;
  options.host_name = s.host_name;
  options.busy_poll = s.busy_poll;
  options.peers = s.peers;
  return options;
}

StatusOr<std::unique_ptr<Device>> ConnectRdma(const ConnectSettings& s, bootstrap::Store& store,
                                              int rank, int size) {
  KOLO_ASSIGN_OR_RETURN(auto device, rdma::Connect(RdmaOptionsFrom(s), store, rank, size));
  return std::unique_ptr<Device>(std::move(device));
}

// Before any exchange with the other ranks: a host without a usable device fails at once.
Status ProbeRdma(const ConnectSettings& s) { return rdma::Probe(RdmaOptionsFrom(s)); }
#endif

using ProbeFn = Status (*)(const ConnectSettings&);

struct Entry {
  const char* name;
  ConnectFn connect;        // null: kolo knows the name, this build has no such transport
  const char* missing;      // why, when connect is null
  ProbeFn probe = nullptr;  // checks this host can use the transport at all, before connecting
};

// One line per transport.
constexpr Entry kTransports[] = {
    {"auto", &ConnectAuto, nullptr},
    {"shm", &ConnectShm, nullptr},
    {"tcp", &ConnectTcp, nullptr},
#if KOLO_HAVE_IBVERBS
    {"rdma", &ConnectRdma, nullptr, &ProbeRdma},
#else
    {"rdma", nullptr, "this build lacks rdma-core's headers (install libibverbs-dev and rebuild)"},
#endif
};

const Entry* Find(const std::string& name) {
  for (const Entry& e : kTransports) {
    if (name == e.name) return &e;
  }
  return nullptr;
}

}  // namespace

ConnectSettings SettingsFrom(const Options& options, const std::string& listen_addr,
                             const std::string& secret) {
  ConnectSettings s;
  s.listen_addr = listen_addr;
  s.secret = secret;
  s.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.peer_timeout_s * 1000));
  s.socket_buffer_bytes = options.socket_buffer_bytes;
  s.shm_ring_bytes = options.shm_ring_bytes;
  s.busy_poll = options.busy_poll;
  s.poll_spin_us = options.poll_spin_us;
  s.host_name = options.host_name;
  s.ib_device = options.ib_device;
  s.ib_port = options.ib_port;
  s.ib_gid_index = options.ib_gid_index;
  s.ib_verbs = options.ib_verbs;
  s.tcp_streams = options.tcp_streams > 0 ? options.tcp_streams : AutoTcpStreams(listen_addr);
  s.tcp_stripe_min_bytes = options.tcp_stripe_min_bytes;
  s.tcp_flow_cap_bytes_per_s = options.emulated_flow_cap_bits_per_s / 8;
  return s;
}

std::vector<std::string> TransportNames() {
  std::vector<std::string> names;
  for (const Entry& e : kTransports) {
    if (e.connect != nullptr) names.emplace_back(e.name);
  }
  return names;
}

Status CheckTransport(const std::string& name) {
  const Entry* e = Find(name);
  if (e != nullptr && e->connect != nullptr) return Status::OK();
  const std::string allowed = fmt::format("{}", fmt::join(TransportNames(), ", "));
  if (e != nullptr) {
    return InvalidArgument("transport '{}' is not available: {}; allowed: {}", name, e->missing,
                           allowed);
  }
  return InvalidArgument("transport '{}' is unknown; allowed: {}", name, allowed);
}

Status ProbeTransport(const std::string& name, const ConnectSettings& settings) {
  KOLO_RETURN_IF_ERROR(CheckTransport(name));
  const ProbeFn probe = Find(name)->probe;
  return probe != nullptr ? probe(settings) : Status::OK();
}

StatusOr<std::unique_ptr<Device>> Connect(const std::string& name, const ConnectSettings& settings,
                                          bootstrap::Store& store, int rank, int size) {
  KOLO_RETURN_IF_ERROR(ProbeTransport(name, settings));
  if (settings.hosts.known()) {
    if (settings.hosts.size() != size) {
      return InvalidArgument("the host layout covers {} ranks, the job has {}",
                             settings.hosts.size(), size);
    }
    KOLO_ASSIGN_OR_RETURN(auto device, Find(name)->connect(settings, store, rank, size));
    device->SetPollSpin(std::chrono::microseconds(settings.poll_spin_us));
    return device;
  }
  ConnectSettings with_hosts = settings;
  KOLO_ASSIGN_OR_RETURN(const std::string host, bootstrap::ThisHostName(settings.host_name));
  KOLO_ASSIGN_OR_RETURN(with_hosts.hosts,
                        bootstrap::ExchangeHostLayout(store, host, rank, size, settings.timeout));
  KOLO_ASSIGN_OR_RETURN(auto device, Find(name)->connect(with_hosts, store, rank, size));
  device->SetPollSpin(std::chrono::microseconds(settings.poll_spin_us));
  return device;
}

}  // namespace kolo::transport
