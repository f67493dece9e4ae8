#include "engine/transport/rdma/device.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <list>
#include <vector>

#include "engine/common/logging.h"
#include "engine/common/random.h"
#include "engine/common/sha256.h"

namespace kolo::transport::rdma {
namespace {

using Clock = std::chrono::steady_clock;

// Eager slots per pair and direction, and their size (a 16-byte header, then the payload).
constexpr uint64_t kSlots = 16;
constexpr size_t kSlotBytes = 32 << 10;
constexpr size_t kHeaderBytes = 16;
constexpr size_t kEagerMax = kSlotBytes - kHeaderBytes;
// Messages up to this size go eager even when their receive's advert is at hand (one work
// request and a copy beat two work requests); larger ones go direct when they can.
constexpr size_t kPreferEager = 4096;
// Adverts in flight per pair and direction (the advert ring and the direct headers).
constexpr uint64_t kAdverts = 32;
constexpr size_t kAdvertBytes = 48;
constexpr size_t kReasonBytes = 512;
constexpr size_t kProofBytes = 32;
// Largest single RDMA write; longer messages are written in pieces.
constexpr size_t kMaxWrite = size_t{1} << 30;
constexpr uint32_t kInlineWanted = 64;

// Queue depths per QP. Receives are zero-length notifications reposted as each completes.
constexpr int kSqDepth = 2 * kSlots + 2 * kAdverts + 64;
constexpr int kRqDepth = kSlots + 2 * kAdverts + 64;

// Control block layout (the memory a peer writes into).
constexpr size_t kSlotsOffset = 0;
constexpr size_t kAdvertsOffset = kSlotsOffset + kSlots * kSlotBytes;
constexpr size_t kDirectOffset = kAdvertsOffset + kAdverts * kAdvertBytes;
constexpr size_t kReasonOffset = kDirectOffset + kAdverts * kHeaderBytes;
constexpr size_t kProofOffset = kReasonOffset + kReasonBytes;
constexpr size_t kCtrlBytes = (kProofOffset + kProofBytes + 4095) & ~size_t{4095};
// Staging layout (local memory work requests gather from when they cannot be inline).
constexpr size_t kStEagerOffset = 0;
constexpr size_t kStAdvertOffset = kStEagerOffset + kSlots * kHeaderBytes;
constexpr size_t kStDirectOffset = kStAdvertOffset + kAdverts * kAdvertBytes;
constexpr size_t kStReasonOffset = kStDirectOffset + kAdverts * kHeaderBytes;
constexpr size_t kStProofOffset = kStReasonOffset + kReasonBytes;
constexpr size_t kStagingBytes = (kStProofOffset + kProofBytes + 4095) & ~size_t{4095};

// The immediate: a type in the top 4 bits, a value in the low 28.
enum class Imm : uint32_t {
  kEager = 1,
  kCredit = 2,
  kAdvert = 3,
  kDirect = 4,
  kRts = 5,
  kKeepalive = 6,
  kGoodbye = 7,
  kAbort = 8,
  kProof = 9,
};
constexpr uint32_t kValueBits = 28;
constexpr uint32_t kValueMask = (1u << kValueBits) - 1;
constexpr uint32_t kWithheld = 1;  // eager header flag: the payload was not sent

uint32_t MakeImm(Imm type, uint64_t value) {
  return htonl((static_cast<uint32_t>(type) << kValueBits) |
               (static_cast<uint32_t>(value) & kValueMask));
}

// The full counter whose low 28 bits are `low`, nearest at or after `base` (-1: before it).
int64_t Unwrap(uint64_t base, uint32_t low) {
  const uint32_t diff = (low - static_cast<uint32_t>(base)) & kValueMask;
  if (diff < (1u << (kValueBits - 1))) return static_cast<int64_t>(base + diff);
  return -1;
}

// Work request ids: kind in the top byte, peer in the next two, a value in the low 40 bits.
enum class Wr : uint64_t { kSendLast = 1, kSendPart = 2, kControl = 3, kAdvert = 4, kRecv = 5 };
uint64_t MakeWrId(Wr kind, int peer, uint64_t value = 0) {
  return (static_cast<uint64_t>(kind) << 56) | (static_cast<uint64_t>(peer & 0xffff) << 40) |
         (value & ((uint64_t{1} << 40) - 1));
}
Wr WrKind(uint64_t id) { return static_cast<Wr>(id >> 56); }
int WrPeer(uint64_t id) { return static_cast<int>((id >> 40) & 0xffff); }
uint64_t WrValue(uint64_t id) { return id & ((uint64_t{1} << 40) - 1); }

void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void Put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t Get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// ---------------------------------------------------------------------------------------------
// Registration cache.

struct MrEntry {
  uintptr_t start = 0, end = 0;
  ibv_mr* mr = nullptr;
  int refs = 0;
  bool writable = true;
};

class RegCache {
 public:
  RegCache(const Verbs* verbs, ibv_pd* pd) : verbs_(verbs), pd_(pd) {}

  StatusOr<MrEntry*> Acquire(void* data, size_t size) {
    const auto lo = reinterpret_cast<uintptr_t>(data);
    const uintptr_t hi = lo + size;
    for (MrEntry& e : entries_) {
      if (e.start <= lo && hi <= e.end) {
        ++e.refs;
        return &e;
      }
    }
    const uintptr_t start = lo & ~uintptr_t{4095};
    const uintptr_t end = (hi + 4095) & ~uintptr_t{4095};
    void* base = reinterpret_cast<void*>(start);
    bool writable = true;
    ibv_mr* mr =
        verbs_->reg_mr(pd_, base, end - start, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    const int err = errno;
    if (mr == nullptr) {
      // Read-only memory can still be sent from.
      mr = verbs_->reg_mr(pd_, base, end - start, 0);
      writable = false;
    }
    if (mr == nullptr) {
      return ErrnoStatus(StatusCode::kUnavailable,
                         fmt::format("ibv_reg_mr of {} bytes at {} (the memory lock limit, ulimit "
                                     "-l, may be too low)",
                                     end - start, base),
                         err);
    }
    MrEntry& e = entries_.emplace_back();
    e.start = start;
    e.end = end;
    e.mr = mr;
    e.refs = 1;
    e.writable = writable;
    return &e;
  }

  // Another user of `entry` (an operation in flight keeps its MR registered even if its Region is
  // destroyed before the operation completes).
  void Retain(MrEntry* entry) {
    if (!closed_ && entry != nullptr) ++entry->refs;
  }

  void Release(MrEntry* entry) {
    if (closed_ || entry == nullptr) return;
    if (--entry->refs > 0) return;
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (&*it != entry) continue;
      if (verbs_->dereg_mr(it->mr) != 0) {
        KOLO_LOG(kWarning, "rdma: ibv_dereg_mr failed: {}", std::strerror(errno));
      }
      entries_.erase(it);
      return;
    }
  }

  // Deregisters every MR (the device is going away; Regions still alive keep dangling keys and
  // must not be used).
  void Close() {
    if (closed_) return;
    closed_ = true;
    for (MrEntry& e : entries_) verbs_->dereg_mr(e.mr);
    entries_.clear();
  }
  size_t count() const { return entries_.size(); }

 private:
  const Verbs* verbs_;
  ibv_pd* pd_;
  std::list<MrEntry> entries_;
  bool closed_ = false;
};

class RdmaRegion final : public Region {
 public:
  RdmaRegion(void* data, size_t size, const void* owner, std::shared_ptr<RegCache> cache,
             MrEntry* entry)
      : Region(data, size), owner_(owner), cache_(std::move(cache)), entry_(entry) {
    if (entry_ != nullptr) {
      lkey_ = entry_->mr->lkey;
      rkey_ = entry_->mr->rkey;
      writable_ = entry_->writable;
    }
  }
  ~RdmaRegion() override { cache_->Release(entry_); }

  const void* owner() const { return owner_; }
  MrEntry* entry() const { return entry_; }
  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }
  bool writable() const { return writable_; }

 private:
  const void* owner_;
  std::shared_ptr<RegCache> cache_;
  MrEntry* entry_;
  uint32_t lkey_ = 0, rkey_ = 0;
  bool writable_ = true;
};

// ---------------------------------------------------------------------------------------------
// Set-up records.

struct PeerInfo {  // what rank A tells rank B about A's end of their QP
  uint16_t lid = 0;
  uint8_t gid[16] = {};
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint64_t ctrl_addr = 0;
  uint32_t ctrl_rkey = 0;
  uint8_t nonce[16] = {};
  uint8_t mtu = 0;
  uint8_t global = 0;  // route by GID
  static constexpr size_t kBytes = 2 + 16 + 4 + 4 + 8 + 4 + 16 + 1 + 1;
};

void Encode(const PeerInfo& i, uint8_t* p) {
  p[0] = static_cast<uint8_t>(i.lid);
  p[1] = static_cast<uint8_t>(i.lid >> 8);
  std::memcpy(p + 2, i.gid, 16);
  Put32(p + 18, i.qpn);
  Put32(p + 22, i.psn);
  Put64(p + 26, i.ctrl_addr);
  Put32(p + 34, i.ctrl_rkey);
  std::memcpy(p + 38, i.nonce, 16);
  p[54] = i.mtu;
  p[55] = i.global;
}

PeerInfo DecodeInfo(const uint8_t* p) {
  PeerInfo i;
  i.lid = static_cast<uint16_t>(p[0] | (p[1] << 8));
  std::memcpy(i.gid, p + 2, 16);
  i.qpn = Get32(p + 18);
  i.psn = Get32(p + 22);
  i.ctrl_addr = Get64(p + 26);
  i.ctrl_rkey = Get32(p + 34);
  std::memcpy(i.nonce, p + 38, 16);
  i.mtu = p[54];
  i.global = p[55];
  return i;
}

constexpr uint32_t kInfoMagic = 0x414d4452;  // "RDMA"
constexpr uint32_t kInfoVersion = 1;
constexpr std::string_view kInfoLabel = "kolo-rdma-info-v1";
constexpr std::string_view kProofLabel = "kolo-rdma-proof-v1";

Digest InfoMac(std::string_view secret, const uint8_t* body, size_t n) {
  std::vector<uint8_t> m(kInfoLabel.begin(), kInfoLabel.end());
  m.insert(m.end(), body, body + n);
  return HmacSha256(secret, m.data(), m.size());
}

Digest ProofMac(std::string_view secret, int from, int to, const PeerInfo& from_info,
                const PeerInfo& to_info) {
  std::vector<uint8_t> m(kProofLabel.begin(), kProofLabel.end());
  uint8_t b[4 + 4 + 16 + 16 + 4 + 4];
  Put32(b, static_cast<uint32_t>(from));
  Put32(b + 4, static_cast<uint32_t>(to));
  std::memcpy(b + 8, from_info.nonce, 16);
  std::memcpy(b + 24, to_info.nonce, 16);
  Put32(b + 40, from_info.qpn);
  Put32(b + 44, to_info.qpn);
  m.insert(m.end(), b, b + sizeof b);
  return HmacSha256(secret, m.data(), m.size());
}

std::string HostName(const std::string& configured) {
  if (!configured.empty()) return configured;
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "this host";
  return name;
}

int RemainingMs(Clock::time_point until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// ---------------------------------------------------------------------------------------------
// The device and its pairs.

class RdmaDevice;

// What the pairs share: completions, counters, the first error (sticky).
struct DeviceState {
  int rank = 0;
  std::vector<Completion> completions;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  Status error;
  Status Fail(const Status& s) {
    if (error.ok()) error = s;
    return error;
  }
};

class RdmaPair final : public Pair {
 public:
  RdmaPair(DeviceState& state, const Verbs* verbs, int peer, const void* owner, RegCache* cache)
      : state_(state), verbs_(verbs), peer_(peer), owner_(owner), cache_(cache) {}

  ~RdmaPair() override = default;

  int peer() const override { return peer_; }

  Status Send(const Region& region, size_t offset, size_t nbytes, uint64_t tag) override {
    if (!state_.error.ok()) return state_.error;
    const auto* r = dynamic_cast<const RdmaRegion*>(&region);
    if (r == nullptr || r->owner() != owner_) {
      return InvalidArgument(
          "send to rank {} (tag {:#x}): the region was not registered with this "
          "RDMA device",
          peer_, tag);
    }
    if (offset > region.size() || nbytes > region.size() - offset) {
      return InvalidArgument(
          "send to rank {} (tag {:#x}): bytes [{}, {}) exceed the {}-byte region", peer_, tag,
          offset, offset + nbytes, region.size());
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

  Status Recv(Region& region, size_t offset, size_t capacity, uint64_t tag) override {
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

  // --- Set-up.
  Status Create(ibv_context* ctx, ibv_pd* pd, ibv_cq* cq, uint8_t port) {
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

  PeerInfo& mine() { return mine_; }
  const PeerInfo& theirs() const { return theirs_; }

  Status ConnectTo(const PeerInfo& theirs, uint8_t sgid_index, int timeout_exp) {
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

  Status SendProof(const Digest& proof) {
    std::memcpy(staging_ + kStProofOffset, proof.data(), kProofBytes);
    return PostWrite(Wr::kControl, 0, staging_ + kStProofOffset, kProofBytes, kProofOffset,
                     Imm::kProof, 0);
  }
  void ExpectProof(const Digest& proof) { expected_proof_ = proof; }
  bool proven() const { return proven_; }

  // --- Progress, driven by the device.

  // Handles one completion of this pair's QP.
  Status OnCompletion(const ibv_wc& wc) {
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

  // Posts what can be posted: sends, credits, adverts, announcements.
  Status Progress() {
    if (!state_.error.ok()) return state_.error;
    if (dead_ || qp_ == nullptr) return Status::OK();
    Status s = Flush();
    if (!s.ok()) return state_.Fail(s);
    return Status::OK();
  }

  Status MaybeKeepalive(Clock::time_point now, std::chrono::milliseconds interval) {
    if (dead_ || peer_gone_ || now - last_tx_ < interval) return Status::OK();
    if (sq_used_ + 1 > kSqDepth) return Status::OK();
    Status s = PostControl(Imm::kKeepalive, 0);
    if (!s.ok()) return state_.Fail(s);
    return Status::OK();
  }

  bool Arrived() const { return !stash_.empty() || rts_upto_ > recv_index_next_; }

  Clock::duration SilentFor(Clock::time_point now) const {
    if (Arrived()) return Clock::duration::zero();
    return now - last_rx_;
  }

  std::string DescribePending() const {
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

  bool pending() const { return !sends_.empty() || !inflight_.empty() || !recvs_.empty(); }
  bool peer_gone() const { return peer_gone_; }
  bool usable() const { return !dead_ && !peer_gone_ && qp_ != nullptr; }

  // Shutdown: posts GOODBYE, or ABORT with `reason`; false if nothing was posted.
  bool PostFarewell(const std::string* reason) {
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
  // A peer that said GOODBYE first is not waiting for ours (and its QP may be gone already).
  bool farewell_done() const { return !farewell_ || sq_used_ == 0 || dead_ || peer_gone_; }

  // Destroys the QP (first in the teardown order), then the pair's MRs (second).
  void DestroyQp() {
    if (qp_ != nullptr) {
      if (verbs_->destroy_qp(qp_) != 0) {
        KOLO_LOG(kWarning, "rdma: ibv_destroy_qp (rank {}) failed: {}", peer_,
                 std::strerror(errno));
      }
      qp_ = nullptr;
    }
    dead_ = true;
  }
  void DestroyMrs() {
    if (ctrl_mr_ != nullptr) verbs_->dereg_mr(ctrl_mr_);
    if (staging_mr_ != nullptr) verbs_->dereg_mr(staging_mr_);
    ctrl_mr_ = staging_mr_ = nullptr;
    std::free(ctrl_);
    std::free(staging_);
    ctrl_ = staging_ = nullptr;
  }
  ibv_qp* qp() const { return qp_; }

 private:
  // Operations copy what they need of their Region and hold its MR (the Region itself may be
  // destroyed before they complete; its memory may not).
  struct SendOp {
    const uint8_t* data;
    uint32_t lkey;
    MrEntry* mr;
    size_t nbytes;
    uint64_t tag;
    uint64_t index;
  };
  struct RecvOp {
    uint8_t* data;
    uint32_t rkey;
    MrEntry* mr;
    size_t capacity;
    uint64_t tag;
    uint64_t index;
    bool advertised;
  };
  struct Advert {
    uint64_t index, addr, capacity, tag;
    uint32_t rkey;
  };

  Status Lost(const std::string& why) const {
    return Unavailable("connection to rank {} lost: {}", peer_, why);
  }

  Status OnError(const ibv_wc& wc) {
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
    return Lost(fmt::format("{} (completion status '{}', {})", why,
                            verbs_->wc_status_str(wc.status),
                            WrKind(wc.wr_id) == Wr::kRecv ? "receive" : "send"));
  }

  Status OnNotification(uint32_t imm) {
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
          return Lost(fmt::format(
              "rank {} shut down before taking {} message(s) sent to it (next tag {:#x})", peer_,
              sends_.size() + inflight_.size(), f.tag));
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

  Status OnEager(uint32_t slot_value) {
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

  Status DeliverEager(const RecvOp& op, uint64_t slot) {
    const uint8_t* h = ctrl_ + kSlotsOffset + slot * kSlotBytes;
    const uint64_t tag = Get64(h);
    const uint64_t length = Get32(h + 8);
    const uint32_t flags = Get32(h + 12);
    KOLO_RETURN_IF_ERROR(Check(op, tag, length));
    if ((flags & kWithheld) != 0 || length > kEagerMax) {
      return ProtocolError("rank {} sent a malformed eager message (tag {:#x}, {} bytes)", peer_,
                           tag, length);
    }
    if (length > 0) std::memcpy(op.data, h + kHeaderBytes, length);
    ++freed_;
    Complete(op, length);
    return Status::OK();
  }

  Status Check(const RecvOp& op, uint64_t tag, uint64_t length) const {
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

  void Complete(const RecvOp& op, uint64_t length) {
    cache_->Release(op.mr);
    state_.bytes_received += length;
    state_.completions.push_back(Completion{peer_, OpKind::kRecv, op.tag, length});
  }

  Status OnDirect(uint32_t value) {
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

  Status OnAdvert(uint32_t value) {
    const int64_t index = Unwrap(send_index_, value);
    if (index < 0) return Status::OK();  // for a message already sent eagerly
    const uint8_t* e =
        ctrl_ + kAdvertsOffset + (static_cast<uint64_t>(index) % kAdverts) * kAdvertBytes;
    Advert a{Get64(e), Get64(e + 8), Get64(e + 16), Get64(e + 24), Get32(e + 32)};
    if (a.index != static_cast<uint64_t>(index) ||
        (!adverts_.empty() && adverts_.back().index >= a.index)) {
      return ProtocolError("rank {} sent a malformed advert (receive {}, entry for {})", peer_,
                           index, a.index);
    }
    adverts_.push_back(a);
    return Status::OK();
  }

  // The pair's posting logic; returns an error to record (not yet recorded).
  Status Flush() {
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

  StatusOr<bool> PostEager(const SendOp& op, bool withheld) {
    if (sq_used_ + 1 > kSqDepth) return false;
    const uint64_t slot = eager_sent_ % kSlots;
    uint8_t* h = staging_ + kStEagerOffset + slot * kHeaderBytes;
    Put64(h, op.tag);
    Put32(h + 8, static_cast<uint32_t>(op.nbytes));
    Put32(h + 12, withheld ? kWithheld : 0);
    const size_t payload = withheld ? 0 : op.nbytes;
    ibv_sge sge[2]{};
    sge[0] = {reinterpret_cast<uintptr_t>(h), static_cast<uint32_t>(kHeaderBytes),
              staging_mr_->lkey};
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
    wr.send_flags =
        IBV_SEND_SIGNALED | (kHeaderBytes + payload <= max_inline_ ? IBV_SEND_INLINE : 0);
    wr.imm_data = MakeImm(Imm::kEager, slot);
    wr.wr.rdma.remote_addr = theirs_.ctrl_addr + kSlotsOffset + slot * kSlotBytes;
    wr.wr.rdma.rkey = theirs_.ctrl_rkey;
    KOLO_RETURN_IF_ERROR(Post(&wr, 1));
    ++eager_sent_;
    return true;
  }

  StatusOr<bool> PostDirect(const SendOp& op, const Advert& a) {
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

  Status PostControl(Imm type, uint64_t value) {
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

  // A write of `n` staging bytes at `local` to the peer's control block at `remote_offset`, with
  // an immediate.
  Status PostWrite(Wr kind, uint64_t wr_value, const uint8_t* local, size_t n, size_t remote_offset,
                   Imm type, uint64_t value) {
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

  Status Post(ibv_send_wr* wr, int n) {
    ibv_send_wr* bad = nullptr;
    if (int rc = verbs_->post_send(qp_, wr, &bad); rc != 0) {
      return Lost(fmt::format("ibv_post_send failed: {}", std::strerror(rc)));
    }
    sq_used_ += n;
    last_tx_ = Clock::now();
    return Status::OK();
  }

  Status PostRecv() {
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

  DeviceState& state_;
  const Verbs* verbs_;
  const int peer_;
  const void* owner_;
  RegCache* cache_;  // the device's; operations hold their MRs through it
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  ibv_qp* qp_ = nullptr;
  uint32_t max_inline_ = 0;
  uint8_t* ctrl_ = nullptr;
  uint8_t* staging_ = nullptr;
  ibv_mr* ctrl_mr_ = nullptr;
  ibv_mr* staging_mr_ = nullptr;
  PeerInfo mine_, theirs_;
  Digest expected_proof_{};
  bool proven_ = false;

  int sq_used_ = 0;
  bool dead_ = false;       // the QP failed or was destroyed: nothing more is posted
  bool peer_gone_ = false;  // GOODBYE received
  bool farewell_ = false;   // GOODBYE or ABORT posted

  // Sender side.
  std::deque<SendOp> sends_;      // not yet posted, in order
  std::deque<SendOp> inflight_;   // posted, not yet complete
  std::deque<Advert> adverts_;    // the peer's receives, in index order
  uint64_t send_index_next_ = 0;  // index of the next Send call
  uint64_t send_index_ = 0;       // index of the next message to post
  uint64_t eager_sent_ = 0;
  uint64_t peer_freed_ = 0;
  uint64_t rts_sent_upto_ = 0;

  // Receiver side.
  std::deque<RecvOp> recvs_;      // posted, not yet satisfied
  std::deque<uint64_t> stash_;    // eager slots holding messages no receive has taken yet
  uint64_t recv_index_next_ = 0;  // index of the next Recv call
  uint64_t received_ = 0;         // messages arrived
  uint64_t eager_received_ = 0;
  uint64_t freed_ = 0;
  uint64_t freed_reported_ = 0;
  uint64_t rts_upto_ = 0;
  bool advert_busy_[kAdverts] = {};

  Clock::time_point last_rx_ = Clock::now();
  Clock::time_point last_tx_ = Clock::now();
};

constexpr std::chrono::milliseconds kAbortBound{1000};
constexpr std::chrono::milliseconds kGoodbyeBound{200};
constexpr int kPollBatch = 32;

class RdmaDevice final : public PollableDevice {
 public:
  RdmaDevice(const Verbs* verbs, const RdmaOptions& options, int rank, int size)
      : verbs_(verbs),
        size_(size),
        busy_poll_(options.busy_poll),
        keepalive_(std::clamp(options.timeout / 8, std::chrono::milliseconds(20),
                              std::chrono::milliseconds(1000))),
        silence_(std::max<std::chrono::milliseconds>(options.timeout / 2, 3 * keepalive_)) {
    state_.rank = rank;
    state_.completions.reserve(1024);
    pairs_.resize(static_cast<size_t>(size));
  }

  ~RdmaDevice() override {
    if (!torn_down_ && connected_) {
      for (auto& p : pairs_) {
        if (p) p->PostFarewell(nullptr);
      }
      DrainFarewells(kGoodbyeBound);
    }
    Teardown();
  }

  // Opens the device and creates everything but the connections.
  Status Open(ibv_device* device, const RdmaOptions& options, uint8_t port) {
    ctx_ = verbs_->open_device(device);
    if (ctx_ == nullptr) {
      return ErrnoStatus(StatusCode::kUnavailable,
                         fmt::format("ibv_open_device({})", verbs_->get_device_name(device)),
                         errno);
    }
    port_ = port;
    // The port as this context sees it (its LID may differ from what the device pick saw).
    ibv_port_attr port_attr{};
    if (int rc = verbs_->query_port(ctx_, port, &port_attr); rc != 0) {
      return ErrnoStatus(StatusCode::kUnavailable, fmt::format("ibv_query_port({})", port), rc);
    }
    pd_ = verbs_->alloc_pd(ctx_);
    if (pd_ == nullptr) return ErrnoStatus(StatusCode::kUnavailable, "ibv_alloc_pd", errno);
    cache_ = std::make_shared<RegCache>(verbs_, pd_);
    channel_ = verbs_->create_comp_channel(ctx_);
    if (channel_ == nullptr) {
      return ErrnoStatus(StatusCode::kUnavailable, "ibv_create_comp_channel", errno);
    }
    const int flags = ::fcntl(channel_->fd, F_GETFL);
    if (flags < 0 || ::fcntl(channel_->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "fcntl(completion channel, O_NONBLOCK)", errno);
    }
    const int cqe = std::max(1, size_ - 1) * (kSqDepth + kRqDepth) + 16;
    cq_ = verbs_->create_cq(ctx_, cqe, nullptr, channel_, 0);
    if (cq_ == nullptr) {
      return ErrnoStatus(StatusCode::kUnavailable, fmt::format("ibv_create_cq({} entries)", cqe),
                         errno);
    }
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_ < 0 || wake_ < 0) return ErrnoStatus(StatusCode::kInternal, "epoll/eventfd", errno);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, channel_->fd, &ev) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "epoll_ctl(completion channel)", errno);
    }
    ev.data.u64 = 1;
    if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "epoll_ctl(eventfd)", errno);
    }

    // Addressing: RoCE routes by GID, InfiniBand by LID unless a GID index was asked for.
    const bool roce = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET;
    int gid_index = options.gid_index;
    if (gid_index < 0 && roce) gid_index = PickRoceGid(verbs_->get_device_name(device), port);
    ibv_gid gid{};
    if (gid_index >= 0) {
      if (verbs_->query_gid(ctx_, port, gid_index, &gid) != 0) {
        return InvalidArgument(
            "GID index {} of {} port {} cannot be read (the port's table has "
            "{} entries)",
            gid_index, verbs_->get_device_name(device), port, port_attr.gid_tbl_len);
      }
    } else {
      verbs_->query_gid(ctx_, port, 0, &gid);
    }
    sgid_index_ = static_cast<uint8_t>(std::max(gid_index, 0));
    // The QPs' transport retries: 4.096 us * 2^t per try, 8 tries; about half the peer timeout.
    const double per_try_us = std::max(1.0, options.timeout.count() * 1000.0 / 2 / 8);
    timeout_exp_ = std::clamp(static_cast<int>(std::ceil(std::log2(per_try_us / 4.096))), 8, 24);

    for (int peer = 0; peer < size_; ++peer) {
      if (peer == state_.rank) continue;
      auto pair = std::make_unique<RdmaPair>(state_, verbs_, peer, this, cache_.get());
      Status s = pair->Create(ctx_, pd_, cq_, port);
      pairs_[static_cast<size_t>(peer)] = std::move(pair);
      KOLO_RETURN_IF_ERROR(s);
      PeerInfo& mine = pairs_[static_cast<size_t>(peer)]->mine();
      mine.lid = port_attr.lid;
      std::memcpy(mine.gid, gid.raw, 16);
      mine.mtu = static_cast<uint8_t>(port_attr.active_mtu);
      mine.global = gid_index >= 0 ? 1 : 0;
    }
    if (verbs_->req_notify_cq(cq_, 0) != 0) {
      return ErrnoStatus(StatusCode::kUnavailable, "ibv_req_notify_cq", errno);
    }
    return Status::OK();
  }

  // Exchanges the set-up records, brings the QPs up and checks the proofs.
  Status Handshake(bootstrap::Store& store, const RdmaOptions& options) {
    const auto deadline = Clock::now() + options.timeout;
    const int rank = state_.rank;
    // Publish.
    std::vector<uint8_t> blob(16 + static_cast<size_t>(size_) * PeerInfo::kBytes, 0);
    Put32(blob.data(), kInfoMagic);
    Put32(blob.data() + 4, kInfoVersion);
    Put32(blob.data() + 8, static_cast<uint32_t>(rank));
    Put32(blob.data() + 12, static_cast<uint32_t>(size_));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank) continue;
      Encode(pairs_[static_cast<size_t>(peer)]->mine(),
             blob.data() + 16 + static_cast<size_t>(peer) * PeerInfo::kBytes);
    }
    const Digest mac = InfoMac(options.secret, blob.data(), blob.size());
    blob.insert(blob.end(), mac.begin(), mac.end());
    KOLO_RETURN_IF_ERROR(store.Set(fmt::format("rdma/info/{}", rank), blob));
    // Connect.
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank) continue;
      auto value = store.Get(fmt::format("rdma/info/{}", peer),
                             std::chrono::milliseconds(RemainingMs(deadline)));
      if (!value.ok()) {
        return value.status().WithContext(
            fmt::format("rank {}: looking up the RDMA address of rank {}", rank, peer));
      }
      const std::vector<uint8_t>& v = *value;
      const size_t body = 16 + static_cast<size_t>(size_) * PeerInfo::kBytes;
      if (v.size() != body + 32 || Get32(v.data()) != kInfoMagic ||
          Get32(v.data() + 4) != kInfoVersion ||
          Get32(v.data() + 8) != static_cast<uint32_t>(peer) ||
          Get32(v.data() + 12) != static_cast<uint32_t>(size_)) {
        return Unavailable(
            "rank {}: the RDMA set-up record of rank {} is malformed or from a job of another size",
            rank, peer);
      }
      Digest got;
      std::memcpy(got.data(), v.data() + body, 32);
      if (!DigestsEqual(got, InfoMac(options.secret, v.data(), body))) {
        return Unavailable(
            "rank {}: the RDMA set-up record of rank {} fails authentication (wrong job secret?)",
            rank, peer);
      }
      const PeerInfo theirs =
          DecodeInfo(v.data() + 16 + static_cast<size_t>(rank) * PeerInfo::kBytes);
      RdmaPair& p = *pairs_[static_cast<size_t>(peer)];
      KOLO_RETURN_IF_ERROR(p.ConnectTo(theirs, sgid_index_, timeout_exp_));
      p.ExpectProof(ProofMac(options.secret, peer, rank, theirs, p.mine()));
    }
    KOLO_RETURN_IF_ERROR(store.Set(fmt::format("rdma/ready/{}", rank), {1}));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank) continue;
      auto ready = store.Get(fmt::format("rdma/ready/{}", peer),
                             std::chrono::milliseconds(RemainingMs(deadline)));
      if (!ready.ok()) {
        return ready.status().WithContext(
            fmt::format("rank {}: waiting for rank {}'s RDMA queue pair", rank, peer));
      }
    }
    // Prove, and wait for every peer's proof.
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank) continue;
      RdmaPair& p = *pairs_[static_cast<size_t>(peer)];
      KOLO_RETURN_IF_ERROR(p.SendProof(ProofMac(options.secret, rank, peer, p.mine(), p.theirs())));
    }
    connected_ = true;
    for (;;) {
      std::string missing;
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != rank && !pairs_[static_cast<size_t>(peer)]->proven()) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(peer);
        }
      }
      if (missing.empty()) break;
      if (Clock::now() >= deadline) {
        return DeadlineExceeded("rank {}: no RDMA connection proof from rank(s) {} within {} ms",
                                rank, missing, options.timeout.count());
      }
      KOLO_RETURN_IF_ERROR(Step(true));
      Sleep(std::min(deadline, Clock::now() + std::chrono::milliseconds(50)), false);
    }
    return Status::OK();
  }

  int rank() const override { return state_.rank; }
  int size() const override { return size_; }
  const char* name() const override { return "rdma"; }

  StatusOr<std::unique_ptr<Region>> Register(void* data, size_t size) override {
    if (data == nullptr && size > 0) {
      return InvalidArgument("Register: null pointer with size {} (only size 0 may be null)", size);
    }
    if (torn_down_) return FailedPrecondition("Register: the RDMA device is closed");
    MrEntry* entry = nullptr;
    if (size > 0) {
      KOLO_ASSIGN_OR_RETURN(entry, cache_->Acquire(data, size));
    }
    return std::unique_ptr<Region>(new RdmaRegion(data, size, this, cache_, entry));
  }

  Pair& pair(int peer) override {
    if (peer < 0 || peer >= size_ || !pairs_[static_cast<size_t>(peer)]) {
      KOLO_LOG(kError, "rdma device of rank {}: pair({}) is not a peer (size {})", state_.rank,
               peer, size_);
      std::abort();
    }
    return *pairs_[static_cast<size_t>(peer)];
  }

  Status Poll(std::vector<Completion>* out, std::chrono::milliseconds timeout) override {
    if (!state_.error.ok()) return state_.error;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      KOLO_RETURN_IF_ERROR(Step(true));
      if (TakeCompletions(out)) return Status::OK();
      if (woken_) {
        woken_ = false;
        return Status::OK();
      }
      if (Clock::now() >= deadline) return TimedOut(timeout);
      Sleep(std::min(deadline, next_keepalive_), false);
    }
  }

  Status WaitForArrival(std::chrono::microseconds timeout, bool* arrived) override {
    *arrived = false;
    if (!state_.error.ok()) return state_.error;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      KOLO_RETURN_IF_ERROR(Step(true));
      KOLO_RETURN_IF_ERROR(CheckArrival(arrived));
      if (*arrived) return Status::OK();
      if (woken_) {
        woken_ = false;
        return Status::OK();
      }
      if (Clock::now() >= deadline) return Status::OK();
      Sleep(std::min(deadline, next_keepalive_), true);
    }
  }

  void Wake() override {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_, &one, sizeof one);
  }

  void Abort(const Status& reason) override {
    if (torn_down_) return;
    state_.Fail(Aborted("rank {} aborted: {}", state_.rank, reason.ToString())).IgnoreError();
    if (connected_) {
      const std::string text = reason.ToString();
      for (auto& p : pairs_) {
        if (p) p->PostFarewell(&text);
      }
      DrainFarewells(kAbortBound);
    }
    Teardown();
  }

  uint64_t bytes_sent() const override { return state_.bytes_sent; }
  uint64_t bytes_received() const override { return state_.bytes_received; }

  double SilentSeconds(int peer) const override {
    if (!has_peer(peer)) return -1;
    return std::chrono::duration<double>(pairs_[static_cast<size_t>(peer)]->SilentFor(Clock::now()))
        .count();
  }

  // PollableDevice.
  bool has_peer(int peer) const override {
    return peer >= 0 && peer < size_ && pairs_[static_cast<size_t>(peer)] != nullptr;
  }
  int wait_fd() const override { return epoll_; }

  Status Step(bool events) override {
    if (!state_.error.ok()) return state_.error;
    if (torn_down_) return FailedPrecondition("the RDMA device is closed");
    if (events) DrainChannel();
    KOLO_RETURN_IF_ERROR(DrainCq());
    for (auto& p : pairs_) {
      if (p) KOLO_RETURN_IF_ERROR(p->Progress());
    }
    return SendKeepalives();
  }

  bool TakeCompletions(std::vector<Completion>* out) override {
    if (state_.completions.empty()) return false;
    out->insert(out->end(), state_.completions.begin(), state_.completions.end());
    state_.completions.clear();
    return true;
  }

  Status CheckArrival(bool* arrived) override {
    *arrived = false;
    if (!state_.error.ok()) return state_.error;
    for (auto& p : pairs_) {
      if (p && p->Arrived()) {
        *arrived = true;
        break;
      }
    }
    return Status::OK();
  }

  bool PrepareToSleep(bool /*for_arrival*/) override {
    if (busy_poll_) return false;
    if (verbs_->req_notify_cq(cq_, 0) != 0) return false;
    // A completion that came between the last drain and arming raises no event: look once more.
    ibv_wc wc;
    const int n = verbs_->poll_cq(cq_, 1, &wc);
    if (n > 0) {
      early_.push_back(wc);
      return false;
    }
    return true;
  }
  void AfterSleep() override {}

  Clock::time_point next_timer() const override { return next_keepalive_; }

  std::string DescribePending() const override {
    std::string pending;
    for (const auto& p : pairs_) {
      if (!p) continue;
      const std::string d = p->DescribePending();
      if (!d.empty()) pending += (pending.empty() ? "" : "; ") + d;
    }
    return pending;
  }

  std::chrono::milliseconds silence_threshold() const override { return silence_; }

  // Tests: the QP to `peer` and the context (fault injection on the software device).
  ibv_qp* qp_for_tests(int peer) const {
    return has_peer(peer) ? pairs_[static_cast<size_t>(peer)]->qp() : nullptr;
  }
  ibv_context* context_for_tests() const { return ctx_; }

 private:
  // RoCE: the highest GID index whose type is RoCE v2 and whose GID is IPv4-mapped (sysfs); else 0.
  static int PickRoceGid(const char* device, uint8_t port) {
    int best = 0;
    for (int i = 0; i < 256; ++i) {
      std::ifstream type(
          fmt::format("/sys/class/infiniband/{}/ports/{}/gid_attrs/types/{}", device, port, i));
      std::string t;
      if (!type || !std::getline(type, t)) continue;
      std::ifstream gid(fmt::format("/sys/class/infiniband/{}/ports/{}/gids/{}", device, port, i));
      std::string g;
      if (!gid || !std::getline(gid, g)) continue;
      if (t.find("RoCE v2") != std::string::npos &&
          g.rfind("0000:0000:0000:0000:0000:ffff:", 0) == 0) {
        best = i;
        break;
      }
    }
    return best;
  }

  Status SendKeepalives() {
    const auto now = Clock::now();
    if (now < next_keepalive_) return Status::OK();
    next_keepalive_ = now + keepalive_ / 2;
    for (auto& p : pairs_) {
      if (p) KOLO_RETURN_IF_ERROR(p->MaybeKeepalive(now, keepalive_));
    }
    return Status::OK();
  }

  Status TimedOut(std::chrono::milliseconds timeout) const {
    const std::string pending = DescribePending();
    const std::string silent = DescribeSilentPeers(*this, silence_);
    return DeadlineExceeded("rank {}: nothing completed within {} ms; {}pending: {}", state_.rank,
                            timeout.count(), silent.empty() ? "" : silent + "; ",
                            pending.empty() ? "nothing" : pending);
  }

  void DrainChannel() {
    for (;;) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      if (verbs_->get_cq_event(channel_, &cq, &context) != 0) break;
      verbs_->ack_cq_events(cq, 1);
    }
    uint64_t count;
    while (::read(wake_, &count, sizeof count) > 0) woken_ = true;
  }

  Status DrainCq() {
    for (const ibv_wc& wc : early_) KOLO_RETURN_IF_ERROR(Handle(wc));
    early_.clear();
    ibv_wc wcs[kPollBatch];
    for (;;) {
      const int n = verbs_->poll_cq(cq_, kPollBatch, wcs);
      if (n < 0) return state_.Fail(Internal("ibv_poll_cq failed ({})", n));
      for (int i = 0; i < n; ++i) KOLO_RETURN_IF_ERROR(Handle(wcs[i]));
      if (n < kPollBatch) return Status::OK();
    }
  }

  Status Handle(const ibv_wc& wc) {
    const int peer = WrPeer(wc.wr_id);
    if (!has_peer(peer))
      return state_.Fail(Internal("rdma: a completion for unknown rank {}", peer));
    Status s = pairs_[static_cast<size_t>(peer)]->OnCompletion(wc);
    if (!s.ok()) return state_.Fail(s);
    return Status::OK();
  }

  // Sleeps until the completion channel or the wake-up fires, or `until`. Returns false when it
  // did not sleep (progress was possible at once).
  bool Sleep(Clock::time_point until, bool /*for_arrival*/) {
    if (!PrepareToSleep(false)) return false;
    epoll_event ev[2];
    const int ms = RemainingMs(until);
    if (ms == 0 && Clock::now() >= until) return true;
    ::epoll_wait(epoll_, ev, 2, ms);
    return true;
  }

  // Polls the CQ until every farewell posted has completed (or failed), at most `bound`.
  void DrainFarewells(std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    for (;;) {
      bool done = true;
      for (auto& p : pairs_) {
        if (p && !p->farewell_done()) done = false;
      }
      if (done || Clock::now() >= deadline) return;
      DrainChannel();
      ibv_wc wcs[kPollBatch];
      const int n = verbs_->poll_cq(cq_, kPollBatch, wcs);
      for (int i = 0; i < n; ++i) {
        const int peer = WrPeer(wcs[i].wr_id);
        if (has_peer(peer)) pairs_[static_cast<size_t>(peer)]->OnCompletion(wcs[i]).IgnoreError();
      }
      if (n <= 0) {
        if (verbs_->req_notify_cq(cq_, 0) == 0 && verbs_->poll_cq(cq_, 0, wcs) == 0) {
          epoll_event ev[2];
          ::epoll_wait(epoll_, ev, 2, std::min(RemainingMs(deadline), 10));
        }
      }
    }
  }

  // QPs, MRs, CQ, channel, PD, context: in that order.
  void Teardown() {
    if (torn_down_) return;
    torn_down_ = true;
    for (auto& p : pairs_) {
      if (p) p->DestroyQp();
    }
    for (auto& p : pairs_) {
      if (p) p->DestroyMrs();
    }
    if (cache_) cache_->Close();
    if (cq_ != nullptr) {
      if (channel_ != nullptr) DrainChannel();
      if (verbs_->destroy_cq(cq_) != 0) {
        KOLO_LOG(kWarning, "rdma: ibv_destroy_cq failed: {}", std::strerror(errno));
      }
      cq_ = nullptr;
    }
    if (channel_ != nullptr) {
      if (verbs_->destroy_comp_channel(channel_) != 0) {
        KOLO_LOG(kWarning, "rdma: ibv_destroy_comp_channel failed: {}", std::strerror(errno));
      }
      channel_ = nullptr;
    }
    if (pd_ != nullptr) {
      if (verbs_->dealloc_pd(pd_) != 0) {
        KOLO_LOG(kWarning, "rdma: ibv_dealloc_pd failed: {}", std::strerror(errno));
      }
      pd_ = nullptr;
    }
    if (ctx_ != nullptr) {
      if (verbs_->close_device(ctx_) != 0) {
        KOLO_LOG(kWarning, "rdma: ibv_close_device failed: {}", std::strerror(errno));
      }
      ctx_ = nullptr;
    }
    if (epoll_ >= 0) ::close(epoll_);
    if (wake_ >= 0) ::close(wake_);
    epoll_ = wake_ = -1;
  }

  const Verbs* verbs_;
  const int size_;
  const bool busy_poll_;
  const std::chrono::milliseconds keepalive_;
  const std::chrono::milliseconds silence_;
  Clock::time_point next_keepalive_{};
  DeviceState state_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::shared_ptr<RegCache> cache_;
  uint8_t port_ = 1;
  uint8_t sgid_index_ = 0;
  int timeout_exp_ = 14;
  int epoll_ = -1;
  int wake_ = -1;
  bool woken_ = false;
  bool connected_ = false;
  bool torn_down_ = false;
  std::vector<ibv_wc> early_;
  std::vector<std::unique_ptr<RdmaPair>> pairs_;
};

const char* PortState(ibv_port_state s) {
  switch (s) {
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    default:
      return "not active";
  }
}

}  // namespace

ibv_qp* QueuePairForTests(Device& device, int peer) {
  auto* d = dynamic_cast<RdmaDevice*>(&device);
  return d != nullptr ? d->qp_for_tests(peer) : nullptr;
}

ibv_context* ContextForTests(Device& device) {
  auto* d = dynamic_cast<RdmaDevice*>(&device);
  return d != nullptr ? d->context_for_tests() : nullptr;
}

StatusOr<std::string> DeviceNames(const Verbs& verbs) {
  int n = 0;
  ibv_device** list = verbs.get_device_list(&n);
  if (list == nullptr) {
    // ENOSYS: the kernel offers no RDMA support at all, so there is no device.
    if (errno == ENOSYS) return std::string();
    return ErrnoStatus(StatusCode::kUnavailable, "ibv_get_device_list", errno);
  }
  std::string names;
  for (int i = 0; i < n; ++i) {
    names += (names.empty() ? "" : ", ") + std::string(verbs.get_device_name(list[i]));
  }
  verbs.free_device_list(list);
  return names;
}

namespace {

// The devices the table lists, freed on scope exit.
struct DeviceList {
  const Verbs* verbs = nullptr;
  ibv_device** list = nullptr;
  int n = 0;
  ~DeviceList() {
    if (list != nullptr) verbs->free_device_list(list);
  }
};

// Loads the table and picks the device (the named one, or the first whose port is ACTIVE): its
// index in *devices. Errors name the host, and what exists.
StatusOr<int> PickDevice(const RdmaOptions& options, DeviceList* devices) {
  const std::string host = HostName(options.host_name);
  auto loaded = OpenVerbs(options.verbs);
  if (!loaded.ok()) {
    return Unavailable("host {}: --transport rdma cannot start: {}", host,
                       loaded.status().message());
  }
  const Verbs* verbs = *loaded;
  if (options.port < 1 || options.port > 255) {
    return InvalidArgument("RDMA port {} is outside [1, 255]", options.port);
  }
  const auto port = static_cast<uint8_t>(options.port);
  devices->verbs = verbs;
  devices->list = verbs->get_device_list(&devices->n);
  if (devices->list == nullptr || devices->n == 0) {
    return Unavailable(
        "host {}: --transport rdma needs an RDMA device, but {} finds none (no InfiniBand, RoCE "
        "or iWARP device, nor rxe/siw); use --transport tcp or auto",
        host, verbs->label);
  }
  std::string names, states;
  bool named_exists = false;
  int chosen = -1;
  for (int i = 0; i < devices->n; ++i) {
    const std::string name = verbs->get_device_name(devices->list[i]);
    names += (names.empty() ? "" : ", ") + name;
    if (chosen >= 0 || (!options.device.empty() && name != options.device)) continue;
    named_exists = true;
    ibv_context* ctx = verbs->open_device(devices->list[i]);
    if (ctx == nullptr) {
      states += fmt::format("{}{}: cannot be opened ({})", states.empty() ? "" : ", ", name,
                            std::strerror(errno));
      continue;
    }
    ibv_port_attr attr{};
    const int rc = verbs->query_port(ctx, port, &attr);
    verbs->close_device(ctx);
    if (rc != 0) {
      states += fmt::format("{}{}: no port {}", states.empty() ? "" : ", ", name, options.port);
      continue;
    }
    if (attr.state != IBV_PORT_ACTIVE) {
      states += fmt::format("{}{} port {}: {}", states.empty() ? "" : ", ", name, options.port,
                            PortState(attr.state));
      continue;
    }
    chosen = i;
  }
  if (chosen < 0) {
    if (!options.device.empty() && !named_exists) {
      return NotFound("host {}: RDMA device '{}' does not exist; the devices are: {}", host,
                      options.device, names);
    }
    return Unavailable("host {}: no RDMA device with an ACTIVE port {} ({}); devices: {}", host,
                       options.port, states, names);
  }
  return chosen;
}

}  // namespace

Status Probe(const RdmaOptions& options) {
  DeviceList devices;
  return PickDevice(options, &devices).status();
}

StatusOr<std::unique_ptr<PollableDevice>> Connect(const RdmaOptions& options,
                                                  bootstrap::Store& store, int rank, int size) {
  DeviceList devices;
  KOLO_ASSIGN_OR_RETURN(const int chosen, PickDevice(options, &devices));
  auto device = std::make_unique<RdmaDevice>(devices.verbs, options, rank, size);
  KOLO_RETURN_IF_ERROR(
      device->Open(devices.list[chosen], options, static_cast<uint8_t>(options.port)));
  KOLO_RETURN_IF_ERROR(device->Handshake(store, options));
  return std::unique_ptr<PollableDevice>(std::move(device));
}

}  // namespace kolo::transport::rdma
