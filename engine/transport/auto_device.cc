#include "engine/transport/auto_device.h"

#include <sys/epoll.h>

#include <algorithm>
#include <cstdlib>

#include "engine/common/logging.h"
#include "engine/transport/poll_core.h"

namespace kolo::transport {
namespace {

class CombinedDevice final : public PollCore {
 public:
  CombinedDevice(int rank, int size, std::vector<std::unique_ptr<PollableDevice>> parts,
                 bool busy_poll)
      : PollCore(&state_, busy_poll),
        size_(size),
        parts_(std::move(parts)),
        owner_(static_cast<size_t>(size), nullptr),
        ready_(parts_.size(), true) {
    state_.rank = rank;
    for (auto& part : parts_) {
      for (int peer = 0; peer < size; ++peer) {
        if (part->has_peer(peer)) owner_[static_cast<size_t>(peer)] = part.get();
      }
    }
  }

  Status Init() {
    KOLO_RETURN_IF_ERROR(InitWaitSet());
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == state_.rank && owner_[static_cast<size_t>(peer)] != nullptr) {
        return Internal("rank {}: the combined device has a pair for itself", state_.rank);
      }
    }
    for (size_t i = 0; i < parts_.size(); ++i) {
      KOLO_RETURN_IF_ERROR(
          Watch(parts_[i]->wait_fd(), EPOLLIN, i, fmt::format("the {} device", parts_[i]->name())));
    }
    return Status::OK();
  }

  int rank() const override { return state_.rank; }
  int size() const override { return size_; }
  const char* name() const override { return "auto"; }
  const char* pair_transport(int peer) const override {
    return has_peer(peer) ? Owner(peer).name() : "none";
  }
  bool connected(int peer) const override { return has_peer(peer); }
  uint64_t transport_memory_bytes() const override {
    uint64_t n = 0;
    for (const auto& part : parts_) n += part->transport_memory_bytes();
    return n;
  }

  StatusOr<std::unique_ptr<Region>> Register(void* data, size_t size) override {
    // Every part registers for free (a Region is a pointer and a size), so one Region serves all.
    return parts_.front()->Register(data, size);
  }

  Pair& pair(int peer) override {
    if (!has_peer(peer) && peer >= 0 && peer < size_ && peer != state_.rank) {
      // Not connected by any part: the first part hands out its stand-in, which fails each use.
      return parts_.front()->pair(peer);
    }
    return Owner(peer).pair(peer);
  }

  // One part: its own loop, which sleeps in its wait set directly.
  Status Poll(std::vector<Completion>* out, std::chrono::milliseconds timeout) override {
    if (single()) return Sticky(parts_.front()->Poll(out, timeout));
    std::fill(ready_.begin(), ready_.end(), true);
    return PollCore::Poll(out, timeout);
  }

  Status WaitForArrival(std::chrono::microseconds timeout, bool* arrived) override {
    if (single()) return Sticky(parts_.front()->WaitForArrival(timeout, arrived));
    std::fill(ready_.begin(), ready_.end(), true);
    return PollCore::WaitForArrival(timeout, arrived);
  }

  void Wake() override {
    if (single()) return parts_.front()->Wake();
    PollCore::Wake();
  }
  void SetPollSpin(std::chrono::microseconds spin) override {
    PollCore::SetPollSpin(spin);
    for (auto& part : parts_) part->SetPollSpin(spin);
  }

  void Abort(const Status& reason) override {
    state_.Fail(Aborted("rank {} aborted: {}", state_.rank, reason.ToString())).IgnoreError();
    for (auto& part : parts_) part->Abort(reason);
  }

  uint64_t bytes_sent() const override {
    uint64_t n = 0;
    for (const auto& part : parts_) n += part->bytes_sent();
    return n;
  }
  uint64_t bytes_received() const override {
    uint64_t n = 0;
    for (const auto& part : parts_) n += part->bytes_received();
    return n;
  }

  double SilentSeconds(int peer) const override {
    if (!has_peer(peer)) return -1;
    return owner_[static_cast<size_t>(peer)]->SilentSeconds(peer);
  }

  // PollableDevice, over the parts.
  bool has_peer(int peer) const override {
    return peer >= 0 && peer < size_ && owner_[static_cast<size_t>(peer)] != nullptr;
  }

  bool TakeCompletions(std::vector<Completion>* out) override {
    bool any = false;
    for (auto& part : parts_) any = part->TakeCompletions(out) || any;
    return any;
  }

  Status CheckArrival(bool* arrived) override {
    *arrived = false;
    for (auto& part : parts_) {
      Status s = part->CheckArrival(arrived);
      if (!s.ok()) return state_.Fail(s);
      if (*arrived) break;
    }
    return Status::OK();
  }

  // Every part arranges its wake-up (all of them, even once one says it need not sleep:
  // AfterSleep undoes them all).
  bool PrepareToSleep(bool for_arrival) override {
    bool sleep = true;
    for (auto& part : parts_) sleep = part->PrepareToSleep(for_arrival) && sleep;
    return sleep;
  }
  void AfterSleep() override {
    for (auto& part : parts_) part->AfterSleep();
  }

  Clock::time_point next_timer() const override {
    Clock::time_point t = Clock::time_point::max();
    for (const auto& part : parts_) t = std::min(t, part->next_timer());
    return t;
  }

  std::string DescribePending() const override { return JoinPending(parts_); }

  std::chrono::milliseconds silence_threshold() const override {
    std::chrono::milliseconds silence = std::chrono::milliseconds::max();
    for (const auto& part : parts_) silence = std::min(silence, part->silence_threshold());
    return silence;
  }

 protected:
  // Steps every part; only the parts whose wait_fd the last sleep reported read their events.
  Status Advance() override {
    for (size_t i = 0; i < parts_.size(); ++i) {
      Status s = parts_[i]->Step(ready_[i]);
      if (!s.ok()) return state_.Fail(s);
      ready_[i] = false;
    }
    return Status::OK();
  }

  Status OnEvent(const epoll_event& event) override {
    ready_[event.data.u64] = true;
    return Status::OK();
  }

 private:
  bool single() const { return parts_.size() == 1; }

  PollableDevice& Owner(int peer) const {
    if (!has_peer(peer)) {
      KOLO_LOG(kError, "auto device of rank {}: pair({}) is not a peer (size {})", state_.rank,
               peer, size_);
      std::abort();
    }
    return *owner_[static_cast<size_t>(peer)];
  }

  // A part's error becomes the device's; a timeout is not an error.
  Status Sticky(const Status& s) {
    if (s.ok() || s.code() == StatusCode::kDeadlineExceeded) return s;
    return state_.Fail(s);
  }

  DeviceState state_;  // the rank and the first error; the parts keep their own completions
  const int size_;
  std::vector<std::unique_ptr<PollableDevice>> parts_;
  std::vector<PollableDevice*> owner_;  // the part with each peer; null at this rank
  std::vector<bool> ready_;             // per part: whether its wait_fd may have events
};

}  // namespace

StatusOr<std::unique_ptr<Device>> CombineDevices(int rank, int size,
                                                 std::vector<std::unique_ptr<PollableDevice>> parts,
                                                 bool busy_poll) {
  if (parts.empty()) return InvalidArgument("rank {}: no device to combine", rank);
  auto device = std::make_unique<CombinedDevice>(rank, size, std::move(parts), busy_poll);
  KOLO_RETURN_IF_ERROR(device->Init());
  return std::unique_ptr<Device>(std::move(device));
}

}  // namespace kolo::transport
