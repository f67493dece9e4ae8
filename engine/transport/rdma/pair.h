// One RC queue pair of the RDMA transport and the protocol spoken over it (device.h describes
// it): eager slots and credits, adverts and direct writes, the control notifications. Internal to
// the transport; users see it as a transport::Pair.
//
// Thread-safety: none; driven by the device's thread, like the device.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>

#include "engine/common/crypto.h"
#include "engine/common/status.h"
#include "engine/transport/poll_core.h"
#include "engine/transport/rdma/peer_info.h"
#include "engine/transport/rdma/registration_cache.h"
#include "engine/transport/rdma/verbs.h"
#include "engine/transport/rdma/wire_ids.h"
#include "engine/transport/transport.h"

namespace kolo::transport::rdma {

class RdmaPair final : public Pair {
 public:
  // A pair of the device whose completions, counters and error are `state`, whose Regions are
  // identified by `owner`, and whose registrations go through `cache`; all outlive the pair.
  RdmaPair(DeviceState& state, const Verbs* verbs, int peer, const void* owner, RegCache* cache)
      : state_(state), verbs_(verbs), peer_(peer), owner_(owner), cache_(cache) {}
  ~RdmaPair() override = default;

  // Pair. Send and Recv refuse Regions of another device and ranges outside the Region; Recv also
  // refuses memory registered for reading only.
  int peer() const override { return peer_; }
  Status Send(const Region& region, size_t offset, size_t nbytes, uint64_t tag) override;
  Status Recv(Region& region, size_t offset, size_t capacity, uint64_t tag) override;

  // Set-up, in this order: Create (control block, staging, the QP in INIT with its receives
  // posted; fills mine() but for the port's addressing, which the device adds), ConnectTo (RTR,
  // RTS), ExpectProof, SendProof; the pair is usable once proven() (the peer's proof arrived
  // and matched).
  Status Create(ibv_context* ctx, ibv_pd* pd, ibv_cq* cq, uint8_t port);
  PeerInfo& mine() { return mine_; }
  const PeerInfo& theirs() const { return theirs_; }
  // `timeout_exp`: the QP's transport timeout exponent (4.096 us * 2^t per try).
  Status ConnectTo(const PeerInfo& theirs, uint8_t sgid_index, int timeout_exp);
  Status SendProof(const Digest& proof);
  void ExpectProof(const Digest& proof) { expected_proof_ = proof; }
  bool proven() const { return proven_; }

  // Progress, driven by the device. OnCompletion handles one completion of this pair's QP;
  // Progress posts what can be posted (sends, credits, adverts, announcements). Errors of
  // Progress and MaybeKeepalive are recorded in the device state; OnCompletion's are returned
  // for the device to record.
  Status OnCompletion(const ibv_wc& wc);
  Status Progress();

  // Liveness, as the other transports' pairs: a KEEPALIVE when nothing was posted to the peer for
  // `interval`; the peer's silence is the time since a notification last arrived from it, zero
  // while a message of its waits here for a receive.
  Status MaybeKeepalive(Clock::time_point now, std::chrono::milliseconds interval);
  Clock::duration SilentFor(Clock::time_point now) const;
  // Whether a message has arrived (or announced itself) that no posted receive has taken.
  bool Arrived() const { return !stash_.empty() || rts_upto_ > recv_index_next_; }
  Status CheckArrival(bool* arrived) {
    *arrived = Arrived();
    return Status::OK();
  }
  // "rank P: 2 recv (next tag 0x..., N bytes), 1 send (...)" or "" when nothing is pending.
  std::string DescribePending() const;

  bool pending() const { return !sends_.empty() || !inflight_.empty() || !recvs_.empty(); }
  bool peer_gone() const { return peer_gone_; }
  bool usable() const { return !dead_ && !peer_gone_ && qp_ != nullptr; }

  // Shutdown: posts GOODBYE, or ABORT with `reason`; false if nothing was posted.
  bool PostFarewell(const std::string* reason);
  // A peer that said GOODBYE first is not waiting for ours (and its QP may be gone already).
  bool farewell_done() const { return !farewell_ || sq_used_ == 0 || dead_ || peer_gone_; }

  // Destroys the QP (first in the teardown order), then the pair's MRs (second).
  void DestroyQp();
  void DestroyMrs();
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

  Status OnError(const ibv_wc& wc);

  Status OnNotification(uint32_t imm);

  Status OnEager(uint32_t slot_value);

  Status DeliverEager(const RecvOp& op, uint64_t slot);

  Status Check(const RecvOp& op, uint64_t tag, uint64_t length) const;

  void Complete(const RecvOp& op, uint64_t length);

  Status OnDirect(uint32_t value);

  Status OnAdvert(uint32_t value);

  // The pair's posting logic; returns an error to record (not yet recorded).
  Status Flush();

  StatusOr<bool> PostEager(const SendOp& op, bool withheld);

  StatusOr<bool> PostDirect(const SendOp& op, const Advert& a);

  Status PostControl(Imm type, uint64_t value);

  // A write of `n` staging bytes at `local` to the peer's control block at `remote_offset`, with
  // an immediate.
  Status PostWrite(Wr kind, uint64_t wr_value, const uint8_t* local, size_t n, size_t remote_offset,
                   Imm type, uint64_t value);

  Status Post(ibv_send_wr* wr, int n);

  Status PostRecv();

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

}  // namespace kolo::transport::rdma
