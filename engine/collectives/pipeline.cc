#include "engine/collectives/pipeline.h"

#include <algorithm>

#include "engine/kernels/reduce.h"

namespace kolo::collectives {
namespace {

// Receives and sends kept posted ahead. Receives run deeper than sends: a piece is reduced only
// once it has arrived whole, and a deep receive window lets the socket drain into the next slots
// meanwhile (on loopback, 8 against 4 made the 2-rank ring 4% faster and the link row 2%, with no
// change at 4 ranks). More only adds scratch.
constexpr size_t kRecvDepth = 8;
constexpr size_t kSendDepth = 4;
// How far behind its arrival a piece is forwarded: enough slack that a neighbour descheduled for
// a moment does not stall the ring, little enough that the piece is still in the cache (1 MiB
// beat 2 MiB on loopback at 2 ranks; the lag is never under 2 pieces).
constexpr size_t kForwardLagBytes = 1 << 20;

// Balances the phase callbacks even when the ring fails half-way.
class PhaseScope {
 public:
  PhaseScope(const Comm& comm, Phase phase) : comm_(comm), phase_(phase) { Report(true); }
  ~PhaseScope() { Report(false); }
  void Switch(Phase next) {
    if (next == phase_) return;
    Report(false);
    phase_ = next;
    Report(true);
  }

 private:
  void Report(bool start) {
    if (comm_.on_phase) comm_.on_phase(phase_, start);
  }
  const Comm& comm_;
  Phase phase_;
};

// transport::Accumulator's combiner for a sum; `arg` is the DataType.
void AccumulateSum(uint8_t* dst, const uint8_t* src, size_t nbytes, uintptr_t arg) {
  const auto dtype = static_cast<DataType>(arg);
  kernels::ReduceSum(dtype, dst, src, nbytes / DataTypeSize(dtype));
}

}  // namespace

ExtentMap::ExtentMap(std::vector<Extent> extents) : extents_(std::move(extents)) {
  starts_.push_back(0);
  for (const Extent& e : extents_) starts_.push_back(starts_.back() + e.nbytes);
}

ExtentMap::ExtentMap(transport::Region& region)
    : ExtentMap(std::vector<Extent>{{&region, 0, region.size()}}) {}

size_t ExtentMap::Index(size_t offset) const {
  // The last extent starting at or before `offset` that is not empty.
  auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, offset);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

std::pair<transport::Region*, size_t> ExtentMap::Locate(size_t offset) const {
  const size_t i = Index(offset);
  return {extents_[i].region, extents_[i].offset + (offset - starts_[i])};
}

size_t ExtentMap::ExtentEnd(size_t offset) const { return starts_[Index(offset) + 1]; }

std::vector<size_t> EvenSplit(size_t count, int parts) {
  std::vector<size_t> bounds(static_cast<size_t>(parts) + 1, 0);
  const size_t n = static_cast<size_t>(parts);
  for (size_t i = 0; i < n; ++i) bounds[i + 1] = bounds[i] + count / n + (i < count % n ? 1 : 0);
  return bounds;
}

void AppendPieces(size_t offset, size_t nbytes, size_t piece_bytes, std::vector<RecvPiece>* out) {
  for (size_t done = 0; done < nbytes; done += piece_bytes) {
    out->push_back(RecvPiece{offset + done, std::min(piece_bytes, nbytes - done), false});
  }
}

void LayOutRing(const std::vector<Span>& recv_steps, const std::vector<bool>& combine_steps,
                Span own, size_t piece_bytes, RingPlan* plan, const ExtentMap* map) {
  struct Slot {
    size_t key;
    size_t step;
    size_t piece;
    bool operator<(const Slot& o) const { return key != o.key ? key < o.key : step < o.step; }
  };
  const size_t lag = std::max<size_t>(2, kForwardLagBytes / piece_bytes);
  // A span's pieces: every piece_bytes from the start of each extent it covers.
  auto cut = [&](const Span& s) {
    std::vector<Span> out;
    for (size_t at = s.offset, end = s.offset + s.nbytes; at < end;) {
      const size_t extent_end = map ? std::min(end, map->ExtentEnd(at)) : end;
      for (; at < extent_end; at += piece_bytes) {
        out.push_back(Span{at, std::min(piece_bytes, extent_end - at)});
      }
      at = extent_end;
    }
    return out;
  };
  auto order = [&](const std::vector<std::vector<Span>>& steps) {
    std::vector<Slot> slots;
    for (size_t t = 0; t < steps.size(); ++t) {
      for (size_t c = 0; c < steps[t].size(); ++c) slots.push_back(Slot{c + t * lag, t, c});
    }
    std::sort(slots.begin(), slots.end());
    return slots;
  };
  std::vector<std::vector<Span>> recv_cuts;
  for (const Span& s : recv_steps) recv_cuts.push_back(cut(s));
  // index[t][c]: position of piece c of receive step t in the receive stream.
  std::vector<std::vector<int64_t>> index(recv_steps.size());
  for (size_t t = 0; t < recv_steps.size(); ++t) index[t].resize(recv_cuts[t].size());
  for (const Slot& s : order(recv_cuts)) {
    const Span& piece = recv_cuts[s.step][s.piece];
    index[s.step][s.piece] = static_cast<int64_t>(plan->recvs.size());
    plan->recvs.push_back(RecvPiece{piece.offset, piece.nbytes, combine_steps[s.step]});
  }
  // Send step t > 0 forwards what receive step t-1 got, cut the same way.
  std::vector<std::vector<Span>> send_cuts = {cut(own)};
  if (!recv_cuts.empty()) send_cuts.insert(send_cuts.end(), recv_cuts.begin(), recv_cuts.end() - 1);
  for (const Slot& s : order(send_cuts)) {
    const Span& piece = send_cuts[s.step][s.piece];
    plan->sends.push_back(SendPiece{piece.offset, piece.nbytes,
                                    s.step == 0 ? int64_t{-1} : index[s.step - 1][s.piece]});
  }
}

Status RunRing(Comm& comm, const ExtentMap& buf, const RingPlan& plan, OpCode op, uint32_t sequence,
               DataType dtype, bool reduce, Scratch& scratch, DescribeFn what) {
  transport::Device& device = *comm.device;
  const size_t num_recvs = plan.recvs.size();
  const size_t num_sends = plan.sends.size();
  transport::Pair* left = num_recvs > 0 ? &device.pair(plan.left) : nullptr;
  transport::Pair* right = num_sends > 0 ? &device.pair(plan.right) : nullptr;
  const size_t elem = DataTypeSize(dtype);
  // Summing a piece as its bytes arrive reads them while they are still in cache, and needs no
  // scratch cycling through the shared cache: on loopback, against receiving whole pieces into
  // scratch and summing from there, the ring's busbw rose 11-17% at 4 ranks on 2 cores and 16% at
  // 2 ranks (medians of alternating runs).
  const bool accumulate =
      reduce && left != nullptr && comm.accumulate_on_arrival && left->CanAccumulate();
  const transport::Accumulator acc{&AccumulateSum, static_cast<uintptr_t>(dtype), elem};
  // Otherwise the pieces to sum arrive whole in scratch slots and are summed from there.
  const bool via_scratch = reduce && !accumulate;
  size_t slot_bytes = 0;
  for (const RecvPiece& p : plan.recvs) {
    if (p.combine && via_scratch) slot_bytes = std::max(slot_bytes, p.nbytes);
  }
  transport::Region* slots = nullptr;
  if (slot_bytes > 0) {
    KOLO_ASSIGN_OR_RETURN(slots, scratch.Get(device, slot_bytes * kRecvDepth));
  }

  size_t recvs_posted = 0, recvs_done = 0, sends_posted = 0, sends_done = 0;
  auto post = [&]() -> Status {
    while (recvs_posted < num_recvs && recvs_posted - recvs_done < kRecvDepth) {
      const RecvPiece& p = plan.recvs[recvs_posted];
      const uint64_t tag = CollectiveTag(op, sequence, static_cast<uint32_t>(recvs_posted));
      if (p.combine && accumulate) {
        auto [region, local] = buf.Locate(p.offset);
        KOLO_RETURN_IF_ERROR(left->RecvAccumulate(*region, local, p.nbytes, tag, acc));
      } else if (p.combine && via_scratch) {
        KOLO_RETURN_IF_ERROR(
            left->Recv(*slots, (recvs_posted % kRecvDepth) * slot_bytes, p.nbytes, tag));
      } else {
        auto [region, local] = buf.Locate(p.offset);
        KOLO_RETURN_IF_ERROR(left->Recv(*region, local, p.nbytes, tag));
      }
      ++recvs_posted;
    }
    while (sends_posted < num_sends && sends_posted - sends_done < kSendDepth) {
      const SendPiece& p = plan.sends[sends_posted];
      if (p.after >= 0 && static_cast<size_t>(p.after) >= recvs_done) break;
      auto [region, local] = buf.Locate(p.offset);
      KOLO_RETURN_IF_ERROR(
          right->Send(*region, local, p.nbytes,
                      CollectiveTag(op, sequence, static_cast<uint32_t>(sends_posted))));
      ++sends_posted;
    }
    return Status::OK();
  };

  PhaseScope phase(comm, plan.split == 0 ? plan.second : plan.first);
  std::vector<transport::Completion> done;
  done.reserve(2 * (kRecvDepth + kSendDepth));
  Status s = post();
  while (s.ok() && (recvs_done < num_recvs || sends_done < num_sends)) {
    done.clear();
    s = device.Poll(&done, comm.timeout);
    for (size_t i = 0; s.ok() && i < done.size(); ++i) {
      const transport::Completion& c = done[i];
      if (c.kind == transport::OpKind::kSend) {
        ++sends_done;
        continue;
      }
      const RecvPiece& p = plan.recvs[recvs_done];
      if (c.nbytes != p.nbytes) {
        s = ProtocolError(
            "rank {} sent {} bytes for piece {} where {} were expected (do all ranks pass the "
            "same sizes?)",
            plan.left, c.nbytes, recvs_done, p.nbytes);
        break;
      }
      if (p.combine && via_scratch) {
        auto [region, local] = buf.Locate(p.offset);
        kernels::ReduceSum(dtype, region->data() + local,
                           slots->data() + (recvs_done % kRecvDepth) * slot_bytes, p.nbytes / elem);
      }
      if (++recvs_done == plan.split) phase.Switch(plan.second);
    }
    if (s.ok()) s = post();
  }
  if (!s.ok()) return s.WithContext(fmt::format("rank {}: {}", comm.rank(), what()));
  return Status::OK();
}

}  // namespace kolo::collectives
