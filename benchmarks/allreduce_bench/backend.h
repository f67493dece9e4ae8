// One measured allreduce implementation: a row label in the table.
//
// The harness (sweep.h) drives the Backends through, per buffer size:
//   Bind(buf, count)        untimed, every row: register the buffer, build per-size state
//   RunOnce(), each timed on its own: warmup + iters rounds, each round running every row once
//   Unbind()                untimed, every row: drop per-size state
// so every row of a size is bound at once and must leave the others' state alone. Every row
// reduces `buf` in place, as a trainer reduces its gradients: RunOnce replaces the `count`
// elements in buf with `op` applied over every rank's buf. The harness restores this rank's input
// into buf before each RunOnce and passes a barrier before and after it (untimed), the same way
// for every row. Every RunOnce is collective: all ranks call it for the same size in the same
// order. Methods are called from the main thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/allreduce_bench/bench_config.h"
#include "benchmarks/allreduce_bench/reference.h"
#include "engine/common/options.h"
#include "engine/common/status.h"

namespace kolo::bootstrap {
class Store;
}
namespace kolo::transport {
class Device;
}
namespace kolo::transport::shm {
class HostArea;
}

namespace kolo::bench {

class Control;

// The buffer a row reduces in place: host memory (device -1), or memory on CUDA device `device`
// (--device cuda), which only the rows that RunsOnDevice are given.
struct BenchBuffer {
  uint8_t* data = nullptr;
  size_t size = 0;  // bytes
  int device = -1;
  bool on_device() const { return device >= 0; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  // The row label: "ring", "mpi", "mpi-direct", "gloo-ring", "gloo-ring-chunked", "gloo-allreduce",
  // "link"; "ring-shm", "link-tcp", ... when the ring and link rows run over several transports.
  virtual std::string name() const = 0;
  virtual BackendKind kind() const = 0;
  // The kolo transport the row runs over (Options::transport), or "" for a row that does not use
  // kolo's transport to move its payload (mpi-direct, gloo, the engine's mpi backend).
  virtual std::string transport() const { return ""; }
  // Which transports carried the row's pairs, as transport::PairTransports says ("shm+tcp"), once
  // bound; "" like transport().
  virtual std::string pairs() const { return ""; }
  // False for `link`, which moves the bytes without reducing them: its output is not checked.
  virtual bool reduces() const { return true; }

  virtual Status Bind(const BenchBuffer& buf, size_t count) = 0;
  virtual Status RunOnce() = 0;
  virtual void Unbind() {}
  // For rows through the engine, after Unbind: where this rank's engine spent its time per call
  // of the last size, in microseconds, the median over the timed calls: agreeing
  // (Stats::coordination_us), executing (execute_us) and holding work for the cycle grid
  // (gather_us). Empty for other rows.
  virtual std::vector<double> EngineParts() const { return {}; }
};

// What backends are built from. Pointers are owned by the caller and outlive every Backend.
struct BackendEnv {
  const BenchConfig* config = nullptr;
  Options options;                    // engine options: environment, then flags
  bootstrap::Store* store = nullptr;  // the job's rendezvous store (callers prefix their keys)
  std::string listen_addr;            // IPv4 address this rank's transports bind
  // kolo's transports the ring and link rows run over, in order (at least one).
  std::vector<std::string> transports;
  // The benchmark's own device per transport, for the link rows (and control under kolo-run: the
  // first transport's); absent where none was connected.
  std::map<std::string, transport::Device*> devices;
  // The host-wide shared-memory area of a device whose every pair is shared memory on one host
  // (the one-shot allreduce's; collectives::AttachHostArea), by device; absent elsewhere.
  std::map<const transport::Device*, transport::shm::HostArea*> host_areas;
  Control* control = nullptr;
  int engine_starts = 0;  // engines started so far (each gets its own key prefix)
  // The most connections and transport memory any engine of the rows held on this rank.
  int engine_connections = 0;
  int64_t engine_transport_memory_bytes = 0;
};

// Whether this build and launch can run `kind`; the error names the backend, why not, and what to
// do (FailedPrecondition). Checked for every requested backend before any rank connects.
Status CheckBackendAvailable(BackendKind kind, const Options& options);

// Starts what `kind` needs from this process before any row or engine of it is built: MPI for mpi
// and mpi-direct (the engine's mpi backend expects MPI initialised; mpirun's rendezvous does it,
// a single rank without mpirun needs it done here). Collective under mpirun.
Status PrepareBackend(BackendKind kind, const Options& options);

// A buffer of `bytes` in CUDA device memory for --device cuda, on device `local_rank` modulo the
// devices visible. Fails naming the reason when this build has no CUDA or no device is present.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  virtual BenchBuffer view() const = 0;
  // Synchronous copies of the whole buffer (untimed: around the iterations).
  [[nodiscard]] virtual Status CopyFromHost(const void* src) = 0;
  [[nodiscard]] virtual Status CopyToHost(void* dst) = 0;
};
StatusOr<std::unique_ptr<DeviceBuffer>> AllocateDeviceBuffer(size_t bytes, int local_rank);

// OK when buffers of `place` can be had here: always for host memory; for cuda, a build with CUDA
// and a device visible; otherwise FailedPrecondition naming why.
Status CheckPlaceAvailable(BufferPlace place);

// True if `kind` needs the rendezvous store / the benchmark's kolo devices in BackendEnv.
bool NeedsStore(BackendKind kind);
bool NeedsDevice(BackendKind kind);

// The control channel for this launch: MPI under mpirun (initialising MPI if nobody has), else
// LocalControl for a single rank, else collectives over `device`. True from ControlNeedsDevice
// when `device` must be connected before MakeControl.
bool ControlNeedsDevice(const Options& options);
StatusOr<std::unique_ptr<Control>> MakeControl(const Options& options, transport::Device* device);

// Open MPI's selection of byte transfer layers (its "btl" parameter, e.g. "self,vader") when
// this launch runs MPI rows under mpirun; "default" when MPI was left to choose; "" without MPI.
std::string MpiBtl(const Options& options);

// After a rank-local failure under mpirun: MPI_Abort, so that no rank waits forever in a
// collective for this one (and this one does not wait in MPI_Finalize for them). Returns if MPI
// is not in use.
void AbortJobAfterError(const Options& options, int exit_code);

// Builds the rows of `kind` (gloo gives gloo-ring-chunked and gloo-allreduce, plus gloo-ring with
// --gloo-all). Collective: every
// rank calls it for the same kinds in the same order.
StatusOr<std::vector<std::unique_ptr<Backend>>> MakeBackends(BackendKind kind, BackendEnv& env);

}  // namespace kolo::bench
