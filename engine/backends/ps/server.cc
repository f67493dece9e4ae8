#include "engine/backends/ps/server.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "engine/backends/ps/sgd.h"
#include "engine/common/logging.h"
#include "engine/kernels/reduce.h"

namespace kolo::backends::ps {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::chrono::milliseconds kPollSlice{250};
constexpr auto kStallCheckEvery = std::chrono::milliseconds(250);
constexpr size_t kElem = sizeof(float);

bool SameSettings(const SgdSettings& a, const SgdSettings& b) {
  return a.learning_rate == b.learning_rate && a.momentum == b.momentum &&
         a.weight_decay == b.weight_decay && a.grad_scale == b.grad_scale;
}

std::string SettingsText(const SgdSettings& s) {
  return fmt::format("learning rate {}, momentum {}, weight decay {}, grad scale {}",
                     s.learning_rate, s.momentum, s.weight_decay, s.grad_scale);
}

}  // namespace

Server::Server(Job job, timeline::Timeline* timeline)
    : job_(std::move(job)),
      timeline_(timeline),
      workers_(job_.roles.workers()),
      peer_timeout_(static_cast<int64_t>(job_.options.peer_timeout_s * 1000)) {
  peers_.resize(static_cast<size_t>(workers_));
  for (int w = 0; w < workers_; ++w) {
    peers_[static_cast<size_t>(w)].rank = job_.roles.worker_ranks[static_cast<size_t>(w)];
  }
  rx_headers_.resize(static_cast<size_t>(workers_));
}

std::string Server::Who(int worker) const {
  return job_.roles.Describe(job_.roles.worker_ranks[static_cast<size_t>(worker)]);
}

Status Server::Serve() {
  if (served_) return FailedPrecondition("Serve was already called on this rank");
  served_ = true;
  Status s = Loop();
  if (job_.device) {
    bytes_sent_ = static_cast<int64_t>(job_.device->bytes_sent());
    bytes_received_ = static_cast<int64_t>(job_.device->bytes_received());
  }
  const std::string me = job_.roles.Describe(job_.options.rank);
  if (!s.ok()) {
    s = s.WithContext(me);
    s = Status(s.code(), job_.hosts.NameHosts(s.message()));
    KOLO_LOG(kError, "{}", s.ToString());
    job_.device->Abort(s);
  } else {
    fmt::print(stderr, "kolo ps: {} served {} updates: received {} bytes, sent {} bytes\n", me,
               updates_.load(), bytes_received_.load(), bytes_sent_.load());
  }
  job_.device.reset();
  return s;
}

Status Server::Loop() {
  transport::Device& d = *job_.device;
  KOLO_ASSIGN_OR_RETURN(rx_headers_region_,
                        d.Register(rx_headers_.data(), rx_headers_.size() * sizeof(Header)));
  KOLO_ASSIGN_OR_RETURN(registered_region_, d.Register(&registered_header_, sizeof(Header)));
  for (int w = 0; w < workers_; ++w) KOLO_RETURN_IF_ERROR(PostHeaderRecv(w));
  last_stall_check_ = Clock::now();
  Clock::time_point flush_deadline{};
  while (gone_ < workers_ || pending_sends_ > 0) {
    if (gone_ == workers_) {
      // Every worker is done; only replies to workers that left mid-step could still be queued.
      if (flush_deadline == Clock::time_point{}) flush_deadline = Clock::now() + peer_timeout_;
      if (Clock::now() > flush_deadline) break;
    }
    completions_.clear();
    Status s = d.Poll(&completions_, kPollSlice);
    if (s.code() != StatusCode::kDeadlineExceeded) {
      KOLO_RETURN_IF_ERROR(s);
      for (const transport::Completion& c : completions_) KOLO_RETURN_IF_ERROR(OnCompletion(c));
    }
    bytes_sent_ = static_cast<int64_t>(d.bytes_sent());
    bytes_received_ = static_cast<int64_t>(d.bytes_received());
    if (Clock::now() - last_stall_check_ >= kStallCheckEvery) KOLO_RETURN_IF_ERROR(CheckStalls());
    if (!registered_) KOLO_RETURN_IF_ERROR(CheckRegistration());
  }
  return Status::OK();
}

Status Server::PostHeaderRecv(int worker) {
  Peer& p = peers_[static_cast<size_t>(worker)];
  KOLO_RETURN_IF_ERROR(job_.device->pair(p.rank).Recv(*rx_headers_region_,
                                                      static_cast<size_t>(worker) * sizeof(Header),
                                                      sizeof(Header), kHeaderTag));
  p.recvs.push_back(RecvSlot{Slot::kHeader, -1, 0, sizeof(Header), 0});
  return Status::OK();
}

Status Server::PostChunks(int worker) {
  Peer& p = peers_[static_cast<size_t>(worker)];
  ShardState& s = shards_[static_cast<size_t>(p.push_shard)];
  // Chunks of chunk_bytes_ / 4 elements in the push dtype (half the bytes when compressed).
  const size_t chunk_elems = chunk_bytes_ / kElem;
  const size_t push_elem = DataTypeSize(registration_.push_dtype);
  while (p.chunks_outstanding < 2 && p.chunks_posted < p.chunks_total) {
    const size_t k = p.chunks_posted;
    const size_t len = std::min(chunk_elems, s.count - k * chunk_elems) * push_elem;
    const size_t slot = k % 2;
    KOLO_RETURN_IF_ERROR(job_.device->pair(p.rank).Recv(
        *staging_region_, (static_cast<size_t>(worker) * 2 + slot) * chunk_bytes_, len,
        PayloadTag(Kind::kPush, static_cast<uint32_t>(s.id))));
    p.recvs.push_back(RecvSlot{Slot::kChunk, p.push_shard, k, len, slot});
    ++p.chunks_posted;
    ++p.chunks_outstanding;
    // The worker's next header follows its last chunk on the stream.
    if (p.chunks_posted == p.chunks_total) KOLO_RETURN_IF_ERROR(PostHeaderRecv(worker));
  }
  return Status::OK();
}

Status Server::OnCompletion(const transport::Completion& c) {
  const size_t peer = static_cast<size_t>(c.peer);
  if (peer >= job_.roles.role.size() || job_.roles.role[peer] != Role::kWorker) {
    return Internal("completion from rank {}, which is not a worker", c.peer);
  }
  if (c.kind == transport::OpKind::kSend) {
    --pending_sends_;
    return Status::OK();
  }
  const int w = job_.roles.index[peer];
  Peer& p = peers_[static_cast<size_t>(w)];
  if (p.recvs.empty())
    return Internal("receive completion from rank {} with nothing posted", c.peer);
  const RecvSlot slot = p.recvs.front();
  p.recvs.pop_front();
  if (c.nbytes != slot.bytes) {
    return ProtocolError("{} sent {} bytes where {} were due", Who(w), c.nbytes, slot.bytes);
  }
  switch (slot.kind) {
    case Slot::kHeader:
      return OnHeader(w);
    case Slot::kRegistration:
      p.registered = true;
      if (++registrations_ == workers_) return FinishRegistration();
      return Status::OK();
    case Slot::kInit:
      shards_[static_cast<size_t>(slot.shard)].initialized = true;
      return Status::OK();
    case Slot::kChunk: {
      ShardState& s = shards_[static_cast<size_t>(slot.shard)];
      const float* src =
          staging_.data() + (static_cast<size_t>(w) * 2 + slot.staging) * (chunk_bytes_ / kElem);
      const DataType push = registration_.push_dtype;
      const size_t elems = slot.bytes / DataTypeSize(push);
      if (push != DataType::kFloat32) {  // compressed: summed in float32
        kernels::Convert(push, DataType::kFloat32, widened_.data(), src, elems, 1.0);
        src = widened_.data();
      }
      kernels::ReduceSum(DataType::kFloat32, s.sum.data() + slot.chunk * (chunk_bytes_ / kElem),
                         src, elems);
      --p.chunks_outstanding;
      if (slot.chunk + 1 == p.chunks_total) return OnPushDone(w, s);
      return PostChunks(w);
    }
  }
  return Status::OK();
}

Status Server::OnHeader(int w) {
  const Header h = rx_headers_[static_cast<size_t>(w)];
  Peer& p = peers_[static_cast<size_t>(w)];
  if (h.check != kHeaderCheck) {
    return ProtocolError("{} sent a malformed header (check {:#x})", Who(w), h.check);
  }
  switch (static_cast<Kind>(h.kind)) {
    case Kind::kRegister: {
      if (p.registration_region) return ProtocolError("{} registered twice", Who(w));
      if (h.bytes > kMaxRegistrationBytes) {
        return ProtocolError("{} sent a registration of {} bytes; at most {} are accepted", Who(w),
                             h.bytes, kMaxRegistrationBytes);
      }
      p.registration.resize(h.bytes);
      KOLO_ASSIGN_OR_RETURN(p.registration_region,
                            job_.device->Register(p.registration.data(), p.registration.size()));
      KOLO_RETURN_IF_ERROR(job_.device->pair(p.rank).Recv(
          *p.registration_region, 0, p.registration.size(), PayloadTag(Kind::kRegister, 0)));
      p.recvs.push_back(RecvSlot{Slot::kRegistration, -1, 0, p.registration.size(), 0});
      return PostHeaderRecv(w);
    }
    case Kind::kPush:
      return OnPushHeader(w, h);
    case Kind::kBye:
      return OnBye(w);
    default:
      return ProtocolError("{} sent a '{}' header, which servers do not accept", Who(w),
                           KindName(h.kind));
  }
}

Status Server::OnPushHeader(int w, const Header& h) {
  Peer& p = peers_[static_cast<size_t>(w)];
  if (!registered_) {
    return ProtocolError("{} pushed before every worker had registered its variables", Who(w));
  }
  if (h.shard >= local_.size() || local_[h.shard] < 0) {
    return ProtocolError("{} pushed shard {}, which {} does not hold", Who(w), h.shard,
                         job_.roles.Describe(job_.options.rank));
  }
  const int local = local_[h.shard];
  ShardState& s = shards_[static_cast<size_t>(local)];
  if (h.step != s.step || s.pushed[static_cast<size_t>(w)]) {
    return ProtocolError("{} pushed '{}' for update {}, but the server is at update {}{}", Who(w),
                         s.name, h.step, s.step,
                         s.pushed[static_cast<size_t>(w)] ? " and already has its push" : "");
  }
  if (h.bytes != s.count * kElem) {
    return ProtocolError("{} pushed {} bytes of '{}', which holds {} bytes here", Who(w), h.bytes,
                         s.name, s.count * kElem);
  }
  const bool init = (h.flags & kInitFlag) != 0;
  if (init != (w == 0 && s.step == 0)) {
    return ProtocolError(
        "{} pushed '{}' for update {} {} the initial value (only worker 0's first "
        "push carries it)",
        Who(w), s.name, h.step, init ? "with" : "without");
  }
  const SgdSettings sgd{h.learning_rate, h.momentum, h.weight_decay, h.grad_scale};
  if (s.announced == 0) {
    s.sgd = sgd;
    s.wait_start = Clock::now();
    s.last_warning = s.wait_start;
    if (timeline_) timeline_->Begin(s.name, "PS_SERVER_WAIT");
  } else if (!SameSettings(sgd, s.sgd)) {
    return InvalidArgument(
        "{} pushed '{}' with SGD settings ({}) other than the step's first push ({}): every "
        "worker must pass the same settings",
        Who(w), s.name, SettingsText(sgd), SettingsText(s.sgd));
  }
  for (int g = 0; g < workers_; ++g) {
    if (peers_[static_cast<size_t>(g)].gone && !s.pushed[static_cast<size_t>(g)]) {
      return FailedPrecondition("{} has shut down and will never push '{}' for update {}", Who(g),
                                s.name, s.step);
    }
  }
  s.pushed[static_cast<size_t>(w)] = true;
  ++s.announced;
  if (init) {
    KOLO_RETURN_IF_ERROR(job_.device->pair(p.rank).Recv(*s.weights_region, 0, s.count * kElem,
                                                        PayloadTag(Kind::kInit, h.shard)));
    p.recvs.push_back(RecvSlot{Slot::kInit, local, 0, s.count * kElem, 0});
  }
  p.push_shard = local;
  p.chunks_total = ChunkCount(s.count, chunk_bytes_ / kElem);
  p.chunks_posted = 0;
  p.chunks_outstanding = 0;
  if (p.chunks_total == 0) {
    KOLO_RETURN_IF_ERROR(PostHeaderRecv(w));
    return OnPushDone(w, s);
  }
  return PostChunks(w);
}

Status Server::OnBye(int w) {
  peers_[static_cast<size_t>(w)].gone = true;
  ++gone_;
  for (const ShardState& s : shards_) {
    if (s.announced > 0 && !s.pushed[static_cast<size_t>(w)]) {
      return FailedPrecondition("{} shut down while '{}' waits for its push of update {} ({})",
                                Who(w), s.name, s.step, MissingWorkers(s));
    }
  }
  return Status::OK();
}

Status Server::OnPushDone(int w, ShardState& s) {
  s.summed[static_cast<size_t>(w)] = true;
  if (++s.arrived == workers_) return Update(s);
  return Status::OK();
}

Status Server::Update(ShardState& s) {
  if (!s.initialized) {
    return Internal("'{}' has every push of update {} but no initial value", s.name, s.step);
  }
  if (timeline_) {
    timeline_->End(s.name, "PS_SERVER_WAIT");
    timeline_->Begin(s.name, "PS_UPDATE");
  }
  ApplySgd(s.weights.data(), s.momentum.data(), s.sum.data(), s.count, workers_, s.sgd);
  if (timeline_) timeline_->End(s.name, "PS_UPDATE");
  ++s.step;
  s.announced = s.arrived = 0;
  std::fill(s.pushed.begin(), s.pushed.end(), false);
  std::fill(s.summed.begin(), s.summed.end(), false);
  s.reply = Header{};
  s.reply.kind = static_cast<uint32_t>(Kind::kPull);
  s.reply.shard = static_cast<uint32_t>(s.id);
  s.reply.step = s.step;
  s.reply.bytes = s.count * kElem;
  transport::Region& reply = *reply_regions_[static_cast<size_t>(&s - shards_.data())];
  for (const Peer& p : peers_) {
    if (p.gone) continue;  // left mid-step; the others still get the update
    transport::Pair& pair = job_.device->pair(p.rank);
    KOLO_RETURN_IF_ERROR(pair.Send(reply, 0, sizeof(Header), kHeaderTag));
    KOLO_RETURN_IF_ERROR(pair.Send(*s.weights_region, 0, s.count * kElem,
                                   PayloadTag(Kind::kPull, static_cast<uint32_t>(s.id))));
    pending_sends_ += 2;
  }
  ++updates_;
  return Status::OK();
}

Status Server::FinishRegistration() {
  auto parsed = ParseRegistration(peers_[0].registration);
  if (!parsed.ok()) return parsed.status().WithContext(Who(0));
  registration_ = std::move(parsed).value();
  for (int w = 1; w < workers_; ++w) {
    if (peers_[static_cast<size_t>(w)].registration == peers_[0].registration) continue;
    auto theirs = ParseRegistration(peers_[static_cast<size_t>(w)].registration);
    if (!theirs.ok()) return theirs.status().WithContext(Who(w));
    return InvalidArgument("{} registered variables other than {}'s: {}", Who(w), Who(0),
                           DescribeDifference(registration_, *theirs));
  }
  if (registration_.servers != job_.roles.servers() || registration_.policy != job_.policy) {
    return InvalidArgument(
        "the workers registered for {} servers with placement {}; this job has "
        "{} with placement {}",
        registration_.servers, PlacementPolicyName(registration_.policy), job_.roles.servers(),
        PlacementPolicyName(job_.policy));
  }
  chunk_bytes_ = static_cast<size_t>(registration_.chunk_bytes);
  placement_ = Place(registration_.vars, registration_.servers, registration_.policy,
                     registration_.split_min_bytes);
  transport::Device& d = *job_.device;
  const auto& mine = placement_.server_shards[static_cast<size_t>(job_.index)];
  local_.assign(placement_.shards.size(), -1);
  shards_.resize(mine.size());
  reply_regions_.resize(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const Shard& sh = placement_.shards[static_cast<size_t>(mine[i])];
    ShardState& s = shards_[i];
    local_[static_cast<size_t>(mine[i])] = static_cast<int>(i);
    s.id = mine[i];
    s.name = registration_.vars[static_cast<size_t>(sh.variable)].name;
    s.count = static_cast<size_t>(sh.count);
    s.weights.assign(s.count, 0.0f);
    s.momentum.assign(s.count, 0.0f);
    s.sum.assign(s.count, 0.0f);
    s.pushed.assign(static_cast<size_t>(workers_), false);
    s.summed.assign(static_cast<size_t>(workers_), false);
    s.initialized = s.count == 0;
    KOLO_ASSIGN_OR_RETURN(s.weights_region, d.Register(s.weights.data(), s.count * kElem));
    KOLO_ASSIGN_OR_RETURN(reply_regions_[i], d.Register(&s.reply, sizeof(Header)));
  }
  staging_.assign(static_cast<size_t>(workers_) * 2 * (chunk_bytes_ / kElem), 0.0f);
  if (registration_.push_dtype != DataType::kFloat32) widened_.assign(chunk_bytes_ / kElem, 0.0f);
  KOLO_ASSIGN_OR_RETURN(staging_region_, d.Register(staging_.data(), staging_.size() * kElem));
  registered_ = true;
  registered_header_ = Header{};
  registered_header_.kind = static_cast<uint32_t>(Kind::kRegistered);
  for (const Peer& p : peers_) {
    KOLO_RETURN_IF_ERROR(d.pair(p.rank).Send(*registered_region_, 0, sizeof(Header), kHeaderTag));
    ++pending_sends_;
  }
  return Status::OK();
}

std::string Server::MissingWorkers(const ShardState& s) const {
  std::vector<int> have, partly, missing;
  for (int w = 0; w < workers_; ++w) {
    const size_t ws = static_cast<size_t>(w);
    if (s.summed[ws]) {
      have.push_back(w);
    } else {
      (s.pushed[ws] ? partly : missing).push_back(w);
    }
  }
  std::string text = fmt::format("pushed by workers [{}]", fmt::join(have, ","));
  if (!partly.empty()) text += fmt::format(", partly by workers [{}]", fmt::join(partly, ","));
  return text + fmt::format(", not yet by workers [{}]", fmt::join(missing, ","));
}

std::vector<int> Server::SilentWorkers(const std::vector<bool>& done) const {
  std::vector<int> silent;
  for (int w = 0; w < workers_; ++w) {
    if (done[static_cast<size_t>(w)] || peers_[static_cast<size_t>(w)].gone) continue;
    const double quiet = job_.device->SilentSeconds(peers_[static_cast<size_t>(w)].rank);
    if (quiet * 1000 >= static_cast<double>(peer_timeout_.count())) silent.push_back(w);
  }
  return silent;
}

std::string Server::DescribeSilent(const std::vector<int>& workers) const {
  std::string text;
  for (int w : workers) {
    text += fmt::format("{}{} has sent nothing for {:.1f} s", text.empty() ? "" : ", ", Who(w),
                        job_.device->SilentSeconds(peers_[static_cast<size_t>(w)].rank));
  }
  return text + fmt::format(" (the peer timeout is {} s): stopped, hung or unreachable",
                            job_.options.peer_timeout_s);
}

Status Server::CheckRegistration() {
  std::vector<bool> done(static_cast<size_t>(workers_));
  for (int w = 0; w < workers_; ++w)
    done[static_cast<size_t>(w)] = peers_[static_cast<size_t>(w)].registered;
  const std::vector<int> silent = SilentWorkers(done);
  if (silent.empty()) return Status::OK();
  return DeadlineExceeded("{} of {} workers registered their variables; {}", registrations_,
                          workers_, DescribeSilent(silent));
}

Status Server::CheckStalls() {
  const auto now = Clock::now();
  const auto gap = now - last_stall_check_;
  last_stall_check_ = now;
  if (gap > kPollSlice + peer_timeout_ / 4) {
    // This server was stopped or starved for that long: the workers' pushes wait unread in its
    // sockets. Its waits restart now, so that it blames no worker for its own absence.
    KOLO_LOG(kWarning, "{}: this server did not run for {:.1f} s (stopped or starved)",
             job_.roles.Describe(job_.options.rank), std::chrono::duration<double>(gap).count());
    for (ShardState& s : shards_) {
      s.wait_start += gap;
      s.last_warning += gap;
    }
    return Status::OK();
  }
  const double warn_s = job_.options.stall_warning_s;
  const double fail_s = job_.options.stall_shutdown_s;
  for (ShardState& s : shards_) {
    if (s.announced == 0) continue;
    const double waited = std::chrono::duration<double>(now - s.wait_start).count();
    if (waited * 1000 >= static_cast<double>(peer_timeout_.count())) {
      // Workers that are alive but late (a slow step) keep sending keepalives and are waited
      // for; one silent for the peer timeout has stopped, and the job fails naming it.
      const std::vector<int> silent = SilentWorkers(s.summed);
      if (!silent.empty()) {
        return DeadlineExceeded("'{}' update {} has waited {:.1f} s: {}; {}", s.name, s.step,
                                waited, MissingWorkers(s), DescribeSilent(silent));
      }
    }
    if (fail_s > 0 && waited > fail_s) {
      return DeadlineExceeded(
          "'{}' update {} stalled for {:.1f} s (KOLO_STALL_SHUTDOWN_SECONDS={}): "
          "{}",
          s.name, s.step, waited, fail_s, MissingWorkers(s));
    }
    if (warn_s > 0 && std::chrono::duration<double>(now - s.last_warning).count() > warn_s) {
      s.last_warning = now;
      KOLO_LOG(kWarning, "{}: '{}' update {} has waited {:.1f} s: {}",
               job_.roles.Describe(job_.options.rank), s.name, s.step, waited, MissingWorkers(s));
    }
  }
  return Status::OK();
}

}  // namespace kolo::backends::ps
