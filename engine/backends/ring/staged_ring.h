// kolo's ring collectives for tensors in device memory, through pinned host staging buffers.
//
// The ring collectives (engine/collectives) run on registered host memory. A device buffer is cut
// into chunks of kStagingChunkBytes; each chunk is copied to one of kStagingSlots pinned host slots
// on a copy stream, run through the ring over the transport, and copied back on a second stream.
// The copies are queued ahead, so that the device-to-host copy of chunk i+1 and the host-to-device
// copy of chunk i-1 overlap the wire of chunk i; the host blocks only until the chunk it is about
// to send has arrived.
#pragma once

#include <cstddef>
#include <memory>

#include "engine/backends/device_collectives.h"
#include "engine/collectives/plan.h"

namespace kolo::backends {

inline constexpr size_t kStagingChunkBytes = 4 << 20;
inline constexpr int kStagingSlots = 3;

// Allreduce and broadcast of device tensors over `comm` (see DeviceCollectives). Each staged
// chunk is allreduced with `algorithm` (kAuto: the rule's choice for the whole tensor's bytes,
// collectives::ChooseAllreduceAlgorithm, as for host tensors). The pinned slots are allocated
// and registered with comm->device at the first collective. `comm` and `ctx` must outlive the
// result. Fails in a build without CUDA.
StatusOr<std::unique_ptr<DeviceCollectives>> MakeStagedRing(
    collectives::Comm* comm, cuda::DeviceContext* ctx,
    collectives::AllreduceAlgorithm algorithm = collectives::AllreduceAlgorithm::kAuto,
    int hosts = 1);

}  // namespace kolo::backends
