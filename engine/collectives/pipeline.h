// The chunk-pipelined ring engine the ring collectives share (internal).
//
// A collective is described as the stream of pieces this rank receives from its left neighbour
// and the stream it sends to its right neighbour. A send may wait for one receive (it forwards
// what arrived, after reducing it). The engine keeps `kRecvDepth` receives and `kSendDepth` sends
// posted ahead, reduces each piece the moment it arrives and sends what it unblocks at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/collectives/collectives.h"
#include "engine/collectives/tags.h"

namespace kolo::collectives {

// Reports a phase to the timeline (Comm::on_phase) for its lifetime, balancing the callbacks even
// when the collective fails half-way; Switch moves to the next phase. Shared by every collective.
class PhaseScope {
 public:
  PhaseScope(const Comm& comm, Phase phase) : comm_(comm), phase_(phase) { Report(true); }
  ~PhaseScope() { Report(false); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;
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

struct RecvPiece {
  size_t offset;  // bytes into the buffer region where the piece belongs
  size_t nbytes;
  // A reduce-scatter piece: when reducing, summed into the buffer (as it arrives where the
  // transport can accumulate, else from scratch once whole); otherwise written over it. Other
  // pieces always land in the buffer as they are.
  bool combine;
};

struct SendPiece {
  size_t offset;
  size_t nbytes;
  int64_t after;  // index of the receive that must be done first; -1 for none
};

struct RingPlan {
  int left = -1;
  int right = -1;
  std::vector<RecvPiece> recvs;
  std::vector<SendPiece> sends;
  // Phases for the timeline: `first` covers receives [0, split), `second` the rest.
  Phase first = Phase::kSendRecv;
  Phase second = Phase::kSendRecv;
  size_t split = 0;
};

// The bytes a ring runs on: extents read as one buffer, addressed by offsets into their
// concatenation ("virtual" offsets).
class ExtentMap {
 public:
  explicit ExtentMap(std::vector<Extent> extents);
  // One extent covering all of `region`.
  explicit ExtentMap(transport::Region& region);

  size_t size() const { return starts_.back(); }
  // The region and the offset in it of virtual byte `offset`. REQUIRES: offset < size().
  std::pair<transport::Region*, size_t> Locate(size_t offset) const;
  // The virtual offset where the extent holding `offset` ends.
  size_t ExtentEnd(size_t offset) const;

 private:
  size_t Index(size_t offset) const;
  std::vector<Extent> extents_;
  std::vector<size_t> starts_;  // virtual start of each extent, then the total
};

// Splits [0, count) elements into `parts` near-equal ranges (the first count % parts one longer).
// Returns the start of each range plus count at the end.
std::vector<size_t> EvenSplit(size_t count, int parts);

// BitwiseAllreduceRiding's step through comm.host_area (BitExchangeThroughHostArea): the words of
// buf (and_words AND words, then or_words OR words) and this rank's payload of payload_bytes after
// them combined with every rank's; *summed, with the payloads' sum in `sum`, where every rank
// offered payload_bytes.
Status HostAreaBitwiseAllreduce(Comm& comm, transport::Region& buf, size_t and_words,
                                size_t or_words, size_t payload_bytes, DataType dtype, uint8_t* sum,
                                bool* summed);

// transport::Accumulator's combiner for a sum; `arg` is the DataType.
void AccumulateSum(uint8_t* dst, const uint8_t* src, size_t nbytes, uintptr_t arg);

// Appends the pieces of bytes [offset, offset + nbytes) cut every `piece_bytes` bytes.
void AppendPieces(size_t offset, size_t nbytes, size_t piece_bytes, std::vector<RecvPiece>* out);

// A byte range of the buffer.
struct Span {
  size_t offset;
  size_t nbytes;
};

// Lays out a forwarding ring: receive step t gets recv_steps[t] (combined when
// combine_steps[t]), send step 0 sends `own`, and send step t > 0 forwards what receive step t-1
// got. Every span is cut into `piece_bytes` pieces. Pieces of consecutive steps are interleaved
// (piece c of step t goes at about c + t * lag, lag = kForwardLagBytes / piece_bytes, at least 2),
// so a piece is forwarded soon after it arrives, while it is still in cache, instead of a whole
// segment later. Neighbours compute the same order, and every send depends on an earlier message
// of the left neighbour, so the ring cannot deadlock.
// Pieces are also cut where an extent of `map` ends (none when map is null), so that no piece
// straddles two extents.
void LayOutRing(const std::vector<Span>& recv_steps, const std::vector<bool>& combine_steps,
                Span own, size_t piece_bytes, RingPlan* plan, const ExtentMap* map = nullptr);

// A non-owning reference to a callable returning the name of a call for error messages, so the
// name is only formatted when an error needs it. Does not allocate. REQUIRES: the callable outlives
// this reference (pass a lambda directly as the argument).
class DescribeFn {
 public:
  template <typename F>
  DescribeFn(const F& f)  // NOLINT(google-explicit-constructor): lets callers pass a lambda.
      : callable_(&f),
        call_([](const void* c) { return std::string((*static_cast<const F*>(c))()); }) {}
  std::string operator()() const { return call_(callable_); }

 private:
  const void* callable_;
  std::string (*call_)(const void*);
};

// One ring plan in progress on buf, driven by whoever polls the device: Start posts the first
// operations, Handle takes each completion the plan owns (a receive from plan.left, a send to
// plan.right) and posts what it unblocks. Several runs may be in progress at once on one device as
// long as no two share a pair in the same direction (RunLanes).
class RingRun {
 public:
  RingRun(Comm& comm, const ExtentMap& buf, const RingPlan& plan, OpCode op, uint32_t sequence,
          DataType dtype, bool reduce, Scratch& scratch);
  Status Start();
  // Whether `c` is this run's: it has a receive from c.peer (or a send to it) posted and not yet
  // completed. Completions on one pair come in the order their operations were posted, so of two
  // runs on the same pair, the one whose operations were all posted first owns the next.
  bool Owns(const transport::Completion& c) const;
  Status Handle(const transport::Completion& c);
  bool done() const;
  // Every operation of the plan is posted (some may still be in flight).
  bool all_posted() const {
    return recvs_posted_ == plan_.recvs.size() && sends_posted_ == plan_.sends.size();
  }
  size_t recvs_done() const { return recvs_done_; }

 private:
  Status Post();

  Comm& comm_;
  const ExtentMap& buf_;
  const RingPlan& plan_;
  OpCode op_;
  uint32_t sequence_;
  DataType dtype_;
  size_t elem_;
  bool reduce_;
  Scratch& scratch_;
  transport::Pair* left_ = nullptr;
  transport::Pair* right_ = nullptr;
  bool accumulate_ = false;
  bool via_scratch_ = false;
  size_t slot_bytes_ = 0;
  transport::Region* slots_ = nullptr;
  size_t recvs_posted_ = 0, recvs_done_ = 0, sends_posted_ = 0, sends_done_ = 0;
};

// A step of a lane: a ring plan (left and right are ranks), run once step `after_step` of lane
// `after_lane` has finished (-1: at once).
struct LaneStep {
  RingPlan plan;
  OpCode op;
  uint32_t sequence;
  DataType dtype;
  bool reduce;
  int after_lane = -1;
  int after_step = -1;
};

// Plans run one after another over the same pairs, on `buf`, with their own scratch.
struct Lane {
  const ExtentMap* buf = nullptr;
  Scratch* scratch = nullptr;
  std::vector<LaneStep> steps;
};

// Runs every lane's steps in order, the lanes at the same time: the completions of one Poll go to
// the run of the lane whose pair they belong to. A step starts once its dependency has finished
// and the step before it in its lane has posted all of its operations (not necessarily completed
// them), so that consecutive steps on the same pairs leave no gap between them; messages on a pair
// still follow the steps' order. So a step that needs the bytes an earlier step of its own lane
// leaves must name it as its dependency. Lanes must use disjoint pairs (or pairs in different
// directions), and every rank must build the same steps in the same order, so that each pair sees
// the same sequence of messages on both sides. The timeline sees one `phase` for the whole. Every
// wait is bounded by comm.timeout.
Status RunLanes(Comm& comm, std::vector<Lane>& lanes, Phase phase, DescribeFn what);

// Runs `plan` on buf. When `reduce` is true, the combine pieces are summed (`dtype`) into the
// buffer: as their bytes arrive (Pair::RecvAccumulate) when comm.accumulate_on_arrival and the
// transport allow, else received whole into scratch (kRecvDepth piece-sized slots) and summed
// from there. When `reduce` is false every piece is received into place, overwriting the buffer.
// `what()` names the call in errors; it is invoked only on error.
Status RunRing(Comm& comm, const ExtentMap& buf, const RingPlan& plan, OpCode op, uint32_t sequence,
               DataType dtype, bool reduce, Scratch& scratch, DescribeFn what);

}  // namespace kolo::collectives
