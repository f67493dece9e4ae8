#include "engine/transport/registry.h"

#include <fmt/format.h>

#include "engine/transport/tcp/device.h"

namespace kolo::transport {
namespace {

using ConnectFn = StatusOr<std::unique_ptr<Device>> (*)(const ConnectSettings&, bootstrap::Store&,
                                                        int, int);

StatusOr<std::unique_ptr<Device>> ConnectTcp(const ConnectSettings& s, bootstrap::Store& store,
                                             int rank, int size) {
  tcp::TcpOptions tcp;
  tcp.listen_addr = s.listen_addr;
  tcp.secret = s.secret;
  tcp.timeout = s.timeout;
  tcp.socket_buffer_bytes = s.socket_buffer_bytes;
  tcp.busy_poll = s.busy_poll;
  return tcp::Connect(tcp, store, rank, size);
}

struct Entry {
  const char* name;
  ConnectFn connect;    // null: kolo knows the name, this build has no such transport
  const char* missing;  // why, when connect is null
};

// One line per transport.
constexpr Entry kTransports[] = {
    {"tcp", &ConnectTcp, nullptr},
    {"rdma", nullptr, "kolo has no RDMA (ibverbs) transport yet"},
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
  s.busy_poll = options.busy_poll;
  s.host_name = options.host_name;
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

StatusOr<std::unique_ptr<Device>> Connect(const std::string& name, const ConnectSettings& settings,
                                          bootstrap::Store& store, int rank, int size) {
  KOLO_RETURN_IF_ERROR(CheckTransport(name));
  if (settings.hosts.known()) {
    if (settings.hosts.size() != size) {
      return InvalidArgument("the host layout covers {} ranks, the job has {}",
                             settings.hosts.size(), size);
    }
    return Find(name)->connect(settings, store, rank, size);
  }
  ConnectSettings with_hosts = settings;
  KOLO_ASSIGN_OR_RETURN(const std::string host, bootstrap::ThisHostName(settings.host_name));
  KOLO_ASSIGN_OR_RETURN(with_hosts.hosts,
                        bootstrap::ExchangeHostLayout(store, host, rank, size, settings.timeout));
  return Find(name)->connect(with_hosts, store, rank, size);
}

}  // namespace kolo::transport
