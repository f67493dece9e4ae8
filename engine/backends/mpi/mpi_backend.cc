#include <mpi.h>

#include <memory>

#include "engine/backends/backend.h"
#include "engine/collectives/reduce.h"

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

// MPI has no float16/bfloat16 sum: 16-bit contiguous types with a user op that calls kolo's
// reduction kernel (accumulating in float32, as the ring does).
void SumHalf(void* in, void* inout, int* len, MPI_Datatype*) {
  collectives::ReduceSum(DataType::kFloat16, inout, in, static_cast<size_t>(*len));
}
void SumBFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  collectives::ReduceSum(DataType::kBFloat16, inout, in, static_cast<size_t>(*len));
}

class MpiBackend final : public Backend {
 public:
  MpiBackend() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Type_contiguous(2, MPI_BYTE, &half_type_);
    MPI_Type_commit(&half_type_);
    MPI_Type_contiguous(2, MPI_BYTE, &bf16_type_);
    MPI_Type_commit(&bf16_type_);
    MPI_Op_create(&SumHalf, 1, &half_sum_);
    MPI_Op_create(&SumBFloat16, 1, &bf16_sum_);
  }
  ~MpiBackend() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Op_free(&half_sum_);
    MPI_Op_free(&bf16_sum_);
    MPI_Type_free(&half_type_);
    MPI_Type_free(&bf16_type_);
    MPI_Comm_free(&comm_);
  }

  const char* name() const override { return "mpi"; }
  bool Enabled(coordinator::CollectiveType, DataType) const override { return true; }

  Status Allreduce(void* buf, size_t count, DataType dtype) override {
    // MPI counts are int: large buffers go in pieces.
    const size_t elem = DataTypeSize(dtype);
    MPI_Datatype type = Type(dtype);
    MPI_Op op = MPI_SUM;
    if (dtype == DataType::kFloat16) op = half_sum_;
    if (dtype == DataType::kBFloat16) op = bf16_sum_;
    auto* p = static_cast<uint8_t*>(buf);
    for (size_t done = 0; done < count;) {
      const size_t n = std::min<size_t>(count - done, 1u << 30);
      KOLO_MPI_RETURN_IF_ERROR(
          MPI_Allreduce(MPI_IN_PLACE, p + done * elem, static_cast<int>(n), type, op, comm_));
      done += n;
    }
    return Status::OK();
  }

  Status Broadcast(void* buf, size_t nbytes, int root) override {
    auto* p = static_cast<uint8_t*>(buf);
    for (size_t done = 0; done < nbytes;) {
      const size_t n = std::min<size_t>(nbytes - done, 1u << 30);
      KOLO_MPI_RETURN_IF_ERROR(MPI_Bcast(p + done, static_cast<int>(n), MPI_BYTE, root, comm_));
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
    KOLO_MPI_RETURN_IF_ERROR(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, buf, counts.data(),
                                            displs.data(), MPI_BYTE, comm_));
    return Status::OK();
  }

 private:
  MPI_Datatype Type(DataType dtype) const {
    switch (dtype) {
      case DataType::kFloat32:
        return MPI_FLOAT;
      case DataType::kFloat64:
        return MPI_DOUBLE;
      case DataType::kFloat16:
        return half_type_;
      case DataType::kBFloat16:
        return bf16_type_;
      case DataType::kInt32:
        return MPI_INT32_T;
      case DataType::kInt64:
        return MPI_INT64_T;
      case DataType::kUInt8:
        return MPI_UINT8_T;
    }
    return MPI_BYTE;
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Datatype half_type_ = MPI_DATATYPE_NULL;
  MPI_Datatype bf16_type_ = MPI_DATATYPE_NULL;
  MPI_Op half_sum_ = MPI_OP_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
};

}  // namespace

std::unique_ptr<Backend> MakeMpiBackend(std::string* why) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    *why = "MPI is not initialised: the mpi backend needs a launch by mpirun";
    return nullptr;
  }
  return std::make_unique<MpiBackend>();
}

}  // namespace kolo::backends
