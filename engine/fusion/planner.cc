#include "engine/fusion/planner.h"

namespace kolo::fusion {

using coordinator::CollectiveType;
using coordinator::Response;

std::vector<Group> PlanFusion(const std::vector<Response>& responses, size_t threshold_bytes) {
  std::vector<Group> groups;
  auto fusable = [&](const Response& r) {
    return !r.is_error() && r.request.type == CollectiveType::kAllreduce &&
           threshold_bytes > 0 && r.bytes() <= threshold_bytes;
  };
  size_t i = 0;
  while (i < responses.size()) {
    const Response& first = responses[i];
    Group g{i, i + 1, first.bytes(), fusable(first)};
    if (g.fused) {
      while (g.end < responses.size()) {
        const Response& next = responses[g.end];
        if (!fusable(next) || next.request.dtype != first.request.dtype ||
            next.request.reduce_op != first.request.reduce_op ||
            g.bytes + next.bytes() > threshold_bytes) {
          break;
        }
        g.bytes += next.bytes();
        ++g.end;
      }
    }
    g.fused = g.end - g.begin > 1;
    groups.push_back(g);
    i = g.end;
  }
  return groups;
}

}  // namespace kolo::fusion
