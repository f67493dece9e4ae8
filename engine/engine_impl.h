// Engine::Impl: state shared by the submission API (any thread) and the background thread.
// Internal to engine/; see engine.h for the contract.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/device_collectives.h"
#include "engine/backends/ps/server.h"
#include "engine/backends/ps/worker.h"
#include "engine/bootstrap/host_layout.h"
#include "engine/bootstrap/rendezvous.h"
#include "engine/collectives/collectives.h"
#include "engine/collectives/negotiation_peers.h"
#include "engine/common/mutex.h"
#include "engine/common/thread_annotations.h"
#include "engine/coordinator/controller.h"
#include "engine/coordinator/message.h"
#include "engine/cuda/device_context.h"
#include "engine/engine.h"
#include "engine/execution/executor.h"
#include "engine/timeline/timeline.h"
#include "engine/transport/transport.h"

namespace kolo {

using SteadyClock = std::chrono::steady_clock;

// One submitted operation (what execution needs of it), from submission until its handle
// completes.
struct TensorEntry : execution::Operation {
  Handle handle;
  SteadyClock::time_point submitted;
};

struct HandleState {
  bool done = false;
  Status status;
  std::unique_ptr<GatheredTensor> gathered;  // allgather results
};

// The API object's state: it wires the layers together. Its background thread drains the queue
// into `pending`, lets the controller (coordinator/) agree with the other ranks, and hands the
// agreed responses to the executor (execution/), which completes them through this object.
struct Engine::Impl final : execution::Operations {
  explicit Impl(const Options& o) : options(o) {}

  // --- Background thread.
  void Loop() KOLO_EXCLUDES(mu);
  // Blocks until this rank should run its next cycle: at its next tick (a whole number of cycles
  // after *last_start) when it has news for its peers, or at once when a peer has started the
  // cycle's exchange. A rank with nothing new waits for its peers instead of waking every cycle:
  // whichever rank submits last starts the exchange that agrees on what every rank has.
  Status AwaitCycle(SteadyClock::duration cycle, SteadyClock::time_point last_start)
      KOLO_EXCLUDES(mu);
  // Whether this rank knows something its peers need for agreement: new submissions, a shutdown,
  // or what the controller has (Controller::HasNews). Sets `idle` when it has none, in the same
  // critical section that looked at the queue, so that no submission goes unnoticed.
  bool HasNews(SteadyClock::time_point now) KOLO_EXCLUDES(mu);
  // One negotiation-and-execution cycle. Sets *stop when every rank is to stop.
  Status RunCycle(bool* stop) KOLO_EXCLUDES(mu);
  // Moves the submission queue into `pending` and hands each request to the controller.
  void DrainQueue() KOLO_EXCLUDES(mu);
  // The controller's agreement for this cycle, with the engine's statistics updated.
  Status Negotiate(std::vector<coordinator::Response>* responses, bool* stop) KOLO_EXCLUDES(mu);
  // execution::Operations: the executor's view of `pending`, and the statistics it adds.
  execution::Operation* Find(const std::string& name) override;
  void Complete(const std::string& name, const Status& status,
                std::unique_ptr<GatheredTensor> gathered) override KOLO_EXCLUDES(mu);
  void Count(const execution::ExecutionStats& delta) override KOLO_EXCLUDES(mu);
  // Completes every pending and queued operation with `status`; a fatal one also becomes the
  // sticky error that later submissions and Shutdown return.
  void FailEverything(const Status& status, bool fatal_error) KOLO_EXCLUDES(mu);

  // --- Submission side.
  // Checks that this rank can move a device tensor `name` at `place` and sets up the CUDA context
  // (and the staged ring) on first use. Errors name the tensor and what is allowed.
  Status PrepareDevice(const char* type, const std::string& name, const TensorPlace& place)
      KOLO_EXCLUDES(gpu_mu);
  StatusOr<Handle> Submit(TensorEntry entry) KOLO_EXCLUDES(mu);
  StatusOr<HandleState> WaitState(Handle handle, std::chrono::milliseconds timeout)
      KOLO_EXCLUDES(mu);

  const Options options;
  bootstrap::Rendezvous rendezvous;
  // Which host each rank is on, as the ranks agreed before connecting.
  bootstrap::HostLayout hosts;
  std::unique_ptr<transport::Device> device;
  // Which transports carry this rank's pairs ("shm", "tcp", "shm+tcp"); set before the thread
  // starts, then only read.
  std::string pair_transports;
  collectives::Comm comm;
  std::vector<std::unique_ptr<backends::Backend>> backends;  // ordered; the last accepts all
  std::unique_ptr<timeline::Timeline> timeline;

  // Device tensors. gpu and device_collectives are set once, before any device tensor is queued:
  // at Create for backend nccl (before the engine is shared, so without a lock), else by
  // PrepareDevice under gpu_mu when the first device tensor is submitted; PrepareDevice reads them
  // under gpu_mu. They are handed to the executor; from then on only the background thread uses
  // them, through the executor. Not KOLO_GUARDED_BY(gpu_mu) for Create's unlocked writes.
  // device_collectives refers to gpu and is declared after it, so that it is destroyed first (the
  // executor, declared later still, before both). Lock order: gpu_mu, then mu.
  Mutex gpu_mu;
  std::unique_ptr<cuda::DeviceContext> gpu;
  std::unique_ptr<backends::DeviceCollectives> device_collectives;

  // Lock order: gpu_mu, then mu (the only other lock); mu is never held across communication.
  Mutex mu;
  CondVar done_cv;
  std::deque<TensorEntry> queue KOLO_GUARDED_BY(mu);
  std::unordered_set<std::string> in_flight KOLO_GUARDED_BY(mu);
  std::unordered_map<int64_t, HandleState> handles KOLO_GUARDED_BY(mu);
  int64_t next_handle KOLO_GUARDED_BY(mu) = 0;
  int64_t barrier_seq KOLO_GUARDED_BY(mu) = 0;
  Status fatal KOLO_GUARDED_BY(mu);                                    // sticky
  std::chrono::steady_clock::time_point fatal_at KOLO_GUARDED_BY(mu);  // when fatal was set
  bool shutdown_requested KOLO_GUARDED_BY(mu) = false;
  bool stopped KOLO_GUARDED_BY(mu) = false;
  // The background thread is about to wait with nothing new to do: the next submission wakes it
  // (and clears this), later ones need not (it starts the exchange at its tick anyway).
  bool idle KOLO_GUARDED_BY(mu) = false;
  Stats stats KOLO_GUARDED_BY(mu);
  // Started at the end of Create, joined by Shutdown; not guarded by mu (Shutdown joins it with
  // mu released, so that the background thread can finish). Shutdown holds shutdown_mu throughout
  // (taken before mu, never while holding it), so that callers on several threads join it once
  // and every one returns after the thread has stopped.
  Mutex shutdown_mu;
  std::thread thread;

  // Background thread only. The controller (negotiation) talks to its peers through `peers`,
  // declared first so that it is destroyed last.
  std::unique_ptr<collectives::NegotiationPeers> peers;
  std::unique_ptr<coordinator::Controller> controller;
  // Run by the background thread; the one exception is SetDevice, which PrepareDevice calls under
  // gpu_mu before the first device tensor is queued (Submit's mu then orders it before the
  // background thread's first use of the device).
  std::unique_ptr<execution::Executor> executor;
  std::unordered_map<std::string, TensorEntry> pending;  // drained, awaiting a response
  collectives::Scratch message_scratch;  // comm.messages: negotiation's message staging

  // Parameter-server jobs (engine_ps.cc). Set once at creation: a worker has ps_worker (its
  // thread reports completions under mu), a server has ps_server and no engine thread. Declared
  // last so that they stop before everything they refer to is destroyed.
  Role role = Role::kWorker;
  void AddParameterServerStats(Stats* stats) const;
  std::unique_ptr<backends::ps::Worker> ps_worker;
  std::unique_ptr<backends::ps::Server> ps_server;
};

}  // namespace kolo
