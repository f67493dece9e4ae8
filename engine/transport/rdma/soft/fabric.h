// The software verbs device's state: one fabric per process holding every object the table made,
// behind one mutex. Internal to soft/; the contract is soft_verbs.h.
//
// Each object embeds the rdma-core struct it stands for as its first member `base` (the pointer the
// table hands out); the fabric's maps from those pointers validate what callers pass back, so a
// pointer the device did not make is refused (EINVAL) rather than followed.
#pragma once

#include <errno.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "engine/common/mutex.h"
#include "engine/transport/rdma/soft/soft_verbs.h"

namespace kolo::transport::rdma::soft {

using Clock = std::chrono::steady_clock;

// Device limits, reported by query_device / query_port and enforced by create_cq / create_qp.
inline constexpr int kMaxQpWr = 16384;
inline constexpr int kMaxSge = 16;
inline constexpr int kMaxCqe = 1 << 22;
inline constexpr uint32_t kMaxInline = 256;
inline constexpr int kMaxRdAtomic = 16;
inline constexpr uint32_t kMaxMsgSize = 1u << 31;

struct Context;
struct Pd;
struct Cq;
struct Channel;
struct Qp;

struct Context {
  ibv_context base{};
  uint16_t lid = 0;
  bool vanished = false;
};

struct Pd {
  ibv_pd base{};
  Context* ctx = nullptr;
};

struct Mr {
  ibv_mr base{};
  Pd* pd = nullptr;
  int access = 0;
};

struct Channel {
  ibv_comp_channel base{};
  Context* ctx = nullptr;
  // CQs that had an event, oldest first; the eventfd's counter is non-zero exactly while this is
  // non-empty (both change only with the fabric's mutex held).
  std::deque<Cq*> events;
};

struct Cq {
  ibv_cq base{};
  Context* ctx = nullptr;
  Channel* channel = nullptr;
  std::deque<ibv_wc> entries;
  int capacity = 0;
  bool overflowed = false;
  bool armed = false;
  bool solicited_only = false;
  // Events get_cq_event handed out, and how many of them ack_cq_events acknowledged.
  uint64_t events_got = 0;
  uint64_t events_acked = 0;
};

struct SendWr {
  uint64_t wr_id = 0;
  ibv_wr_opcode opcode = IBV_WR_SEND;
  bool signaled = false;
  bool solicited = false;
  uint32_t imm = 0;  // network byte order, as posted
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  std::vector<ibv_sge> sges;     // empty when inline
  std::vector<uint8_t> inlined;  // the data, copied at post time, when IBV_SEND_INLINE
  bool is_inline = false;
  uint64_t length = 0;
  // Set when the responder did not answer: the WR fails with IBV_WC_RETRY_EXC_ERR at this time.
  std::optional<Clock::time_point> retry_deadline;
};

struct RecvWr {
  uint64_t wr_id = 0;
  std::vector<ibv_sge> sges;
};

struct Qp {
  ibv_qp base{};
  Context* ctx = nullptr;
  Pd* pd = nullptr;
  Cq* send_cq = nullptr;
  Cq* recv_cq = nullptr;
  ibv_qp_cap cap{};
  bool sq_sig_all = false;
  ibv_qp_attr attr{};  // what modify_qp set (query_qp reports it)
  std::deque<SendWr> sq;
  std::deque<RecvWr> rq;
  // Unsignaled WRs that completed: they hold their send-queue slots until a later signaled WR of
  // the QP completes, as on hardware.
  int unsignaled_done = 0;
  uint32_t next_send_psn = 0;  // the PSN of the next message this QP sends
  uint32_t next_recv_psn = 0;  // the PSN this QP expects next as a responder
  // The remote end modify_qp to RTR named: the LID of its port and its QP number.
  uint16_t remote_lid = 0;
  uint32_t remote_qpn = 0;
  std::optional<ibv_wc_status> inject;
  bool pumping = false;  // Pump is running for this QP (a nested call returns at once)
};

class Fabric {
 public:
  static Fabric& Get();

  Mutex mu;
  // Devices ever listed (kept for the process: ibv_device pointers stay valid), and how many
  // get_device_list reports now.
  std::vector<ibv_device*> devices KOLO_GUARDED_BY(mu);
  int device_count KOLO_GUARDED_BY(mu) = 1;
  uint16_t next_lid KOLO_GUARDED_BY(mu) = 1;
  uint32_t next_qpn KOLO_GUARDED_BY(mu) = 0x100;
  uint32_t next_key KOLO_GUARDED_BY(mu) = 0x1000;

  std::map<ibv_context*, Context*> contexts KOLO_GUARDED_BY(mu);
  std::map<ibv_pd*, Pd*> pds KOLO_GUARDED_BY(mu);
  std::map<ibv_mr*, Mr*> mrs KOLO_GUARDED_BY(mu);
  // Each MR has an lkey and a different rkey (a key used on the wrong side is not found).
  std::map<uint32_t, Mr*> mrs_by_lkey KOLO_GUARDED_BY(mu);
  std::map<uint32_t, Mr*> mrs_by_rkey KOLO_GUARDED_BY(mu);
  std::map<ibv_comp_channel*, Channel*> channels KOLO_GUARDED_BY(mu);
  std::map<ibv_cq*, Cq*> cqs KOLO_GUARDED_BY(mu);
  std::map<ibv_qp*, Qp*> qps KOLO_GUARDED_BY(mu);
  std::map<uint32_t, Qp*> qps_by_num KOLO_GUARDED_BY(mu);

  Context* FindContext(ibv_context* c) KOLO_REQUIRES(mu);
  Pd* FindPd(ibv_pd* p) KOLO_REQUIRES(mu);
  Cq* FindCq(ibv_cq* c) KOLO_REQUIRES(mu);
  Channel* FindChannel(ibv_comp_channel* c) KOLO_REQUIRES(mu);
  Qp* FindQp(ibv_qp* q) KOLO_REQUIRES(mu);
  // The context whose port has `lid` / `gid`; nullptr when none.
  Context* ContextByLid(uint16_t lid) KOLO_REQUIRES(mu);
  Context* ContextByGid(const ibv_gid& gid) KOLO_REQUIRES(mu);
  // The QP `qp`'s remote end as modify_qp to RTR named it (context by LID or GID, then QP number);
  // nullptr when that QP does not exist (any more).
  Qp* RemoteOf(Qp* qp) KOLO_REQUIRES(mu);

  // Runs the send queue of `qp` from its head as far as it can (stops at a message that waits for
  // a receive or for an unreachable responder). Called after anything that may let it go on.
  void Pump(Qp* qp) KOLO_REQUIRES(mu);
  // Pumps every QP whose remote end is `qp` (after `qp` posted receives or changed state).
  void PumpPeersOf(Qp* qp) KOLO_REQUIRES(mu);
  // Moves `qp` to ERROR and flushes its work requests (no-op when it is in ERROR already).
  void ToError(Qp* qp) KOLO_REQUIRES(mu);
  // Completes a work request of `qp` on `cq` (applying an injected failure first).
  void Complete(Qp* qp, Cq* cq, ibv_wc wc, bool solicited) KOLO_REQUIRES(mu);
  // Adds `wc` to `cq` (overflow moves the CQ's QPs to ERROR) and raises its event when armed.
  void Push(Cq* cq, const ibv_wc& wc, bool solicited) KOLO_REQUIRES(mu);
  // Flush completion for a receive WR (posted in ERROR, or outstanding when it began).
  void FlushRecv(Qp* qp, const RecvWr& wr) KOLO_REQUIRES(mu);
  void FlushSend(Qp* qp, const SendWr& wr) KOLO_REQUIRES(mu);
  // Removes `qp`'s completions from `cq` (modify to RESET, destroy_qp).
  void CleanCq(Cq* cq, uint32_t qp_num) KOLO_REQUIRES(mu);
  // Whether every entry of `sges` lies inside an MR of `pd` with its lkey (and, when `write`,
  // IBV_ACCESS_LOCAL_WRITE).
  bool LocalOk(Pd* pd, const std::vector<ibv_sge>& sges, bool write) KOLO_REQUIRES(mu);
  // Whether a posted, not yet completed WR names the MR with `lkey` as a local buffer.
  bool MrInUse(uint32_t lkey) KOLO_REQUIRES(mu);
  // The transport-retry time of `qp` (attr.timeout, retry_cnt), capped at 1 s.
  static Clock::duration RetryTime(const ibv_qp_attr& attr);
  // Makes sure the timer thread runs while some WR has a retry deadline, and wakes it.
  void WakeTimer() KOLO_REQUIRES(mu);

  Live Count() KOLO_REQUIRES(mu);

 private:
  Fabric() = default;
  void TimerLoop();
  CondVar timer_cv_;
  bool timer_running_ KOLO_GUARDED_BY(mu) = false;
};

// errno-style failures for the pointer-returning verbs: sets errno and returns nullptr.
template <class T>
T* Fail(int err) {
  errno = err;
  return nullptr;
}

}  // namespace kolo::transport::rdma::soft
