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
// - PDs, MRs (lkey/rkey, access flags; an MR's rkey differs from its lkey, so a key used on the
//   wrong side is not found): a work request whose scatter/gather entry is not inside an MR of the
//   QP's PD with the lkey given completes with IBV_WC_LOC_PROT_ERR (a receive's entries also need
//   IBV_ACCESS_LOCAL_WRITE: IBV_WC_LOC_PROT_ERR at the responder, IBV_WC_REM_OP_ERR at the
//   requester); an RDMA write to a range not inside a remote MR with that rkey, or without
//   IBV_ACCESS_REMOTE_WRITE on the MR or on the responder's QP (qp_access_flags), completes with
//   IBV_WC_REM_ACCESS_ERR at the requester and moves both QPs to ERROR. reg_mr refuses remote write
//   without local write (EINVAL). dereg_mr of an MR that a posted, not yet completed work request
//   names, dealloc_pd / destroy_comp_channel / close_device of an object still in use, and
//   destroy_cq of a CQ a QP uses or with events get_cq_event returned and ack_cq_events did not
//   acknowledge, fail with EBUSY. A pointer the device did not make is refused with EINVAL.
// - RC QPs only (no SRQ) with the state machine RESET → INIT → RTR → RTS (and any → ERROR, any →
//   RESET); a transition with a missing required attribute, one it does not take, a value out of
//   range, or from the wrong state fails with EINVAL; posting a send before RTS or a receive in
//   RESET fails with EINVAL. In ERROR every outstanding and later work request completes with
//   IBV_WC_WR_FLUSH_ERR. Moving to RESET discards work requests without completions; RESET and
//   destroy_qp remove the QP's completions from its CQs.
// - IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM (any other
//   opcode: post_send fails with EINVAL); IBV_SEND_INLINE (up to max_inline_data, at most 256; the
//   data is copied when posted), IBV_SEND_SIGNALED / sq_sig_all, IBV_SEND_SOLICITED. A QP executes
//   its work requests in posting order: one waits behind an earlier one that waits. Sends and
//   writes with immediate consume the responder's receives in posting order; a message longer than
//   the receive's buffers completes with IBV_WC_LOC_LEN_ERR at the responder
//   (IBV_WC_REM_INV_REQ_ERR at the requester) and moves both QPs to ERROR. With no receive posted
//   the message waits (receiver not ready, however long: rnr_retry is not modelled) and is
//   delivered when one is posted, in order. An error completes even an unsignaled work request; an
//   unsignaled one that succeeded keeps its send-queue slot until a later signaled one of the QP
//   completes. Queue depths are bounded by the QP's max_send_wr / max_recv_wr (posting beyond them
//   fails with ENOMEM).
// - A responder that does not answer — its QP gone, vanished, in RESET, INIT or ERROR, connected to
//   another QP, or expecting another PSN than the requester's sq_psn (each message advances both by
//   one) — makes the requester's work request complete with IBV_WC_RETRY_EXC_ERR after the
//   requester's transport-retry time, 4.096 us * 2^timeout * (retry_cnt + 1), capped at 1 s
//   (timeout 0, infinite on hardware, is 1 s), and moves the requester's QP to ERROR.
// - CQs (overflow moves the CQ's QPs to ERROR and, once the completions it kept are read, poll_cq
//   returns -EOVERFLOW), completion channels whose fd is readable when an armed CQ gets a
//   completion (with solicited_only, a solicited or an error one); the fd can be made O_NONBLOCK,
//   and get_cq_event then fails with EAGAIN (on a blocking fd it blocks, as libibverbs' does);
//   ack_cq_events. The contexts' ops table has poll_cq, req_notify_cq, post_send and post_recv,
//   so libibverbs' inline calls on the device's objects work too.
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
// vanished context any more (work requests posted there are taken and never complete) and
// query_port reports its port DOWN; it can still be torn down.
void Vanish(ibv_context* context);

// Objects alive in the fabric, for leak checks in tests.
struct Live {
  int contexts = 0, pds = 0, mrs = 0, cqs = 0, channels = 0, qps = 0;
};
Live LiveObjects();

}  // namespace kolo::transport::rdma::soft
