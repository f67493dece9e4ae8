#include "engine/transport/shm/pair.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/common/fault_inject.h"

namespace kolo::transport::shm {
namespace {

constexpr size_t kQueueReserve = 256;
constexpr uint64_t kFrameBytes = sizeof(RingFrame);

}  // namespace

ShmPair::ShmPair(DeviceState& state, int peer, Fd socket, Segment segment)
    : state_(state),
      peer_(peer),
      fd_(std::move(socket)),
      segment_(std::move(segment)),
      tx_(&segment_.control(SendDirection(state.rank, peer))),
      tx_ring_(segment_.ring(SendDirection(state.rank, peer))),
      rx_(&segment_.control(SendDirection(peer, state.rank))),
      rx_ring_(segment_.ring(SendDirection(peer, state.rank))),
      ring_bytes_(segment_.ring_bytes()),
      mask_(segment_.ring_bytes() - 1),
      sends_(kQueueReserve),
      recvs_(kQueueReserve) {}

ShmPair::~ShmPair() { Disarm(); }

Status ShmPair::Lost(const std::string& why) const {
  return Unavailable("connection to rank {} lost: {}", peer_, why);
}

Status ShmPair::Send(const Region& region, size_t offset, size_t nbytes, uint64_t tag) {
  if (!state_.error.ok()) return state_.error;
  if (offset > region.size() || nbytes > region.size() - offset) {
    return InvalidArgument("send to rank {} (tag {:#x}): bytes [{}, {}) exceed the {}-byte region",
                           peer_, tag, offset, offset + nbytes, region.size());
  }
  if (eof_ || goodbye_ || closing_) {
    return state_.Fail(
        Lost(fmt::format("cannot send message tag {:#x}: the connection is closed", tag)));
  }
  sends_.push_back(SendOp{region.data() + offset, nbytes, tag, 0, false});
  Status s = PushSends();
  if (!s.ok()) return state_.Fail(s);
  if (nbytes >= 4096) FaultPoint(FaultPointId::kSend, state_.rank);
  return Status::OK();
}

Status ShmPair::Recv(Region& region, size_t offset, size_t capacity, uint64_t tag) {
  return PostRecv(region, offset, capacity, tag, Accumulator{});
}

Status ShmPair::RecvAccumulate(Region& region, size_t offset, size_t capacity, uint64_t tag,
                               const Accumulator& acc) {
  if (acc.add == nullptr || acc.unit == 0 || acc.unit > kMaxAccumulateUnit) {
    return InvalidArgument(
        "accumulating receive from rank {} (tag {:#x}): needs a combiner and a unit of 1 to {} "
        "bytes (got {})",
        peer_, tag, kMaxAccumulateUnit, acc.unit);
  }
  return PostRecv(region, offset, capacity, tag, acc);
}

Status ShmPair::PostRecv(Region& region, size_t offset, size_t capacity, uint64_t tag,
                         const Accumulator& acc) {
  if (!state_.error.ok()) return state_.error;
  if (offset > region.size() || capacity > region.size() - offset) {
    return InvalidArgument(
        "receive from rank {} (tag {:#x}): bytes [{}, {}) exceed the {}-byte region", peer_, tag,
        offset, offset + capacity, region.size());
  }
  recvs_.push_back(RecvOp{region.data() + offset, capacity, tag, acc});
  // The message may be in the ring already: take it now rather than after a trip through Poll.
  Status s = PullRecvs();
  if (s.ok()) s = CheckClosed();
  if (!s.ok()) return state_.Fail(s);
  return Status::OK();
}

Status ShmPair::Progress() {
  Observe();
  Status s = PushSends();
  if (s.ok()) s = PullRecvs();
  if (s.ok()) s = CheckClosed();
  if (!s.ok()) return state_.Fail(s);
  return Status::OK();
}

Status ShmPair::PushSends() {
  if (sends_.empty() || closing_) return Status::OK();
  // Room in the ring from what we last knew of the consumer's tail; read again only when that is
  // not enough (the tail's cache line belongs to the other side).
  auto room = [this](uint64_t need) {
    uint64_t space = ring_bytes_ - (tx_head_ - tx_tail_seen_);
    if (space < need) {
      const uint64_t tail = tx_->tail.load(std::memory_order_acquire);
      if (tail != tx_tail_seen_) {
        tx_tail_seen_ = tail;
        last_rx_ = Clock::now();  // the peer is reading: it is alive
      }
      space = ring_bytes_ - (tx_head_ - tx_tail_seen_);
    }
    return space;
  };
  while (!sends_.empty()) {
    SendOp& op = sends_.front();
    if (!op.header_done) {
      if (room(kFrameBytes) < kFrameBytes) break;
      const RingFrame frame{op.tag, op.length, kRingFrameCheck, 0, tx_sequence_};
      CopyIntoRing(tx_ring_, mask_, tx_head_, &frame, sizeof frame);
      tx_head_ += kFrameBytes;
      op.header_done = true;
    }
    while (op.done < op.length) {
      const uint64_t left = op.length - op.done;
      // The last piece takes its padding along, so that head is always a multiple of kRingAlign
      // and a message's end is published together with its padding.
      const uint64_t space = room(std::min(AlignUp(left), kPieceBytes));
      uint64_t n = 0, advance = 0;
      if (left <= kPieceBytes && AlignUp(left) <= space) {
        n = left;
        advance = AlignUp(left);
      } else {
        n = advance = std::min({AlignDown(space), kPieceBytes, AlignDown(left)});
      }
      if (n == 0) break;
      CopyIntoRing(tx_ring_, mask_, tx_head_, op.data + op.done, n);
      tx_head_ += advance;
      op.done += n;
      PublishHead();
    }
    if (op.done < op.length) break;
    PublishHead();  // a message without payload: its header alone
    state_.completions.push_back(Completion{peer_, OpKind::kSend, op.tag, op.length});
    state_.bytes_sent += op.length;
    ++tx_sequence_;
    sends_.pop_front();
  }
  PublishHead();  // a header written without room for any payload yet
  return Status::OK();
}

void ShmPair::PublishHead() {
  if (tx_->head.load(std::memory_order_relaxed) == tx_head_) return;
  tx_->head.store(tx_head_, std::memory_order_release);
  last_tx_ = Clock::now();
  // Pairs with the fence in Arm: either the consumer sees this head before it sleeps, or we see
  // its request for a doorbell here.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (tx_->consumer_waiting.load(std::memory_order_acquire) != 0 &&
      tx_head_ >= tx_->consumer_wake_at.load(std::memory_order_relaxed) &&
      tx_->consumer_waiting.exchange(0) != 0) {
    Doorbell();
  }
}

void ShmPair::PublishTail() {
  if (rx_->tail.load(std::memory_order_relaxed) == rx_pos_) return;
  rx_->tail.store(rx_pos_, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (rx_->producer_waiting.load(std::memory_order_acquire) != 0 &&
      rx_pos_ >= rx_->producer_wake_at.load(std::memory_order_relaxed) &&
      rx_->producer_waiting.exchange(0) != 0) {
    Doorbell();
  }
}

Status ShmPair::PullRecvs() {
  if (recvs_.empty() || closing_) return Status::OK();
  uint64_t head = rx_head_seen_;
  // Reads the producer's head again; false if it has not moved.
  auto refresh = [&]() {
    const uint64_t h = rx_->head.load(std::memory_order_acquire);
    if (h == head) return false;
    head = rx_head_seen_ = h;
    last_rx_ = Clock::now();
    return true;
  };
  while (!recvs_.empty()) {
    if (!rx_in_message_) {
      if (head - rx_pos_ < kFrameBytes && (!refresh() || head - rx_pos_ < kFrameBytes)) break;
      KOLO_RETURN_IF_ERROR(StartMessage());
      if (rx_remaining_ > 0) continue;
    } else {
      const uint64_t avail = head - rx_pos_;
      const uint64_t n =
          avail == 0 ? 0 : TakePayload(std::min({avail, rx_remaining_, kPieceBytes}));
      if (n == 0) {
        if (!refresh()) break;
        continue;
      }
      rx_pos_ += n;
      rx_remaining_ -= n;
      if (rx_remaining_ > 0) {
        PublishTail();
        continue;
      }
    }
    // The whole message is here (the producer published its end and padding together).
    rx_pos_ = AlignUp(rx_pos_);
    state_.completions.push_back(Completion{peer_, OpKind::kRecv, rx_frame_.tag, rx_frame_.length});
    state_.bytes_received += rx_frame_.length;
    recvs_.pop_front();
    rx_in_message_ = false;
    PublishTail();
  }
  PublishTail();
  return Status::OK();
}

Status ShmPair::StartMessage() {
  RingFrame f;
  CopyFromRing(rx_ring_, mask_, rx_pos_, &f, sizeof f);
  if (f.check != kRingFrameCheck || f.sequence != rx_sequence_) {
    return ProtocolError(
        "rank {} wrote a malformed frame header in the shared-memory ring (check word {:#x}, "
        "message {} where {} was next): the ring is out of step",
        peer_, f.check, f.sequence, rx_sequence_);
  }
  const RecvOp& r = recvs_.front();
  if (f.tag != r.tag) {
    return ProtocolError(
        "rank {} sent a message with tag {:#x} ({} bytes) but the next receive posted for it "
        "expects tag {:#x} ({} bytes): the ranks are running different operations",
        peer_, f.tag, f.length, r.tag, r.capacity);
  }
  if (f.length > r.capacity) {
    return ProtocolError(
        "rank {} sent a {}-byte message with tag {:#x} but the posted receive holds {} bytes",
        peer_, f.length, r.tag, r.capacity);
  }
  if (r.acc.add != nullptr && f.length % r.acc.unit != 0) {
    return ProtocolError(
        "rank {} sent a {}-byte message with tag {:#x} to be combined in {}-byte elements: not a "
        "whole number of them",
        peer_, f.length, r.tag, r.acc.unit);
  }
  rx_pos_ += kFrameBytes;
  rx_frame_ = f;
  rx_remaining_ = f.length;
  rx_dst_ = r.data;
  rx_in_message_ = true;
  ++rx_sequence_;
  return Status::OK();
}

uint64_t ShmPair::TakePayload(uint64_t n) {
  const RecvOp& r = recvs_.front();
  if (r.acc.add == nullptr) {
    CopyFromRing(rx_ring_, mask_, rx_pos_, rx_dst_, n);
    rx_dst_ += n;
    return n;
  }
  // Combined straight from the ring, in whole elements.
  const uint64_t unit = r.acc.unit;
  uint64_t taken = 0;
  while (n - taken >= unit) {
    const uint64_t at = (rx_pos_ + taken) & mask_;
    const uint64_t contiguous = std::min(n - taken, ring_bytes_ - at);
    const uint64_t whole = contiguous - contiguous % unit;
    if (whole > 0) {
      r.acc.add(rx_dst_, rx_ring_ + at, whole, r.acc.arg);
      rx_dst_ += whole;
      taken += whole;
      continue;
    }
    // An element across the ring's end (a unit that does not divide kRingAlign).
    uint8_t element[kMaxAccumulateUnit];
    CopyFromRing(rx_ring_, mask_, rx_pos_ + taken, element, unit);
    r.acc.add(rx_dst_, element, unit, r.acc.arg);
    rx_dst_ += unit;
    taken += unit;
  }
  return taken;
}

bool ShmPair::Arrived() {
  if (!recvs_.empty() || rx_in_message_) return false;
  const uint64_t head = rx_->head.load(std::memory_order_acquire);
  if (head != rx_head_seen_) {
    rx_head_seen_ = head;
    last_rx_ = Clock::now();
  }
  return head - rx_pos_ >= kFrameBytes;
}

bool ShmPair::Arm(bool for_arrival) {
  if (closing_ || eof_) return true;
  uint64_t rx_wake = 0, tx_wake = 0;
  if (!recvs_.empty() || for_arrival) {
    // Woken at the next header, or once the message has arrived or half a ring of it has: not
    // for every piece.
    rx_wake = rx_pos_ + (rx_in_message_ ? std::min(rx_remaining_, ring_bytes_ / 2) : kFrameBytes);
    rx_->consumer_wake_at.store(rx_wake, std::memory_order_relaxed);
    rx_->consumer_waiting.store(1, std::memory_order_seq_cst);
    rx_armed_ = true;
  }
  if (!sends_.empty()) {
    const SendOp& op = sends_.front();
    const uint64_t want = (op.header_done ? 0 : kFrameBytes) +
                          std::min(AlignUp(op.length - op.done), ring_bytes_ / 2);
    tx_wake = tx_head_ + want > ring_bytes_ ? tx_head_ + want - ring_bytes_ : 0;
    tx_->producer_wake_at.store(tx_wake, std::memory_order_relaxed);
    tx_->producer_waiting.store(1, std::memory_order_seq_cst);
    tx_armed_ = true;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (rx_armed_ && rx_->head.load(std::memory_order_acquire) >= rx_wake) return false;
  if (tx_armed_ && tx_->tail.load(std::memory_order_acquire) >= tx_wake) return false;
  return true;
}

void ShmPair::Disarm() {
  if (rx_armed_) rx_->consumer_waiting.store(0, std::memory_order_relaxed);
  if (tx_armed_) tx_->producer_waiting.store(0, std::memory_order_relaxed);
  rx_armed_ = tx_armed_ = false;
}

void ShmPair::Doorbell() {
  const auto bell = static_cast<uint8_t>(Control::kDoorbell);
  // Would block: the socket holds unread frames, which wake the peer just as well.
  if (WriteControl(&bell, 1)) last_tx_ = Clock::now();
}

bool ShmPair::WriteControl(const void* bytes, size_t n) {
  if (!fd_.valid() || eof_) return false;
  for (;;) {
    const ssize_t k = ::send(fd_.get(), bytes, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k >= 0) return static_cast<size_t>(k) == n;
    if (errno == EINTR) continue;
    // EAGAIN: full. EPIPE, ECONNRESET: the peer is gone, which its hang-up reports.
    return false;
  }
}

Status ShmPair::OnReadable() {
  uint8_t chunk[4096];
  while (fd_.valid()) {
    const ssize_t n = ::recv(fd_.get(), chunk, sizeof chunk, MSG_DONTWAIT);
    if (n > 0) {
      control_in_.insert(control_in_.end(), chunk, chunk + n);
      last_rx_ = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // End of stream, or a reset (the peer closed with our frames unread): nothing more comes.
    eof_ = true;
    fd_.reset();  // also leaves the epoll set
  }
  size_t pos = 0;
  bool partial = false;  // an ABORT frame whose rest has not arrived
  Status s;
  while (s.ok() && !partial && pos < control_in_.size()) {
    switch (static_cast<Control>(control_in_[pos])) {
      case Control::kDoorbell:
      case Control::kKeepalive:
        ++pos;
        break;
      case Control::kGoodbye:
        goodbye_ = true;
        ++pos;
        break;
      case Control::kAbort: {
        const size_t have = control_in_.size() - pos;
        const size_t len =
            have < 3 ? 0 : control_in_[pos + 1] | (size_t{control_in_[pos + 2]} << 8);
        if (have < 3 || (len <= kMaxAbortReason && have - 3 < len)) {
          partial = true;
        } else if (len > kMaxAbortReason) {
          s = ProtocolError("rank {} sent an ABORT frame with a {}-byte reason (at most {})", peer_,
                            len, kMaxAbortReason);
        } else if (len == 0) {
          s = Aborted("rank {} aborted (no reason given)", peer_);
        } else {
          s = Aborted("rank {} aborted: {}", peer_,
                      std::string(reinterpret_cast<const char*>(&control_in_[pos + 3]), len));
        }
        break;
      }
      default:
        s = ProtocolError("rank {} sent an unknown control frame (type {}) on its socket", peer_,
                          control_in_[pos]);
    }
  }
  if (!s.ok()) return state_.Fail(s);
  control_in_.erase(control_in_.begin(), control_in_.begin() + static_cast<ptrdiff_t>(pos));
  if (partial && eof_) return state_.Fail(Lost("the peer closed the connection mid-frame"));
  return Progress();
}

Status ShmPair::CheckClosed() {
  if (!eof_ && !goodbye_) return Status::OK();
  if (!goodbye_) {
    return Lost(fmt::format("the peer closed the connection (did rank {} exit or crash?)", peer_));
  }
  // After its GOODBYE the peer sends nothing more; all it sent before is in the ring, and
  // Progress has taken what the posted receives asked for.
  if (!recvs_.empty()) {
    return Lost(fmt::format(
        "rank {} shut down while {} receive(s) from it were still posted (next tag {:#x})", peer_,
        recvs_.size(), recvs_.front().tag));
  }
  if (!sends_.empty()) {
    return Lost(fmt::format(
        "rank {} closed the connection before reading {} message(s) sent to it (next tag {:#x})",
        peer_, sends_.size(), sends_.front().tag));
  }
  return Status::OK();
}

std::string ShmPair::DescribePending() const {
  if (sends_.empty() && recvs_.empty()) return "";
  std::string text = fmt::format("rank {}:", peer_);
  if (!recvs_.empty()) {
    text += fmt::format(" {} recv (next tag {:#x}, {} bytes)", recvs_.size(), recvs_.front().tag,
                        recvs_.front().capacity);
  }
  if (!sends_.empty()) {
    text += fmt::format(" {} send (next tag {:#x}, {} bytes)", sends_.size(), sends_.front().tag,
                        sends_.front().length);
  }
  return text;
}

Status ShmPair::MaybeKeepalive(Clock::time_point now, std::chrono::milliseconds interval) {
  if (closing_ || now - last_tx_ < interval) return Status::OK();
  last_tx_ = now;  // one frame per interval, written or not
  const auto frame = static_cast<uint8_t>(Control::kKeepalive);
  WriteControl(&frame, 1);
  return Status::OK();
}

void ShmPair::Observe() {
  const uint64_t head = rx_->head.load(std::memory_order_acquire);
  const uint64_t tail = tx_->tail.load(std::memory_order_acquire);
  if (head != rx_head_seen_ || tail != tx_tail_seen_) {
    rx_head_seen_ = head;
    tx_tail_seen_ = tail;
    last_rx_ = Clock::now();
  }
}

Clock::duration ShmPair::SilentFor(Clock::time_point now) const {
  if (closing_ || eof_) return Clock::duration::zero();
  // A message of the peer's waits for a receive here: the peer waits on us.
  const uint64_t head = rx_->head.load(std::memory_order_acquire);
  if (recvs_.empty() && !rx_in_message_ && head - rx_pos_ >= kFrameBytes) {
    return Clock::duration::zero();
  }
  // Not updated from the rings here: a move seen only now may be long past. Progress looks at
  // them every round of Poll and WaitForArrival.
  return now - last_rx_;
}

void ShmPair::QueueAbort(const std::string& reason) {
  const std::string text = reason.substr(0, kMaxAbortReason);
  closing_frame_.clear();
  closing_frame_ += static_cast<char>(Control::kAbort);
  closing_frame_ += static_cast<char>(text.size() & 0xff);
  closing_frame_ += static_cast<char>(text.size() >> 8);
  closing_frame_ += text;
  closing_written_ = 0;
  closing_ = true;
  sends_.clear();
  recvs_.clear();
  Disarm();
}

void ShmPair::QueueGoodbye() {
  closing_frame_.assign(1, static_cast<char>(Control::kGoodbye));
  closing_written_ = 0;
  closing_ = true;
  sends_.clear();
  recvs_.clear();
  Disarm();
}

bool ShmPair::FlushClosing() {
  while (fd_.valid() && closing_written_ < closing_frame_.size()) {
    const ssize_t k = ::send(fd_.get(), closing_frame_.data() + closing_written_,
                             closing_frame_.size() - closing_written_, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k > 0) {
      closing_written_ += static_cast<size_t>(k);
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return false;
    } else {
      return true;  // the peer is gone
    }
  }
  return true;
}

void ShmPair::Close() {
  if (!fd_.valid()) return;
  ::shutdown(fd_.get(), SHUT_WR);
  // Unread bytes at close make the peer's next read fail with a reset instead of an end of
  // stream; read what has arrived (bounded) first.
  uint8_t chunk[4096];
  for (int i = 0; i < 64; ++i) {
    if (::recv(fd_.get(), chunk, sizeof chunk, MSG_DONTWAIT) <= 0) break;
  }
  fd_.reset();
}

}  // namespace kolo::transport::shm
