#include "engine/execution/executor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <string_view>

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
  std::vector<Operation*> op_of(responses.size(), nullptr);
  for (size_t i = 0; i < responses.size(); ++i) {
    op_of[i] = ops.Find(responses[i].request.name);
    if (!responses[i].is_error() && op_of[i] == nullptr) {
      return Internal("response for '{}', which rank {} has not submitted",
                      responses[i].request.name, settings_.rank);
    }
  }
  for (const fusion::Group& g :
       fusion::PlanFusion(responses, static_cast<size_t>(settings_.fusion_threshold_bytes))) {
    const Response& first = responses[g.members[0]];
    Operation* first_op = op_of[g.members[0]];
    if (first.is_error()) {
      if (first_op != nullptr) {
        ops.Complete(first_op, Status(StatusCode::kInvalidArgument, first.error), nullptr);
      }
      continue;
    }
    switch (first.request.type) {
      case CollectiveType::kAllreduce: {
        GroupOps group;
        for (size_t i : g.members) group.members.push_back(op_of[i]);
        group.dtype = first.request.dtype;
        group.wire = group.dtype == DataType::kFloat32 ? settings_.compression : group.dtype;
        group.bytes = g.bytes;
        group.fused = g.fused;
        // Averaging is decided here, once, and applied where each path writes its results.
        if (first.request.reduce_op == static_cast<uint8_t>(ReduceOp::kAverage)) {
          group.scale = 1.0 / settings_.size;
        }
        KOLO_RETURN_IF_ERROR(Allreduce(group, ops));
        break;
      }
      case CollectiveType::kBroadcast:
        KOLO_RETURN_IF_ERROR(Broadcast(first, *first_op, ops));
        break;
      case CollectiveType::kAllgather:
        KOLO_RETURN_IF_ERROR(Allgather(first, *first_op, ops));
        break;
    }
  }
  return Status::OK();
}

bool Executor::PrepareRiding(const std::vector<const Request*>& hits, size_t max_bytes,
                             bool allowed, Operations& ops, coordinator::RidingPayload* payload) {
  if (!allowed || hits.empty()) return false;
  const DataType dtype = hits[0]->dtype;
  const uint8_t op = hits[0]->reduce_op;
  if (op != static_cast<uint8_t>(ReduceOp::kSum) &&
      op != static_cast<uint8_t>(ReduceOp::kAverage)) {
    return false;
  }
  if (dtype == DataType::kFloat32 && settings_.compression != DataType::kFloat32) return false;
  size_t bytes = 0;
  for (const Request* r : hits) {
    if (r->type != CollectiveType::kAllreduce || r->on_device || r->dtype != dtype ||
        r->reduce_op != op || std::string_view(BackendFor(*r).name()) != "ring") {
      return false;
    }
    bytes += static_cast<size_t>(NumElements(r->shape)) * DataTypeSize(dtype);
    if (bytes > max_bytes) return false;
  }
  if (bytes == 0) return false;
  if (payload->data == nullptr) {
    riding_in_.resize(bytes);
    payload->data = riding_in_.data();
  }
  riding_sum_.resize(bytes);
  size_t at = 0;
  for (const Request* r : hits) {
    const Operation* e = ops.Find(r->name);
    if (e == nullptr) return false;
    const size_t n = static_cast<size_t>(NumElements(r->shape)) * DataTypeSize(dtype);
    if (n > 0) std::memcpy(payload->data + at, e->in, n);
    at += n;
  }
  payload->bytes = bytes;
  payload->dtype = dtype;
  payload->sum = riding_sum_.data();
  return true;
}

Status Executor::CompleteRiding(const std::vector<Response>& responses, Operations& ops) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Operation*> members;
  for (const Response& r : responses) {
    Operation* e = ops.Find(r.request.name);
    if (e == nullptr) {
      return Internal("response for '{}', which rank {} has not submitted", r.request.name,
                      settings_.rank);
    }
    members.push_back(e);
  }
  if (members.empty()) return Status::OK();
  const DataType dtype = members[0]->request.dtype;
  const double scale = members[0]->request.reduce_op == static_cast<uint8_t>(ReduceOp::kAverage)
                           ? 1.0 / settings_.size
                           : 1.0;
  std::vector<fusion::CopyEntry> out;
  size_t at = 0;
  for (Operation* e : members) {
    const size_t n = static_cast<size_t>(NumElements(e->request.shape)) * DataTypeSize(dtype);
    out.push_back({riding_sum_.data() + at, e->out, n});
    at += n;
  }
  if (at != riding_sum_.size()) {
    return Internal("the riding payload holds {} bytes; its responses {}", riding_sum_.size(), at);
  }
  if (timeline_ != nullptr) {
    const std::string args =
        fmt::format("{{\"bytes\":{},\"tensors\":{},\"dtype\":\"{}\",\"riding\":true}}", at,
                    members.size(), DataTypeName(dtype));
    for (Operation* e : members) {
      Begin(e->request.name, "ALLREDUCE", args);
      Begin(e->request.name, "RIDING_UNPACK");
    }
  }
  fusion::UnpackEntries(out.data(), out.size(), dtype, scale);
  for (Operation* e : members) {
    End(e->request.name, "RIDING_UNPACK");
    End(e->request.name, "ALLREDUCE");
  }
  const bool fused = members.size() > 1;
  ops.Count({1, fused ? static_cast<int64_t>(at) : 0, fused ? static_cast<int64_t>(at) : 0,
             static_cast<int64_t>(at), MicrosSince(start), static_cast<int64_t>(at), 1});
  for (Operation* e : members) ops.Complete(e, Status::OK(), nullptr);
  return Status::OK();
}

backends::Backend& Executor::BackendFor(const Request& request) {
  for (const auto& b : *backends_) {
    if (b->Enabled(request.type, request.dtype)) return *b;
  }
  return *backends_->back();
}

Status Executor::RunHost(const GroupOps& group, backends::Backend& backend,
                         const std::string& op_name, Operations& ops) {
  const DataType dtype = group.dtype;
  const size_t elem = DataTypeSize(dtype);
  auto bytes_of = [&](const Operation* e) {
    return static_cast<size_t>(NumElements(e->request.shape)) * elem;
  };
  // A tensor alone is reduced where it is; in a fused group, large tensors are too when the
  // backend reduces scattered buffers, and the rest go through the fusion buffer.
  const bool scattered = backend.SupportsScattered();
  std::vector<Operation*> packed;    // into the fusion buffer and back
  std::vector<Operation*> in_place;  // reduced in their outputs
  size_t packed_bytes = 0;
  for (Operation* e : group.members) {
    const size_t n = bytes_of(e);
    if (!group.fused || (scattered && n >= kInPlaceMinBytes)) {
      if (n > 0 && e->in != e->out) std::memmove(e->out, e->in, n);
      in_place.push_back(e);
    } else {
      packed.push_back(e);
      packed_bytes += n;
    }
  }
  KOLO_RETURN_IF_ERROR(fusion_buffer_.Reserve(packed_bytes));
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

  if (group.fused) {
    for (const auto& n : group_names_) Begin(n, "MEMCPY_IN_FUSION_BUFFER");
    const std::vector<fusion::CopyEntry> in_copies = copies(/*into=*/true);
    fusion::PackEntries(in_copies.data(), in_copies.size());
    for (const auto& n : group_names_) End(n, "MEMCPY_IN_FUSION_BUFFER");
  }

  for (const auto& n : group_names_) Begin(n, op_name);
  Status status;
  if (pieces.size() == 1) {
    status = backend.Allreduce(pieces[0].data, pieces[0].bytes / elem, dtype);
  } else {
    status = backend.AllreduceScattered(pieces, dtype);
  }
  for (const auto& n : group_names_) End(n, op_name);
  KOLO_RETURN_IF_ERROR(status);

  // Results out of the fusion buffer, and every result scaled for an average on the way.
  if (group.fused) {
    for (const auto& n : group_names_) Begin(n, "MEMCPY_OUT_FUSION_BUFFER");
  }
  const std::vector<fusion::CopyEntry> out_copies = copies(/*into=*/false);
  fusion::UnpackEntries(out_copies.data(), out_copies.size(), dtype, group.scale);
  if (group.scale != 1.0) {
    for (Operation* e : in_place) kernels::Scale(dtype, e->out, bytes_of(e) / elem, group.scale);
  }
  if (group.fused) {
    for (const auto& n : group_names_) End(n, "MEMCPY_OUT_FUSION_BUFFER");
    ops.Count({0, static_cast<int64_t>(group.bytes), static_cast<int64_t>(packed_bytes)});
  }
  return Status::OK();
}

Status Executor::RunHostCompressed(const GroupOps& group, backends::Backend& backend,
                                   const std::string& op_name, Operations& ops) {
  const size_t wire_elem = DataTypeSize(group.wire);
  const size_t count = group.bytes / DataTypeSize(group.dtype);
  KOLO_RETURN_IF_ERROR(fusion_buffer_.Reserve(count * wire_elem));
  uint8_t* wire = fusion_buffer_.data();
  for (const auto& n : group_names_) Begin(n, "COMPRESS");
  size_t offset = 0;
  for (Operation* e : group.members) {
    const size_t n = static_cast<size_t>(NumElements(e->request.shape));
    kernels::Convert(group.dtype, group.wire, wire + offset * wire_elem, e->in, n, 1.0);
    offset += n;
  }
  for (const auto& n : group_names_) End(n, "COMPRESS");

  for (const auto& n : group_names_) Begin(n, op_name);
  const Status status =
      count == 0 ? Status::OK() : backend.Allreduce(fusion_buffer_.data(), count, group.wire);
  for (const auto& n : group_names_) End(n, op_name);
  KOLO_RETURN_IF_ERROR(status);

  for (const auto& n : group_names_) Begin(n, "DECOMPRESS");
  offset = 0;
  for (Operation* e : group.members) {
    const size_t n = static_cast<size_t>(NumElements(e->request.shape));
    kernels::Convert(group.wire, group.dtype, e->out, wire + offset * wire_elem, n, group.scale);
    offset += n;
  }
  for (const auto& n : group_names_) End(n, "DECOMPRESS");
  if (group.fused) {
    ops.Count({0, static_cast<int64_t>(group.bytes), static_cast<int64_t>(group.bytes)});
  }
  return Status::OK();
}

// Device work is queued on the context's stream, so the MEMCPY_IN and collective activities time
// the queueing (and, for the ring, the staged wire); MEMCPY_OUT ends when the results are written.
Status Executor::RunDevice(const GroupOps& group, const std::string& op_name, Operations& ops) {
  cuda::DeviceContext& ctx = *gpu_;
  const DataType dtype = group.dtype;
  const size_t elem = DataTypeSize(dtype);
  const double scale = group.scale;
  KOLO_RETURN_IF_ERROR(ctx.Activate());
  const std::vector<Operation*>& entries = group.members;
  for (Operation* e : entries) KOLO_RETURN_IF_ERROR(ctx.WaitEvent(e->place.ready_event));
  auto bytes_of = [&](const Operation* e) {
    return static_cast<size_t>(NumElements(e->request.shape)) * elem;
  };
  // A group runs in the device fusion buffer; a lone tensor in its output. Compressed, every
  // tensor is cast into the fusion buffer in the wire dtype and cast back out of it.
  const bool compressed = group.wire != dtype;
  const size_t wire_elem = DataTypeSize(group.wire);
  void* buf = nullptr;
  std::vector<fusion::CopyEntry> in, out;
  if (group.fused || compressed) {
    KOLO_ASSIGN_OR_RETURN(uint8_t * fused, ctx.FusionBuffer(group.bytes / elem * wire_elem));
    size_t offset = 0;
    for (Operation* e : entries) {
      const size_t n = bytes_of(e);
      const size_t wire_n = n / elem * wire_elem;
      in.push_back({e->in, fused + offset, n});
      out.push_back({fused + offset, e->out, wire_n});
      offset += wire_n;
    }
    buf = fused;
  } else {
    Operation* e = entries[0];
    if (e->in != e->out) in.push_back({e->in, e->out, bytes_of(e)});
    if (scale != 1.0) out.push_back({e->out, e->out, bytes_of(e)});
    buf = e->out;
  }
  if (compressed) {
    for (const auto& n : group_names_) Begin(n, "COMPRESS");
    KOLO_RETURN_IF_ERROR(ctx.Convert(in.data(), in.size(), dtype, group.wire, 1.0));
    for (const auto& n : group_names_) End(n, "COMPRESS");
    for (const auto& n : group_names_) Begin(n, op_name);
    Status status = group.bytes == 0
                        ? Status::OK()
                        : device_collectives_->Allreduce(buf, group.bytes / elem, group.wire);
    for (const auto& n : group_names_) End(n, op_name);
    KOLO_RETURN_IF_ERROR(status);
    for (const auto& n : group_names_) Begin(n, "DECOMPRESS");
    KOLO_RETURN_IF_ERROR(ctx.Convert(out.data(), out.size(), group.wire, dtype, scale));
    KOLO_RETURN_IF_ERROR(ctx.Synchronize());
    for (const auto& n : group_names_) End(n, "DECOMPRESS");
    if (group.fused) {
      ops.Count({0, static_cast<int64_t>(group.bytes), static_cast<int64_t>(group.bytes)});
    }
    return Status::OK();
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

Status Executor::Allreduce(const GroupOps& group, Operations& ops) {
  const auto start = std::chrono::steady_clock::now();
  const coordinator::Request& first = group.members[0]->request;
  backends::Backend& backend = BackendFor(first);
  const std::string op_name =
      UpperName(first.on_device ? device_collectives_->name() : backend.name()) + "_ALLREDUCE";

  group_names_.clear();
  for (const Operation* e : group.members) group_names_.push_back(e->request.name);
  if (timeline_ != nullptr) {
    std::string args = fmt::format("{{\"bytes\":{},\"tensors\":{},\"dtype\":\"{}\"", group.bytes,
                                   group.members.size(), DataTypeName(group.dtype));
    if (group.wire != group.dtype) {
      args += fmt::format(",\"compressed_to\":\"{}\"", DataTypeName(group.wire));
    }
    args += "}";
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

  const bool compressed = group.wire != group.dtype;
  Status status;
  if (first.on_device) {
    status = RunDevice(group, op_name, ops);
  } else if (compressed) {
    status = RunHostCompressed(group, backend, op_name, ops);
  } else {
    status = RunHost(group, backend, op_name, ops);
  }
  comm_->on_phase = nullptr;
  for (const auto& n : group_names_) End(n, "ALLREDUCE");
  const size_t wire_bytes = group.bytes / DataTypeSize(group.dtype) * DataTypeSize(group.wire);
  ops.Count({1, 0, 0, status.ok() ? static_cast<int64_t>(group.bytes) : 0, MicrosSince(start),
             status.ok() ? static_cast<int64_t>(wire_bytes) : 0});
  if (!status.ok()) return status;  // a transport failure is fatal for the job
  for (Operation* e : group.members) ops.Complete(e, Status::OK(), nullptr);
  return Status::OK();
}

Status Executor::Broadcast(const Response& response, Operation& e, Operations& ops) {
  const auto start = std::chrono::steady_clock::now();
  const std::string& name = response.request.name;
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
  ops.Complete(&e, Status::OK(), nullptr);
  return Status::OK();
}

Status Executor::Allgather(const Response& response, Operation& e, Operations& ops) {
  const auto start = std::chrono::steady_clock::now();
  const coordinator::Request& req = response.request;
  const std::string& name = req.name;
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
  ops.Complete(&e, Status::OK(), std::move(out));
  return Status::OK();
}

}  // namespace kolo::execution
