// Where each variable of a parameter-server job lives: which server holds which elements.
//
// Computed independently on every rank from the same registration (Engine::RegisterVariables), so
// it must be, and is, a pure function of its arguments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/backends/ps/types.h"
#include "engine/common/status.h"

namespace kolo::backends::ps {

enum class PlacementPolicy : uint8_t {
  // Whole tensors, each to the server with the fewest bytes so far (ties: the lowest index), in
  // creation order: TensorFlow's GreedyLoadBalancingStrategy, the parameter-server baseline of
  // the Horovod paper. A large layer lands whole on one server, which becomes the bottleneck.
  kGreedy,
  // Tensors of at least split_min_bytes cut into equal contiguous pieces, one per server (fewer
  // when the tensor has fewer elements than there are servers: then to the least loaded);
  // smaller tensors placed as kGreedy places them. What a modern parameter server does.
  kSplit,
};

// "greedy" | "split"; the error names the value and what is allowed.
StatusOr<PlacementPolicy> ParsePlacementPolicy(const std::string& name);
const char* PlacementPolicyName(PlacementPolicy policy);

// The split policy cuts tensors of at least this many bytes (1 MiB: every convolution and
// fully-connected weight of the paper's models that dominates traffic, no bias or batch-norm
// vector).
inline constexpr int64_t kSplitMinBytes = 1 << 20;

// A contiguous piece of one variable, held by one server.
struct Shard {
  int variable = 0;   // index in the registration
  int server = 0;     // server index, in [0, servers)
  int64_t begin = 0;  // first element
  int64_t count = 0;  // elements
  int64_t bytes = 0;  // count * element size
};

struct Placement {
  // Every shard, ordered by variable (registration order), then by `begin`. A shard's index in
  // this list is its id on the wire.
  std::vector<Shard> shards;
  // variable index -> indices into `shards`, by `begin`.
  std::vector<std::vector<int>> variable_shards;
  // server index -> bytes held, and -> shard ids held.
  std::vector<int64_t> bytes_per_server;
  std::vector<std::vector<int>> server_shards;
};

// Places `vars` on `servers` servers. REQUIRES: servers >= 1, split_min_bytes >= 1; every
// variable's shape has no negative dimension. A variable with no elements gets one empty shard.
Placement Place(const std::vector<VariableSpec>& vars, int servers, PlacementPolicy policy,
                int64_t split_min_bytes = kSplitMinBytes);

}  // namespace kolo::backends::ps
