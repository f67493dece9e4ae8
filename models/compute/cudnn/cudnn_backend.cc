// Set-up, parameters, input, loss, optimizer and timing of the cudnn backend; the per-layer
// kernels are in layer_ops.cc.
#include "models/compute/cudnn/cudnn_backend.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <variant>

#include "models/compute/cudnn/backend_impl.h"
#include "models/compute/cudnn/check.h"
#include "models/compute/cudnn/kernels.h"

namespace kolo::models::compute::cudnn {

std::unique_ptr<ComputeBackend> CreateCudnnBackend(const LossScaleOptions& loss_scale) {
  return std::make_unique<CudnnBackend>(loss_scale);
}

StatusOr<LossScaleState> ReadLossScale(ComputeBackend& backend) {
  auto* b = dynamic_cast<CudnnBackend*>(&backend);
  if (b == nullptr) {
    return InvalidArgument("ReadLossScale: backend '{}' is not the cudnn backend", backend.name());
  }
  return b->ReadLossScale();
}

CudnnBackend::~CudnnBackend() {
  // Nothing may still be running on buffers about to be freed (pinned host ones included).
  if (stream_) cudaStreamSynchronize(stream_.get());
  if (copy_stream_) cudaStreamSynchronize(copy_stream_.get());
}

Status CudnnBackend::CheckReady(const char* what) const {
  if (!prepared_) return FailedPrecondition("cudnn backend: {} before a successful Prepare", what);
  return Status::OK();
}

Status CudnnBackend::CheckLayer(int layer) const {
  KOLO_RETURN_IF_ERROR(CheckReady("layer call"));
  if (layer < 0 || layer >= static_cast<int>(layers_.size())) {
    return InvalidArgument("cudnn backend: layer {} does not exist; the graph has {} layers", layer,
                           layers_.size());
  }
  return Status::OK();
}

Status CudnnBackend::CheckParam(int param, size_t size, const char* what) const {
  KOLO_RETURN_IF_ERROR(CheckReady(what));
  if (param < 0 || param >= static_cast<int>(params_.size())) {
    return InvalidArgument("cudnn backend: {}: parameter {} does not exist; the graph has {}", what,
                           param, params_.size());
  }
  const auto& p = graph_->params()[static_cast<size_t>(param)];
  if (static_cast<int64_t>(size) != p.numel) {
    return InvalidArgument("cudnn backend: {} '{}': got {} values, the parameter has {}", what,
                           p.name, size, p.numel);
  }
  return Status::OK();
}

StatusOr<float*> CudnnBackend::Allocate(int64_t floats) {
  KOLO_ASSIGN_OR_RETURN(void* p,
                        AllocateBytes(static_cast<size_t>(std::max<int64_t>(floats, 0)) * 4));
  return static_cast<float*>(p);
}

StatusOr<void*> CudnnBackend::AllocateBytes(size_t bytes) {
  DevicePtr p;
  // 256-byte multiples keep every buffer (and any region carved from one) aligned for vector
  // loads and tensor cores.
  bytes = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  cudaError_t err = cudaMalloc(p.out(), bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return Internal(
        "cudnn backend: cudaMalloc of {} MiB failed on device {}: {} ({} MiB of {} MiB free); "
        "use a smaller --batch-size",
        bytes >> 20, config_.device, cudaGetErrorString(err), free_bytes >> 20, total >> 20);
  }
  void* f = p.get();
  allocations_.push_back(std::move(p));
  return f;
}

Status CudnnBackend::SetTensor4d(cudnnTensorDescriptor_t desc, int64_t n, const ImageShape& s,
                                 bool master) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (n * s.size() > kMax) {
    return InvalidArgument(
        "cudnn backend: a tensor of {} x {} elements exceeds cuDNN's limit of {}", n, ToString(s),
        kMax);
  }
  KOLO_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
      desc, CUDNN_TENSOR_NCHW, master ? CUDNN_DATA_FLOAT : act_type_, static_cast<int>(n),
      static_cast<int>(s.c), static_cast<int>(s.h), static_cast<int>(s.w)));
  return Status::OK();
}

namespace {

// KOLO_CUDNN_CONV_API: how convolutions reach cuDNN. legacy (the default): cudnnConvolution*
// with the algorithms cudnnFind chose; plans: its graph API with each plan built once
// (conv_plans.h).
StatusOr<bool> ConvPlansFromEnv() {
  const char* v = std::getenv("KOLO_CUDNN_CONV_API");
  const std::string api = v == nullptr ? "" : v;
  if (api.empty() || api == "legacy") return false;
  if (api == "plans") return true;
  return InvalidArgument("KOLO_CUDNN_CONV_API '{}' is not allowed; allowed: legacy, plans", api);
}

}  // namespace

Status CudnnBackend::Prepare(const Graph& graph, const BackendConfig& config) {
  if (graph_ != nullptr) return FailedPrecondition("cudnn backend: Prepare called twice");
  if (config.dilation != 1) {
    return InvalidArgument(
        "cudnn backend: dilation {} is not allowed; it stretches recorded times, which only "
        "compute 'replay' plays (allowed here: 1)",
        config.dilation);
  }
  if (config.batch <= 0) {
    return InvalidArgument("cudnn backend: batch size {} must be positive", config.batch);
  }
  KOLO_ASSIGN_OR_RETURN(conv_plans_on_, ConvPlansFromEnv());
  const int devices = CudaDeviceCount();
  if (devices <= 0) return FailedPrecondition("cudnn backend: this process sees no CUDA device");
  BackendConfig resolved = config;
  if (resolved.device < 0) resolved.device = std::max(config.local_rank, 0) % devices;
  if (resolved.device >= devices) {
    return InvalidArgument("cudnn backend: CUDA device {} does not exist; this process sees {}",
                           resolved.device, devices);
  }
  graph_ = &graph;
  config_ = resolved;
  KOLO_CUDA_CHECK(cudaSetDevice(config_.device));
  KOLO_RETURN_IF_ERROR(ChoosePrecision(config_));
  KOLO_CUDA_CHECK(cudaStreamCreateWithFlags(stream_.out(), cudaStreamNonBlocking));
  KOLO_CUDNN_CHECK(cudnnCreate(cudnn_.out()));
  KOLO_CUDNN_CHECK(cudnnSetStream(cudnn_.get(), stream_.get()));
  KOLO_CUBLAS_CHECK(cublasCreate(cublas_.out()));
  KOLO_CUBLAS_CHECK(cublasSetStream(cublas_.get(), stream_.get()));
  // Half products use tensor cores under CUBLAS_DEFAULT_MATH; only float32 ones need TF32 asked.
  const bool tf32 = config.precision == Precision::kTf32;
  KOLO_CUBLAS_CHECK(
      cublasSetMathMode(cublas_.get(), tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  conv_math_ = tf32 || mixed_ ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;

  params_.resize(graph.params().size());
  for (size_t i = 0; i < params_.size(); ++i) {
    ParamState& p = params_[i];
    p.numel = graph.params()[i].numel;
    KOLO_ASSIGN_OR_RETURN(p.w, Allocate(p.numel));
    KOLO_ASSIGN_OR_RETURN(p.g, Allocate(p.numel));
    KOLO_ASSIGN_OR_RETURN(p.v, Allocate(p.numel));
    KOLO_CUDA_CHECK(cudaMemsetAsync(p.w, 0, p.numel * sizeof(float), stream_.get()));
    KOLO_CUDA_CHECK(cudaMemsetAsync(p.g, 0, p.numel * sizeof(float), stream_.get()));
    KOLO_CUDA_CHECK(cudaMemsetAsync(p.v, 0, p.numel * sizeof(float), stream_.get()));
  }

  layers_ = std::vector<LayerState>(graph.layers().size());
  for (int i = 0; i < static_cast<int>(layers_.size()); ++i) {
    Status s = PrepareLayer(i);
    if (!s.ok()) return s.WithContext(fmt::format("layer '{}'", graph.layer(i).name));
  }
  if (workspace_bytes_ > 0) {
    KOLO_ASSIGN_OR_RETURN(workspace_,
                          Allocate(static_cast<int64_t>((workspace_bytes_ + 3) / sizeof(float))));
  }
  KOLO_ASSIGN_OR_RETURN(ones_, Allocate(config.batch));
  KOLO_CUDA_CHECK(LaunchFill(ones_, config.batch, 1.0f, stream_.get()));
  KOLO_ASSIGN_OR_RETURN(float* labels, Allocate(config.batch));
  labels_ = reinterpret_cast<int32_t*>(labels);
  KOLO_ASSIGN_OR_RETURN(loss_values_, Allocate(num_losses_));
  KOLO_CUDA_CHECK(cudaMemsetAsync(loss_values_, 0, num_losses_ * sizeof(float), stream_.get()));
  if (mixed_) KOLO_RETURN_IF_ERROR(PrepareMixed());
  KOLO_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  prepared_ = true;
  return Status::OK();
}

Status CudnnBackend::PrepareLayer(int index) {
  const Layer& l = graph_->layer(index);
  LayerState& s = layers_[static_cast<size_t>(index)];
  const int64_t n = config_.batch;
  KOLO_CUDNN_CHECK(cudnnCreateTensorDescriptor(s.y_desc.out()));
  KOLO_RETURN_IF_ERROR(SetTensor4d(s.y_desc.get(), n, l.out));
  if (l.kind == LayerKind::kSoftmaxCrossEntropy) {
    KOLO_ASSIGN_OR_RETURN(s.dlogits, AllocateActivations(n * l.in.size()));
    KOLO_ASSIGN_OR_RETURN(s.row_loss, Allocate(n));
    s.loss_index = num_losses_++;
    const auto& p = std::get<LossParams>(l.params);
    // A plain-sum loss has the constant gradient `weight` everywhere (times the loss scale,
    // which changes: mixed precision fills it at each backward).
    if (p.sum_of_inputs && !mixed_) {
      KOLO_CUDA_CHECK(LaunchFill(static_cast<float*>(s.dlogits), n * l.in.size(),
                                 static_cast<float>(p.weight), stream_.get()));
    }
  } else {
    KOLO_ASSIGN_OR_RETURN(s.y, AllocateActivations(n * l.out.size()));
    KOLO_ASSIGN_OR_RETURN(s.dy, AllocateActivations(n * l.out.size()));
  }
  if (!l.param_ids.empty()) {
    KOLO_CUDA_CHECK(cudaEventCreateWithFlags(s.grads_ready.out(), cudaEventDisableTiming));
  }
  switch (l.kind) {
    case LayerKind::kConv:
      return PrepareConv(index);
    case LayerKind::kBatchNorm: {
      KOLO_CUDNN_CHECK(cudnnCreateTensorDescriptor(s.bn_desc.out()));
      KOLO_RETURN_IF_ERROR(
          SetTensor4d(s.bn_desc.get(), 1, ImageShape{l.out.c, 1, 1}, /*master=*/true));
      KOLO_ASSIGN_OR_RETURN(s.running_mean, Allocate(l.out.c));
      KOLO_ASSIGN_OR_RETURN(s.running_var, Allocate(l.out.c));
      KOLO_ASSIGN_OR_RETURN(s.save_mean, Allocate(l.out.c));
      KOLO_ASSIGN_OR_RETURN(s.save_inv_std, Allocate(l.out.c));
      KOLO_CUDA_CHECK(LaunchFill(s.running_mean, l.out.c, 0.0f, stream_.get()));
      KOLO_CUDA_CHECK(LaunchFill(s.running_var, l.out.c, 1.0f, stream_.get()));
      const auto& p = std::get<BatchNormParams>(l.params);
      if (p.epsilon < CUDNN_BN_MIN_EPSILON) {
        return InvalidArgument("batch-norm epsilon {} is below cuDNN's minimum {}", p.epsilon,
                               CUDNN_BN_MIN_EPSILON);
      }
      return Status::OK();
    }
    case LayerKind::kMaxPool:
    case LayerKind::kAvgPool: {
      const auto& p = std::get<PoolParams>(l.params);
      const cudnnPoolingMode_t mode = l.kind == LayerKind::kMaxPool ? CUDNN_POOLING_MAX
                                      : p.count_include_pad
                                          ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                          : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
      KOLO_CUDNN_CHECK(cudnnCreatePoolingDescriptor(s.pool.out()));
      KOLO_CUDNN_CHECK(cudnnSetPooling2dDescriptor(
          s.pool.get(), mode, CUDNN_NOT_PROPAGATE_NAN, static_cast<int>(p.kernel_h),
          static_cast<int>(p.kernel_w), static_cast<int>(p.pad_h), static_cast<int>(p.pad_w),
          static_cast<int>(p.stride_h), static_cast<int>(p.stride_w)));
      return Status::OK();
    }
    case LayerKind::kDropout: {
      const double rate = std::get<DropoutParams>(l.params).rate;
      if (!(rate >= 0.0 && rate < 1.0)) {
        return InvalidArgument("dropout rate {} must lie in [0, 1)", rate);
      }
      return Status::OK();
    }
    case LayerKind::kSoftmaxCrossEntropy:
    case LayerKind::kFullyConnected:
    case LayerKind::kInput:
    case LayerKind::kRelu:
    case LayerKind::kConcat:
    case LayerKind::kAdd:
      return Status::OK();
  }
  return InvalidArgument("layer kind {} is not supported by the cudnn backend",
                         static_cast<int>(l.kind));
}

Status CudnnBackend::PrepareConv(int index) {
  const Layer& l = graph_->layer(index);
  LayerState& s = layers_[static_cast<size_t>(index)];
  const auto& p = std::get<ConvParams>(l.params);
  const LayerState& in = layers_[static_cast<size_t>(l.inputs[0])];
  s.needs_dx = graph_->layer(l.inputs[0]).kind != LayerKind::kInput;
  KOLO_CUDNN_CHECK(cudnnCreateFilterDescriptor(s.w_desc.out()));
  KOLO_CUDNN_CHECK(cudnnSetFilter4dDescriptor(
      s.w_desc.get(), act_type_, CUDNN_TENSOR_NCHW, static_cast<int>(p.out_channels),
      static_cast<int>(l.in.c / p.groups), static_cast<int>(p.kernel_h),
      static_cast<int>(p.kernel_w)));
  for (ConvDesc* d : {&s.conv_fwd, &s.conv_bwd_data, &s.conv_bwd_filter}) {
    KOLO_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(d->out()));
    KOLO_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        d->get(), static_cast<int>(p.pad_h), static_cast<int>(p.pad_w),
        static_cast<int>(p.stride_h), static_cast<int>(p.stride_w), 1, 1, CUDNN_CROSS_CORRELATION,
        CUDNN_DATA_FLOAT));
    KOLO_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d->get(), static_cast<int>(p.groups)));
    KOLO_CUDNN_CHECK(cudnnSetConvolutionMathType(d->get(), conv_math_));
  }
  int on = 0, oc = 0, oh = 0, ow = 0;
  KOLO_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(s.conv_fwd.get(), in.y_desc.get(),
                                                         s.w_desc.get(), &on, &oc, &oh, &ow));
  if (on != config_.batch || oc != l.out.c || oh != l.out.h || ow != l.out.w) {
    return Internal("cuDNN computes output {}x{}x{}x{}, the graph says {}x{}", on, oc, oh, ow,
                    config_.batch, ToString(l.out));
  }
  if (p.bias) {
    KOLO_CUDNN_CHECK(cudnnCreateTensorDescriptor(s.bias_desc.out()));
    KOLO_RETURN_IF_ERROR(SetTensor4d(s.bias_desc.get(), 1, ImageShape{l.out.c, 1, 1}));
  }
  const ConvKey key{config_.batch,
                    l.in.c,
                    l.in.h,
                    l.in.w,
                    p.out_channels,
                    p.kernel_h,
                    p.kernel_w,
                    p.stride_h,
                    p.stride_w,
                    p.pad_h,
                    p.pad_w,
                    p.groups,
                    int64_t{conv_math_},
                    int64_t{s.needs_dx},
                    int64_t{act_type_}};
  const ConvDescriptors d{in.y_desc.get(),  s.w_desc.get(),        s.y_desc.get(),
                          s.conv_fwd.get(), s.conv_bwd_data.get(), s.conv_bwd_filter.get()};
  KOLO_ASSIGN_OR_RETURN(s.algos,
                        algo_cache_.Choose(cudnn_.get(), key, d, s.needs_dx, l.name.c_str()));
  workspace_bytes_ = std::max(workspace_bytes_, s.algos.workspace_bytes);
  return Status::OK();
}

Status CudnnBackend::SetParameter(int param, std::span<const float> values) {
  KOLO_RETURN_IF_ERROR(CheckParam(param, values.size(), "SetParameter"));
  const ParamState& p = params_[param];
  KOLO_CUDA_CHECK(cudaMemcpyAsync(p.w, values.data(), values.size_bytes(), cudaMemcpyHostToDevice,
                                  stream_.get()));
  if (p.w_half != nullptr) {
    KOLO_CUDA_CHECK(LaunchCast(act_, p.w, p.w_half, p.numel, stream_.get()));
  }
  KOLO_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return Status::OK();
}

Status CudnnBackend::GetParameter(int param, std::span<float> out) {
  KOLO_RETURN_IF_ERROR(CheckParam(param, out.size(), "GetParameter"));
  KOLO_CUDA_CHECK(cudaMemcpyAsync(out.data(), params_[param].w, out.size_bytes(),
                                  cudaMemcpyDeviceToHost, stream_.get()));
  KOLO_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return Status::OK();
}

Status CudnnBackend::GetGradient(int param, std::span<float> out) {
  KOLO_RETURN_IF_ERROR(CheckParam(param, out.size(), "GetGradient"));
  KOLO_CUDA_CHECK(cudaMemcpyAsync(out.data(), params_[param].g, out.size_bytes(),
                                  cudaMemcpyDeviceToHost, stream_.get()));
  KOLO_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return Status::OK();
}

Status CudnnBackend::SetInput(std::span<const float> images, std::span<const int32_t> labels) {
  KOLO_RETURN_IF_ERROR(CheckReady("SetInput"));
  const int64_t n = config_.batch;
  const int64_t want = n * graph_->input_shape().size();
  if (static_cast<int64_t>(images.size()) != want || static_cast<int64_t>(labels.size()) != n) {
    return InvalidArgument(
        "cudnn backend: SetInput got {} image values and {} labels; batch {} of {} needs {} and {}",
        images.size(), labels.size(), n, ToString(graph_->input_shape()), want, n);
  }
  for (int loss : graph_->loss_layers()) {
    const auto& p = std::get<LossParams>(graph_->layer(loss).params);
    if (p.sum_of_inputs) continue;
    const int64_t classes = p.num_classes;
    for (int64_t i = 0; i < n; ++i) {
      if (labels[i] < 0 || labels[i] >= classes) {
        return InvalidArgument(
            "cudnn backend: label {} of image {} is outside [0, {}) of loss '{}'", labels[i], i,
            classes, graph_->layer(loss).name);
      }
    }
  }
  void* input = layers_[graph_->input_layer()].y;
  KOLO_CUDA_CHECK(cudaMemcpyAsync(mixed_ ? input_staging_ : input, images.data(),
                                  images.size_bytes(), cudaMemcpyHostToDevice, stream_.get()));
  if (mixed_) KOLO_CUDA_CHECK(LaunchCast(act_, input_staging_, input, want, stream_.get()));
  KOLO_CUDA_CHECK(cudaMemcpyAsync(labels_, labels.data(), labels.size_bytes(),
                                  cudaMemcpyHostToDevice, stream_.get()));
  KOLO_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  have_input_ = true;
  return Status::OK();
}

StatusOr<double> CudnnBackend::Loss() {
  KOLO_RETURN_IF_ERROR(CheckReady("Loss"));
  std::vector<float> values(static_cast<size_t>(num_losses_));
  KOLO_CUDA_CHECK(cudaMemcpyAsync(values.data(), loss_values_, values.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_.get()));
  KOLO_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  double sum = 0;
  for (float v : values) sum += v;
  return sum;
}

std::string CudnnBackend::DeviceName() const {
  if (!prepared_) return {};
  auto name = GpuName(config_.device);
  return name.ok() ? *name : std::string();
}

GradientView CudnnBackend::Gradient(int param) {
  GradientView v;
  if (!prepared_ || param < 0 || param >= static_cast<int>(params_.size())) return v;
  const ParamState& p = params_[static_cast<size_t>(param)];
  v.data = p.g;
  v.dtype = DataType::kFloat32;
  v.numel = p.numel;
  v.device = config_.device;
  v.ready_event = layers_[graph_->params()[param].layer].grads_ready.get();
  return v;
}

Status CudnnBackend::Update(int param, const SgdConfig& sgd, double grad_scale) {
  KOLO_RETURN_IF_ERROR(CheckReady("Update"));
  if (param < 0 || param >= static_cast<int>(params_.size())) {
    return InvalidArgument("cudnn backend: Update: parameter {} does not exist; the graph has {}",
                           param, params_.size());
  }
  if (mixed_) return UpdateMixed(param, sgd, grad_scale);
  ParamState& p = params_[static_cast<size_t>(param)];
  KOLO_CUDA_CHECK(LaunchSgdMomentum(p.w, p.g, p.v, p.numel, static_cast<float>(sgd.learning_rate),
                                    static_cast<float>(sgd.momentum),
                                    static_cast<float>(sgd.weight_decay),
                                    static_cast<float>(grad_scale), stream_.get()));
  return Status::OK();
}

Status CudnnBackend::Synchronize() {
  KOLO_RETURN_IF_ERROR(CheckReady("Synchronize"));
  KOLO_CUDA_CHECK(cudaStreamSynchronize(stream_.get()));
  return Status::OK();
}

Status CudnnBackend::MarkForwardStart() {
  if (!pass_backward_) return Status::OK();
  if (used_passes_ == passes_.size()) {
    PassEvents e;
    KOLO_CUDA_CHECK(cudaEventCreate(e.start.out()));
    KOLO_CUDA_CHECK(cudaEventCreate(e.end.out()));
    passes_.push_back(std::move(e));
  }
  PassEvents& e = passes_[used_passes_++];
  e.ended = false;
  KOLO_CUDA_CHECK(cudaEventRecord(e.start.get(), stream_.get()));
  pass_backward_ = false;
  return Status::OK();
}

Status CudnnBackend::MarkBackwardEnd() {
  if (used_passes_ == 0) return Status::OK();
  PassEvents& e = passes_[used_passes_ - 1];
  KOLO_CUDA_CHECK(cudaEventRecord(e.end.get(), stream_.get()));
  e.ended = true;
  pass_backward_ = true;
  return Status::OK();
}

Status CudnnBackend::TimeMark() {
  KOLO_RETURN_IF_ERROR(CheckReady("TimeMark"));
  if (used_marks_ == marks_.size()) {
    Event e;
    KOLO_CUDA_CHECK(cudaEventCreate(e.out()));
    marks_.push_back(std::move(e));
  }
  KOLO_CUDA_CHECK(cudaEventRecord(marks_[used_marks_++].get(), stream_.get()));
  return Status::OK();
}

StatusOr<std::vector<double>> CudnnBackend::TakeMarkTimesMs() {
  std::vector<double> ms;
  const size_t n = used_marks_;
  used_marks_ = 0;
  if (n == 0) return ms;
  KOLO_CUDA_CHECK(cudaEventSynchronize(marks_[n - 1].get()));
  ms.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    float t = 0;
    KOLO_CUDA_CHECK(cudaEventElapsedTime(&t, marks_[0].get(), marks_[i].get()));
    ms.push_back(t);
  }
  return ms;
}

Status CudnnBackend::RunConvPlan(const Layer& l, ConvDirection dir, bool accumulate, const void* x,
                                 const void* w, const void* y) {
  const auto& p = std::get<ConvParams>(l.params);
  ConvGeometry g;
  g.n = config_.batch;
  g.c = l.in.c;
  g.h = l.in.h;
  g.w = l.in.w;
  g.k = p.out_channels;
  g.r = p.kernel_h;
  g.s = p.kernel_w;
  g.groups = p.groups;
  g.oh = l.out.h;
  g.ow = l.out.w;
  g.pad_h = p.pad_h;
  g.pad_w = p.pad_w;
  g.stride_h = p.stride_h;
  g.stride_w = p.stride_w;
  g.data_type = act_type_;
  g.allow_tensor_cores = conv_math_ != CUDNN_FMA_MATH;
  const int index = static_cast<int>(&l - graph_->layers().data());
  return conv_plans_.Run(
      cudnn_.get(), stream_.get(), index, dir, accumulate, g,
      ConvPointers{const_cast<void*>(x), const_cast<void*>(w), const_cast<void*>(y)},
      l.name.c_str());
}

double CudnnBackend::TakeKernelSeconds() {
  double seconds = 0;
  for (size_t i = 0; i < used_passes_; ++i) {
    PassEvents& e = passes_[i];
    if (!e.ended) cudaEventRecord(e.end.get(), stream_.get());
    float ms = 0;
    if (cudaEventSynchronize(e.end.get()) == cudaSuccess &&
        cudaEventElapsedTime(&ms, e.start.get(), e.end.get()) == cudaSuccess) {
      seconds += ms * 1e-3;
    }
  }
  used_passes_ = 0;
  pass_backward_ = true;
  return seconds;
}

}  // namespace kolo::models::compute::cudnn
