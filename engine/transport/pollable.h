// Internal to the transports: the steps of a Device's Poll, offered separately so that one thread
// can drive several devices with one sleep. The auto transport (auto_device.h) drives a TCP
// device for the peers on other hosts and a shm device for those on this one this way: it sleeps
// in one epoll set that holds each device's wait_fd, and runs the steps in between. Every device
// implements these on PollCore (poll_core.h), whose Poll is the same loop over its own steps.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "engine/transport/transport.h"

namespace kolo::transport {

class PollableDevice : public Device {
 public:
  using Clock = std::chrono::steady_clock;

  // Whether this device has a pair with `peer` (a device may connect only some of the job).
  virtual bool has_peer(int peer) const = 0;

  // A descriptor (the device's epoll set) that becomes readable when the device has events to
  // handle: data, room, a control frame, a lost peer. Valid for the device's lifetime.
  virtual int wait_fd() const = 0;

  // Makes progress without blocking: handles the events wait_fd has (when `events` is true; a
  // caller that knows it has none passes false), moves bytes, sends the keepalives that are due.
  // Completions are kept for TakeCompletions. Errors are sticky, as Poll's.
  virtual Status Step(bool events) = 0;
  // Moves the completions gathered so far to *out; true if there were any.
  virtual bool TakeCompletions(std::vector<Completion>* out) = 0;
  // Whether a message has begun to arrive that no posted receive has taken (WaitForArrival's
  // condition). Errors as Step's.
  virtual Status CheckArrival(bool* arrived) = 0;

  // Called right before the caller sleeps on wait_fd: arranges that wait_fd becomes readable when
  // progress is possible (a shared-memory device asks its peers for doorbells). Returns false when
  // progress is possible already: the caller must Step again instead of sleeping. With
  // `for_arrival`, any arriving message counts. AfterSleep undoes the arrangement.
  virtual bool PrepareToSleep(bool for_arrival) = 0;
  virtual void AfterSleep() = 0;

  // When the device next needs a Step even without events (its keepalives).
  virtual Clock::time_point next_timer() const = 0;
  // The pending operations: "rank P: 1 recv (...)" per pair with any, "; "-separated.
  virtual std::string DescribePending() const = 0;
  // A peer silent this long has stopped (half the peer timeout).
  virtual std::chrono::milliseconds silence_threshold() const = 0;
};

}  // namespace kolo::transport
