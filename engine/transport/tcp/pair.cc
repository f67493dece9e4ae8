#include "engine/transport/tcp/pair.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine/common/fault_inject.h"

namespace kolo::transport::tcp {
namespace {

constexpr size_t kQueueReserve = 256;
constexpr int kMaxIov = 32;
constexpr size_t kHeaderBytes = sizeof(FrameHeader);

}  // namespace

TcpPair::TcpPair(TcpState& state, int peer, Fd fd, std::vector<Fd> streams, size_t stripe_min_bytes)
    : state_(state),
      peer_(peer),
      fd_(std::move(fd)),
      sends_(kQueueReserve),
      recvs_(kQueueReserve),
      stripe_min_bytes_(stripe_min_bytes) {
  abort_reason_.reserve(kMaxAbortReason);
  streams_.resize(streams.size());
  for (size_t k = 0; k < streams.size(); ++k) streams_[k].fd = std::move(streams[k]);
}

void TcpPair::PartDone(InOrder& order, OpKind kind, uint64_t seq) {
  if (--order.queue.at(static_cast<size_t>(seq - order.base)).parts_left == 0 &&
      kind == OpKind::kRecv) {
    auto it = deferred_.find(seq);
    if (it != deferred_.end()) {
      // Every part is in: combine parts 1.. in order behind part 0, through the staging buffer.
      Deferred& d = it->second;
      for (size_t at = 0; at < d.scratch.size();) {
        size_t room = 0;
        uint8_t* dst = d.acc.Prepare(state_.staging.get(), TcpState::kStagingBytes, &room);
        const size_t n = std::min(room, d.scratch.size() - at);
        std::memcpy(dst, d.scratch.data() + at, n);
        d.acc.Consume(state_.staging.get(), n);
        at += n;
      }
      deferred_.erase(it);
    }
  }
  while (!order.queue.empty() && order.queue.front().parts_left == 0) {
    const Message& m = order.queue.front();
    state_.completions.push_back(Completion{peer_, kind, m.tag, m.length});
    (kind == OpKind::kSend ? state_.bytes_sent : state_.bytes_received) += m.length;
    order.queue.pop_front();
    ++order.base;
  }
}

Status TcpPair::Lost(const std::string& why) const {
  return Unavailable("connection to rank {} lost: {}", peer_, why);
}

Status TcpPair::Send(const Region& region, size_t offset, size_t nbytes, uint64_t tag) {
  if (!state_.error.ok()) return state_.error;
  if (offset > region.size() || nbytes > region.size() - offset) {
    return InvalidArgument("send to rank {} (tag {:#x}): bytes [{}, {}) exceed the {}-byte region",
                           peer_, tag, offset, offset + nbytes, region.size());
  }
  if (eof_ || !fd_.valid()) {
    return state_.Fail(
        Lost(fmt::format("cannot send message tag {:#x}: the connection is closed", tag)));
  }
  SendOp op{FrameHeader{tag, nbytes, static_cast<uint32_t>(FrameType::kData), kFrameCheck},
            region.data() + offset, 0, nbytes, 0};
  if (!streams_.empty()) {
    // Several streams: every message is numbered, so that completions keep their order, and a
    // large one is cut across the streams.
    op.seq = send_order_.next++;
    const bool striped = nbytes >= stripe_min_bytes_;
    send_order_.queue.push_back(Message{tag, nbytes, striped ? streams() : 1});
    if (striped) {
      op.header.type = static_cast<uint32_t>(FrameType::kStriped);
      uint64_t off = 0, part = 0;
      StripePart(nbytes, streams(), 0, &off, &op.payload);
      for (int k = 1; k < streams(); ++k) {
        StripePart(nbytes, streams(), k, &off, &part);
        if (part == 0) {
          PartDone(send_order_, OpKind::kSend, op.seq);
          continue;
        }
        streams_[static_cast<size_t>(k - 1)].sends.push_back(
            Piece{const_cast<uint8_t*>(op.data) + off, part, 0, op.seq, Accumulation()});
      }
    }
  }
  sends_.push_back(op);
  Status s = FlushSends();
  for (size_t k = 0; s.ok() && k < streams_.size(); ++k) s = FlushStream(streams_[k]);
  if (!s.ok()) return state_.Fail(s);
  if (nbytes >= 4096) FaultPoint(FaultPointId::kSend, state_.rank);
  return Status::OK();
}

Status TcpPair::Recv(Region& region, size_t offset, size_t capacity, uint64_t tag) {
  return PostRecv(region, offset, capacity, tag, Accumulator{});
}

Status TcpPair::RecvAccumulate(Region& region, size_t offset, size_t capacity, uint64_t tag,
                               const Accumulator& acc) {
  if (acc.add == nullptr || acc.unit == 0 || acc.unit > kMaxAccumulateUnit) {
    return InvalidArgument(
        "accumulating receive from rank {} (tag {:#x}): needs a combiner and a unit of 1 to {} "
        "bytes (got {})",
        peer_, tag, kMaxAccumulateUnit, acc.unit);
  }
  if (!state_.staging) state_.staging = std::make_unique<uint8_t[]>(TcpState::kStagingBytes);
  return PostRecv(region, offset, capacity, tag, acc);
}

Status TcpPair::PaceSends(double bytes_per_s) {
  // The pair's pace, shared evenly by its streams.
  return CapEachStream(bytes_per_s / streams());
}

Status TcpPair::CapEachStream(double bytes_per_s) {
  if (!fd_.valid()) return Lost("its connection is closed");
  Status s = SetMaxPacingRate(fd_.get(), bytes_per_s);
  for (size_t k = 0; s.ok() && k < streams_.size(); ++k) {
    s = SetMaxPacingRate(streams_[k].fd.get(), bytes_per_s);
  }
  if (!s.ok()) return s.WithContext(fmt::format("pacing the connection to rank {}", peer_));
  return Status::OK();
}

Status TcpPair::OnStreamEvents(int k, uint32_t events) {
  Stream& st = streams_[static_cast<size_t>(k - 1)];
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) st.readable = true;
  if (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) st.writable = true;
  KOLO_RETURN_IF_ERROR(ProcessStream(st));
  return FlushStream(st);
}

// Writes the stream's queued parts; a part fully written completes its share of its message.
Status TcpPair::FlushStream(Stream& st) {
  while (st.writable && !st.sends.empty() && st.fd.valid()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (size_t k = 0; k < st.sends.size() && n < kMaxIov; ++k) {
      Piece& p = st.sends.at(k);
      iov[n++] = {p.data + p.done, p.bytes - p.done};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t written = ::sendmsg(st.fd.get(), &msg, MSG_NOSIGNAL);
    if (written < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        st.writable = false;
        break;
      }
      return Lost(fmt::format("stream {} of {}: {}", &st - streams_.data() + 1, streams(),
                              ErrnoStatus(StatusCode::kUnavailable, "sendmsg", errno).message()));
    }
    size_t left = static_cast<size_t>(written);
    if (left > 0) last_tx_ = Clock::now();
    while (left > 0) {
      Piece& p = st.sends.front();
      const size_t need = p.bytes - p.done;
      if (left < need) {
        p.done += left;
        break;
      }
      left -= need;
      const uint64_t seq = p.seq;
      st.sends.pop_front();
      PartDone(send_order_, OpKind::kSend, seq);
    }
  }
  return Status::OK();
}

// Reads the parts posted on the stream, combining them as they come for an accumulating receive.
// Bytes for which no part is posted stay in the kernel.
Status TcpPair::ProcessStream(Stream& st) {
  while (st.readable && !st.recvs.empty() && st.fd.valid()) {
    Piece& p = st.recvs.front();
    uint8_t* dst = p.data + p.done;
    size_t want = p.bytes - p.done;
    if (p.acc.active()) {
      size_t room = 0;
      dst = p.acc.Prepare(state_.staging.get(), TcpState::kStagingBytes, &room);
      want = std::min(want, room);
    }
    const ssize_t got = ::recv(st.fd.get(), dst, want, 0);
    if (got > 0) {
      st.last_rx = Clock::now();
      if (p.acc.active()) p.acc.Consume(state_.staging.get(), static_cast<size_t>(got));
      p.done += static_cast<size_t>(got);
      if (p.done == p.bytes) {
        const uint64_t seq = p.seq;
        st.recvs.pop_front();
        PartDone(recv_order_, OpKind::kRecv, seq);
      }
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      st.readable = false;
      break;
    }
    return Lost(fmt::format("stream {} of {} {} mid-message (did rank {} exit or crash?)",
                            &st - streams_.data() + 1, streams(),
                            got == 0 ? "was closed" : "was reset", peer_));
  }
  return Status::OK();
}

Status TcpPair::PostRecv(Region& region, size_t offset, size_t capacity, uint64_t tag,
                         const Accumulator& acc) {
  if (!state_.error.ok()) return state_.error;
  if (offset > region.size() || capacity > region.size() - offset) {
    return InvalidArgument(
        "receive from rank {} (tag {:#x}): bytes [{}, {}) exceed the {}-byte region", peer_, tag,
        offset, offset + capacity, region.size());
  }
  recvs_.push_back(RecvOp{region.data() + offset, capacity, tag, acc});
  // Read at once if bytes may be waiting: saves a trip through epoll.
  if (rx_ == Rx::kHeaderReady || readable_ || closing_) {
    Status s = ProcessRx();
    if (s.ok()) s = CheckClosed();
    if (!s.ok()) return state_.Fail(s);
  }
  return Status::OK();
}

Status TcpPair::OnEvents(uint32_t events) {
  if (events & EPOLLIN) readable_ = true;
  if (events & EPOLLOUT) writable_ = true;
  if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    readable_ = true;
    BeginClosing();
  }
  KOLO_RETURN_IF_ERROR(ProcessRx());
  KOLO_RETURN_IF_ERROR(FlushSends());
  return CheckClosed();
}

Status TcpPair::CheckArrival(bool* arrived) {
  *arrived = false;
  if (recvs_.empty() && rx_ == Rx::kHeader && (readable_ || closing_)) {
    // With no receive posted ProcessRx stops after the header: the payload stays in the kernel.
    Status s = ProcessRx();
    if (s.ok()) s = CheckClosed();
    if (!s.ok()) return state_.Fail(s);
  }
  *arrived = recvs_.empty() && (rx_ == Rx::kHeaderReady || rx_header_got_ > 0);
  return Status::OK();
}

Status TcpPair::FlushSends() {
  while (writable_ && !sends_.empty() && fd_.valid()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (size_t k = 0; k < sends_.size() && n + 2 <= kMaxIov; ++k) {
      SendOp& op = sends_.at(k);
      if (op.done < kHeaderBytes) {
        iov[n++] = {reinterpret_cast<uint8_t*>(&op.header) + op.done, kHeaderBytes - op.done};
      }
      const size_t payload_done = op.done > kHeaderBytes ? op.done - kHeaderBytes : 0;
      if (op.payload > payload_done) {
        iov[n++] = {const_cast<uint8_t*>(op.data) + payload_done, op.payload - payload_done};
      }
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t written = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    if (written < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        writable_ = false;
        break;
      }
      const int err = errno;
      reset_ = reset_ || err == ECONNRESET || err == EPIPE;
      BeginClosing();
      KOLO_RETURN_IF_ERROR(CheckClosed());
      return Lost(ErrnoStatus(StatusCode::kUnavailable, "sendmsg", err).message());
    }
    size_t left = static_cast<size_t>(written);
    if (left > 0) last_tx_ = Clock::now();
    while (left > 0) {
      SendOp& op = sends_.front();
      const size_t need = kHeaderBytes + op.payload - op.done;
      if (left < need) {
        op.done += left;
        break;
      }
      left -= need;
      const bool message = op.header.type == static_cast<uint32_t>(FrameType::kData) ||
                           op.header.type == static_cast<uint32_t>(FrameType::kStriped);
      if (message && streams_.empty()) {
        state_.completions.push_back(
            Completion{peer_, OpKind::kSend, op.header.tag, op.header.length});
        state_.bytes_sent += op.header.length;
      } else if (message) {
        PartDone(send_order_, OpKind::kSend, op.seq);
      }
      sends_.pop_front();
    }
  }
  return Status::OK();
}

Status TcpPair::ProcessRx() {
  for (;;) {
    switch (rx_) {
      case Rx::kHeader: {
        auto* dst = reinterpret_cast<uint8_t*>(&rx_header_) + rx_header_got_;
        const ssize_t n = Read(dst, kHeaderBytes - rx_header_got_);
        if (n < 0) return Status::OK();
        if (n == 0) return AtEndOfStream();
        if (goodbye_) {
          return ProtocolError("rank {} sent bytes after its GOODBYE frame", peer_);
        }
        rx_header_got_ += static_cast<size_t>(n);
        if (rx_header_got_ < kHeaderBytes) break;
        rx_header_got_ = 0;
        KOLO_RETURN_IF_ERROR(OnHeader());
        break;
      }
      case Rx::kHeaderReady:
        if (recvs_.empty()) return Status::OK();  // back-pressure: the payload stays in the kernel
        KOLO_RETURN_IF_ERROR(StartPayload());
        break;
      case Rx::kPayload: {
        // An accumulating receive reads into the staging buffer (behind a partial unit left by
        // the last read) and combines from there; a plain one reads into place.
        uint8_t* dst = rx_dst_;
        size_t want = rx_remaining_;
        if (rx_acc_.active()) {
          size_t room = 0;
          dst = rx_acc_.Prepare(state_.staging.get(), TcpState::kStagingBytes, &room);
          want = std::min(want, room);
        }
        // The payload's remaining bytes and whatever of the next header has arrived, in one call:
        // saves a system call per message.
        const bool last = want == rx_remaining_;
        const ssize_t n =
            ReadThen(dst, want, last ? &rx_next_ : nullptr, last ? kHeaderBytes : size_t{0});
        if (n < 0) return Status::OK();
        if (n == 0) return AtEndOfStream();
        const size_t got = static_cast<size_t>(n);
        const size_t payload = std::min(got, want);
        if (rx_acc_.active()) {
          rx_acc_.Consume(state_.staging.get(), payload);
        } else {
          rx_dst_ += payload;
        }
        rx_remaining_ -= payload;
        if (rx_remaining_ > 0) break;
        CompleteRecv();
        if (got > payload) {
          rx_header_got_ = got - payload;
          std::memcpy(&rx_header_, &rx_next_, rx_header_got_);
          if (rx_header_got_ == kHeaderBytes) {
            rx_header_got_ = 0;
            KOLO_RETURN_IF_ERROR(OnHeader());
          }
        }
        break;
      }
      case Rx::kAbortReason: {
        const size_t have = abort_reason_.size();
        abort_reason_.resize(rx_header_.length);
        const ssize_t n = Read(abort_reason_.data() + have, rx_header_.length - have);
        abort_reason_.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
        if (n < 0) return Status::OK();
        if (n == 0) return AtEndOfStream();
        if (abort_reason_.size() == rx_header_.length) {
          return Aborted("rank {} aborted: {}", peer_, abort_reason_);
        }
        break;
      }
    }
  }
}

Status TcpPair::OnHeader() {
  const FrameHeader& h = rx_header_;
  if (h.check != kFrameCheck) {
    return ProtocolError(
        "rank {} sent a malformed frame header (check word {:#x}, type {}, length {}): the "
        "stream is out of step",
        peer_, h.check, h.type, h.length);
  }
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kData:
      rx_ = Rx::kHeaderReady;
      return Status::OK();
    case FrameType::kStriped:
      if (streams_.empty()) {
        return ProtocolError(
            "rank {} sent a message striped across streams, but this pair has one stream (do all "
            "ranks share KOLO_TCP_STREAMS?)",
            peer_);
      }
      rx_ = Rx::kHeaderReady;
      return Status::OK();
    case FrameType::kAbort:
      if (h.length > kMaxAbortReason) {
        return ProtocolError("rank {} sent an ABORT frame with a {}-byte reason (at most {})",
                             peer_, h.length, kMaxAbortReason);
      }
      if (h.length == 0) return Aborted("rank {} aborted (no reason given)", peer_);
      abort_reason_.clear();
      rx_ = Rx::kAbortReason;
      return Status::OK();
    case FrameType::kKeepalive:
      if (h.length != 0) {
        return ProtocolError("rank {} sent a KEEPALIVE frame with {} payload bytes", peer_,
                             h.length);
      }
      return Status::OK();  // the next frame header follows
    case FrameType::kGoodbye:
      if (h.length != 0) {
        return ProtocolError("rank {} sent a GOODBYE frame with {} payload bytes", peer_, h.length);
      }
      goodbye_ = true;
      BeginClosing();
      return Status::OK();
  }
  return ProtocolError("rank {} sent a frame of unknown type {}", peer_, h.type);
}

Status TcpPair::StartPayload() {
  const RecvOp& r = recvs_.front();
  if (rx_header_.tag != r.tag) {
    return ProtocolError(
        "rank {} sent a message with tag {:#x} ({} bytes) but the next receive posted for it "
        "expects tag {:#x} ({} bytes): the ranks are running different operations",
        peer_, rx_header_.tag, rx_header_.length, r.tag, r.capacity);
  }
  if (rx_header_.length > r.capacity) {
    return ProtocolError(
        "rank {} sent a {}-byte message with tag {:#x} but the posted receive holds {} bytes",
        peer_, rx_header_.length, r.tag, r.capacity);
  }
  if (r.acc.add != nullptr && rx_header_.length % r.acc.unit != 0) {
    return ProtocolError(
        "rank {} sent a {}-byte message with tag {:#x} to be combined in {}-byte elements: not a "
        "whole number of them",
        peer_, rx_header_.length, r.tag, r.acc.unit);
  }
  rx_dst_ = r.data;
  rx_remaining_ = rx_header_.length;
  rx_acc_ = r.acc.add != nullptr ? Accumulation(r.data, r.acc) : Accumulation();
  if (!streams_.empty()) {
    rx_seq_ = recv_order_.next++;
    const bool striped = rx_header_.type == static_cast<uint32_t>(FrameType::kStriped);
    recv_order_.queue.push_back(
        Message{rx_header_.tag, rx_header_.length, striped ? streams() : 1});
    if (striped) {
      uint64_t off = 0, part = 0;
      StripePart(rx_header_.length, streams(), 0, &off, &part);
      rx_remaining_ = part;
      // Elements that straddle the parts' boundaries are combined once the parts are all in.
      Deferred* deferred = nullptr;
      if (r.acc.add != nullptr && 64 % r.acc.unit != 0) {
        deferred = &deferred_[rx_seq_];
        deferred->scratch.resize(rx_header_.length - part);
      }
      for (int k = 1; k < streams(); ++k) {
        StripePart(rx_header_.length, streams(), k, &off, &part);
        if (part == 0) {
          PartDone(recv_order_, OpKind::kRecv, rx_seq_);
          continue;
        }
        Stream& st = streams_[static_cast<size_t>(k - 1)];
        if (deferred != nullptr) {
          const uint64_t first = rx_header_.length - deferred->scratch.size();
          st.recvs.push_back(
              Piece{deferred->scratch.data() + (off - first), part, 0, rx_seq_, Accumulation()});
        } else {
          st.recvs.push_back(
              Piece{r.data + off, part, 0, rx_seq_,
                    r.acc.add != nullptr ? Accumulation(r.data + off, r.acc) : Accumulation()});
        }
        KOLO_RETURN_IF_ERROR(ProcessStream(st));
      }
    }
  }
  rx_ = Rx::kPayload;
  if (rx_remaining_ == 0) CompleteRecv();
  return Status::OK();
}

void TcpPair::CompleteRecv() {
  if (streams_.empty()) {
    state_.completions.push_back(
        Completion{peer_, OpKind::kRecv, rx_header_.tag, rx_header_.length});
    state_.bytes_received += rx_header_.length;
  } else {
    auto it = deferred_.find(rx_seq_);
    if (it != deferred_.end()) it->second.acc = rx_acc_;  // part 0's position and carry
    PartDone(recv_order_, OpKind::kRecv, rx_seq_);
  }
  recvs_.pop_front();
  rx_ = Rx::kHeader;
}

ssize_t TcpPair::Read(void* dst, size_t n) { return ReadThen(dst, n, nullptr, 0); }

ssize_t TcpPair::ReadThen(void* dst, size_t n, void* next, size_t next_n) {
  if (n == 0) return -1;
  if (closing_) {
    if (tail_pos_ == tail_.size() && !eof_) Slurp();
    if (tail_pos_ < tail_.size()) {
      const size_t k = std::min(n, tail_.size() - tail_pos_);
      std::memcpy(dst, tail_.data() + tail_pos_, k);
      tail_pos_ += k;
      if (tail_pos_ == tail_.size()) {
        tail_.clear();
        tail_pos_ = 0;
      }
      return static_cast<ssize_t>(k);
    }
    return eof_ ? 0 : -1;
  }
  if (!readable_ || !fd_.valid()) return -1;
  iovec iov[2] = {{dst, n}, {next, next_n}};
  for (;;) {
    const ssize_t got = ::readv(fd_.get(), iov, next_n > 0 ? 2 : 1);
    if (got > 0) {
      last_rx_ = Clock::now();
      return got;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      readable_ = false;
      return -1;
    }
    if (got < 0) reset_ = true;
    BeginClosing();
    return ReadThen(dst, n, next, next_n);  // closing now: from tail_
  }
}

void TcpPair::BeginClosing() {
  closing_ = true;
  Slurp();
}

void TcpPair::Slurp() {
  uint8_t chunk[1 << 16];
  while (!eof_ && fd_.valid()) {
    const ssize_t got = ::recv(fd_.get(), chunk, sizeof chunk, 0);
    if (got > 0) {
      last_rx_ = Clock::now();
      tail_.insert(tail_.end(), chunk, chunk + got);
    } else if (got == 0) {
      eof_ = true;
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      readable_ = false;
      return;
    } else {
      reset_ = true;
      eof_ = true;
    }
  }
  // Nothing more will arrive; closing also takes the socket out of the epoll set.
  if (eof_) fd_.reset();
}

Status TcpPair::AtEndOfStream() {
  if (rx_ == Rx::kHeader && rx_header_got_ == 0 && goodbye_) {
    if (!recvs_.empty()) {
      return Lost(fmt::format(
          "rank {} shut down while {} receive(s) from it were still posted (next tag {:#x})", peer_,
          recvs_.size(), recvs_.front().tag));
    }
    return Status::OK();
  }
  return Lost(fmt::format("{}{} (did rank {} exit or crash?)",
                          reset_ ? "the connection was reset" : "the peer closed the connection",
                          rx_ == Rx::kHeader && rx_header_got_ == 0 ? "" : " mid-frame", peer_));
}

Status TcpPair::CheckClosed() {
  if (!eof_) return Status::OK();
  if (rx_ == Rx::kHeaderReady) {
    // Nobody has asked for the next message yet; look past the queued ones for how the stream
    // ends, so that an ABORT behind them surfaces now.
    uint64_t first = rx_header_.length, first_off = 0;
    if (rx_header_.type == static_cast<uint32_t>(FrameType::kStriped) && !streams_.empty()) {
      StripePart(rx_header_.length, streams(), 0, &first_off, &first);
    }
    size_t pos = tail_pos_ + first;
    bool clean = false;
    while (!clean && pos + kHeaderBytes <= tail_.size()) {
      FrameHeader h;
      std::memcpy(&h, tail_.data() + pos, kHeaderBytes);
      pos += kHeaderBytes;
      if (h.check != kFrameCheck) {
        return ProtocolError("rank {} sent a malformed frame header: the stream is out of step",
                             peer_);
      }
      if (h.type == static_cast<uint32_t>(FrameType::kAbort)) {
        const size_t n = std::min<size_t>({h.length, kMaxAbortReason, tail_.size() - pos});
        return Aborted("rank {} aborted: {}", peer_,
                       std::string(reinterpret_cast<const char*>(tail_.data() + pos), n));
      }
      clean = h.type == static_cast<uint32_t>(FrameType::kGoodbye);
      uint64_t off = 0, part = h.length;
      if (h.type == static_cast<uint32_t>(FrameType::kStriped) && !streams_.empty()) {
        StripePart(h.length, streams(), 0, &off, &part);  // only part 0 is on this stream
      }
      pos += part;
    }
    if (!clean) return AtEndOfStream();
  }
  if (!sends_.empty()) {
    return Lost(
        fmt::format("rank {} closed the connection before reading {} message(s) sent to "
                    "it (next tag {:#x})",
                    peer_, sends_.size(), sends_.front().header.tag));
  }
  if (!send_order_.queue.empty()) {
    return Lost(fmt::format(
        "rank {} closed the connection before reading all of {} message(s) sent to it (next tag "
        "{:#x})",
        peer_, send_order_.queue.size(), send_order_.queue.front().tag));
  }
  return Status::OK();
}

std::string TcpPair::DescribePending() const {
  if (sends_.empty() && recvs_.empty() && send_order_.queue.empty() && recv_order_.queue.empty()) {
    return "";
  }
  std::string text = fmt::format("rank {}:", peer_);
  if (!recvs_.empty()) {
    text += fmt::format(" {} recv (next tag {:#x}, {} bytes)", recvs_.size(), recvs_.front().tag,
                        recvs_.front().capacity);
  }
  if (!sends_.empty()) {
    text += fmt::format(" {} send (next tag {:#x}, {} bytes)", sends_.size(),
                        sends_.front().header.tag, sends_.front().header.length);
  }
  if (!streams_.empty()) {
    size_t in = 0, out = 0;
    for (const Stream& st : streams_) {
      in += st.recvs.size();
      out += st.sends.size();
    }
    text += fmt::format(" ({} streams: {} message(s) unfinished in, {} out; parts {} in, {} out)",
                        streams(), recv_order_.queue.size(), send_order_.queue.size(), in, out);
  }
  return text;
}

Status TcpPair::MaybeKeepalive(Clock::time_point now, std::chrono::milliseconds interval) {
  if (!sends_.empty() || closing_ || !fd_.valid() || now - last_tx_ < interval) return Status::OK();
  sends_.push_back(SendOp{
      FrameHeader{0, 0, static_cast<uint32_t>(FrameType::kKeepalive), kFrameCheck}, nullptr, 0});
  last_tx_ = now;  // one frame per interval, written or not
  Status s = FlushSends();
  if (!s.ok()) return state_.Fail(s);
  return Status::OK();
}

Clock::duration TcpPair::SilentFor(Clock::time_point now) const {
  if (rx_ == Rx::kHeaderReady || closing_) return Clock::duration::zero();
  Clock::time_point last = last_rx_;
  for (const Stream& st : streams_) last = std::max(last, st.last_rx);
  return now - last;
}

void TcpPair::QueueAbort(const std::string& reason) {
  for (Stream& st : streams_) st.sends.clear();  // raw parts: nothing to keep in step
  closing_frame_payload_ = reason.substr(0, kMaxAbortReason);
  // Only a frame already partly on the wire must be finished; the stream has to stay in step.
  const bool keep = !sends_.empty() && sends_.front().done > 0;
  SendOp partial = keep ? sends_.front() : SendOp{};
  sends_.clear();
  if (keep) sends_.push_back(partial);
  sends_.push_back(SendOp{FrameHeader{0, closing_frame_payload_.size(),
                                      static_cast<uint32_t>(FrameType::kAbort), kFrameCheck},
                          reinterpret_cast<const uint8_t*>(closing_frame_payload_.data()), 0,
                          closing_frame_payload_.size()});
}

void TcpPair::QueueGoodbye() {
  for (Stream& st : streams_) st.sends.clear();
  const bool keep = !sends_.empty() && sends_.front().done > 0;
  SendOp partial = keep ? sends_.front() : SendOp{};
  sends_.clear();
  if (keep) sends_.push_back(partial);
  sends_.push_back(SendOp{
      FrameHeader{0, 0, static_cast<uint32_t>(FrameType::kGoodbye), kFrameCheck}, nullptr, 0});
}

bool TcpPair::FlushClosing() {
  if (!fd_.valid() || eof_) return true;
  writable_ = true;
  if (!FlushSends().ok()) return true;
  return sends_.empty() || !fd_.valid();
}

void TcpPair::Close() {
  for (Stream& st : streams_) {
    if (!st.fd.valid()) continue;
    ::shutdown(st.fd.get(), SHUT_WR);
    st.fd.reset();
  }
  if (!fd_.valid()) return;
  ::shutdown(fd_.get(), SHUT_WR);
  // Closing with unread bytes makes the kernel reset the connection, which can destroy our last
  // frame before the peer reads it; read what has arrived (bounded) first.
  uint8_t chunk[1 << 16];
  for (int i = 0; i < 256; ++i) {
    if (::recv(fd_.get(), chunk, sizeof chunk, MSG_DONTWAIT) <= 0) break;
  }
  fd_.reset();
  eof_ = true;
  closing_ = true;
}

}  // namespace kolo::transport::tcp
