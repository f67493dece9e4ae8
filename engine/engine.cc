#include "engine/engine.h"

#include <fmt/format.h>

#include <optional>

#include "engine/backends/ring/staged_ring.h"
#include "engine/collectives/plan.h"
#include "engine/collectives/settings_check.h"
#include "engine/common/logging.h"
#include "engine/engine_impl.h"
#include "engine/transport/registry.h"

namespace kolo {
namespace {

using coordinator::CollectiveType;

}  // namespace

Status CheckTransportName(const std::string& name) { return transport::CheckTransport(name); }

Status CheckTransportUsable(const Options& options) {
  return transport::ProbeTransport(options.transport, transport::SettingsFrom(options, "", ""));
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() { Shutdown().IgnoreError(); }

StatusOr<std::unique_ptr<Engine>> Engine::Create(const Options& options, bootstrap::Store* store) {
  KOLO_RETURN_IF_ERROR(options.Validate());
  if (options.backend == "none") {
    return InvalidArgument(
        "backend 'none' means no engine (kolo-train trains the single rank without one); an "
        "engine needs ring, mpi, ps or nccl");
  }
  KOLO_RETURN_IF_ERROR(transport::CheckTransport(options.transport));
  // A host that cannot use the transport (rdma without a device) fails now, before any work.
  KOLO_RETURN_IF_ERROR(CheckTransportUsable(options));
  if (options.backend == "ps") return CreateParameterServerRank(options, store);
  return CreateRank(options, store, nullptr);
}

StatusOr<std::unique_ptr<Engine>> Engine::CreateRank(const Options& options,
                                                     bootstrap::Store* store,
                                                     backends::ps::Job* ps_job) {
  SetLogLevel(options.log_level);
  if (options.size > 1) SetLogRank(options.rank);
  auto impl = std::make_unique<Impl>(options);
  Impl& e = *impl;

  if (ps_job != nullptr) {
    e.rendezvous = std::move(ps_job->rendezvous);
  } else {
    KOLO_ASSIGN_OR_RETURN(e.rendezvous, bootstrap::StartRendezvous(options, store));
  }
  transport::ConnectSettings link =
      transport::SettingsFrom(options, e.rendezvous.listen_addr, e.rendezvous.secret);
  bootstrap::Store& addresses = ps_job != nullptr ? *ps_job->worker_store : *e.rendezvous.store;
  KOLO_ASSIGN_OR_RETURN(const std::string host, bootstrap::ThisHostName(options.host_name));
  KOLO_ASSIGN_OR_RETURN(link.hosts, bootstrap::ExchangeHostLayout(addresses, host, options.rank,
                                                                  options.size, link.timeout));
  e.hosts = link.hosts;
  std::optional<collectives::HostGroups> hierarchical;
  if (options.hierarchical_allreduce && !e.hosts.uniform()) {
    return InvalidArgument(
        "hierarchical allreduce needs the same number of ranks on every host, but this job has "
        "{}; run without KOLO_HIERARCHICAL_ALLREDUCE, or launch as many ranks on each host",
        e.hosts.Summary());
  }
  // Switchable (Retune) where it could help: several hosts, the same ranks on each, more than one.
  const bool switchable = options.hierarchical_switchable && e.hosts.uniform() &&
                          e.hosts.num_hosts() > 1 && options.size > e.hosts.num_hosts();
  if (options.hierarchical_allreduce || switchable) {
    hierarchical = collectives::HostGroups{e.hosts.ranks_on(e.hosts.host(options.rank)),
                                           e.hosts.CrossGroup(options.rank)};
    e.hierarchical_groups = true;
  }
  // Only the peers the collectives use (collectives/plan.h).
  link.peers =
      collectives::PlanConnections(options.rank, options.size, e.comm.bitwise_direct_max_ranks,
                                   hierarchical ? &*hierarchical : nullptr);
  link.full_ring_peers = collectives::PlanFullRingPeers(options.rank, options.size,
                                                        hierarchical ? &*hierarchical : nullptr);
  auto device = transport::Connect(options.transport, link, addresses, options.rank, options.size);
  if (!device.ok()) {
    // The peers it could not reach, with their hosts.
    const Status& s = device.status();
    return Status(s.code(), e.hosts.NameHosts(s.message()))
        .WithContext(fmt::format("rank {}: connecting to peers", options.rank));
  }
  e.device = std::move(device).value();
  e.pair_transports = transport::PairTransports(*e.device);
  e.transport_connections = e.device->connections();
  e.transport_memory_bytes = static_cast<int64_t>(e.device->transport_memory_bytes());
  e.tcp_streams = link.tcp_streams;
  e.comm.device = e.device.get();
  e.comm.chunk_bytes = static_cast<size_t>(options.ring_chunk_bytes);
  e.comm.timeout = link.timeout;
  e.comm.messages = &e.message_scratch;
  {
    // Ranks may still be in their own connecting, bounded by the same timeout from their own
    // start (with a peer that stopped, say). The check waits twice as long, so that such a rank's
    // failure (naming the peer it could not reach) arrives before rank 0 gives up on it and
    // blames its silence instead (as the parameter-server job's start-up does).
    e.comm.timeout = 2 * link.timeout;
    const Status agreed = collectives::CheckSettingsMatch(e.comm, MustMatch(options));
    e.comm.timeout = link.timeout;
    KOLO_RETURN_IF_ERROR(agreed);
  }
  // Shared memory within a host: the ranks of a host map one area. Every rank on one host: all of
  // them, for the one-shot allreduce (collectives/one_shot.cc). Several hosts with hierarchical
  // allreduce (on or switchable) over auto: each host's ranks, for its small buffers (one step
  // within the host, then across hosts).
  const bool all_shm =
      e.hosts.num_hosts() == 1 && (options.transport == "auto" || options.transport == "shm");
  const bool one_host_area = options.size > 1 && all_shm && e.pair_transports == "shm";
  const bool host_areas = !one_host_area && hierarchical && options.transport == "auto" &&
                          hierarchical->local.size() > 1;
  if (one_host_area || host_areas) {
    std::vector<int> area_ranks(static_cast<size_t>(options.size));
    for (int r = 0; r < options.size; ++r) area_ranks[static_cast<size_t>(r)] = r;
    if (host_areas) area_ranks = hierarchical->local;
    KOLO_ASSIGN_OR_RETURN(
        e.host_area,
        collectives::AttachHostArea(
            e.comm, area_ranks, addresses,
            fmt::format("shm/host-area/{}", e.hosts.host(options.rank)), e.rendezvous.secret,
            std::chrono::microseconds(options.poll_spin_us), e.message_scratch));
    (one_host_area ? e.comm.host_area : hierarchical->area) = e.host_area.get();
    if (e.host_area) {
      e.transport_memory_bytes += static_cast<int64_t>(e.host_area->mapped_bytes());
    }
  }
  if (options.size > 1 && options.allreduce_algorithm == "one-shot" && !e.comm.host_area) {
    return InvalidArgument(
        "allreduce algorithm 'one-shot' needs every rank on one host with a host-wide "
        "shared-memory area; this job has {} (pairs over {}){}: allowed are auto, ring, "
        "recursive-doubling, halving-doubling",
        e.hosts.Summary(), e.pair_transports,
        all_shm ? ", and not every rank could map the area (see the warning)" : "");
  }

  if (options.backend == "mpi") {
    std::string why;
    auto mpi = backends::MakeMpiBackend(link.timeout, options.mpi_idle_progress, &why);
    if (!mpi) return InvalidArgument("backend 'mpi' is not available: {}", why);
    e.backends.push_back(std::move(mpi));
  }
  if (hierarchical) {
    KOLO_LOG(kInfo, "hierarchical allreduce{}: {} hosts x {} ranks ({})",
             options.hierarchical_allreduce ? "" : " (off; Retune may switch it on)",
             e.hosts.num_hosts(), hierarchical->local.size(), e.hosts.Summary());
  }
  KOLO_ASSIGN_OR_RETURN(const collectives::AllreduceAlgorithm algorithm,
                        collectives::ParseAllreduceAlgorithm(options.allreduce_algorithm));
  e.backends.push_back(backends::MakeRingBackend(&e.comm, std::move(hierarchical), algorithm,
                                                 e.hosts.num_hosts(),
                                                 options.hierarchical_allreduce));
  if (options.backend == "nccl") {
    // One GPU per rank: the rank's local index picks it.
    std::string why;
    const int gpus = cuda::DeviceCount(&why);
    if (gpus == 0) {
      return FailedPrecondition("rank {}: backend 'nccl' needs a CUDA device: {}", options.rank,
                                why);
    }
    KOLO_ASSIGN_OR_RETURN(e.gpu,
                          cuda::CreateDeviceContext(options.local_rank % gpus, link.timeout));
    KOLO_ASSIGN_OR_RETURN(e.device_collectives, backends::MakeNcclCollectives(e.comm, *e.gpu));
  }

  if (!options.timeline_path.empty()) {
    KOLO_ASSIGN_OR_RETURN(
        e.timeline,
        timeline::Timeline::Open(timeline::TimelinePathForRank(options.timeline_path, options.rank),
                                 options.rank));
  }
  execution::ExecutorSettings run;
  run.rank = options.rank;
  run.size = options.size;
  run.fusion_threshold_bytes = options.fusion_threshold_bytes;
  KOLO_ASSIGN_OR_RETURN(run.compression, execution::CompressionDataType(options.compression));
  e.executor = std::make_unique<execution::Executor>(run, &e.comm, &e.backends, e.timeline.get());
  if (e.gpu) e.executor->SetDevice(e.gpu.get(), e.device_collectives.get());
  coordinator::ControllerSettings negotiation;
  negotiation.rank = options.rank;
  negotiation.size = options.size;
  negotiation.cache_capacity = options.cache_capacity;
  negotiation.stall_warning_s = options.stall_warning_s;
  negotiation.stall_shutdown_s = options.stall_shutdown_s;
  // Riding saves one exchange of messages per small allreduce: where messages cross sockets or
  // NICs. Between ranks of one host over shared memory, where a message costs little and the
  // direct exchange sends N - 1 of them, it measured slower (docs/measured.md); where the
  // exchange goes through the host area instead, the payload shares its one step.
  const size_t exchange_words = coordinator::Controller::ExchangeWords(negotiation);
  e.exchange_through_area =
      collectives::BitExchangeThroughHostArea(e.comm, exchange_words * sizeof(uint64_t));
  KOLO_ASSIGN_OR_RETURN(
      e.peers,
      collectives::NegotiationPeers::Create(
          &e.comm, exchange_words,
          all_shm && !e.exchange_through_area ? 0 : static_cast<size_t>(options.riding_max_bytes)));
  e.controller =
      std::make_unique<coordinator::Controller>(negotiation, *e.peers, coordinator::SystemClock());
  e.riding_allowed = options.allreduce_algorithm == "auto";
  if (e.peers->RidingMaxBytes() > 0) {
    e.controller->SetRiding([&e](const std::vector<const coordinator::Request*>& hits,
                                 size_t max_bytes, coordinator::RidingPayload* payload) {
      return e.executor->PrepareRiding(hits, max_bytes, e.riding_allowed, e.ops, payload);
    });
  }
  KOLO_LOG(kInfo, "engine up: rank {}/{} backend {} fusion {} bytes cycle {} ms cache {}",
           options.rank, options.size, options.backend, options.fusion_threshold_bytes,
           options.cycle_time_ms, options.cache_capacity);
  // A waiting caller may drive the ring backend's cycles (Engine::Impl::DriveUntilDone). MPI's
  // and NCCL's calls stay on the background thread, where their libraries were set up.
  e.caller_drives = options.caller_progress && options.backend == "ring";
  e.peer_timeout = std::chrono::duration_cast<SteadyClock::duration>(
      std::chrono::duration<double>(options.peer_timeout_s));
  e.batch_driver = EngineThreadIsBatch(options.engine_sched, options.local_size, OnlineCpus());
  e.last_start = SteadyClock::now() - e.Cycle();
  e.thread = std::thread([&e] { e.Loop(); });
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

int Engine::rank() const { return impl_->options.rank; }
int Engine::size() const { return impl_->options.size; }
int Engine::local_rank() const { return impl_->options.local_rank; }
int Engine::local_size() const { return impl_->options.local_size; }
const Options& Engine::options() const { return impl_->options; }

StatusOr<Handle> Engine::Impl::Submit(execution::Operation op) {
  op.submitted = SteadyClock::now();
  const std::string name = op.request.name;
  const char* type = coordinator::CollectiveTypeName(op.request.type);
  if (name.empty()) return InvalidArgument("{}: the tensor name is empty", type);
  for (int64_t d : op.request.shape) {
    if (d < 0) {
      return InvalidArgument("{} '{}': shape {} has a negative dimension", type, name,
                             ShapeToString(op.request.shape));
    }
  }
  if (role == Role::kServer) {
    return FailedPrecondition(
        "{} '{}': this rank is parameter server {}; collectives run among the workers only", type,
        name, options.rank);
  }
  bool was_idle = false;
  KOLO_ASSIGN_OR_RETURN(const int64_t id,
                        ops.Submit(std::move(op), &was_idle, [this](const std::string& n) {
                          if (timeline) timeline->Begin(n, "QUEUE");
                        }));
  // The background thread waits in the device (or on its doorbell in the host area) with nothing
  // to do: wake it.
  if (was_idle) {
    if (exchange_through_area) {
      collectives::RingHostDoorbell(comm.host_area);
    } else {
      device->Wake();
    }
  }
  return Handle{id};
}

Status Engine::Impl::PrepareDevice(const char* type, const std::string& name,
                                   const TensorPlace& place) {
  if (options.backend != "ring" && options.backend != "nccl") {
    return InvalidArgument(
        "{} '{}': the tensor is on CUDA device {}, but backend '{}' moves host tensors only; use "
        "backend ring or nccl for device tensors, or pass a host tensor",
        type, name, place.device, options.backend);
  }
  // From now on the background thread alone drives (Engine::Impl::caller_drives).
  device_tensors.store(true, std::memory_order_release);
  MutexLock lock(gpu_mu);
  if (!gpu) {
    const auto timeout =
        std::chrono::milliseconds(static_cast<int64_t>(options.peer_timeout_s * 1000));
    auto ctx = cuda::CreateDeviceContext(place.device, timeout);
    if (!ctx.ok()) return ctx.status().WithContext(fmt::format("{} '{}'", type, name));
    auto algorithm = collectives::ParseAllreduceAlgorithm(options.allreduce_algorithm);
    if (!algorithm.ok()) return algorithm.status();
    auto ring = backends::MakeStagedRing(&comm, ctx->get(), *algorithm, hosts.num_hosts());
    if (!ring.ok()) return ring.status().WithContext(fmt::format("{} '{}'", type, name));
    gpu = std::move(ctx).value();
    device_collectives = std::move(ring).value();
    if (executor) executor->SetDevice(gpu.get(), device_collectives.get());
  }
  if (place.device != gpu->device()) {
    return InvalidArgument(
        "{} '{}': the tensor is on CUDA device {}, but rank {} moves tensors of CUDA device {} "
        "only (one device per rank{})",
        type, name, place.device, options.rank, gpu->device(),
        options.backend == "nccl" ? "; backend nccl uses device local_rank % device count" : "");
  }
  return Status::OK();
}

StatusOr<Handle> Engine::AllreduceAsync(const std::string& name, const void* in, void* out,
                                        DataType dtype, const Shape& shape, ReduceOp op,
                                        const TensorPlace& place) {
  execution::Operation e;
  e.request = {name, CollectiveType::kAllreduce, dtype, static_cast<uint8_t>(op), 0, shape};
  e.request.on_device = place.on_device();
  e.in = in;
  e.out = out;
  e.place = place;
  if (NumElements(shape) > 0 && (in == nullptr || out == nullptr)) {
    return InvalidArgument("allreduce '{}': null buffer for shape {}", name, ShapeToString(shape));
  }
  if (place.on_device()) KOLO_RETURN_IF_ERROR(impl_->PrepareDevice("allreduce", name, place));
  return impl_->Submit(std::move(e));
}

StatusOr<Handle> Engine::BroadcastAsync(const std::string& name, void* data, DataType dtype,
                                        const Shape& shape, int root, const TensorPlace& place) {
  if (root < 0 || root >= size()) {
    return InvalidArgument("broadcast '{}': root {} is outside [0, {})", name, root, size());
  }
  execution::Operation e;
  e.request = {name, CollectiveType::kBroadcast, dtype, 0, root, shape};
  e.request.on_device = place.on_device();
  e.out = data;
  e.place = place;
  if (NumElements(shape) > 0 && data == nullptr) {
    return InvalidArgument("broadcast '{}': null buffer for shape {}", name, ShapeToString(shape));
  }
  if (place.on_device()) KOLO_RETURN_IF_ERROR(impl_->PrepareDevice("broadcast", name, place));
  return impl_->Submit(std::move(e));
}

StatusOr<Handle> Engine::AllgatherAsync(const std::string& name, const void* in, DataType dtype,
                                        const Shape& shape) {
  if (shape.empty()) {
    return InvalidArgument(
        "allgather '{}': a scalar has no first dimension to gather along; "
        "pass shape [1]",
        name);
  }
  execution::Operation e;
  e.request = {name, CollectiveType::kAllgather, dtype, 0, 0, shape};
  e.in = in;
  if (NumElements(shape) > 0 && in == nullptr) {
    return InvalidArgument("allgather '{}': null buffer for shape {}", name, ShapeToString(shape));
  }
  return impl_->Submit(std::move(e));
}

Status Engine::Wait(Handle handle, std::chrono::milliseconds timeout) {
  // A year stands for "no bound" (the deadline must not overflow the clock).
  timeout = std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24 * 365));
  const auto deadline = SteadyClock::now() + timeout;
  // Run the cycles here where nobody drives them; else (or after) sleep until they complete it.
  // A handle still running after that: this caller sleeps on it, and comes back from the wait
  // when the driver completes it (the background thread then leaves the drive to callers a while).
  const bool sleeps = !impl_->DriveUntilDone(handle.id, deadline);
  const auto left = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(0),
      std::chrono::ceil<std::chrono::milliseconds>(deadline - SteadyClock::now()));
  if (sleeps) {
    MutexLock lock(impl_->drive_mu);
    ++impl_->callers_asleep;
  }
  StatusOr<execution::HandleState> state = impl_->ops.Wait(handle.id, left);
  if (sleeps) {
    MutexLock lock(impl_->drive_mu);
    --impl_->callers_asleep;
    impl_->caller_seen = SteadyClock::now();
  }
  if (state.status().code() == StatusCode::kDeadlineExceeded) {
    // Named with the caller's timeout, not what was left of it after driving.
    return DeadlineExceeded("handle {} did not complete within {} ms", handle.id, timeout.count());
  }
  KOLO_RETURN_IF_ERROR(state.status());
  return state->status;
}

StatusOr<bool> Engine::Poll(Handle handle) { return impl_->ops.Poll(handle.id); }

StatusOr<GatheredTensor> Engine::TakeGathered(Handle handle) {
  KOLO_ASSIGN_OR_RETURN(execution::HandleState state,
                        impl_->ops.Wait(handle.id, std::chrono::hours(24)));
  KOLO_RETURN_IF_ERROR(state.status);
  if (!state.gathered) return InvalidArgument("handle {} is not an allgather", handle.id);
  return GatheredTensor(std::move(*state.gathered));
}

Status Engine::Barrier() {
  int64_t seq;
  {
    MutexLock lock(impl_->mu);
    seq = impl_->barrier_seq++;
  }
  KOLO_ASSIGN_OR_RETURN(Handle h, AllreduceAsync(fmt::format("kolo.barrier.{}", seq), nullptr,
                                                 nullptr, DataType::kInt32, {0}, ReduceOp::kSum));
  return Wait(h);
}

bool Engine::CanSwitchHierarchical() const {
  return impl_->hierarchical_groups && impl_->options.backend == "ring";
}

Engine::Tunables Engine::tunables() const {
  MutexLock lock(impl_->mu);
  return impl_->tunables;
}

Status Engine::Retune(const std::string& name, const Tunables& t) {
  if (t.fusion_threshold_bytes < 0 || t.fusion_threshold_bytes > (int64_t{1} << 40)) {
    return InvalidArgument("retune: fusion threshold {} bytes is outside [0, 1 TiB]",
                           t.fusion_threshold_bytes);
  }
  if (!(t.cycle_time_ms > 0 && t.cycle_time_ms <= 10000)) {
    return InvalidArgument("retune: cycle time {} ms is outside (0, 10000]", t.cycle_time_ms);
  }
  KOLO_ASSIGN_OR_RETURN(const collectives::AllreduceAlgorithm algorithm,
                        collectives::ParseAllreduceAlgorithm(t.allreduce_algorithm));
  if (t.hierarchical_allreduce && algorithm != collectives::AllreduceAlgorithm::kAuto &&
      algorithm != collectives::AllreduceAlgorithm::kRing) {
    return InvalidArgument(
        "retune: allreduce algorithm '{}' cannot run a hierarchical allreduce: allowed are auto, "
        "ring",
        t.allreduce_algorithm);
  }
  if (t.hierarchical_allreduce != tunables().hierarchical_allreduce && !CanSwitchHierarchical()) {
    return InvalidArgument(
        "retune: hierarchical allreduce cannot be switched {} here: it needs several hosts with "
        "the same number of ranks (more than one) on each, and the engine started with "
        "Options::hierarchical_switchable (kolo-train --autotune sets it); this job has {}",
        t.hierarchical_allreduce ? "on" : "off", impl_->hosts.Summary());
  }
  if (role() != Role::kWorker || impl_->executor == nullptr) {
    return FailedPrecondition("retune: this rank runs no allreduce engine (a parameter server)");
  }
  if (algorithm == collectives::AllreduceAlgorithm::kOneShot && size() > 1 &&
      impl_->comm.host_area == nullptr) {
    return InvalidArgument(
        "retune: allreduce algorithm 'one-shot' needs every rank on one host with a host-wide "
        "shared-memory area, which this job has not: allowed are auto, ring, recursive-doubling, "
        "halving-doubling");
  }
  {
    MutexLock lock(impl_->mu);
    if (!impl_->pending_retunes.emplace(name, t).second) {
      return InvalidArgument("retune '{}' is already pending: give each switch its own name", name);
    }
    impl_->retunes_pending.fetch_add(1, std::memory_order_release);
  }
  // The switch point: an empty allreduce, negotiated like any collective, so that every rank
  // runs it, and applies `t` after it, in the same cycle.
  auto h = AllreduceAsync(name, nullptr, nullptr, DataType::kInt32, {0}, ReduceOp::kSum);
  if (!h.ok()) {
    MutexLock lock(impl_->mu);
    impl_->pending_retunes.erase(name);
    impl_->retunes_pending.fetch_sub(1, std::memory_order_relaxed);
    return h.status();
  }
  return Wait(*h);
}

Status Engine::Shutdown() {
  MutexLock once(impl_->shutdown_mu);
  // A parameter-server worker first tells the servers it is done (its errors are in fatal).
  if (impl_->ps_worker) impl_->ps_worker->Shutdown().IgnoreError();
  impl_->ops.RequestShutdown();
  {
    // A background thread that leaves the drive to callers takes it now.
    MutexLock lock(impl_->drive_mu);
    impl_->shutting = true;
    impl_->drive_cv.notify_all();
  }
  if (impl_->exchange_through_area) collectives::RingHostDoorbell(impl_->comm.host_area);
  if (impl_->device) impl_->device->Wake();
  if (impl_->thread.joinable()) impl_->thread.join();
  return impl_->ops.fatal();
}

std::optional<std::chrono::steady_clock::time_point> Engine::failed_at() const {
  return impl_->ops.failed_at();
}

Engine::Stats Engine::stats() const {
  const int64_t tensors = impl_->ops.completed();
  MutexLock lock(impl_->mu);
  Stats s = impl_->stats;
  s.tensors = tensors;
  s.transport_pairs = impl_->pair_transports;
  s.transport_connections = impl_->transport_connections;
  s.transport_memory_bytes = impl_->transport_memory_bytes;
  s.tcp_streams = impl_->tcp_streams;
  impl_->AddParameterServerStats(&s);
  return s;
}

}  // namespace kolo
