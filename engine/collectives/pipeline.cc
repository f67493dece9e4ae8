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

}  // namespace

void AccumulateSum(uint8_t* dst, const uint8_t* src, size_t nbytes, uintptr_t arg) {
  const auto dtype = static_cast<DataType>(arg);
  kernels::ReduceSum(dtype, dst, src, nbytes / DataTypeSize(dtype));
}

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

RingRun::RingRun(Comm& comm, const ExtentMap& buf, const RingPlan& plan, OpCode op,
                 uint32_t sequence, DataType dtype, bool reduce, Scratch& scratch)
    : comm_(comm),
      buf_(buf),
      plan_(plan),
      op_(op),
      sequence_(sequence),
      dtype_(dtype),
      elem_(DataTypeSize(dtype)),
      reduce_(reduce),
      scratch_(scratch) {}

Status RingRun::Start() {
  transport::Device& device = *comm_.device;
  left_ = plan_.recvs.empty() ? nullptr : &device.pair(plan_.left);
  right_ = plan_.sends.empty() ? nullptr : &device.pair(plan_.right);
  // Summing a piece as its bytes arrive reads them while they are still in cache, and needs no
  // scratch cycling through the shared cache: on loopback, against receiving whole pieces into
  // scratch and summing from there, the ring's busbw rose 11-17% at 4 ranks on 2 cores and 16% at
  // 2 ranks (medians of alternating runs).
  accumulate_ =
      reduce_ && left_ != nullptr && comm_.accumulate_on_arrival && left_->CanAccumulate();
  // Otherwise the pieces to sum arrive whole in scratch slots and are summed from there.
  via_scratch_ = reduce_ && !accumulate_;
  for (const RecvPiece& p : plan_.recvs) {
    if (p.combine && via_scratch_) slot_bytes_ = std::max(slot_bytes_, p.nbytes);
  }
  if (slot_bytes_ > 0) {
    KOLO_ASSIGN_OR_RETURN(slots_, scratch_.Get(device, slot_bytes_ * kRecvDepth));
  }
  return Post();
}

Status RingRun::Post() {
  const transport::Accumulator acc{&AccumulateSum, static_cast<uintptr_t>(dtype_), elem_};
  while (recvs_posted_ < plan_.recvs.size() && recvs_posted_ - recvs_done_ < kRecvDepth) {
    const RecvPiece& p = plan_.recvs[recvs_posted_];
    const uint64_t tag = CollectiveTag(op_, sequence_, static_cast<uint32_t>(recvs_posted_));
    if (p.combine && accumulate_) {
      auto [region, local] = buf_.Locate(p.offset);
      KOLO_RETURN_IF_ERROR(left_->RecvAccumulate(*region, local, p.nbytes, tag, acc));
    } else if (p.combine && via_scratch_) {
      KOLO_RETURN_IF_ERROR(
          left_->Recv(*slots_, (recvs_posted_ % kRecvDepth) * slot_bytes_, p.nbytes, tag));
    } else {
      auto [region, local] = buf_.Locate(p.offset);
      KOLO_RETURN_IF_ERROR(left_->Recv(*region, local, p.nbytes, tag));
    }
    ++recvs_posted_;
  }
  while (sends_posted_ < plan_.sends.size() && sends_posted_ - sends_done_ < kSendDepth) {
    const SendPiece& p = plan_.sends[sends_posted_];
    if (p.after >= 0 && static_cast<size_t>(p.after) >= recvs_done_) break;
    auto [region, local] = buf_.Locate(p.offset);
    KOLO_RETURN_IF_ERROR(
        right_->Send(*region, local, p.nbytes,
                     CollectiveTag(op_, sequence_, static_cast<uint32_t>(sends_posted_))));
    ++sends_posted_;
  }
  return Status::OK();
}

bool RingRun::Owns(const transport::Completion& c) const {
  return c.kind == transport::OpKind::kSend
             ? right_ != nullptr && c.peer == plan_.right && sends_done_ < sends_posted_
             : left_ != nullptr && c.peer == plan_.left && recvs_done_ < recvs_posted_;
}

Status RingRun::Handle(const transport::Completion& c) {
  if (c.kind == transport::OpKind::kSend) {
    ++sends_done_;
    return Post();
  }
  const RecvPiece& p = plan_.recvs[recvs_done_];
  if (c.nbytes != p.nbytes) {
    return ProtocolError(
        "rank {} sent {} bytes for piece {} where {} were expected (do all ranks pass the same "
        "sizes?)",
        plan_.left, c.nbytes, recvs_done_, p.nbytes);
  }
  if (p.combine && via_scratch_) {
    auto [region, local] = buf_.Locate(p.offset);
    kernels::ReduceSum(dtype_, region->data() + local,
                       slots_->data() + (recvs_done_ % kRecvDepth) * slot_bytes_, p.nbytes / elem_);
  }
  ++recvs_done_;
  return Post();
}

bool RingRun::done() const {
  return recvs_done_ == plan_.recvs.size() && sends_done_ == plan_.sends.size();
}

Status RunRing(Comm& comm, const ExtentMap& buf, const RingPlan& plan, OpCode op, uint32_t sequence,
               DataType dtype, bool reduce, Scratch& scratch, DescribeFn what) {
  RingRun run(comm, buf, plan, op, sequence, dtype, reduce, scratch);
  PhaseScope phase(comm, plan.split == 0 ? plan.second : plan.first);
  std::vector<transport::Completion> done;
  done.reserve(2 * (kRecvDepth + kSendDepth));
  Status s = run.Start();
  while (s.ok() && !run.done()) {
    done.clear();
    s = comm.device->Poll(&done, comm.timeout);
    for (size_t i = 0; s.ok() && i < done.size(); ++i) {
      s = run.Handle(done[i]);
      if (run.recvs_done() == plan.split) phase.Switch(plan.second);
    }
  }
  if (!s.ok()) return s.WithContext(fmt::format("rank {}: {}", comm.rank(), what()));
  return Status::OK();
}

Status RunLanes(Comm& comm, std::vector<Lane>& lanes, Phase phase, DescribeFn what) {
  PhaseScope scope(comm, phase);
  struct Active {
    size_t step;
    std::unique_ptr<RingRun> run;
  };
  // Each lane's runs in progress, oldest first, and its next step to start.
  std::vector<std::vector<Active>> active(lanes.size());
  std::vector<size_t> next(lanes.size(), 0);
  std::vector<std::vector<bool>> finished(lanes.size());
  for (size_t l = 0; l < lanes.size(); ++l) finished[l].assign(lanes[l].steps.size(), false);
  auto ready = [&](const LaneStep& step) {
    return step.after_lane < 0 ||
           finished[static_cast<size_t>(step.after_lane)][static_cast<size_t>(step.after_step)];
  };
  // Retires finished runs and starts every step that may start; a step with nothing to move
  // finishes at once.
  auto advance = [&]() -> Status {
    for (bool progressed = true; progressed;) {
      progressed = false;
      for (size_t l = 0; l < lanes.size(); ++l) {
        auto& runs = active[l];
        while (!runs.empty() && runs.front().run->done()) {
          finished[l][runs.front().step] = true;
          runs.erase(runs.begin());
          progressed = true;
        }
        if (next[l] < lanes[l].steps.size() && (runs.empty() || runs.back().run->all_posted()) &&
            ready(lanes[l].steps[next[l]])) {
          const LaneStep& step = lanes[l].steps[next[l]];
          runs.push_back(Active{
              next[l]++,
              std::make_unique<RingRun>(comm, *lanes[l].buf, step.plan, step.op, step.sequence,
                                        step.dtype, step.reduce, *lanes[l].scratch)});
          KOLO_RETURN_IF_ERROR(runs.back().run->Start());
          progressed = true;
        }
      }
    }
    return Status::OK();
  };
  auto all_done = [&] {
    for (size_t l = 0; l < lanes.size(); ++l) {
      if (next[l] < lanes[l].steps.size() || !active[l].empty()) return false;
    }
    return true;
  };
  std::vector<transport::Completion> done;
  Status s = advance();
  while (s.ok() && !all_done()) {
    done.clear();
    s = comm.device->Poll(&done, comm.timeout);
    for (size_t i = 0; s.ok() && i < done.size(); ++i) {
      RingRun* owner = nullptr;
      for (size_t l = 0; owner == nullptr && l < lanes.size(); ++l) {
        for (Active& a : active[l]) {
          if (a.run->Owns(done[i])) {
            owner = a.run.get();
            break;
          }
        }
      }
      if (owner == nullptr) {
        s = Internal("a completion from rank {} ({}) belongs to no running ring", done[i].peer,
                     done[i].kind == transport::OpKind::kSend ? "send" : "receive");
      } else {
        s = owner->Handle(done[i]);
      }
    }
    if (s.ok()) s = advance();
  }
  if (!s.ok()) return s.WithContext(fmt::format("rank {}: {}", comm.rank(), what()));
  return Status::OK();
}

}  // namespace kolo::collectives
