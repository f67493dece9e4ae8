#include "models/compute/onednn/net.h"

#include <algorithm>
#include <map>

#include "models/compute/onednn/dnnl_check.h"

namespace kolo::models::compute::onednn {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

Net::Net(const Graph& graph, const BackendConfig& config)
    : graph_(graph),
      batch_(config.batch),
      seed_(config.seed),
      engine_(dnnl::engine::kind::cpu, 0),
      stream_(engine_) {
  const size_t n = graph.layers().size();
  value_.resize(n);
  diff_.resize(n);
  needs_grad_.assign(n, false);
  adds_.resize(n);
  losses_.assign(n, 0.0);
  labels_.assign(static_cast<size_t>(batch_), 0);

  for (size_t l = 0; l < n; ++l) {
    const Layer& layer = graph.layers()[l];
    bool needs = !layer.param_ids.empty();
    for (int in : layer.inputs) needs = needs || needs_grad_[static_cast<size_t>(in)];
    needs_grad_[l] = layer.kind != LayerKind::kInput && needs;
    adds_[l].assign(layer.inputs.size(), false);
  }
  // Backward runs the layers last to first and a layer's inputs in slot order, so the first edge
  // to reach a producer is the one from its last consumer; every later edge adds.
  std::vector<bool> reached(n, false);
  for (size_t l = n; l-- > 0;) {
    const Layer& layer = graph.layers()[l];
    for (size_t slot = 0; slot < layer.inputs.size(); ++slot) {
      const auto p = static_cast<size_t>(layer.inputs[slot]);
      adds_[l][slot] = reached[p];
      reached[p] = true;
    }
  }

  ChooseLayouts();
  AllocateValues();
  AllocateDiffs();

  params_.reserve(graph.params().size());
  for (const Parameter& p : graph.params()) {
    const memory::desc md({p.numel}, Dt::f32, Tag::a);
    ParamState s{memory(md, engine_), memory(md, engine_), memory(md, engine_), p.numel};
    for (const memory* m : {&s.value, &s.grad, &s.momentum}) {
      std::fill_n(static_cast<float*>(m->get_data_handle()), p.numel, 0.0f);
    }
    params_.push_back(std::move(s));
  }
}

void Net::AllocateValues() {
  for (size_t l = 0; l < value_.size(); ++l) {
    const Layer& layer = graph_.layers()[l];
    if (layer.kind == LayerKind::kSoftmaxCrossEntropy) continue;
    const memory::desc md = OutputDesc(static_cast<int>(l));
    // A ReLU overwrites its input when nothing else reads it: no kernel needs its own output in
    // backward, and the ReLU's backward reads its output, not its input.
    if (layer.kind == LayerKind::kRelu) {
      const auto p = static_cast<size_t>(layer.inputs[0]);
      const Layer& producer = graph_.layers()[p];
      if (producer.kind != LayerKind::kInput && producer.consumers.size() == 1) {
        value_[l] = memory(md, engine_, value_[p].get_data_handle());
        continue;
      }
    }
    value_[l] = memory(md, engine_);
  }
}

void Net::AllocateDiffs() {
  // A layer's output gradient lives from the backward of its last consumer (the first to write
  // it) to its own backward (which reads it). Gradients whose lives do not overlap share storage:
  // walking backward, each takes the smallest free buffer that fits and frees it after its own
  // layer, so the pool holds a few activations instead of one per layer.
  const size_t n = diff_.size();
  std::vector<std::vector<size_t>> born(n);  // by backward step: gradients first written there
  for (size_t l = 0; l < n; ++l) {
    const Layer& layer = graph_.layers()[l];
    if (!needs_grad_[l] || layer.kind == LayerKind::kSoftmaxCrossEntropy) continue;
    if (layer.consumers.empty()) continue;  // Graph::Finish rules this out
    born[static_cast<size_t>(layer.consumers.back())].push_back(l);
  }
  std::multimap<size_t, memory> free;  // bytes -> buffer; every buffer is free at the end
  std::vector<memory> owner(n);
  for (size_t k = n; k-- > 0;) {
    for (size_t p : born[k]) {
      const memory::desc md = OutputDesc(static_cast<int>(p));
      const size_t bytes = md.get_size();
      auto it = free.lower_bound(bytes);
      if (it == free.end()) {
        owner[p] =
            memory(memory::desc({static_cast<memory::dim>(bytes / sizeof(float))}, Dt::f32, Tag::a),
                   engine_);
      } else {
        owner[p] = it->second;
        free.erase(it);
      }
      diff_[p] = memory(md, engine_, owner[p].get_data_handle());
    }
    if (owner[k]) free.emplace(owner[k].get_desc().get_size(), owner[k]);
  }
  // The views in diff_ do not own their storage: the pool keeps it.
  for (auto& [bytes, buffer] : free) diff_pool_.push_back(buffer);
}

memory::desc Net::OutputDesc(int l) const {
  const ImageShape& s = graph_.layer(l).out;
  return memory::desc({batch_, s.c, s.h, s.w}, Dt::f32,
                      blocked_[static_cast<size_t>(l)] ? block_tag_ : Tag::nchw);
}

void Net::ChooseLayouts() {
  // oneDNN's fastest CPU kernels for convolution, batch norm and pooling work on channels blocked
  // by the vector width (nChw8c for AVX2, nChw16c for AVX-512); its plain-NCHW batch norm is
  // several times slower than the blocked one. A layer's output is blocked when its channels
  // fill whole blocks (no padding to maintain, and concat slices start on block boundaries) and,
  // except for a convolution (which converts), its inputs are blocked too, so that elementwise
  // layers see one layout. Images, fully-connected outputs and the rest stay plain NCHW.
  const bool avx512 = dnnl::get_effective_cpu_isa() >= dnnl::cpu_isa::avx512_core;
  const int64_t block = avx512 ? 16 : 8;
  block_tag_ = avx512 ? Tag::nChw16c : Tag::nChw8c;
  blocked_.assign(graph_.layers().size(), false);
  for (size_t l = 0; l < blocked_.size(); ++l) {
    const Layer& layer = graph_.layers()[l];
    bool blocked = layer.out.c % block == 0;
    switch (layer.kind) {
      case LayerKind::kInput:
      case LayerKind::kFullyConnected:
      case LayerKind::kSoftmaxCrossEntropy:
        blocked = false;
        break;
      case LayerKind::kConv:
        break;
      default:
        for (int in : layer.inputs) blocked = blocked && blocked_[static_cast<size_t>(in)];
    }
    blocked_[l] = blocked;
  }
}

bool Net::adds_to_input(int l, int slot) const {
  return adds_[static_cast<size_t>(l)][static_cast<size_t>(slot)];
}

memory Net::ActivationStaging(const memory::desc& desc) {
  act_scratch_bytes_ = std::max(act_scratch_bytes_, desc.get_size());
  memory view(desc, engine_, DNNL_MEMORY_NONE);
  act_views_.push_back(view);
  return view;
}

memory Net::ParamStaging(const memory::desc& desc, size_t offset_bytes, bool eager) {
  param_scratch_bytes_ = std::max(param_scratch_bytes_, offset_bytes + desc.get_size());
  param_scratch_eager_ = param_scratch_eager_ || eager;
  memory view(desc, engine_, DNNL_MEMORY_NONE);
  param_views_.push_back(view);
  param_offsets_.push_back(offset_bytes);
  return view;
}

namespace {

memory AllocateBytes(const dnnl::engine& engine, size_t bytes) {
  const auto floats = static_cast<memory::dim>((bytes + sizeof(float) - 1) / sizeof(float));
  return memory(memory::desc({std::max<memory::dim>(floats, 1)}, Dt::f32, Tag::a), engine);
}

}  // namespace

void Net::AttachScratch() {
  if (!act_views_.empty() && !act_scratch_) {
    act_scratch_ = AllocateBytes(engine_, act_scratch_bytes_);
    for (memory& v : act_views_) v.set_data_handle(act_scratch_.get_data_handle());
  }
  if (param_scratch_eager_) UseParamScratch();
}

void Net::UseParamScratch() {
  if (param_scratch_ || param_views_.empty()) return;
  param_scratch_ = AllocateBytes(engine_, param_scratch_bytes_);
  auto* base = static_cast<char*>(param_scratch_.get_data_handle());
  for (size_t i = 0; i < param_views_.size(); ++i) {
    param_views_[i].set_data_handle(base + param_offsets_[i]);
  }
}

Status Net::Run(const std::string& context, const char* step, const dnnl::primitive& p,
                const Args& args) {
  const auto start = std::chrono::steady_clock::now();
  KOLO_DNNL_CHECK(context + " " + step, p.execute(stream_, args));
  KOLO_DNNL_CHECK(context + " " + step, stream_.wait());
  AddKernelTime(start);
  return Status::OK();
}

void Net::AddKernelTime(std::chrono::steady_clock::time_point start) {
  kernel_seconds_ +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Net::TakeKernelSeconds() {
  const double s = kernel_seconds_;
  kernel_seconds_ = 0;
  return s;
}

Transfer::Transfer(const Net& net, const memory& src, const memory& dst) {
  const dnnl::engine& eng = net.engine();
  copy_ = dnnl::reorder(dnnl::reorder::primitive_desc(eng, src.get_desc(), eng, dst.get_desc()));
  dnnl::post_ops ops;
  ops.append_sum(1.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  add_ =
      dnnl::reorder(dnnl::reorder::primitive_desc(eng, src.get_desc(), eng, dst.get_desc(), attr));
  args_ = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
}

Status Transfer::Run(Net& net, const std::string& context, bool add) const {
  return net.Run(context, add ? "gradient add" : "gradient copy", add ? add_ : copy_, args_);
}

GradOutput::GradOutput(const Net& net, const memory::desc& natural, const memory& target,
                       const memory& staging)
    : target_(target),
      staging_(staging),
      direct_(natural == target.get_desc()),
      transfer_(net, staging, target) {}

Status GradOutput::Finish(Net& net, const std::string& context, bool add) const {
  if (discard_ || (direct_ && !add)) return Status::OK();
  return transfer_.Run(net, context, add);
}

}  // namespace kolo::models::compute::onednn
