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

RingPlan AllreducePlan(int rank, int n, size_t offset, size_t count, size_t elem,
                       size_t chunk_bytes, const ExtentMap& map) {
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
  for (int t = 0; t < 2 * (n - 1); ++t) {
    const bool scatter = t < n - 1;
    steps.push_back(segment(scatter ? rank - 1 - t : rank - (t - n + 1)));
    combine.push_back(scatter);
  }
  LayOutRing(steps, combine, segment(rank), piece, &plan, &map);
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

}  // namespace

Status RingAllreduce(Comm& comm, transport::Region& buf, size_t offset_bytes, size_t count,
                     DataType dtype, Scratch& scratch) {
  return Allreduce(comm, ExtentMap(buf), offset_bytes, count, dtype, scratch, /*reduce=*/true);
}

Status RingAllreduce(Comm& comm, const std::vector<Extent>& extents, DataType dtype,
                     Scratch& scratch) {
  const size_t elem = DataTypeSize(dtype);
  for (const Extent& e : extents) {
    if (e.region == nullptr || e.offset > e.region->size() ||
        e.nbytes > e.region->size() - e.offset || e.nbytes % elem != 0) {
      return InvalidArgument(
          "ring allreduce: an extent of {} bytes at offset {} is not a whole number of {} "
          "elements inside its region",
          e.nbytes, e.offset, DataTypeName(dtype));
    }
  }
  ExtentMap map(extents);
  return Allreduce(comm, map, 0, map.size() / elem, dtype, scratch, /*reduce=*/true);
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
