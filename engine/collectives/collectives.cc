#include "engine/collectives/collectives.h"

#include <algorithm>

namespace kolo::collectives {

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kReduceScatter:
      return "REDUCE_SCATTER";
    case Phase::kAllgather:
      return "ALLGATHER";
    case Phase::kBroadcast:
      return "BROADCAST";
    case Phase::kSendRecv:
      return "SEND_RECV";
    case Phase::kHierarchical:
      return "HIERARCHICAL_ALLREDUCE";
    case Phase::kRecursiveDoubling:
      return "RECURSIVE_DOUBLING";
    case Phase::kOneShot:
      return "ONE_SHOT";
  }
  return "UNKNOWN";
}

StatusOr<transport::Region*> Scratch::Get(transport::Device& device, size_t bytes) {
  if (region_ != nullptr && storage_.size() >= bytes) return region_.get();
  // The registration must end before the memory it names is freed.
  region_.reset();
  storage_.clear();
  storage_.shrink_to_fit();
  storage_.resize(std::max<size_t>(bytes, 1));
  KOLO_ASSIGN_OR_RETURN(region_, device.Register(storage_.data(), storage_.size()));
  return region_.get();
}

}  // namespace kolo::collectives
