// The software verbs device: an in-process stand-in for an RDMA NIC, for tests and for the
// benchmark's labelled "rdma (software verbs device)" row on hosts that have no RDMA hardware. It
// proves kolo's RDMA protocol logic (ordering, flow control, errors, teardown), not RDMA
// performance: every transfer is a memcpy made by the thread that posts (or, for a message that
// waited for a receive, by the thread that posts that receive).
//
// One fabric per process: every device the table lists ("softverbs0" … ) is a port on it, and QPs
// of any two contexts of the process can be connected, so ranks run as threads of one process.
// Each opened context is a port of its own: port 1, ACTIVE, link layer InfiniBand, a LID unique in
// the process (1, 2, …) and one GID (index 0) whose interface id holds the LID; the fabric routes
// by LID (ah_attr.dlid) or, with is_global, by that GID. A QP in another process cannot be reached:
// connecting to an address the fabric does not know fails the modify to RTR with EINVAL.
//
// Implemented as strictly as hardware is, for what the transport uses:
// - PDs, MRs (lkey/rkey, access flags): a work request whose scatter/gather entry is not inside an
//   MR of the QP's PD with the lkey given completes with IBV_WC_LOC_PROT_ERR; an RDMA write to a
//   range not inside a remote MR with that rkey, or without IBV_ACCESS_REMOTE_WRITE, completes
//   with IBV_WC_REM_ACCESS_ERR at the requester and moves both QPs to ERROR. dereg_mr of an MR, or
//   dealloc_pd / destroy_cq / close_device of an object still in use, fails with EBUSY.
// - RC QPs with the state machine RESET → INIT → RTR → RTS (and any → ERROR, any → RESET); a
//   transition with a missing required attribute or from the wrong state fails with EINVAL;
//   posting a send before RTS or a receive in RESET fails with EINVAL. In ERROR every outstanding
//   and later work request completes with IBV_WC_WR_FLUSH_ERR.
// - IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM;
//   IBV_SEND_INLINE (up to max_inline_data), IBV_SEND_SIGNALED / sq_sig_all. Sends and writes
//   with immediate consume the responder's receives in posting order; a message longer than the
//   receive's buffers completes with IBV_WC_LOC_LEN_ERR at the responder (IBV_WC_REM_INV_REQ_ERR at
//   the requester) and moves both QPs to ERROR. With no receive posted the message waits
//   (receiver not ready) and is delivered when one is posted, in order; queue depths are bounded
//   by the QP's max_send_wr / max_recv_wr (posting beyond them fails with ENOMEM).
// - CQs (overflow moves the CQ's QPs to ERROR), completion channels whose fd is readable when an
//   armed CQ gets a completion (fd can be made O_NONBLOCK; get_cq_event then fails with EAGAIN),
//   ack_cq_events.
//
// Fault injection (below), for the failures a transport must survive.
#pragma once

#include <infiniband/verbs.h>

#include "engine/transport/rdma/verbs.h"

namespace kolo::transport::rdma::soft {

// The software device's table (label "software verbs device (in-process test stand-in, not RDMA
// hardware)", software = true). Lives for the process.
const Verbs* Table();

// Number of devices get_device_list reports (default 1: "softverbs0"). Tests that need "no device"
// or several set it. Thread-safe.
void SetDeviceCount(int n);

// The next work request that completes on `qp` (send or receive side) completes with `status`
// instead, and `qp` moves to ERROR (its peer's later work requests fail as a vanished peer's do).
void FailNextCompletion(ibv_qp* qp, ibv_wc_status status);
// Moves `qp` to ERROR now, as a NIC does on a fatal error: outstanding work requests are flushed.
void ForceError(ibv_qp* qp);
// Makes the context's port vanish, as a killed process or a pulled cable does: its QPs stop
// responding. A peer's work request to one of them completes with IBV_WC_RETRY_EXC_ERR after the
// transport-retry time the peer's QP was configured with (attr.timeout and retry_cnt, as on
// hardware, but capped at 1 s), and the peer's QP moves to ERROR. Nothing completes on the
// vanished context any more; it can still be torn down.
void Vanish(ibv_context* context);

// Objects alive in the fabric, for leak checks in tests.
struct Live {
  int contexts = 0, pds = 0, mrs = 0, cqs = 0, channels = 0, qps = 0;
};
Live LiveObjects();

}  // namespace kolo::transport::rdma::soft
