#include "engine/transport/tcp/device.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <limits>

#include "engine/common/logging.h"
#include "engine/transport/tcp/mesh.h"
#include "engine/transport/tcp/pair.h"

namespace kolo::transport::tcp {
namespace {

constexpr uint64_t kListenerId = std::numeric_limits<uint64_t>::max();
constexpr uint64_t kWakeId = kListenerId - 1;
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

class TcpDevice final : public PollableDevice {
 public:
  TcpDevice(int rank, int size, const TcpOptions& options, Mesh mesh)
      : size_(size),
        busy_poll_(options.busy_poll),
        keepalive_(KeepaliveInterval(options.timeout)),
        silence_(std::max<std::chrono::milliseconds>(options.timeout / 2, 3 * keepalive_)),
        listener_(std::move(mesh.listener)) {
    state_.rank = rank;
    state_.completions.reserve(1024);
    pairs_.resize(static_cast<size_t>(size));
    for (int peer = 0; peer < size; ++peer) {
      if (peer == rank || !mesh.peers[static_cast<size_t>(peer)].valid()) continue;
      pairs_[static_cast<size_t>(peer)] =
          std::make_unique<TcpPair>(state_, peer, std::move(mesh.peers[static_cast<size_t>(peer)]));
    }
  }

  ~TcpDevice() override {
    if (closed_) return;
    for (auto& p : pairs_) {
      if (p) p->QueueGoodbye();
    }
    CloseAll(kGoodbyeBound);
  }

  Status Init() {
    epoll_ = Fd(::epoll_create1(EPOLL_CLOEXEC));
    if (!epoll_.valid()) return ErrnoStatus(StatusCode::kInternal, "epoll_create1", errno);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerId;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &ev) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "epoll_ctl(ADD, listener)", errno);
    }
    wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_.valid()) return ErrnoStatus(StatusCode::kInternal, "eventfd", errno);
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeId;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &ev) != 0) {
      return ErrnoStatus(StatusCode::kInternal, "epoll_ctl(ADD, eventfd)", errno);
    }
    for (auto& p : pairs_) {
      if (!p) continue;
      // Edge-triggered: a pair keeps its own readable/writable flags, so back-pressure (not
      // reading) costs no epoll_ctl calls and no wake-ups.
      ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
      ev.data.u64 = static_cast<uint64_t>(p->peer());
      if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, p->fd(), &ev) != 0) {
        return ErrnoStatus(StatusCode::kInternal,
                           fmt::format("epoll_ctl(ADD, connection to rank {})", p->peer()), errno);
      }
    }
    return Status::OK();
  }

  int rank() const override { return state_.rank; }
  int size() const override { return size_; }
  const char* name() const override { return "tcp"; }

  StatusOr<std::unique_ptr<Region>> Register(void* data, size_t size) override {
    if (data == nullptr && size > 0) {
      return InvalidArgument("Register: null pointer with size {} (only size 0 may be null)", size);
    }
    return std::make_unique<Region>(data, size);
  }

  Pair& pair(int peer) override {
    if (peer < 0 || peer >= size_ || !pairs_[static_cast<size_t>(peer)]) {
      KOLO_LOG(kError, "tcp device of rank {}: pair({}) is not a peer (size {})", state_.rank, peer,
               size_);
      std::abort();
    }
    return *pairs_[static_cast<size_t>(peer)];
  }

  Status Poll(std::vector<Completion>* out, std::chrono::milliseconds timeout) override {
    if (!state_.error.ok()) return state_.error;
    const auto deadline = Clock::now() + timeout;
    epoll_event events[kMaxEvents];
    for (;;) {
      KOLO_RETURN_IF_ERROR(SendKeepalives());
      const bool have = !state_.completions.empty();
      const int wait_ms =
          (have || busy_poll_) ? 0 : std::min(RemainingMs(deadline), RemainingMs(next_keepalive_));
      const int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, wait_ms);
      if (n < 0 && errno != EINTR) {
        return state_.Fail(ErrnoStatus(StatusCode::kInternal, "epoll_wait", errno));
      }
      bool woken = false;
      KOLO_RETURN_IF_ERROR(Dispatch(events, n, &woken));
      if (!state_.completions.empty()) {
        out->insert(out->end(), state_.completions.begin(), state_.completions.end());
        state_.completions.clear();
        return Status::OK();
      }
      if (woken) return Status::OK();
      if (Clock::now() >= deadline) return TimedOut(timeout);
    }
  }

  Status WaitForArrival(std::chrono::microseconds timeout, bool* arrived) override {
    *arrived = false;
    if (!state_.error.ok()) return state_.error;
    const auto deadline = Clock::now() + timeout;
    epoll_event events[kMaxEvents];
    bool woken = false;
    for (;;) {
      // Bytes may have come in while the thread was busy elsewhere (an edge already consumed by
      // an earlier Poll): look at every pair before sleeping, and once more after each wake-up.
      for (auto& p : pairs_) {
        if (!p) continue;
        KOLO_RETURN_IF_ERROR(p->CheckArrival(arrived));
        if (*arrived) return Status::OK();
      }
      if (woken || Clock::now() >= deadline) return Status::OK();
      KOLO_RETURN_IF_ERROR(SendKeepalives());
      // Microsecond resolution: an engine cycle may be shorter than epoll_wait's millisecond.
      const timespec wait =
          busy_poll_ ? timespec{0, 0} : RemainingTimespec(std::min(deadline, next_keepalive_));
      const int n = ::epoll_pwait2(epoll_.get(), events, kMaxEvents, &wait, nullptr);
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
    for (auto& p : pairs_) {
      if (p) p->QueueAbort(text);
    }
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
    if (!events) return Status::OK();
    epoll_event ready[kMaxEvents];
    const int n = ::epoll_wait(epoll_.get(), ready, kMaxEvents, 0);
    if (n < 0 && errno != EINTR) {
      return state_.Fail(ErrnoStatus(StatusCode::kInternal, "epoll_wait", errno));
    }
    bool woken = false;
    return Dispatch(ready, n, &woken);
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
      if (!p) continue;
      KOLO_RETURN_IF_ERROR(p->CheckArrival(arrived));
      if (*arrived) break;
    }
    return Status::OK();
  }

  // Edge-triggered sockets: an edge not yet taken keeps the epoll set readable, and bytes taken
  // are processed at once; nothing to arrange.
  bool PrepareToSleep(bool /*for_arrival*/) override { return true; }
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

 private:
  // Keepalives go out several times per peer timeout, so that a live peer is never silent for
  // long; at most once a second (a quiet job costs nothing to speak of), at least every 20 ms.
  static std::chrono::milliseconds KeepaliveInterval(std::chrono::milliseconds timeout) {
    return std::clamp(timeout / 8, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
  }

  Status SendKeepalives() {
    const auto now = Clock::now();
    if (now < next_keepalive_) return Status::OK();
    next_keepalive_ = now + keepalive_ / 2;
    for (auto& p : pairs_) {
      if (!p) continue;
      Status s = p->MaybeKeepalive(now, keepalive_);
      if (!s.ok()) return s;
    }
    return Status::OK();
  }

  Status TimedOut(std::chrono::milliseconds timeout) const {
    const std::string pending = DescribePending();
    // Live peers send keepalives while they wait, so the ones silent for half the peer timeout are
    // the ones that stopped: name them first (the pending operations name only the neighbours
    // this rank waits on, which may themselves be waiting on the stopped rank).
    const std::string silent = DescribeSilentPeers(*this, silence_);
    return DeadlineExceeded("rank {}: nothing completed within {} ms; {}pending: {}", state_.rank,
                            timeout.count(), silent.empty() ? "" : silent + "; ",
                            pending.empty() ? "nothing" : pending);
  }

  // Handles what epoll reported: late connections, a Wake (sets *woken), progress on pairs (an
  // error is recorded as the device's and returned).
  Status Dispatch(const epoll_event* events, int n, bool* woken) {
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == kListenerId) {
        RejectLateConnections();
      } else if (events[i].data.u64 == kWakeId) {
        DrainWake();
        *woken = true;
      } else {
        Status s = pairs_[events[i].data.u64]->OnEvents(events[i].events);
        if (!s.ok()) return state_.Fail(s);
      }
    }
    return Status::OK();
  }

  void DrainWake() {
    uint64_t count;
    while (::read(wake_.get(), &count, sizeof count) > 0) {
    }
  }

  void RejectLateConnections() {
    for (;;) {
      Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (!fd.valid()) return;
      KOLO_LOG(kWarning, "rank {}: closed a connection from {}: every peer is already connected",
               state_.rank, PeerAddress(fd.get()));
    }
  }

  // Writes the queued farewell frames on every pair within `bound`, then closes everything.
  void CloseAll(std::chrono::milliseconds bound) {
    closed_ = true;
    const auto deadline = Clock::now() + bound;
    std::vector<pollfd> waiting;
    for (;;) {
      waiting.clear();
      for (auto& p : pairs_) {
        if (p && !p->FlushClosing()) waiting.push_back({p->fd(), POLLOUT, 0});
      }
      if (waiting.empty() || Clock::now() >= deadline) break;
      ::poll(waiting.data(), waiting.size(), RemainingMs(deadline));
    }
    DrainUntilPeersClose(deadline);
    for (auto& p : pairs_) {
      if (p) p->Close();
    }
    listener_.reset();
  }

  // Closing a socket whose receive queue holds unread bytes sends a reset, and a reset makes the
  // peer's kernel drop what it has not yet read — our farewell frame among it. So: half-close,
  // then read and discard until each peer closes its side (peers close promptly once they have
  // read the farewell) or the deadline passes.
  void DrainUntilPeersClose(Clock::time_point deadline) {
    std::vector<pollfd> open;
    for (auto& p : pairs_) {
      if (!p || p->fd() < 0) continue;  // already closed: nothing to wait for
      ::shutdown(p->fd(), SHUT_WR);
      open.push_back({p->fd(), POLLIN, 0});
    }
    char sink[64 * 1024];
    while (!open.empty() && Clock::now() < deadline) {
      if (::poll(open.data(), open.size(), RemainingMs(deadline)) <= 0) break;
      for (size_t i = 0; i < open.size();) {
        bool done = false;
        if (open[i].revents & (POLLIN | POLLHUP | POLLERR)) {
          const ssize_t n = ::recv(open[i].fd, sink, sizeof sink, MSG_DONTWAIT);
          done = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
        }
        if (done) {
          open[i] = open.back();
          open.pop_back();
        } else {
          open[i].revents = 0;
          ++i;
        }
      }
    }
  }

  const int size_;
  const bool busy_poll_;
  const std::chrono::milliseconds keepalive_;
  const std::chrono::milliseconds silence_;  // a peer silent this long has stopped
  Clock::time_point next_keepalive_{};
  DeviceState state_;
  Fd listener_;
  Fd epoll_;
  Fd wake_;                                      // eventfd in the epoll set; Wake writes it
  std::vector<std::unique_ptr<TcpPair>> pairs_;  // null at this rank
  bool closed_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<PollableDevice>> Connect(const TcpOptions& options,
                                                  bootstrap::Store& store, int rank, int size) {
  KOLO_ASSIGN_OR_RETURN(Mesh mesh, BuildMesh(options, store, rank, size));
  auto device = std::make_unique<TcpDevice>(rank, size, options, std::move(mesh));
  KOLO_RETURN_IF_ERROR(device->Init());
  return std::unique_ptr<PollableDevice>(std::move(device));
}

}  // namespace kolo::transport::tcp
