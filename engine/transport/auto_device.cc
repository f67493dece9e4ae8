#include "engine/transport/auto_device.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "engine/common/logging.h"

namespace kolo::transport {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kWakeId = std::numeric_limits<uint64_t>::max();
constexpr int kMaxEvents = 16;

int RemainingMs(Clock::time_point until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, std::numeric_limits<int>::max()));
}

timespec RemainingTimespec(Clock::time_point until) {
  const auto left = std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now()).count());
  return timespec{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
}

// Closes a descriptor on destruction.
class OwnedFd {
 public:
  explicit OwnedFd(int fd = -1) : fd_(fd) {}
  ~OwnedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

class CombinedDevice final : public Device {
 public:
  CombinedDevice(int rank, int size, std::vector<std::unique_ptr<PollableDevice>> parts,
                 bool busy_poll)
      : rank_(rank),
        size_(size),
        busy_poll_(busy_poll),
        parts_(std::move(parts)),
        owner_(static_cast<size_t>(size), nullptr),
        epoll_(::epoll_create1(EPOLL_CLOEXEC)),
        wake_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    for (auto& part : parts_) {
      for (int peer = 0; peer < size; ++peer) {
        if (part->has_peer(peer)) owner_[static_cast<size_t>(peer)] = part.get();
      }
    }
  }

  Status Init() {
    if (epoll_.get() < 0) return ErrnoStatus(StatusCode::kInternal, "epoll_create1", errno);
    if (wake_.get() < 0) return ErrnoStatus(StatusCode::kInternal, "eventfd", errno);
    for (int peer = 0; peer < size_; ++peer) {
      const bool owned = owner_[static_cast<size_t>(peer)] != nullptr;
      if (owned == (peer == rank_)) {
        return Internal("rank {}: the combined device has {} for rank {}", rank_,
                        owned ? "a pair" : "no pair", peer);
      }
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeId;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "epoll_ctl(ADD, eventfd)", errno);
    }
    for (size_t i = 0; i < parts_.size(); ++i) {
      ev.events = EPOLLIN;
      ev.data.u64 = i;
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, parts_[i]->wait_fd(), &ev) != 0) {
        return ErrnoStatus(StatusCode::kInternal,
                           fmt::format("epoll_ctl(ADD, the {} device)", parts_[i]->name()), errno);
      }
    }
    return Status::OK();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "auto"; }
  const char* pair_transport(int peer) const override { return Owner(peer).name(); }

  StatusOr<std::unique_ptr<Region>> Register(void* data, size_t size) override {
    // Every part registers for free (a Region is a pointer and a size), so one Region serves all.
    return parts_.front()->Register(data, size);
  }

  Pair& pair(int peer) override { return Owner(peer).pair(peer); }

  Status Poll(std::vector<Completion>* out, std::chrono::milliseconds timeout) override {
    if (single()) return Sticky(parts_.front()->Poll(out, timeout));
    if (!error_.ok()) return error_;
    const auto deadline = Clock::now() + timeout;
    std::vector<bool> ready(parts_.size(), true);
    bool woken = false;
    bool expired = false;
    for (;;) {
      KOLO_RETURN_IF_ERROR(StepAll(ready));
      bool any = false;
      for (auto& part : parts_) any = part->TakeCompletions(out) || any;
      if (any || woken) return Status::OK();
      if (expired) return TimedOut(timeout);
      expired = Clock::now() >= deadline;
      const bool sleep = !busy_poll_ && !expired;
      int wait_ms = 0;
      if (sleep && PrepareAll(false)) {
        wait_ms = std::min(RemainingMs(deadline), RemainingMs(NextTimer()));
      }
      epoll_event events[kMaxEvents];
      const int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, wait_ms);
      if (sleep) AfterAll();
      if (n < 0 && errno != EINTR) {
        return Fail(ErrnoStatus(StatusCode::kInternal, "epoll_wait", errno));
      }
      Mark(events, n, &ready, &woken);
    }
  }

  Status WaitForArrival(std::chrono::microseconds timeout, bool* arrived) override {
    if (single()) return Sticky(parts_.front()->WaitForArrival(timeout, arrived));
    *arrived = false;
    if (!error_.ok()) return error_;
    const auto deadline = Clock::now() + timeout;
    std::vector<bool> ready(parts_.size(), true);
    bool woken = false;
    for (;;) {
      KOLO_RETURN_IF_ERROR(StepAll(ready));
      for (auto& part : parts_) {
        Status s = part->CheckArrival(arrived);
        if (!s.ok()) return Fail(s);
        if (*arrived) return Status::OK();
      }
      if (woken || Clock::now() >= deadline) return Status::OK();
      const bool sleep = !busy_poll_;
      timespec wait{0, 0};
      if (sleep && PrepareAll(true)) wait = RemainingTimespec(std::min(deadline, NextTimer()));
      epoll_event events[kMaxEvents];
      const int n = ::epoll_pwait2(epoll_.get(), events, kMaxEvents, &wait, nullptr);
      if (sleep) AfterAll();
      if (n < 0 && errno != EINTR) {
        return Fail(ErrnoStatus(StatusCode::kInternal, "epoll_pwait2", errno));
      }
      Mark(events, n, &ready, &woken);
    }
  }

  void Wake() override {
    if (single()) return parts_.front()->Wake();
    const uint64_t one = 1;
    // A full counter (EAGAIN) means a wake-up is already pending: nothing is lost.
    [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
  }

  void Abort(const Status& reason) override {
    if (error_.ok()) error_ = Aborted("rank {} aborted: {}", rank_, reason.ToString());
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
    if (peer < 0 || peer >= size_ || owner_[static_cast<size_t>(peer)] == nullptr) return -1;
    return owner_[static_cast<size_t>(peer)]->SilentSeconds(peer);
  }

 private:
  bool single() const { return parts_.size() == 1; }

  PollableDevice& Owner(int peer) const {
    if (peer < 0 || peer >= size_ || owner_[static_cast<size_t>(peer)] == nullptr) {
      KOLO_LOG(kError, "auto device of rank {}: pair({}) is not a peer (size {})", rank_, peer,
               size_);
      std::abort();
    }
    return *owner_[static_cast<size_t>(peer)];
  }

  Status Fail(const Status& s) {
    if (error_.ok()) error_ = s;
    return error_;
  }
  // A part's error becomes the device's; a timeout is not an error.
  Status Sticky(const Status& s) {
    if (s.ok() || s.code() == StatusCode::kDeadlineExceeded) return s;
    return Fail(s);
  }

  Status StepAll(const std::vector<bool>& ready) {
    for (size_t i = 0; i < parts_.size(); ++i) {
      Status s = parts_[i]->Step(ready[i]);
      if (!s.ok()) return Fail(s);
    }
    return Status::OK();
  }

  // Every part arranges its wake-up (all of them, even once one says it need not sleep: AfterAll
  // undoes them all).
  bool PrepareAll(bool for_arrival) {
    bool sleep = true;
    for (auto& part : parts_) sleep = part->PrepareToSleep(for_arrival) && sleep;
    return sleep;
  }
  void AfterAll() {
    for (auto& part : parts_) part->AfterSleep();
  }

  Clock::time_point NextTimer() const {
    Clock::time_point t = Clock::time_point::max();
    for (const auto& part : parts_) t = std::min(t, part->next_timer());
    return t;
  }

  void Mark(const epoll_event* events, int n, std::vector<bool>* ready, bool* woken) {
    std::fill(ready->begin(), ready->end(), false);
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kWakeId) {
        uint64_t count;
        while (::read(wake_.get(), &count, sizeof count) > 0) {
        }
        *woken = true;
      } else {
        (*ready)[events[i].data.u64] = true;
      }
    }
  }

  Status TimedOut(std::chrono::milliseconds timeout) const {
    std::string pending;
    std::chrono::milliseconds silence = std::chrono::milliseconds::max();
    for (const auto& part : parts_) {
      const std::string d = part->DescribePending();
      if (!d.empty()) pending += (pending.empty() ? "" : "; ") + d;
      silence = std::min(silence, part->silence_threshold());
    }
    const std::string silent = DescribeSilentPeers(*this, silence);
    return DeadlineExceeded("rank {}: nothing completed within {} ms; {}pending: {}", rank_,
                            timeout.count(), silent.empty() ? "" : silent + "; ",
                            pending.empty() ? "nothing" : pending);
  }

  const int rank_;
  const int size_;
  const bool busy_poll_;
  std::vector<std::unique_ptr<PollableDevice>> parts_;
  std::vector<PollableDevice*> owner_;  // the part with each peer; null at this rank
  OwnedFd epoll_;                       // each part's wait_fd and wake_
  OwnedFd wake_;                        // eventfd; Wake writes it
  Status error_;
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
