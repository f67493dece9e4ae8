// Execution: what happens to the responses a negotiation agreed on. The executor plans the fusion
// groups (engine/fusion), packs small host tensors into the fusion buffer (large ones stay where
// they are when the backend reduces scattered buffers), runs each group's collective on the first
// backend that takes it (engine/backends), unpacks and scales for an average, records every phase
// on the timeline, and completes each tensor through Operations. Device tensors go through the
// device context and device collectives the engine installs.
//
// Driven by the engine's background thread only; every rank executes the same responses in the
// same order.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backends/backend.h"
#include "engine/backends/device_collectives.h"
#include "engine/collectives/collectives.h"
#include "engine/common/options.h"
#include "engine/common/status.h"
#include "engine/common/tensor.h"
#include "engine/coordinator/controller.h"
#include "engine/coordinator/message.h"
#include "engine/cuda/device_context.h"
#include "engine/fusion/fusion_buffer.h"
#include "engine/fusion/planner.h"
#include "engine/timeline/timeline.h"

namespace kolo::execution {

// One submitted operation, as the executor needs it.
struct Operation {
  coordinator::Request request;
  const void* in = nullptr;  // allreduce input, allgather input
  void* out = nullptr;       // allreduce output, broadcast data
  TensorPlace place;         // host, or a CUDA device with the producer's ready event
  std::chrono::steady_clock::time_point submitted;  // for the controller's stall accounting
};

// What execution adds to the engine's statistics.
struct ExecutionStats {
  int64_t collectives = 0;      // backend calls (one per fused buffer)
  int64_t fused_bytes = 0;      // bytes of tensors reduced in fused groups
  int64_t packed_bytes = 0;     // of those, bytes copied through the fusion buffer
  int64_t allreduce_bytes = 0;  // payload of completed allreduces, every tensor
  double execute_us = 0;        // time executing collectives, fusion copies included
  // Of allreduce_bytes, the bytes as they were reduced: half for compressed float32 tensors.
  int64_t allreduce_wire_bytes = 0;
  int64_t riding = 0;  // of collectives, those that rode the negotiation
};

// The engine's side: the operations this rank submitted, and where finished ones go
// (OperationTable).
class Operations {
 public:
  virtual ~Operations() = default;
  // The operation `name` this rank submitted and has not seen completed; null when none.
  virtual Operation* Find(const std::string& name) = 0;
  // `op` (from Find) finished with `status` (and, for an allgather, its result); it is gone
  // afterwards.
  virtual void Complete(Operation* op, const Status& status,
                        std::unique_ptr<GatheredTensor> gathered) = 0;
  // Adds to the statistics. Called on the executor's thread before the counted collective's
  // tensors complete.
  virtual void Count(const ExecutionStats& delta) = 0;
};

struct ExecutorSettings {
  int rank = 0;
  int size = 1;
  int64_t fusion_threshold_bytes = 64ll << 20;  // Options::fusion_threshold_bytes
  // Options::compression as the dtype float32 tensors travel in: kFloat16 or kBFloat16, or
  // kFloat32 for none.
  DataType compression = DataType::kFloat32;
};

// Options::compression's name as a wire dtype (engine/common/options.h).
using kolo::CompressionDataType;

class Executor {
 public:
  // `comm` (its on_phase reports ring phases to the timeline), `backends` (ordered; the last takes
  // everything) and `timeline` (may be null) must outlive the executor.
  Executor(const ExecutorSettings& settings, collectives::Comm* comm,
           const std::vector<std::unique_ptr<backends::Backend>>* backends,
           timeline::Timeline* timeline);

  // The device context and device collectives that move device tensors. Set once, before the
  // first device tensor is queued (the engine's submission side does it, under its lock, and the
  // queue hands the tensor to the background thread afterwards); both must outlive the executor.
  void SetDevice(cuda::DeviceContext* context, backends::DeviceCollectives* collectives);

  // Runs one negotiation's responses in order. Each response's operation is looked up once, here,
  // and passed down. An error response completes its tensor (if this rank has it) with the
  // error; every other tensor completes OK once its collective is done. A failed collective
  // returns its error, which is fatal for the job: the tensors of that group are not completed
  // here (the engine fails everything pending). A collective response naming a tensor this rank
  // did not submit is an Internal error.
  Status Execute(const std::vector<coordinator::Response>& responses, Operations& ops);

  // Engine::Retune: the fusion threshold of the cycles from the next on. Background thread only.
  void set_fusion_threshold_bytes(int64_t bytes) { settings_.fusion_threshold_bytes = bytes; }

  // Small allreduces riding the negotiation (coordinator::Controller::SetRiding). PrepareRiding:
  // when every one of `hits` is a host allreduce this rank submitted, sum or average, of one
  // dtype, not compressed, on the ring backend, and together at most max_bytes, copies their
  // inputs, in order, to payload->data (the exchange's own space where set; else a buffer of the
  // executor's) and points payload->sum at the buffer the sum goes to; returns false otherwise.
  // `allowed` is false where the allreduce algorithm was chosen by hand (riding would replace
  // it).
  bool PrepareRiding(const std::vector<const coordinator::Request*>& hits, size_t max_bytes,
                     bool allowed, Operations& ops, coordinator::RidingPayload* payload);
  // After a Negotiate that set NegotiationStats::riding: completes `responses` from the
  // payload's sum (scaled for an average), with their timeline activities and statistics.
  Status CompleteRiding(const std::vector<coordinator::Response>& responses, Operations& ops);

 private:
  // A group's operations, in the group's order, and what they share.
  struct GroupOps {
    std::vector<Operation*> members;
    DataType dtype = DataType::kFloat32;
    // What the collective reduces: dtype, or the compression's half type for float32 tensors.
    DataType wire = DataType::kFloat32;
    size_t bytes = 0;
    bool fused = false;
    double scale = 1.0;  // 1/size for an average, applied where the results are written
  };
  Status Allreduce(const GroupOps& group, Operations& ops);
  // Host tensors: small ones packed into the fusion buffer (a fused group), large ones (and a
  // tensor alone) in place when the backend reduces scattered buffers or there is one piece, all
  // in one collective.
  Status RunHost(const GroupOps& group, backends::Backend& backend, const std::string& op_name,
                 Operations& ops);
  // Compressed host tensors: each cast once into its slot of the fusion buffer in the wire dtype
  // (a lone tensor too), the buffer reduced in the wire dtype, and cast back into the outputs
  // with the average's scaling in the same pass.
  Status RunHostCompressed(const GroupOps& group, backends::Backend& backend,
                           const std::string& op_name, Operations& ops);
  // Device tensors: packed into the device fusion buffer (or reduced in place when alone) after
  // each tensor's ready event, reduced by the device collectives, unpacked and scaled on the
  // context's stream; returns once the results are in the outputs.
  Status RunDevice(const GroupOps& group, const std::string& op_name, Operations& ops);
  Status Broadcast(const coordinator::Response& response, Operation& op, Operations& ops);
  Status Allgather(const coordinator::Response& response, Operation& op, Operations& ops);
  backends::Backend& BackendFor(const coordinator::Request& request);
  void Begin(const std::string& name, const std::string& activity, const std::string& args = "");
  void End(const std::string& name, const std::string& activity);

  ExecutorSettings settings_;
  std::vector<uint8_t> riding_in_, riding_sum_;  // PrepareRiding's payload and its sum
  collectives::Comm* comm_;
  const std::vector<std::unique_ptr<backends::Backend>>* backends_;
  timeline::Timeline* timeline_;
  cuda::DeviceContext* gpu_ = nullptr;
  backends::DeviceCollectives* device_collectives_ = nullptr;
  fusion::FusionBuffer fusion_buffer_;
  std::vector<std::string> group_names_;  // tensors of the collective in flight (timeline)
};

}  // namespace kolo::execution
