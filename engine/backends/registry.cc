// The one place that knows which optional backends this build has.
#include "engine/backends/backend.h"
#include "kolo/config.h"

namespace kolo::backends {

#if !KOLO_HAVE_MPI
std::unique_ptr<Backend> MakeMpiBackend(std::string* why) {
  *why = "this build of kolo has no MPI (install libopenmpi-dev and rebuild)";
  return nullptr;
}
#endif

}  // namespace kolo::backends
