#include "benchmarks/allreduce_bench/mpi/mpi_peer.h"

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "engine/backends/mpi/mpi_types.h"
#include "engine/bootstrap/mpi/mpi_env.h"
#include "engine/kernels/reduce.h"

namespace kolo::bench::mpi {
namespace {

// A duplicate of MPI_COMM_WORLD, so that the benchmark's messages never match the engine's.
class DupComm {
 public:
  DupComm() = default;
  DupComm(const DupComm&) = delete;
  DupComm& operator=(const DupComm&) = delete;
  ~DupComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
  }
  Status Init() {
    KOLO_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    KOLO_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    KOLO_MPI_CHECK(MPI_Comm_size(comm_, &size_));
    return Status::OK();
  }
  MPI_Comm get() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

class MpiControl final : public Control {
 public:
  Status Init() { return comm_.Init(); }
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  const char* name() const override { return "mpi"; }

  Status Barrier() override {
    KOLO_MPI_CHECK(MPI_Barrier(comm_.get()));
    return Status::OK();
  }

  StatusOr<std::vector<double>> AllgatherDoubles(const std::vector<double>& mine) override {
    if (mine.size() > static_cast<size_t>(INT_MAX / comm_.size())) {
      return InvalidArgument("control gather of {} values per rank is too large", mine.size());
    }
    std::vector<double> all(mine.size() * static_cast<size_t>(comm_.size()));
    KOLO_MPI_CHECK(MPI_Allgather(mine.data(), static_cast<int>(mine.size()), MPI_DOUBLE, all.data(),
                                 static_cast<int>(mine.size()), MPI_DOUBLE, comm_.get()));
    return all;
  }

  StatusOr<std::vector<std::string>> AllgatherStrings(const std::string& mine) override {
    const int n = comm_.size();
    int len = static_cast<int>(mine.size());
    std::vector<int> lens(static_cast<size_t>(n));
    KOLO_MPI_CHECK(MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm_.get()));
    std::vector<int> displs(static_cast<size_t>(n), 0);
    for (int r = 1; r < n; ++r) displs[r] = displs[r - 1] + lens[r - 1];
    std::string all(static_cast<size_t>(displs[n - 1] + lens[n - 1]), '\0');
    KOLO_MPI_CHECK(MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(),
                                  displs.data(), MPI_CHAR, comm_.get()));
    std::vector<std::string> out;
    for (int r = 0; r < n; ++r) out.push_back(all.substr(displs[r], lens[r]));
    return out;
  }

 private:
  DupComm comm_;
};

class MpiDirect final : public Backend {
 public:
  explicit MpiDirect(const BenchConfig& config) : dtype_(config.dtype), op_(config.op) {}
  Status Init() {
    KOLO_RETURN_IF_ERROR(comm_.Init());
    types_ = std::make_unique<backends::mpi::SumTypes>();
    type_ = types_->type(dtype_);
    mpi_op_ = types_->sum(dtype_);
    return Status::OK();
  }

  std::string name() const override { return "mpi-direct"; }
  BackendKind kind() const override { return BackendKind::kMpiDirect; }

  Status Bind(const BenchBuffer& buf, size_t count) override {
    if (count > static_cast<size_t>(INT_MAX)) {
      return InvalidArgument("mpi-direct: {} elements exceed MPI's int count (at most {})", count,
                             INT_MAX);
    }
    buf_ = buf.data;
    count_ = count;
    return Status::OK();
  }

  Status RunOnce() override {
    KOLO_MPI_CHECK(
        MPI_Allreduce(MPI_IN_PLACE, buf_, static_cast<int>(count_), type_, mpi_op_, comm_.get()));
    if (op_ == ReduceOp::kAverage) {
      kernels::Scale(dtype_, buf_, count_, 1.0 / comm_.size());
    }
    return Status::OK();
  }

 private:
  DataType dtype_;
  ReduceOp op_;
  DupComm comm_;
  std::unique_ptr<backends::mpi::SumTypes> types_;  // made after MPI is initialised
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op mpi_op_ = MPI_SUM;
  void* buf_ = nullptr;
  size_t count_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Control>> MakeMpiControl() {
  auto control = std::make_unique<MpiControl>();
  KOLO_RETURN_IF_ERROR(control->Init());
  return std::unique_ptr<Control>(std::move(control));
}

StatusOr<std::unique_ptr<Backend>> MakeMpiDirect(const BenchConfig& config) {
  auto peer = std::make_unique<MpiDirect>(config);
  KOLO_RETURN_IF_ERROR(peer->Init());
  return std::unique_ptr<Backend>(std::move(peer));
}

std::string BtlSelection() {
  // The thread level MPI already runs at: Open MPI records what MPI_T_init_thread asks for as the
  // process's level.
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  int provided = 0;
  if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return "unknown";
  std::string value = "unknown";
  int index = -1;
  MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
  int count = 0;
  if (MPI_T_cvar_get_index("btl", &index) == MPI_SUCCESS &&
      MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
    std::vector<char> text(static_cast<size_t>(std::max(count, 1)) + 1, '\0');
    if (MPI_T_cvar_read(handle, text.data()) == MPI_SUCCESS) {
      value = text.data();
      if (value.empty()) value = "default";
    }
    MPI_T_cvar_handle_free(&handle);
  }
  MPI_T_finalize();
  return value;
}

void AbortWorld(int exit_code) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

}  // namespace kolo::bench::mpi
