// Internal to the transports: a PollCore (poll_core.h) that owns one pair per connected peer — what
// the TCP, shm and RDMA devices have in common. It keeps the pairs in rank order and answers, from
// them, pair(), has_peer, SilentSeconds, DescribePending, CheckArrival and the keepalive timer;
// the device adds its connections, its Advance and its OnEvent.
//
// PairT is the transport's pair, with:
//   int peer() const;
//   Status MaybeKeepalive(Clock::time_point now, std::chrono::milliseconds interval);
//   Clock::duration SilentFor(Clock::time_point now) const;
//   std::string DescribePending() const;   // "" when nothing is pending
//   Status CheckArrival(bool* arrived);    // a message waits for a receive (errors recorded)
// StateT is DeviceState or a transport's extension of it, shared by the pairs.
#pragma once

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/logging.h"
#include "engine/transport/poll_core.h"

namespace kolo::transport {

template <typename PairT, typename StateT = DeviceState>
class PairedDevice : public PollCore {
 public:
  // `timeout` is the peer timeout the keepalive interval and the silence threshold derive from
  // (poll_core.h). `scope` ends the message of a pair() that names no peer ("", " on this host").
  PairedDevice(int rank, int size, bool busy_poll, std::chrono::milliseconds timeout,
               const char* scope = "")
      : PollCore(&state_, busy_poll),
        size_(size),
        keepalive_(KeepaliveInterval(timeout)),
        silence_(SilenceThreshold(timeout)),
        scope_(scope) {
    state_.rank = rank;
    state_.completions.reserve(1024);
    pairs_.resize(static_cast<size_t>(size));
    unconnected_.resize(static_cast<size_t>(size));
  }

  int rank() const override { return state_.rank; }
  int size() const override { return size_; }

  Pair& pair(int peer) override {
    if (!has_peer(peer)) {
      if (peer < 0 || peer >= size_ || peer == state_.rank) {
        KOLO_LOG(kError, "{} device of rank {}: pair({}) is not a peer{} (size {})", name(),
                 state_.rank, peer, scope_, size_);
        std::abort();
      }
      auto& stand_in = unconnected_[static_cast<size_t>(peer)];
      if (!stand_in) stand_in = std::make_unique<UnconnectedPair>(state_.rank, peer, name());
      return *stand_in;
    }
    return *pairs_[static_cast<size_t>(peer)];
  }
  bool connected(int peer) const override { return has_peer(peer); }

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

  Status CheckArrival(bool* arrived) override {
    *arrived = false;
    if (!state_.error.ok()) return state_.error;
    for (PairT* p : live_) {
      KOLO_RETURN_IF_ERROR(p->CheckArrival(arrived));
      if (*arrived) break;
    }
    return Status::OK();
  }

  Clock::time_point next_timer() const override { return next_keepalive_; }

  std::string DescribePending() const override { return JoinPending(live_); }

  std::chrono::milliseconds silence_threshold() const override { return silence_; }

 protected:
  // Takes `pair` as the pair with pair->peer(). REQUIRES: pairs added in increasing rank order,
  // each peer once, before Init of the subclass.
  PairT& AddPair(std::unique_ptr<PairT> pair) {
    PairT* p = pair.get();
    pairs_[static_cast<size_t>(p->peer())] = std::move(pair);
    live_.push_back(p);
    return *p;
  }

  // Queues a keepalive on every pair idle for the keepalive interval; looks at most twice per
  // interval.
  Status SendKeepalives() {
    const auto now = Clock::now();
    if (now < next_keepalive_) return Status::OK();
    next_keepalive_ = now + keepalive_ / 2;
    for (PairT* p : live_) KOLO_RETURN_IF_ERROR(p->MaybeKeepalive(now, keepalive_));
    return Status::OK();
  }

  // The pair with `peer`. REQUIRES: has_peer(peer).
  PairT& pair_of(int peer) const { return *pairs_[static_cast<size_t>(peer)]; }
  // The pairs, in rank order.
  const std::vector<PairT*>& pairs() const { return live_; }

  StateT state_;

 private:
  const int size_;
  const std::chrono::milliseconds keepalive_;
  const std::chrono::milliseconds silence_;  // a peer silent this long has stopped
  const char* const scope_;
  Clock::time_point next_keepalive_{};
  std::vector<std::unique_ptr<PairT>> pairs_;  // null at this rank and for ranks not connected
  std::vector<PairT*> live_;
  std::vector<std::unique_ptr<UnconnectedPair>> unconnected_;  // made on first ask
};

}  // namespace kolo::transport
