#include "engine/transport/rdma/pick_device.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "engine/common/file.h"

namespace kolo::transport::rdma {
namespace {

std::string HostName(const std::string& configured) {
  if (!configured.empty()) return configured;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "this host";
  return name;
}

const char* PortState(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    default:
      return "not active";
  }
}

}  // namespace

DeviceList::~DeviceList() {
  if (list != nullptr) verbs->free_device_list(list);
}

StatusOr<std::string> DeviceNames(const Verbs& verbs) {
  int n = 0;
  ibv_device** list = verbs.get_device_list(&n);
  if (list == nullptr) {
    // ENOSYS: the kernel offers no RDMA support at all, so there is no device.
    if (errno == ENOSYS) return std::string();
    return ErrnoStatus(StatusCode::kUnavailable, "ibv_get_device_list", errno);
  }
  std::string names;
  for (int i = 0; i < n; ++i) {
    names += (names.empty() ? "" : ", ") + std::string(verbs.get_device_name(list[i]));
  }
  verbs.free_device_list(list);
  return names;
}

StatusOr<int> PickDevice(const RdmaOptions& options, DeviceList* devices) {
  const std::string host = HostName(options.host_name);
  auto loaded = OpenVerbs(options.verbs);
  if (!loaded.ok()) {
    return Unavailable("host {}: --transport rdma cannot start: {}", host,
                       loaded.status().message());
  }
  const Verbs* verbs = *loaded;
  if (options.port < 1 || options.port > 255) {
    return InvalidArgument("RDMA port {} is outside [1, 255]", options.port);
  }
  const auto port = static_cast<uint8_t>(options.port);
  devices->verbs = verbs;
  devices->list = verbs->get_device_list(&devices->n);
  if (devices->list == nullptr || devices->n == 0) {
    return Unavailable(
        "host {}: --transport rdma needs an RDMA device, but {} finds none (no InfiniBand, RoCE "
        "or iWARP device, nor rxe/siw); use --transport tcp or auto",
        host, verbs->label);
  }
  std::string names, states;
  bool named_exists = false;
  int chosen = -1;
  for (int i = 0; i < devices->n; ++i) {
    const std::string name = verbs->get_device_name(devices->list[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (chosen >= 0 || (!options.device.empty() && name != options.device)) continue;
    named_exists = true;
    ibv_context* ctx = verbs->open_device(devices->list[i]);
    if (ctx == nullptr) {
      states += fmt::format("{}{}: cannot be opened ({})", states.empty() ? "" : ", ", name,
                            std::strerror(errno));
      continue;
    }
    ibv_port_attr attr{};
    const int rc = verbs->query_port(ctx, port, &attr);
    verbs->close_device(ctx);
    if (rc != 0) {
      states += fmt::format("{}{}: no port {}", states.empty() ? "" : ", ", name, options.port);
      continue;
    }
    if (attr.state != IBV_PORT_ACTIVE) {
      states += fmt::format("{}{} port {}: {}", states.empty() ? "" : ", ", name, options.port,
                            PortState(attr.state));
      continue;
    }
    chosen = i;
  }
  if (chosen < 0) {
    if (!options.device.empty() && !named_exists) {
      return NotFound("host {}: RDMA device '{}' does not exist; the devices are: {}", host,
                      options.device, names);
    }
    return Unavailable("host {}: no RDMA device with an ACTIVE port {} ({}); devices: {}", host,
                       options.port, states, names);
  }
  return chosen;
}

int PickRoceGid(const char* device, uint8_t port) {
  int best = 0;
  for (int i = 0; i < 256; ++i) {
    // sysfs attributes, each at most a page (and saying so in its size).
    auto t = ReadFileBounded(
        fmt::format("/sys/class/infiniband/{}/ports/{}/gid_attrs/types/{}", device, port, i), 4096,
        "GID type");
    if (!t.ok()) continue;
    auto g = ReadFileBounded(
        fmt::format("/sys/class/infiniband/{}/ports/{}/gids/{}", device, port, i), 4096, "GID");
    if (!g.ok()) continue;
    if (t->find("RoCE v2") != std::string::npos &&
        g->rfind("0000:0000:0000:0000:0000:ffff:", 0) == 0) {
      best = i;
      break;
    }
  }
  return best;
}

}  // namespace kolo::transport::rdma
