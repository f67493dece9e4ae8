#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "engine/backends/backend.h"
#include "engine/backends/mpi/mpi_types.h"
#include "engine/common/fault_inject.h"
#include "engine/common/logging.h"
#include "engine/common/mutex.h"

namespace kolo::backends {
namespace {

#define KOLO_MPI_RETURN_IF_ERROR(call)                                                             \
  do {                                                                                             \
    const int kolo_mpi_rc_ = (call);                                                               \
    if (kolo_mpi_rc_ != MPI_SUCCESS) {                                                             \
      char kolo_mpi_msg_[MPI_MAX_ERROR_STRING];                                                    \
      int kolo_mpi_len_ = 0;                                                                       \
      MPI_Error_string(kolo_mpi_rc_, kolo_mpi_msg_, &kolo_mpi_len_);                               \
      return Internal("{} failed: {} (code {})", #call, std::string(kolo_mpi_msg_, kolo_mpi_len_), \
                      kolo_mpi_rc_);                                                               \
    }                                                                                              \
  } while (0)

// Aborts the MPI job when one blocking call outlives the peer timeout.
class Watchdog {
 public:
  static constexpr auto kProgressEvery = std::chrono::milliseconds(5);
  // `comm`: the communicator to probe for progress while idle (see Progress), when
  // `idle_progress` and MPI allows calls from this thread.
  Watchdog(std::chrono::milliseconds timeout, MPI_Comm comm, bool idle_progress)
      : timeout_(timeout),
        comm_(comm),
        progress_(idle_progress && ThreadMultiple()),
        thread_([this] { Watch(); }) {}
  ~Watchdog() { Stop(); }
  // Ends the watching thread (before the communicator it probes is freed). Idempotent.
  void Stop() {
    {
      MutexLock lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  // Marks the calling thread's blocking call (`what`, a literal, of `bytes`) as started, and
  // finished. Nothing is formatted unless the watchdog fires.
  void Enter(const char* what, size_t bytes) {
    MutexLock lock(mu_);
    what_ = what;
    bytes_ = bytes;
    since_ = std::chrono::steady_clock::now();
    busy_ = true;
  }
  void Leave() {
    MutexLock lock(mu_);
    busy_ = false;
  }

 private:
  void Watch() {
    MutexLock lock(mu_);
    while (!stop_) {
      cv_.WaitFor(mu_, progress_ ? kProgressEvery : std::chrono::milliseconds(200));
      if (stop_) break;
      if (!busy_) {
        Progress();
        continue;
      }
      if (std::chrono::steady_clock::now() - since_ < timeout_) continue;
      KOLO_LOG(kError,
               "mpi {} of {} bytes: still blocked after {} ms (the peer timeout): some rank "
               "stopped taking part (MPI does not say which); aborting the MPI job",
               what_, bytes_, timeout_.count());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }

  // Drives MPI's progress engine while this rank is not inside an MPI call. MPI promises only that
  // one side of a transfer completes: a rank may leave a collective with a protocol message its
  // peer still needs queued (Open MPI's ob1 queues a rendezvous FIN when its transport is out of
  // resources, and sends it at the next progress call). The engine then negotiates over kolo's own
  // transport, calling no MPI, and the peer would wait in the collective until the peer timeout.
  // With MPI_THREAD_MULTIPLE (what kolo asks for) a probe from this thread every few ms keeps
  // MPI moving; under mu_, so never during the engine's own call. Lower thread levels: none.
  void Progress() KOLO_REQUIRES(mu_) {
    if (!progress_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {
      progress_ = false;
      return;
    }
    int flag = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, MPI_STATUS_IGNORE);
  }

  static bool ThreadMultiple() {
    int provided = MPI_THREAD_SINGLE;
    return MPI_Query_thread(&provided) == MPI_SUCCESS && provided == MPI_THREAD_MULTIPLE;
  }

  const std::chrono::milliseconds timeout_;
  const MPI_Comm comm_;
  Mutex mu_;
  bool progress_ KOLO_GUARDED_BY(mu_);
  CondVar cv_;
  bool stop_ KOLO_GUARDED_BY(mu_) = false;
  bool busy_ KOLO_GUARDED_BY(mu_) = false;
  const char* what_ KOLO_GUARDED_BY(mu_) = "";
  size_t bytes_ KOLO_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point since_ KOLO_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts once the rest is built
};

class MpiBackend final : public Backend {
 public:
  MpiBackend(std::chrono::milliseconds timeout, bool idle_progress)
      : comm_(DupWorld()), watchdog_(timeout, comm_, idle_progress) {
    MPI_Comm_rank(comm_, &rank_);
  }
  ~MpiBackend() override {
    watchdog_.Stop();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  const char* name() const override { return "mpi"; }
  bool Enabled(coordinator::CollectiveType, DataType) const override { return true; }

  Status Allreduce(void* buf, size_t count, DataType dtype) override {
    // MPI counts are int: large buffers go in pieces.
    const size_t elem = DataTypeSize(dtype);
    MPI_Datatype type = types_.type(dtype);
    MPI_Op op = types_.sum(dtype);
    auto* p = static_cast<uint8_t*>(buf);
    for (size_t done = 0; done < count;) {
      const size_t n = std::min<size_t>(count - done, 1u << 30);
      FaultPoint(FaultPointId::kMpi, rank_);
      watchdog_.Enter("allreduce", n * elem);
      const int rc =
          MPI_Allreduce(MPI_IN_PLACE, p + done * elem, static_cast<int>(n), type, op, comm_);
      watchdog_.Leave();
      KOLO_MPI_RETURN_IF_ERROR(rc);
      done += n;
    }
    return Status::OK();
  }

  Status Broadcast(void* buf, size_t nbytes, int root) override {
    auto* p = static_cast<uint8_t*>(buf);
    for (size_t done = 0; done < nbytes;) {
      const size_t n = std::min<size_t>(nbytes - done, 1u << 30);
      FaultPoint(FaultPointId::kMpi, rank_);
      watchdog_.Enter("broadcast", n);
      const int rc = MPI_Bcast(p + done, static_cast<int>(n), MPI_BYTE, root, comm_);
      watchdog_.Leave();
      KOLO_MPI_RETURN_IF_ERROR(rc);
      done += n;
    }
    return Status::OK();
  }

  Status Allgatherv(void* buf, const std::vector<size_t>& bytes_per_rank) override {
    std::vector<int> counts, displs;
    size_t off = 0;
    for (size_t b : bytes_per_rank) {
      if (b > static_cast<size_t>(INT32_MAX) || off > static_cast<size_t>(INT32_MAX)) {
        return InvalidArgument("allgather block of {} bytes is too large for the mpi backend", b);
      }
      counts.push_back(static_cast<int>(b));
      displs.push_back(static_cast<int>(off));
      off += b;
    }
    FaultPoint(FaultPointId::kMpi, rank_);
    watchdog_.Enter("allgather", off);
    const int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, buf, counts.data(), displs.data(),
                                  MPI_BYTE, comm_);
    watchdog_.Leave();
    KOLO_MPI_RETURN_IF_ERROR(rc);
    return Status::OK();
  }

 private:
  static MPI_Comm DupWorld() {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    return comm;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;  // before watchdog_, which probes it
  Watchdog watchdog_;
  int rank_ = 0;
  mpi::SumTypes types_;
};

}  // namespace

std::unique_ptr<Backend> MakeMpiBackend(std::chrono::milliseconds timeout, bool idle_progress,
                                        std::string* why) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    *why = "MPI is not initialised: the mpi backend needs a launch by mpirun";
    return nullptr;
  }
  return std::make_unique<MpiBackend>(timeout, idle_progress);
}

}  // namespace kolo::backends
