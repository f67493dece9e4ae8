// The engine's background thread: one cycle = drain, negotiate, fuse, execute, complete.
#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "engine/common/logging.h"
#include "engine/engine_impl.h"
#include "engine/fusion/planner.h"
#include "engine/kernels/reduce.h"

namespace kolo {
namespace {

using coordinator::CollectiveType;
using coordinator::Request;
using coordinator::Response;

// Longest idle wait before the loop looks again (a submission or a peer ends it sooner).
constexpr auto kIdleWait = std::chrono::milliseconds(500);

std::string UpperType(CollectiveType t) {
  switch (t) {
    case CollectiveType::kAllreduce:
      return "ALLREDUCE";
    case CollectiveType::kBroadcast:
      return "BROADCAST";
    case CollectiveType::kAllgather:
      return "ALLGATHER";
  }
  return "UNKNOWN";
}

}  // namespace

void Engine::Impl::Loop() {
  if (options.size > 1) SetThreadLogRank(options.rank);
  const int cpus = OnlineCpus();
  if (batch_driver) {
    sched_param param{};
    if (::sched_setscheduler(0, SCHED_BATCH, &param) != 0) {
      KOLO_LOG(kWarning, "could not make the engine thread SCHED_BATCH ({}); it keeps the default",
               std::strerror(errno));
    } else {
      KOLO_LOG(kDebug, "engine thread runs as SCHED_BATCH ({} local ranks, {} processors)",
               options.local_size, cpus);
    }
  }
  while (TakeDriveInBackground()) {
    const bool go_on = Turn(SteadyClock::time_point::max(), /*by_caller=*/false);
    ReleaseDrive(go_on);
    if (!go_on) return;
  }
}

bool Engine::Impl::TakeDriveInBackground() {
  MutexLock lock(drive_mu);
  for (;;) {
    if (ended) return false;
    if (driver == Driver::kNone) {
      const auto until = caller_seen + kCallerLinger;
      if (!caller_drives || device_tensors.load(std::memory_order_acquire) || shutting ||
          work_left || SteadyClock::now() >= until) {
        break;
      }
      drive_cv.WaitUntil(drive_mu, until);
    } else {
      // A caller drives. It wakes this thread when it lets go with work left or the engine ended;
      // otherwise this thread looks again a linger later.
      drive_cv.WaitUntil(drive_mu, SteadyClock::now() + kCallerLinger);
    }
  }
  driver = Driver::kBackground;
  work_left = false;
  return true;
}

void Engine::Impl::ReleaseDrive(bool go_on) {
  MutexLock lock(drive_mu);
  // Read while this thread still drives (Drain, Find and Complete are the driver's), and under
  // drive_mu, so that a caller that submits and then finds this thread driving is counted here.
  const bool left = go_on && !ops.Idle();
  const bool by_caller = driver == Driver::kCaller;
  driver = Driver::kNone;
  // A caller asleep on a handle this cycle may have completed comes back from it now.
  if (by_caller || callers_asleep > 0) caller_seen = SteadyClock::now();
  if (!go_on) ended = true;
  work_left = left;
  // The background thread sleeps while a caller drives: wake it where it must take over.
  if (by_caller && (left || !go_on || shutting)) drive_cv.notify_all();
}

bool Engine::Impl::DriveUntilDone(int64_t id, SteadyClock::time_point deadline) {
  // A wait on a handle already done (or unknown: the table's Wait says so) drives nothing, and
  // does not hold the background thread back.
  if (StatusOr<bool> done = ops.Poll(id); !done.ok() || *done) return true;
  if (!caller_drives || device_tensors.load(std::memory_order_acquire)) return false;
  // A cycle, once started, runs to its end, bounded by the peer timeout: a caller whose wait
  // ends sooner sleeps instead, so that its timeout holds.
  if (deadline - SteadyClock::now() < peer_timeout) return false;
  {
    MutexLock lock(drive_mu);
    caller_seen = SteadyClock::now();
    if (ended || driver != Driver::kNone) return false;
    driver = Driver::kCaller;
  }
  if (options.size > 1) SetThreadLogRank(options.rank);
  // The driver runs under the background thread's policy (KOLO_ENGINE_SCHED): a caller's thread
  // at the default policy takes SCHED_BATCH while it drives, where the ranks outnumber the
  // processors, and gets its policy back after. (A caller at a real-time policy keeps it.)
  sched_param batch_param{};
  const bool batch = batch_driver && ::sched_getscheduler(0) == SCHED_OTHER &&
                     ::sched_setscheduler(0, SCHED_BATCH, &batch_param) == 0;
  bool go_on = true;
  bool finished = false;
  for (;;) {
    StatusOr<bool> done = ops.Poll(id);
    finished = !done.ok() || *done;
    if (finished || SteadyClock::now() >= deadline) break;
    if (device_tensors.load(std::memory_order_acquire)) break;
    go_on = Turn(deadline, /*by_caller=*/true);
    if (!go_on) break;
  }
  ReleaseDrive(go_on);
  if (batch) {
    sched_param param{};
    ::sched_setscheduler(0, SCHED_OTHER, &param);
  }
  return finished;
}

SteadyClock::duration Engine::Impl::Cycle() const {
  return std::chrono::duration_cast<SteadyClock::duration>(
      std::chrono::duration<double, std::milli>(cycle_time_ms.load(std::memory_order_relaxed)));
}

bool Engine::Impl::Turn(SteadyClock::time_point give_up, bool by_caller) {
  bool due = false;
  Status s = AwaitCycle(Cycle(), give_up, &due);
  if (s.ok() && !due) return true;
  last_start = SteadyClock::now();
  bool stop = false;
  bool ran = true;
  if (s.ok()) s = RunCycle(by_caller, &stop, &ran);
  if (s.ok() && !ran) return true;
  last_end = SteadyClock::now();
  if (s.ok() && by_caller) {
    MutexLock lock(mu);
    ++stats.caller_cycles;
  }
  if (!s.ok()) {
    // Across hosts, an error naming a rank names its host too.
    s = Status(s.code(), hosts.NameHosts(s.message()));
    KOLO_LOG(kError, "engine failed: {}", s.ToString());
    // An error every rank reaches on its own in the same exchange needs no abort, which would
    // overtake the message that tells the other ranks why.
    if (!controller->FailedEverywhere()) device->Abort(s);
    ops.FailAll(s, /*fatal_error=*/true);
    return false;
  }
  if (stop) {
    // What still waits here waited on ranks that are gone: say which asked to stop.
    const int by = controller->ShutDownBy();
    std::string why = "the engine has shut down";
    if (by == coordinator::Controller::kSeveralRanks) {
      why += ": several ranks shut down (finished, failed or were interrupted) while this waited";
    } else if (by >= 0 && by != options.rank) {
      why += fmt::format(
          ": rank {} shut down (it finished, failed or was interrupted) while this waited", by);
    }
    ops.FailAll(FailedPrecondition("{}", why), /*fatal_error=*/false);
    return false;
  }
  return true;
}

bool Engine::Impl::HasNews(SteadyClock::time_point now) {
  // Submissions are handed to the controller as soon as they are seen, so that it can tell
  // whether peers already wait on them (Controller::Urgent). RequestIdle is only asked while the
  // controller has no news, so that a rank holding news for its tick is not woken by every
  // submission that comes meanwhile.
  if (controller->HasNews(now)) {
    DrainQueue();
    return true;
  }
  if (ops.RequestIdle()) return false;
  DrainQueue();
  return true;
}

Status Engine::Impl::AwaitCycle(SteadyClock::duration cycle, SteadyClock::time_point give_up,
                                bool* due) {
  *due = false;
  // The tick this rank waits for while it has news; time_point::max() while it has none. (Not a
  // std::optional: GCC 12 at -Os reports its value as maybe uninitialized, GCC bug 80635.)
  constexpr auto kNoTick = SteadyClock::time_point::max();
  SteadyClock::time_point tick = kNoTick;
  // Time spent holding news back for the cycle grid (counted in stats.gather_us).
  SteadyClock::duration held{0};
  const auto count_held = [&] {
    if (held.count() == 0) return;
    MutexLock lock(mu);
    stats.gather_us += std::chrono::duration<double, std::micro>(held).count();
  };
  // News that came while the last cycle ran (submissions trickling or in a burst) is what the
  // grid gathers for fusion: hold again. Then, per hold, whether it gathered anything more.
  bool first = true;
  int64_t drained_at_hold = 0;
  const auto end_hold = [&] {
    if (tick == kNoTick || held.count() == 0) return;
    lone_holds = drained_total > drained_at_hold ? 0 : lone_holds + 1;
  };
  for (;;) {
    // Read before looking for news, so that a submission after the look rings a bell heard.
    const uint32_t rung = exchange_through_area ? collectives::HostDoorbell(*comm.host_area) : 0;
    const auto now = SteadyClock::now();
    SteadyClock::time_point until;
    if (first) earliest_drained = SteadyClock::time_point::max();
    const bool news = HasNews(now);
    // (A submission made after the last cycle ended, as a caller's that then drives, came
    // between cycles, not during one.)
    if (first && news && earliest_drained < last_end) lone_holds = 0;
    first = false;
    if (news) {
      // Peers already wait on what this rank just submitted: go now.
      if (controller->Urgent()) tick = now;
      if (tick == kNoTick) {
        // (A single rank has nobody to wait for: it keeps the grid, which only gathers.)
        if (options.size > 1 && (now - last_start >= cycle || lone_holds >= kLoneHoldsToStop)) {
          // Idle for a whole cycle (nothing submitted earlier waits to be fused with this news),
          // or the last holds gathered nothing: holding a lone small collective for the next
          // tick would cost it up to a cycle (half of one on average) of pure latency. Go now.
          tick = now;
        } else {
          // The next tick on this rank's grid: submissions gather for up to a cycle, as they
          // would under a fixed cycle, and ranks that last met in an exchange share the grid.
          const auto ticks = (now - last_start + cycle - SteadyClock::duration(1)) / cycle;
          tick = last_start + std::max<int64_t>(ticks, 1) * cycle;
          drained_at_hold = drained_total;
        }
      }
      if (tick <= now) {
        end_hold();
        count_held();
        *due = true;
        return Status::OK();
      }
      until = tick;
    } else {
      tick = kNoTick;
      // Idle: only a submission (Wake), a peer's exchange or what the controller has due (a
      // cache hit's stall time, rank 0's next stall check) ends it.
      until = std::min(now + kIdleWait, controller->NextDue());
    }
    if (now >= give_up) {
      count_held();
      return Status::OK();
    }
    until = std::min(until, give_up);
    bool arrived = false;
    if (exchange_through_area) {
      // A peer that enters an exchange says so in the host area, not with a message.
      KOLO_RETURN_IF_ERROR(collectives::AwaitHostDoorbell(comm, rung, until, &arrived));
    } else {
      KOLO_RETURN_IF_ERROR(device->WaitForArrival(
          std::chrono::duration_cast<std::chrono::microseconds>(until - now) +
              std::chrono::microseconds(1),
          &arrived));
    }
    if (tick != kNoTick) held += SteadyClock::now() - now;
    if (arrived) {
      end_hold();
      count_held();
      *due = true;
      return Status::OK();
    }
  }
}

void Engine::Impl::DrainQueue() {
  for (const execution::Operation* op : ops.Drain()) {
    ++drained_total;
    earliest_drained = std::min(earliest_drained, op->submitted);
    if (timeline) {
      timeline->End(op->request.name, "QUEUE");
      timeline->Begin(op->request.name, "NEGOTIATE_" + UpperType(op->request.type));
    }
    controller->Add(op->request, op->submitted);
  }
}

Status Engine::Impl::RunCycle(bool by_caller, bool* stop, bool* ran) {
  DrainQueue();
  // A device tensor drained here (its flag was set before it was queued) runs on the background
  // thread only: a caller leaves this cycle to it (the drained requests wait in the controller).
  *ran = !(by_caller && device_tensors.load(std::memory_order_acquire));
  if (!*ran) return Status::OK();
  std::vector<Response> responses;
  bool riding = false;
  KOLO_RETURN_IF_ERROR(Negotiate(&responses, stop, &riding));
  if (timeline) {
    // The negotiation DrainQueue began ends for every agreed tensor this rank has.
    for (const Response& r : responses) {
      if (ops.Find(r.request.name) != nullptr) {
        timeline->End(r.request.name, "NEGOTIATE_" + UpperType(r.request.type));
      }
    }
  }
  if (riding) {
    KOLO_RETURN_IF_ERROR(executor->CompleteRiding(responses, ops));
  } else {
    KOLO_RETURN_IF_ERROR(executor->Execute(responses, ops));
  }
  KOLO_RETURN_IF_ERROR(ApplyRetunes(responses));
  MutexLock lock(mu);
  ++stats.cycles;
  return Status::OK();
}

Status Engine::Impl::ApplyRetunes(const std::vector<Response>& responses) {
  // Per cycle: no lock unless a switch is pending.
  if (retunes_pending.load(std::memory_order_acquire) == 0) return Status::OK();
  std::vector<Engine::Tunables> due;
  {
    MutexLock lock(mu);
    for (const Response& r : responses) {
      auto it = pending_retunes.find(r.request.name);
      if (it == pending_retunes.end()) continue;
      due.push_back(it->second);
      pending_retunes.erase(it);
      retunes_pending.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  for (const Engine::Tunables& t : due) {
    // Checked by Retune before its collective was submitted.
    KOLO_ASSIGN_OR_RETURN(const collectives::AllreduceAlgorithm algorithm,
                          collectives::ParseAllreduceAlgorithm(t.allreduce_algorithm));
    for (auto& b : backends) {
      if (std::string(b->name()) != "ring") continue;
      // Hierarchical first: Retune checked the pair, and the algorithm's check reads it.
      if (hierarchical_groups)
        KOLO_RETURN_IF_ERROR(b->SetHierarchicalAllreduce(t.hierarchical_allreduce));
      KOLO_RETURN_IF_ERROR(b->SetAllreduceAlgorithm(algorithm));
    }
    executor->set_fusion_threshold_bytes(t.fusion_threshold_bytes);
    riding_allowed = t.allreduce_algorithm == "auto";
    cycle_time_ms.store(t.cycle_time_ms, std::memory_order_relaxed);
    KOLO_LOG(kInfo,
             "retuned: fusion threshold {} bytes, cycle time {} ms, allreduce algorithm {}, "
             "hierarchical {}",
             t.fusion_threshold_bytes, t.cycle_time_ms, t.allreduce_algorithm,
             t.hierarchical_allreduce ? "on" : "off");
    MutexLock lock(mu);
    tunables = t;
  }
  return Status::OK();
}

Status Engine::Impl::Negotiate(std::vector<Response>* responses, bool* stop, bool* riding) {
  const auto start = SteadyClock::now();
  const bool shutdown = ops.shutdown_requested();
  coordinator::NegotiationStats agreed;
  KOLO_RETURN_IF_ERROR(controller->Negotiate(shutdown, responses, stop, &agreed));
  *riding = agreed.riding;
  const double us = std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count();
  MutexLock lock(mu);
  stats.cache_hits += agreed.cache_hits;
  stats.negotiations += agreed.rounds;
  // Idle cycles (nothing agreed) cost no step anything; only cycles that release work count.
  // A single rank agrees with nobody: its cycles cost no coordination.
  if (!responses->empty() && options.size > 1) stats.coordination_us += us;
  return Status::OK();
}

void Engine::Impl::Count(const execution::ExecutionStats& delta) {
  MutexLock lock(mu);
  stats.collectives += delta.collectives;
  stats.riding_collectives += delta.riding;
  stats.fused_bytes += delta.fused_bytes;
  stats.packed_bytes += delta.packed_bytes;
  stats.allreduce_bytes += delta.allreduce_bytes;
  stats.allreduce_wire_bytes += delta.allreduce_wire_bytes;
  stats.execute_us += delta.execute_us;
  // Counted before the collective's tensors complete, so that a caller that has waited for them
  // sees their bytes. The device's counters belong to this (the background) thread.
  if (comm.device != nullptr) {
    // With the host area (one-shot allreduces), what went through it counts too.
    const uint64_t area_out = comm.host_area != nullptr ? comm.host_area->bytes_written : 0;
    const uint64_t area_in = comm.host_area != nullptr ? comm.host_area->bytes_read : 0;
    stats.transport_bytes_sent = static_cast<int64_t>(comm.device->bytes_sent() + area_out);
    stats.transport_bytes_received = static_cast<int64_t>(comm.device->bytes_received() + area_in);
  }
}

}  // namespace kolo
