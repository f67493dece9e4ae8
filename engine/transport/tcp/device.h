// The TCP transport: a full mesh of non-blocking TCP connections driven by one epoll set.
//
// Wire format after the handshake (handshake.h): each message is a 24-byte frame header (tag,
// payload length, frame type; host byte order) followed by the payload, which is read straight
// into the posted Region. Frame types: DATA (a message), ABORT (the peer is failing; the payload is
// its reason), GOODBYE (the peer is shutting down cleanly), KEEPALIVE (no payload: sent on a
// connection idle for min(peer timeout / 8, 1 s) while the device is polled, so that a live peer
// is never silent for long; Device::SilentSeconds reports the silence, and a Poll timeout names
// the peers silent for half the peer timeout as the ones that stopped). A receiver with no posted
// receive reads at most the next frame header and leaves the payload in the kernel (back-pressure),
// but it watches every socket for the peer closing, so a dead or aborting peer surfaces in Poll
// even while the caller waits on someone else.
//
// Errors: a lost connection (EOF without GOODBYE, reset, or a GOODBYE while operations on that
// pair are still pending) is kUnavailable "connection to rank R lost ..."; an ABORT frame is
// kAborted "rank R aborted: <reason>"; a tag mismatch, an oversize message or a malformed frame is
// kProtocol naming the peer. These are sticky. A Poll timeout (kDeadlineExceeded) is not sticky:
// the caller may poll again.
//
// Several streams (TcpOptions::streams = K > 1): each pair holds K authenticated connections
// (the handshake names each one's stream). Stream 0 carries every frame as above. A message of
// at least stripe_min_bytes goes as a STRIPED frame on stream 0, whose `length` is the whole
// message's: the message is cut into K parts of ceil(length / K) bytes rounded up to 64 (the
// last part shorter, or empty), part 0 follows the header on stream 0 and part k goes on stream
// k as raw bytes with no header of its own. Streams 1..K-1 carry nothing else, so each side
// knows from stream 0 alone what every stream carries next. Each part of an accumulating receive
// is combined as it arrives; a message completes once all its parts have, and completions keep
// the order the operations were posted in. One stream's flow is bounded by one congestion window
// (and, on a real NIC, by one core's copies); K streams share the link among them.
//
// Shutdown: destroying a Device sends GOODBYE to every peer, half-closes, and waits at most
// 200 ms for the peers to close their side (so that no reset destroys the frame before they read
// it); Abort does the same with an ABORT frame and waits at most 1 s. Sends not yet started are
// dropped; a frame already partly written is finished first, within the same bound.
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

namespace kolo::transport::tcp {

struct TcpOptions {
  // IPv4 address to bind; the port is ephemeral.
  std::string listen_addr = "127.0.0.1";
  // SO_SNDBUF and SO_RCVBUF of every connection, set explicitly before connect/listen. The kernel
  // caps it at net.core.{w,r}mem_max.
  int64_t socket_buffer_bytes = 2 << 20;
  // Bound on the whole connection set-up (store look-ups, connects, handshakes).
  std::chrono::milliseconds timeout{30000};
  // Per-job secret; every connection must prove it knows it (HMAC, the secret is never sent).
  std::string secret;
  // Spin on epoll_wait(0) instead of sleeping in it. Only for ranks with dedicated cores.
  bool busy_poll = false;
  // The ranks to connect to (the auto transport: those on other hosts); unset: every other rank.
  // The device has pair(p) only for these.
  std::optional<std::vector<int>> peers;
  // Connections per peer (Options::tcp_streams), 1 to kMaxStreams. With more than one, a message
  // of at least stripe_min_bytes is striped across them (see "Several streams" above).
  int streams = 1;
  size_t stripe_min_bytes = 256 << 10;
  // Every data socket's send rate cap in bytes/s (SO_MAX_PACING_RATE), 0 for none: the emulated
  // cluster's per-flow cap (Options::emulated_flow_cap_bits_per_s).
  double flow_cap_bytes_per_s = 0;
};

inline constexpr int kMaxStreams = 16;

// Connects `rank` to every other rank of a job of `size` ranks (or to options.peers): binds a
// listener, publishes "tcp/addr/<rank>" = "ip:port" in `store`, reads every peer's address,
// connects to every lower peer and accepts every higher peer, and authenticates each connection
// (handshake.h). On the
// accepting side, connections that fail the handshake (wrong magic, wrong secret, garbage, rank out
// of range or already connected, silent for longer than min(timeout, 5 s)) are closed with a
// warning and set-up goes on waiting for the real peers; on the connecting side, a peer that fails
// the handshake (a bad challenge, the wrong rank, a rejected hello or proof) fails the set-up.
// Returns once every peer is connected; DeadlineExceeded after options.timeout names the ranks
// still missing. After set-up the listener stays open: any later connection is accepted and
// closed with a warning. REQUIRES: 0 <= rank < size; options.peers, if set, distinct ranks in
// [0, size) other than rank. The Device is driven by one thread at a time (transport.h).
StatusOr<std::unique_ptr<PollableDevice>> Connect(const TcpOptions& options,
                                                  bootstrap::Store& store, int rank, int size);

}  // namespace kolo::transport::tcp
