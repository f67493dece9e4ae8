// Latency-bound collectives: variable-length messages for negotiation, the bit-vector allreduce of
// the response cache, and the barrier.

#include <algorithm>
#include <cstring>
#include <memory>

#include "engine/collectives/collectives.h"
#include "engine/collectives/tags.h"
#include "engine/kernels/reduce.h"

namespace kolo::collectives {
namespace {

using transport::Completion;
using transport::Region;

// A length larger than this is taken as a corrupted or mismatched stream, not as an allocation
// to attempt.
constexpr uint64_t kMaxMessageBytes = uint64_t{1} << 31;

Status CheckComm(const Comm& comm) {
  if (comm.device == nullptr) return InvalidArgument("collective called with a null device");
  return Status::OK();
}

Status CheckPeer(const Comm& comm, int peer, const char* what) {
  if (peer < 0 || peer >= comm.size() || peer == comm.rank()) {
    return InvalidArgument("{}: rank {} is not a peer of rank {} (size {})", what, peer,
                           comm.rank(), comm.size());
  }
  return Status::OK();
}

// Waits for `n` completions and checks the received sizes against `expected_recv_bytes` (by
// completion order within each peer is not needed: every receive here expects the same size).
Status Await(Comm& comm, size_t n, const char* what, size_t expected_recv_bytes = SIZE_MAX) {
  std::vector<Completion> done;
  done.reserve(n);
  Status s = transport::WaitFor(*comm.device, n, &done, comm.timeout);
  if (!s.ok()) return s.WithContext(fmt::format("rank {}: {}", comm.rank(), what));
  for (const Completion& c : done) {
    if (c.kind == transport::OpKind::kRecv && expected_recv_bytes != SIZE_MAX &&
        c.nbytes != expected_recv_bytes) {
      return ProtocolError("rank {}: {}: rank {} sent {} bytes, expected {}", comm.rank(), what,
                           c.peer, c.nbytes, expected_recv_bytes);
    }
  }
  return Status::OK();
}

// Registered bytes for one message exchange: the comm's reused staging, or a registration of its
// own when the comm has none. A later Get on the same comm may move the shared staging.
class Staging {
 public:
  static StatusOr<Staging> Get(Comm& comm, size_t bytes) {
    Staging st;
    if (comm.messages != nullptr) {
      KOLO_ASSIGN_OR_RETURN(st.region_, comm.messages->Get(*comm.device, bytes));
      return st;
    }
    st.own_.resize(std::max<size_t>(bytes, 1));
    KOLO_ASSIGN_OR_RETURN(st.own_region_, comm.device->Register(st.own_.data(), st.own_.size()));
    st.region_ = st.own_region_.get();
    return st;
  }
  Region& region() { return *region_; }
  uint8_t* data() { return region_->data(); }

 private:
  std::vector<uint8_t> own_;
  std::unique_ptr<Region> own_region_;
  Region* region_ = nullptr;
};

// Stages `payload` behind its length and posts both to each of `peers` (not waited for).
StatusOr<Staging> PostMessage(Comm& comm, const std::vector<int>& peers,
                              const std::vector<uint8_t>& payload, uint64_t length_tag,
                              uint64_t payload_tag) {
  const uint64_t length = payload.size();
  KOLO_ASSIGN_OR_RETURN(Staging st, Staging::Get(comm, sizeof length + payload.size()));
  std::memcpy(st.data(), &length, sizeof length);
  if (!payload.empty()) std::memcpy(st.data() + sizeof length, payload.data(), payload.size());
  for (int peer : peers) {
    transport::Pair& pair = comm.device->pair(peer);
    KOLO_RETURN_IF_ERROR(pair.Send(st.region(), 0, sizeof length, length_tag));
    KOLO_RETURN_IF_ERROR(pair.Send(st.region(), sizeof length, payload.size(), payload_tag));
  }
  return st;
}

// Receives one length-prefixed message from each of `peers` (lengths first, then payloads).
Status ReceiveMessages(Comm& comm, const std::vector<int>& peers, uint64_t length_tag,
                       uint64_t payload_tag, const char* what,
                       std::vector<std::vector<uint8_t>*> outs) {
  std::vector<uint64_t> lengths(peers.size(), 0);
  {
    KOLO_ASSIGN_OR_RETURN(Staging st, Staging::Get(comm, lengths.size() * sizeof(uint64_t)));
    for (size_t i = 0; i < peers.size(); ++i) {
      KOLO_RETURN_IF_ERROR(comm.device->pair(peers[i]).Recv(st.region(), i * sizeof(uint64_t),
                                                            sizeof(uint64_t), length_tag));
    }
    KOLO_RETURN_IF_ERROR(Await(comm, peers.size(), what, sizeof(uint64_t)));
    std::memcpy(lengths.data(), st.data(), lengths.size() * sizeof(uint64_t));
  }
  std::vector<size_t> offsets(peers.size() + 1, 0);
  for (size_t i = 0; i < peers.size(); ++i) {
    if (lengths[i] > kMaxMessageBytes) {
      return ProtocolError("rank {}: {}: rank {} announced a {}-byte message (at most {})",
                           comm.rank(), what, peers[i], lengths[i], kMaxMessageBytes);
    }
    offsets[i + 1] = offsets[i] + lengths[i];
  }
  KOLO_ASSIGN_OR_RETURN(Staging st, Staging::Get(comm, offsets.back()));
  for (size_t i = 0; i < peers.size(); ++i) {
    KOLO_RETURN_IF_ERROR(
        comm.device->pair(peers[i]).Recv(st.region(), offsets[i], lengths[i], payload_tag));
  }
  std::vector<Completion> done;
  Status s = transport::WaitFor(*comm.device, peers.size(), &done, comm.timeout);
  if (!s.ok()) return s.WithContext(fmt::format("rank {}: {}", comm.rank(), what));
  // Rank -> position in `peers`, so matching completions stays linear in the job size.
  std::vector<size_t> index_of(static_cast<size_t>(comm.size()), peers.size());
  for (size_t i = 0; i < peers.size(); ++i) index_of[static_cast<size_t>(peers[i])] = i;
  for (const Completion& c : done) {
    const size_t i =
        c.peer >= 0 && c.peer < comm.size() ? index_of[static_cast<size_t>(c.peer)] : peers.size();
    if (i < peers.size() && c.nbytes != lengths[i]) {
      return ProtocolError("rank {}: {}: rank {} announced {} bytes but sent {}", comm.rank(), what,
                           c.peer, lengths[i], c.nbytes);
    }
  }
  for (size_t i = 0; i < peers.size(); ++i) {
    outs[i]->assign(st.data() + offsets[i], st.data() + offsets[i + 1]);
  }
  return Status::OK();
}

}  // namespace

Status SendMessage(Comm& comm, int peer, const std::vector<uint8_t>& payload, uint64_t tag) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  KOLO_RETURN_IF_ERROR(CheckPeer(comm, peer, "SendMessage"));
  KOLO_ASSIGN_OR_RETURN(Staging st,
                        PostMessage(comm, {peer}, payload, MessageTag(OpCode::kMessageLength, tag),
                                    MessageTag(OpCode::kMessagePayload, tag)));
  return Await(comm, 2, "SendMessage");
}

StatusOr<std::vector<uint8_t>> RecvMessage(Comm& comm, int peer, uint64_t tag) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  KOLO_RETURN_IF_ERROR(CheckPeer(comm, peer, "RecvMessage"));
  std::vector<uint8_t> message;
  KOLO_RETURN_IF_ERROR(ReceiveMessages(comm, {peer}, MessageTag(OpCode::kMessageLength, tag),
                                       MessageTag(OpCode::kMessagePayload, tag), "RecvMessage",
                                       {&message}));
  return message;
}

StatusOr<std::vector<std::vector<uint8_t>>> GatherMessages(Comm& comm, int root,
                                                           const std::vector<uint8_t>& mine) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  const uint32_t sequence = comm.sequence++;
  const int n = comm.size();
  if (root < 0 || root >= n) {
    return InvalidArgument("GatherMessages: root {} is not a rank (size {})", root, n);
  }
  const uint64_t length_tag = CollectiveTag(OpCode::kGather, sequence, 0);
  const uint64_t payload_tag = CollectiveTag(OpCode::kGather, sequence, 1);
  std::vector<std::vector<uint8_t>> all(static_cast<size_t>(n));
  if (comm.rank() != root) {
    KOLO_ASSIGN_OR_RETURN(Staging st, PostMessage(comm, {root}, mine, length_tag, payload_tag));
    KOLO_RETURN_IF_ERROR(Await(comm, 2, "GatherMessages"));
    return all;
  }
  std::vector<int> peers;
  std::vector<std::vector<uint8_t>*> outs;
  for (int r = 0; r < n; ++r) {
    if (r == root) continue;
    peers.push_back(r);
    outs.push_back(&all[static_cast<size_t>(r)]);
  }
  all[static_cast<size_t>(root)] = mine;
  if (!peers.empty()) {
    KOLO_RETURN_IF_ERROR(
        ReceiveMessages(comm, peers, length_tag, payload_tag, "GatherMessages", outs));
  }
  return all;
}

StatusOr<std::vector<uint8_t>> BroadcastMessage(Comm& comm, int root,
                                                const std::vector<uint8_t>& message) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  const uint32_t sequence = comm.sequence++;
  const int n = comm.size();
  if (root < 0 || root >= n) {
    return InvalidArgument("BroadcastMessage: root {} is not a rank (size {})", root, n);
  }
  const uint64_t length_tag = CollectiveTag(OpCode::kBroadcastMessage, sequence, 0);
  const uint64_t payload_tag = CollectiveTag(OpCode::kBroadcastMessage, sequence, 1);
  if (comm.rank() == root) {
    std::vector<int> peers;
    for (int r = 0; r < n; ++r) {
      if (r != root) peers.push_back(r);
    }
    KOLO_ASSIGN_OR_RETURN(Staging st, PostMessage(comm, peers, message, length_tag, payload_tag));
    KOLO_RETURN_IF_ERROR(Await(comm, 2 * peers.size(), "BroadcastMessage"));
    return message;
  }
  std::vector<uint8_t> received;
  KOLO_RETURN_IF_ERROR(
      ReceiveMessages(comm, {root}, length_tag, payload_tag, "BroadcastMessage", {&received}));
  return received;
}

Status Barrier(Comm& comm) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  const uint32_t sequence = comm.sequence++;
  const int n = comm.size();
  KOLO_ASSIGN_OR_RETURN(Staging st, Staging::Get(comm, 1));  // empty messages: any region will do
  Region* region = &st.region();
  // Dissemination: after round k every rank has heard, directly or not, from 2^(k+1) ranks.
  uint32_t round = 0;
  for (int distance = 1; distance < n; distance *= 2, ++round) {
    const uint64_t tag = CollectiveTag(OpCode::kBarrier, sequence, round);
    KOLO_RETURN_IF_ERROR(comm.device->pair((comm.rank() + distance) % n).Send(*region, 0, 0, tag));
    KOLO_RETURN_IF_ERROR(
        comm.device->pair((comm.rank() - distance + n) % n).Recv(*region, 0, 0, tag));
    KOLO_RETURN_IF_ERROR(Await(comm, 2, "barrier", 0));
  }
  return Status::OK();
}

Status BitwiseAllreduce(Comm& comm, transport::Region& buf, size_t and_words, size_t or_words,
                        Scratch& scratch) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  const uint32_t sequence = comm.sequence++;
  const size_t bytes = (and_words + or_words) * sizeof(uint64_t);
  if (buf.size() < bytes) {
    return InvalidArgument("BitwiseAllreduce: {} + {} words need {} bytes; the buffer has {}",
                           and_words, or_words, bytes, buf.size());
  }
  const int n = comm.size();
  const int rank = comm.rank();
  if (n == 1 || bytes == 0) return Status::OK();
  auto* words = reinterpret_cast<uint64_t*>(buf.data());
  // Posting may already fail (a peer's message of the wrong size is waiting): name the call.
  auto posted = [&](Status s) {
    return s.ok() ? s : s.WithContext(fmt::format("rank {}: bitwise allreduce", rank));
  };
  auto combine = [&](const uint8_t* theirs_bytes) {
    const auto* theirs = reinterpret_cast<const uint64_t*>(theirs_bytes);
    kernels::BitAnd(words, theirs, and_words);
    kernels::BitOr(words + and_words, theirs + and_words, or_words);
  };
  if (n <= comm.bitwise_direct_max_ranks) {
    // Direct exchange: receives from every peer posted, then this rank's words sent to each. A
    // rank idling in WaitForArrival is woken by the first peer to enter. The sends read buf, so
    // everything completes before combining.
    const size_t peers = static_cast<size_t>(n - 1);
    KOLO_ASSIGN_OR_RETURN(Region * incoming, scratch.Get(*comm.device, bytes * peers));
    const uint64_t tag = CollectiveTag(OpCode::kBitwise, sequence, 0);
    for (int k = 1; k < n; ++k) {
      KOLO_RETURN_IF_ERROR(
          posted(comm.device->pair((rank + k) % n)
                     .Recv(*incoming, static_cast<size_t>(k - 1) * bytes, bytes, tag)));
    }
    for (int k = 1; k < n; ++k) {
      KOLO_RETURN_IF_ERROR(posted(comm.device->pair((rank + k) % n).Send(buf, 0, bytes, tag)));
    }
    KOLO_RETURN_IF_ERROR(Await(comm, 2 * peers, "bitwise allreduce", bytes));
    for (size_t k = 0; k < peers; ++k) combine(incoming->data() + k * bytes);
    return Status::OK();
  }
  KOLO_ASSIGN_OR_RETURN(Region * incoming, scratch.Get(*comm.device, bytes));
  // Recursive doubling: log2(p) rounds in which partners swap and combine at once, half the
  // sequential hops of a tree, because this exchange runs every cycle. Ranks beyond the largest
  // power of two p fold their bits into rank - p first and get the result back at the end.
  int p = 1;
  while (p * 2 <= n) p *= 2;
  //
  // Every rank that enters the exchange sends something to each of its partners before it waits
  // on them, so a rank idling in WaitForArrival is woken by whichever partner enters first: the
  // recursive-doubling partners swap anyway, and a folding pair starts with an empty "kick" from
  // rank - p, which would otherwise only wait for the fold.
  const uint64_t fold_tag = CollectiveTag(OpCode::kBitwise, sequence, 0);
  const uint64_t unfold_tag = CollectiveTag(OpCode::kBitwise, sequence, 1);
  const uint64_t kick_tag = CollectiveTag(OpCode::kBitwise, sequence, 2);
  if (rank >= p) {
    transport::Pair& pair = comm.device->pair(rank - p);
    KOLO_RETURN_IF_ERROR(posted(pair.Recv(*incoming, 0, 0, kick_tag)));
    KOLO_RETURN_IF_ERROR(posted(pair.Send(buf, 0, bytes, fold_tag)));
    KOLO_RETURN_IF_ERROR(posted(pair.Recv(buf, 0, bytes, unfold_tag)));
    // The unfold only arrives after the fold was read, so buf is not overwritten early. The kick
    // is empty (a longer message fails the receive), so only the unfold's size needs checking.
    std::vector<Completion> done;
    Status s = transport::WaitFor(*comm.device, 3, &done, comm.timeout);
    if (!s.ok()) return s.WithContext(fmt::format("rank {}: bitwise allreduce (fold)", rank));
    for (const Completion& c : done) {
      if (c.kind == transport::OpKind::kRecv && c.tag == unfold_tag && c.nbytes != bytes) {
        return ProtocolError(
            "rank {}: bitwise allreduce (unfold): rank {} sent {} bytes, expected {}", rank, c.peer,
            c.nbytes, bytes);
      }
    }
    return Status::OK();
  }
  if (rank + p < n) {
    transport::Pair& pair = comm.device->pair(rank + p);
    KOLO_RETURN_IF_ERROR(posted(pair.Send(buf, 0, 0, kick_tag)));
    KOLO_RETURN_IF_ERROR(posted(pair.Recv(*incoming, 0, bytes, fold_tag)));
    KOLO_RETURN_IF_ERROR(Await(comm, 2, "bitwise allreduce (fold)", bytes));
    combine(incoming->data());
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = rank ^ mask;
    const uint64_t tag = CollectiveTag(OpCode::kBitwise, sequence, 2 + static_cast<uint32_t>(mask));
    KOLO_RETURN_IF_ERROR(posted(comm.device->pair(partner).Recv(*incoming, 0, bytes, tag)));
    KOLO_RETURN_IF_ERROR(posted(comm.device->pair(partner).Send(buf, 0, bytes, tag)));
    // Both must finish before combining: the send reads buf.
    KOLO_RETURN_IF_ERROR(Await(comm, 2, "bitwise allreduce", bytes));
    combine(incoming->data());
  }
  if (rank + p < n) {
    KOLO_RETURN_IF_ERROR(posted(comm.device->pair(rank + p).Send(buf, 0, bytes, unfold_tag)));
    return Await(comm, 1, "bitwise allreduce (unfold)");
  }
  return Status::OK();
}

}  // namespace kolo::collectives
