#include "engine/transport/shm/device.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "engine/common/logging.h"
#include "engine/transport/shm/mesh.h"
#include "engine/transport/shm/pair.h"

namespace kolo::transport::shm {
namespace {

constexpr uint64_t kWakeId = std::numeric_limits<uint64_t>::max();
constexpr int kMaxEvents = 64;
// Bounds on the best-effort farewell frames: a peer that does not read cannot hold us longer.
constexpr std::chrono::milliseconds kAbortBound{1000};
constexpr std::chrono::milliseconds kGoodbyeBound{200};

int RemainingMs(Clock::time_point until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, std::numeric_limits<int>::max()));
}

timespec RemainingTimespec(Clock::time_point until) {
  const auto left = std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now()).count());
  return timespec{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
}

// Keepalives go out several times per peer timeout, as the TCP transport's do.
std::chrono::milliseconds KeepaliveInterval(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 8, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
}

class ShmDevice final : public PollableDevice {
 public:
  ShmDevice(int rank, int size, const ShmOptions& options, std::vector<Link> links)
      : size_(size),
        busy_poll_(options.busy_poll),
        keepalive_(KeepaliveInterval(options.timeout)),
        silence_(std::max<std::chrono::milliseconds>(options.timeout / 2, 3 * keepalive_)) {
    state_.rank = rank;
    state_.completions.reserve(1024);
    pairs_.resize(static_cast<size_t>(size));
    for (int peer = 0; peer < size; ++peer) {
      Link& link = links[static_cast<size_t>(peer)];
      if (!link.socket.valid()) continue;
      pairs_[static_cast<size_t>(peer)] =
          std::make_unique<ShmPair>(state_, peer, std::move(link.socket), std::move(link.segment));
      live_.push_back(pairs_[static_cast<size_t>(peer)].get());
    }
  }

  ~ShmDevice() override {
    if (closed_) return;
    for (ShmPair* p : live_) p->QueueGoodbye();
    CloseAll(kGoodbyeBound);
  }

  Status Init() {
    epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_.valid()) return ErrnoStatus(StatusCode::kInternal, "epoll_create1", errno);
    wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_.valid()) return ErrnoStatus(StatusCode::kInternal, "eventfd", errno);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeId;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "epoll_ctl(ADD, eventfd)", errno);
    }
    for (ShmPair* p : live_) {
      // Level-triggered: every readable event is read to the end, and only control frames come
      // this way (a few bytes), never data.
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = static_cast<uint64_t>(p->peer());
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, p->fd(), &ev) != 0) {
        return ErrnoStatus(StatusCode::kInternal,
                           fmt::format("epoll_ctl(ADD, socket of rank {})", p->peer()), errno);
      }
    }
    return Status::OK();
  }

  int rank() const override { return state_.rank; }
  int size() const override { return size_; }
  const char* name() const override { return "shm"; }

  StatusOr<std::unique_ptr<Region>> Register(void* data, size_t size) override {
    if (data == nullptr && size > 0) {
      return InvalidArgument("Register: null pointer with size {} (only size 0 may be null)", size);
    }
    return std::make_unique<Region>(data, size);
  }

  Pair& pair(int peer) override {
    if (peer < 0 || peer >= size_ || !pairs_[static_cast<size_t>(peer)]) {
      KOLO_LOG(kError, "shm device of rank {}: pair({}) is not a peer on this host (size {})",
               state_.rank, peer, size_);
      std::abort();
    }
    return *pairs_[static_cast<size_t>(peer)];
  }

  Status Poll(std::vector<Completion>* out, std::chrono::milliseconds timeout) override {
    if (!state_.error.ok()) return state_.error;
    const auto deadline = Clock::now() + timeout;
    epoll_event events[kMaxEvents];
    bool woken = false;
    for (;;) {
      KOLO_RETURN_IF_ERROR(SendKeepalives());
      KOLO_RETURN_IF_ERROR(ProgressAll());
      if (TakeCompletions(out) || woken) return Status::OK();
      int wait_ms = 0;
      const bool sleep = !busy_poll_ && Clock::now() < deadline;
      if (sleep && PrepareToSleep(false)) {
        wait_ms = std::min(RemainingMs(deadline), RemainingMs(next_keepalive_));
      }
      const int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, wait_ms);
      if (sleep) AfterSleep();
      if (n < 0 && errno != EINTR) {
        return state_.Fail(ErrnoStatus(StatusCode::kInternal, "epoll_wait", errno));
      }
      KOLO_RETURN_IF_ERROR(Dispatch(events, n, &woken));
      if (state_.completions.empty() && !woken && Clock::now() >= deadline) {
        // One last look: the ring may have moved without a doorbell (none was asked for).
        KOLO_RETURN_IF_ERROR(ProgressAll());
        if (TakeCompletions(out)) return Status::OK();
        return TimedOut(timeout);
      }
    }
  }

  Status WaitForArrival(std::chrono::microseconds timeout, bool* arrived) override {
    *arrived = false;
    if (!state_.error.ok()) return state_.error;
    const auto deadline = Clock::now() + timeout;
    epoll_event events[kMaxEvents];
    bool woken = false;
    for (;;) {
      KOLO_RETURN_IF_ERROR(CheckArrival(arrived));
      if (*arrived || woken || Clock::now() >= deadline) return Status::OK();
      KOLO_RETURN_IF_ERROR(SendKeepalives());
      KOLO_RETURN_IF_ERROR(ProgressAll());
      const bool sleep = !busy_poll_;
      // Microsecond resolution: an engine cycle may be shorter than epoll_wait's millisecond.
      timespec wait{0, 0};
      if (sleep && PrepareToSleep(true))
        wait = RemainingTimespec(std::min(deadline, next_keepalive_));
      const int n = ::epoll_pwait2(epoll_.get(), events, kMaxEvents, &wait, nullptr);
      if (sleep) AfterSleep();
      if (n < 0 && errno != EINTR) {
        return state_.Fail(ErrnoStatus(StatusCode::kInternal, "epoll_pwait2", errno));
      }
      KOLO_RETURN_IF_ERROR(Dispatch(events, n, &woken));
    }
  }

  void Abort(const Status& reason) override {
    if (closed_) return;
    state_.Fail(Aborted("rank {} aborted: {}", state_.rank, reason.ToString())).IgnoreError();
    const std::string text = reason.ToString();
    for (ShmPair* p : live_) p->QueueAbort(text);
    CloseAll(kAbortBound);
  }

  void Wake() override {
    const uint64_t one = 1;
    // A full counter (EAGAIN) means a wake-up is already pending: nothing is lost.
    [[maybe_unused]] const ssize_t n = ::write(wake_.get(), &one, sizeof one);
  }

  uint64_t bytes_sent() const override { return state_.bytes_sent; }
  uint64_t bytes_received() const override { return state_.bytes_received; }

  double SilentSeconds(int peer) const override {
    if (peer < 0 || peer >= size_ || !pairs_[static_cast<size_t>(peer)]) return -1;
    return std::chrono::duration<double>(pairs_[static_cast<size_t>(peer)]->SilentFor(Clock::now()))
        .count();
  }

  // PollableDevice.
  bool has_peer(int peer) const override {
    return peer >= 0 && peer < size_ && pairs_[static_cast<size_t>(peer)] != nullptr;
  }
  int wait_fd() const override { return epoll_.get(); }

  Status Step(bool events) override {
    if (!state_.error.ok()) return state_.error;
    KOLO_RETURN_IF_ERROR(SendKeepalives());
    if (events) {
      epoll_event ready[kMaxEvents];
      const int n = ::epoll_wait(epoll_.get(), ready, kMaxEvents, 0);
      if (n < 0 && errno != EINTR) {
        return state_.Fail(ErrnoStatus(StatusCode::kInternal, "epoll_wait", errno));
      }
      bool woken = false;
      KOLO_RETURN_IF_ERROR(Dispatch(ready, n, &woken));
    }
    return ProgressAll();
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
    for (ShmPair* p : live_) {
      if (p->Arrived()) {
        *arrived = true;
        break;
      }
    }
    return Status::OK();
  }

  bool PrepareToSleep(bool for_arrival) override {
    bool sleep = true;
    for (ShmPair* p : live_) sleep = p->Arm(for_arrival) && sleep;
    return sleep;
  }

  void AfterSleep() override {
    for (ShmPair* p : live_) p->Disarm();
  }

  Clock::time_point next_timer() const override { return next_keepalive_; }

  std::string DescribePending() const override {
    std::string pending;
    for (const ShmPair* p : live_) {
      const std::string d = p->DescribePending();
      if (!d.empty()) pending += (pending.empty() ? "" : "; ") + d;
    }
    return pending;
  }

  std::chrono::milliseconds silence_threshold() const override { return silence_; }

 private:
  Status ProgressAll() {
    for (ShmPair* p : live_) KOLO_RETURN_IF_ERROR(p->Progress());
    return Status::OK();
  }

  Status SendKeepalives() {
    const auto now = Clock::now();
    if (now < next_keepalive_) return Status::OK();
    next_keepalive_ = now + keepalive_ / 2;
    for (ShmPair* p : live_) KOLO_RETURN_IF_ERROR(p->MaybeKeepalive(now, keepalive_));
    return Status::OK();
  }

  Status TimedOut(std::chrono::milliseconds timeout) const {
    const std::string pending = DescribePending();
    // Live peers send keepalives while they wait, so the ones silent for half the peer timeout are
    // the ones that stopped: name them first.
    const std::string silent = DescribeSilentPeers(*this, silence_);
    return DeadlineExceeded("rank {}: nothing completed within {} ms; {}pending: {}", state_.rank,
                            timeout.count(), silent.empty() ? "" : silent + "; ",
                            pending.empty() ? "nothing" : pending);
  }

  Status Dispatch(const epoll_event* events, int n, bool* woken) {
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kWakeId) {
        uint64_t count;
        while (::read(wake_.get(), &count, sizeof count) > 0) {
        }
        *woken = true;
      } else {
        ShmPair* p = pairs_[events[i].data.u64].get();
        if (p->fd() < 0) continue;  // closed by an earlier event of this batch
        KOLO_RETURN_IF_ERROR(p->OnReadable());
      }
    }
    return Status::OK();
  }

  // Writes the queued farewell frames on every pair within `bound`, then closes the sockets.
  void CloseAll(std::chrono::milliseconds bound) {
    closed_ = true;
    const auto deadline = Clock::now() + bound;
    std::vector<pollfd> waiting;
    for (;;) {
      waiting.clear();
      for (ShmPair* p : live_) {
        if (!p->FlushClosing()) waiting.push_back({p->fd(), POLLOUT, 0});
      }
      if (waiting.empty() || Clock::now() >= deadline) break;
      ::poll(waiting.data(), waiting.size(), RemainingMs(deadline));
    }
    for (ShmPair* p : live_) p->Close();
  }

  const int size_;
  const bool busy_poll_;
  const std::chrono::milliseconds keepalive_;
  const std::chrono::milliseconds silence_;  // a peer silent this long has stopped
  Clock::time_point next_keepalive_{};
  ShmState state_;
  Fd epoll_;
  Fd wake_;                                      // eventfd in the epoll set; Wake writes it
  std::vector<std::unique_ptr<ShmPair>> pairs_;  // null at this rank and for other hosts' ranks
  std::vector<ShmPair*> live_;                   // the pairs, in rank order
  bool closed_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<PollableDevice>> Connect(const ShmOptions& options,
                                                  bootstrap::Store& store, int rank, int size,
                                                  const std::vector<int>& peers) {
  KOLO_ASSIGN_OR_RETURN(std::vector<Link> links, BuildMesh(options, store, rank, size, peers));
  auto device = std::make_unique<ShmDevice>(rank, size, options, std::move(links));
  KOLO_RETURN_IF_ERROR(device->Init());
  return std::unique_ptr<PollableDevice>(std::move(device));
}

}  // namespace kolo::transport::shm
