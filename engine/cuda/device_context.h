// The engine's CUDA state for device tensors, behind a vendor-free interface: nothing outside
// engine/cuda (and the backends that run on CUDA streams) includes a CUDA header.
//
// A DeviceContext owns one non-blocking stream on one device; every device operation of the engine
// (waiting on a tensor's ready event, packing the fusion buffer, scaling, unpacking) is queued on
// it in order, and the host blocks only in Synchronize. The device fusion buffer lives here too.
//
// Thread-safety: none. The engine creates the context on a submitting thread (before the first
// device tensor is queued) and then uses it from its background thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/common/dtype.h"
#include "engine/common/status.h"
#include "engine/fusion/fusion_buffer.h"

namespace kolo::cuda {

// The CUDA devices this process can use: 0 when this build has no CUDA, the driver is missing or
// no device is present; then *why (if given) says which.
int DeviceCount(std::string* why = nullptr);

class DeviceContext {
 public:
  virtual ~DeviceContext() = default;

  // The CUDA device ordinal.
  virtual int device() const = 0;
  // The context's stream, as a cudaStream_t.
  virtual void* stream() const = 0;
  // The longest any blocking wait of this context (and the collectives using it) may take.
  virtual std::chrono::milliseconds timeout() const = 0;

  // Makes this context's device current on the calling thread. Call before other methods on a
  // thread that has not yet done so (cheap when it already is).
  [[nodiscard]] virtual Status Activate() = 0;

  // Work queued on stream() after this call runs only once `event` (a cudaEvent_t, recorded by the
  // tensor's producer on any stream) has completed. The host does not block.
  [[nodiscard]] virtual Status WaitEvent(void* event) = 0;

  // A device buffer of at least `bytes` bytes, 256-byte aligned. Grows (after the stream has
  // drained: the old buffer may still be in use); contents are not preserved when it grows.
  [[nodiscard]] virtual StatusOr<uint8_t*> FusionBuffer(size_t bytes) = 0;

  // Queues on stream(), in one kernel launch, the copy of every entry (device memory of this
  // device; the ranges of one entry must not overlap). n == 0 queues nothing.
  [[nodiscard]] virtual Status Pack(const fusion::CopyEntry* entries, size_t n) = 0;

  // Queues on stream(), in one kernel launch, dst = src * scale element-wise as `dtype` for every
  // entry, with the semantics of fusion::UnpackEntries (scale 1.0: a plain copy). Here an entry's
  // dst may also equal its src (scaling in place).
  // REQUIRES: every entry's bytes is a multiple of DataTypeSize(dtype) and its pointers are aligned
  // to it.
  [[nodiscard]] virtual Status Unpack(const fusion::CopyEntry* entries, size_t n, DataType dtype,
                                      double scale) = 0;

  // Queues on stream(), in one kernel launch, gradient compression's cast for every entry:
  // dst = src * scale converted from `from` to `to` (the pairs kernels::CanConvert allows, with
  // kernels::Convert's semantics: the product in float32, rounded once to nearest even). An
  // entry's bytes are its source's; its dst holds as many elements of `to`.
  [[nodiscard]] virtual Status Convert(const fusion::CopyEntry* entries, size_t n, DataType from,
                                       DataType to, double scale) = 0;

  // Blocks (sleeping, never spinning) until everything queued on stream() so far has run.
  // DeadlineExceeded after timeout(); the first asynchronous CUDA error otherwise.
  [[nodiscard]] virtual Status Synchronize() = 0;
};

// A context on CUDA device `device`. Fails with the reason when this build has no CUDA, the
// device does not exist, or the stream cannot be created. Does not change the calling thread's
// current device.
StatusOr<std::unique_ptr<DeviceContext>> CreateDeviceContext(int device,
                                                             std::chrono::milliseconds timeout);

}  // namespace kolo::cuda
