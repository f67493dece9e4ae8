#include "engine/bootstrap/mpi/mpi_env.h"

#include <mpi.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "engine/common/logging.h"
#include "engine/common/mutex.h"

static_assert(MPI_SUCCESS == 0, "KOLO_MPI_CHECK relies on MPI_SUCCESS being 0");

namespace kolo::bootstrap::mpi {
namespace {

// Serialises EnsureInitialized: MPI's own initialisation state is what it guards.
Mutex g_mu;
std::atomic<bool> g_initialized_by_kolo{false};

const char* ThreadLevelName(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

Status CheckThreadLevel(int provided, const char* who) {
  if (provided < MPI_THREAD_SERIALIZED) {
    return FailedPrecondition(
        "MPI {} thread level {}: kolo needs at least MPI_THREAD_SERIALIZED (its background thread "
        "makes MPI calls); initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) or let kolo do "
        "it",
        who, ThreadLevelName(provided));
  }
  return Status::OK();
}

void FinalizeIfOurs() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_initialized_by_kolo.load() && !finalized) MPI_Finalize();
}

}  // namespace

Status MpiErrorStatus(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
  return Internal("{}: {} (MPI error {})", call, len > 0 ? std::string(text, len) : "unknown error",
                  code);
}

Status EnsureInitialized() {
  MutexLock lock(g_mu);
  int finalized = 0;
  KOLO_MPI_CHECK(MPI_Finalized(&finalized));
  if (finalized) return FailedPrecondition("MPI was already finalised; it cannot be used again");
  int initialized = 0;
  KOLO_MPI_CHECK(MPI_Initialized(&initialized));
  int provided = 0;
  if (initialized) {
    KOLO_MPI_CHECK(MPI_Query_thread(&provided));
    return CheckThreadLevel(provided, "was initialised by the application with");
  }
  KOLO_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
  g_initialized_by_kolo = true;
  return CheckThreadLevel(provided, "provides only");
}

void AbortWorldIfInitialized(int code) {
  int initialized = 0, finalized = 0;
  if (MPI_Initialized(&initialized) != MPI_SUCCESS || !initialized) return;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

void FinalizeAtExit() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(FinalizeIfOurs); });
}

struct StartupWatchdog::State {
  Mutex mu;
  CondVar cv;
  bool done KOLO_GUARDED_BY(mu) = false;
  std::thread thread;
};

StartupWatchdog::StartupWatchdog(std::chrono::milliseconds timeout, int rank, std::string what)
    : state_(std::make_unique<State>()) {
  State* st = state_.get();
  st->thread = std::thread([st, timeout, rank, what = std::move(what)] {
    {
      MutexLock lock(st->mu);
      if (st->cv.WaitFor(st->mu, timeout, [&]() KOLO_REQUIRES(st->mu) { return st->done; })) {
        return;
      }
    }
    KOLO_LOG(kError,
             "rank {}: {} did not finish within {} ms: some rank of the job did not start or "
             "stopped taking part (MPI does not say which); ending the job",
             rank, what, timeout.count());
    AbortWorldIfInitialized(1);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  });
}

StartupWatchdog::~StartupWatchdog() {
  {
    MutexLock lock(state_->mu);
    state_->done = true;
  }
  state_->cv.notify_all();
  state_->thread.join();
}

bool InitializedByKolo() { return g_initialized_by_kolo.load(); }

Status CheckWorld(int rank, int size) {
  int world_rank = -1;
  int world_size = -1;
  KOLO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  KOLO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  if (world_rank != rank || world_size != size) {
    return FailedPrecondition(
        "MPI_COMM_WORLD has rank {} of {}, but the launch environment says rank {} of {}",
        world_rank, world_size, rank, size);
  }
  return Status::OK();
}

Status BroadcastString(std::string* data, int root) {
  int rank = -1;
  KOLO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  // An oversized payload is announced as length -1 so that every rank fails instead of waiting.
  int len = -1;
  if (rank == root && data->size() <= static_cast<size_t>(INT_MAX)) {
    len = static_cast<int>(data->size());
  }
  KOLO_MPI_CHECK(MPI_Bcast(&len, 1, MPI_INT, root, MPI_COMM_WORLD));
  if (len < 0) {
    return InvalidArgument("broadcast from rank {}: the payload exceeds {} bytes", root, INT_MAX);
  }
  data->resize(static_cast<size_t>(len));
  KOLO_MPI_CHECK(MPI_Bcast(data->data(), len, MPI_CHAR, root, MPI_COMM_WORLD));
  return Status::OK();
}

Status GatherFixed(const std::string& mine, int root, std::vector<std::string>* all) {
  int rank = -1;
  int size = 0;
  KOLO_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  KOLO_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size));
  const int n = static_cast<int>(mine.size());
  std::string joined(rank == root ? mine.size() * static_cast<size_t>(size) : 0, '\0');
  KOLO_MPI_CHECK(
      MPI_Gather(mine.data(), n, MPI_CHAR, joined.data(), n, MPI_CHAR, root, MPI_COMM_WORLD));
  all->clear();
  if (rank == root) {
    for (int r = 0; r < size; ++r) all->push_back(joined.substr(mine.size() * r, mine.size()));
  }
  return Status::OK();
}

}  // namespace kolo::bootstrap::mpi
