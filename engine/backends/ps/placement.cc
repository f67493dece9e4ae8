#include "engine/backends/ps/placement.h"

#include <algorithm>
#include <numeric>

namespace kolo::backends::ps {
namespace {

// The server with the fewest bytes; the lowest index among equals, so every rank agrees.
int LeastLoaded(const std::vector<int64_t>& bytes) {
  return static_cast<int>(std::min_element(bytes.begin(), bytes.end()) - bytes.begin());
}

}  // namespace

StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name) {
  if (name == "greedy") return PlacementPolicy::kGreedy;
  if (name == "split") return PlacementPolicy::kSplit;
  return InvalidArgument("parameter-server placement '{}' is unknown: allowed are greedy, split",
                         name);
}

const char* PlacementPolicyName(PlacementPolicy policy) {
  return policy == PlacementPolicy::kGreedy ? "greedy" : "split";
}

Placement Place(const std::vector<VariableSpec>& vars, int servers, PlacementPolicy policy,
                int64_t split_min_bytes) {
  Placement p;
  p.variable_shards.resize(vars.size());
  p.bytes_per_server.assign(static_cast<size_t>(servers), 0);
  p.server_shards.resize(static_cast<size_t>(servers));
  auto add = [&](int v, int server, int64_t begin, int64_t count, int64_t elem) {
    const int id = static_cast<int>(p.shards.size());
    p.shards.push_back(Shard{v, server, begin, count, count * elem});
    p.variable_shards[static_cast<size_t>(v)].push_back(id);
    p.server_shards[static_cast<size_t>(server)].push_back(id);
    p.bytes_per_server[static_cast<size_t>(server)] += count * elem;
  };
  for (size_t i = 0; i < vars.size(); ++i) {
    const int v = static_cast<int>(i);
    const int64_t elem = static_cast<int64_t>(DataTypeSize(vars[i].dtype));
    const int64_t count = NumElements(vars[i].shape);
    const int64_t pieces = std::min<int64_t>(servers, count);
    if (policy == PlacementPolicy::kGreedy || count * elem < split_min_bytes || pieces < 2) {
      add(v, LeastLoaded(p.bytes_per_server), 0, count, elem);
      continue;
    }
    // Pieces differ by at most one element. With one piece per server each server takes one;
    // with fewer, the least loaded take them (chosen before any piece is added).
    std::vector<int> order(static_cast<size_t>(servers));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return p.bytes_per_server[static_cast<size_t>(a)] <
             p.bytes_per_server[static_cast<size_t>(b)];
    });
    std::sort(order.begin(), order.begin() + pieces);
    for (int64_t k = 0; k < pieces; ++k) {
      const int64_t begin = k * count / pieces;
      const int64_t end = (k + 1) * count / pieces;
      add(v, order[static_cast<size_t>(k)], begin, end - begin, elem);
    }
  }
  return p;
}

}  // namespace kolo::backends::ps
