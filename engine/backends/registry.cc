// The one place that knows which optional backends this build has.
#include "engine/backends/backend.h"
#include "engine/backends/device_collectives.h"
#include "engine/cuda/staged_ring.h"
#include "kolo/config.h"

namespace kolo::backends {

#if !KOLO_HAVE_MPI
std::unique_ptr<Backend> MakeMpiBackend(std::string* why) {
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

}  // namespace kolo::backends

#if !KOLO_HAVE_CUDA
namespace kolo::cuda {

int DeviceCount(std::string* why) {
  if (why != nullptr) *why = "this build of kolo has no CUDA";
  return 0;
}

StatusOr<std::unique_ptr<DeviceContext>> CreateDeviceContext(int device,
                                                             std::chrono::milliseconds) {
  return FailedPrecondition(
      "CUDA device {} cannot be used: this build of kolo has no CUDA (install the CUDA toolkit and "
      "rebuild); pass host tensors instead",
      device);
}

StatusOr<std::unique_ptr<backends::DeviceCollectives>> MakeStagedRing(collectives::Comm*,
                                                                      DeviceContext*) {
  return FailedPrecondition("this build of kolo has no CUDA: device tensors cannot be staged");
}

}  // namespace kolo::cuda
#endif
