// The latency-optimal allreduces: recursive doubling and recursive halving-doubling
// (Rabenseifner), for any rank count. See collectives.h for their contracts and
// engine/docs/collectives.md for when each is chosen.
//
// A rank count N that is not a power of two is folded onto the largest power of two p <= N first:
// rank p + i (i < N - p) sends its whole buffer to rank i, which adds it to its own; the p ranks
// then run the algorithm; at the end rank i sends the result back to rank p + i. The folded ranks
// wait two messages, the others log2 p exchanges.
//
// Every rank ends with the same bits: recursive doubling adds the same two partial sums on both
// partners of an exchange (a + b on one, b + a on the other, equal in IEEE arithmetic and in every
// kolo reduction kernel, which add in float32 or exactly); halving-doubling reduces each block on
// one rank only and then copies it.
#include <algorithm>
#include <cstring>

#include "engine/collectives/collectives.h"
#include "engine/collectives/pipeline.h"
#include "engine/collectives/tags.h"
#include "engine/kernels/reduce.h"

namespace kolo::collectives {
namespace {

using transport::Completion;
using transport::Region;

// Message index of the fold and of the unfold within a call; the exchanges are 1..2 log2 p.
constexpr uint32_t kFoldIndex = 0;
constexpr uint32_t kUnfoldIndex = 0xffff;

// The buffer being reduced and the scratch the partner's bytes land in.
struct Buffers {
  Region* data = nullptr;
  size_t data_offset = 0;
  Region* recv = nullptr;
  size_t recv_offset = 0;
};

// The ranks an algorithm runs over: the whole communicator (ranks null), or a group of it (the
// ranks of one cross-host group of hierarchical allreduce), this rank being member `me` of `n`.
struct Members {
  const std::vector<int>* ranks = nullptr;
  int me = 0;
  int n = 1;
  int at(int i) const { return ranks == nullptr ? i : (*ranks)[static_cast<size_t>(i)]; }
};

Members Everyone(const Comm& comm) { return Members{nullptr, comm.rank(), comm.size()}; }

// Waits for `n` completions; every receive must have brought `expected` bytes.
Status Await(Comm& comm, size_t n, size_t expected, const char* what, int step) {
  std::vector<Completion> done;
  done.reserve(n);
  Status s = transport::WaitFor(*comm.device, n, &done, comm.timeout);
  if (!s.ok()) return s.WithContext(fmt::format("rank {}: {} (step {})", comm.rank(), what, step));
  for (const Completion& c : done) {
    if (c.kind == transport::OpKind::kRecv && c.nbytes != expected) {
      return ProtocolError("rank {}: {} (step {}): rank {} sent {} bytes, expected {}", comm.rank(),
                           what, step, c.peer, c.nbytes, expected);
    }
  }
  return Status::OK();
}

// Posting may fail at once (a peer's message of the wrong size waits): name the call.
Status Posted(const Comm& comm, Status s, const char* what) {
  return s.ok() ? s : s.WithContext(fmt::format("rank {}: {}", comm.rank(), what));
}

int LargestPowerOfTwo(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// The fold before the algorithm. Returns true when this rank is folded away (it then waits for
// the unfold and is done).
StatusOr<bool> Fold(Comm& comm, const Members& m, const Buffers& b, size_t bytes, size_t count,
                    DataType dtype, int p, OpCode op, uint32_t sequence, const char* what) {
  const int rank = m.me;
  const int n = m.n;
  if (rank >= p) {
    transport::Pair& pair = comm.device->pair(m.at(rank - p));
    KOLO_RETURN_IF_ERROR(Posted(
        comm, pair.Send(*b.data, b.data_offset, bytes, CollectiveTag(op, sequence, kFoldIndex)),
        what));
    // The result arrives only after the fold was read: the receive may target the same bytes.
    KOLO_RETURN_IF_ERROR(Posted(
        comm, pair.Recv(*b.data, b.data_offset, bytes, CollectiveTag(op, sequence, kUnfoldIndex)),
        what));
    KOLO_RETURN_IF_ERROR(Await(comm, 2, bytes, what, -1));
    return true;
  }
  if (rank + p < n) {
    KOLO_RETURN_IF_ERROR(
        Posted(comm,
               comm.device->pair(m.at(rank + p))
                   .Recv(*b.recv, b.recv_offset, bytes, CollectiveTag(op, sequence, kFoldIndex)),
               what));
    KOLO_RETURN_IF_ERROR(Await(comm, 1, bytes, what, 0));
    kernels::ReduceSum(dtype, b.data->data() + b.data_offset, b.recv->data() + b.recv_offset,
                       count);
  }
  return false;
}

Status Unfold(Comm& comm, const Members& m, const Buffers& b, size_t bytes, int p, OpCode op,
              uint32_t sequence, const char* what) {
  const int rank = m.me;
  if (rank + p >= m.n) return Status::OK();
  KOLO_RETURN_IF_ERROR(
      Posted(comm,
             comm.device->pair(m.at(rank + p))
                 .Send(*b.data, b.data_offset, bytes, CollectiveTag(op, sequence, kUnfoldIndex)),
             what));
  return Await(comm, 1, 0, what, -1);
}

Status CheckArgs(const Comm& comm, const Region& buf, size_t offset_bytes, size_t count,
                 DataType dtype, const char* what) {
  if (comm.device == nullptr) return InvalidArgument("collective called with a null device");
  const size_t elem = DataTypeSize(dtype);
  if (offset_bytes > buf.size() || count > (buf.size() - offset_bytes) / elem) {
    return InvalidArgument("{}: {} {} elements at byte {} exceed the {}-byte buffer", what, count,
                           DataTypeName(dtype), offset_bytes, buf.size());
  }
  return Status::OK();
}

Status RecursiveDoubling(Comm& comm, const Members& m, const Buffers& b, size_t count,
                         DataType dtype, uint32_t sequence) {
  constexpr const char* kWhat = "recursive-doubling allreduce";
  const size_t bytes = count * DataTypeSize(dtype);
  const int p = LargestPowerOfTwo(m.n);
  const OpCode op = OpCode::kRecursiveDoubling;
  PhaseScope phase(comm, Phase::kRecursiveDoubling);
  KOLO_ASSIGN_OR_RETURN(const bool folded,
                        Fold(comm, m, b, bytes, count, dtype, p, op, sequence, kWhat));
  if (folded) return Status::OK();
  const int rank = m.me;
  uint32_t step = 1;
  for (int mask = 1; mask < p; mask <<= 1, ++step) {
    transport::Pair& pair = comm.device->pair(m.at(rank ^ mask));
    const uint64_t tag = CollectiveTag(op, sequence, step);
    KOLO_RETURN_IF_ERROR(Posted(comm, pair.Recv(*b.recv, b.recv_offset, bytes, tag), kWhat));
    KOLO_RETURN_IF_ERROR(Posted(comm, pair.Send(*b.data, b.data_offset, bytes, tag), kWhat));
    // Both before adding: the send reads the bytes the sum overwrites.
    KOLO_RETURN_IF_ERROR(Await(comm, 2, bytes, kWhat, static_cast<int>(step)));
    kernels::ReduceSum(dtype, b.data->data() + b.data_offset, b.recv->data() + b.recv_offset,
                       count);
  }
  return Unfold(comm, m, b, bytes, p, op, sequence, kWhat);
}

Status HalvingDoubling(Comm& comm, const Members& m, const Buffers& b, size_t count, DataType dtype,
                       uint32_t sequence) {
  constexpr const char* kWhat = "halving-doubling allreduce";
  const size_t elem = DataTypeSize(dtype);
  const size_t bytes = count * elem;
  const int p = LargestPowerOfTwo(m.n);
  const OpCode op = OpCode::kHalvingDoubling;
  KOLO_ASSIGN_OR_RETURN(const bool folded,
                        Fold(comm, m, b, bytes, count, dtype, p, op, sequence, kWhat));
  if (folded) return Status::OK();
  const int rank = m.me;
  // Block i of p: elements [bounds[i], bounds[i + 1]).
  const std::vector<size_t> bounds = EvenSplit(count, p);
  auto byte_at = [&](int block) { return bounds[static_cast<size_t>(block)] * elem; };
  uint8_t* data = b.data->data() + b.data_offset;
  uint8_t* recv = b.recv->data() + b.recv_offset;
  uint32_t step = 1;
  // Reduce-scatter by recursive halving: each step keeps half of the blocks still held, sends the
  // other half to the partner and adds the partner's copy of the kept half. Rank r ends holding
  // block r summed over every rank.
  {
    PhaseScope phase(comm, Phase::kReduceScatter);
    int lo = 0, hi = p;
    for (int mask = p / 2; mask >= 1; mask >>= 1, ++step) {
      const int mid = lo + (hi - lo) / 2;
      const bool upper = (rank & mask) != 0;
      const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const int send_lo = upper ? lo : mid, send_hi = upper ? mid : hi;
      const size_t keep_bytes = byte_at(keep_hi) - byte_at(keep_lo);
      transport::Pair& pair = comm.device->pair(m.at(rank ^ mask));
      const uint64_t tag = CollectiveTag(op, sequence, step);
      // The kept half and the half sent are disjoint: where the transport can, the partner's
      // bytes are summed into the kept half as they arrive, with no pass through scratch.
      const bool on_arrival = comm.accumulate_on_arrival && pair.CanAccumulate();
      if (on_arrival) {
        const transport::Accumulator acc{&AccumulateSum, static_cast<uintptr_t>(dtype), elem};
        KOLO_RETURN_IF_ERROR(Posted(
            comm,
            pair.RecvAccumulate(*b.data, b.data_offset + byte_at(keep_lo), keep_bytes, tag, acc),
            kWhat));
      } else {
        KOLO_RETURN_IF_ERROR(
            Posted(comm, pair.Recv(*b.recv, b.recv_offset, keep_bytes, tag), kWhat));
      }
      KOLO_RETURN_IF_ERROR(Posted(comm,
                                  pair.Send(*b.data, b.data_offset + byte_at(send_lo),
                                            byte_at(send_hi) - byte_at(send_lo), tag),
                                  kWhat));
      KOLO_RETURN_IF_ERROR(Await(comm, 2, keep_bytes, kWhat, static_cast<int>(step)));
      if (!on_arrival) kernels::ReduceSum(dtype, data + byte_at(keep_lo), recv, keep_bytes / elem);
      lo = keep_lo;
      hi = keep_hi;
    }
  }
  // Allgather by recursive doubling: each step swaps the blocks held with the partner's, which
  // lie next to them, doubling what is held.
  {
    PhaseScope phase(comm, Phase::kAllgather);
    for (int mask = 1; mask < p; mask <<= 1, ++step) {
      const int partner = rank ^ mask;
      const int mine_lo = rank & ~(mask - 1), theirs_lo = partner & ~(mask - 1);
      const size_t mine_bytes = byte_at(mine_lo + mask) - byte_at(mine_lo);
      const size_t theirs_bytes = byte_at(theirs_lo + mask) - byte_at(theirs_lo);
      transport::Pair& pair = comm.device->pair(m.at(partner));
      const uint64_t tag = CollectiveTag(op, sequence, step);
      KOLO_RETURN_IF_ERROR(Posted(
          comm, pair.Recv(*b.data, b.data_offset + byte_at(theirs_lo), theirs_bytes, tag), kWhat));
      KOLO_RETURN_IF_ERROR(Posted(
          comm, pair.Send(*b.data, b.data_offset + byte_at(mine_lo), mine_bytes, tag), kWhat));
      KOLO_RETURN_IF_ERROR(Await(comm, 2, theirs_bytes, kWhat, static_cast<int>(step)));
    }
  }
  return Unfold(comm, m, b, bytes, p, op, sequence, kWhat);
}

using Algorithm = Status (*)(Comm&, const Members&, const Buffers&, size_t, DataType, uint32_t);

// Over the members `m` (the communicator, or a group of it).
Status RunInPlace(Comm& comm, const Members& m, Region& buf, size_t offset_bytes, size_t count,
                  DataType dtype, Scratch& scratch, Algorithm algorithm, const char* what) {
  KOLO_RETURN_IF_ERROR(CheckArgs(comm, buf, offset_bytes, count, dtype, what));
  const uint32_t sequence = comm.sequence++;
  if (m.n == 1 || count == 0) return Status::OK();
  KOLO_ASSIGN_OR_RETURN(Region * recv, scratch.Get(*comm.device, count * DataTypeSize(dtype)));
  return algorithm(comm, m, Buffers{&buf, offset_bytes, recv, 0}, count, dtype, sequence);
}

// This rank as a member of `group`; InvalidArgument when the group does not hold it.
StatusOr<Members> MemberOf(const Comm& comm, const std::vector<int>& group, const char* what) {
  const auto me = std::find(group.begin(), group.end(), comm.rank());
  if (me == group.end()) {
    return InvalidArgument("rank {}: {}: the group does not hold this rank", comm.rank(), what);
  }
  return Members{&group, static_cast<int>(me - group.begin()), static_cast<int>(group.size())};
}

// The extents are copied into one staging buffer, reduced there and copied back: these
// algorithms serve buffers small enough that the copies cost less than a message each extent
// would take.
Status RunOnExtents(Comm& comm, const Members& m, const std::vector<Extent>& extents,
                    DataType dtype, Scratch& scratch, Algorithm algorithm, const char* what) {
  if (comm.device == nullptr) return InvalidArgument("collective called with a null device");
  const size_t elem = DataTypeSize(dtype);
  size_t bytes = 0;
  for (const Extent& e : extents) {
    if (e.region == nullptr || e.offset > e.region->size() ||
        e.nbytes > e.region->size() - e.offset || e.nbytes % elem != 0) {
      return InvalidArgument(
          "{}: an extent of {} bytes at {} is not whole {} elements of its region", what, e.nbytes,
          e.offset, DataTypeName(dtype));
    }
    bytes += e.nbytes;
  }
  const uint32_t sequence = comm.sequence++;
  if (m.n == 1 || bytes == 0) return Status::OK();
  KOLO_ASSIGN_OR_RETURN(Region * space, scratch.Get(*comm.device, 2 * bytes));
  size_t at = 0;
  for (const Extent& e : extents) {
    std::memcpy(space->data() + at, e.region->data() + e.offset, e.nbytes);
    at += e.nbytes;
  }
  KOLO_RETURN_IF_ERROR(algorithm(comm, Everyone(comm), Buffers{space, 0, space, bytes},
                                 bytes / elem, dtype, sequence));
  at = 0;
  for (const Extent& e : extents) {
    std::memcpy(e.region->data() + e.offset, space->data() + at, e.nbytes);
    at += e.nbytes;
  }
  return Status::OK();
}

}  // namespace

Status RecursiveDoublingAllreduce(Comm& comm, transport::Region& buf, size_t offset_bytes,
                                  size_t count, DataType dtype, Scratch& scratch) {
  return RunInPlace(comm, Everyone(comm), buf, offset_bytes, count, dtype, scratch,
                    &RecursiveDoubling, "recursive-doubling allreduce");
}

Status RecursiveDoublingAllreduce(Comm& comm, const std::vector<Extent>& extents, DataType dtype,
                                  Scratch& scratch) {
  return RunOnExtents(comm, Everyone(comm), extents, dtype, scratch, &RecursiveDoubling,
                      "recursive-doubling allreduce");
}

Status RecursiveDoublingAllreduce(Comm& comm, const std::vector<int>& group, transport::Region& buf,
                                  size_t offset_bytes, size_t count, DataType dtype,
                                  Scratch& scratch) {
  constexpr const char* kWhat = "recursive-doubling allreduce across hosts";
  KOLO_ASSIGN_OR_RETURN(const Members m, MemberOf(comm, group, kWhat));
  return RunInPlace(comm, m, buf, offset_bytes, count, dtype, scratch, &RecursiveDoubling, kWhat);
}

Status RecursiveDoublingAllreduce(Comm& comm, const std::vector<int>& group,
                                  const std::vector<Extent>& extents, DataType dtype,
                                  Scratch& scratch) {
  constexpr const char* kWhat = "recursive-doubling allreduce across hosts";
  KOLO_ASSIGN_OR_RETURN(const Members m, MemberOf(comm, group, kWhat));
  return RunOnExtents(comm, m, extents, dtype, scratch, &RecursiveDoubling, kWhat);
}

Status HalvingDoublingAllreduce(Comm& comm, transport::Region& buf, size_t offset_bytes,
                                size_t count, DataType dtype, Scratch& scratch) {
  return RunInPlace(comm, Everyone(comm), buf, offset_bytes, count, dtype, scratch,
                    &HalvingDoubling, "halving-doubling allreduce");
}

Status HalvingDoublingAllreduce(Comm& comm, const std::vector<Extent>& extents, DataType dtype,
                                Scratch& scratch) {
  return RunOnExtents(comm, Everyone(comm), extents, dtype, scratch, &HalvingDoubling,
                      "halving-doubling allreduce");
}

}  // namespace kolo::collectives
