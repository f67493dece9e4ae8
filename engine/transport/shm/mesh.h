// Connection set-up for the shm transport (the contract is Connect's, in device.h).
#pragma once

#include <string>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/common/status.h"
#include "engine/transport/shm/device.h"
#include "engine/transport/shm/segment.h"
#include "engine/transport/tcp/socket.h"

namespace kolo::transport::shm {

struct Link {
  tcp::Fd socket;   // the pair's authenticated AF_UNIX stream socket, non-blocking
  Segment segment;  // mapped; no descriptor of it is left open
};

// links[r] for every r in `peers`; the others stay empty.
StatusOr<std::vector<Link>> BuildMesh(const ShmOptions& options, bootstrap::Store& store, int rank,
                                      int size, const std::vector<int>& peers);

// Whether `published` is "@kolo-shm-<job_id>-<rank>-<16 hex digits>": the abstract AF_UNIX name
// `rank` listens on, as it publishes it under "shm/addr/<rank>".
bool IsListenerName(const std::string& published, const std::string& job_id, int rank);

}  // namespace kolo::transport::shm
