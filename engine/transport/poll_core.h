// Internal to the transports: the polling core every device is built on. A device plugs its steps
// into PollCore (move bytes without blocking, handle one event of its wait set, arrange a wake-up
// before sleeping) and PollCore runs the one loop that Device::Poll and Device::WaitForArrival
// share: step, hand over what completed, sleep in the device's epoll set until an event, a Wake,
// the next timer or the deadline, and again. The TCP, shm and RDMA devices are PollCores over
// their pairs (paired_device.h); the auto device (auto_device.h) is a PollCore over other devices,
// whose wait sets sit in its own.
#pragma once

#include <sys/epoll.h>
#include <time.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/status.h"
#include "engine/transport/pollable.h"
#include "engine/transport/transport.h"

namespace kolo::transport {

using Clock = std::chrono::steady_clock;

// The time left until `until`, rounded up to whole milliseconds (so that a sleep never ends just
// short of it) and clamped to [0, INT_MAX]: the timeout of epoll_wait and poll.
int RemainingMs(Clock::time_point until);
// The time left until `until` at nanosecond resolution, at least zero: the timeout of
// epoll_pwait2, for waits shorter than a millisecond.
timespec RemainingTimespec(Clock::time_point until);

// Liveness timings derived from a device's peer timeout. A device sends a keepalive on a pair idle
// for KeepaliveInterval(timeout) — min(timeout / 8, 1 s), at least 20 ms — and names a peer silent
// for SilenceThreshold(timeout) — half the timeout, at least three keepalive intervals — as one
// that stopped.
std::chrono::milliseconds KeepaliveInterval(std::chrono::milliseconds timeout);
std::chrono::milliseconds SilenceThreshold(std::chrono::milliseconds timeout);

// The DescribePending() texts of `items` (pointers to pairs, or to devices), the empty ones left
// out, "; "-separated: what a device's DescribePending returns.
template <typename Items>
std::string JoinPending(const Items& items) {
  std::string pending;
  for (const auto& item : items) {
    const std::string d = item->DescribePending();
    if (!d.empty()) pending += (pending.empty() ? "" : "; ") + d;
  }
  return pending;
}

// What the pairs of one device share: finished operations not yet returned by Poll, byte counters
// and the device's first error (sticky). Owned by the device; single-threaded like the device.
struct DeviceState {
  int rank = 0;
  std::vector<Completion> completions;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  Status error;

  // Records `s` as the device error if there is none yet; returns the device error.
  Status Fail(const Status& s) {
    if (error.ok()) error = s;
    return error;
  }
  // Moves the completions to *out; true if there were any.
  bool TakeCompletions(std::vector<Completion>* out) {
    if (completions.empty()) return false;
    out->insert(out->end(), completions.begin(), completions.end());
    completions.clear();
    return true;
  }
};

// A PollableDevice whose Poll, WaitForArrival, Wake and Step are the shared loop over the steps a
// subclass provides. It owns the device's wait set (an epoll set, wait_fd()) and an eventfd in it
// that Wake writes; the subclass adds its own descriptors with Watch.
//
// Poll: Advance, hand over the completions (or return after a Wake), else PrepareToSleep, sleep in
// the wait set until min(deadline, next_timer()) at millisecond resolution, AfterSleep, handle
// what the wait set reported (OnEvent), and again; once the deadline has passed, one more round
// without sleeping, then DeadlineExceeded (TimedOut). WaitForArrival: the same, with
// CheckArrival in place of the completions and microsecond resolution. With busy polling the wait
// set is only looked at, and PrepareToSleep is not called.
//
// Errors: the device state's error is checked on entry and returned (sticky); a failing epoll call
// is recorded there as kInternal naming the call.
class PollCore : public PollableDevice {
 public:
  // `state` is the subclass's; it must outlive this object and is not used before InitWaitSet.
  PollCore(DeviceState* state, bool busy_poll) : state_(state), busy_poll_(busy_poll) {}
  ~PollCore() override;
  PollCore(const PollCore&) = delete;
  PollCore& operator=(const PollCore&) = delete;

  // Device.
  Status Poll(std::vector<Completion>* out, std::chrono::milliseconds timeout) override;
  Status WaitForArrival(std::chrono::microseconds timeout, bool* arrived) override;
  void Wake() override;
  void SetPollSpin(std::chrono::microseconds spin) override { spin_ = spin; }

  // PollableDevice. Step: the sticky error, else the events the wait set holds now (when
  // `events`), then Advance.
  int wait_fd() const final { return epoll_; }
  Status Step(bool events) final;
  bool TakeCompletions(std::vector<Completion>* out) override {
    return state_->TakeCompletions(out);
  }

 protected:
  // The id Watch must not use: the wake-up's.
  static constexpr uint64_t kWakeId = std::numeric_limits<uint64_t>::max();

  // Creates the wait set and the wake-up eventfd in it. Call once, before any other method.
  Status InitWaitSet();
  // Adds `fd` to the wait set with `events` (EPOLLIN, ...) and `id`, which OnEvent receives;
  // `what` names the descriptor in the error ("listener", "connection to rank 3").
  // REQUIRES: id != kWakeId.
  Status Watch(int fd, uint32_t events, uint64_t id, std::string_view what);
  // Closes the wait set and the eventfd (a device tearing down early; also done on destruction).
  // wait_fd() is -1 afterwards.
  void CloseWaitSet();

  // Makes progress without blocking: moves bytes, handles what earlier events left to do, sends
  // the keepalives that are due. Errors are recorded in the device state and returned.
  virtual Status Advance() = 0;
  // Handles one event the wait set reported (never the wake-up's). Errors are recorded in the
  // device state and returned.
  virtual Status OnEvent(const epoll_event& event) = 0;

  // Sleeps in the wait set until an event, a Wake or `until`, handles the events and sets *woken
  // on a Wake. Sleeps not at all when busy polling or when PrepareToSleep(for_arrival) says
  // progress is possible; millisecond resolution (epoll_wait).
  Status SleepUntil(Clock::time_point until, bool for_arrival, bool* woken);

  // Handles the events the wait set holds now, without sleeping; sets *woken on a Wake.
  Status LookAtEvents(bool* woken);

  bool busy_poll() const { return busy_poll_; }
  // Looks for progress without sleeping, yielding the processor between looks, until
  // `done(woken)` holds (then *progressed is true), the spin time passes or `deadline` does.
  template <typename Done>
  Status Spin(Done done, Clock::time_point deadline, bool* progressed);

 private:
  static constexpr int kMaxEvents = 64;

  // The one sleep: when `may_sleep` and not busy polling, PrepareToSleep(for_arrival) and, if it
  // agrees, waits until `until` (epoll_pwait2 at nanosecond resolution when `fine`, else
  // epoll_wait rounded up to milliseconds), AfterSleep; otherwise only looks. Then Dispatch.
  Status Sleep(bool may_sleep, Clock::time_point until, bool fine, bool for_arrival, bool* woken);
  // Hands what the wait set reported to OnEvent; a Wake drains the eventfd and sets *woken.
  Status Dispatch(const epoll_event* events, int n, bool* woken);
  // DeadlineExceeded "rank R: nothing completed within T ms; <silent peers>; pending: <...>".
  // Live peers send keepalives while they wait, so the ones silent for silence_threshold() are the
  // ones that stopped: named first, before the pending operations, which name only the peers this
  // rank waits on (which may themselves be waiting on the stopped one).
  Status TimedOut(std::chrono::milliseconds timeout) const;

  DeviceState* const state_;
  const bool busy_poll_;
  std::chrono::microseconds spin_{0};  // SetPollSpin
  int epoll_ = -1;
  int wake_ = -1;  // eventfd in the epoll set; Wake writes it
};

}  // namespace kolo::transport
