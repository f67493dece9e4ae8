// kolo's communication engine: the public API.
//
// An Engine is one rank of a data-parallel job. Collectives are submitted asynchronously by name:
// every rank submits the same names (in any order); a background thread negotiates which tensors
// are ready on every rank (rank 0 coordinates; a response cache lets steady-state steps agree with
// one bit-vector exchange), fuses compatible ready tensors into one buffer up to the fusion
// threshold (Tensor Fusion), runs the collective on the selected backend (ring over TCP, or MPI;
// tensors in CUDA device memory through NCCL or the ring via pinned host staging), and completes
// the handles. The data flow, layer by layer: engine/docs/layers.md.
//
// Usage:
//   KOLO_ASSIGN_OR_RETURN(auto engine, kolo::Engine::Create(options));
//   KOLO_ASSIGN_OR_RETURN(auto h, engine->AllreduceAsync("fc/weight", grad, grad,
//   DataType::kFloat32,
//                                                        {1000, 2048}, ReduceOp::kAverage));
//   ... more work ...
//   KOLO_RETURN_IF_ERROR(engine->Wait(h));
//   KOLO_RETURN_IF_ERROR(engine->Shutdown());
//
// Thread-safety: every method may be called from any thread. Buffers passed to *Async belong to
// the engine until the handle completes: they must stay valid and unchanged (inputs) or untouched
// (outputs) until Wait returns or Poll reports completion.
//
// Errors: a failed collective completes its handle with a Status naming the tensor, the ranks
// involved and the cause, on every rank. The background thread's first fatal error (a lost peer,
// a protocol violation) is sticky: every pending and later operation fails with it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/backends/ps/types.h"  // Role, VariableSpec, SgdSettings
#include "engine/common/dtype.h"
#include "engine/common/options.h"
#include "engine/common/status.h"
#include "engine/common/tensor.h"  // ReduceOp, TensorPlace, GatheredTensor

namespace kolo {

namespace bootstrap {
class Store;
}
namespace backends::ps {
struct Job;
}

// OK when this build has the transport `name` (Options::transport: KOLO_TRANSPORT, --transport);
// otherwise InvalidArgument naming it and the transports there are. Engine::Create checks it too.
Status CheckTransportName(const std::string& name);

// OK when this host can use the transport of `options` at all (rdma: the verbs library loads and
// a device with an ACTIVE port exists, Options::ib_*); otherwise an error naming the host, for
// start-up checks of flags. Engine::Create checks it too.
Status CheckTransportUsable(const Options& options);

// Identifies one submitted operation. Cheap to copy.
struct Handle {
  int64_t id = -1;
};

class Engine {
 public:
  // Starts one rank: connects to every peer (address exchange through the store at
  // options.store_addr, over MPI when launched by mpirun, or in-process when `store` is given),
  // checks that every rank uses the same settings, and starts the background thread.
  // `store` (optional) overrides the rendezvous: ranks running as threads of one process share one
  // bootstrap::InMemoryStore. Fails if any rank's options differ in a setting that must agree.
  static StatusOr<std::unique_ptr<Engine>> Create(const Options& options,
                                                  bootstrap::Store* store = nullptr);
  // Shuts down (as Shutdown) if that was not done.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // On worker ranks of a "ps" job: the worker index and worker count (data-parallel ranks); on
  // server ranks: the server index and server count. Otherwise the launch rank and size.
  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  const Options& options() const;

  // Allreduce: out = sum (or mean) over ranks of `in`. `in` may equal `out` (in place).
  // Errors at submission: a name already in flight; an engine that has shut down.
  StatusOr<Handle> AllreduceAsync(const std::string& name, const void* in, void* out,
                                  DataType dtype, const Shape& shape, ReduceOp op,
                                  const TensorPlace& place = {});

  // Broadcast `data` (in place) from rank `root` to every rank.
  StatusOr<Handle> BroadcastAsync(const std::string& name, void* data, DataType dtype,
                                  const Shape& shape, int root, const TensorPlace& place = {});

  // Allgather: every rank's tensor concatenated along the first dimension, which may differ per
  // rank (the other dimensions must agree). Fetch the result with TakeGathered after Wait.
  StatusOr<Handle> AllgatherAsync(const std::string& name, const void* in, DataType dtype,
                                  const Shape& shape);

  // Blocks until `handle` completes and returns its status; DeadlineExceeded if `timeout` passes
  // first (the operation continues). A handle can be waited on once; afterwards it is unknown.
  // Of several threads waiting on one handle, one gets its status and the others an error.
  Status Wait(Handle handle, std::chrono::milliseconds timeout = std::chrono::hours(24));
  // True if `handle` has completed (then Wait returns at once).
  StatusOr<bool> Poll(Handle handle);
  // The gathered tensor of a completed allgather `handle` (call before or instead of Wait; the
  // handle is then consumed).
  StatusOr<GatheredTensor> TakeGathered(Handle handle);

  // Returns once every rank has called Barrier (negotiated like any collective).
  Status Barrier();

  // What an autotuner may change while the job runs. Every rank must use the same values.
  struct Tunables {
    int64_t fusion_threshold_bytes = 64ll << 20;  // Options::fusion_threshold_bytes
    double cycle_time_ms = 1.0;                   // Options::cycle_time_ms
    std::string allreduce_algorithm = "auto";     // Options::allreduce_algorithm (ring backend)
    // Options::hierarchical_allreduce; switchable only where CanSwitchHierarchical.
    bool hierarchical_allreduce = false;
  };
  // Whether Retune may switch hierarchical allreduce on and off: the job spans several hosts with
  // the same number of ranks (more than one) on each, and the engine connected the hierarchical
  // rings' peers at start-up (Options::hierarchical_allreduce or hierarchical_switchable).
  bool CanSwitchHierarchical() const;
  // The tunables in force on this rank.
  Tunables tunables() const;
  // Switches every rank to `t` at the same point of the collective stream: an allreduce named
  // `name` (every rank calls Retune with the same name and values, between steps: the trainer
  // broadcasts rank 0's first), after whose cycle each rank applies `t` before it runs anything
  // agreed later; so fusion groups and algorithms never differ between ranks. Returns once the
  // collective has run here (the switch follows within the same cycle). Errors (before anything is
  // submitted): a value out of range or an algorithm the backend cannot run, naming it and what is
  // allowed. The device staged ring of device tensors keeps its algorithm.
  Status Retune(const std::string& name, const Tunables& t);

  // Stops the background thread after the current cycle. Operations still pending fail with
  // "shut down". Any rank's shutdown ends the job's engine on every rank. Idempotent, and safe to
  // call from several threads at once (each returns once the background thread has stopped).
  Status Shutdown();

  // --- Parameter servers (backend "ps"). Under "ps", allreduce, broadcast, allgather and barrier
  // work among the workers (rank() and size() as above); server ranks only Serve.

  // kServer on parameter-server ranks; kWorker everywhere else (every rank of other backends).
  Role role() const;
  // True with backend "ps": workers push gradients and pull updated weights (PushPullAsync)
  // instead of averaging gradients and updating locally.
  bool updates_on_servers() const;

  // Server ranks: serves the workers until every worker has shut down (OK), or fails when a peer
  // dies or misbehaves (the error names it; every worker then fails too). Every wait is bounded:
  // a dead peer is seen at once, a stalled step as the KOLO_STALL_* settings say. Blocks the
  // calling thread. Errors: FailedPrecondition on a worker rank.
  [[nodiscard]] Status Serve();

  // Workers, once, before the first PushPullAsync, with the same list on every worker: every
  // variable to be updated on the servers, in creation (forward) order. Fixes the placement of
  // variables on servers (Options::ps_placement), the same on every rank; worker 0 prints each
  // server's share (one line per server, to stderr). Returns once every server has accepted the
  // list (bounded by the peer timeout). Errors: float32 only; duplicate or empty names; lists
  // that differ between workers (then every rank fails, naming the worker).
  [[nodiscard]] Status RegisterVariables(const std::vector<VariableSpec>& vars);

  // Workers (backend "ps"): pushes `grad`, this worker's gradient of variable `name`, to the
  // server(s) holding the variable, the moment it is called; once every worker has pushed the
  // variable for this step, each server averages the pushes, applies `sgd` (SgdSettings; worker
  // 0's settings, which must equal every worker's) and sends the new values, which are written
  // into `weights` before the handle completes (Wait / Poll). The first PushPull of a variable
  // also carries worker 0's `weights` as its initial value (after the trainer's broadcast every
  // worker holds the same). `grad` must stay unchanged and `weights` untouched until the handle
  // completes. One PushPull per variable may be in flight. dtype and shape must match the
  // registration. Errors at submission: unregistered name, mismatch, a name in flight, a rank
  // that is not a worker of a "ps" job, an engine that has failed or shut down.
  StatusOr<Handle> PushPullAsync(const std::string& name, const void* grad, void* weights,
                                 DataType dtype, const Shape& shape, const SgdSettings& sgd);

  // Statistics since Create, for benchmarks and tests.
  struct Stats {
    int64_t cycles = 0;  // exchanges this rank took part in (idle ranks run none)
    // Of those, cycles a caller waiting on a handle ran on its own thread (KOLO_CALLER_PROGRESS).
    int64_t caller_cycles = 0;
    int64_t negotiations = 0;  // cycles that went through the coordinator
    int64_t cache_hits = 0;    // tensors agreed through the response cache
    int64_t collectives = 0;   // backend calls (one per fused buffer)
    // Of those, allreduces that rode the negotiation's bit exchange (KOLO_RIDING_MAX_BYTES).
    int64_t riding_collectives = 0;
    int64_t tensors = 0;       // completed operations
    int64_t fused_bytes = 0;   // bytes of tensors reduced in fused groups
    int64_t packed_bytes = 0;  // of those, bytes copied through the fusion buffer
    // Time spent agreeing (bit-vector exchange and coordinator rounds) in cycles that released
    // work; includes waiting inside the exchange for ranks that arrive later.
    double coordination_us = 0;
    // Parameter servers: payload bytes this rank sent to / received from the other side (workers:
    // to and from the servers; servers: to and from the workers), and completed PushPulls
    // (workers) or applied shard updates (servers).
    int64_t ps_bytes_sent = 0;
    int64_t ps_bytes_received = 0;
    int64_t ps_updates = 0;
    // Workers of a parameter-server job: time with at least one PushPull in flight.
    double ps_busy_us = 0;
    // Time spent executing agreed work (fusion copies and collectives) in cycles that released
    // work; with coordination_us, the time the engine was communicating.
    double execute_us = 0;
    // Payload bytes of the allreduces this rank completed, every tensor (fused or not).
    int64_t allreduce_bytes = 0;
    // The same allreduces' bytes as they were reduced and sent: float32 tensors count half under
    // compression (Options::compression), every other tensor as its payload.
    int64_t allreduce_wire_bytes = 0;
    // Time this rank held submitted work back to gather it on its cycle grid (KOLO_CYCLE_TIME_MS)
    // before an exchange: what the cycle time costs in latency, which other load does not add to.
    double gather_us = 0;
    // Bytes kolo's own transport sent and received for this rank (ring, negotiation, broadcast,
    // allgather; not what MPI or NCCL move themselves), as of the last cycle. With the host-wide
    // area (one host over shared memory), a one-shot allreduce counts the buffer it put in as sent
    // and the other ranks' buffers it read as received.
    int64_t transport_bytes_sent = 0;
    int64_t transport_bytes_received = 0;
    // Which transports carry this rank's pairs (Options::transport "auto" picks per peer): "shm",
    // "tcp", "shm+tcp"; "none" for one rank; empty where the engine has no transport of its own.
    std::string transport_pairs;
    // The connections kolo's transport holds for this rank (the connection plan's peers:
    // collectives/plan.h) and the memory they hold (Device::transport_memory_bytes).
    int transport_connections = 0;
    int64_t transport_memory_bytes = 0;
    // TCP connections this rank opens to each peer it connects to over TCP (Options::tcp_streams
    // resolved: "auto" picks by the NIC's speed); within a pair the connecting rank's count holds.
    int tcp_streams = 1;
  };
  Stats stats() const;

  // When this rank's engine first failed for good (a peer lost, a collective failed), on the
  // steady clock; nothing while it has not. Lets a caller tell an error that came before a stop
  // signal (its cause) from one that followed it.
  std::optional<std::chrono::steady_clock::time_point> failed_at() const;

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  // One rank of the collective engine. `ps_job` (a worker of a parameter-server job, joined by
  // CreateParameterServerRank) supplies the rendezvous and the workers' address store; `options`
  // are then the worker's (rank and size among the workers) and were validated as launched.
  static StatusOr<std::unique_ptr<Engine>> CreateRank(const Options& options,
                                                      bootstrap::Store* store,
                                                      backends::ps::Job* ps_job);
  // Backend "ps" (engine_ps.cc): joins the job, then builds a server rank or a worker rank.
  static StatusOr<std::unique_ptr<Engine>> CreateParameterServerRank(const Options& options,
                                                                     bootstrap::Store* store);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kolo
