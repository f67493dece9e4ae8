#include "engine/backends/ps/worker.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "engine/common/logging.h"
#include "engine/kernels/reduce.h"

namespace kolo::backends::ps {
namespace {

// Longest sleep in Poll: new work wakes the device, so this only bounds how often an idle worker
// looks up; peers that die are seen at once through their sockets.
constexpr std::chrono::milliseconds kPollSlice{1000};
constexpr size_t kRegisterSlot = 0;
constexpr size_t kByeSlot = 1;
constexpr size_t kElem = sizeof(float);

}  // namespace

Worker::Worker(Job job, CompleteFn complete, FailFn fail, timeline::Timeline* timeline)
    : job_(std::move(job)),
      complete_(std::move(complete)),
      fail_(std::move(fail)),
      timeline_(timeline),
      chunk_bytes_(PushChunkBytes(job_.options.ring_chunk_bytes)),
      peer_timeout_(static_cast<int64_t>(job_.options.peer_timeout_s * 1000)) {
  // Checked by Options::Validate before the job was joined.
  if (auto wire = CompressionDataType(job_.options.compression); wire.ok()) push_dtype_ = *wire;
  const size_t servers = static_cast<size_t>(job_.roles.servers());
  rx_headers_.resize(servers);
  control_headers_.resize(2);
  sends_.resize(servers);
  recvs_.resize(servers);
  acked_.assign(servers, false);
  pulls_due_.assign(servers, 0);
  thread_ = std::thread([this] { Run(); });
}

Worker::~Worker() { Shutdown().IgnoreError(); }

Status Worker::RegisterVariables(const std::vector<VariableSpec>& vars) {
  Registration reg;
  reg.servers = job_.roles.servers();
  reg.policy = job_.policy;
  reg.chunk_bytes = static_cast<int64_t>(chunk_bytes_);
  reg.push_dtype = push_dtype_;
  reg.vars = vars;
  KOLO_RETURN_IF_ERROR(ValidateRegistration(reg));
  {
    MutexLock lock(mu_);
    if (!fatal_.ok()) return fatal_;
    if (stop_ || stopped_) return FailedPrecondition("RegisterVariables: the engine has shut down");
    if (registering_) {
      return FailedPrecondition("RegisterVariables was already called: call it once per job");
    }
    placement_ = Place(reg.vars, reg.servers, reg.policy, reg.split_min_bytes);
    registration_ = std::move(reg);
    specs_ = vars;
    for (size_t i = 0; i < vars.size(); ++i) index_[vars[i].name] = static_cast<int>(i);
    in_flight_.assign(vars.size(), false);
    registering_ = true;
    job_.device->Wake();
    // Half a timeout more than the worker thread and the servers take to name a silent peer, so
    // that their diagnosis arrives first.
    if (!cv_.WaitFor(mu_, peer_timeout_ + peer_timeout_ / 2,
                     [&]() KOLO_REQUIRES(mu_) { return registered_.has_value(); })) {
      return DeadlineExceeded(
          "{}: the parameter servers did not all accept the {} variables within {} s (every "
          "worker must call RegisterVariables with the same list; KOLO_PEER_TIMEOUT_SECONDS)",
          job_.roles.Describe(job_.options.rank), vars.size(), job_.options.peer_timeout_s);
    }
    KOLO_RETURN_IF_ERROR(*registered_);
  }
  if (job_.index == 0) {
    for (int j = 0; j < job_.roles.servers(); ++j) {
      const auto& ids = placement_.server_shards[static_cast<size_t>(j)];
      std::vector<int> tensors;
      for (int id : ids) tensors.push_back(placement_.shards[static_cast<size_t>(id)].variable);
      tensors.erase(std::unique(tensors.begin(), tensors.end()), tensors.end());
      const int64_t bytes = placement_.bytes_per_server[static_cast<size_t>(j)];
      fmt::print(stderr,
                 "kolo ps: server {} (rank {}): {} bytes ({:.1f} MiB) in {} tensors, {} shards "
                 "(placement {})\n",
                 j, job_.roles.server_ranks[static_cast<size_t>(j)], bytes,
                 static_cast<double>(bytes) / (1 << 20), tensors.size(), ids.size(),
                 PlacementPolicyName(job_.policy));
    }
  }
  return Status::OK();
}

Status Worker::PushPull(int64_t handle, const std::string& name, const void* grad, void* weights,
                        DataType dtype, const Shape& shape, const SgdSettings& sgd) {
  MutexLock lock(mu_);
  if (!fatal_.ok()) return fatal_;
  if (stop_ || stopped_) return FailedPrecondition("pushpull '{}': the engine has shut down", name);
  if (!registered_.has_value() || !registered_->ok()) {
    return FailedPrecondition(
        "pushpull '{}': call RegisterVariables (and let it succeed) before the first PushPull",
        name);
  }
  auto it = index_.find(name);
  if (it == index_.end()) {
    return InvalidArgument("pushpull '{}': not a registered variable ({} are registered)", name,
                           specs_.size());
  }
  const VariableSpec& spec = specs_[static_cast<size_t>(it->second)];
  if (dtype != spec.dtype || shape != spec.shape) {
    return InvalidArgument("pushpull '{}': got {} {}, but it was registered as {} {}", name,
                           DataTypeName(dtype), ShapeToString(shape), DataTypeName(spec.dtype),
                           ShapeToString(spec.shape));
  }
  if (NumElements(shape) > 0 && (grad == nullptr || weights == nullptr)) {
    return InvalidArgument("pushpull '{}': null buffer for shape {}", name, ShapeToString(shape));
  }
  if (in_flight_[static_cast<size_t>(it->second)]) {
    return InvalidArgument(
        "pushpull '{}': already in flight on {}; wait for it before pushing the variable again",
        name, job_.roles.Describe(job_.options.rank));
  }
  in_flight_[static_cast<size_t>(it->second)] = true;
  queue_.push_back(Request{it->second, handle, grad, weights, sgd});
  job_.device->Wake();
  return Status::OK();
}

Status Worker::Shutdown() {
  MutexLock serial(shutdown_mu_);
  {
    MutexLock lock(mu_);
    stop_ = true;
    if (!stopped_) job_.device->Wake();
  }
  if (thread_.joinable()) thread_.join();
  MutexLock lock(mu_);
  return fatal_;
}

void Worker::Run() {
  SetThreadLogRank(job_.options.rank);
  Status s = Loop();
  if (!s.ok()) {
    s = s.WithContext(fmt::format("{}: parameter-server traffic (servers are ranks {})",
                                  job_.roles.Describe(job_.options.rank),
                                  fmt::join(job_.roles.server_ranks, ",")));
    s = Status(s.code(), job_.hosts.NameHosts(s.message()));
    KOLO_LOG(kError, "{}", s.ToString());
    job_.device->Abort(s);
  }
  UpdateCounters();
  {
    MutexLock lock(mu_);
    stopped_ = true;
    if (!s.ok() && fatal_.ok()) fatal_ = s;
    if (!registered_.has_value()) {
      registered_ =
          s.ok() ? FailedPrecondition("the engine shut down during RegisterVariables") : s;
    }
    cv_.notify_all();
  }
  // Closing the device first: a send still queued could otherwise read a gradient after its
  // handle has completed and the caller has reused the buffer.
  job_.device.reset();
  if (!s.ok() && fail_) fail_(s);
  FailInFlight(s.ok() ? FailedPrecondition("the engine has shut down") : s);
}

void Worker::EndBusy() {
  if (active_ == 0 || --active_ > 0) return;
  busy_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::steady_clock::now() - busy_since_)
                  .count();
}

void Worker::FailInFlight(const Status& status) {
  std::vector<std::pair<int64_t, std::string>> failed;
  for (Variable& v : vars_) {
    if (v.handle >= 0) failed.emplace_back(std::exchange(v.handle, -1), v.spec.name);
  }
  while (active_ > 0) EndBusy();
  {
    MutexLock lock(mu_);
    for (const Request& r : queue_) {
      failed.emplace_back(r.handle, specs_[static_cast<size_t>(r.var)].name);
    }
    queue_.clear();
    std::fill(in_flight_.begin(), in_flight_.end(), false);
  }
  for (const auto& [handle, name] : failed) {
    complete_(handle, status.WithContext(fmt::format("pushpull '{}'", name)));
  }
}

void Worker::UpdateCounters() {
  if (!job_.device) return;
  bytes_sent_ = static_cast<int64_t>(job_.device->bytes_sent());
  bytes_received_ = static_cast<int64_t>(job_.device->bytes_received());
}

Status Worker::Loop() {
  transport::Device& d = *job_.device;
  KOLO_ASSIGN_OR_RETURN(rx_headers_region_,
                        d.Register(rx_headers_.data(), rx_headers_.size() * sizeof(Header)));
  KOLO_ASSIGN_OR_RETURN(control_region_, d.Register(control_headers_.data(),
                                                    control_headers_.size() * sizeof(Header)));
  for (int j = 0; j < job_.roles.servers(); ++j) KOLO_RETURN_IF_ERROR(PostHeaderRecv(j));
  bool registration_sent = false;
  std::deque<Request> work;
  while (true) {
    bool stop, send_registration = false;
    {
      MutexLock lock(mu_);
      work.swap(queue_);
      stop = stop_;
      if (registering_ && !registration_sent) send_registration = registration_sent = true;
    }
    if (send_registration) KOLO_RETURN_IF_ERROR(SendRegistration());
    // Every taken request is owned by its variable before anything can fail, so that a failure
    // completes it.
    for (const Request& r : work) vars_[static_cast<size_t>(r.var)].handle = r.handle;
    while (!work.empty()) {
      const Request r = work.front();
      work.pop_front();
      KOLO_RETURN_IF_ERROR(StartPush(r));
    }
    if (stop) break;
    completions_.clear();
    Status s = d.Poll(&completions_, kPollSlice);
    if (s.code() != StatusCode::kDeadlineExceeded) {
      KOLO_RETURN_IF_ERROR(s);
      for (const transport::Completion& c : completions_) KOLO_RETURN_IF_ERROR(OnCompletion(c));
      UpdateCounters();
    }
    KOLO_RETURN_IF_ERROR(CheckServers(registration_sent));
  }

  // Goodbye: every server learns that this worker is done, after whatever it already sent. No
  // poll follows: a server that has every goodbye closes at once, which a poll here would report
  // as a lost connection. The frame is written within Send unless the socket is still full of an
  // unfinished push (a shutdown mid-step), and the device's destruction finishes a frame it has
  // started.
  control_headers_[kByeSlot] = Header{};
  control_headers_[kByeSlot].kind = static_cast<uint32_t>(Kind::kBye);
  for (int j = 0; j < job_.roles.servers(); ++j) {
    KOLO_RETURN_IF_ERROR(
        d.pair(job_.roles.server_ranks[static_cast<size_t>(j)])
            .Send(*control_region_, kByeSlot * sizeof(Header), sizeof(Header), kHeaderTag));
  }
  return Status::OK();
}

Status Worker::CheckServers(bool registration_sent) {
  const auto now = std::chrono::steady_clock::now();
  // A turn of this loop much longer than a poll slice means this worker itself was stopped or
  // starved: its peers' silence since then says nothing about them.
  const bool resumed = last_turn_ != std::chrono::steady_clock::time_point{} &&
                       now - last_turn_ > kPollSlice + peer_timeout_ / 4;
  last_turn_ = now;
  if (resumed) return Status::OK();
  for (int j = 0; j < job_.roles.servers(); ++j) {
    const size_t js = static_cast<size_t>(j);
    const int waiting = pulls_due_[js] + (registration_sent && !acked_[js] ? 1 : 0);
    if (waiting == 0 && sends_[js].empty()) continue;
    const int rank = job_.roles.server_ranks[js];
    // A live server keeps sending keepalives while it waits for other workers; a silent one has
    // stopped, hung or become unreachable.
    const double silent = job_.device->SilentSeconds(rank);
    if (silent * 1000 < static_cast<double>(peer_timeout_.count())) continue;
    return DeadlineExceeded(
        "{} has sent nothing for {:.1f} s (the peer timeout is {} s) while this worker waits for "
        "{} of its replies and {} of its sends: it stopped, hung or became unreachable",
        job_.roles.Describe(rank), silent, job_.options.peer_timeout_s, waiting, sends_[js].size());
  }
  return Status::OK();
}

Status Worker::SendRegistration() {
  transport::Device& d = *job_.device;
  vars_.clear();
  vars_.resize(registration_.vars.size());
  for (size_t i = 0; i < vars_.size(); ++i) vars_[i].spec = registration_.vars[i];
  push_headers_.assign(placement_.shards.size(), Header{});
  KOLO_ASSIGN_OR_RETURN(push_headers_region_,
                        d.Register(push_headers_.data(), push_headers_.size() * sizeof(Header)));
  registration_text_ = SerializeRegistration(registration_);
  KOLO_ASSIGN_OR_RETURN(registration_region_,
                        d.Register(registration_text_.data(), registration_text_.size()));
  Header& h = control_headers_[kRegisterSlot];
  h = Header{};
  h.kind = static_cast<uint32_t>(Kind::kRegister);
  h.bytes = registration_text_.size();
  for (int j = 0; j < job_.roles.servers(); ++j) {
    transport::Pair& p = d.pair(job_.roles.server_ranks[static_cast<size_t>(j)]);
    KOLO_RETURN_IF_ERROR(
        p.Send(*control_region_, kRegisterSlot * sizeof(Header), sizeof(Header), kHeaderTag));
    KOLO_RETURN_IF_ERROR(p.Send(*registration_region_, 0, registration_text_.size(),
                                PayloadTag(Kind::kRegister, 0)));
    sends_[static_cast<size_t>(j)].push_back(SendSlot{});
    sends_[static_cast<size_t>(j)].push_back(SendSlot{});
  }
  return Status::OK();
}

Status Worker::StartPush(const Request& r) {
  transport::Device& d = *job_.device;
  Variable& v = vars_[static_cast<size_t>(r.var)];
  const size_t bytes = static_cast<size_t>(NumElements(v.spec.shape)) * kElem;
  // Regions are made once per buffer and kept while the caller passes the same one (registration
  // pins memory on RDMA).
  if (!v.grad_region || v.grad_ptr != r.grad) {
    KOLO_ASSIGN_OR_RETURN(v.grad_region, d.Register(const_cast<void*>(r.grad), bytes));
    v.grad_ptr = r.grad;
  }
  if (!v.weights_region || v.weights_ptr != r.weights) {
    KOLO_ASSIGN_OR_RETURN(v.weights_region, d.Register(r.weights, bytes));
    v.weights_ptr = r.weights;
  }
  // Compressed, the whole gradient is cast once into the variable's wire buffer, and its shards
  // are sent from there.
  const bool compressed = push_dtype_ != DataType::kFloat32;
  const size_t push_elem = DataTypeSize(push_dtype_);
  transport::Region* push_region = v.grad_region.get();
  if (compressed) {
    const size_t count = static_cast<size_t>(NumElements(v.spec.shape));
    if (!v.wire_region) {
      v.wire.assign(std::max<size_t>(count, 1), 0);
      KOLO_ASSIGN_OR_RETURN(v.wire_region, d.Register(v.wire.data(), count * push_elem));
    }
    kernels::Convert(DataType::kFloat32, push_dtype_, v.wire.data(), r.grad, count, 1.0);
    push_region = v.wire_region.get();
  }
  const auto& ids = placement_.variable_shards[static_cast<size_t>(r.var)];
  v.handle = r.handle;
  v.pending_sends = v.pending_pulls = static_cast<int>(ids.size());
  if (active_++ == 0) busy_since_ = std::chrono::steady_clock::now();
  if (timeline_) timeline_->Begin(v.spec.name, "PS_PUSH");
  const bool init = job_.index == 0 && v.step == 0;
  for (int id : ids) {
    const Shard& sh = placement_.shards[static_cast<size_t>(id)];
    Header& h = push_headers_[static_cast<size_t>(id)];
    h = Header{};
    h.kind = static_cast<uint32_t>(Kind::kPush);
    h.shard = static_cast<uint32_t>(id);
    h.step = v.step;
    h.bytes = static_cast<uint64_t>(sh.bytes);
    h.flags = init ? kInitFlag : 0;
    h.learning_rate = r.sgd.learning_rate;
    h.momentum = r.sgd.momentum;
    h.weight_decay = r.sgd.weight_decay;
    h.grad_scale = r.sgd.grad_scale;
    transport::Pair& p = d.pair(job_.roles.server_ranks[static_cast<size_t>(sh.server)]);
    auto& q = sends_[static_cast<size_t>(sh.server)];
    ++pulls_due_[static_cast<size_t>(sh.server)];
    const size_t offset = static_cast<size_t>(sh.begin) * kElem;
    const size_t shard_bytes = static_cast<size_t>(sh.bytes);
    // Chunks hold chunk_bytes_ / 4 elements, in the push dtype.
    const size_t chunk_elems = chunk_bytes_ / kElem;
    const size_t count = static_cast<size_t>(sh.count);
    const size_t chunks = ChunkCount(count, chunk_elems);
    KOLO_RETURN_IF_ERROR(p.Send(*push_headers_region_, static_cast<size_t>(id) * sizeof(Header),
                                sizeof(Header), kHeaderTag));
    q.push_back(SendSlot{r.var, !init && chunks == 0});
    if (init) {
      KOLO_RETURN_IF_ERROR(p.Send(*v.weights_region, offset, shard_bytes,
                                  PayloadTag(Kind::kInit, static_cast<uint32_t>(id))));
      q.push_back(SendSlot{r.var, chunks == 0});
    }
    for (size_t k = 0; k < chunks; ++k) {
      const size_t elems = std::min(chunk_elems, count - k * chunk_elems);
      KOLO_RETURN_IF_ERROR(
          p.Send(*push_region, (static_cast<size_t>(sh.begin) + k * chunk_elems) * push_elem,
                 elems * push_elem, PayloadTag(Kind::kPush, static_cast<uint32_t>(id))));
      q.push_back(SendSlot{r.var, k + 1 == chunks});
    }
  }
  return Status::OK();
}

Status Worker::PostHeaderRecv(int server) {
  transport::Pair& p = job_.device->pair(job_.roles.server_ranks[static_cast<size_t>(server)]);
  KOLO_RETURN_IF_ERROR(p.Recv(*rx_headers_region_, static_cast<size_t>(server) * sizeof(Header),
                              sizeof(Header), kHeaderTag));
  recvs_[static_cast<size_t>(server)].push_back(RecvSlot{-1, sizeof(Header)});
  return Status::OK();
}

Status Worker::OnCompletion(const transport::Completion& c) {
  const size_t peer = static_cast<size_t>(c.peer);
  if (peer >= job_.roles.role.size() || job_.roles.role[peer] != Role::kServer) {
    return Internal("completion from rank {}, which is not a parameter server", c.peer);
  }
  const int server = job_.roles.index[peer];
  if (c.kind == transport::OpKind::kSend) {
    auto& q = sends_[static_cast<size_t>(server)];
    if (q.empty()) return Internal("send completion to rank {} with nothing posted", c.peer);
    const SendSlot slot = q.front();
    q.pop_front();
    if (slot.last) {
      Variable& v = vars_[static_cast<size_t>(slot.var)];
      if (--v.pending_sends == 0 && timeline_) {
        timeline_->End(v.spec.name, "PS_PUSH");
        timeline_->Begin(v.spec.name, "PS_PULL");
      }
      MaybeComplete(v);
    }
    return Status::OK();
  }
  auto& q = recvs_[static_cast<size_t>(server)];
  if (q.empty()) return Internal("receive completion from rank {} with nothing posted", c.peer);
  const RecvSlot slot = q.front();
  q.pop_front();
  if (c.nbytes != slot.bytes) {
    return ProtocolError("{} sent {} bytes where {} were due", job_.roles.Describe(c.peer),
                         c.nbytes, slot.bytes);
  }
  if (slot.shard < 0) return OnHeader(server);
  Variable& v =
      vars_[static_cast<size_t>(placement_.shards[static_cast<size_t>(slot.shard)].variable)];
  --v.pending_pulls;
  --pulls_due_[static_cast<size_t>(server)];
  MaybeComplete(v);
  return Status::OK();
}

Status Worker::OnHeader(int server) {
  const Header h = rx_headers_[static_cast<size_t>(server)];
  const int rank = job_.roles.server_ranks[static_cast<size_t>(server)];
  if (h.check != kHeaderCheck) {
    return ProtocolError("{} sent a malformed header (check {:#x})", job_.roles.Describe(rank),
                         h.check);
  }
  switch (static_cast<Kind>(h.kind)) {
    case Kind::kRegistered: {
      acked_[static_cast<size_t>(server)] = true;
      if (std::all_of(acked_.begin(), acked_.end(), [](bool b) { return b; })) {
        MutexLock lock(mu_);
        registered_ = Status::OK();
        cv_.notify_all();
      }
      break;
    }
    case Kind::kPull: {
      if (h.shard >= placement_.shards.size() || placement_.shards[h.shard].server != server) {
        return ProtocolError("{} sent shard {}, which it does not hold", job_.roles.Describe(rank),
                             h.shard);
      }
      const Shard& sh = placement_.shards[h.shard];
      Variable& v = vars_[static_cast<size_t>(sh.variable)];
      if (v.handle < 0 || h.step != v.step + 1 || h.bytes != static_cast<uint64_t>(sh.bytes)) {
        return ProtocolError(
            "{} sent '{}' after update {} ({} bytes), but this worker {} (update {}, {} bytes)",
            job_.roles.Describe(rank), v.spec.name, h.step, h.bytes,
            v.handle < 0 ? "has no push of it in flight" : "awaits", v.step + 1, sh.bytes);
      }
      transport::Pair& p = job_.device->pair(rank);
      KOLO_RETURN_IF_ERROR(p.Recv(*v.weights_region, static_cast<size_t>(sh.begin) * kElem,
                                  static_cast<size_t>(sh.bytes), PayloadTag(Kind::kPull, h.shard)));
      recvs_[static_cast<size_t>(server)].push_back(
          RecvSlot{static_cast<int>(h.shard), static_cast<size_t>(sh.bytes)});
      break;
    }
    default:
      return ProtocolError("{} sent a '{}' header, which workers do not accept",
                           job_.roles.Describe(rank), KindName(h.kind));
  }
  return PostHeaderRecv(server);
}

void Worker::MaybeComplete(Variable& v) {
  if (v.handle < 0 || v.pending_sends > 0 || v.pending_pulls > 0) return;
  if (timeline_) timeline_->End(v.spec.name, "PS_PULL");
  ++v.step;
  const int64_t handle = std::exchange(v.handle, -1);
  {
    MutexLock lock(mu_);
    in_flight_[static_cast<size_t>(&v - vars_.data())] = false;
  }
  ++updates_;
  EndBusy();
  UpdateCounters();  // so that a caller that has waited for this PushPull sees its bytes
  complete_(handle, Status::OK());
}

}  // namespace kolo::backends::ps
