#include "engine/common/fault_inject.h"

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <vector>

#include "engine/common/logging.h"
#include "engine/common/options.h"

namespace kolo {
namespace {

struct Armed {
  int rank = -1;
  int signal = 0;  // 0: an action the caller takes (SKEW, EXIT)
  FaultPointId point = FaultPointId::kSend;
  int64_t at = 0;
};

std::atomic<bool> g_armed{false};
Armed g_fault;  // written before g_armed is set (release), read after it is seen (acquire)
std::atomic<int64_t> g_passes{0};

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> parts(1);
  for (char c : s) {
    if (c == sep) {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  return parts;
}

}  // namespace

Status ConfigureFaultInjection(const std::string& value) {
  g_armed.store(false);
  if (value.empty()) return Status::OK();
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(
        "KOLO_FAULT_INJECT='{}': {}; expected RANK:ACTION:POINT:N with ACTION STOP or KILL and "
        "POINT send, mpi, negotiate or step, or SKEW:negotiate or EXIT:step, N >= 1 (for example "
        "2:STOP:send:500)",
        value, why);
  };
  const std::vector<std::string> parts = Split(value, ':');
  if (parts.size() != 4) return bad(fmt::format("{} fields", parts.size()));
  Armed a;
  KOLO_ASSIGN_OR_RETURN(const int64_t rank,
                        ParseInt("KOLO_FAULT_INJECT rank", parts[0], 0, 1 << 20));
  a.rank = static_cast<int>(rank);
  if (parts[1] == "STOP") {
    a.signal = SIGSTOP;
  } else if (parts[1] == "KILL") {
    a.signal = SIGKILL;
  } else if (parts[1] != "SKEW" && parts[1] != "EXIT") {
    return bad(fmt::format("action '{}'", parts[1]));
  }
  if (parts[2] == "send") {
    a.point = FaultPointId::kSend;
  } else if (parts[2] == "mpi") {
    a.point = FaultPointId::kMpi;
  } else if (parts[2] == "negotiate") {
    a.point = FaultPointId::kNegotiate;
  } else if (parts[2] == "step") {
    a.point = FaultPointId::kStep;
  } else {
    return bad(fmt::format("point '{}'", parts[2]));
  }
  if ((parts[1] == "SKEW" && a.point != FaultPointId::kNegotiate) ||
      (parts[1] == "EXIT" && a.point != FaultPointId::kStep)) {
    return bad(fmt::format("{} at point '{}'", parts[1], parts[2]));
  }
  KOLO_ASSIGN_OR_RETURN(a.at, ParseInt("KOLO_FAULT_INJECT count", parts[3], 1, int64_t{1} << 40));
  g_fault = a;
  g_passes.store(0);
  g_armed.store(true, std::memory_order_release);
  return Status::OK();
}

bool FaultPoint(FaultPointId point, int rank) {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  if (!g_armed.load(std::memory_order_acquire)) return false;
  const Armed& a = g_fault;
  if (a.point != point || a.rank != rank) return false;
  if (g_passes.fetch_add(1) + 1 != a.at) return false;
  if (a.signal == 0) {
    KOLO_LOG(kWarning, "KOLO_FAULT_INJECT: rank {} {} here", rank,
             point == FaultPointId::kNegotiate ? "skews its step check" : "stops training");
    return true;
  }
  KOLO_LOG(kWarning, "KOLO_FAULT_INJECT: rank {} raises SIG{} on itself here", rank,
           a.signal == SIGSTOP ? "STOP" : "KILL");
  std::fflush(stderr);
  ::raise(a.signal);
  return false;
}

namespace {
std::atomic<double> g_ring_slowdown{0.0};
}  // namespace

Status ConfigureRingSlowdown(const std::string& value) {
  double fraction = 0;
  if (!value.empty()) {
    KOLO_ASSIGN_OR_RETURN(fraction, ParseDouble("KOLO_FAULT_SLOW_RING", value, 0, 10));
  }
  g_ring_slowdown.store(fraction);
  return Status::OK();
}

double RingSlowdown() { return g_ring_slowdown.load(std::memory_order_relaxed); }

SlowRingScope::SlowRingScope()
    : fraction_(RingSlowdown()),
      start_(fraction_ > 0 ? std::chrono::steady_clock::now()
                           : std::chrono::steady_clock::time_point{}) {}

SlowRingScope::~SlowRingScope() {
  if (fraction_ <= 0) return;
  // Busy, as extra work in the ring would be: the allreduce costs that much more time and CPU.
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         (std::chrono::steady_clock::now() - start_) * fraction_);
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace kolo
