#include "engine/transport/poll_core.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace kolo::transport {

int RemainingMs(Clock::time_point until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, std::numeric_limits<int>::max()));
}

timespec RemainingTimespec(Clock::time_point until) {
  const auto left = std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(until - Clock::now()).count());
  return timespec{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
}

// Several keepalives per peer timeout, so that a live peer is never silent for long; at most one
// a second (a quiet job costs nothing to speak of), at least every 20 ms.
std::chrono::milliseconds KeepaliveInterval(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 8, std::chrono::milliseconds(20), std::chrono::milliseconds(1000));
}

std::chrono::milliseconds SilenceThreshold(std::chrono::milliseconds timeout) {
  return std::max<std::chrono::milliseconds>(timeout / 2, 3 * KeepaliveInterval(timeout));
}

PollCore::~PollCore() { CloseWaitSet(); }

Status PollCore::InitWaitSet() {
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_ < 0) return ErrnoStatus(StatusCode::kInternal, "epoll_create1", errno);
  wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_ < 0) return ErrnoStatus(StatusCode::kInternal, "eventfd", errno);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev) != 0) {
    return ErrnoStatus(StatusCode::kInternal, "epoll_ctl(ADD, eventfd)", errno);
  }
  return Status::OK();
}

Status PollCore::Watch(int fd, uint32_t events, uint64_t id, std::string_view what) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = id;
  if (::epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    return ErrnoStatus(StatusCode::kInternal, fmt::format("epoll_ctl(ADD, {})", what), errno);
  }
  return Status::OK();
}

void PollCore::CloseWaitSet() {
  if (epoll_ >= 0) ::close(epoll_);
  if (wake_ >= 0) ::close(wake_);
  epoll_ = wake_ = -1;
}

template <typename Done>
Status PollCore::Spin(Done done, Clock::time_point deadline, bool* progressed) {
  *progressed = false;
  if (busy_poll_ || spin_.count() <= 0) return Status::OK();
  const auto until = std::min(deadline, Clock::now() + spin_);
  while (Clock::now() < until) {
    ::sched_yield();
    bool woken = false;
    KOLO_RETURN_IF_ERROR(LookAtEvents(&woken));
    KOLO_RETURN_IF_ERROR(Advance());
    if (done(woken)) {
      *progressed = true;
      return Status::OK();
    }
  }
  return Status::OK();
}

Status PollCore::Poll(std::vector<Completion>* out, std::chrono::milliseconds timeout) {
  if (!state_->error.ok()) return state_->error;
  const auto deadline = Clock::now() + timeout;
  bool woken = false;
  bool expired = false;
  bool spun = false;
  for (;;) {
    KOLO_RETURN_IF_ERROR(Advance());
    if (TakeCompletions(out) || woken) return Status::OK();
    if (expired) return TimedOut(timeout);
    // Once per call, a short spin before the first sleep (SetPollSpin).
    if (!spun) {
      spun = true;
      bool progressed = false;
      KOLO_RETURN_IF_ERROR(
          Spin([&](bool w) { return TakeCompletions(out) || w; }, deadline, &progressed));
      if (progressed) return Status::OK();
    }
    // The round after the deadline only looks: what the last sleep reported, or what moved without
    // an event (none was asked for), still completes rather than timing out.
    expired = Clock::now() >= deadline;
    KOLO_RETURN_IF_ERROR(
        Sleep(!expired, std::min(deadline, next_timer()), /*fine=*/false, false, &woken));
  }
}

Status PollCore::WaitForArrival(std::chrono::microseconds timeout, bool* arrived) {
  *arrived = false;
  if (!state_->error.ok()) return state_->error;
  const auto deadline = Clock::now() + timeout;
  bool woken = false;
  bool spun = false;
  bool looked = false;
  for (;;) {
    // Bytes may have come in while the thread was busy elsewhere (an edge already consumed by an
    // earlier Poll): look before sleeping, and once more after each wake-up.
    KOLO_RETURN_IF_ERROR(Advance());
    KOLO_RETURN_IF_ERROR(CheckArrival(arrived));
    if (*arrived || woken) return Status::OK();
    if (Clock::now() >= deadline) {
      // Out of time before any sleep (a timeout of zero: a look): the events that came since the
      // last are read once, without waiting, so that a look sees what arrived and a peer that is
      // gone (its closed connection), as a sleep would.
      if (looked) return Status::OK();
      looked = true;
      KOLO_RETURN_IF_ERROR(LookAtEvents(&woken));
      continue;
    }
    looked = true;
    if (!spun) {
      spun = true;
      bool progressed = false;
      Status arrival_error;
      KOLO_RETURN_IF_ERROR(Spin(
          [&](bool w) {
            arrival_error = CheckArrival(arrived);
            return !arrival_error.ok() || *arrived || w;
          },
          deadline, &progressed));
      KOLO_RETURN_IF_ERROR(arrival_error);
      if (progressed) return Status::OK();
    }
    // Microsecond resolution: an engine cycle may be shorter than epoll_wait's millisecond.
    KOLO_RETURN_IF_ERROR(
        Sleep(true, std::min(deadline, next_timer()), /*fine=*/true, true, &woken));
  }
}

void PollCore::Wake() {
  const uint64_t one = 1;
  // A full counter (EAGAIN) means a wake-up is already pending: nothing is lost.
  [[maybe_unused]] const ssize_t n = ::write(wake_, &one, sizeof one);
}

Status PollCore::Step(bool events) {
  if (!state_->error.ok()) return state_->error;
  if (events) {
    bool woken = false;
    KOLO_RETURN_IF_ERROR(LookAtEvents(&woken));
  }
  return Advance();
}

Status PollCore::LookAtEvents(bool* woken) {
  return Sleep(false, Clock::now(), /*fine=*/false, false, woken);
}

Status PollCore::SleepUntil(Clock::time_point until, bool for_arrival, bool* woken) {
  return Sleep(true, until, /*fine=*/false, for_arrival, woken);
}

Status PollCore::Sleep(bool may_sleep, Clock::time_point until, bool fine, bool for_arrival,
                       bool* woken) {
  const bool sleep = may_sleep && !busy_poll_;
  int wait_ms = 0;
  timespec wait{0, 0};
  if (sleep && PrepareToSleep(for_arrival)) {
    if (fine) {
      wait = RemainingTimespec(until);
    } else {
      wait_ms = RemainingMs(until);
    }
  }
  epoll_event events[kMaxEvents];
  const int n = fine ? ::epoll_pwait2(epoll_, events, kMaxEvents, &wait, nullptr)
                     : ::epoll_wait(epoll_, events, kMaxEvents, wait_ms);
  const int err = errno;
  if (sleep) AfterSleep();
  if (n < 0) {
    if (err == EINTR) return Status::OK();
    return state_->Fail(
        ErrnoStatus(StatusCode::kInternal, fine ? "epoll_pwait2" : "epoll_wait", err));
  }
  return Dispatch(events, n, woken);
}

Status PollCore::Dispatch(const epoll_event* events, int n, bool* woken) {
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kWakeId) {
      uint64_t count;
      while (::read(wake_, &count, sizeof count) > 0) {
      }
      *woken = true;
    } else {
      KOLO_RETURN_IF_ERROR(OnEvent(events[i]));
    }
  }
  return Status::OK();
}

Status PollCore::TimedOut(std::chrono::milliseconds timeout) const {
  const std::string pending = DescribePending();
  const std::string silent = DescribeSilentPeers(*this, silence_threshold());
  return DeadlineExceeded("rank {}: nothing completed within {} ms; {}pending: {}", rank(),
                          timeout.count(), silent.empty() ? "" : silent + "; ",
                          pending.empty() ? "nothing" : pending);
}

}  // namespace kolo::transport
