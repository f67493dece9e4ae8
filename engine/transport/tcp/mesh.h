// Connection set-up for the TCP transport (see Connect in device.h for the contract).
#pragma once

#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/common/status.h"
#include "engine/transport/tcp/device.h"
#include "engine/transport/tcp/socket.h"

namespace kolo::transport::tcp {

struct Mesh {
  Fd listener;
  std::vector<Fd> peers;  // peers[r] is the authenticated connection to rank r; none at own rank
};

StatusOr<Mesh> BuildMesh(const TcpOptions& options, bootstrap::Store& store, int rank, int size);

}  // namespace kolo::transport::tcp
