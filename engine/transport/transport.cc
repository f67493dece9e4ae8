#include "engine/transport/transport.h"

#include <algorithm>

namespace kolo::transport {

Status WaitFor(Device& device, size_t expected, std::vector<Completion>* out,
               std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  const size_t target = out->size() + expected;
  while (out->size() < target) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    Status s = device.Poll(out, std::max(left, std::chrono::milliseconds(0)));
    if (s.code() == StatusCode::kDeadlineExceeded) {
      return s.WithContext(fmt::format("waited {} ms for {} completion(s), got {}", timeout.count(),
                                       expected, expected - (target - out->size())));
    }
    KOLO_RETURN_IF_ERROR(s);
  }
  return Status::OK();
}

}  // namespace kolo::transport
