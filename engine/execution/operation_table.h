// The engine's handle table: every operation from submission until its handle is waited on, in one
// place, for every path that completes one — the executor (ring, MPI, NCCL, the staged ring) and
// the parameter-server worker.
//
// An operation is submitted (queued, its name in flight, its handle issued), drained by the
// background thread (pending: awaiting the ranks' agreement), completed (the handle done with its
// status; the name free again) and finally taken by Wait. A push-pull of the parameter servers has
// a handle and no queued operation: it is issued, then completed by its handle id.
//
// The first fatal error is sticky: every later submission fails with it, and FailAll completes
// every queued and pending operation with it.
//
// Thread-safety: Submit, Issue, Forget, Wait, Poll, Take*, SetFatal, RequestShutdown and the
// queries may be called from any thread; RequestIdle, Idle, Drain, Find, Complete and FailAll
// from the thread that drives the engine only (its background thread, or a waiting caller that
// took the drive; see Engine::Impl::DriveUntilDone); CompleteHandle from the parameter-server
// worker's thread. The table's
// mutex is held while calling out only for Submit's `on_queued` (a leaf) and Count's sink is
// called without it, so it nests under no other lock of the engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/common/mutex.h"
#include "engine/common/status.h"
#include "engine/common/tensor.h"
#include "engine/common/thread_annotations.h"
#include "engine/execution/executor.h"

namespace kolo::execution {

// A handle's outcome, as Wait hands it over.
struct HandleState {
  bool done = false;
  Status status;
  std::unique_ptr<GatheredTensor> gathered;  // allgather results
};

class OperationTable final : public Operations {
 public:
  // `rank` names this rank in errors. `count` receives the executor's statistics (Count).
  OperationTable(int rank, std::function<void(const ExecutionStats&)> count)
      : rank_(rank), count_(std::move(count)) {}

  // --- Any thread.
  // Queues `op` and issues its handle. Errors: the sticky fatal error; a shut-down engine; a name
  // already in flight on this rank. *was_idle is set when the background thread had said it was
  // idle (RequestIdle), so the caller wakes it. `on_queued` (may be empty) runs once the operation
  // is queued, before the background thread can drain it: under the table's lock, so it must be
  // a leaf call (the timeline's QUEUE begins there).
  StatusOr<int64_t> Submit(Operation op, bool* was_idle,
                           const std::function<void(const std::string&)>& on_queued)
      KOLO_EXCLUDES(mu_);
  // A handle with no queued operation (a push-pull), completed later by CompleteHandle. Same
  // errors as Submit, but only this rank's own shutdown refuses it (see RequestShutdown).
  StatusOr<int64_t> Issue(const std::string& what) KOLO_EXCLUDES(mu_);
  // Drops an issued handle whose operation could not start.
  void Forget(int64_t id) KOLO_EXCLUDES(mu_);
  // Blocks until handle `id` is done and takes its state; DeadlineExceeded after `timeout` (the
  // operation goes on). Of several threads waiting on one handle, one takes it and the others are
  // told so.
  StatusOr<HandleState> Wait(int64_t id, std::chrono::milliseconds timeout) KOLO_EXCLUDES(mu_);
  StatusOr<bool> Poll(int64_t id) KOLO_EXCLUDES(mu_);

  // The first fatal error becomes sticky (later ones are ignored).
  void SetFatal(const Status& status) KOLO_EXCLUDES(mu_);
  Status fatal() const KOLO_EXCLUDES(mu_);
  std::optional<std::chrono::steady_clock::time_point> failed_at() const KOLO_EXCLUDES(mu_);
  // This rank's own shutdown: later submissions and issues are refused.
  void RequestShutdown() KOLO_EXCLUDES(mu_);
  bool shutdown_requested() const KOLO_EXCLUDES(mu_);
  // Operations completed so far, whatever their status (push-pulls included).
  int64_t completed() const KOLO_EXCLUDES(mu_);

  // --- The engine's driver (background thread or driving caller).
  // True (and the table remembers it) when nothing is queued and no shutdown was requested: the
  // background thread is about to wait, and the next submission must wake it. Looked at in the
  // same critical section as the queue, so that no submission goes unnoticed.
  bool RequestIdle() KOLO_EXCLUDES(mu_);
  // Nothing queued and nothing pending (awaiting agreement or running).
  bool Idle() KOLO_EXCLUDES(mu_);
  // Moves the queue into pending; returns the newly pending operations in submission order (valid
  // until they complete).
  std::vector<Operation*> Drain() KOLO_EXCLUDES(mu_);
  // Operations: the pending operation `name`, or null; completion of a pending operation.
  Operation* Find(const std::string& name) override;
  void Complete(Operation* op, const Status& status,
                std::unique_ptr<GatheredTensor> gathered) override KOLO_EXCLUDES(mu_);
  void Count(const ExecutionStats& delta) override { count_(delta); }
  // Completes every queued and pending operation with `status` (named per tensor) and refuses
  // later submissions; with `fatal_error`, `status` also becomes the sticky error.
  void FailAll(const Status& status, bool fatal_error) KOLO_EXCLUDES(mu_);

  // --- The parameter-server worker's thread.
  // Completes the issued handle `id` (unknown ids are ignored: the waiter gave up on it).
  void CompleteHandle(int64_t id, const Status& status) KOLO_EXCLUDES(mu_);

 private:
  struct Pending {
    Operation op;
    int64_t handle = -1;
  };
  // Marks handle `id` done; REQUIRES: mu_ held.
  void Finish(int64_t id, const Status& status, std::unique_ptr<GatheredTensor> gathered)
      KOLO_REQUIRES(mu_);

  const int rank_;
  const std::function<void(const ExecutionStats&)> count_;

  mutable Mutex mu_;
  CondVar done_cv_;
  std::deque<Pending> queue_ KOLO_GUARDED_BY(mu_);
  std::unordered_set<std::string> in_flight_ KOLO_GUARDED_BY(mu_);
  std::unordered_map<int64_t, HandleState> handles_ KOLO_GUARDED_BY(mu_);
  int64_t next_handle_ KOLO_GUARDED_BY(mu_) = 0;
  int64_t completed_ KOLO_GUARDED_BY(mu_) = 0;
  Status fatal_ KOLO_GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point fatal_at_ KOLO_GUARDED_BY(mu_);
  bool shutdown_requested_ KOLO_GUARDED_BY(mu_) = false;
  bool stopped_ KOLO_GUARDED_BY(mu_) = false;
  // Why the engine stopped (FailAll's status), for what is submitted after it.
  Status stop_reason_ KOLO_GUARDED_BY(mu_);
  bool idle_ KOLO_GUARDED_BY(mu_) = false;

  // Driver only: drained operations awaiting a response, by name. Node-based, so the
  // Operation pointers handed out stay valid until their operation completes.
  std::unordered_map<std::string, Pending> pending_;
};

}  // namespace kolo::execution
