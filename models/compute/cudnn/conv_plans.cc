#include "models/compute/cudnn/conv_plans.h"

#include <algorithm>
#include <array>
#include <limits>

#include "models/compute/cudnn/check.h"
#include "models/compute/cudnn/conv_algos.h"

namespace kolo::models::compute::cudnn {
namespace {

// The tensors' unique ids in every graph: the forward convolution's x, w and y.
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;
// Candidates timed per plan: the heuristics' first ones (cudnnFind times all it has).
constexpr int64_t kCandidates = 8;   // timed, of those that pass the numerical notes
constexpr int64_t kHeuristics = 32;  // asked of the heuristics, in their order
constexpr int kTimedRuns = 3;

// cuDNN 9 marks the handle attributes of a graph and a plan deprecated but still reads them; set
// by number so that the deprecation does not stop a warnings-as-errors build, and a version that
// refuses them is not an error (finalizing says whether one was needed).
const auto kGraphHandle = static_cast<cudnnBackendAttributeName_t>(800);  // OPERATIONGRAPH_HANDLE
const auto kPlanHandle = static_cast<cudnnBackendAttributeName_t>(400);   // EXECUTION_PLAN_HANDLE

StatusOr<BackendDesc> Create(cudnnBackendDescriptorType_t type) {
  BackendDesc d;
  KOLO_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, d.out()));
  return d;
}

Status Set(const BackendDesc& d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
           int64_t count, const void* values) {
  KOLO_CUDNN_CHECK(cudnnBackendSetAttribute(d.get(), name, type, count, values));
  return Status::OK();
}

Status SetDesc(const BackendDesc& d, cudnnBackendAttributeName_t name, const BackendDesc& value) {
  cudnnBackendDescriptor_t v = value.get();
  return Set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

size_t ElemBytes(cudnnDataType_t t) { return t == CUDNN_DATA_FLOAT ? 4 : 2; }

// The largest power of two up to 16 that divides every pointer.
int64_t Alignment(std::initializer_list<const void*> ptrs) {
  int64_t a = 16;
  for (const void* p : ptrs) {
    while (a > 1 && reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(a) != 0) a /= 2;
  }
  return a;
}

StatusOr<BackendDesc> Tensor(int64_t uid, cudnnDataType_t type, const std::array<int64_t, 4>& dims,
                             int64_t alignment) {
  KOLO_ASSIGN_OR_RETURN(BackendDesc t, Create(CUDNN_BACKEND_TENSOR_DESCRIPTOR));
  const std::array<int64_t, 4> strides{dims[1] * dims[2] * dims[3], dims[2] * dims[3], dims[3], 1};
  KOLO_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type));
  KOLO_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data()));
  KOLO_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data()));
  KOLO_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid));
  KOLO_RETURN_IF_ERROR(Set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment));
  KOLO_CUDNN_CHECK(cudnnBackendFinalize(t.get()));
  return t;
}

StatusOr<BackendDesc> Pack(const ConvPointers& p, void* workspace) {
  KOLO_ASSIGN_OR_RETURN(BackendDesc pack, Create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
  const std::array<int64_t, 3> uids{kUidX, kUidW, kUidY};
  std::array<void*, 3> ptrs{p.x, p.w, p.y};
  KOLO_RETURN_IF_ERROR(
      Set(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids.data()));
  KOLO_RETURN_IF_ERROR(
      Set(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, ptrs.data()));
  KOLO_RETURN_IF_ERROR(
      Set(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace));
  KOLO_CUDNN_CHECK(cudnnBackendFinalize(pack.get()));
  return pack;
}

const char* DirectionName(ConvDirection dir) {
  switch (dir) {
    case ConvDirection::kForward:
      return "forward";
    case ConvDirection::kBackwardData:
      return "backward-data";
    case ConvDirection::kBackwardFilter:
      return "backward-filter";
  }
  return "?";
}

}  // namespace

// Calls already queued may still read the old buffer: cudaFree waits for the device.
Status ConvPlanCache::Grow(DevicePtr& buf, size_t& have, size_t bytes) {
  if (bytes <= have) return Status::OK();
  buf.Reset();
  have = 0;
  KOLO_CUDA_CHECK(cudaMalloc(buf.out(), bytes));
  have = bytes;
  return Status::OK();
}

StatusOr<ConvPlanCache::Entry> ConvPlanCache::Build(cudnnHandle_t handle, cudaStream_t stream,
                                                    ConvDirection dir, bool accumulate,
                                                    const ConvGeometry& g, const ConvPointers& p,
                                                    const char* name) {
  Entry e;
  // The timing runs write the output into scratch and use the workspace, whose alignment
  // (cudaMalloc's) is at least 16.
  e.alignment = Alignment({p.x, p.w, p.y});
  const std::array<int64_t, 4> xd{g.n, g.c, g.h, g.w};
  const std::array<int64_t, 4> wd{g.k, g.c / g.groups, g.r, g.s};
  const std::array<int64_t, 4> yd{g.n, g.k, g.oh, g.ow};
  KOLO_ASSIGN_OR_RETURN(BackendDesc x, Tensor(kUidX, g.data_type, xd, e.alignment));
  KOLO_ASSIGN_OR_RETURN(BackendDesc w, Tensor(kUidW, g.data_type, wd, e.alignment));
  KOLO_ASSIGN_OR_RETURN(BackendDesc y, Tensor(kUidY, g.data_type, yd, e.alignment));

  KOLO_ASSIGN_OR_RETURN(BackendDesc conv, Create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR));
  {
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    const cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
    const int64_t dims = 2;
    const std::array<int64_t, 2> pad{g.pad_h, g.pad_w}, stride{g.stride_h, g.stride_w},
        dilation{1, 1};
    KOLO_RETURN_IF_ERROR(
        Set(conv, CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &compute));
    KOLO_RETURN_IF_ERROR(
        Set(conv, CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode));
    KOLO_RETURN_IF_ERROR(
        Set(conv, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &dims));
    KOLO_RETURN_IF_ERROR(
        Set(conv, CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation.data()));
    KOLO_RETURN_IF_ERROR(
        Set(conv, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride.data()));
    KOLO_RETURN_IF_ERROR(
        Set(conv, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, pad.data()));
    KOLO_RETURN_IF_ERROR(
        Set(conv, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, pad.data()));
    KOLO_CUDNN_CHECK(cudnnBackendFinalize(conv.get()));
  }

  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  // The operation of each direction and its attributes, in the forward convolution's roles.
  struct OpAttrs {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  static constexpr OpAttrs kForwardOp{CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR,
                                      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
                                      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
                                      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
                                      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
                                      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
                                      CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
  static constexpr OpAttrs kBackwardDataOp{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
  static constexpr OpAttrs kBackwardFilterOp{
      CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
      CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  const OpAttrs& a = dir == ConvDirection::kForward        ? kForwardOp
                     : dir == ConvDirection::kBackwardData ? kBackwardDataOp
                                                           : kBackwardFilterOp;
  KOLO_ASSIGN_OR_RETURN(BackendDesc op, Create(a.type));
  KOLO_RETURN_IF_ERROR(SetDesc(op, a.x, x));
  KOLO_RETURN_IF_ERROR(SetDesc(op, a.w, w));
  KOLO_RETURN_IF_ERROR(SetDesc(op, a.y, y));
  KOLO_RETURN_IF_ERROR(SetDesc(op, a.conv, conv));
  KOLO_RETURN_IF_ERROR(Set(op, a.alpha, CUDNN_TYPE_FLOAT, 1, &alpha));
  KOLO_RETURN_IF_ERROR(Set(op, a.beta, CUDNN_TYPE_FLOAT, 1, &beta));
  KOLO_CUDNN_CHECK(cudnnBackendFinalize(op.get()));

  KOLO_ASSIGN_OR_RETURN(BackendDesc graph, Create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR));
  {
    cudnnBackendDescriptor_t ops = op.get();
    KOLO_RETURN_IF_ERROR(
        Set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ops));
    (void)cudnnBackendSetAttribute(graph.get(), kGraphHandle, CUDNN_TYPE_HANDLE, 1, &handle);
    KOLO_CUDNN_CHECK(cudnnBackendFinalize(graph.get()));
  }

  KOLO_ASSIGN_OR_RETURN(BackendDesc heur, Create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR));
  {
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    KOLO_RETURN_IF_ERROR(SetDesc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph));
    KOLO_RETURN_IF_ERROR(Set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode));
    KOLO_CUDNN_CHECK(cudnnBackendFinalize(heur.get()));
  }
  int64_t available = 0;
  KOLO_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                            CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available, nullptr));
  const int64_t want = std::min(available, kHeuristics);
  std::vector<BackendDesc> cfgs(static_cast<size_t>(want));
  std::vector<cudnnBackendDescriptor_t> raw(static_cast<size_t>(want));
  for (int64_t i = 0; i < want; ++i) {
    KOLO_ASSIGN_OR_RETURN(cfgs[static_cast<size_t>(i)], Create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
    raw[static_cast<size_t>(i)] = cfgs[static_cast<size_t>(i)].get();
  }
  int64_t got = 0;
  if (want > 0) {
    KOLO_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, want, &got,
                                              raw.data()));
  }

  // The output the timing runs write: y (forward), x (backward data) or w (backward filter).
  const std::array<int64_t, 4>& out_dims = dir == ConvDirection::kForward        ? yd
                                           : dir == ConvDirection::kBackwardData ? xd
                                                                                 : wd;
  const size_t out_bytes =
      static_cast<size_t>(out_dims[0] * out_dims[1] * out_dims[2] * out_dims[3]) *
      ElemBytes(g.data_type);
  KOLO_RETURN_IF_ERROR(Grow(scratch_, scratch_bytes_, out_bytes));
  ConvPointers timing = p;
  (dir == ConvDirection::kForward        ? timing.y
   : dir == ConvDirection::kBackwardData ? timing.x
                                         : timing.w) = scratch_.get();
  KOLO_ASSIGN_OR_RETURN(BackendDesc timing_pack, Pack(timing, workspace_.get()));
  Event start, stop;
  KOLO_CUDA_CHECK(cudaEventCreate(start.out()));
  KOLO_CUDA_CHECK(cudaEventCreate(stop.out()));

  float best_ms = std::numeric_limits<float>::infinity();
  int64_t best = -1;
  std::vector<BackendDesc> plans(static_cast<size_t>(got));
  int64_t timed = 0;
  for (int64_t i = 0; i < got && timed < kCandidates; ++i) {
    const BackendDesc& cfg = cfgs[static_cast<size_t>(i)];
    // The legacy calls' numerics and no less: no engine that converts its inputs down to a half
    // type or reduces in less than float32 (the compute type), and, for float data without
    // tensor cores, none that uses them. (A tf32 engine's note is TENSOR_CORE; DOWN_CONVERT means
    // float32 inputs cast to fp16, whose range VGG-16's unnormalised activations exceed.)
    {
      KOLO_ASSIGN_OR_RETURN(BackendDesc engine, Create(CUDNN_BACKEND_ENGINE_DESCRIPTOR));
      cudnnBackendDescriptor_t engine_raw = engine.get();
      int64_t n = 0;
      KOLO_CUDNN_CHECK(cudnnBackendGetAttribute(cfg.get(), CUDNN_ATTR_ENGINECFG_ENGINE,
                                                CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &engine_raw));
      std::array<cudnnBackendNumericalNote_t, 16> notes{};
      int64_t count = 0;
      if (cudnnBackendGetAttribute(engine.get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                   CUDNN_TYPE_NUMERICAL_NOTE, static_cast<int64_t>(notes.size()),
                                   &count, notes.data()) != CUDNN_STATUS_SUCCESS) {
        continue;
      }
      const auto end = notes.begin() + std::min<int64_t>(count, notes.size());
      const auto has = [&](cudnnBackendNumericalNote_t note) {
        return std::find(notes.begin(), end, note) != end;
      };
      if (has(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) ||
          has(CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION)) {
        continue;
      }
      if (!g.allow_tensor_cores && g.data_type == CUDNN_DATA_FLOAT &&
          has(CUDNN_NUMERICAL_NOTE_TENSOR_CORE)) {
        continue;
      }
    }
    auto plan = Create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (!plan.ok()) return plan.status();
    (void)cudnnBackendSetAttribute(plan->get(), kPlanHandle, CUDNN_TYPE_HANDLE, 1, &handle);
    if (!SetDesc(*plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg).ok() ||
        cudnnBackendFinalize(plan->get()) != CUDNN_STATUS_SUCCESS) {
      continue;  // an engine that cannot run this convolution
    }
    int64_t need = 0, n = 0;
    KOLO_CUDNN_CHECK(cudnnBackendGetAttribute(plan->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                              CUDNN_TYPE_INT64, 1, &n, &need));
    if (need < 0 || static_cast<size_t>(need) > kMaxWorkspaceBytes) continue;
    if (static_cast<size_t>(need) > workspace_bytes_) {
      KOLO_RETURN_IF_ERROR(Grow(workspace_, workspace_bytes_, static_cast<size_t>(need)));
      KOLO_ASSIGN_OR_RETURN(timing_pack, Pack(timing, workspace_.get()));
    }
    // One untimed run, then the fastest of kTimedRuns.
    if (cudnnBackendExecute(handle, plan->get(), timing_pack.get()) != CUDNN_STATUS_SUCCESS) {
      continue;
    }
    float ms = std::numeric_limits<float>::infinity();
    for (int r = 0; r < kTimedRuns; ++r) {
      KOLO_CUDA_CHECK(cudaEventRecord(start.get(), stream));
      KOLO_CUDNN_CHECK(cudnnBackendExecute(handle, plan->get(), timing_pack.get()));
      KOLO_CUDA_CHECK(cudaEventRecord(stop.get(), stream));
      KOLO_CUDA_CHECK(cudaEventSynchronize(stop.get()));
      float t = 0;
      KOLO_CUDA_CHECK(cudaEventElapsedTime(&t, start.get(), stop.get()));
      ms = std::min(ms, t);
    }
    if (ms < best_ms) {
      best_ms = ms;
      best = i;
    }
    plans[static_cast<size_t>(i)] = std::move(plan).value();
    ++timed;
  }
  if (best < 0) {
    return Internal(
        "conv layer '{}': no cuDNN engine runs its {} convolution ({} candidates, at most {} MiB "
        "of workspace)",
        name, DirectionName(dir), got, kMaxWorkspaceBytes >> 20);
  }
  e.plan = std::move(plans[static_cast<size_t>(best)]);
  KOLO_ASSIGN_OR_RETURN(e.pack, Pack(p, workspace_.get()));
  e.ptrs = p;
  e.workspace = workspace_.get();
  for (BackendDesc* d : {&x, &w, &y, &conv, &op, &graph, &heur}) e.keep.push_back(std::move(*d));
  for (auto& cfg : cfgs) e.keep.push_back(std::move(cfg));
  return e;
}

Status ConvPlanCache::Run(cudnnHandle_t handle, cudaStream_t stream, int layer, ConvDirection dir,
                          bool accumulate, const ConvGeometry& g, const ConvPointers& p,
                          const char* name) {
  const auto key = std::make_tuple(layer, static_cast<int>(dir), accumulate ? 1 : 0);
  auto it = entries_.find(key);
  if (it != entries_.end() && !(it->second.ptrs == p && it->second.workspace == workspace_.get())) {
    // Other buffers, or a workspace grown since: a new variant pack, or a new plan where the
    // buffers are less aligned.
    if (Alignment({p.x, p.w, p.y}) < it->second.alignment) {
      entries_.erase(it);
      it = entries_.end();
    } else {
      KOLO_ASSIGN_OR_RETURN(it->second.pack, Pack(p, workspace_.get()));
      it->second.ptrs = p;
      it->second.workspace = workspace_.get();
    }
  }
  if (it == entries_.end()) {
    KOLO_ASSIGN_OR_RETURN(Entry e, Build(handle, stream, dir, accumulate, g, p, name));
    it = entries_.emplace(key, std::move(e)).first;
  }
  const cudnnStatus_t st =
      cudnnBackendExecute(handle, it->second.plan.get(), it->second.pack.get());
  if (st != CUDNN_STATUS_SUCCESS) {
    return Internal("conv layer '{}': cudnnBackendExecute of its {} plan failed: {} (code {})",
                    name, DirectionName(dir), cudnnGetErrorString(st), static_cast<int>(st));
  }
  return Status::OK();
}

}  // namespace kolo::models::compute::cudnn
