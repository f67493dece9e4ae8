// What a collective operates on, shared by the engine's API and the layers below it: the reduce
// operation, where a tensor's memory lives, and an allgather's result.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/common/dtype.h"

namespace kolo {

enum class ReduceOp : uint8_t { kSum = 0, kAverage = 1 };
const char* ReduceOpName(ReduceOp op);

// Where a tensor's memory lives and when it is ready to be read.
struct TensorPlace {
  // -1: host memory. >= 0: memory on this CUDA device (needs a build with CUDA and a backend that
  // moves device tensors; otherwise submission fails naming the tensor).
  int device = -1;
  // For device tensors: a cudaEvent_t recorded after the producer's last write. The engine waits
  // on this event (not on the whole device) before it reads the tensor. nullptr: ready now.
  // The event must stay valid until the handle completes.
  void* ready_event = nullptr;
  bool on_device() const { return device >= 0; }
};

// The result of an allgather: the concatenation of every rank's tensor along the first dimension.
struct GatheredTensor {
  std::vector<uint8_t> data;
  Shape shape;
  std::vector<int64_t> first_dims;  // each rank's first dimension, in rank order
};

}  // namespace kolo
