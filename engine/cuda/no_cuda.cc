// The CUDA layer in a build without the CUDA toolkit: no device, and a context that cannot be
// made, each saying why. Compiled instead of the real implementation (engine/CMakeLists.txt).
#include "engine/cuda/device_context.h"

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

}  // namespace kolo::cuda
