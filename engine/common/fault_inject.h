// Fault injection for the reliability tests (tests/scripts/fault_matrix.sh): makes one rank stop
// or die at a precise point of its own work, beside the real code paths rather than in place of
// them.
//
// KOLO_FAULT_INJECT="RANK:ACTION:POINT:N" — rank RANK takes ACTION the Nth time (N >= 1) it passes
// POINT. Actions STOP and KILL raise that signal on the rank itself, at any point:
//   send       a message of at least 4 KiB posted on kolo's transport, TCP or shared memory
//              (gradient traffic of the ring and of parameter servers: mid-collective);
//   mpi        a blocking collective of the MPI backend about to be entered (the others are in it);
//   negotiate  a negotiation exchange about to start;
//   step       a training step of kolo-train about to start.
// Actions that are not signals, each at its one point:
//   SKEW  (negotiate) the rank's step check records a collective the others did not agree: the
//         ranks are out of step, as a bug in agreement would leave them;
//   EXIT  (step) the rank stops training there and goes on as if its last step were done (its
//         final collectives, its shutdown): a rank that finishes early.
// Unset or empty: nothing is injected (FaultPoint costs one relaxed atomic load).
//
// KOLO_FAULT_SLOW_RING=FRACTION (0 to 10) — a deliberately slower ring, for testing that the
// regression gate catches one: each ring allreduce of the engine spins for FRACTION of its own
// duration after it, as extra work in the ring would (0.1: a ring 10% slower, in time and in
// CPU). Unset or empty: 0.
#pragma once

#include <chrono>
#include <string>

#include "engine/common/status.h"

namespace kolo {

enum class FaultPointId { kSend, kMpi, kNegotiate, kStep };

// Parses `value` (the variable's syntax above) and arms the injection; an empty value disarms
// it. Errors name the value and what is allowed. Called by OptionsFromEnvironment.
Status ConfigureFaultInjection(const std::string& value);

// Counts a pass of `point` on `rank`; on the Nth raises the armed signal, or returns true for an
// armed action that is not a signal (the caller takes it). False otherwise.
bool FaultPoint(FaultPointId point, int rank);

// Parses KOLO_FAULT_SLOW_RING's value (empty: 0); errors name the value and the range.
Status ConfigureRingSlowdown(const std::string& value);
double RingSlowdown();

// Around one ring allreduce: on destruction spins RingSlowdown() times the time it lived.
class SlowRingScope {
 public:
  SlowRingScope();
  ~SlowRingScope();
  SlowRingScope(const SlowRingScope&) = delete;
  SlowRingScope& operator=(const SlowRingScope&) = delete;

 private:
  const double fraction_;
  const std::chrono::steady_clock::time_point start_;
};

}  // namespace kolo
