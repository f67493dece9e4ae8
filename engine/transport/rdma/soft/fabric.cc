#include "engine/transport/rdma/soft/fabric.h"

#include <endian.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

namespace kolo::transport::rdma::soft {

namespace {

constexpr uint32_t kPsnMask = 0xffffff;

bool IsSend(ibv_wr_opcode op) { return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM; }
bool IsWrite(ibv_wr_opcode op) {
  return op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}
bool HasImm(ibv_wr_opcode op) {
  return op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM;
}
ibv_wc_opcode SendWcOpcode(ibv_wr_opcode op) {
  return IsWrite(op) ? IBV_WC_RDMA_WRITE : IBV_WC_SEND;
}

struct Piece {
  uint8_t* addr;
  uint64_t len;
};

// Copies the source pieces, in order, into the destination pieces (whose total is large enough).
// memmove: a QP may write into the very buffer it sends from.
void Scatter(const std::vector<Piece>& from, const std::vector<Piece>& to) {
  size_t ti = 0;
  uint64_t toff = 0;
  for (const Piece& f : from) {
    uint64_t done = 0;
    while (done < f.len) {
      while (to[ti].len == toff) {
        ++ti;
        toff = 0;
      }
      uint64_t n = std::min(f.len - done, to[ti].len - toff);
      std::memmove(to[ti].addr + toff, f.addr + done, n);
      done += n;
      toff += n;
    }
  }
}

std::vector<Piece> Pieces(const std::vector<ibv_sge>& sges) {
  std::vector<Piece> out;
  for (const ibv_sge& s : sges) out.push_back({reinterpret_cast<uint8_t*>(s.addr), s.length});
  return out;
}

}  // namespace

Fabric& Fabric::Get() {
  // Never destroyed: the timer thread and objects callers leak at exit may still refer to it.
  static Fabric* fabric = new Fabric();
  return *fabric;
}

Context* Fabric::FindContext(ibv_context* c) {
  auto it = contexts.find(c);
  return it == contexts.end() ? nullptr : it->second;
}
Pd* Fabric::FindPd(ibv_pd* p) {
  auto it = pds.find(p);
  return it == pds.end() ? nullptr : it->second;
}
Cq* Fabric::FindCq(ibv_cq* c) {
  auto it = cqs.find(c);
  return it == cqs.end() ? nullptr : it->second;
}
Channel* Fabric::FindChannel(ibv_comp_channel* c) {
  auto it = channels.find(c);
  return it == channels.end() ? nullptr : it->second;
}
Qp* Fabric::FindQp(ibv_qp* q) {
  auto it = qps.find(q);
  return it == qps.end() ? nullptr : it->second;
}

Context* Fabric::ContextByLid(uint16_t lid) {
  for (auto& [p, c] : contexts) {
    if (c->lid == lid) return c;
  }
  return nullptr;
}

Context* Fabric::ContextByGid(const ibv_gid& gid) {
  for (auto& [p, c] : contexts) {
    ibv_gid own{};
    own.global.subnet_prefix = htobe64(0xfe80000000000000ull);
    own.global.interface_id = htobe64(c->lid);
    if (std::memcmp(own.raw, gid.raw, sizeof own.raw) == 0) return c;
  }
  return nullptr;
}

Qp* Fabric::RemoteOf(Qp* qp) {
  auto it = qps_by_num.find(qp->remote_qpn);
  if (it == qps_by_num.end() || it->second->ctx->lid != qp->remote_lid) return nullptr;
  return it->second;
}

bool Fabric::LocalOk(Pd* pd, const std::vector<ibv_sge>& sges, bool write) {
  for (const ibv_sge& s : sges) {
    auto it = mrs_by_lkey.find(s.lkey);
    if (it == mrs_by_lkey.end()) return false;
    const Mr* mr = it->second;
    if (mr->pd != pd || (write && !(mr->access & IBV_ACCESS_LOCAL_WRITE))) return false;
    uint64_t begin = reinterpret_cast<uint64_t>(mr->base.addr);
    if (s.addr < begin || s.addr + s.length > begin + mr->base.length) return false;
  }
  return true;
}

bool Fabric::MrInUse(uint32_t lkey) {
  auto names = [lkey](const std::vector<ibv_sge>& sges) {
    return std::any_of(sges.begin(), sges.end(),
                       [lkey](const ibv_sge& s) { return s.lkey == lkey; });
  };
  for (auto& [p, q] : qps) {
    for (const SendWr& w : q->sq) {
      if (names(w.sges)) return true;
    }
    for (const RecvWr& w : q->rq) {
      if (names(w.sges)) return true;
    }
  }
  return false;
}

Clock::duration Fabric::RetryTime(const ibv_qp_attr& attr) {
  // The local ACK timeout is 4.096 us * 2^timeout (0: infinite), tried retry_cnt + 1 times.
  constexpr auto kCap = std::chrono::seconds(1);
  if (attr.timeout == 0 || attr.timeout >= 31) return kCap;
  double seconds = 4.096e-6 * static_cast<double>(1ull << attr.timeout) * (attr.retry_cnt + 1);
  if (seconds >= 1.0) return kCap;
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void Fabric::Push(Cq* cq, const ibv_wc& wc, bool solicited) {
  if (cq->overflowed) return;
  if (static_cast<int>(cq->entries.size()) >= cq->capacity) {
    cq->overflowed = true;
    std::vector<Qp*> users;
    for (auto& [p, q] : qps) {
      if (q->send_cq == cq || q->recv_cq == cq) users.push_back(q);
    }
    for (Qp* q : users) ToError(q);
    return;
  }
  cq->entries.push_back(wc);
  if (cq->armed && (!cq->solicited_only || solicited || wc.status != IBV_WC_SUCCESS)) {
    cq->armed = false;
    if (Channel* ch = cq->channel) {
      if (ch->events.empty()) {
        uint64_t one = 1;
        // An eventfd's write of 1 cannot fail short of a counter overflow, which the drain on the
        // queue's last pop rules out.
        [[maybe_unused]] ssize_t n = ::write(ch->base.fd, &one, sizeof one);
      }
      ch->events.push_back(cq);
    }
  }
}

void Fabric::Complete(Qp* qp, Cq* cq, ibv_wc wc, bool solicited) {
  if (qp->ctx->vanished) return;
  if (qp->inject) {
    wc.status = *qp->inject;
    qp->inject.reset();
    Push(cq, wc, solicited);
    ToError(qp);
    return;
  }
  Push(cq, wc, solicited);
}

void Fabric::FlushSend(Qp* qp, const SendWr& w) {
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = IBV_WC_WR_FLUSH_ERR;
  wc.opcode = SendWcOpcode(w.opcode);
  wc.qp_num = qp->base.qp_num;
  Complete(qp, qp->send_cq, wc, false);
}

void Fabric::FlushRecv(Qp* qp, const RecvWr& w) {
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = IBV_WC_WR_FLUSH_ERR;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = qp->base.qp_num;
  Complete(qp, qp->recv_cq, wc, false);
}

void Fabric::ToError(Qp* qp) {
  if (qp->base.state == IBV_QPS_ERR) return;
  qp->base.state = IBV_QPS_ERR;
  qp->attr.qp_state = IBV_QPS_ERR;
  qp->attr.cur_qp_state = IBV_QPS_ERR;
  qp->unsignaled_done = 0;
  if (qp->ctx->vanished) return;  // nothing completes there any more
  std::deque<SendWr> sq = std::move(qp->sq);
  std::deque<RecvWr> rq = std::move(qp->rq);
  qp->sq.clear();
  qp->rq.clear();
  for (const SendWr& w : sq) FlushSend(qp, w);
  for (const RecvWr& w : rq) FlushRecv(qp, w);
  PumpPeersOf(qp);
}

void Fabric::PumpPeersOf(Qp* qp) {
  std::vector<Qp*> peers;
  for (auto& [p, q] : qps) {
    if (q != qp && q->remote_qpn == qp->base.qp_num && q->remote_lid == qp->ctx->lid) {
      peers.push_back(q);
    }
  }
  for (Qp* q : peers) Pump(q);
}

void Fabric::Pump(Qp* q) {
  if (q->pumping || q->ctx->vanished) return;
  q->pumping = true;
  while (q->base.state == IBV_QPS_RTS && !q->sq.empty()) {
    SendWr& w = q->sq.front();
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.opcode = SendWcOpcode(w.opcode);
    wc.qp_num = q->base.qp_num;
    wc.byte_len = static_cast<uint32_t>(w.length);
    auto fail_head = [&](ibv_wc_status status) KOLO_REQUIRES(mu) {
      q->sq.pop_front();
      wc.status = status;
      Complete(q, q->send_cq, wc, false);
      ToError(q);
    };

    if (!w.is_inline && !LocalOk(q->pd, w.sges, false)) {
      fail_head(IBV_WC_LOC_PROT_ERR);
      break;
    }
    // A responder that is gone, not ready to receive, not connected back to this QP or expecting
    // another PSN drops the packets: the requester retries until its retry time is over.
    Qp* r = RemoteOf(q);
    bool answers = r != nullptr && !r->ctx->vanished &&
                   (r->base.state == IBV_QPS_RTR || r->base.state == IBV_QPS_RTS) &&
                   r->remote_qpn == q->base.qp_num && r->remote_lid == q->ctx->lid &&
                   r->next_recv_psn == q->next_send_psn;
    if (!answers) {
      Clock::time_point now = Clock::now();
      if (!w.retry_deadline) {
        w.retry_deadline = now + RetryTime(q->attr);
        WakeTimer();
        break;
      }
      if (now < *w.retry_deadline) break;
      fail_head(IBV_WC_RETRY_EXC_ERR);
      break;
    }
    w.retry_deadline.reset();

    std::vector<Piece> source;
    if (w.is_inline) {
      source.push_back({w.inlined.data(), w.inlined.size()});
    } else {
      source = Pieces(w.sges);
    }
    std::vector<Piece> dest;
    if (IsWrite(w.opcode)) {
      auto it = mrs_by_rkey.find(w.rkey);
      const Mr* mr = it == mrs_by_rkey.end() ? nullptr : it->second;
      uint64_t begin = mr ? reinterpret_cast<uint64_t>(mr->base.addr) : 0;
      bool allowed = mr != nullptr && mr->pd == r->pd && (mr->access & IBV_ACCESS_REMOTE_WRITE) &&
                     (r->attr.qp_access_flags & IBV_ACCESS_REMOTE_WRITE) &&
                     w.remote_addr >= begin && w.remote_addr + w.length <= begin + mr->base.length;
      if (!allowed) {
        fail_head(IBV_WC_REM_ACCESS_ERR);
        ToError(r);
        break;
      }
      dest.push_back({reinterpret_cast<uint8_t*>(w.remote_addr), w.length});
    }
    bool consumes_recv = IsSend(w.opcode) || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
    if (consumes_recv && r->rq.empty()) break;  // receiver not ready: wait for a receive
    RecvWr rw;
    if (consumes_recv) {
      rw = std::move(r->rq.front());
      r->rq.pop_front();
    }
    ibv_wc rwc{};
    rwc.wr_id = rw.wr_id;
    rwc.qp_num = r->base.qp_num;
    rwc.src_qp = q->base.qp_num;
    rwc.slid = q->ctx->lid;
    rwc.byte_len = static_cast<uint32_t>(w.length);
    rwc.opcode = IsWrite(w.opcode) ? IBV_WC_RECV_RDMA_WITH_IMM : IBV_WC_RECV;
    if (HasImm(w.opcode)) {
      rwc.wc_flags |= IBV_WC_WITH_IMM;
      rwc.imm_data = w.imm;
    }
    if (IsSend(w.opcode)) {
      uint64_t room = 0;
      for (const ibv_sge& s : rw.sges) room += s.length;
      std::optional<std::pair<ibv_wc_status, ibv_wc_status>> error;  // responder's, requester's
      if (!LocalOk(r->pd, rw.sges, true)) {
        error = {IBV_WC_LOC_PROT_ERR, IBV_WC_REM_OP_ERR};
      } else if (w.length > room) {
        error = {IBV_WC_LOC_LEN_ERR, IBV_WC_REM_INV_REQ_ERR};
      }
      if (error) {
        rwc.status = error->first;
        Complete(r, r->recv_cq, rwc, w.solicited);
        ToError(r);
        fail_head(error->second);
        break;
      }
      dest = Pieces(rw.sges);
    }
    Scatter(source, dest);
    q->next_send_psn = (q->next_send_psn + 1) & kPsnMask;
    r->next_recv_psn = (r->next_recv_psn + 1) & kPsnMask;
    bool signaled = w.signaled, solicited = w.solicited;
    q->sq.pop_front();  // `w` is gone from here on
    if (consumes_recv) Complete(r, r->recv_cq, rwc, solicited);
    if (signaled || q->inject) {
      q->unsignaled_done = 0;
      wc.status = IBV_WC_SUCCESS;
      Complete(q, q->send_cq, wc, false);
    } else {
      ++q->unsignaled_done;
    }
  }
  q->pumping = false;
}

void Fabric::CleanCq(Cq* cq, uint32_t qp_num) {
  auto& e = cq->entries;
  e.erase(std::remove_if(e.begin(), e.end(),
                         [qp_num](const ibv_wc& wc) { return wc.qp_num == qp_num; }),
          e.end());
}

void Fabric::WakeTimer() {
  if (timer_running_) {
    timer_cv_.notify_all();
    return;
  }
  timer_running_ = true;
  // Detached: it exits by itself once no work request waits for a retry deadline.
  std::thread([this] { TimerLoop(); }).detach();
}

void Fabric::TimerLoop() {
  MutexLock lock(mu);
  while (true) {
    std::optional<Clock::time_point> earliest;
    std::vector<Qp*> due;
    Clock::time_point now = Clock::now();
    for (auto& [p, q] : qps) {
      if (q->sq.empty() || !q->sq.front().retry_deadline) continue;
      Clock::time_point d = *q->sq.front().retry_deadline;
      if (d <= now) {
        due.push_back(q);
      } else if (!earliest || d < *earliest) {
        earliest = d;
      }
    }
    if (!due.empty()) {
      for (Qp* q : due) Pump(q);
      continue;
    }
    if (!earliest) {
      timer_running_ = false;
      return;
    }
    timer_cv_.WaitUntil(mu, *earliest);
  }
}

Live Fabric::Count() {
  Live live;
  live.contexts = static_cast<int>(contexts.size());
  live.pds = static_cast<int>(pds.size());
  live.mrs = static_cast<int>(mrs.size());
  live.cqs = static_cast<int>(cqs.size());
  live.channels = static_cast<int>(channels.size());
  live.qps = static_cast<int>(qps.size());
  return live;
}

void SetDeviceCount(int n) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  f.device_count = std::max(0, n);
}

void FailNextCompletion(ibv_qp* qp, ibv_wc_status status) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  if (Qp* q = f.FindQp(qp)) q->inject = status;
}

void ForceError(ibv_qp* qp) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  if (Qp* q = f.FindQp(qp)) f.ToError(q);
}

void Vanish(ibv_context* context) {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  Context* c = f.FindContext(context);
  if (c == nullptr || c->vanished) return;
  c->vanished = true;
  std::vector<Qp*> own;
  for (auto& [p, q] : f.qps) {
    if (q->ctx == c) own.push_back(q);
  }
  for (Qp* q : own) f.PumpPeersOf(q);
}

Live LiveObjects() {
  Fabric& f = Fabric::Get();
  MutexLock lock(f.mu);
  return f.Count();
}

}  // namespace kolo::transport::rdma::soft
