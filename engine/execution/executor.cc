#include "engine/execution/executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>

#include "engine/kernels/reduce.h"

namespace kolo::execution {
namespace {

using coordinator::CollectiveType;
using coordinator::Request;
using coordinator::Response;

std::string UpperName(const char* s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// Tensors at least this large join a fusion group where they are (zero-copy) when the backend
// reduces scattered buffers in one collective; smaller ones are packed. Copying a tensor in and
// out costs about as much as the two extra messages a separate piece costs near this size.
constexpr size_t kInPlaceMinBytes = 128 << 10;

double MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

Executor::Executor(const ExecutorSettings& settings, collectives::Comm* comm,
                   const std::vector<std::unique_ptr<backends::Backend>>* backends,
                   timeline::Timeline* timeline)
    : settings_(settings), comm_(comm), backends_(backends), timeline_(timeline) {}

void Executor::SetDevice(cuda::DeviceContext* context, backends::DeviceCollectives* collectives) {
  gpu_ = context;
  device_collectives_ = collectives;
}

Operation& Executor::Get(Operations& ops, const std::string& name) {
  // Execute checked that every collective response names an operation of this rank.
  return *ops.Find(name);
}

void Executor::Begin(const std::string& name, const std::string& activity,
                     const std::string& args) {
  if (timeline_ != nullptr) timeline_->Begin(name, activity, args);
}

void Executor::End(const std::string& name, const std::string& activity) {
  if (timeline_ != nullptr) timeline_->End(name, activity);
}

Status Executor::Execute(const std::vector<Response>& responses, Operations& ops) {
  // Every collective response must name a tensor this rank submitted; errors may name tensors
  // this rank never submitted (a stall it caused), which it simply has nothing to complete for.
  for (const Response& r : responses) {
    if (!r.is_error() && ops.Find(r.request.name) == nullptr) {
      return Internal("response for '{}', which rank {} has not submitted", r.request.name,
                      settings_.rank);
    }
  }
  for (const fusion::Group& g :
       fusion::PlanFusion(responses, static_cast<size_t>(settings_.fusion_threshold_bytes))) {
    const Response& first = responses[g.members[0]];
    if (first.is_error()) {
      if (ops.Find(first.request.name) != nullptr) {
        ops.Complete(first.request.name, Status(StatusCode::kInvalidArgument, first.error),
                     nullptr);
      }
      continue;
    }
    switch (first.request.type) {
      case CollectiveType::kAllreduce:
        KOLO_RETURN_IF_ERROR(Allreduce(responses, g, ops));
        break;
      case CollectiveType::kBroadcast:
        KOLO_RETURN_IF_ERROR(Broadcast(first, ops));
        break;
      case CollectiveType::kAllgather:
        KOLO_RETURN_IF_ERROR(Allgather(first, ops));
        break;
    }
  }
  return Status::OK();
}

backends::Backend& Executor::BackendFor(const Request& request) {
  for (const auto& b : *backends_) {
    if (b->Enabled(request.type, request.dtype)) return *b;
  }
  return *backends_->back();
}

Status Executor::RunFused(const std::vector<Response>& responses, const fusion::Group& group,
                          backends::Backend& backend, const std::string& op_name, double scale,
                          Operations& ops) {
  const DataType dtype = responses[group.members[0]].request.dtype;
  const bool scattered = backend.SupportsScattered();
  std::vector<Operation*> packed;    // small tensors: into the fusion buffer and back
  std::vector<Operation*> in_place;  // large tensors: reduced where they are
  size_t packed_bytes = 0;
  for (size_t i : group.members) {
    Operation& e = Get(ops, responses[i].request.name);
    const size_t n = responses[i].bytes();
    if (scattered && n >= kInPlaceMinBytes) {
      if (e.in != e.out) std::memmove(e.out, e.in, n);
      in_place.push_back(&e);
    } else {
      packed.push_back(&e);
      packed_bytes += n;
    }
  }
  KOLO_RETURN_IF_ERROR(fusion_buffer_.Reserve(packed_bytes));
  auto bytes_of = [&](const Operation* e) {
    return static_cast<size_t>(NumElements(e->request.shape)) * DataTypeSize(dtype);
  };
  // Copies between each packed tensor and its slot; `into` picks the direction.
  auto copies = [&](bool into) {
    std::vector<fusion::CopyEntry> out;
    size_t offset = 0;
    for (Operation* e : packed) {
      uint8_t* slot = fusion_buffer_.data() + offset;
      out.push_back(into ? fusion::CopyEntry{e->in, slot, bytes_of(e)}
                         : fusion::CopyEntry{slot, e->out, bytes_of(e)});
      offset += bytes_of(e);
    }
    return out;
  };
  std::vector<backends::HostBuffer> pieces;
  if (packed_bytes > 0) pieces.push_back({fusion_buffer_.data(), packed_bytes});
  for (Operation* e : in_place) pieces.push_back({e->out, bytes_of(e)});

  for (const auto& n : group_names_) Begin(n, "MEMCPY_IN_FUSION_BUFFER");
  const std::vector<fusion::CopyEntry> in_copies = copies(/*into=*/true);
  fusion::PackEntries(in_copies.data(), in_copies.size());
  for (const auto& n : group_names_) End(n, "MEMCPY_IN_FUSION_BUFFER");

  for (const auto& n : group_names_) Begin(n, op_name);
  Status status =
      pieces.size() == 1
          ? backend.Allreduce(pieces[0].data, pieces[0].bytes / DataTypeSize(dtype), dtype)
          : backend.AllreduceScattered(pieces, dtype);
  for (const auto& n : group_names_) End(n, op_name);
  KOLO_RETURN_IF_ERROR(status);

  // Back out of the fusion buffer, scaling on the way for an average.
  const std::vector<fusion::CopyEntry> out_copies = copies(/*into=*/false);
  for (const auto& n : group_names_) Begin(n, "MEMCPY_OUT_FUSION_BUFFER");
  fusion::UnpackEntries(out_copies.data(), out_copies.size(), dtype, scale);
  if (scale != 1.0) {
    for (Operation* e : in_place) {
      kernels::Scale(dtype, e->out, bytes_of(e) / DataTypeSize(dtype), scale);
    }
  }
  for (const auto& n : group_names_) End(n, "MEMCPY_OUT_FUSION_BUFFER");
  ops.Count({0, static_cast<int64_t>(group.bytes), static_cast<int64_t>(packed_bytes)});
  return Status::OK();
}

// Device work is queued on the context's stream, so the MEMCPY_IN and collective activities time
// the queueing (and, for the ring, the staged wire); MEMCPY_OUT ends when the results are written.
Status Executor::RunDevice(const std::vector<Response>& responses, const fusion::Group& group,
                           const std::string& op_name, double scale, Operations& ops) {
  cuda::DeviceContext& ctx = *gpu_;
  const DataType dtype = responses[group.members[0]].request.dtype;
  const size_t elem = DataTypeSize(dtype);
  KOLO_RETURN_IF_ERROR(ctx.Activate());
  std::vector<Operation*> entries;
  for (size_t i : group.members) {
    Operation& e = Get(ops, responses[i].request.name);
    KOLO_RETURN_IF_ERROR(ctx.WaitEvent(e.place.ready_event));
    entries.push_back(&e);
  }
  auto bytes_of = [&](const Operation* e) {
    return static_cast<size_t>(NumElements(e->request.shape)) * elem;
  };
  // A group runs in the device fusion buffer; a lone tensor in its output.
  void* buf = nullptr;
  std::vector<fusion::CopyEntry> in, out;
  if (group.fused) {
    KOLO_ASSIGN_OR_RETURN(uint8_t * fused, ctx.FusionBuffer(group.bytes));
    size_t offset = 0;
    for (Operation* e : entries) {
      in.push_back({e->in, fused + offset, bytes_of(e)});
      out.push_back({fused + offset, e->out, bytes_of(e)});
      offset += bytes_of(e);
    }
    buf = fused;
  } else {
    Operation* e = entries[0];
    if (e->in != e->out) in.push_back({e->in, e->out, bytes_of(e)});
    if (scale != 1.0) out.push_back({e->out, e->out, bytes_of(e)});
    buf = e->out;
  }
  for (const auto& n : group_names_) Begin(n, "MEMCPY_IN_FUSION_BUFFER");
  KOLO_RETURN_IF_ERROR(ctx.Pack(in.data(), in.size()));
  for (const auto& n : group_names_) End(n, "MEMCPY_IN_FUSION_BUFFER");

  for (const auto& n : group_names_) Begin(n, op_name);
  Status status = group.bytes == 0 ? Status::OK()
                                   : device_collectives_->Allreduce(buf, group.bytes / elem, dtype);
  for (const auto& n : group_names_) End(n, op_name);
  KOLO_RETURN_IF_ERROR(status);

  for (const auto& n : group_names_) Begin(n, "MEMCPY_OUT_FUSION_BUFFER");
  KOLO_RETURN_IF_ERROR(ctx.Unpack(out.data(), out.size(), dtype, scale));
  KOLO_RETURN_IF_ERROR(ctx.Synchronize());
  for (const auto& n : group_names_) End(n, "MEMCPY_OUT_FUSION_BUFFER");
  if (group.fused) {
    ops.Count({0, static_cast<int64_t>(group.bytes), static_cast<int64_t>(group.bytes)});
  }
  return Status::OK();
}

Status Executor::Allreduce(const std::vector<Response>& responses, const fusion::Group& group,
                           Operations& ops) {
  const auto start = std::chrono::steady_clock::now();
  const coordinator::Request& first = responses[group.members[0]].request;
  const size_t bytes = group.bytes;
  const bool fused = group.fused;
  const DataType dtype = first.dtype;
  const size_t elem = DataTypeSize(dtype);
  const bool average = first.reduce_op == static_cast<uint8_t>(ReduceOp::kAverage);
  const double scale = average ? 1.0 / settings_.size : 1.0;
  backends::Backend& backend = BackendFor(first);
  const std::string op_name =
      UpperName(first.on_device ? device_collectives_->name() : backend.name()) + "_ALLREDUCE";

  group_names_.clear();
  for (size_t i : group.members) group_names_.push_back(responses[i].request.name);
  if (timeline_ != nullptr) {
    const std::string args = fmt::format("{{\"bytes\":{},\"tensors\":{},\"dtype\":\"{}\"}}", bytes,
                                         group.members.size(), DataTypeName(dtype));
    for (const auto& n : group_names_) timeline_->Begin(n, "ALLREDUCE", args);
    comm_->on_phase = [this](collectives::Phase phase, bool starting) {
      for (const auto& n : group_names_) {
        if (starting) {
          timeline_->Begin(n, collectives::PhaseName(phase));
        } else {
          timeline_->End(n, collectives::PhaseName(phase));
        }
      }
    };
  }

  Status status;
  if (first.on_device) {
    status = RunDevice(responses, group, op_name, scale, ops);
  } else if (fused) {
    status = RunFused(responses, group, backend, op_name, scale, ops);
  } else {
    Operation& e = Get(ops, first.name);
    if (bytes > 0 && e.in != e.out) std::memmove(e.out, e.in, bytes);
    Begin(first.name, op_name);
    status = backend.Allreduce(e.out, bytes / elem, dtype);
    End(first.name, op_name);
    if (status.ok() && average) kernels::Scale(dtype, e.out, bytes / elem, scale);
  }
  comm_->on_phase = nullptr;
  for (const auto& n : group_names_) End(n, "ALLREDUCE");
  ops.Count({1, 0, 0, status.ok() ? static_cast<int64_t>(bytes) : 0, MicrosSince(start)});
  if (!status.ok()) return status;  // a transport failure is fatal for the job
  for (const auto& n : group_names_) ops.Complete(n, Status::OK(), nullptr);
  return Status::OK();
}

Status Executor::Broadcast(const Response& response, Operations& ops) {
  const auto start = std::chrono::steady_clock::now();
  const std::string& name = response.request.name;
  Operation& e = Get(ops, name);
  backends::Backend& backend = BackendFor(response.request);
  const bool on_device = response.request.on_device;
  const std::string op_name =
      UpperName(on_device ? device_collectives_->name() : backend.name()) + "_BROADCAST";
  Begin(name, "BROADCAST",
        fmt::format("{{\"bytes\":{},\"root\":{}}}", response.bytes(), response.request.root));
  Begin(name, op_name);
  Status status;
  if (!on_device) {
    status = backend.Broadcast(e.out, response.bytes(), response.request.root);
  } else {
    // In place on the device: after the producer's event, on the engine's stream.
    status = gpu_->Activate();
    if (status.ok()) status = gpu_->WaitEvent(e.place.ready_event);
    if (status.ok() && response.bytes() > 0) {
      status = device_collectives_->Broadcast(e.out, response.bytes(), response.request.root);
    }
    if (status.ok()) status = gpu_->Synchronize();
  }
  End(name, op_name);
  End(name, "BROADCAST");
  ops.Count({1, 0, 0, 0, MicrosSince(start)});
  KOLO_RETURN_IF_ERROR(status);
  ops.Complete(name, Status::OK(), nullptr);
  return Status::OK();
}

Status Executor::Allgather(const Response& response, Operations& ops) {
  const auto start = std::chrono::steady_clock::now();
  const coordinator::Request& req = response.request;
  const std::string& name = req.name;
  Operation& e = Get(ops, name);
  // Bytes of one slice along the first dimension.
  int64_t row = 1;
  for (size_t d = 1; d < req.shape.size(); ++d) row *= req.shape[d];
  const size_t row_bytes = static_cast<size_t>(row) * DataTypeSize(req.dtype);
  std::vector<size_t> per_rank;
  size_t total = 0, mine_offset = 0;
  for (int r = 0; r < settings_.size; ++r) {
    if (r == settings_.rank) mine_offset = total;
    per_rank.push_back(static_cast<size_t>(response.first_dims[r]) * row_bytes);
    total += per_rank.back();
  }
  auto out = std::make_unique<GatheredTensor>();
  out->data.resize(total);
  out->first_dims = response.first_dims;
  out->shape = e.request.shape;
  out->shape[0] = 0;
  for (int64_t d : response.first_dims) out->shape[0] += d;
  if (per_rank[settings_.rank] > 0) {
    std::memcpy(out->data.data() + mine_offset, e.in, per_rank[settings_.rank]);
  }
  backends::Backend& backend = BackendFor(req);
  const std::string op_name = UpperName(backend.name()) + "_ALLGATHER";
  Begin(name, "ALLGATHER", fmt::format("{{\"bytes\":{}}}", total));
  Begin(name, op_name);
  Status status = backend.Allgatherv(out->data.data(), per_rank);
  End(name, op_name);
  End(name, "ALLGATHER");
  ops.Count({1, 0, 0, 0, MicrosSince(start)});
  KOLO_RETURN_IF_ERROR(status);
  ops.Complete(name, Status::OK(), std::move(out));
  return Status::OK();
}

}  // namespace kolo::execution
