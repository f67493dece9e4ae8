// Choosing the RDMA device, port and GID a rank uses (RdmaOptions::device, port, gid_index), with
// errors that name the host and list what exists. Internal to rdma/.
#pragma once

#include <cstdint>

#include "engine/common/status.h"
#include "engine/transport/rdma/device.h"
#include "engine/transport/rdma/verbs.h"

namespace kolo::transport::rdma {

// The devices a verbs table lists; the list is freed on destruction.
struct DeviceList {
  DeviceList() = default;
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;
  ~DeviceList();

  const Verbs* verbs = nullptr;
  ibv_device** list = nullptr;
  int n = 0;
};

// Loads the table named by options.verbs and picks the device: options.device, or the first whose
// port options.port is ACTIVE. Returns its index in devices->list, which it fills. Unavailable
// naming the host when the table cannot be loaded, when there is no device, or when no device
// has that port ACTIVE (with each device's state); NotFound listing the devices when the named
// one does not exist; InvalidArgument for a port outside [1, 255].
StatusOr<int> PickDevice(const RdmaOptions& options, DeviceList* devices);

// RoCE: the GID index to route by when none was asked for, read from sysfs: the first whose type
// is RoCE v2 and whose GID is IPv4-mapped; 0 when there is none.
int PickRoceGid(const char* device, uint8_t port);

}  // namespace kolo::transport::rdma
