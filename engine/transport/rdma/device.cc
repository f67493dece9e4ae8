#include "engine/transport/rdma/device.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/logging.h"
#include "engine/transport/paired_device.h"
#include "engine/transport/rdma/pair.h"
#include "engine/transport/rdma/peer_info.h"
#include "engine/transport/rdma/pick_device.h"
#include "engine/transport/rdma/registration_cache.h"
#include "engine/transport/rdma/wire_ids.h"

namespace kolo::transport::rdma {
namespace {

constexpr std::chrono::milliseconds kAbortBound{1000};
constexpr std::chrono::milliseconds kGoodbyeBound{200};
constexpr int kPollBatch = 32;

class RdmaDevice final : public PairedDevice<RdmaPair> {
 public:
  RdmaDevice(const Verbs* verbs, const RdmaOptions& options, int rank, int size)
      : PairedDevice(rank, size, options.busy_poll, options.timeout), verbs_(verbs) {}

  ~RdmaDevice() override {
    if (!torn_down_ && connected_) {
      for (RdmaPair* p : pairs()) p->PostFarewell(nullptr);
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
    const int cqe = std::max(1, size() - 1) * (kSqDepth + kRqDepth) + 16;
    cq_ = verbs_->create_cq(ctx_, cqe, nullptr, channel_, 0);
    if (cq_ == nullptr) {
      return ErrnoStatus(StatusCode::kUnavailable, fmt::format("ibv_create_cq({} entries)", cqe),
                         errno);
    }
    KOLO_RETURN_IF_ERROR(InitWaitSet());
    KOLO_RETURN_IF_ERROR(Watch(channel_->fd, EPOLLIN, kChannelId, "completion channel"));

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

    std::vector<bool> planned(static_cast<size_t>(size()), !options.peers.has_value());
    if (options.peers) {
      for (int p : *options.peers) planned[static_cast<size_t>(p)] = true;
    }
    for (int peer = 0; peer < size(); ++peer) {
      if (peer == state_.rank || !planned[static_cast<size_t>(peer)]) continue;
      auto pair = std::make_unique<RdmaPair>(state_, verbs_, peer, this, cache_.get());
      Status s = pair->Create(ctx_, pd_, cq_, port);
      RdmaPair& added = AddPair(std::move(pair));  // torn down with the rest even if it failed
      KOLO_RETURN_IF_ERROR(s);
      PeerInfo& mine = added.mine();
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
    std::vector<PeerInfo> infos(static_cast<size_t>(size()));
    for (RdmaPair* p : pairs()) infos[static_cast<size_t>(p->peer())] = p->mine();
    KOLO_RETURN_IF_ERROR(store.Set(fmt::format("rdma/info/{}", rank),
                                   EncodeInfoRecord(options.secret, rank, size(), infos)));
    // Connect.
    for (RdmaPair* p : pairs()) {
      const int peer = p->peer();
      auto value = store.Get(fmt::format("rdma/info/{}", peer),
                             std::chrono::milliseconds(RemainingMs(deadline)));
      if (!value.ok()) {
        return value.status().WithContext(
            fmt::format("rank {}: looking up the RDMA address of rank {}", rank, peer));
      }
      KOLO_ASSIGN_OR_RETURN(const PeerInfo theirs,
                            DecodeInfoRecord(options.secret, *value, peer, rank, size()));
      KOLO_RETURN_IF_ERROR(p->ConnectTo(theirs, sgid_index_, timeout_exp_));
      p->ExpectProof(ProofMac(options.secret, peer, rank, theirs, p->mine()));
    }
    KOLO_RETURN_IF_ERROR(store.Set(fmt::format("rdma/ready/{}", rank), {1}));
    for (RdmaPair* p : pairs()) {
      const int peer = p->peer();
      auto ready = store.Get(fmt::format("rdma/ready/{}", peer),
                             std::chrono::milliseconds(RemainingMs(deadline)));
      if (!ready.ok()) {
        return ready.status().WithContext(
            fmt::format("rank {}: waiting for rank {}'s RDMA queue pair", rank, peer));
      }
    }
    // Prove, and wait for every peer's proof.
    for (RdmaPair* p : pairs()) {
      KOLO_RETURN_IF_ERROR(
          p->SendProof(ProofMac(options.secret, rank, p->peer(), p->mine(), p->theirs())));
    }
    connected_ = true;
    for (;;) {
      std::string missing;
      for (const RdmaPair* p : pairs()) {
        if (!p->proven()) missing += (missing.empty() ? "" : ", ") + std::to_string(p->peer());
      }
      if (missing.empty()) break;
      if (Clock::now() >= deadline) {
        return DeadlineExceeded("rank {}: no RDMA connection proof from rank(s) {} within {} ms",
                                rank, missing, options.timeout.count());
      }
      KOLO_RETURN_IF_ERROR(Step(true));
      bool woken = false;
      KOLO_RETURN_IF_ERROR(SleepUntil(
          std::min(deadline, Clock::now() + std::chrono::milliseconds(50)), false, &woken));
    }
    return Status::OK();
  }

  const char* name() const override { return "rdma"; }
  // Each queue pair's control block and staging, registered with the NIC.
  uint64_t transport_memory_bytes() const override {
    return (kCtrlBytes + kStagingBytes) * pairs().size();
  }

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

  void Abort(const Status& reason) override {
    if (torn_down_) return;
    state_.Fail(Aborted("rank {} aborted: {}", state_.rank, reason.ToString())).IgnoreError();
    if (connected_) {
      const std::string text = reason.ToString();
      for (RdmaPair* p : pairs()) p->PostFarewell(&text);
      DrainFarewells(kAbortBound);
    }
    Teardown();
  }

  bool PrepareToSleep(bool /*for_arrival*/) override {
    if (busy_poll()) return false;
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

  // Tests: the QP to `peer` and the context (fault injection on the software device).
  ibv_qp* qp_for_tests(int peer) const { return has_peer(peer) ? pair_of(peer).qp() : nullptr; }
  ibv_context* context_for_tests() const { return ctx_; }

 protected:
  Status Advance() override {
    if (torn_down_) return FailedPrecondition("the RDMA device is closed");
    KOLO_RETURN_IF_ERROR(DrainCq());
    for (RdmaPair* p : pairs()) KOLO_RETURN_IF_ERROR(p->Progress());
    return SendKeepalives();
  }

  // The completion channel fired: take its events (the completions are polled in Advance).
  Status OnEvent(const epoll_event& /*event*/) override {
    DrainChannel();
    return Status::OK();
  }

 private:
  static constexpr uint64_t kChannelId = 0;

  void DrainChannel() {
    for (;;) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      if (verbs_->get_cq_event(channel_, &cq, &context) != 0) break;
      verbs_->ack_cq_events(cq, 1);
    }
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
    if (!has_peer(peer)) {
      return state_.Fail(Internal("rdma: a completion for unknown rank {}", peer));
    }
    Status s = pair_of(peer).OnCompletion(wc);
    if (!s.ok()) return state_.Fail(s);
    return Status::OK();
  }

  // Polls the CQ until every farewell posted has completed (or failed), at most `bound`.
  void DrainFarewells(std::chrono::milliseconds bound) {
    const auto deadline = Clock::now() + bound;
    for (;;) {
      bool done = true;
      for (const RdmaPair* p : pairs()) {
        if (!p->farewell_done()) done = false;
      }
      if (done || Clock::now() >= deadline) return;
      bool woken = false;
      LookAtEvents(&woken).IgnoreError();
      ibv_wc wcs[kPollBatch];
      const int n = verbs_->poll_cq(cq_, kPollBatch, wcs);
      for (int i = 0; i < n; ++i) {
        const int peer = WrPeer(wcs[i].wr_id);
        if (has_peer(peer)) pair_of(peer).OnCompletion(wcs[i]).IgnoreError();
      }
      if (n <= 0) {
        if (verbs_->req_notify_cq(cq_, 0) == 0 && verbs_->poll_cq(cq_, 0, wcs) == 0) {
          epoll_event ev[2];
          ::epoll_wait(wait_fd(), ev, 2, std::min(RemainingMs(deadline), 10));
        }
      }
    }
  }

  // QPs, MRs, CQ, channel, PD, context: in that order.
  void Teardown() {
    if (torn_down_) return;
    torn_down_ = true;
    for (RdmaPair* p : pairs()) p->DestroyQp();
    for (RdmaPair* p : pairs()) p->DestroyMrs();
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
    CloseWaitSet();
  }

  const Verbs* verbs_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  std::shared_ptr<RegCache> cache_;
  uint8_t port_ = 1;
  uint8_t sgid_index_ = 0;
  int timeout_exp_ = 14;
  bool connected_ = false;
  bool torn_down_ = false;
  std::vector<ibv_wc> early_;  // completions PrepareToSleep found; handled first by DrainCq
};

}  // namespace

ibv_qp* QueuePairForTests(Device& device, int peer) {
  auto* d = dynamic_cast<RdmaDevice*>(&device);
  return d != nullptr ? d->qp_for_tests(peer) : nullptr;
}

ibv_context* ContextForTests(Device& device) {
  auto* d = dynamic_cast<RdmaDevice*>(&device);
  return d != nullptr ? d->context_for_tests() : nullptr;
}

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
