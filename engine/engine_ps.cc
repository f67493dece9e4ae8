// The Engine's parameter-server side (backend "ps"): joining the job as a worker or a server, and
// the calls that only a "ps" job has. The protocol lives in engine/backends/ps/.
#include <fmt/format.h>

#include "engine/common/logging.h"
#include "engine/engine_impl.h"

namespace kolo {

StatusOr<std::unique_ptr<Engine>> Engine::CreateParameterServerRank(const Options& options,
                                                                    bootstrap::Store* store) {
  KOLO_ASSIGN_OR_RETURN(backends::ps::Job job, backends::ps::Join(options, store));
  if (job.role == Role::kWorker) {
    const Options worker_options = job.worker_options;
    KOLO_ASSIGN_OR_RETURN(auto engine, CreateRank(worker_options, nullptr, &job));
    Impl& e = *engine->impl_;
    e.ps_worker = std::make_unique<backends::ps::Worker>(
        std::move(job),
        [&e](int64_t id, const Status& status) { e.ops.CompleteHandle(id, status); },
        [&e](const Status& status) { e.ops.SetFatal(status); }, e.timeline.get());
    return engine;
  }

  // A server: no engine thread and no collectives, only Serve. rank()/size() count servers.
  SetLogRank(options.rank);
  Options server_options = options;
  server_options.rank = job.index;
  server_options.size = job.roles.servers();
  server_options.local_rank = 0;
  server_options.local_size = 1;
  auto impl = std::make_unique<Impl>(server_options);
  Impl& e = *impl;
  e.role = Role::kServer;
  if (!options.timeline_path.empty()) {
    const int pid = job.roles.workers() + job.index;
    KOLO_ASSIGN_OR_RETURN(
        e.timeline,
        timeline::Timeline::Open(timeline::TimelinePathForRank(options.timeline_path, pid), pid));
  }
  e.rendezvous = std::move(job.rendezvous);
  KOLO_LOG(kInfo, "parameter server {} of {} up (rank {} of {})", job.index, job.roles.servers(),
           options.rank, options.size);
  e.ps_server = std::make_unique<backends::ps::Server>(std::move(job), e.timeline.get());
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Role Engine::role() const { return impl_->role; }

bool Engine::updates_on_servers() const { return impl_->options.backend == "ps"; }

Status Engine::Serve() {
  if (!impl_->ps_server) {
    return FailedPrecondition(
        "Serve: rank {} is not a parameter server (backend '{}'); only server ranks of a 'ps' job "
        "serve",
        rank(), impl_->options.backend);
  }
  return impl_->ps_server->Serve();
}

Status Engine::RegisterVariables(const std::vector<VariableSpec>& vars) {
  if (!impl_->ps_worker) {
    return FailedPrecondition(
        "RegisterVariables: needs a worker rank of a parameter-server job (backend 'ps'; this "
        "rank: backend '{}', {})",
        impl_->options.backend, impl_->role == Role::kServer ? "a server" : "a worker");
  }
  return impl_->ps_worker->RegisterVariables(vars);
}

StatusOr<Handle> Engine::PushPullAsync(const std::string& name, const void* grad, void* weights,
                                       DataType dtype, const Shape& shape, const SgdSettings& sgd) {
  Impl& e = *impl_;
  if (!e.ps_worker) {
    return FailedPrecondition(
        "pushpull '{}': needs a worker rank of a parameter-server job (backend 'ps'; this rank: "
        "backend '{}', {})",
        name, e.options.backend, e.role == Role::kServer ? "a server" : "a worker");
  }
  // Only this rank's own Shutdown stops its pushes. The workers' engine (their collectives among
  // themselves) also stops when another worker shuts down, but pushes and pulls go to the
  // servers, which name a worker that left in the step's error.
  KOLO_ASSIGN_OR_RETURN(const int64_t id, e.ops.Issue(fmt::format("pushpull '{}'", name)));
  Status s = e.ps_worker->PushPull(id, name, grad, weights, dtype, shape, sgd);
  if (!s.ok()) {
    e.ops.Forget(id);
    return s;
  }
  return Handle{id};
}

void Engine::Impl::AddParameterServerStats(Stats* s) const {
  if (ps_worker) {
    s->ps_bytes_sent = ps_worker->bytes_sent();
    s->ps_bytes_received = ps_worker->bytes_received();
    s->ps_updates = ps_worker->updates();
    s->ps_busy_us = ps_worker->busy_us();
  } else if (ps_server) {
    s->ps_bytes_sent = ps_server->bytes_sent();
    s->ps_bytes_received = ps_server->bytes_received();
    s->ps_updates = ps_server->updates();
  }
}

}  // namespace kolo
