#include "engine/execution/operation_table.h"

#include <fmt/format.h>

namespace kolo::execution {
namespace {

std::string Describe(const Operation& op) {
  return fmt::format("{} '{}'", coordinator::CollectiveTypeName(op.request.type), op.request.name);
}

}  // namespace

StatusOr<int64_t> OperationTable::Submit(Operation op, bool* was_idle,
                                         const std::function<void(const std::string&)>& on_queued) {
  MutexLock lock(mu_);
  if (!fatal_.ok()) return fatal_;
  if (stopped_ && !stop_reason_.ok()) return stop_reason_.WithContext(Describe(op));
  if (shutdown_requested_ || stopped_) {
    return FailedPrecondition("{}: the engine has shut down", Describe(op));
  }
  if (!in_flight_.insert(op.request.name).second) {
    return InvalidArgument(
        "{}: a collective with this name is already in flight on rank {}; wait for it before "
        "submitting the name again",
        Describe(op), rank_);
  }
  const int64_t id = next_handle_++;
  handles_.emplace(id, HandleState{});
  if (on_queued) on_queued(op.request.name);
  queue_.push_back(Pending{std::move(op), id});
  *was_idle = idle_;
  idle_ = false;
  return id;
}

StatusOr<int64_t> OperationTable::Issue(const std::string& what) {
  MutexLock lock(mu_);
  if (!fatal_.ok()) return fatal_;
  // Only this rank's own shutdown refuses it: a push-pull goes to the servers, not to the peers
  // whose engine may have stopped.
  if (shutdown_requested_) return FailedPrecondition("{}: the engine has shut down", what);
  const int64_t id = next_handle_++;
  handles_.emplace(id, HandleState{});
  return id;
}

void OperationTable::Forget(int64_t id) {
  MutexLock lock(mu_);
  handles_.erase(id);
}

StatusOr<HandleState> OperationTable::Wait(int64_t id, std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  if (handles_.find(id) == handles_.end()) {
    return InvalidArgument("handle {} is unknown (never issued, or already waited on)", id);
  }
  // Another thread waiting on the same handle may take it first: then this one is told so.
  if (!done_cv_.WaitFor(mu_, timeout, [&]() KOLO_REQUIRES(mu_) {
        const auto h = handles_.find(id);
        return h == handles_.end() || h->second.done;
      })) {
    return DeadlineExceeded("handle {} did not complete within {} ms", id, timeout.count());
  }
  auto it = handles_.find(id);
  if (it == handles_.end()) {
    return InvalidArgument(
        "handle {} was taken by another thread waiting on it (wait on a handle from one thread)",
        id);
  }
  HandleState state = std::move(it->second);
  handles_.erase(it);
  return state;
}

StatusOr<bool> OperationTable::Poll(int64_t id) {
  MutexLock lock(mu_);
  auto it = handles_.find(id);
  if (it == handles_.end()) {
    return InvalidArgument("handle {} is unknown (never issued, or already waited on)", id);
  }
  return it->second.done;
}

void OperationTable::SetFatal(const Status& status) {
  MutexLock lock(mu_);
  if (fatal_.ok() && !status.ok()) {
    fatal_ = status;
    fatal_at_ = std::chrono::steady_clock::now();
  }
}

Status OperationTable::fatal() const {
  MutexLock lock(mu_);
  return fatal_;
}

std::optional<std::chrono::steady_clock::time_point> OperationTable::failed_at() const {
  MutexLock lock(mu_);
  if (fatal_.ok()) return std::nullopt;
  return fatal_at_;
}

void OperationTable::RequestShutdown() {
  MutexLock lock(mu_);
  shutdown_requested_ = true;
}

bool OperationTable::shutdown_requested() const {
  MutexLock lock(mu_);
  return shutdown_requested_;
}

int64_t OperationTable::completed() const {
  MutexLock lock(mu_);
  return completed_;
}

bool OperationTable::RequestIdle() {
  MutexLock lock(mu_);
  idle_ = queue_.empty() && !shutdown_requested_;
  return idle_;
}

bool OperationTable::Idle() {
  MutexLock lock(mu_);
  return queue_.empty() && pending_.empty();
}

std::vector<Operation*> OperationTable::Drain() {
  std::deque<Pending> drained;
  {
    MutexLock lock(mu_);
    drained.swap(queue_);
  }
  std::vector<Operation*> out;
  out.reserve(drained.size());
  for (Pending& p : drained) {
    std::string name = p.op.request.name;
    auto [it, inserted] = pending_.emplace(std::move(name), std::move(p));
    if (inserted) out.push_back(&it->second.op);  // in_flight_ keeps names unique
  }
  return out;
}

Operation* OperationTable::Find(const std::string& name) {
  auto it = pending_.find(name);
  return it == pending_.end() ? nullptr : &it->second.op;
}

void OperationTable::Complete(Operation* op, const Status& status,
                              std::unique_ptr<GatheredTensor> gathered) {
  auto it = pending_.find(op->request.name);
  if (it == pending_.end()) return;
  // The node keeps the name alive for the in-flight set without a copy.
  const auto node = pending_.extract(it);
  MutexLock lock(mu_);
  in_flight_.erase(node.key());
  Finish(node.mapped().handle, status, std::move(gathered));
}

void OperationTable::CompleteHandle(int64_t id, const Status& status) {
  MutexLock lock(mu_);
  Finish(id, status, nullptr);
}

void OperationTable::Finish(int64_t id, const Status& status,
                            std::unique_ptr<GatheredTensor> gathered) {
  auto h = handles_.find(id);
  if (h == handles_.end()) return;
  h->second.done = true;
  h->second.status = status;
  h->second.gathered = std::move(gathered);
  ++completed_;
  done_cv_.notify_all();
}

void OperationTable::FailAll(const Status& status, bool fatal_error) {
  std::deque<Pending> queued;  // destroyed after the lock is released
  MutexLock lock(mu_);
  if (fatal_error && fatal_.ok()) {
    fatal_ = status;
    fatal_at_ = std::chrono::steady_clock::now();
  }
  stopped_ = true;
  stop_reason_ = status;
  queued.swap(queue_);
  auto fail = [&](const Pending& p) KOLO_REQUIRES(mu_) {
    auto h = handles_.find(p.handle);
    if (h == handles_.end()) return;
    h->second.done = true;
    h->second.status = status.WithContext(Describe(p.op));
  };
  for (const auto& [name, p] : pending_) fail(p);
  for (const Pending& p : queued) fail(p);
  pending_.clear();
  in_flight_.clear();
  done_cv_.notify_all();
}

}  // namespace kolo::execution
