// One pair of the shm transport: two single-producer/single-consumer byte rings in the pair's
// segment (one per direction) and the pair's connected AF_UNIX stream socket. Internal to the
// transport; users see it as a transport::Pair. The protocol is described in device.h.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/transport/poll_core.h"
#include "engine/transport/shm/frame.h"
#include "engine/transport/shm/segment.h"
#include "engine/transport/tcp/frame.h"
#include "engine/transport/tcp/socket.h"
#include "engine/transport/transport.h"

namespace kolo::transport::shm {

using tcp::Fd;

class ShmPair final : public Pair {
 public:
  // Most bytes copied into or out of a ring between two publications of the position: the other
  // side starts on one piece while this side copies the next. Small enough to stay in the core's
  // cache on the way through.
  static constexpr uint64_t kPieceBytes = 64 << 10;

  ShmPair(DeviceState& state, int peer, Fd socket, Segment segment);
  // Bytes of the pair's mapped segment (both rings and the header).
  size_t segment_bytes() const { return SegmentBytes(segment_.ring_bytes()); }
  ~ShmPair() override;

  int peer() const override { return peer_; }
  Status Send(const Region& region, size_t offset, size_t nbytes, uint64_t tag) override;
  Status Recv(Region& region, size_t offset, size_t capacity, uint64_t tag) override;
  bool CanAccumulate() const override { return true; }
  Status RecvAccumulate(Region& region, size_t offset, size_t capacity, uint64_t tag,
                        const Accumulator& acc) override;

  // -1 once the socket is closed.
  int fd() const { return fd_.get(); }

  // Moves what it can: posted sends into the outgoing ring, the incoming ring into posted
  // receives. Errors are also recorded in the device state.
  Status Progress();
  // Reads the socket's control frames (after epoll said it is readable or hung up).
  Status OnReadable();
  // Whether a message has begun to arrive that no posted receive has taken.
  bool Arrived();
  Status CheckArrival(bool* arrived) {
    *arrived = Arrived();
    return Status::OK();
  }

  // Before the device sleeps: asks the peer for a doorbell when the ring this pair waits on has
  // moved far enough (the incoming ring, for a posted receive or, with `for_arrival`, for any
  // message; the outgoing ring, for a send waiting for room). Returns false when it already has:
  // the caller must not sleep. Disarm takes the requests back after the sleep.
  bool Arm(bool for_arrival);
  void Disarm();

  // Liveness, as the TCP pairs do it: a KEEPALIVE when nothing went to the peer for `interval`;
  // the peer's silence is the time since anything came from it (a control frame, or either ring
  // moving on its side), zero while a message of its waits here for a receive.
  Status MaybeKeepalive(Clock::time_point now, std::chrono::milliseconds interval);
  Clock::duration SilentFor(Clock::time_point now) const;
  // "rank P: 2 recv (next tag 0x..., N bytes), 1 send (...)" or "" when nothing is pending.
  std::string DescribePending() const;

  // Shutdown, in steps a device overlaps over its pairs: Queue* drops the operations not yet
  // done and queues an ABORT (with `reason`) or GOODBYE frame; FlushClosing writes without
  // blocking and returns true once it is out (or the socket is gone); Close closes the socket.
  void QueueAbort(const std::string& reason);
  void QueueGoodbye();
  bool FlushClosing();
  void Close();

 private:
  struct SendOp {
    const uint8_t* data;
    uint64_t length;
    uint64_t tag;
    uint64_t done;  // payload bytes in the ring
    bool header_done;
  };
  struct RecvOp {
    uint8_t* data;
    size_t capacity;
    uint64_t tag;
    Accumulator acc;  // acc.add null: a plain receive
  };

  Status PostRecv(Region& region, size_t offset, size_t capacity, uint64_t tag,
                  const Accumulator& acc);
  // Notes the peer alive when either ring has moved on its side since last looked at.
  void Observe();
  Status PushSends();
  Status PullRecvs();
  // Reads the next message's header and matches it to the first posted receive.
  Status StartMessage();
  // Copies or combines up to `n` available payload bytes at rx_pos_; returns how many it took
  // (fewer than n when an accumulating receive waits for a whole element).
  uint64_t TakePayload(uint64_t n);
  void PublishHead();
  void PublishTail();
  void Doorbell();
  Status CheckClosed();
  Status Lost(const std::string& why) const;
  // Writes `bytes` to the socket without blocking; false if it would block. Errors mark the
  // socket closed.
  bool WriteControl(const void* bytes, size_t n);

  DeviceState& state_;
  const int peer_;
  Fd fd_;
  Segment segment_;
  RingControl* const tx_;
  uint8_t* const tx_ring_;
  RingControl* const rx_;
  const uint8_t* const rx_ring_;
  const uint64_t ring_bytes_;
  const uint64_t mask_;

  // Producer side.
  tcp::RingQueue<SendOp> sends_;
  uint64_t tx_head_ = 0;       // written so far (published unless a piece is in progress)
  uint64_t tx_tail_seen_ = 0;  // the consumer's tail when last read
  uint64_t tx_sequence_ = 0;
  bool tx_armed_ = false;

  // Consumer side.
  tcp::RingQueue<RecvOp> recvs_;
  uint64_t rx_pos_ = 0;        // consumed so far; published as tail
  uint64_t rx_head_seen_ = 0;  // the producer's head when last read
  uint64_t rx_sequence_ = 0;
  bool rx_in_message_ = false;
  RingFrame rx_frame_;
  uint64_t rx_remaining_ = 0;
  uint8_t* rx_dst_ = nullptr;
  bool rx_armed_ = false;

  // The socket: control frames in, and the farewell frame out.
  std::vector<uint8_t> control_in_;
  std::string closing_frame_;
  size_t closing_written_ = 0;
  bool closing_ = false;
  bool goodbye_ = false;  // the peer said GOODBYE
  bool eof_ = false;      // the peer's end of the socket is closed

  Clock::time_point last_rx_ = Clock::now();
  Clock::time_point last_tx_ = Clock::now();
};

}  // namespace kolo::transport::shm
