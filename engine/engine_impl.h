// Engine::Impl: state shared by the submission API (any thread) and the background thread.
// Internal to engine/; see engine.h for the contract.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
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
#include "engine/execution/operation_table.h"
#include "engine/timeline/timeline.h"
#include "engine/transport/shm/host_area.h"
#include "engine/transport/transport.h"

namespace kolo {

using SteadyClock = std::chrono::steady_clock;

// The API object's state: it wires the layers together. Submissions go into the operation table
// (execution/operation_table.h); the background thread drains them, lets the controller
// (coordinator/) agree with the other ranks, and hands the agreed responses to the executor
// (execution/), which completes them in the table.
struct Engine::Impl final {
  explicit Impl(const Options& o)
      : options(o), ops(o.rank, [this](const execution::ExecutionStats& d) { Count(d); }) {
    MutexLock lock(mu);
    tunables = Engine::Tunables{o.fusion_threshold_bytes, o.cycle_time_ms, o.allreduce_algorithm,
                                o.hierarchical_allreduce};
    cycle_time_ms.store(o.cycle_time_ms);
  }

  // --- The drive: which thread runs the engine's cycles. The background thread does, except
  // where a caller waiting on a handle finds nobody driving (options.caller_progress): that
  // caller then runs the cycles itself until its handle is done (DriveUntilDone), sparing the two
  // thread wake-ups of handing the work over and back. One thread drives at a time; the members
  // marked "driver only" below belong to it.
  enum class Driver { kNone, kBackground, kCaller };
  // After a caller drove or waited (or the background thread completed a cycle while a caller
  // slept on a handle), the background thread leaves the drive to callers for this long (unless
  // work is left or the engine shuts down): a caller that comes back within it, as one does that
  // waits on every collective, takes the drive without waking anybody. A submission made
  // meanwhile by a caller that does not wait on it is picked up within it.
  static constexpr auto kCallerLinger = std::chrono::milliseconds(2);
  // Whether a waiting caller may drive: the option, the ring backend, not a parameter-server
  // rank. Set before the thread starts, then only read. Once a device tensor has been submitted
  // (device_tensors), callers no longer drive: the executor makes the engine's CUDA device current
  // on the thread that runs it, which must not be a caller's.
  bool caller_drives = false;
  // The bound of any blocking inside a cycle (options.peer_timeout_s): a caller drives only when
  // its wait has at least this long left.
  SteadyClock::duration peer_timeout{};
  // The driver runs as SCHED_BATCH (EngineThreadIsBatch); set before the thread starts.
  bool batch_driver = false;
  std::atomic<bool> device_tensors{false};
  Mutex drive_mu;
  CondVar drive_cv;  // the background thread waits here while it leaves the drive to callers
  Driver driver KOLO_GUARDED_BY(drive_mu) = Driver::kNone;
  // The engine has ended (an error or every rank's stop); nobody drives any more.
  bool ended KOLO_GUARDED_BY(drive_mu) = false;
  // Shutdown was asked for: the background thread takes the drive at once.
  bool shutting KOLO_GUARDED_BY(drive_mu) = false;
  // The driver that let go left work (queued or pending operations): the background thread takes
  // the drive at once.
  bool work_left KOLO_GUARDED_BY(drive_mu) = false;
  // When a caller last waited on a handle or let go of the drive, or the background thread let go
  // of it while a caller slept on a handle.
  SteadyClock::time_point caller_seen KOLO_GUARDED_BY(drive_mu);
  // Callers asleep on a handle that somebody else drives (Engine::Wait).
  int callers_asleep KOLO_GUARDED_BY(drive_mu) = 0;
  // The background thread's turn at the drive: blocks until it may take it (false: the engine
  // has ended).
  bool TakeDriveInBackground() KOLO_EXCLUDES(drive_mu, mu);
  // Lets go of the drive; `go_on` false: the engine has ended.
  void ReleaseDrive(bool go_on) KOLO_EXCLUDES(drive_mu, mu);
  // A caller waiting on handle `id`: if nobody drives and caller_drives, takes the drive and runs
  // cycles until the handle is done, the engine ends or `deadline` passes; otherwise returns at
  // once (the caller then sleeps until the driver completes the handle). True when the handle is
  // done (or unknown), so that the caller will not sleep on it.
  bool DriveUntilDone(int64_t id, SteadyClock::time_point deadline) KOLO_EXCLUDES(drive_mu, mu);
  // The cycle time in force (cycle_time_ms) as a duration.
  SteadyClock::duration Cycle() const;
  // One turn of the engine by its driver: AwaitCycle, then RunCycle. False once the engine has
  // ended (an error or every rank's stop), having failed what still waits. Returns true without
  // a cycle when `give_up` passes first. `by_caller`: a waiting caller drives (counted in
  // Stats::caller_cycles).
  bool Turn(SteadyClock::time_point give_up, bool by_caller) KOLO_EXCLUDES(mu);
  // Driver only: when the last cycle started and ended; the earliest submission among those
  // drained since AwaitCycle's first look.
  SteadyClock::time_point last_start;
  SteadyClock::time_point last_end;
  SteadyClock::time_point earliest_drained = SteadyClock::time_point::max();

  // --- Background thread.
  void Loop() KOLO_EXCLUDES(mu);
  // Driver only. Blocks until this rank should run its next cycle: at its next tick (a whole
  // number of cycles after last_start) when it has news for its peers, or at once when a peer has
  // started the cycle's exchange. A rank with nothing new waits for its peers instead of waking
  // every cycle: whichever rank submits last starts the exchange that agrees on what every rank
  // has. Sets *due when the cycle is due; leaves it false when `give_up` passed first.
  Status AwaitCycle(SteadyClock::duration cycle, SteadyClock::time_point give_up, bool* due)
      KOLO_EXCLUDES(mu);
  // Whether this rank knows something its peers need for agreement: new submissions, a shutdown,
  // or what the controller has (Controller::HasNews); otherwise the table remembers that the
  // thread is idle, so that the next submission wakes it.
  bool HasNews(SteadyClock::time_point now);
  // One negotiation-and-execution cycle. Sets *stop when every rank is to stop. A caller's
  // (`by_caller`) runs nothing once a device tensor has been submitted: *ran false.
  Status RunCycle(bool by_caller, bool* stop, bool* ran) KOLO_EXCLUDES(mu);
  // Moves the submission queue into the table's pending operations and hands each request to the
  // controller.
  void DrainQueue();
  // Driver only. Tensors drained so far; consecutive cycles held for the cycle grid
  // during which nothing more was submitted (the hold gathered nothing to fuse): from
  // kLoneHoldsToStop on, news starts an exchange at once until news comes while a cycle runs.
  int64_t drained_total = 0;
  int lone_holds = 0;
  // Small allreduces may ride the negotiation (Controller::SetRiding): not where the allreduce
  // algorithm was chosen by hand, which riding would replace. Driver only.
  bool riding_allowed = true;
  static constexpr int kLoneHoldsToStop = 2;
  // The controller's agreement for this cycle, with the engine's statistics updated.
  // Sets *riding when the responses' allreduce rode the exchange (NegotiationStats::riding).
  Status Negotiate(std::vector<coordinator::Response>* responses, bool* stop, bool* riding)
      KOLO_EXCLUDES(mu);
  // After a cycle ran `responses`: applies the tunables whose switch collective was among them.
  Status ApplyRetunes(const std::vector<coordinator::Response>& responses) KOLO_EXCLUDES(mu);
  // The statistics the executor adds (through the table).
  void Count(const execution::ExecutionStats& delta) KOLO_EXCLUDES(mu);

  // --- Submission side.
  // Checks that this rank can move a device tensor `name` at `place` and sets up the CUDA context
  // (and the staged ring) on first use. Errors name the tensor and what is allowed.
  Status PrepareDevice(const char* type, const std::string& name, const TensorPlace& place)
      KOLO_EXCLUDES(gpu_mu);
  StatusOr<Handle> Submit(execution::Operation op);

  const Options options;
  bootstrap::Rendezvous rendezvous;
  // Which host each rank is on, as the ranks agreed before connecting.
  bootstrap::HostLayout hosts;
  std::unique_ptr<transport::Device> device;
  // Which transports carry this rank's pairs ("shm", "tcp", "shm+tcp"); set before the thread
  // starts, then only read.
  std::string pair_transports;
  // The ring backend holds hierarchical allreduce's host groups (on, or switchable by Retune).
  bool hierarchical_groups = false;
  int transport_connections = 0;
  int64_t transport_memory_bytes = 0;
  int tcp_streams = 1;  // Engine::Stats::tcp_streams
  // Every rank on one host over shared memory: the area of the one-shot allreduce (comm.host_area
  // points at it); with hierarchical allreduce across hosts (on or switchable) over auto, this
  // host's area (the ring backend's HostGroups::area); else null.
  std::unique_ptr<transport::shm::HostArea> host_area;
  // The negotiation's bit exchange goes through comm.host_area (BitExchangeThroughHostArea): the
  // background thread then idles on its doorbell there rather than in the device. Set before the
  // thread starts, then only read.
  bool exchange_through_area = false;
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

  // Every operation from submission to its handle's wait, the sticky fatal error and the shutdown
  // request. Its lock nests under none of the engine's.
  execution::OperationTable ops;

  // Lock order: gpu_mu, then mu; mu is never held across communication nor while calling into
  // the table.
  Mutex mu;
  int64_t barrier_seq KOLO_GUARDED_BY(mu) = 0;
  // Engine::Retune: tunables waiting for the collective of their name to run; those in force.
  std::map<std::string, Engine::Tunables> pending_retunes KOLO_GUARDED_BY(mu);
  Engine::Tunables tunables KOLO_GUARDED_BY(mu);
  // How many pending_retunes there are, so that a cycle with none takes no lock to find out.
  std::atomic<int> retunes_pending{0};
  // The cycle time in force, read by the background thread each cycle (Retune changes it).
  std::atomic<double> cycle_time_ms{1.0};
  Stats stats KOLO_GUARDED_BY(mu);
  // Started at the end of Create, joined by Shutdown; not guarded by mu (Shutdown joins it with
  // mu released, so that the background thread can finish). Shutdown holds shutdown_mu throughout
  // (taken before mu, never while holding it), so that callers on several threads join it once
  // and every one returns after the thread has stopped.
  Mutex shutdown_mu;
  std::thread thread;

  // Driver only. The controller (negotiation) talks to its peers through `peers`,
  // declared first so that it is destroyed last.
  std::unique_ptr<collectives::NegotiationPeers> peers;
  std::unique_ptr<coordinator::Controller> controller;
  // Run by the driver; the one exception is SetDevice, which PrepareDevice calls under
  // gpu_mu before the first device tensor is queued (Submit's mu then orders it before the
  // background thread's first use of the device).
  std::unique_ptr<execution::Executor> executor;
  collectives::Scratch message_scratch;  // comm.messages: negotiation's message staging

  // Parameter-server jobs (engine_ps.cc). Set once at creation: a worker has ps_worker (its
  // thread completes handles in the table), a server has ps_server and no engine thread. Declared
  // last so that they stop before everything they refer to is destroyed.
  Role role = Role::kWorker;
  void AddParameterServerStats(Stats* stats) const;
  std::unique_ptr<backends::ps::Worker> ps_worker;
  std::unique_ptr<backends::ps::Server> ps_server;
};

}  // namespace kolo
