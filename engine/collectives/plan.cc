#include "engine/collectives/plan.h"

#include <algorithm>

#include "engine/common/options.h"

namespace kolo::collectives {
namespace {

struct Named {
  AllreduceAlgorithm algorithm;
  const char* name;
};
constexpr Named kNames[] = {
    {AllreduceAlgorithm::kAuto, "auto"},
    {AllreduceAlgorithm::kRing, "ring"},
    {AllreduceAlgorithm::kRecursiveDoubling, "recursive-doubling"},
    {AllreduceAlgorithm::kHalvingDoubling, "halving-doubling"},
    {AllreduceAlgorithm::kOneShot, "one-shot"},
};

// The neighbours of `rank` in the ring `group` (empty when rank is not in it).
void AddRingNeighbours(const std::vector<int>& group, int rank, std::vector<int>* out) {
  const auto it = std::find(group.begin(), group.end(), rank);
  if (it == group.end() || group.size() < 2) return;
  const size_t n = group.size();
  const size_t i = static_cast<size_t>(it - group.begin());
  out->push_back(group[(i + 1) % n]);
  out->push_back(group[(i + n - 1) % n]);
}

// Sorted, without duplicates or `rank` itself.
void Normalize(int rank, std::vector<int>* peers) {
  std::sort(peers->begin(), peers->end());
  peers->erase(std::unique(peers->begin(), peers->end()), peers->end());
  peers->erase(std::remove(peers->begin(), peers->end(), rank), peers->end());
}

}  // namespace

const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm) {
  for (const Named& n : kNames) {
    if (n.algorithm == algorithm) return n.name;
  }
  return "unknown";
}

StatusOr<AllreduceAlgorithm> ParseAllreduceAlgorithm(const std::string& name) {
  for (const Named& n : kNames) {
    if (name == n.name) return n.algorithm;
  }
  return InvalidArgument("allreduce algorithm '{}' is unknown; allowed: {}", name,
                         fmt::join(AllreduceAlgorithmNames(), ", "));
}

AllreduceAlgorithm ChooseAllreduceAlgorithm(size_t bytes, int ranks, int hosts, bool host_area) {
  if (ranks <= 1) return AllreduceAlgorithm::kRing;
  if (host_area && hosts == 1 && bytes <= kOneShotMaxBytes &&
      bytes * static_cast<size_t>(ranks - 1) <= kOneShotMaxSummedBytes) {
    return AllreduceAlgorithm::kOneShot;
  }
  if (bytes <= kRecursiveDoublingMaxBytes) return AllreduceAlgorithm::kRecursiveDoubling;
  if (bytes <= kHalvingDoublingMaxBytes) return AllreduceAlgorithm::kHalvingDoubling;
  return AllreduceAlgorithm::kRing;
}

bool HierarchicalSmallFits(size_t bytes, int ranks_per_host) {
  return ranks_per_host > 1 && bytes <= kOneShotMaxBytes &&
         bytes * static_cast<size_t>(ranks_per_host - 1) <= kOneShotMaxSummedBytes;
}

Status AllreduceWith(AllreduceAlgorithm algorithm, int hosts, Comm& comm, transport::Region& buf,
                     size_t offset_bytes, size_t count, DataType dtype, Scratch& scratch) {
  if (algorithm == AllreduceAlgorithm::kAuto && comm.device != nullptr) {
    algorithm = ChooseAllreduceAlgorithm(count * DataTypeSize(dtype), comm.size(), hosts,
                                         comm.host_area != nullptr);
  }
  switch (algorithm) {
    case AllreduceAlgorithm::kOneShot:
      return OneShotAllreduce(comm, buf, offset_bytes, count, dtype);
    case AllreduceAlgorithm::kRecursiveDoubling:
      return RecursiveDoublingAllreduce(comm, buf, offset_bytes, count, dtype, scratch);
    case AllreduceAlgorithm::kHalvingDoubling:
      return HalvingDoublingAllreduce(comm, buf, offset_bytes, count, dtype, scratch);
    default:
      return RingAllreduce(comm, buf, offset_bytes, count, dtype, scratch);
  }
}

Status AllreduceWith(AllreduceAlgorithm algorithm, int hosts, Comm& comm,
                     const std::vector<Extent>& extents, DataType dtype, Scratch& scratch) {
  if (algorithm == AllreduceAlgorithm::kAuto && comm.device != nullptr) {
    size_t bytes = 0;
    for (const Extent& e : extents) bytes += e.nbytes;
    algorithm = ChooseAllreduceAlgorithm(bytes, comm.size(), hosts, comm.host_area != nullptr);
  }
  switch (algorithm) {
    case AllreduceAlgorithm::kOneShot:
      return OneShotAllreduce(comm, extents, dtype);
    case AllreduceAlgorithm::kRecursiveDoubling:
      return RecursiveDoublingAllreduce(comm, extents, dtype, scratch);
    case AllreduceAlgorithm::kHalvingDoubling:
      return HalvingDoublingAllreduce(comm, extents, dtype, scratch);
    default:
      return RingAllreduce(comm, extents, dtype, scratch);
  }
}

std::vector<int> PlanConnections(int rank, int size, int direct_max_ranks,
                                 const HostGroups* hierarchical) {
  std::vector<int> peers;
  if (size <= std::max(direct_max_ranks, 2)) {
    for (int r = 0; r < size; ++r) {
      if (r != rank) peers.push_back(r);
    }
    return peers;
  }
  // The rings' neighbours, then the r XOR 2^k partners.
  peers = PlanFullRingPeers(rank, size, hierarchical);
  for (int mask = 1; mask < size; mask <<= 1) {
    const int partner = rank ^ mask;
    if (partner < size) peers.push_back(partner);
  }
  // Hierarchical allreduce of small buffers: recursive doubling within the cross-host group.
  if (hierarchical != nullptr) {
    const auto& cross = hierarchical->cross;
    const auto me = std::find(cross.begin(), cross.end(), rank);
    if (me != cross.end()) {
      const size_t i = static_cast<size_t>(me - cross.begin());
      for (size_t mask = 1; mask < cross.size(); mask <<= 1) {
        if ((i ^ mask) < cross.size()) peers.push_back(cross[i ^ mask]);
      }
    }
  }
  Normalize(rank, &peers);
  return peers;
}

std::vector<int> PlanFullRingPeers(int rank, int size, const HostGroups* hierarchical) {
  std::vector<int> peers;
  if (size > 1) {
    peers.push_back((rank + 1) % size);
    peers.push_back((rank + size - 1) % size);
  }
  if (hierarchical != nullptr) {
    AddRingNeighbours(hierarchical->local, rank, &peers);
    AddRingNeighbours(hierarchical->cross, rank, &peers);
  }
  Normalize(rank, &peers);
  return peers;
}

}  // namespace kolo::collectives
