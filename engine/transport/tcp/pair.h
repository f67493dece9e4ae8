// One authenticated connection of the TCP transport (the framing is described in device.h).
// Internal to the transport; users see it as a transport::Pair.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/transport/poll_core.h"
#include "engine/transport/tcp/accumulation.h"
#include "engine/transport/tcp/frame.h"
#include "engine/transport/tcp/socket.h"
#include "engine/transport/transport.h"

namespace kolo::transport::tcp {

// The device state (poll_core.h) with the staging buffer of the accumulating receives.
struct TcpState : DeviceState {
  // Bytes an accumulating receive reads at a time: small enough to stay in the core's cache
  // between the kernel's copy into it and the combine that reads it (at 4 ranks on 2 cores, 64,
  // 128, 256 and 512 KiB measured alike; all well ahead of message-sized scratch).
  static constexpr size_t kStagingBytes = 128 << 10;

  // Staging for accumulating receives; shared by the pairs (one reads at a time), allocated on
  // first use.
  std::unique_ptr<uint8_t[]> staging;
};

class TcpPair final : public Pair {
 public:
  // `streams`: the pair's connections besides `fd` (stream 1, 2, ...; device.h "Several
  // streams"); messages of at least `stripe_min_bytes` are striped across all of them.
  TcpPair(TcpState& state, int peer, Fd fd, std::vector<Fd> streams = {},
          size_t stripe_min_bytes = 0);

  int peer() const override { return peer_; }
  Status Send(const Region& region, size_t offset, size_t nbytes, uint64_t tag) override;
  Status Recv(Region& region, size_t offset, size_t capacity, uint64_t tag) override;
  bool CanAccumulate() const override { return true; }
  Status RecvAccumulate(Region& region, size_t offset, size_t capacity, uint64_t tag,
                        const Accumulator& acc) override;
  Status PaceSends(double bytes_per_s) override;

  // -1 once the connection is closed.
  int fd() const { return fd_.get(); }
  // The connections in all (1 + the extra streams), and the socket of stream k >= 1.
  int streams() const { return 1 + static_cast<int>(streams_.size()); }
  int stream_fd(int k) const { return streams_[static_cast<size_t>(k - 1)].fd.get(); }
  // Progress after epoll reported `events` for this pair's socket. An error is also recorded in
  // the device state.
  Status OnEvents(uint32_t events);
  // The same for stream k >= 1.
  Status OnStreamEvents(int k, uint32_t events);
  // Caps every connection's send rate at `bytes_per_s` (SO_MAX_PACING_RATE; 0: none).
  Status CapEachStream(double bytes_per_s);
  // Reads what the socket holds when no receive is posted, and sets *arrived when (part of) a
  // message is waiting for a receive to be posted. An error is also recorded in the device state.
  Status CheckArrival(bool* arrived);
  // "rank P: 2 recv (next tag 0x..), 1 send (...)" or "" when nothing is pending.
  std::string DescribePending() const;

  // Liveness. Queues a KEEPALIVE frame when nothing has been written to the peer for `interval`
  // and nothing is queued (a queued frame that does not drain means the peer is not reading: it
  // hears from us when it does). An error is also recorded in the device state.
  Status MaybeKeepalive(Clock::time_point now, std::chrono::milliseconds interval);
  // How long the peer has been silent: the time since bytes last arrived from it, or zero while a
  // message of its waits for a receive here (it is waiting on us, not silent).
  Clock::duration SilentFor(Clock::time_point now) const;

  // Shutdown, in two steps so that a device can overlap them over all its pairs: Queue* drops the
  // sends that have not started and queues an ABORT (with `reason`) or GOODBYE frame behind the
  // one partly written, if any; FlushClosing writes without blocking and returns true once that
  // frame is out (or the connection is gone); Close shuts the socket down without provoking a
  // reset where it can.
  void QueueAbort(const std::string& reason);
  void QueueGoodbye();
  bool FlushClosing();
  void Close();

 private:
  struct SendOp {
    FrameHeader header;
    const uint8_t* data;
    size_t done;  // bytes of header + payload written
    // Payload bytes behind the header on this stream: header.length, or a striped message's
    // part 0.
    uint64_t payload = 0;
    uint64_t seq = 0;  // with several streams: the message's place in send order
  };
  // A part of a striped message on stream k >= 1: raw bytes, no header.
  struct Piece {
    uint8_t* data;
    size_t bytes;
    size_t done;
    uint64_t seq;
    Accumulation acc;  // receives: active for an accumulating one
  };
  struct Stream {
    Fd fd;
    bool readable = true;
    bool writable = true;
    RingQueue<Piece> sends{64};
    RingQueue<Piece> recvs{64};
    Clock::time_point last_rx = Clock::now();
  };
  // With several streams, messages complete in the order they were posted, each once all its
  // parts have: posted messages in order, from `base` (the front's seq) on.
  struct Message {
    uint64_t tag;
    uint64_t length;
    int parts_left;
  };
  struct InOrder {
    RingQueue<Message> queue{256};
    uint64_t base = 0;
    uint64_t next = 0;
  };
  struct RecvOp {
    uint8_t* data;
    size_t capacity;
    uint64_t tag;
    Accumulator acc;  // acc.add null: a plain receive
  };
  enum class Rx { kHeader, kHeaderReady, kPayload, kAbortReason };

  Status PostRecv(Region& region, size_t offset, size_t capacity, uint64_t tag,
                  const Accumulator& acc);
  Status FlushSends();
  Status FlushStream(Stream& s);
  Status ProcessStream(Stream& s);
  // A part of message `seq` is done: completes the messages at the front whose parts all are.
  void PartDone(InOrder& order, OpKind kind, uint64_t seq);
  Status ProcessRx();
  Status OnHeader();
  Status StartPayload();
  void CompleteRecv();
  // Bytes from the socket, or from tail_ once the peer has closed: > 0 read, 0 end of stream,
  // -1 nothing available now.
  ssize_t Read(void* dst, size_t n);
  // Read, filling `dst` first and then as much of `next` as has arrived, in one call (a payload's
  // last bytes and the following frame header). Same return values; from tail_ only `dst`.
  ssize_t ReadThen(void* dst, size_t n, void* next, size_t next_n);
  void BeginClosing();
  void Slurp();
  Status AtEndOfStream();
  Status CheckClosed();
  Status Lost(const std::string& why) const;

  TcpState& state_;
  const int peer_;
  Fd fd_;
  bool readable_ = true;  // edge-triggered: true until a read would block
  bool writable_ = true;
  RingQueue<SendOp> sends_;
  RingQueue<RecvOp> recvs_;
  std::string closing_frame_payload_;  // ABORT reason being sent

  Rx rx_ = Rx::kHeader;
  FrameHeader rx_header_;
  size_t rx_header_got_ = 0;
  FrameHeader rx_next_;  // the next frame's header bytes read along with a payload's last bytes
  uint8_t* rx_dst_ = nullptr;
  size_t rx_remaining_ = 0;
  Accumulation rx_acc_;  // active while the payload goes to an accumulating receive
  std::string abort_reason_;

  // Once the peer has closed (or sent ABORT/GOODBYE) every remaining byte is read into tail_ and
  // parsed from there: it is bounded by the kernel's buffers, and lets us see an ABORT queued
  // behind messages nobody has asked for yet.
  bool closing_ = false;
  bool eof_ = false;
  bool reset_ = false;
  bool goodbye_ = false;
  std::vector<uint8_t> tail_;
  size_t tail_pos_ = 0;

  // Streams 1.. (empty with one stream), and the order of messages across them.
  std::vector<Stream> streams_;
  const size_t stripe_min_bytes_;
  InOrder send_order_, recv_order_;
  uint64_t rx_seq_ = 0;  // the message the payload being read belongs to
  // A striped accumulating receive whose element size does not divide the parts' 64-byte
  // boundaries: parts 1.. land raw in `scratch`, and once every part is in they are combined in
  // order behind part 0 (whose Accumulation, carry included, is kept in `acc`).
  struct Deferred {
    std::vector<uint8_t> scratch;
    Accumulation acc;
  };
  std::map<uint64_t, Deferred> deferred_;

  // When bytes last arrived from the peer, and were last written to it.
  Clock::time_point last_rx_ = Clock::now();
  Clock::time_point last_tx_ = Clock::now();
};

}  // namespace kolo::transport::tcp
