// The defaults of ComputeBackend's optional capabilities.
#include "models/compute/backend.h"

namespace kolo::models::compute {
namespace {

// A copy that finished before StartGradientCopy returned.
class CompletedCopy final : public GradientCopy {
 public:
  Status Wait(std::chrono::milliseconds /*timeout*/) override { return Status::OK(); }
};

}  // namespace

Status ComputeBackend::TimeMark() {
  KOLO_RETURN_IF_ERROR(Synchronize());
  host_marks_.push_back(std::chrono::steady_clock::now());
  return Status::OK();
}

StatusOr<std::vector<double>> ComputeBackend::TakeMarkTimesMs() {
  std::vector<double> ms;
  ms.reserve(host_marks_.size());
  for (const auto& t : host_marks_) {
    ms.push_back(std::chrono::duration<double, std::milli>(t - host_marks_.front()).count());
  }
  host_marks_.clear();
  return ms;
}

StatusOr<std::unique_ptr<GradientCopy>> ComputeBackend::StartGradientCopy(int param,
                                                                          std::span<float> out) {
  KOLO_RETURN_IF_ERROR(GetGradient(param, out));
  return std::unique_ptr<GradientCopy>(std::make_unique<CompletedCopy>());
}

}  // namespace kolo::models::compute
