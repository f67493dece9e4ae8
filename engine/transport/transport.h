// The transport interface: how bytes move between ranks. Collectives are written once against it;
// tcp/ implements it over sockets, shm/ over shared memory between the ranks of one host,
// auto_device.h combines the two (shm within a host, TCP between hosts), rdma/ implements it over
// ibverbs RC queue pairs (libibverbs loaded at run time, or the software verbs device for tests).
//
// Model (shaped after RDMA so that verbs fits as naturally as TCP):
// - A Device is one rank's endpoint (a NIC, or loopback). It owns a full mesh of Pairs, one per
//   peer, set up by a Connect function of the implementation (see tcp/device.h).
// - Memory is registered once (Register) and reused; sends and receives name a registered Region,
//   an offset and a length. TCP registration is free; verbs registration pins and maps the memory.
// - Operations are posted and complete asynchronously. Progress happens inside Device::Poll, which
//   blocks (epoll / completion channel) until something completes, a peer fails or the timeout
//   passes — never a busy spin unless busy polling was asked for.
// - On one Pair, messages are delivered in the order they were sent, and receives match sends in
//   the order they were posted (FIFO). Each message carries a 64-bit tag; the receive's tag must
//   equal the arriving message's tag, otherwise Poll fails with a protocol error naming both. A
//   receiver that has not posted a receive exerts back-pressure: the sender's bytes wait (in the
//   kernel for TCP; by credits for verbs) and nothing is buffered without bound.
// - A receive may instead fold the message into memory that already holds data as its bytes
//   arrive (RecvAccumulate: the ring's reduce-scatter sums that way), where the transport copies
//   the bytes itself (TCP); verbs places them in memory directly, so the collectives receive into
//   scratch there and sum afterwards.
//
// Thread-safety: a Device and its Pairs are driven by one thread at a time (the engine's
// background thread, or a benchmark's main thread). Register may be called from that thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/status.h"

namespace kolo::transport {

// Memory registered with a Device. Owned by the caller; must outlive every operation naming it.
class Region {
 public:
  Region(void* data, size_t size) : data_(static_cast<uint8_t*>(data)), size_(size) {}
  virtual ~Region() = default;
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_;
  size_t size_;
};

enum class OpKind : uint8_t { kSend = 0, kRecv = 1 };

// One finished operation, as reported by Device::Poll.
struct Completion {
  int peer = -1;
  OpKind kind = OpKind::kSend;
  uint64_t tag = 0;
  size_t nbytes = 0;  // bytes sent, or bytes actually received (<= the posted capacity)
};

// Combines arriving bytes into memory that already holds data, for a receive that reduces as it
// goes (Pair::RecvAccumulate). `add(dst, src, nbytes, arg)` folds nbytes at src into dst; it is
// only ever called with a multiple of `unit` bytes.
struct Accumulator {
  void (*add)(uint8_t* dst, const uint8_t* src, size_t nbytes, uintptr_t arg) = nullptr;
  uintptr_t arg = 0;
  size_t unit = 1;
};

class Pair {
 public:
  virtual ~Pair() = default;
  virtual int peer() const = 0;

  // Posts a send of region[offset, offset + nbytes) with `tag`. The bytes must stay unchanged until
  // its completion. nbytes may be 0 (a message with no payload).
  // REQUIRES: offset + nbytes <= region.size().
  virtual Status Send(const Region& region, size_t offset, size_t nbytes, uint64_t tag) = 0;

  // Posts a receive of the next message from the peer into region[offset, offset + capacity). A
  // message longer than `capacity` or with another tag is a protocol error.
  // REQUIRES: offset + capacity <= region.size().
  virtual Status Recv(Region& region, size_t offset, size_t capacity, uint64_t tag) = 0;

  // Whether RecvAccumulate is available: a transport that copies arriving bytes itself (TCP) can
  // fold them in on the way; one that places them in memory directly (verbs) cannot.
  virtual bool CanAccumulate() const { return false; }

  // Like Recv, but the message is combined into region[offset, offset + capacity) with `acc` as
  // its bytes arrive, staged through a small buffer that stays in cache, instead of being written
  // there: the reduction reads the bytes while they are hot and needs no message-sized scratch.
  // Parts of the destination may be combined before the completion, and with several TCP
  // streams the parts of a striped message side by side (whole elements, each part in order); it
  // must not be read or written by anything else until then. A message whose length is not a
  // multiple of acc.unit is a protocol error. REQUIRES: CanAccumulate(), offset + capacity <=
  // region.size(), 1 <= acc.unit <= kMaxAccumulateUnit.
  static constexpr size_t kMaxAccumulateUnit = 16;
  virtual Status RecvAccumulate(Region& /*region*/, size_t /*offset*/, size_t /*capacity*/,
                                uint64_t /*tag*/, const Accumulator& /*acc*/) {
    return FailedPrecondition("the connection to rank {} cannot combine bytes as they arrive",
                              peer());
  }

  // Caps what this connection sends at `bytes_per_s` (0: no cap), spacing its packets out rather
  // than sending in bursts, from the next send on. TCP paces in the kernel (SO_MAX_PACING_RATE);
  // a transport that cannot pace says so.
  virtual Status PaceSends(double /*bytes_per_s*/) {
    return FailedPrecondition("the connection to rank {} cannot pace its sends (only tcp can)",
                              peer());
  }
};

class Device {
 public:
  virtual ~Device() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "tcp", "shm", "auto", ...
  virtual const char* name() const = 0;
  // The transport that carries the pair with `peer` ("tcp", "shm"): name() except for a device
  // that combines several. REQUIRES: 0 <= peer < size(), peer != rank().
  virtual const char* pair_transport(int /*peer*/) const { return name(); }

  // Registers [data, data + size). The Region must be destroyed before the memory is freed.
  virtual StatusOr<std::unique_ptr<Region>> Register(void* data, size_t size) = 0;

  // The connection to `peer`. REQUIRES: 0 <= peer < size(), peer != rank(). A device connects
  // only the peers its job's connection plan names (collectives/connection_plan.h); for any other
  // peer this returns a pair whose every operation fails with FailedPrecondition naming both
  // ranks, so that a collective that needs a connection the plan lacks says so instead of hanging.
  virtual Pair& pair(int peer) = 0;

  // Whether this device has a connection to `peer`.
  virtual bool connected(int peer) const { return peer >= 0 && peer < size() && peer != rank(); }
  // The connections this rank holds (peers connected).
  int connections() const;
  // Memory this device holds for its connections, in bytes: shared-memory segments mapped (shm),
  // socket buffers asked of the kernel (TCP: send and receive per connection), queue-pair and
  // staging buffers (rdma). An upper bound of what the connections can pin, not what is resident.
  virtual uint64_t transport_memory_bytes() const { return 0; }

  // Makes progress on every posted operation. Blocks until at least one operation completes (its
  // Completion is appended to *out), or `timeout` passes (returns DeadlineExceeded naming the
  // peers with pending operations), or a peer fails: a lost connection returns Unavailable naming
  // the peer's rank; a peer's Abort returns Aborted with the peer's rank and reason. After an
  // error every later call fails the same way (the error is sticky). Also returns OK, possibly
  // with no completion, after Wake.
  virtual Status Poll(std::vector<Completion>* out, std::chrono::milliseconds timeout) = 0;

  // For a thread with nothing posted that waits for its peers to start something: blocks until a
  // message from some peer has begun to arrive that no posted receive has taken (it stays queued
  // for the next receive posted for that peer), or Wake is called, or `timeout` passes. Sets
  // *arrived to true only in the first case. Fails like Poll when a peer fails or is lost, so an
  // idle rank learns of a dead peer as soon as its connection says so. A timeout of zero is a
  // look: what has come in since the last call is read, without waiting.
  virtual Status WaitForArrival(std::chrono::microseconds timeout, bool* arrived) = 0;

  // Before Poll or WaitForArrival sleeps, it polls for up to `spin`, yielding the processor
  // between looks (sched_yield): a reply that comes within it is taken without the cost of a
  // sleep and a wake-up, while a thread of another rank that needs the processor gets it. 0:
  // sleep at once. Ignored with busy polling. Called by the driving thread.
  virtual void SetPollSpin(std::chrono::microseconds /*spin*/) {}

  // Makes the Poll or WaitForArrival in progress on the driving thread (or, if none, the next
  // one) return soon, possibly with no completion: a thread that queued work for the driving
  // thread wakes it with this instead of waiting for its timeout. Thread-safe: the one method any
  // thread may call while another drives the device. Safe default: nothing (Poll returns at its
  // next completion or timeout).
  virtual void Wake() {}

  // Tells every connected peer that this rank is failing with `reason`, best effort and without
  // blocking for long, then closes every connection. Idempotent.
  virtual void Abort(const Status& reason) = 0;

  // Bytes sent and received since creation (payload, not headers); for benchmarks and tests.
  virtual uint64_t bytes_sent() const = 0;
  virtual uint64_t bytes_received() const = 0;

  // Liveness: seconds since anything last arrived from `peer` (a message, or the keepalive a
  // device sends its peers while it is being polled), zero while a message of the peer's waits
  // for a receive here (the peer waits on this rank), negative when the transport does not track
  // it or `peer` is not a peer. A peer silent for a good part of the peer timeout has stopped,
  // hung or become unreachable, while the peers it blocks keep sending keepalives: this is how
  // a rank names the one that stopped rather than the neighbour it waits on.
  virtual double SilentSeconds(int /*peer*/) const { return -1; }
};

// A stand-in for the pair with a peer the device did not connect: every operation fails with
// FailedPrecondition naming both ranks and the transport.
class UnconnectedPair final : public Pair {
 public:
  UnconnectedPair(int rank, int peer, const char* transport)
      : rank_(rank), peer_(peer), transport_(transport) {}
  int peer() const override { return peer_; }
  Status Send(const Region&, size_t, size_t, uint64_t) override { return Fail(); }
  Status Recv(Region&, size_t, size_t, uint64_t) override { return Fail(); }
  Status RecvAccumulate(Region&, size_t, size_t, uint64_t, const Accumulator&) override {
    return Fail();
  }

 private:
  Status Fail() const;
  int rank_;
  int peer_;
  const char* transport_;
};

// The transports that carry this rank's pairs, distinct, sorted and joined by '+': "shm", "tcp",
// "shm+tcp"; "none" for a job of one rank.
std::string PairTransports(const Device& device);

// "rank 0 has sent nothing for 5.2 s, rank 3 for 5.1 s (stopped, hung or unreachable)" for the
// peers of `device` silent for at least `threshold` (loudest last), or "" when none is.
std::string DescribeSilentPeers(const Device& device, std::chrono::milliseconds threshold);
// The peers silent for at least `threshold`, longest silence first.
std::vector<int> SilentPeers(const Device& device, std::chrono::milliseconds threshold);

// Waits until every operation in `expected` (count of completions) has completed, collecting them.
// A convenience over Poll for simple exchanges; the deadline covers the whole wait.
Status WaitFor(Device& device, size_t expected, std::vector<Completion>* out,
               std::chrono::milliseconds timeout);

}  // namespace kolo::transport
