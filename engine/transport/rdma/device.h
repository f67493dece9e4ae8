// The RDMA transport: one reliable-connected (RC) queue pair per peer, one completion queue and
// completion channel per device, every verb called through a Verbs table (verbs.h): rdma-core's
// libibverbs loaded at run time, or the in-process software verbs device for tests
// (soft/soft_verbs.h; it proves the protocol logic, not RDMA performance).
//
// Set-up. Each rank opens the device (Options::ib_device, or the first one with an ACTIVE port),
// creates its QPs and, per peer, a control block: registered memory its peer writes into (eager
// slots, the advert ring, the direct headers, an abort reason, a proof). It publishes
// "rdma/info/<rank>" in the store: per peer the port's LID and GID, the QP number, the initial
// PSN, the control block's address and rkey and a fresh nonce, followed by an HMAC-SHA-256 of all
// of it under the job secret; a record whose HMAC does not verify fails the set-up. The QPs go
// INIT → RTR → RTS ("rdma/ready/<rank>" says a rank's QPs can receive), and then each side writes
// a proof over the QP, HMAC(secret, label, both ranks, both nonces, both QP numbers), which the
// other checks before Connect returns: the endpoint at the end of the QP knows the secret.
//
// Wire protocol after set-up. Every message to a peer is an RDMA write with immediate into the
// peer's control block or straight into a Region the peer advertised; the 32-bit immediate is a
// 4-bit type and a 28-bit value. The receive queue holds only zero-length receives (a write with
// immediate consumes one without placing bytes in it), reposted as soon as each completes, so
// notifications never wait behind unread data. Messages on a pair are numbered 0, 1, … in send
// order, and the receiver's receives likewise: message i goes to receive i.
// - EAGER (value: slot): a message of at most kSlotBytes - 16 bytes is written, a 16-byte header
//   (tag, length, flags) and the payload gathered straight from the sender's Region, into the
//   next of kSlots slots of the peer. A sender holds one credit per free slot; the receiver copies
//   a slot out when the matching receive is posted and returns its credits with CREDIT (value:
//   slots freed so far, modulo 2^28). A sender without credits waits: it never overruns.
// - ADVERT (value: receive index): the receiver writes {index, address, rkey, capacity, tag} of a
//   posted receive into the sender's advert ring (kAdverts entries, entry = index mod kAdverts),
//   for receives within kAdverts of the next message expected (the ring entry is reused only
//   after the message it served has arrived).
// - DIRECT (value: message index): a message with the advert of its receive in hand whose tag
//   and size fit is written zero-copy from the sender's Region into the advertised memory
//   (RDMA write), followed by its header (tag, length) into the peer's direct-header entry with
//   the immediate. Messages larger than an eager slot always go this way.
// - RTS (value: message index): a message that must wait for its receive's advert says so, so
//   that the receiver's WaitForArrival sees it. A message whose advert names another tag or too
//   small a receive is sent as an EAGER header alone (flag WITHHELD): the receiver reports the
//   protocol error naming both tags (sizes), as TCP does.
// - KEEPALIVE (no payload) on a pair idle for min(peer timeout / 8, 1 s) while the device is
//   polled; GOODBYE on clean shutdown; ABORT (value: reason length; the reason is written into
//   the peer's control block first).
// Control messages (CREDIT, ADVERT, the direct header, KEEPALIVE, GOODBYE) are sent inline where
// the device allows.
//
// Errors, as on TCP: a completion with an error status, a QP flushed because it is in the error
// state, a peer that stopped responding (the QP's transport retries, bounded by about half the
// peer timeout, run out: keepalives make sure something is in flight to every peer), or a GOODBYE
// while operations on the pair are pending is kUnavailable "connection to rank R lost ..."; an
// ABORT is kAborted "rank R aborted: <reason>"; a tag mismatch, an oversize message or a malformed
// notification is kProtocol naming the peer. Sticky. A Poll timeout is kDeadlineExceeded (not
// sticky) and names the silent peers first, as TCP's does.
//
// Memory. Register pins through a registration cache keyed by address range (page-rounded): a
// Region inside memory already registered reuses that MR, which is deregistered when the last
// Region using it is destroyed. CanAccumulate() is false: bytes land in memory directly, so the
// collectives receive into scratch and sum afterwards.
//
// Shutdown: destroying a Device sends GOODBYE to every peer and waits at most 200 ms for those
// writes to complete; Abort sends ABORT the same way (at most 1 s). Then QPs, MRs, the CQ, the
// completion channel, the PD and the context are destroyed in that order, on error paths too.
//
// Layout of rdma/: wire_ids.h (control-block layout, immediates, work-request ids), peer_info.h
// (the set-up records and proofs), registration_cache.h (MRs and Regions), pair.h (one QP and
// its protocol), pick_device.h (device, port and GID choice), device.cc (the device: set-up,
// completions, teardown), verbs.h (the verbs table), soft/ (the software verbs device).
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
#include "engine/transport/rdma/verbs.h"

namespace kolo::transport::rdma {

struct RdmaOptions {
  // Per-job secret (the set-up records' HMAC and the proofs over the QPs).
  std::string secret;
  // Bound on the whole connection set-up; also the peer timeout the keepalives and the QPs'
  // transport retries are sized by.
  std::chrono::milliseconds timeout{30000};
  // Device name (Options::ib_device); empty: the first device with an ACTIVE port.
  std::string device;
  // Port number (Options::ib_port).
  int port = 1;
  // GID index (Options::ib_gid_index); -1: automatic (RoCE: a RoCE v2 IPv4-mapped GID if the
  // port has one, else index 0; InfiniBand: LID routing).
  int gid_index = -1;
  // Verbs table: "libibverbs" or "soft" (Options::ib_verbs).
  std::string verbs = "libibverbs";
  // This host's name, for the error when it has no RDMA device.
  std::string host_name;
  // Spin on the completion queue instead of sleeping on the completion channel.
  bool busy_poll = false;
  // The ranks to connect to (the connection plan's); unset: every other rank. The device has
  // pair(p) only for these.
  std::optional<std::vector<int>> peers;
};

// Connects `rank` to every other rank of a job of `size` ranks over RC queue pairs (see above).
// Fails before creating anything when the verbs table cannot be loaded or the host has no usable
// device (Unavailable naming the host), or the named device does not exist (NotFound listing the
// devices that do); DeadlineExceeded after options.timeout names the ranks still missing.
StatusOr<std::unique_ptr<PollableDevice>> Connect(const RdmaOptions& options,
                                                  bootstrap::Store& store, int rank, int size);

// The checks Connect makes before creating anything (the verbs table loads, the device exists
// and its port is ACTIVE), for failing at start-up before any exchange with the other ranks.
Status Probe(const RdmaOptions& options);

// For fault-injection tests: the QP that connects an RDMA `device` to `peer`, and the device's
// verbs context; null when `device` is not an RDMA device (or is closed).
ibv_qp* QueuePairForTests(Device& device, int peer);
ibv_context* ContextForTests(Device& device);

// The names of the devices the table lists, joined by ", " ("" when there is none, also when the
// kernel has no RDMA support); an error when the list cannot be read.
StatusOr<std::string> DeviceNames(const Verbs& verbs);

}  // namespace kolo::transport::rdma
