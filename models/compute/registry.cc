// The one place that knows which compute backends this build has.
#include <fmt/format.h>

#include "kolo/config.h"
#include "models/compute/backend.h"
#include "models/compute/replay/replay_backend.h"
#if KOLO_HAVE_ONEDNN
#include "models/compute/onednn/onednn_backend.h"
#endif
#if KOLO_HAVE_CUDNN
#include "models/compute/cudnn/cudnn_backend.h"
#endif

namespace kolo::models::compute {

const char* PrecisionName(Precision p) {
  switch (p) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kTf32:
      return "tf32";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16:
      return "bf16";
  }
  return "unknown";
}

StatusOr<Precision> ParsePrecision(const std::string& name) {
  for (Precision p : {Precision::kFp32, Precision::kTf32, Precision::kFp16, Precision::kBf16}) {
    if (name == PrecisionName(p)) return p;
  }
  return InvalidArgument("precision '{}' is not one of fp32, tf32, fp16, bf16", name);
}

std::vector<std::string> AvailableComputeBackends() {
  std::vector<std::string> names;
#if KOLO_HAVE_ONEDNN
  names.push_back("onednn");
#endif
#if KOLO_HAVE_CUDNN
  names.push_back("cudnn");
#endif
  names.push_back("replay");
  return names;
}

StatusOr<std::unique_ptr<ComputeBackend>> CreateComputeBackend(const std::string& name) {
#if KOLO_HAVE_ONEDNN
  if (name == "onednn") return onednn::CreateOneDnnBackend();
#endif
#if KOLO_HAVE_CUDNN
  if (name == "cudnn") return cudnn::CreateCudnnBackend();
#endif
  if (name == "replay") return replay::CreateReplayBackend();
  return InvalidArgument("compute backend '{}' is not available in this build; available: {}", name,
                         fmt::join(AvailableComputeBackends(), ", "));
}

}  // namespace kolo::models::compute
