// The one file that knows which optional peers this build has (KOLO_HAVE_MPI, KOLO_HAVE_GLOO,
// KOLO_HAVE_CUDA, KOLO_HAVE_NCCL); everything else asks it.
#include <fmt/format.h>

#include <chrono>

#include "benchmarks/allreduce_bench/backend.h"
#include "benchmarks/allreduce_bench/control.h"
#include "benchmarks/allreduce_bench/device_control.h"
#include "benchmarks/allreduce_bench/engine_rows.h"
#include "kolo/config.h"

#if KOLO_HAVE_MPI
#include "benchmarks/allreduce_bench/mpi/mpi_peer.h"
#include "engine/bootstrap/mpi/mpi_env.h"
#endif
#if KOLO_HAVE_GLOO
#include "benchmarks/allreduce_bench/gloo/gloo_peer.h"
#endif
#if KOLO_HAVE_CUDA
#include "benchmarks/allreduce_bench/cuda/device_buffer.h"
#endif
#if KOLO_HAVE_NCCL
#include "benchmarks/allreduce_bench/nccl/nccl_peer.h"
#endif
#include "engine/cuda/device_context.h"

namespace kolo::bench {
namespace {

std::chrono::milliseconds PeerTimeout(const Options& o) {
  return std::chrono::milliseconds(static_cast<int64_t>(o.peer_timeout_s * 1000.0));
}

#if KOLO_HAVE_MPI
Status StartMpi(const Options& options) {
  KOLO_RETURN_IF_ERROR(bootstrap::mpi::EnsureInitialized());
  bootstrap::mpi::FinalizeAtExit();
  return bootstrap::mpi::CheckWorld(options.rank, options.size);
}
#endif

}  // namespace

Status CheckBackendAvailable(BackendKind kind, const Options& options) {
  const char* name = BackendKindName(kind);
  switch (kind) {
    case BackendKind::kRing:
    case BackendKind::kRingHier:
    case BackendKind::kLink:
      return Status::OK();
    case BackendKind::kMpi:
    case BackendKind::kMpiDirect:
      if (!KOLO_HAVE_MPI) {
        return FailedPrecondition(
            "--backend {}: this build has no MPI (rebuild with libopenmpi-dev); available here: "
            "ring, link{}",
            name, KOLO_HAVE_GLOO ? ", gloo" : "");
      }
      if (!options.launched_by_mpirun && options.size > 1) {
        return FailedPrecondition(
            "--backend {} needs a launch by mpirun (OMPI_COMM_WORLD_SIZE is unset); under kolo-run "
            "use ring, link{}",
            name, KOLO_HAVE_GLOO ? ", gloo" : "");
      }
      return Status::OK();
    case BackendKind::kNccl:
    case BackendKind::kNcclDirect:
      if (!KOLO_HAVE_NCCL) {
        return FailedPrecondition(
            "--backend {}: this build has no NCCL (build with the CUDA toolkit and NCCL found); "
            "with --device cuda available here: ring, ring-hier",
            name);
      }
      return Status::OK();
    case BackendKind::kGloo:
      if (!KOLO_HAVE_GLOO) {
        return FailedPrecondition(
            "--backend gloo: this build has no Gloo (install libgloo-dev and reconfigure); "
            "available here: ring, link{}",
            KOLO_HAVE_MPI ? ", mpi, mpi-direct" : "");
      }
      return Status::OK();
  }
  return InvalidArgument("unknown backend");
}

Status PrepareBackend(BackendKind kind, const Options& options) {
  KOLO_RETURN_IF_ERROR(CheckBackendAvailable(kind, options));
#if KOLO_HAVE_MPI
  if (kind == BackendKind::kMpi || kind == BackendKind::kMpiDirect) return StartMpi(options);
#endif
  return Status::OK();
}

bool NeedsStore(BackendKind kind) { return kind != BackendKind::kMpiDirect; }

Status CheckPlaceAvailable(BufferPlace place) {
  if (place == BufferPlace::kHost) return Status::OK();
  if (!KOLO_HAVE_CUDA) {
    return FailedPrecondition(
        "--device cuda: this build has no CUDA (build with the CUDA toolkit found); allowed here: "
        "--device host");
  }
  std::string why;
  if (kolo::cuda::DeviceCount(&why) == 0) {
    return FailedPrecondition(
        "--device cuda: no CUDA device on this host ({}); allowed here: "
        "--device host",
        why);
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDeviceBuffer(size_t bytes, int local_rank) {
#if KOLO_HAVE_CUDA
  return cuda::AllocateDeviceBuffer(bytes, local_rank);
#else
  (void)bytes;
  (void)local_rank;
  return FailedPrecondition("--device cuda: this build has no CUDA");
#endif
}

bool NeedsDevice(BackendKind kind) { return kind == BackendKind::kLink; }

bool ControlNeedsDevice(const Options& options) {
  if (options.size == 1) return false;
  return !(options.launched_by_mpirun && KOLO_HAVE_MPI);
}

StatusOr<std::unique_ptr<Control>> MakeControl(const Options& options, transport::Device* device) {
#if KOLO_HAVE_MPI
  if (options.launched_by_mpirun) {
    KOLO_RETURN_IF_ERROR(StartMpi(options));
    return mpi::MakeMpiControl();
  }
#endif
  if (options.size == 1) return std::unique_ptr<Control>(std::make_unique<LocalControl>());
  if (device == nullptr) return Internal("the control channel needs a connected device");
  return MakeDeviceControl(*device, PeerTimeout(options));
}

std::string MpiBtl(const Options& options) {
#if KOLO_HAVE_MPI
  if (options.launched_by_mpirun) return mpi::BtlSelection();
#else
  (void)options;
#endif
  return "";
}

void AbortJobAfterError(const Options& options, int exit_code) {
#if KOLO_HAVE_MPI
  if (options.launched_by_mpirun && options.size > 1) mpi::AbortWorld(exit_code);
#else
  (void)options;
  (void)exit_code;
#endif
}

StatusOr<std::vector<std::unique_ptr<Backend>>> MakeBackends(BackendKind kind, BackendEnv& env) {
  KOLO_RETURN_IF_ERROR(CheckBackendAvailable(kind, env.options));
  std::vector<std::unique_ptr<Backend>> rows;
  // With several transports, a ring and a link row per transport, labelled by it.
  auto label = [&](const std::string& transport) {
    return env.transports.size() > 1 ? fmt::format("{}-{}", BackendKindName(kind), transport)
                                     : std::string(BackendKindName(kind));
  };
  switch (kind) {
    case BackendKind::kRing:
    case BackendKind::kRingHier:
    case BackendKind::kMpi:
    case BackendKind::kNccl:
      if (env.store == nullptr || env.transports.empty())
        return Internal("backend {} needs the rendezvous store", BackendKindName(kind));
      if (kind == BackendKind::kMpi || kind == BackendKind::kNccl) {
        rows.push_back(MakeEngineRow(kind, env, env.transports.front(), BackendKindName(kind)));
        return rows;
      }
      if (kind == BackendKind::kRing && !env.config->algorithms.empty()) {
        // --algorithms: per transport and algorithm, the algorithm alone on the benchmark's own
        // connections, then through the engine.
        for (const std::string& t : env.transports) {
          auto it = env.devices.find(t);
          if (it == env.devices.end() || it->second == nullptr) {
            return Internal("--algorithms needs a connected {} device", t);
          }
          const std::string suffix = env.transports.size() > 1 ? "-" + t : "";
          auto scratch = std::make_shared<collectives::Scratch>();
          for (const std::string& a : env.config->algorithms) {
            if (a == "one-shot" && env.options.size > 1 && !env.host_areas.count(it->second)) {
              return InvalidArgument(
                  "--algorithms one-shot needs every rank on one host over shared memory "
                  "(transport auto or shm), where the ranks map a host-wide area; transport '{}' "
                  "here pairs over {}: allowed are auto, ring, recursive-doubling, "
                  "halving-doubling",
                  t, transport::PairTransports(*it->second));
            }
            rows.push_back(MakeAloneRow(env, *it->second, a, "alone/" + a + suffix, scratch));
            rows.push_back(MakeEngineRow(kind, env, t, "ring/" + a + suffix, a));
          }
        }
        return rows;
      }
      for (const std::string& t : env.transports) {
        rows.push_back(MakeEngineRow(kind, env, t, label(t)));
      }
      return rows;
    case BackendKind::kLink:
      for (const std::string& t : env.transports) {
        auto it = env.devices.find(t);
        if (it == env.devices.end() || it->second == nullptr) {
          return Internal("backend link needs a connected {} device", t);
        }
        rows.push_back(MakeLinkRow(env, *it->second, label(t)));
      }
      return rows;
    case BackendKind::kMpiDirect: {
#if KOLO_HAVE_MPI
      KOLO_RETURN_IF_ERROR(StartMpi(env.options));  // idempotent
      KOLO_ASSIGN_OR_RETURN(auto peer, mpi::MakeMpiDirect(*env.config));
      rows.push_back(std::move(peer));
      return rows;
#else
      break;
#endif
    }
    case BackendKind::kNcclDirect: {
#if KOLO_HAVE_NCCL
      if (env.store == nullptr) return Internal("backend nccl-direct needs the rendezvous store");
      nccl::NcclSetup setup;
      setup.rank = env.options.rank;
      setup.size = env.options.size;
      setup.local_rank = env.options.local_rank;
      setup.timeout = PeerTimeout(env.options);
      bootstrap::PrefixStore store("bench/", *env.store);
      KOLO_ASSIGN_OR_RETURN(auto peer, nccl::MakeNcclDirect(*env.config, store, setup));
      rows.push_back(std::move(peer));
      return rows;
#else
      break;
#endif
    }
    case BackendKind::kGloo: {
#if KOLO_HAVE_GLOO
      if (env.store == nullptr) return Internal("backend gloo needs the rendezvous store");
      gloo::GlooSetup setup;
      setup.rank = env.options.rank;
      setup.size = env.options.size;
      setup.listen_addr = env.listen_addr;
      setup.timeout = PeerTimeout(env.options);
      return gloo::MakeGlooPeers(*env.config, *env.store, setup);
#else
      break;
#endif
    }
  }
  return Internal("backend {} is not built", BackendKindName(kind));
}

}  // namespace kolo::bench
