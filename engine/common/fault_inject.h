// Fault injection for the reliability tests (tests/scripts/fault_matrix.sh): makes one rank stop
// or die at a precise point of its own work, beside the real code paths rather than in place of
// them.
//
// KOLO_FAULT_INJECT="RANK:SIGNAL:POINT:N" — rank RANK raises SIGNAL (STOP or KILL) on itself the
// Nth time (N >= 1) it passes POINT:
//   send  a message of at least 4 KiB posted on the TCP transport (gradient traffic of the ring
//         and of parameter servers: the rank stops or dies mid-collective);
//   mpi   a blocking collective of the MPI backend about to be entered (the other ranks are in it).
// Unset or empty: nothing is injected (FaultPoint costs one relaxed atomic load).
#pragma once

#include <string>

#include "engine/common/status.h"

namespace kolo {

enum class FaultPointId { kSend, kMpi };

// Parses `value` (the variable's syntax above) and arms the injection; an empty value disarms
// it. Errors name the value and what is allowed. Called by OptionsFromEnvironment.
Status ConfigureFaultInjection(const std::string& value);

// Counts a pass of `point` on `rank` and raises the armed signal on the Nth.
void FaultPoint(FaultPointId point, int rank);

}  // namespace kolo
