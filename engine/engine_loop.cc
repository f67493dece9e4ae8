// The engine's background thread: one cycle = drain, negotiate, fuse, execute, complete.
#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "engine/collectives/reduce.h"
#include "engine/common/logging.h"
#include "engine/engine_impl.h"
#include "engine/fusion/planner.h"

namespace kolo {
namespace {

using coordinator::CollectiveType;
using coordinator::Request;
using coordinator::Response;

constexpr uint64_t kFlagUncached = 1;  // some rank has requests for the coordinator
constexpr uint64_t kFlagShutdown = 2;  // some rank asked to shut down
// How often rank 0 inspects the coordinator's table for stalls while something waits there.
constexpr auto kStallCheckEvery = std::chrono::seconds(1);
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
  if (EngineThreadIsBatch(options.engine_sched, options.local_size, cpus)) {
    sched_param param{};
    if (::sched_setscheduler(0, SCHED_BATCH, &param) != 0) {
      KOLO_LOG(kWarning, "could not make the engine thread SCHED_BATCH ({}); it keeps the default",
               std::strerror(errno));
    } else {
      KOLO_LOG(kDebug, "engine thread runs as SCHED_BATCH ({} local ranks, {} processors)",
               options.local_size, cpus);
    }
  }
  const auto cycle = std::chrono::duration_cast<SteadyClock::duration>(
      std::chrono::duration<double, std::milli>(options.cycle_time_ms));
  auto last_start = SteadyClock::now() - cycle;
  while (true) {
    Status s = AwaitCycle(cycle, last_start);
    last_start = SteadyClock::now();
    bool stop = false;
    if (s.ok()) s = RunCycle(&stop);
    if (!s.ok()) {
      KOLO_LOG(kError, "engine failed: {}", s.ToString());
      device->Abort(s);
      FailEverything(s, /*fatal_error=*/true);
      return;
    }
    if (stop) {
      FailEverything(FailedPrecondition("the engine has shut down"), /*fatal_error=*/false);
      return;
    }
  }
}

SteadyClock::duration Engine::Impl::HitStallAfter(const Options& o) {
  double s = o.stall_warning_s;
  if (o.stall_shutdown_s > 0 && (s <= 0 || o.stall_shutdown_s < s)) s = o.stall_shutdown_s;
  return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(s));
}

void Engine::Impl::UpdateHitStallDue() {
  hit_stall_due = SteadyClock::time_point::max();
  if (hit_stall_after <= SteadyClock::duration::zero()) return;
  for (const auto& [name, entry] : pending) {
    if (entry.cache_bit >= 0) {
      hit_stall_due = std::min(hit_stall_due, entry.submitted + hit_stall_after);
    }
  }
}

bool Engine::Impl::HasNews(SteadyClock::time_point now) {
  if (!unreported.empty()) return true;
  if (now >= hit_stall_due) return true;
  if (table && table->pending() > 0 && now - last_stall_check > kStallCheckEvery) return true;
  std::lock_guard<std::mutex> lock(mu);
  idle = queue.empty() && !shutdown_requested;
  return !idle;
}

Status Engine::Impl::AwaitCycle(SteadyClock::duration cycle, SteadyClock::time_point last_start) {
  std::optional<SteadyClock::time_point> tick;
  for (;;) {
    const auto now = SteadyClock::now();
    SteadyClock::time_point until;
    if (HasNews(now)) {
      // The next tick on this rank's grid: submissions gather for up to a cycle, as they would
      // under a fixed cycle, and ranks that last met in an exchange share the grid.
      if (!tick) {
        const auto ticks = (now - last_start + cycle - SteadyClock::duration(1)) / cycle;
        tick = last_start + std::max<int64_t>(ticks, 1) * cycle;
      }
      if (*tick <= now) return Status::OK();
      until = *tick;
    } else {
      tick.reset();
      // Idle: only a submission (Wake), a peer's exchange or rank 0's next stall check ends it.
      until = std::min(now + kIdleWait, hit_stall_due);
      if (table && table->pending() > 0)
        until = std::min(until, last_stall_check + kStallCheckEvery);
    }
    bool arrived = false;
    KOLO_RETURN_IF_ERROR(
        device->WaitForArrival(std::chrono::duration_cast<std::chrono::microseconds>(until - now) +
                                   std::chrono::microseconds(1),
                               &arrived));
    if (arrived) return Status::OK();
  }
}

void Engine::Impl::FailEverything(const Status& status, bool fatal_error) {
  std::lock_guard<std::mutex> lock(mu);
  if (fatal_error && fatal.ok()) fatal = status;
  stopped = true;
  for (auto& [name, entry] : pending) {
    auto it = handles.find(entry.handle.id);
    if (it != handles.end()) {
      it->second.done = true;
      it->second.status = status.WithContext(
          fmt::format("{} '{}'", coordinator::CollectiveTypeName(entry.request.type), name));
    }
  }
  for (TensorEntry& entry : queue) {
    auto it = handles.find(entry.handle.id);
    if (it != handles.end()) {
      it->second.done = true;
      it->second.status = status.WithContext(fmt::format(
          "{} '{}'", coordinator::CollectiveTypeName(entry.request.type), entry.request.name));
    }
  }
  pending.clear();
  queue.clear();
  in_flight.clear();
  done_cv.notify_all();
}

void Engine::Impl::TimelineBegin(const std::string& name, const std::string& activity,
                                 const std::string& args) {
  if (timeline) timeline->Begin(name, activity, args);
}
void Engine::Impl::TimelineEnd(const std::string& name, const std::string& activity) {
  if (timeline) timeline->End(name, activity);
}

void Engine::Impl::DrainQueue() {
  std::deque<TensorEntry> drained;
  {
    std::lock_guard<std::mutex> lock(mu);
    drained.swap(queue);
  }
  for (TensorEntry& entry : drained) {
    const std::string name = entry.request.name;
    if (timeline) {
      timeline->End(name, "QUEUE");
      timeline->Begin(name, "NEGOTIATE_" + UpperType(entry.request.type));
    }
    int bit = -1;
    switch (options.size > 1 ? cache.Find(entry.request, options.rank, &bit)
                             : coordinator::ResponseCache::Lookup::kMiss) {
      case coordinator::ResponseCache::Lookup::kHit:
        entry.cache_bit = bit;
        break;
      case coordinator::ResponseCache::Lookup::kMismatch:
        // Set in this cycle's invalid vector: every rank drops the entry and renegotiates.
        bits[cache.words() + 1 + bit / 64] |= uint64_t{1} << (bit % 64);
        unreported.push_back(name);
        break;
      case coordinator::ResponseCache::Lookup::kMiss:
        unreported.push_back(name);
        break;
    }
    pending.emplace(name, std::move(entry));
  }
}

Status Engine::Impl::RunCycle(bool* stop) {
  std::fill(bits.begin(), bits.end(), 0);
  DrainQueue();
  std::vector<Response> responses;
  KOLO_RETURN_IF_ERROR(Negotiate(&responses, stop));
  KOLO_RETURN_IF_ERROR(Execute(responses));
  std::lock_guard<std::mutex> lock(mu);
  ++stats.cycles;
  return Status::OK();
}

Status Engine::Impl::Negotiate(std::vector<Response>* responses, bool* stop) {
  const auto start = SteadyClock::now();
  const size_t words = cache.words();
  bool shutdown;
  {
    std::lock_guard<std::mutex> lock(mu);
    shutdown = shutdown_requested;
  }
  if (options.size == 1) {
    // Nothing to agree on: everything drained is ready, in submission order.
    std::vector<TensorEntry*> ready;
    for (auto& [name, entry] : pending) ready.push_back(&entry);
    std::sort(ready.begin(), ready.end(),
              [](auto* a, auto* b) { return a->handle.id < b->handle.id; });
    for (TensorEntry* e : ready) {
      Response r;
      r.request = e->request;
      if (r.request.type == CollectiveType::kAllgather) r.first_dims = {e->request.shape[0]};
      responses->push_back(std::move(r));
    }
    unreported.clear();
    *stop = shutdown;
    return Status::OK();
  }

  // One bit-vector exchange: AND of cache hits | OR of flags | OR of invalidated bits. A hit that
  // has waited past the stall time is invalidated instead: every rank drops the entry, and the
  // ranks that have the tensor report it to the coordinator, whose stall inspector then names
  // the ranks missing it.
  bool handed_back = false;
  for (const auto& [name, entry] : pending) {
    if (entry.cache_bit < 0) continue;
    const uint64_t mask = uint64_t{1} << (entry.cache_bit % 64);
    if (hit_stall_after > SteadyClock::duration::zero() &&
        start - entry.submitted >= hit_stall_after) {
      bits[words + 1 + entry.cache_bit / 64] |= mask;
      handed_back = true;
    } else {
      bits[entry.cache_bit / 64] |= mask;
    }
  }
  const bool rank0_round =
      table && table->pending() > 0 && start - last_stall_check > kStallCheckEvery;
  if (!unreported.empty() || rank0_round || handed_back) bits[words] |= kFlagUncached;
  if (shutdown) bits[words] |= kFlagShutdown;
  KOLO_RETURN_IF_ERROR(
      collectives::BitwiseAllreduce(comm, *bits_region, words, words + 1, scratch));
  *stop = (bits[words] & kFlagShutdown) != 0;

  // Invalidated entries: every rank drops them and renegotiates any pending use.
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t m = bits[words + 1 + w]; m != 0; m &= m - 1) {
      const int bit = static_cast<int>(w * 64 + __builtin_ctzll(m));
      for (auto& [name, entry] : pending) {
        if (entry.cache_bit == bit) {
          entry.cache_bit = -1;
          unreported.push_back(name);
        }
      }
      cache.Erase(bit);
      bits[w] &= ~(uint64_t{1} << (bit % 64));
    }
  }
  // Hits on every rank, in bit order (the same on every rank).
  int64_t hits = 0;
  for (size_t w = 0; w < words; ++w) {
    for (uint64_t m = bits[w]; m != 0; m &= m - 1) {
      const int bit = static_cast<int>(w * 64 + __builtin_ctzll(m));
      responses->push_back(cache.Get(bit));
      cache.Touch(bit);
      ++hits;
    }
  }
  for (const Response& r : *responses) PendingEntry(r.request.name).cache_bit = -1;

  int64_t rounds = 0;
  if (bits[words] & kFlagUncached) {
    const size_t cached = responses->size();
    KOLO_RETURN_IF_ERROR(CoordinatorRound(responses));
    ++rounds;
    // Newly agreed collectives enter the cache in list order — the same on every rank. An
    // eviction may take the bit of a tensor still waiting as a hit: it renegotiates.
    for (size_t i = cached; i < responses->size(); ++i) {
      if (!(*responses)[i].is_error()) cache.Put((*responses)[i]);
    }
    for (auto& [name, entry] : pending) {
      if (entry.cache_bit >= 0 &&
          (!cache.Occupied(entry.cache_bit) || cache.Get(entry.cache_bit).request.name != name)) {
        entry.cache_bit = -1;
        unreported.push_back(name);
      }
    }
  }
  UpdateHitStallDue();
  const double us = std::chrono::duration<double, std::micro>(SteadyClock::now() - start).count();
  std::lock_guard<std::mutex> lock(mu);
  stats.cache_hits += hits;
  stats.negotiations += rounds;
  // Idle cycles (nothing agreed) cost no step anything; only cycles that release work count.
  if (!responses->empty()) stats.coordination_us += us;
  return Status::OK();
}

Status Engine::Impl::CoordinatorRound(std::vector<Response>* responses) {
  coordinator::RequestList mine;
  const auto sent = SteadyClock::now();
  for (const std::string& name : unreported) {
    auto it = pending.find(name);
    if (it != pending.end() && it->second.cache_bit < 0) {
      mine.requests.push_back(it->second.request);
      const auto waited =
          std::chrono::duration_cast<std::chrono::milliseconds>(sent - it->second.submitted);
      mine.waited_ms.push_back(static_cast<uint32_t>(
          std::clamp<int64_t>(waited.count(), 0, std::numeric_limits<uint32_t>::max())));
    }
  }
  unreported.clear();
  KOLO_ASSIGN_OR_RETURN(auto gathered,
                        collectives::GatherMessages(comm, 0, coordinator::Serialize(mine)));
  std::vector<uint8_t> answer;
  if (options.rank == 0) {
    coordinator::ResponseList list;
    const auto now = SteadyClock::now();
    for (int r = 0; r < options.size; ++r) {
      auto parsed = coordinator::ParseRequestList(gathered[r]);
      if (!parsed.ok()) return parsed.status().WithContext(fmt::format("requests from rank {}", r));
      for (size_t i = 0; i < parsed->requests.size(); ++i) {
        const auto since = now - std::chrono::milliseconds(parsed->waited_ms[i]);
        table->Add(r, parsed->requests[i], since, &list.responses);
      }
    }
    InspectStalls(&list.responses);
    answer = coordinator::Serialize(list);
  }
  KOLO_ASSIGN_OR_RETURN(answer, collectives::BroadcastMessage(comm, 0, answer));
  KOLO_ASSIGN_OR_RETURN(auto list, coordinator::ParseResponseList(answer));
  for (Response& r : list.responses) responses->push_back(std::move(r));
  return Status::OK();
}

void Engine::Impl::InspectStalls(std::vector<Response>* errors) {
  const auto now = SteadyClock::now();
  last_stall_check = now;
  if (options.stall_warning_s > 0) {
    const auto warn_after = std::chrono::duration<double>(options.stall_warning_s);
    for (const auto& s : table->FindStalled(now, warn_after)) {
      auto& last = stall_warned[s.name];
      if (last != SteadyClock::time_point{} && now - last < warn_after) continue;
      last = now;
      KOLO_LOG(kWarning,
               "stalled: tensor '{}' has waited {:.1f} s: ready on ranks {}, missing on ranks {}. "
               "Every rank must submit the same tensors.",
               s.name, s.waited_s, coordinator::FormatRanks(s.ready_ranks),
               coordinator::FormatRanks(s.missing_ranks));
    }
  }
  if (options.stall_shutdown_s > 0) {
    for (const auto& s :
         table->FindStalled(now, std::chrono::duration<double>(options.stall_shutdown_s))) {
      stall_warned.erase(s.name);
      errors->push_back(table->Fail(
          s.name, fmt::format("'{}' stalled for {:.1f} s (KOLO_STALL_SHUTDOWN_SECONDS={}): "
                              "submitted by ranks {}, never by ranks {}",
                              s.name, s.waited_s, options.stall_shutdown_s,
                              coordinator::FormatRanks(s.ready_ranks),
                              coordinator::FormatRanks(s.missing_ranks))));
    }
  }
}

TensorEntry& Engine::Impl::PendingEntry(const std::string& name) { return pending.at(name); }

backends::Backend& Engine::Impl::BackendFor(const Request& request) {
  for (auto& b : backends) {
    if (b->Enabled(request.type, request.dtype)) return *b;
  }
  return *backends.back();
}

void Engine::Impl::Complete(const std::string& name, const Status& status,
                            std::unique_ptr<GatheredTensor> gathered) {
  auto it = pending.find(name);
  if (it == pending.end()) return;
  const int64_t id = it->second.handle.id;
  pending.erase(it);
  std::lock_guard<std::mutex> lock(mu);
  in_flight.erase(name);
  auto h = handles.find(id);
  if (h != handles.end()) {
    h->second.done = true;
    h->second.status = status;
    h->second.gathered = std::move(gathered);
  }
  ++stats.tensors;
  done_cv.notify_all();
}

Status Engine::Impl::Execute(const std::vector<Response>& responses) {
  // Every collective response must name a tensor this rank submitted; errors may name tensors
  // this rank never submitted (a stall it caused), which it simply has nothing to complete for.
  for (const Response& r : responses) {
    if (!r.is_error() && pending.count(r.request.name) == 0) {
      return Internal("response for '{}', which rank {} has not submitted", r.request.name,
                      options.rank);
    }
    if (timeline && pending.count(r.request.name)) {
      timeline->End(r.request.name, "NEGOTIATE_" + UpperType(r.request.type));
    }
  }
  for (const fusion::Group& g :
       fusion::PlanFusion(responses, static_cast<size_t>(options.fusion_threshold_bytes))) {
    const Response& first = responses[g.members[0]];
    if (first.is_error()) {
      Complete(first.request.name, Status(StatusCode::kInvalidArgument, first.error));
      continue;
    }
    switch (first.request.type) {
      case CollectiveType::kAllreduce:
        KOLO_RETURN_IF_ERROR(ExecuteAllreduce(responses, g));
        break;
      case CollectiveType::kBroadcast:
        KOLO_RETURN_IF_ERROR(ExecuteBroadcast(first));
        break;
      case CollectiveType::kAllgather:
        KOLO_RETURN_IF_ERROR(ExecuteAllgather(first));
        break;
    }
  }
  return Status::OK();
}

}  // namespace kolo
