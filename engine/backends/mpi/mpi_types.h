// MPI datatypes and sum operations for kolo's dtypes (only for code that includes <mpi.h>).
//
// MPI has no float16 or bfloat16 sum: those are 2-byte contiguous types with user operations that
// call kolo's reduction kernels (accumulating in float32, as the ring does), so an MPI reduction
// and a ring reduction give the same bits.
#pragma once

#include <mpi.h>

#include "engine/common/dtype.h"

namespace kolo::backends::mpi {

// Owns the user types and operations it creates. REQUIRES: MPI is initialised when constructed;
// the destructor frees nothing once MPI is finalised. Not copyable.
class SumTypes {
 public:
  SumTypes();
  ~SumTypes();
  SumTypes(const SumTypes&) = delete;
  SumTypes& operator=(const SumTypes&) = delete;

  MPI_Datatype type(DataType dtype) const;
  MPI_Op sum(DataType dtype) const;

 private:
  MPI_Datatype half_type_ = MPI_DATATYPE_NULL;
  MPI_Datatype bf16_type_ = MPI_DATATYPE_NULL;
  MPI_Op half_sum_ = MPI_OP_NULL;
  MPI_Op bf16_sum_ = MPI_OP_NULL;
};

}  // namespace kolo::backends::mpi
