// Latency-bound collectives: variable-length messages for negotiation, the bit-vector allreduce of
// the response cache, and the barrier.

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>

#include "engine/collectives/collectives.h"
#include "engine/collectives/pipeline.h"
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

// A rank's place in the binomial tree rooted at `root` over relative ranks v = (rank - root)
// mod N: the parent of v clears v's lowest set bit; the children of v are v + 2^k for every 2^k
// below that bit (all 2^k for the root) while v + 2^k < N. In absolute ranks for root 0 these are
// the edges r -- r XOR 2^k of the connection plan (plan.h).
struct Tree {
  int parent = -1;
  std::vector<int> children;  // smallest subtree first
};

Tree TreeOf(const Comm& comm, int root) {
  const int n = comm.size();
  const int v = (comm.rank() - root + n) % n;
  Tree tree;
  int mask = 1;
  while (mask < n) {
    if ((v & mask) != 0) {
      tree.parent = (v - mask + root) % n;
      break;
    }
    if (v + mask < n) tree.children.push_back((v + mask + root) % n);
    mask <<= 1;
  }
  return tree;
}

// The messages of a subtree, as one: for each rank, its rank and length (8 bytes each) then its
// bytes.
void AppendRecord(std::vector<uint8_t>* out, uint64_t rank, const std::vector<uint8_t>& bytes) {
  const uint64_t header[2] = {rank, bytes.size()};
  const auto* h = reinterpret_cast<const uint8_t*>(header);
  out->insert(out->end(), h, h + sizeof header);
  out->insert(out->end(), bytes.begin(), bytes.end());
}

Status ParseRecords(const Comm& comm, int from, const std::vector<uint8_t>& blob,
                    std::vector<std::vector<uint8_t>>* all, std::vector<uint8_t>* forward) {
  size_t at = 0;
  while (at < blob.size()) {
    uint64_t header[2];
    if (blob.size() - at < sizeof header) {
      return ProtocolError("rank {}: GatherMessages: rank {} sent a truncated record", comm.rank(),
                           from);
    }
    std::memcpy(header, blob.data() + at, sizeof header);
    at += sizeof header;
    if (header[0] >= static_cast<uint64_t>(comm.size()) || header[1] > blob.size() - at) {
      return ProtocolError(
          "rank {}: GatherMessages: rank {} sent a record for rank {} of {} bytes ({} remain)",
          comm.rank(), from, header[0], header[1], blob.size() - at);
    }
    std::vector<uint8_t> bytes(blob.begin() + static_cast<std::ptrdiff_t>(at),
                               blob.begin() + static_cast<std::ptrdiff_t>(at + header[1]));
    at += header[1];
    if (forward != nullptr) {
      AppendRecord(forward, header[0], bytes);
    } else {
      (*all)[header[0]] = std::move(bytes);
    }
  }
  return Status::OK();
}

// GatherMessages beyond the direct exchange's ranks: each rank receives its children's subtrees,
// appends them to its own message and sends the lot to its parent, so that no rank receives from
// more than log2 N peers.
StatusOr<std::vector<std::vector<uint8_t>>> GatherOverTree(Comm& comm, int root,
                                                           const std::vector<uint8_t>& mine,
                                                           uint64_t length_tag,
                                                           uint64_t payload_tag,
                                                           std::vector<std::vector<uint8_t>> all) {
  const Tree tree = TreeOf(comm, root);
  std::vector<std::vector<uint8_t>> blobs(tree.children.size());
  if (!tree.children.empty()) {
    std::vector<std::vector<uint8_t>*> outs;
    for (auto& b : blobs) outs.push_back(&b);
    KOLO_RETURN_IF_ERROR(
        ReceiveMessages(comm, tree.children, length_tag, payload_tag, "GatherMessages", outs));
  }
  if (tree.parent < 0) {
    all[static_cast<size_t>(comm.rank())] = mine;
    for (size_t i = 0; i < blobs.size(); ++i) {
      KOLO_RETURN_IF_ERROR(ParseRecords(comm, tree.children[i], blobs[i], &all, nullptr));
    }
    return all;
  }
  std::vector<uint8_t> up;
  AppendRecord(&up, static_cast<uint64_t>(comm.rank()), mine);
  for (size_t i = 0; i < blobs.size(); ++i) {
    KOLO_RETURN_IF_ERROR(ParseRecords(comm, tree.children[i], blobs[i], nullptr, &up));
  }
  KOLO_ASSIGN_OR_RETURN(Staging st, PostMessage(comm, {tree.parent}, up, length_tag, payload_tag));
  KOLO_RETURN_IF_ERROR(Await(comm, 2, "GatherMessages"));
  return all;
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
  if (n > comm.bitwise_direct_max_ranks) {
    return GatherOverTree(comm, root, mine, length_tag, payload_tag, std::move(all));
  }
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
  if (n > comm.bitwise_direct_max_ranks) {
    // Binomial tree: from the parent, then to each child, the largest subtree first.
    const Tree tree = TreeOf(comm, root);
    std::vector<uint8_t> received = message;
    if (tree.parent >= 0) {
      KOLO_RETURN_IF_ERROR(ReceiveMessages(comm, {tree.parent}, length_tag, payload_tag,
                                           "BroadcastMessage", {&received}));
    }
    if (!tree.children.empty()) {
      std::vector<int> children(tree.children.rbegin(), tree.children.rend());
      KOLO_ASSIGN_OR_RETURN(Staging st,
                            PostMessage(comm, children, received, length_tag, payload_tag));
      KOLO_RETURN_IF_ERROR(Await(comm, 2 * children.size(), "BroadcastMessage"));
    }
    return received;
  }
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
  if (n > comm.bitwise_direct_max_ranks) {
    // Recursive doubling on empty messages, over the connection plan's r XOR 2^k edges: ranks
    // beyond the largest power of two p report to rank - p first and are released at the end.
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const int rank = comm.rank();
    const uint64_t fold_tag = CollectiveTag(OpCode::kBarrier, sequence, 0);
    const uint64_t unfold_tag = CollectiveTag(OpCode::kBarrier, sequence, 1);
    if (rank >= p) {
      KOLO_RETURN_IF_ERROR(comm.device->pair(rank - p).Send(*region, 0, 0, fold_tag));
      KOLO_RETURN_IF_ERROR(comm.device->pair(rank - p).Recv(*region, 0, 0, unfold_tag));
      return Await(comm, 2, "barrier", 0);
    }
    if (rank + p < n) {
      KOLO_RETURN_IF_ERROR(comm.device->pair(rank + p).Recv(*region, 0, 0, fold_tag));
      KOLO_RETURN_IF_ERROR(Await(comm, 1, "barrier", 0));
    }
    uint32_t index = 2;
    for (int mask = 1; mask < p; mask <<= 1, ++index) {
      const uint64_t tag = CollectiveTag(OpCode::kBarrier, sequence, index);
      KOLO_RETURN_IF_ERROR(comm.device->pair(rank ^ mask).Send(*region, 0, 0, tag));
      KOLO_RETURN_IF_ERROR(comm.device->pair(rank ^ mask).Recv(*region, 0, 0, tag));
      KOLO_RETURN_IF_ERROR(Await(comm, 2, "barrier", 0));
    }
    if (rank + p < n) {
      KOLO_RETURN_IF_ERROR(comm.device->pair(rank + p).Send(*region, 0, 0, unfold_tag));
      return Await(comm, 1, "barrier");
    }
    return Status::OK();
  }
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

Status BitwiseAllreduceRiding(Comm& comm, transport::Region& buf, size_t and_words, size_t or_words,
                              size_t payload_bytes, size_t max_payload_bytes, DataType dtype,
                              uint8_t* sum, bool* summed, Scratch& scratch) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  *summed = false;
  const int n = comm.size();
  const int rank = comm.rank();
  const size_t word_bytes = (and_words + or_words) * sizeof(uint64_t);
  // Every receive takes the most any rank may send; a message says how much it carries.
  const size_t slot = word_bytes + max_payload_bytes;
  if (payload_bytes > max_payload_bytes || buf.size() < slot) {
    return InvalidArgument(
        "bitwise allreduce: a payload of {} bytes (at most {}) after {} word bytes does not fit "
        "the {}-byte buffer",
        payload_bytes, max_payload_bytes, word_bytes, buf.size());
  }
  const size_t elem = DataTypeSize(dtype);
  if (payload_bytes % elem != 0) {
    return InvalidArgument("bitwise allreduce: a payload of {} bytes is not whole {} elements",
                           payload_bytes, DataTypeName(dtype));
  }
  const uint32_t sequence = comm.sequence++;
  uint8_t* mine = buf.data() + word_bytes;
  if (n == 1 || word_bytes == 0) {
    if (n == 1 && payload_bytes > 0) {
      std::memcpy(sum, mine, payload_bytes);
      *summed = true;
    }
    return Status::OK();
  }
  if (BitExchangeThroughHostArea(comm, slot)) {
    return HostAreaBitwiseAllreduce(comm, buf, and_words, or_words, payload_bytes, dtype, sum,
                                    summed);
  }
  // Posting may already fail (a peer's message of the wrong size is waiting): name the call.
  auto posted = [&](Status st) {
    return st.ok() ? st : st.WithContext(fmt::format("rank {}: bitwise allreduce", rank));
  };
  auto* words = reinterpret_cast<uint64_t*>(buf.data());
  auto combine = [&](const uint8_t* theirs_bytes) {
    const auto* theirs = reinterpret_cast<const uint64_t*>(theirs_bytes);
    kernels::BitAnd(words, theirs, and_words);
    kernels::BitOr(words + and_words, theirs + and_words, or_words);
  };
  // Waits for `count` completions; every receive tagged `tag` must carry the words, and
  // `carried` is called with the payload bytes each brought.
  std::vector<Completion> done;
  auto await = [&](size_t count, uint64_t tag, const char* what,
                   const std::function<void(size_t)>& carried) -> Status {
    done.clear();
    Status st = transport::WaitFor(*comm.device, count, &done, comm.timeout);
    if (!st.ok()) return st.WithContext(fmt::format("rank {}: {}", rank, what));
    for (const Completion& c : done) {
      if (c.kind != transport::OpKind::kRecv || c.tag != tag) continue;
      if (c.nbytes < word_bytes) {
        return ProtocolError("rank {}: {}: rank {} sent {} bytes, expected at least {}", rank, what,
                             c.peer, c.nbytes, word_bytes);
      }
      carried(c.nbytes - word_bytes);
    }
    return Status::OK();
  };
  if (n <= comm.bitwise_direct_max_ranks) {
    // Direct exchange: receives from every peer posted, then this rank's message sent to each. A
    // rank idling in WaitForArrival is woken by the first peer to enter. The sends read buf, so
    // everything completes before combining.
    const size_t peers = static_cast<size_t>(n - 1);
    KOLO_ASSIGN_OR_RETURN(Region * incoming, scratch.Get(*comm.device, slot * peers));
    const uint64_t tag = CollectiveTag(OpCode::kBitwise, sequence, 0);
    for (int k = 1; k < n; ++k) {
      KOLO_RETURN_IF_ERROR(
          posted(comm.device->pair((rank + k) % n)
                     .Recv(*incoming, static_cast<size_t>(k - 1) * slot, slot, tag)));
    }
    for (int k = 1; k < n; ++k) {
      KOLO_RETURN_IF_ERROR(
          posted(comm.device->pair((rank + k) % n).Send(buf, 0, word_bytes + payload_bytes, tag)));
    }
    bool all_carried = payload_bytes > 0;
    KOLO_RETURN_IF_ERROR(await(2 * peers, tag, "bitwise allreduce", [&](size_t carried) {
      if (carried != payload_bytes) all_carried = false;
    }));
    for (size_t k = 0; k < peers; ++k) combine(incoming->data() + k * slot);
    if (!all_carried) return Status::OK();
    // Summed in rank order on every rank, so that every rank ends with the same bits.
    auto from = [&](int r) -> const uint8_t* {
      if (r == rank) return mine;
      const size_t k = static_cast<size_t>((r - rank + n) % n);
      return incoming->data() + (k - 1) * slot + word_bytes;
    };
    std::memcpy(sum, from(0), payload_bytes);
    for (int r = 1; r < n; ++r) kernels::ReduceSum(dtype, sum, from(r), payload_bytes / elem);
    *summed = true;
    return Status::OK();
  }
  KOLO_ASSIGN_OR_RETURN(Region * incoming, scratch.Get(*comm.device, slot));
  // Recursive doubling: log2(p) rounds in which partners swap and combine at once, half the
  // sequential hops of a tree, because this exchange runs every cycle. Ranks beyond the largest
  // power of two p fold their bits into rank - p first and get the result back at the end.
  //
  // A payload is summed into buf as the words are combined: partners add the same two partial
  // sums (a + b on one, b + a on the other), so every rank ends with the same bits. A rank sends
  // its payload while it is still whole: one that received a message without as many payload
  // bytes as its own sends none after, and so the lack reaches every rank, as every rank's words
  // do; a rank's sum is the result only where every message it received carried a payload.
  int p = 1;
  while (p * 2 <= n) p *= 2;
  bool whole = payload_bytes > 0;
  size_t carried = 0;
  auto take = [&](size_t c) { carried = c; };
  // After a receive into `incoming`: its words combined, its payload added where both are whole.
  auto add = [&] {
    combine(incoming->data());
    if (whole && carried == payload_bytes) {
      kernels::ReduceSum(dtype, mine, incoming->data() + word_bytes, payload_bytes / elem);
    } else {
      whole = false;
    }
  };
  auto sending = [&] { return word_bytes + (whole ? payload_bytes : 0); };
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
    KOLO_RETURN_IF_ERROR(posted(pair.Send(buf, 0, sending(), fold_tag)));
    // The unfold only arrives after the fold was read, so buf is not overwritten early. The kick
    // is empty (a longer message fails the receive).
    KOLO_RETURN_IF_ERROR(posted(pair.Recv(buf, 0, slot, unfold_tag)));
    KOLO_RETURN_IF_ERROR(await(3, unfold_tag, "bitwise allreduce (fold)", take));
    if (whole && carried == payload_bytes) {
      std::memcpy(sum, mine, payload_bytes);
      *summed = true;
    }
    return Status::OK();
  }
  if (rank + p < n) {
    transport::Pair& pair = comm.device->pair(rank + p);
    KOLO_RETURN_IF_ERROR(posted(pair.Send(buf, 0, 0, kick_tag)));
    KOLO_RETURN_IF_ERROR(posted(pair.Recv(*incoming, 0, slot, fold_tag)));
    KOLO_RETURN_IF_ERROR(await(2, fold_tag, "bitwise allreduce (fold)", take));
    add();
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = rank ^ mask;
    const uint64_t tag = CollectiveTag(OpCode::kBitwise, sequence, 2 + static_cast<uint32_t>(mask));
    KOLO_RETURN_IF_ERROR(posted(comm.device->pair(partner).Recv(*incoming, 0, slot, tag)));
    KOLO_RETURN_IF_ERROR(posted(comm.device->pair(partner).Send(buf, 0, sending(), tag)));
    // Both must finish before combining: the send reads buf.
    KOLO_RETURN_IF_ERROR(await(2, tag, "bitwise allreduce", take));
    add();
  }
  if (rank + p < n) {
    KOLO_RETURN_IF_ERROR(posted(comm.device->pair(rank + p).Send(buf, 0, sending(), unfold_tag)));
    KOLO_RETURN_IF_ERROR(await(1, unfold_tag, "bitwise allreduce (unfold)", take));
  }
  if (whole) {
    std::memcpy(sum, mine, payload_bytes);
    *summed = true;
  }
  return Status::OK();
}

Status BitwiseAllreduce(Comm& comm, transport::Region& buf, size_t and_words, size_t or_words,
                        Scratch& scratch) {
  KOLO_RETURN_IF_ERROR(CheckComm(comm));
  const size_t bytes = (and_words + or_words) * sizeof(uint64_t);
  if (buf.size() < bytes) {
    return InvalidArgument("BitwiseAllreduce: {} + {} words need {} bytes; the buffer has {}",
                           and_words, or_words, bytes, buf.size());
  }
  // The riding exchange without a payload.
  bool unused = false;
  return BitwiseAllreduceRiding(comm, buf, and_words, or_words, 0, 0, DataType::kUInt8, nullptr,
                                &unused, scratch);
}

}  // namespace kolo::collectives
