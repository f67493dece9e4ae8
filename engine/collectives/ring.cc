// The ring collectives: each is a plan of pieces (pipeline.h) run by RunRing.
#include <algorithm>
#include <numeric>

#include "engine/collectives/collectives.h"
#include "engine/collectives/pipeline.h"

namespace kolo::collectives {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

Status CheckComm(const Comm& comm) {
  if (comm.device == nullptr) return InvalidArgument("collective called with a null device");
  if (comm.chunk_bytes == 0) return InvalidArgument("chunk_bytes is 0; it must be positive");
  return Status::OK();
}

Status CheckRange(const transport::Region& buf, size_t offset, size_t nbytes, const char* what) {
  if (offset > buf.size() || nbytes > buf.size() - offset) {
    return InvalidArgument("{}: bytes [{}, {}) exceed the {}-byte buffer", what, offset,
                           offset + nbytes, buf.size());
  }
  return Status::OK();
}

// Which part of the allreduce a plan covers: the whole of it, only its reduce-scatter (rank r of
// n ends holding segment r + 1 mod n summed over the ring), or only its allgather (rank r starts
// holding that segment and ends with every segment).
enum class Steps { kAll, kReduceScatter, kAllgather };

// The plan for `rank` of a ring of `n` (positions 0..n-1; left and right are positions too).
RingPlan AllreducePlan(int rank, int n, size_t offset, size_t count, size_t elem,
                       size_t chunk_bytes, const ExtentMap& map, Steps which = Steps::kAll) {
  const size_t piece = std::max(elem, chunk_bytes / elem * elem);
  const std::vector<size_t> bounds = EvenSplit(count, n);
  auto segment = [&](int s) {
    const size_t i = static_cast<size_t>(Mod(s, n));
    return Span{offset + bounds[i] * elem, (bounds[i + 1] - bounds[i]) * elem};
  };
  RingPlan plan;
  plan.left = Mod(rank - 1, n);
  plan.right = Mod(rank + 1, n);
  plan.first = Phase::kReduceScatter;
  plan.second = Phase::kAllgather;
  std::vector<Span> steps;
  std::vector<bool> combine;
  const int first = which == Steps::kAllgather ? n - 1 : 0;
  const int end = which == Steps::kReduceScatter ? n - 1 : 2 * (n - 1);
  for (int t = first; t < end; ++t) {
    const bool scatter = t < n - 1;
    steps.push_back(segment(scatter ? rank - 1 - t : rank - (t - n + 1)));
    combine.push_back(scatter);
  }
  // The first send: this rank's own segment, or, for an allgather, the segment its
  // reduce-scatter left summed here.
  const Span own = segment(which == Steps::kAllgather ? rank + 1 : rank);
  LayOutRing(steps, combine, own, piece, &plan, &map);
  if (which == Steps::kAllgather) plan.first = Phase::kAllgather;
  if (which == Steps::kReduceScatter) plan.second = Phase::kReduceScatter;
  // The steps overlap; the reduce-scatter phase ends with its last piece.
  for (size_t i = 0; i < plan.recvs.size(); ++i) {
    if (plan.recvs[i].combine) plan.split = i + 1;
  }
  return plan;
}

// Allreduce (or its exchange-only twin) over the concatenated bytes of `buf`, starting at virtual
// offset `offset_bytes`.
Status Allreduce(Comm& comm, const ExtentMap& buf, size_t offset_bytes, size_t count,
                 DataType dtype, Scratch& scratch, bool reduce) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  const uint32_t sequence = comm.sequence++;
  const size_t elem = DataTypeSize(dtype);
  const char* name = reduce ? "ring allreduce" : "ring exchange";
  if (offset_bytes > buf.size() || count > (buf.size() - offset_bytes) / elem) {
    return InvalidArgument("{}: {} {} elements at byte {} exceed the {}-byte buffer", name, count,
                           DataTypeName(dtype), offset_bytes, buf.size());
  }
  const int n = comm.size();
  if (n == 1 || count == 0) return Status::OK();
  RingPlan plan = AllreducePlan(comm.rank(), n, offset_bytes, count, elem, comm.chunk_bytes, buf);
  if (!reduce) plan.first = plan.second = Phase::kSendRecv;
  return RunRing(comm, buf, plan, reduce ? OpCode::kAllreduce : OpCode::kExchange, sequence, dtype,
                 reduce, scratch, [&] {
                   return fmt::format("{} of {} {} elements", name, count, DataTypeName(dtype));
                 });
}

// Where `rank` sits in `group`, or -1.
int PositionIn(const std::vector<int>& group, int rank) {
  const auto it = std::find(group.begin(), group.end(), rank);
  return it == group.end() ? -1 : static_cast<int>(it - group.begin());
}

Status CheckGroups(const Comm& comm, const HostGroups& g) {
  const int n = comm.size();
  for (const std::vector<int>* group : {&g.local, &g.cross}) {
    for (int r : *group) {
      if (r < 0 || r >= n) {
        return InvalidArgument("hierarchical allreduce: rank {} in a group is not a rank (size {})",
                               r, n);
      }
    }
  }
  if (PositionIn(g.local, comm.rank()) < 0 || PositionIn(g.cross, comm.rank()) < 0) {
    return InvalidArgument(
        "hierarchical allreduce: rank {} is missing from its own groups (local [{}], cross [{}])",
        comm.rank(), fmt::join(g.local, ","), fmt::join(g.cross, ","));
  }
  if (g.local.size() * g.cross.size() != static_cast<size_t>(n)) {
    return InvalidArgument(
        "hierarchical allreduce: {} ranks per host times {} hosts is not the job's {} ranks (every "
        "host must have the same number of ranks)",
        g.local.size(), g.cross.size(), n);
  }
  return Status::OK();
}

// The smallest piece the ring across hosts cuts its segments into.
constexpr size_t kMinCrossPieceBytes = 64 << 10;

// `plan`, laid out on positions of `group`, with the positions replaced by their ranks.
RingPlan OnGroup(const std::vector<int>& group, RingPlan plan) {
  plan.left = group[static_cast<size_t>(plan.left)];
  plan.right = group[static_cast<size_t>(plan.right)];
  return plan;
}

Status Hierarchical(Comm& comm, const HostGroups& groups, const ExtentMap& buf, size_t offset_bytes,
                    size_t count, DataType dtype, HierarchicalScratch& scratch) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  const size_t elem = DataTypeSize(dtype);
  // Every rank computes the same chunks from the same count, and takes three sequence numbers per
  // chunk whatever it then skips, so that the counts stay equal across the job.
  const size_t chunks =
      std::clamp<size_t>(count * elem / std::max<size_t>(comm.hierarchical_chunk_bytes, 1), 1,
                         Comm::kMaxHierarchicalChunks);
  const uint32_t first_sequence = comm.sequence;
  comm.sequence += static_cast<uint32_t>(3 * chunks);
  KOLO_RETURN_IF_ERROR(CheckGroups(comm, groups));
  if (offset_bytes > buf.size() || count > (buf.size() - offset_bytes) / elem) {
    return InvalidArgument(
        "hierarchical allreduce: {} {} elements at byte {} exceed the {}-byte buffer", count,
        DataTypeName(dtype), offset_bytes, buf.size());
  }
  if (comm.size() == 1 || count == 0) return Status::OK();
  const int per_host = static_cast<int>(groups.local.size());
  const int hosts = static_cast<int>(groups.cross.size());
  const int local = PositionIn(groups.local, comm.rank());
  const int host = PositionIn(groups.cross, comm.rank());
  // Lane 0: the ring within the host, every chunk's reduce-scatter then every chunk's allgather
  // (chunk c's once chunk c has crossed hosts). Lane 1: the ring across hosts, chunk by chunk,
  // each once its reduce-scatter is done.
  std::vector<Lane> lanes(2);
  lanes[0].buf = lanes[1].buf = &buf;
  lanes[0].scratch = &scratch.local;
  lanes[1].scratch = &scratch.cross;
  const std::vector<size_t> chunk_bounds = EvenSplit(count, static_cast<int>(chunks));
  auto chunk_offset = [&](size_t c) { return offset_bytes + chunk_bounds[c] * elem; };
  auto chunk_count = [&](size_t c) { return chunk_bounds[c + 1] - chunk_bounds[c]; };
  for (size_t c = 0; c < chunks; ++c) {
    const uint32_t sequence = first_sequence + static_cast<uint32_t>(3 * c);
    if (per_host > 1) {
      lanes[0].steps.push_back(LaneStep{
          OnGroup(groups.local, AllreducePlan(local, per_host, chunk_offset(c), chunk_count(c),
                                              elem, comm.chunk_bytes, buf, Steps::kReduceScatter)),
          OpCode::kHierReduceScatter, sequence, dtype, /*reduce=*/true});
    }
    if (hosts == 1) continue;
    // The slice the reduce-scatter left summed here, the one this rank carries across hosts.
    const std::vector<size_t> bounds = EvenSplit(chunk_count(c), per_host);
    const size_t slice = static_cast<size_t>((local + 1) % per_host);
    const size_t slice_count = bounds[slice + 1] - bounds[slice];
    LaneStep cross{RingPlan{}, OpCode::kHierCross, sequence + 1, dtype, /*reduce=*/true};
    if (slice_count > 0) {
      // A slice's segments are small (a chunk / ranks per host / hosts): cut them into a few
      // pieces at least, so that each hop forwards a piece while the next arrives instead of
      // waiting for a whole segment.
      const size_t piece = std::min(
          comm.chunk_bytes, std::max<size_t>(kMinCrossPieceBytes,
                                             slice_count * elem / static_cast<size_t>(hosts) / 4));
      cross.plan =
          OnGroup(groups.cross, AllreducePlan(host, hosts, chunk_offset(c) + bounds[slice] * elem,
                                              slice_count, elem, piece, buf));
    }
    if (per_host > 1) {
      cross.after_lane = 0;
      cross.after_step = static_cast<int>(c);
    }
    lanes[1].steps.push_back(std::move(cross));
  }
  for (size_t c = 0; per_host > 1 && c < chunks; ++c) {
    LaneStep gather{
        OnGroup(groups.local, AllreducePlan(local, per_host, chunk_offset(c), chunk_count(c), elem,
                                            comm.chunk_bytes, buf, Steps::kAllgather)),
        OpCode::kHierAllgather, first_sequence + static_cast<uint32_t>(3 * c + 2), dtype,
        /*reduce=*/false};
    // After the chunk's ring across hosts, or, on one host, after its own reduce-scatter.
    gather.after_lane = hosts > 1 ? 1 : 0;
    gather.after_step = static_cast<int>(c);
    lanes[0].steps.push_back(std::move(gather));
  }
  return RunLanes(comm, lanes, Phase::kHierarchical, [&] {
    return fmt::format("hierarchical allreduce of {} {} elements ({} hosts x {} ranks, {} chunks)",
                       count, DataTypeName(dtype), hosts, per_host, chunks);
  });
}

// The extents as a map, after checking each holds whole elements inside its region.
StatusOr<ExtentMap> MapExtents(const std::vector<Extent>& extents, DataType dtype,
                               const char* name) {
  const size_t elem = DataTypeSize(dtype);
  for (const Extent& e : extents) {
    if (e.region == nullptr || e.offset > e.region->size() ||
        e.nbytes > e.region->size() - e.offset || e.nbytes % elem != 0) {
      return InvalidArgument(
          "{}: an extent of {} bytes at offset {} is not a whole number of {} elements inside its "
          "region",
          name, e.nbytes, e.offset, DataTypeName(dtype));
    }
  }
  return ExtentMap(extents);
}

}  // namespace

Status HierarchicalAllreduce(Comm& comm, const HostGroups& groups, transport::Region& buf,
                             size_t offset_bytes, size_t count, DataType dtype,
                             HierarchicalScratch& scratch) {
  return Hierarchical(comm, groups, ExtentMap(buf), offset_bytes, count, dtype, scratch);
}

Status HierarchicalAllreduce(Comm& comm, const HostGroups& groups,
                             const std::vector<Extent>& extents, DataType dtype,
                             HierarchicalScratch& scratch) {
  KOLO_ASSIGN_OR_RETURN(ExtentMap map, MapExtents(extents, dtype, "hierarchical allreduce"));
  return Hierarchical(comm, groups, map, 0, map.size() / DataTypeSize(dtype), dtype, scratch);
}

Status RingAllreduce(Comm& comm, transport::Region& buf, size_t offset_bytes, size_t count,
                     DataType dtype, Scratch& scratch) {
  return Allreduce(comm, ExtentMap(buf), offset_bytes, count, dtype, scratch, /*reduce=*/true);
}

Status RingAllreduce(Comm& comm, const std::vector<Extent>& extents, DataType dtype,
                     Scratch& scratch) {
  KOLO_ASSIGN_OR_RETURN(ExtentMap map, MapExtents(extents, dtype, "ring allreduce"));
  return Allreduce(comm, map, 0, map.size() / DataTypeSize(dtype), dtype, scratch,
                   /*reduce=*/true);
}

Status RingExchangeNoReduce(Comm& comm, transport::Region& buf, size_t offset_bytes, size_t count,
                            DataType dtype) {
  Scratch unused;  // every piece lands in place
  return Allreduce(comm, ExtentMap(buf), offset_bytes, count, dtype, unused, /*reduce=*/false);
}

Status RingBroadcast(Comm& comm, transport::Region& buf, size_t offset_bytes, size_t nbytes,
                     int root) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  const uint32_t sequence = comm.sequence++;
  const int n = comm.size();
  if (root < 0 || root >= n) {
    return InvalidArgument("ring broadcast: root {} is not a rank (size {})", root, n);
  }
  KOLO_RETURN_IF_ERROR(CheckRange(buf, offset_bytes, nbytes, "ring broadcast"));
  if (n == 1 || nbytes == 0) return Status::OK();
  // Position p = rank - root along the ring: p receives from p-1 and forwards to p+1.
  const int position = Mod(comm.rank() - root, n);
  RingPlan plan;
  plan.left = Mod(comm.rank() - 1, n);
  plan.right = Mod(comm.rank() + 1, n);
  plan.first = plan.second = Phase::kBroadcast;
  std::vector<RecvPiece> pieces;
  AppendPieces(offset_bytes, nbytes, comm.chunk_bytes, &pieces);
  if (position > 0) plan.recvs = pieces;
  for (size_t k = 0; position < n - 1 && k < pieces.size(); ++k) {
    // Each piece is forwarded as soon as it has arrived; the root has nothing to wait for.
    plan.sends.push_back(
        SendPiece{pieces[k].offset, pieces[k].nbytes, position > 0 ? static_cast<int64_t>(k) : -1});
  }
  Scratch unused;
  return RunRing(
      comm, ExtentMap(buf), plan, OpCode::kBroadcast, sequence, DataType::kUInt8, false, unused,
      [&] { return fmt::format("ring broadcast of {} bytes from rank {}", nbytes, root); });
}

Status RingAllgatherv(Comm& comm, transport::Region& buf, size_t offset_bytes,
                      const std::vector<size_t>& bytes_per_rank) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  const uint32_t sequence = comm.sequence++;
  const int n = comm.size();
  if (bytes_per_rank.size() != static_cast<size_t>(n)) {
    return InvalidArgument("ring allgatherv: {} block sizes given for {} ranks",
                           bytes_per_rank.size(), n);
  }
  std::vector<size_t> displ(static_cast<size_t>(n) + 1, offset_bytes);
  for (int r = 0; r < n; ++r) displ[r + 1] = displ[r] + bytes_per_rank[static_cast<size_t>(r)];
  KOLO_RETURN_IF_ERROR(CheckRange(buf, offset_bytes, displ[static_cast<size_t>(n)] - offset_bytes,
                                  "ring allgatherv"));
  if (n == 1) return Status::OK();
  // Step s receives block rank-s-1; send step s > 0 forwards what receive step s-1 got.
  RingPlan plan;
  plan.left = Mod(comm.rank() - 1, n);
  plan.right = Mod(comm.rank() + 1, n);
  plan.first = plan.second = Phase::kAllgather;
  auto block = [&](int b) {
    const size_t i = static_cast<size_t>(Mod(b, n));
    return Span{displ[i], displ[i + 1] - displ[i]};
  };
  std::vector<Span> steps;
  for (int s = 0; s < n - 1; ++s) steps.push_back(block(comm.rank() - s - 1));
  LayOutRing(steps, std::vector<bool>(steps.size(), false), block(comm.rank()), comm.chunk_bytes,
             &plan);
  Scratch unused;
  return RunRing(comm, ExtentMap(buf), plan, OpCode::kAllgatherv, sequence, DataType::kUInt8, false,
                 unused, [&] {
                   return fmt::format("ring allgatherv of {} bytes",
                                      displ[static_cast<size_t>(n)] - offset_bytes);
                 });
}

}  // namespace kolo::collectives
