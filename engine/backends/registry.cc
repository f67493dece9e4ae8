// The one place that knows which optional backends this build has: the stand-ins below fail with
// the reason where the real one is not built.
#include "engine/backends/backend.h"
#include "engine/backends/device_collectives.h"
#include "engine/backends/ring/staged_ring.h"
#include "kolo/config.h"

namespace kolo::backends {

#if !KOLO_HAVE_MPI
std::unique_ptr<Backend> MakeMpiBackend(std::chrono::milliseconds, bool, std::string* why) {
  *why = "this build of kolo has no MPI (install libopenmpi-dev and rebuild)";
  return nullptr;
}
#endif

#if !KOLO_HAVE_NCCL
StatusOr<std::unique_ptr<DeviceCollectives>> MakeNcclCollectives(collectives::Comm&,
                                                                 cuda::DeviceContext&) {
  return FailedPrecondition(
      "backend 'nccl' is not available: this build of kolo has no NCCL (install NCCL with the "
      "CUDA toolkit and rebuild)");
}
#endif

#if !KOLO_HAVE_CUDA
StatusOr<std::unique_ptr<DeviceCollectives>> MakeStagedRing(collectives::Comm*,
                                                            cuda::DeviceContext*,
                                                            collectives::AllreduceAlgorithm, int) {
  return FailedPrecondition("this build of kolo has no CUDA: device tensors cannot be staged");
}
#endif

}  // namespace kolo::backends
