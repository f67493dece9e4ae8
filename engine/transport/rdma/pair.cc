#include "engine/transport/rdma/pair.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "engine/common/logging.h"
#include "engine/common/random.h"

namespace kolo::transport::rdma {

Status RdmaPair::Send(const Region& region, size_t offset, size_t nbytes, uint64_t tag) {
  if (!state_.error.ok()) return state_.error;
  const auto* r = dynamic_cast<const RdmaRegion*>(&region);
  if (r == nullptr || r->owner() != owner_) {
    return InvalidArgument(
        "send to rank {} (tag {:#x}): the region was not registered with this "
        "RDMA device",
        peer_, tag);
  }
  if (offset > region.size() || nbytes > region.size() - offset) {
    return InvalidArgument("send to rank {} (tag {:#x}): bytes [{}, {}) exceed the {}-byte region",
                           peer_, tag, offset, offset + nbytes, region.size());
  }
  if (peer_gone_ || dead_) {
    return state_.Fail(
        Lost(fmt::format("cannot send message tag {:#x}: rank {} has shut down", tag, peer_)));
  }
  cache_->Retain(r->entry());
  sends_.push_back(
      SendOp{r->data() + offset, r->lkey(), r->entry(), nbytes, tag, send_index_next_++});
  return Progress();
}

Status RdmaPair::Recv(Region& region, size_t offset, size_t capacity, uint64_t tag) {
  if (!state_.error.ok()) return state_.error;
  auto* r = dynamic_cast<RdmaRegion*>(&region);
  if (r == nullptr || r->owner() != owner_) {
    return InvalidArgument(
        "receive from rank {} (tag {:#x}): the region was not registered with this RDMA device",
        peer_, tag);
  }
  if (offset > region.size() || capacity > region.size() - offset) {
    return InvalidArgument(
        "receive from rank {} (tag {:#x}): bytes [{}, {}) exceed the {}-byte region", peer_, tag,
        offset, offset + capacity, region.size());
  }
  if (!r->writable() && capacity > 0) {
    return InvalidArgument(
        "receive from rank {} (tag {:#x}): the region's memory could only be registered for "
        "reading",
        peer_, tag);
  }
  cache_->Retain(r->entry());
  RecvOp op{r->data() + offset, r->rkey(), r->entry(), capacity, tag, recv_index_next_++, false};
  if (!stash_.empty()) {
    const uint64_t slot = stash_.front();
    stash_.pop_front();
    KOLO_RETURN_IF_ERROR(state_.Fail(DeliverEager(op, slot)));
    return Progress();
  }
  if (peer_gone_ || dead_) {
    return state_.Fail(Lost(fmt::format(
        "rank {} shut down while a receive from it was posted (tag {:#x})", peer_, tag)));
  }
  recvs_.push_back(op);
  return Progress();
}

Status RdmaPair::Create(ibv_context* ctx, ibv_pd* pd, ibv_cq* cq, uint8_t port) {
  pd_ = pd;
  port_ = port;
  ctrl_ = static_cast<uint8_t*>(std::aligned_alloc(4096, kCtrlBytes));
  staging_ = static_cast<uint8_t*>(std::aligned_alloc(4096, kStagingBytes));
  if (ctrl_ == nullptr || staging_ == nullptr) return Internal("out of memory");
  std::memset(ctrl_, 0, kCtrlBytes);
  std::memset(staging_, 0, kStagingBytes);
  ctrl_mr_ =
      verbs_->reg_mr(pd, ctrl_, kCtrlBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (ctrl_mr_ == nullptr) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("ibv_reg_mr (control block for rank {})", peer_), errno);
  }
  staging_mr_ = verbs_->reg_mr(pd, staging_, kStagingBytes, IBV_ACCESS_LOCAL_WRITE);
  if (staging_mr_ == nullptr) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("ibv_reg_mr (staging for rank {})", peer_), errno);
  }
  for (uint32_t inline_bytes : {kInlineWanted, 0u}) {
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 1;
    init.cap.max_send_wr = kSqDepth;
    init.cap.max_recv_wr = kRqDepth;
    init.cap.max_send_sge = 2;
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = inline_bytes;
    qp_ = verbs_->create_qp(pd, &init);
    if (qp_ != nullptr) {
      max_inline_ = init.cap.max_inline_data;
      break;
    }
  }
  if (qp_ == nullptr) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("ibv_create_qp (RC, for rank {})", peer_), errno);
  }
  (void)ctx;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = port;
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (int rc = verbs_->modify_qp(
          qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
      rc != 0) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("ibv_modify_qp to INIT (QP for rank {})", peer_), rc);
  }
  for (int i = 0; i < kRqDepth; ++i) KOLO_RETURN_IF_ERROR(PostRecv());
  FillRandom(&mine_.psn, sizeof mine_.psn);
  mine_.psn &= 0xffffff;
  FillRandom(mine_.nonce, sizeof mine_.nonce);
  mine_.qpn = qp_->qp_num;
  mine_.ctrl_addr = reinterpret_cast<uintptr_t>(ctrl_);
  mine_.ctrl_rkey = ctrl_mr_->rkey;
  return Status::OK();
}

Status RdmaPair::ConnectTo(const PeerInfo& theirs, uint8_t sgid_index, int timeout_exp) {
  theirs_ = theirs;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(std::min(mine_.mtu, theirs.mtu));
  a.dest_qp_num = theirs.qpn;
  a.rq_psn = theirs.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.dlid = theirs.lid;
  a.ah_attr.sl = 0;
  a.ah_attr.src_path_bits = 0;
  a.ah_attr.port_num = port_;
  if (mine_.global || theirs.global) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, theirs.gid, 16);
    a.ah_attr.grh.sgid_index = sgid_index;
    a.ah_attr.grh.hop_limit = 64;
  }
  if (int rc =
          verbs_->modify_qp(qp_, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
      rc != 0) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("ibv_modify_qp to RTR (QP to rank {}, its QP {:#x}, LID {})",
                                   peer_, theirs.qpn, theirs.lid),
                       rc);
  }
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_RTS;
  s.timeout = static_cast<uint8_t>(timeout_exp);
  s.retry_cnt = 7;
  s.rnr_retry = 7;  // receiver not ready: retry for ever (the receiver reposts as it polls)
  s.sq_psn = mine_.psn;
  s.max_rd_atomic = 1;
  if (int rc = verbs_->modify_qp(qp_, &s,
                                 IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
      rc != 0) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("ibv_modify_qp to RTS (QP to rank {})", peer_), rc);
  }
  return Status::OK();
}

Status RdmaPair::SendProof(const Digest& proof) {
  std::memcpy(staging_ + kStProofOffset, proof.data(), kProofBytes);
  return PostWrite(Wr::kControl, 0, staging_ + kStProofOffset, kProofBytes, kProofOffset,
                   Imm::kProof, 0);
}

Status RdmaPair::OnCompletion(const ibv_wc& wc) {
  const Wr kind = WrKind(wc.wr_id);
  if (kind != Wr::kRecv) --sq_used_;
  if (kind == Wr::kAdvert) advert_busy_[WrValue(wc.wr_id) % kAdverts] = false;
  if (wc.status != IBV_WC_SUCCESS) return OnError(wc);
  if (kind == Wr::kRecv) {
    last_rx_ = Clock::now();
    if (!dead_) KOLO_RETURN_IF_ERROR(PostRecv());
    if ((wc.wc_flags & IBV_WC_WITH_IMM) == 0) {
      return ProtocolError("rank {} sent a notification without an immediate", peer_);
    }
    return OnNotification(ntohl(wc.imm_data));
  }
  if (kind == Wr::kSendLast) {
    if (inflight_.empty()) return Internal("rdma: a send completion with no send in flight");
    const SendOp op = inflight_.front();
    inflight_.pop_front();
    cache_->Release(op.mr);
    state_.bytes_sent += op.nbytes;
    state_.completions.push_back(Completion{peer_, OpKind::kSend, op.tag, op.nbytes});
  }
  return Status::OK();
}

Status RdmaPair::Progress() {
  if (!state_.error.ok()) return state_.error;
  if (dead_ || qp_ == nullptr) return Status::OK();
  Status s = Flush();
  if (!s.ok()) return state_.Fail(s);
  return Status::OK();
}

Status RdmaPair::MaybeKeepalive(Clock::time_point now, std::chrono::milliseconds interval) {
  if (dead_ || peer_gone_ || now - last_tx_ < interval) return Status::OK();
  if (sq_used_ + 1 > kSqDepth) return Status::OK();
  Status s = PostControl(Imm::kKeepalive, 0);
  if (!s.ok()) return state_.Fail(s);
  return Status::OK();
}

Clock::duration RdmaPair::SilentFor(Clock::time_point now) const {
  if (Arrived()) return Clock::duration::zero();
  return now - last_rx_;
}

std::string RdmaPair::DescribePending() const {
  const size_t nsend = sends_.size() + inflight_.size();
  if (nsend == 0 && recvs_.empty()) return "";
  std::string text = fmt::format("rank {}:", peer_);
  if (!recvs_.empty()) {
    text += fmt::format(" {} recv (next tag {:#x}, {} bytes)", recvs_.size(), recvs_.front().tag,
                        recvs_.front().capacity);
  }
  if (nsend > 0) {
    const SendOp& f = inflight_.empty() ? sends_.front() : inflight_.front();
    text += fmt::format(" {} send (next tag {:#x}, {} bytes)", nsend, f.tag, f.nbytes);
  }
  return text;
}

bool RdmaPair::PostFarewell(const std::string* reason) {
  if (!usable() || !proven_) return false;
  farewell_ = true;
  Status s;
  if (reason != nullptr) {
    const size_t n = std::min(reason->size(), kReasonBytes);
    std::memcpy(staging_ + kStReasonOffset, reason->data(), n);
    s = PostWrite(Wr::kControl, 0, staging_ + kStReasonOffset, n, kReasonOffset, Imm::kAbort, n);
  } else {
    s = PostControl(Imm::kGoodbye, 0);
  }
  return s.ok();
}

void RdmaPair::DestroyQp() {
  if (qp_ != nullptr) {
    if (verbs_->destroy_qp(qp_) != 0) {
      KOLO_LOG(kWarning, "rdma: ibv_destroy_qp (rank {}) failed: {}", peer_, std::strerror(errno));
    }
    qp_ = nullptr;
  }
  dead_ = true;
}

void RdmaPair::DestroyMrs() {
  if (ctrl_mr_ != nullptr) verbs_->dereg_mr(ctrl_mr_);
  if (staging_mr_ != nullptr) verbs_->dereg_mr(staging_mr_);
  ctrl_mr_ = staging_mr_ = nullptr;
  std::free(ctrl_);
  std::free(staging_);
  ctrl_ = staging_ = nullptr;
}

Status RdmaPair::OnError(const ibv_wc& wc) {
  const bool was_dead = dead_;
  dead_ = true;
  // A peer that said GOODBYE has destroyed its QP: what we still had in flight to it fails,
  // which matters only if something was still expected of it.
  if ((peer_gone_ && !pending()) || farewell_) return Status::OK();
  if (was_dead && wc.status == IBV_WC_WR_FLUSH_ERR) return Status::OK();
  std::string why;
  switch (wc.status) {
    case IBV_WC_RETRY_EXC_ERR:
      why = "it stopped responding (transport retries exhausted): killed, hung or unreachable";
      break;
    case IBV_WC_WR_FLUSH_ERR:
      why = "the queue pair went into the error state";
      break;
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_REM_INV_REQ_ERR:
    case IBV_WC_REM_OP_ERR:
      why = "the peer's NIC rejected a write";
      break;
    default:
      why = "a work request failed";
  }
  return Lost(fmt::format("{} (completion status '{}', {})", why, verbs_->wc_status_str(wc.status),
                          WrKind(wc.wr_id) == Wr::kRecv ? "receive" : "send"));
}

Status RdmaPair::OnNotification(uint32_t imm) {
  const auto type = static_cast<Imm>(imm >> kValueBits);
  const uint32_t value = imm & kValueMask;
  if (peer_gone_ && type != Imm::kAbort) {
    return ProtocolError("rank {} sent a notification (type {}) after its GOODBYE", peer_,
                         static_cast<uint32_t>(type));
  }
  switch (type) {
    case Imm::kEager:
      return OnEager(value);
    case Imm::kDirect:
      return OnDirect(value);
    case Imm::kCredit: {
      const int64_t freed = Unwrap(peer_freed_, value);
      if (freed < 0 || static_cast<uint64_t>(freed) > eager_sent_) {
        return ProtocolError("rank {} returned credits it was never given", peer_);
      }
      peer_freed_ = static_cast<uint64_t>(freed);
      return Status::OK();
    }
    case Imm::kAdvert:
      return OnAdvert(value);
    case Imm::kRts: {
      const int64_t index = Unwrap(received_, value);
      if (index >= 0) rts_upto_ = std::max(rts_upto_, static_cast<uint64_t>(index) + 1);
      return Status::OK();
    }
    case Imm::kKeepalive:
      return Status::OK();
    case Imm::kGoodbye:
      peer_gone_ = true;
      if (!recvs_.empty()) {
        return Lost(fmt::format(
            "rank {} shut down while {} receive(s) from it were still posted (next tag {:#x})",
            peer_, recvs_.size(), recvs_.front().tag));
      }
      if (!sends_.empty() || !inflight_.empty()) {
        const SendOp& f = inflight_.empty() ? sends_.front() : inflight_.front();
        return Lost(
            fmt::format("rank {} shut down before taking {} message(s) sent to it (next tag {:#x})",
                        peer_, sends_.size() + inflight_.size(), f.tag));
      }
      return Status::OK();
    case Imm::kAbort: {
      const size_t n = std::min<size_t>(value, kReasonBytes);
      if (n == 0) return Aborted("rank {} aborted (no reason given)", peer_);
      return Aborted("rank {} aborted: {}", peer_,
                     std::string(reinterpret_cast<const char*>(ctrl_ + kReasonOffset), n));
    }
    case Imm::kProof: {
      Digest got;
      std::memcpy(got.data(), ctrl_ + kProofOffset, kProofBytes);
      if (!DigestsEqual(got, expected_proof_)) {
        return Unavailable(
            "rank {}'s end of the RDMA connection failed authentication (wrong job secret?)",
            peer_);
      }
      proven_ = true;
      return Status::OK();
    }
  }
  return ProtocolError("rank {} sent a notification of unknown type {}", peer_,
                       static_cast<uint32_t>(type));
}

Status RdmaPair::OnEager(uint32_t slot_value) {
  const uint64_t slot = eager_received_ % kSlots;
  if (slot_value != slot) {
    return ProtocolError("rank {} wrote eager slot {} where slot {} was next", peer_, slot_value,
                         slot);
  }
  ++eager_received_;
  ++received_;
  if (!recvs_.empty()) {
    const RecvOp op = recvs_.front();
    recvs_.pop_front();
    return DeliverEager(op, slot);
  }
  stash_.push_back(slot);
  return Status::OK();
}

Status RdmaPair::DeliverEager(const RecvOp& op, uint64_t slot) {
  const uint8_t* h = ctrl_ + kSlotsOffset + slot * kSlotBytes;
  const uint64_t tag = Get64(h);
  const uint64_t length = Get32(h + 8);
  const uint32_t flags = Get32(h + 12);
  KOLO_RETURN_IF_ERROR(Check(op, tag, length));
  if ((flags & kWithheld) != 0 || length > kEagerMax) {
    return ProtocolError("rank {} sent a malformed eager message (tag {:#x}, {} bytes)", peer_, tag,
                         length);
  }
  if (length > 0) std::memcpy(op.data, h + kHeaderBytes, length);
  ++freed_;
  Complete(op, length);
  return Status::OK();
}

Status RdmaPair::Check(const RecvOp& op, uint64_t tag, uint64_t length) const {
  if (tag != op.tag) {
    return ProtocolError(
        "rank {} sent a message with tag {:#x} ({} bytes) but the next receive posted for it "
        "expects tag {:#x} ({} bytes): the ranks are running different operations",
        peer_, tag, length, op.tag, op.capacity);
  }
  if (length > op.capacity) {
    return ProtocolError(
        "rank {} sent a {}-byte message with tag {:#x} but the posted receive holds {} bytes",
        peer_, length, op.tag, op.capacity);
  }
  return Status::OK();
}

void RdmaPair::Complete(const RecvOp& op, uint64_t length) {
  cache_->Release(op.mr);
  state_.bytes_received += length;
  state_.completions.push_back(Completion{peer_, OpKind::kRecv, op.tag, length});
}

Status RdmaPair::OnDirect(uint32_t value) {
  const uint64_t index = received_;
  if ((index & kValueMask) != value || recvs_.empty() || recvs_.front().index != index ||
      !recvs_.front().advertised) {
    return ProtocolError("rank {} wrote message {} directly, but receive {} was not advertised",
                         peer_, value, index);
  }
  const uint8_t* h = ctrl_ + kDirectOffset + (index % kAdverts) * kHeaderBytes;
  const RecvOp op = recvs_.front();
  recvs_.pop_front();
  ++received_;
  const uint64_t tag = Get64(h);
  const uint64_t length = Get64(h + 8);
  KOLO_RETURN_IF_ERROR(Check(op, tag, length));
  Complete(op, length);
  return Status::OK();
}

Status RdmaPair::OnAdvert(uint32_t value) {
  const int64_t index = Unwrap(send_index_, value);
  if (index < 0) return Status::OK();  // for a message already sent eagerly
  const uint8_t* e =
      ctrl_ + kAdvertsOffset + (static_cast<uint64_t>(index) % kAdverts) * kAdvertBytes;
  Advert a{Get64(e), Get64(e + 8), Get64(e + 16), Get64(e + 24), Get32(e + 32)};
  if (a.index != static_cast<uint64_t>(index) ||
      (!adverts_.empty() && adverts_.back().index >= a.index)) {
    return ProtocolError("rank {} sent a malformed advert (receive {}, entry for {})", peer_, index,
                         a.index);
  }
  adverts_.push_back(a);
  return Status::OK();
}

Status RdmaPair::Flush() {
  if (peer_gone_ || !proven_) return Status::OK();
  // Sends, in order.
  while (!sends_.empty()) {
    SendOp& op = sends_.front();
    while (!adverts_.empty() && adverts_.front().index < op.index) adverts_.pop_front();
    const bool have_advert = !adverts_.empty() && adverts_.front().index == op.index;
    const bool fits =
        have_advert && adverts_.front().tag == op.tag && op.nbytes <= adverts_.front().capacity;
    const bool credit = eager_sent_ - peer_freed_ < kSlots;
    bool posted = false;
    if (fits && (op.nbytes > kPreferEager || !credit)) {
      KOLO_ASSIGN_OR_RETURN(posted, PostDirect(op, adverts_.front()));
    } else if (op.nbytes <= kEagerMax || (have_advert && !fits)) {
      if (!credit) break;
      KOLO_ASSIGN_OR_RETURN(posted, PostEager(op, /*withheld=*/op.nbytes > kEagerMax));
    } else {
      // Waits for its receive's advert; says so once.
      if (rts_sent_upto_ <= op.index && sq_used_ + 1 <= kSqDepth) {
        KOLO_RETURN_IF_ERROR(PostControl(Imm::kRts, op.index));
        rts_sent_upto_ = op.index + 1;
      }
      break;
    }
    if (!posted) break;
    if (have_advert) adverts_.pop_front();
    inflight_.push_back(op);
    sends_.pop_front();
    ++send_index_;
  }
  // Credits for the slots copied out.
  if (freed_ != freed_reported_ && sq_used_ + 1 <= kSqDepth) {
    KOLO_RETURN_IF_ERROR(PostControl(Imm::kCredit, freed_));
    freed_reported_ = freed_;
  }
  // Adverts for posted receives within the window.
  for (RecvOp& op : recvs_) {
    if (op.advertised) continue;
    if (op.index >= received_ + kAdverts) break;
    const uint64_t pos = op.index % kAdverts;
    if (advert_busy_[pos] || sq_used_ + 1 > kSqDepth) break;
    uint8_t* e = staging_ + kStAdvertOffset + pos * kAdvertBytes;
    Put64(e, op.index);
    Put64(e + 8, reinterpret_cast<uintptr_t>(op.data));
    Put64(e + 16, op.capacity);
    Put64(e + 24, op.tag);
    Put32(e + 32, op.rkey);
    KOLO_RETURN_IF_ERROR(PostWrite(Wr::kAdvert, pos, e, kAdvertBytes,
                                   kAdvertsOffset + pos * kAdvertBytes, Imm::kAdvert, op.index));
    advert_busy_[pos] = true;
    op.advertised = true;
  }
  return Status::OK();
}

StatusOr<bool> RdmaPair::PostEager(const SendOp& op, bool withheld) {
  if (sq_used_ + 1 > kSqDepth) return false;
  const uint64_t slot = eager_sent_ % kSlots;
  uint8_t* h = staging_ + kStEagerOffset + slot * kHeaderBytes;
  Put64(h, op.tag);
  Put32(h + 8, static_cast<uint32_t>(op.nbytes));
  Put32(h + 12, withheld ? kWithheld : 0);
  const size_t payload = withheld ? 0 : op.nbytes;
  ibv_sge sge[2]{};
  sge[0] = {reinterpret_cast<uintptr_t>(h), static_cast<uint32_t>(kHeaderBytes), staging_mr_->lkey};
  int nsge = 1;
  if (payload > 0) {
    sge[1] = {reinterpret_cast<uintptr_t>(op.data), static_cast<uint32_t>(payload), op.lkey};
    nsge = 2;
  }
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(Wr::kSendLast, peer_);
  wr.sg_list = sge;
  wr.num_sge = nsge;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED | (kHeaderBytes + payload <= max_inline_ ? IBV_SEND_INLINE : 0);
  wr.imm_data = MakeImm(Imm::kEager, slot);
  wr.wr.rdma.remote_addr = theirs_.ctrl_addr + kSlotsOffset + slot * kSlotBytes;
  wr.wr.rdma.rkey = theirs_.ctrl_rkey;
  KOLO_RETURN_IF_ERROR(Post(&wr, 1));
  ++eager_sent_;
  return true;
}

StatusOr<bool> RdmaPair::PostDirect(const SendOp& op, const Advert& a) {
  const size_t pieces = (op.nbytes + kMaxWrite - 1) / kMaxWrite;
  if (sq_used_ + static_cast<int>(pieces) + 1 > kSqDepth) return false;
  for (size_t done = 0; done < op.nbytes; done += kMaxWrite) {
    const size_t n = std::min(kMaxWrite, op.nbytes - done);
    ibv_sge sge{reinterpret_cast<uintptr_t>(op.data + done), static_cast<uint32_t>(n), op.lkey};
    ibv_send_wr wr{};
    wr.wr_id = MakeWrId(Wr::kSendPart, peer_);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = a.addr + done;
    wr.wr.rdma.rkey = a.rkey;
    KOLO_RETURN_IF_ERROR(Post(&wr, 1));
  }
  const uint64_t pos = op.index % kAdverts;
  uint8_t* h = staging_ + kStDirectOffset + pos * kHeaderBytes;
  Put64(h, op.tag);
  Put64(h + 8, op.nbytes);
  KOLO_RETURN_IF_ERROR(PostWrite(Wr::kSendLast, 0, h, kHeaderBytes,
                                 kDirectOffset + pos * kHeaderBytes, Imm::kDirect, op.index));
  return true;
}

Status RdmaPair::PostControl(Imm type, uint64_t value) {
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(Wr::kControl, peer_);
  wr.sg_list = nullptr;
  wr.num_sge = 0;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = MakeImm(type, value);
  wr.wr.rdma.remote_addr = theirs_.ctrl_addr;
  wr.wr.rdma.rkey = theirs_.ctrl_rkey;
  return Post(&wr, 1);
}

Status RdmaPair::PostWrite(Wr kind, uint64_t wr_value, const uint8_t* local, size_t n,
                           size_t remote_offset, Imm type, uint64_t value) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(local), static_cast<uint32_t>(n), staging_mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = MakeWrId(kind, peer_, wr_value);
  wr.sg_list = n > 0 ? &sge : nullptr;
  wr.num_sge = n > 0 ? 1 : 0;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED | (n <= max_inline_ ? IBV_SEND_INLINE : 0);
  wr.imm_data = MakeImm(type, value);
  wr.wr.rdma.remote_addr = theirs_.ctrl_addr + remote_offset;
  wr.wr.rdma.rkey = theirs_.ctrl_rkey;
  return Post(&wr, 1);
}

Status RdmaPair::Post(ibv_send_wr* wr, int n) {
  ibv_send_wr* bad = nullptr;
  if (int rc = verbs_->post_send(qp_, wr, &bad); rc != 0) {
    return Lost(fmt::format("ibv_post_send failed: {}", std::strerror(rc)));
  }
  sq_used_ += n;
  last_tx_ = Clock::now();
  return Status::OK();
}

Status RdmaPair::PostRecv() {
  ibv_recv_wr wr{};
  wr.wr_id = MakeWrId(Wr::kRecv, peer_);
  wr.sg_list = nullptr;
  wr.num_sge = 0;
  ibv_recv_wr* bad = nullptr;
  if (int rc = verbs_->post_recv(qp_, &wr, &bad); rc != 0) {
    dead_ = true;
    return Lost(fmt::format("ibv_post_recv failed: {}", std::strerror(rc)));
  }
  return Status::OK();
}

}  // namespace kolo::transport::rdma
