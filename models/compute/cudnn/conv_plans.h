// Convolutions through cuDNN's graph API with each execution plan built once and kept
// (KOLO_CUDNN_CONV_API=plans). The legacy calls (cudnnConvolutionForward and the two backward
// ones) look their plan up again at every call: on an H200 in half precision that cost the host
// about 130 us per forward and 165 us per backward call, 48 ms of a ResNet-101 step against the
// convolutions' 40 ms on the device (reports/gpu/2026-11-28-h200/). Here each convolution,
// direction and output scale gets its plan once, chosen by timing the heuristics' first
// candidates as cudnnFind does (into a scratch output, so that no live buffer is written; only
// engines that keep the legacy calls' numerics: no down-conversion of the inputs, no reduction
// below float32), and
// its variant pack (the data pointers and the workspace) is kept too: kolo's buffers do not move
// between steps, so a call is one cudnnBackendExecute.
//
// Thread-safety: none; owned by one backend, used on its stream.
#pragma once

#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "engine/common/status.h"
#include "models/compute/cudnn/descriptors.h"

namespace kolo::models::compute::cudnn {

using BackendDesc = Owned<cudnnBackendDescriptor_t, cudnnBackendDestroyDescriptor>;

enum class ConvDirection : uint8_t { kForward, kBackwardData, kBackwardFilter };

// One 2-D convolution in NCHW, packed: x is n x c x h x w, w is k x (c / groups) x r x s, y is
// n x k x oh x ow.
struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t k = 0, r = 0, s = 0;
  int64_t groups = 1;
  int64_t oh = 0, ow = 0;
  int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1;
  cudnnDataType_t data_type = CUDNN_DATA_FLOAT;  // x, w and y
  // Tensor cores on float data (tf32). Off: engines that use them or down-convert their inputs
  // are left out. Half-precision data always may.
  bool allow_tensor_cores = false;
};

// The three tensors of a call, in the forward convolution's roles: forward (x, w, y), backward
// data (dx, w, dy), backward filter (x, dw, dy). The first named is written in backward data,
// the second in backward filter, the third in forward.
struct ConvPointers {
  void* x = nullptr;
  void* w = nullptr;
  void* y = nullptr;
  bool operator==(const ConvPointers& o) const { return x == o.x && w == o.w && y == o.y; }
};

class ConvPlanCache {
 public:
  // Runs convolution `dir` of layer `layer` (geometry `g`) on `p`, the output scaled by 0 or, with
  // `accumulate`, added to (beta 1), on the handle's stream. The workspace is the cache's own,
  // grown to what the fastest candidate needs (up to kMaxWorkspaceBytes): the backend's is sized
  // for the legacy calls' algorithms, which may need none where every plan needs some.
  // The first call for a layer, direction and scale builds and times its plan; a later call with
  // other pointers rebuilds only the variant pack. Errors name `name` and the cuDNN call.
  [[nodiscard]] Status Run(cudnnHandle_t handle, cudaStream_t stream, int layer, ConvDirection dir,
                           bool accumulate, const ConvGeometry& g, const ConvPointers& p,
                           const char* name);

 private:
  struct Entry {
    std::vector<BackendDesc> keep;  // the graph, engine and configuration the plan refers to
    BackendDesc plan;
    BackendDesc pack;
    ConvPointers ptrs;
    void* workspace = nullptr;
    int64_t alignment = 16;
  };
  StatusOr<Entry> Build(cudnnHandle_t handle, cudaStream_t stream, ConvDirection dir,
                        bool accumulate, const ConvGeometry& g, const ConvPointers& p,
                        const char* name);
  // `buf` (of `have` bytes) to at least `bytes`; a move, so packs that point into it are rebuilt.
  static Status Grow(DevicePtr& buf, size_t& have, size_t bytes);

  std::map<std::tuple<int, int, int>, Entry> entries_;
  DevicePtr scratch_;  // the timing runs' output
  size_t scratch_bytes_ = 0;
  DevicePtr workspace_;
  size_t workspace_bytes_ = 0;
};

}  // namespace kolo::models::compute::cudnn
