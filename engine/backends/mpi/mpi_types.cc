#include "engine/backends/mpi/mpi_types.h"

#include "engine/kernels/reduce.h"

namespace kolo::backends::mpi {
namespace {

void SumHalf(void* in, void* inout, int* len, MPI_Datatype*) {
  kernels::ReduceSum(DataType::kFloat16, inout, in, static_cast<size_t>(*len));
}
void SumBFloat16(void* in, void* inout, int* len, MPI_Datatype*) {
  kernels::ReduceSum(DataType::kBFloat16, inout, in, static_cast<size_t>(*len));
}

}  // namespace

SumTypes::SumTypes() {
  MPI_Type_contiguous(2, MPI_BYTE, &half_type_);
  MPI_Type_commit(&half_type_);
  MPI_Type_contiguous(2, MPI_BYTE, &bf16_type_);
  MPI_Type_commit(&bf16_type_);
  MPI_Op_create(&SumHalf, 1, &half_sum_);
  MPI_Op_create(&SumBFloat16, 1, &bf16_sum_);
}

SumTypes::~SumTypes() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Op_free(&half_sum_);
  MPI_Op_free(&bf16_sum_);
  MPI_Type_free(&half_type_);
  MPI_Type_free(&bf16_type_);
}

MPI_Datatype SumTypes::type(DataType dtype) const {
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

MPI_Op SumTypes::sum(DataType dtype) const {
  if (dtype == DataType::kFloat16) return half_sum_;
  if (dtype == DataType::kBFloat16) return bf16_sum_;
  return MPI_SUM;
}

}  // namespace kolo::backends::mpi
