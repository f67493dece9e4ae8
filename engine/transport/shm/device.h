// The shared-memory transport, for ranks on one host: each byte is copied once into shared memory
// by the sender and once out of it by the receiver, where loopback TCP copies it twice through the
// kernel. Ranks may be processes or threads of one process.
//
// Per pair of ranks: one segment (segment.h: an anonymous memory file made by the lower rank and
// passed to the higher one over the pair's socket, so that it never has a name anything could
// leave behind) holding two single-producer/single-consumer byte rings, one per direction, and
// one connected AF_UNIX stream socket (set up through an abstract-namespace listener whose name is
// published in the store as "shm/addr/<rank>", authenticated with the job secret by the TCP
// transport's handshake, and refused when the other end runs as another user).
//
// Rings (frame.h): a message is a 32-byte header (tag, length, sequence) and its payload, padded to
// 16 bytes. Send copies the message in, in pieces of at most 64 KiB, publishing the producer's
// position after each so that the receiver starts on a piece while the next is written; it
// completes once the last byte is in the ring. A message longer than the free space streams
// through: a full ring leaves the rest of the send pending (back-pressure; nothing is buffered
// beyond the ring). Recv copies out of the ring into the posted Region; RecvAccumulate combines
// straight from the ring into the destination (no staging). Ring size: ShmOptions::ring_bytes.
//
// Waiting: nobody spins (unless busy_poll). A device about to sleep in epoll asks, in the ring's
// control words, for a doorbell when the ring it waits on has moved far enough (the next header,
// the end of the message or half a ring, whichever comes first; or room for the rest of a send,
// or half a ring). The side that moves the ring that far clears the request and writes a DOORBELL
// byte on the pair's socket, which wakes the sleeper's epoll. Request and position are each
// followed by a sequentially consistent fence before the other is read, so that either the sleeper
// sees the progress before it sleeps or the mover sees the request.
//
// The socket also carries the rest of the control traffic, as one-byte frames: KEEPALIVE (sent
// on a pair idle for min(peer timeout / 8, 1 s) while the device is polled; the peer's silence is
// the time since its socket or either ring last moved, SilentSeconds reports it and a Poll timeout
// names the peers silent for half the peer timeout), GOODBYE (clean shutdown: every message sent
// before it is in the ring), ABORT (a 2-byte length and the reason follow). The end of the stream
// without a GOODBYE is a dead peer: Poll fails with kUnavailable "connection to rank R lost" as
// soon as the kernel closes the socket of a killed process, while the caller waits on anyone.
// Errors are sticky and worded as the TCP transport's (tcp/device.h).
//
// Shutdown: destroying a device sends GOODBYE on every socket (at most 200 ms) and closes; Abort
// sends ABORT with the reason (at most 1 s). Pending operations are dropped.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/common/status.h"
#include "engine/transport/pollable.h"

namespace kolo::transport::shm {

struct ShmOptions {
  // Per-job secret: names the listening sockets (through a hash) and authenticates every
  // connection.
  std::string secret;
  // Bound on the whole set-up; the keepalive interval and the silence threshold derive from it as
  // they do for TCP.
  std::chrono::milliseconds timeout{30000};
  // Bytes of each ring (one per direction and pair): a power of two, 64 KiB to 1 GiB. The lower
  // rank's value is the pair's.
  uint64_t ring_bytes = 1 << 20;
  // When set, only these peers' pairs get `ring_bytes`; the others get
  // min(ring_bytes, kSmallRingBytes). The connection plan (registry.cc) gives its ring neighbours,
  // which carry the ring's large buffers, the full rings, and its recursive-doubling partners,
  // which carry buffers of at most a MiB (halving-doubling's largest message is half of that),
  // the small ones: memory per rank grows with log2 N by less.
  // Like ring_bytes, the lower rank's choice is the pair's.
  std::optional<std::vector<int>> full_ring_peers;
  static constexpr uint64_t kSmallRingBytes = 512 << 10;
  // Spin instead of sleeping in epoll. Only for ranks with dedicated cores.
  bool busy_poll = false;
};

// Connects `rank` of a job of `size` ranks to each rank in `peers` (ranks of this host; the
// device's pair(p) exists only for them): publishes "shm/addr/<rank>" in `store` when a higher
// peer must connect to it, connects to every lower peer and accepts every higher one, each
// authenticated, then shares a segment per pair. Connections from other users, or that fail the
// handshake, are rejected with a warning and set-up goes on; a peer that fails once authenticated
// (it cannot map the segment, memory is short) fails the set-up with its reason.
// DeadlineExceeded after options.timeout names the ranks still missing. REQUIRES: 0 <= rank <
// size, peers distinct, each in [0, size) and not rank.
StatusOr<std::unique_ptr<PollableDevice>> Connect(const ShmOptions& options,
                                                  bootstrap::Store& store, int rank, int size,
                                                  const std::vector<int>& peers);

}  // namespace kolo::transport::shm
