#include "engine/fusion/planner.h"

namespace kolo::fusion {

using coordinator::CollectiveType;
using coordinator::Response;

std::vector<Group> PlanFusion(const std::vector<Response>& responses, size_t threshold_bytes) {
  std::vector<Group> groups;
  std::vector<bool> planned(responses.size(), false);
  auto fusable = [&](const Response& r) {
    return !r.is_error() && r.request.type == CollectiveType::kAllreduce && threshold_bytes > 0 &&
           r.bytes() <= threshold_bytes;
  };
  for (size_t i = 0; i < responses.size(); ++i) {
    if (planned[i]) continue;
    const Response& first = responses[i];
    Group g;
    g.members.push_back(i);
    g.bytes = first.bytes();
    planned[i] = true;
    if (fusable(first)) {
      for (size_t j = i + 1; j < responses.size() && g.bytes < threshold_bytes; ++j) {
        const Response& next = responses[j];
        if (planned[j] || !fusable(next) || next.request.dtype != first.request.dtype ||
            next.request.reduce_op != first.request.reduce_op ||
            next.request.on_device != first.request.on_device ||
            g.bytes + next.bytes() > threshold_bytes) {
          continue;
        }
        g.members.push_back(j);
        g.bytes += next.bytes();
        planned[j] = true;
      }
    }
    g.fused = g.members.size() > 1;
    groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace kolo::fusion
