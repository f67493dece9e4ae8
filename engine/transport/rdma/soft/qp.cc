#include <errno.h>
#include <pthread.h>

#include <cstring>
#include <vector>

#include "engine/transport/rdma/soft/fabric.h"
#include "engine/transport/rdma/soft/ops.h"

namespace kolo::transport::rdma::soft::ops {

namespace {

constexpr uint32_t kPsnMask = 0xffffff;

// The attributes a transition of an RC QP requires and those it may take (the IB specification's
// table, as the kernel's ib_modify_qp_is_ok has it; alternate paths are not modelled).
struct Transition {
  int required;
  int optional;
};

bool TransitionFor(ibv_qp_state from, ibv_qp_state to, Transition* t) {
  if (to == IBV_QPS_RESET || to == IBV_QPS_ERR) {
    *t = {0, 0};
    return true;
  }
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    *t = {IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
    return true;
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_INIT) {
    *t = {0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
    return true;
  }
  if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    *t = {IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
          IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
    return true;
  }
  if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    *t = {IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
              IBV_QP_MAX_QP_RD_ATOMIC,
          IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER};
    return true;
  }
  if (from == IBV_QPS_RTS && to == IBV_QPS_RTS) {
    *t = {0, IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER};
    return true;
  }
  return false;
}

// Checks the values modify_qp was given (the mask already checked) and, for IBV_QP_AV, finds the
// remote port's LID. EINVAL for a value out of range or an address the fabric does not know.
int CheckValues(Fabric& f, const ibv_qp_attr& a, int mask, uint16_t* remote_lid)
    KOLO_REQUIRES(f.mu) {
  constexpr int kQpAccess =
      IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  if ((mask & IBV_QP_PORT) && a.port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && a.pkey_index != 0) return EINVAL;
  if ((mask & IBV_QP_ACCESS_FLAGS) &&
      (a.qp_access_flags & ~(kQpAccess | IBV_ACCESS_LOCAL_WRITE)) != 0) {
    return EINVAL;
  }
  if ((mask & IBV_QP_PATH_MTU) && (a.path_mtu < IBV_MTU_256 || a.path_mtu > IBV_MTU_4096)) {
    return EINVAL;
  }
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a.max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a.max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && a.min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && a.timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && a.retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && a.rnr_retry > 7) return EINVAL;
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = a.ah_attr;
    if (ah.port_num != 1) return EINVAL;
    Context* remote = nullptr;
    if (ah.is_global) {
      if (ah.grh.sgid_index != 0) return EINVAL;
      remote = f.ContextByGid(ah.grh.dgid);
    } else {
      remote = f.ContextByLid(ah.dlid);
    }
    if (remote == nullptr) return EINVAL;
    *remote_lid = remote->lid;
  }
  return 0;
}

bool Pending(ibv_qp_state s) { return s == IBV_QPS_RESET || s == IBV_QPS_INIT || s == IBV_QPS_RTR; }

}  // namespace

ibv_qp* CreateQp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Pd* p = f.FindPd(pd);
  if (p == nullptr || attr == nullptr) return Fail<ibv_qp>(EINVAL);
  if (attr->qp_type != IBV_QPT_RC || attr->srq != nullptr) return Fail<ibv_qp>(EINVAL);
  Cq* send_cq = f.FindCq(attr->send_cq);
  Cq* recv_cq = f.FindCq(attr->recv_cq);
  if (send_cq == nullptr || recv_cq == nullptr || send_cq->ctx != p->ctx ||
      recv_cq->ctx != p->ctx) {
    return Fail<ibv_qp>(EINVAL);
  }
  const ibv_qp_cap& cap = attr->cap;
  if (cap.max_send_wr > static_cast<uint32_t>(kMaxQpWr) ||
      cap.max_recv_wr > static_cast<uint32_t>(kMaxQpWr) ||
      cap.max_send_sge > static_cast<uint32_t>(kMaxSge) ||
      cap.max_recv_sge > static_cast<uint32_t>(kMaxSge) || cap.max_inline_data > kMaxInline) {
    return Fail<ibv_qp>(EINVAL);
  }
  auto* q = new Qp();
  q->ctx = p->ctx;
  q->pd = p;
  q->send_cq = send_cq;
  q->recv_cq = recv_cq;
  q->cap = cap;
  q->sq_sig_all = attr->sq_sig_all != 0;
  q->base.context = pd->context;
  q->base.qp_context = attr->qp_context;
  q->base.pd = pd;
  q->base.send_cq = attr->send_cq;
  q->base.recv_cq = attr->recv_cq;
  q->base.handle = f.next_key++;
  q->base.qp_num = f.next_qpn++ & kPsnMask;
  q->base.state = IBV_QPS_RESET;
  q->base.qp_type = IBV_QPT_RC;
  pthread_mutex_init(&q->base.mutex, nullptr);
  pthread_cond_init(&q->base.cond, nullptr);
  q->attr.qp_state = IBV_QPS_RESET;
  q->attr.cap = cap;
  f.qps[&q->base] = q;
  f.qps_by_num[q->base.qp_num] = q;
  return &q->base;
}

int ModifyQp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Qp* q = f.FindQp(qp);
  if (q == nullptr || attr == nullptr) return EINVAL;
  ibv_qp_state cur = q->base.state;
  if ((attr_mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur) return EINVAL;
  ibv_qp_state next = (attr_mask & IBV_QP_STATE) ? attr->qp_state : cur;
  Transition t{};
  if (!TransitionFor(cur, next, &t)) return EINVAL;
  int given = attr_mask & ~(IBV_QP_STATE | IBV_QP_CUR_STATE);
  if ((given & t.required) != t.required || (given & ~(t.required | t.optional)) != 0) {
    return EINVAL;
  }
  uint16_t remote_lid = 0;
  if (int err = CheckValues(f, *attr, given, &remote_lid)) return err;

  ibv_qp_attr& a = q->attr;
  if (given & IBV_QP_PKEY_INDEX) a.pkey_index = attr->pkey_index;
  if (given & IBV_QP_PORT) a.port_num = attr->port_num;
  if (given & IBV_QP_ACCESS_FLAGS) a.qp_access_flags = attr->qp_access_flags;
  if (given & IBV_QP_PATH_MTU) a.path_mtu = attr->path_mtu;
  if (given & IBV_QP_MAX_DEST_RD_ATOMIC) a.max_dest_rd_atomic = attr->max_dest_rd_atomic;
  if (given & IBV_QP_MAX_QP_RD_ATOMIC) a.max_rd_atomic = attr->max_rd_atomic;
  if (given & IBV_QP_MIN_RNR_TIMER) a.min_rnr_timer = attr->min_rnr_timer;
  if (given & IBV_QP_TIMEOUT) a.timeout = attr->timeout;
  if (given & IBV_QP_RETRY_CNT) a.retry_cnt = attr->retry_cnt;
  if (given & IBV_QP_RNR_RETRY) a.rnr_retry = attr->rnr_retry;
  if (given & IBV_QP_AV) {
    a.ah_attr = attr->ah_attr;
    q->remote_lid = remote_lid;
  }
  if (given & IBV_QP_DEST_QPN) {
    a.dest_qp_num = attr->dest_qp_num & kPsnMask;
    q->remote_qpn = a.dest_qp_num;
  }
  if (given & IBV_QP_RQ_PSN) {
    a.rq_psn = attr->rq_psn & kPsnMask;
    q->next_recv_psn = a.rq_psn;
  }
  if (given & IBV_QP_SQ_PSN) {
    a.sq_psn = attr->sq_psn & kPsnMask;
    q->next_send_psn = a.sq_psn;
  }

  if (next == IBV_QPS_ERR) {
    f.ToError(q);
    return 0;
  }
  if (next == IBV_QPS_RESET) {
    // To RESET: outstanding work requests are discarded without completions, and the QP's
    // completions still in its CQs removed, as providers do.
    q->sq.clear();
    q->rq.clear();
    q->unsignaled_done = 0;
    q->inject.reset();
    f.CleanCq(q->send_cq, q->base.qp_num);
    f.CleanCq(q->recv_cq, q->base.qp_num);
    ibv_qp_cap cap = q->cap;
    q->attr = ibv_qp_attr{};
    q->attr.cap = cap;
    q->attr.qp_state = IBV_QPS_RESET;
    q->base.state = IBV_QPS_RESET;
    f.PumpPeersOf(q);
    q->remote_lid = 0;
    q->remote_qpn = 0;
    return 0;
  }
  q->base.state = next;
  a.qp_state = next;
  a.cur_qp_state = next;
  if (next == IBV_QPS_RTR || next == IBV_QPS_RTS) f.PumpPeersOf(q);
  if (next == IBV_QPS_RTS) f.Pump(q);
  return 0;
}

int QueryQp(ibv_qp* qp, ibv_qp_attr* attr, int /*attr_mask*/, ibv_qp_init_attr* init) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Qp* q = f.FindQp(qp);
  if (q == nullptr || attr == nullptr || init == nullptr) return EINVAL;
  *attr = q->attr;
  attr->qp_state = q->base.state;
  attr->cur_qp_state = q->base.state;
  attr->cap = q->cap;
  *init = ibv_qp_init_attr{};
  init->qp_context = q->base.qp_context;
  init->send_cq = q->base.send_cq;
  init->recv_cq = q->base.recv_cq;
  init->cap = q->cap;
  init->qp_type = IBV_QPT_RC;
  init->sq_sig_all = q->sq_sig_all ? 1 : 0;
  return 0;
}

int DestroyQp(ibv_qp* qp) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Qp* q = f.FindQp(qp);
  if (q == nullptr) return EINVAL;
  std::vector<Qp*> peers;
  for (auto& [p, other] : f.qps) {
    if (other != q && other->remote_qpn == q->base.qp_num && other->remote_lid == q->ctx->lid) {
      peers.push_back(other);
    }
  }
  f.CleanCq(q->send_cq, q->base.qp_num);
  f.CleanCq(q->recv_cq, q->base.qp_num);
  f.qps.erase(qp);
  f.qps_by_num.erase(q->base.qp_num);
  pthread_cond_destroy(&q->base.cond);
  pthread_mutex_destroy(&q->base.mutex);
  delete q;
  // A peer's message waiting for this QP now goes unanswered.
  for (Qp* p : peers) f.Pump(p);
  return 0;
}

int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Qp* q = f.FindQp(qp);
  int err = 0;
  ibv_send_wr* w = wr;
  constexpr unsigned kFlags =
      IBV_SEND_SIGNALED | IBV_SEND_SOLICITED | IBV_SEND_INLINE | IBV_SEND_FENCE;
  for (; w != nullptr; w = w->next) {
    if (q == nullptr || Pending(q->base.state)) {
      err = EINVAL;
      break;
    }
    bool known = w->opcode == IBV_WR_SEND || w->opcode == IBV_WR_SEND_WITH_IMM ||
                 w->opcode == IBV_WR_RDMA_WRITE || w->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (!known || (w->send_flags & ~kFlags) != 0 || w->num_sge < 0 ||
        static_cast<uint32_t>(w->num_sge) > q->cap.max_send_sge ||
        (w->num_sge > 0 && w->sg_list == nullptr)) {
      err = EINVAL;
      break;
    }
    SendWr s;
    s.wr_id = w->wr_id;
    s.opcode = w->opcode;
    s.signaled = q->sq_sig_all || (w->send_flags & IBV_SEND_SIGNALED);
    s.solicited = (w->send_flags & IBV_SEND_SOLICITED) != 0;
    s.imm = w->imm_data;
    s.remote_addr = w->wr.rdma.remote_addr;
    s.rkey = w->wr.rdma.rkey;
    s.is_inline = (w->send_flags & IBV_SEND_INLINE) != 0;
    for (int i = 0; i < w->num_sge; ++i) s.length += w->sg_list[i].length;
    if (s.length > kMaxMsgSize || (s.is_inline && s.length > q->cap.max_inline_data)) {
      err = EINVAL;
      break;
    }
    if (static_cast<uint32_t>(q->sq.size()) + q->unsignaled_done >= q->cap.max_send_wr) {
      err = ENOMEM;
      break;
    }
    if (s.is_inline) {
      // The data is copied now: the buffer may be reused as soon as post_send returns.
      s.inlined.reserve(s.length);
      for (int i = 0; i < w->num_sge; ++i) {
        const auto* p = reinterpret_cast<const uint8_t*>(w->sg_list[i].addr);
        s.inlined.insert(s.inlined.end(), p, p + w->sg_list[i].length);
      }
    } else {
      s.sges.assign(w->sg_list, w->sg_list + w->num_sge);
    }
    if (q->base.state == IBV_QPS_ERR) {
      f.FlushSend(q, s);
    } else {
      q->sq.push_back(std::move(s));
    }
  }
  if (q != nullptr) f.Pump(q);
  if (err != 0 && bad_wr != nullptr) *bad_wr = w;
  return err;
}

int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Qp* q = f.FindQp(qp);
  int err = 0;
  ibv_recv_wr* w = wr;
  for (; w != nullptr; w = w->next) {
    if (q == nullptr || q->base.state == IBV_QPS_RESET || w->num_sge < 0 ||
        static_cast<uint32_t>(w->num_sge) > q->cap.max_recv_sge ||
        (w->num_sge > 0 && w->sg_list == nullptr)) {
      err = EINVAL;
      break;
    }
    if (q->rq.size() >= q->cap.max_recv_wr) {
      err = ENOMEM;
      break;
    }
    RecvWr r;
    r.wr_id = w->wr_id;
    r.sges.assign(w->sg_list, w->sg_list + w->num_sge);
    if (q->base.state == IBV_QPS_ERR) {
      f.FlushRecv(q, r);
    } else {
      q->rq.push_back(std::move(r));
    }
  }
  // A message that waited for a receive (receiver not ready) goes on now.
  if (q != nullptr) f.PumpPeersOf(q);
  if (err != 0 && bad_wr != nullptr) *bad_wr = w;
  return err;
}

}  // namespace kolo::transport::rdma::soft::ops
