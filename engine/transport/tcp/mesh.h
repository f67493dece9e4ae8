// Connection set-up for the TCP transport (see Connect in device.h for the contract).
#pragma once

#include <memory>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/common/logging.h"
#include "engine/common/status.h"
#include "engine/transport/tcp/device.h"
#include "engine/transport/tcp/socket.h"

namespace kolo::transport::tcp {

struct Mesh {
  Fd listener;
  std::vector<Fd> peers;  // peers[r] is the authenticated connection to rank r; none at own rank
  // With several streams per peer (TcpOptions::streams): streams[r][k - 1] is stream k to rank r.
  std::vector<std::vector<Fd>> streams;
  // The listener's one log of turned-away connections, through set-up (the mesh) and after it (the
  // device, which turns away every late connection): a few lines per 10 s in all.
  std::shared_ptr<RejectionLog> rejections;
};

StatusOr<Mesh> BuildMesh(const TcpOptions& options, bootstrap::Store& store, int rank, int size);

}  // namespace kolo::transport::tcp
