// Collective algorithms written once against the transport interface (engine/transport).
//
// Every function is called by all ranks of the communicator with matching arguments, from the one
// thread that drives the Device. Buffers are registered Regions; offsets and counts are in
// elements of `dtype` unless named *_bytes. Every wait is bounded by comm.timeout; a peer failure
// returns the Device's error (naming the peer). On error the buffer contents are unspecified.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/status.h"
#include "engine/transport/transport.h"

namespace kolo::bootstrap {
class Store;
}  // namespace kolo::bootstrap
namespace kolo::transport::shm {
class HostArea;
}  // namespace kolo::transport::shm

namespace kolo::collectives {

// Named phases a collective reports, for the timeline.
enum class Phase {
  kReduceScatter,
  kAllgather,
  kBroadcast,
  kSendRecv,
  kHierarchical,
  kRecursiveDoubling,
  kOneShot
};
// "REDUCE_SCATTER", "ALLGATHER", "BROADCAST", "SEND_RECV", "HIERARCHICAL_ALLREDUCE",
// "RECURSIVE_DOUBLING", "ONE_SHOT"
const char* PhaseName(Phase phase);

// Scratch space the collectives receive into before reducing. Grows on demand (then reused), and
// registers itself with the device. Not thread-safe; one per Comm.
class Scratch {
 public:
  // Returns a registered region of at least `bytes`.
  StatusOr<transport::Region*> Get(transport::Device& device, size_t bytes);

 private:
  std::vector<uint8_t> storage_;
  std::unique_ptr<transport::Region> region_;
};

struct Comm {
  transport::Device* device = nullptr;
  // Pipeline chunk: a ring segment larger than this moves in pieces of about this size, so that
  // sending, receiving and reducing overlap.
  size_t chunk_bytes = 512 << 10;
  std::chrono::milliseconds timeout{30000};
  // Called with (phase, true) when a phase starts and (phase, false) when it ends; may be empty.
  std::function<void(Phase, bool)> on_phase;
  // Collective calls made so far; every collective increments it and carries it in its message
  // tags, so that ranks calling collectives in different orders fail with a protocol error instead
  // of exchanging the wrong bytes. Must be equal on every rank (start all at 0).
  uint32_t sequence = 0;
  // Sum reduce-scatter pieces into the buffer as their bytes arrive, where the transport can
  // (Pair::CanAccumulate); false: receive each piece whole into scratch and sum it from there,
  // as on a transport that cannot (kept selectable so that path stays tested and comparable).
  bool accumulate_on_arrival = true;
  // Registered staging for the variable-length messages of negotiation, reused from call to
  // call (registration is costly on RDMA). Null: each message registers a buffer of its own.
  Scratch* messages = nullptr;
  // Up to this many ranks BitwiseAllreduce is a direct exchange (one hop); beyond, recursive
  // doubling. Must be equal on every rank.
  int bitwise_direct_max_ranks = 16;
  // Hierarchical allreduce cuts its buffer into chunks of about this many bytes (at most
  // kMaxHierarchicalChunks), so that the rings within and across hosts overlap. Must be equal on
  // every rank.
  size_t hierarchical_chunk_bytes = 4 << 20;
  static constexpr size_t kMaxHierarchicalChunks = 64;

  // The host-wide shared-memory area of a job whose ranks all share one host over shared memory
  // (transport/shm/host_area.h), for OneShotAllreduce; null elsewhere. Set on every rank or on
  // none (AllRanksTrue agrees on it).
  transport::shm::HostArea* host_area = nullptr;

  int rank() const { return device->rank(); }
  int size() const { return device->size(); }
};

// A piece of a virtual buffer: bytes [offset, offset + nbytes) of a registered region. A list of
// extents is read as their concatenation; every extent holds a whole number of elements.
struct Extent {
  transport::Region* region = nullptr;
  size_t offset = 0;
  size_t nbytes = 0;
};

// Bandwidth-optimal ring allreduce, sum, in place on buf[offset, offset + count): reduce-scatter
// then allgather, each segment moved in chunk_bytes pieces so that send, receive and reduce of
// consecutive pieces overlap. Every rank ends with the elementwise sum over all ranks. Each rank
// sends and receives 2 (N-1)/N of the buffer.
Status RingAllreduce(Comm& comm, transport::Region& buf, size_t offset_bytes, size_t count,
                     DataType dtype, Scratch& scratch);

// The same, in place on the concatenation of `extents` (zero-copy Tensor Fusion: each tensor of a
// fused group reduced where it lives, in one ring pass). Pieces never straddle two extents, so a
// small extent costs a message of its own.
Status RingAllreduce(Comm& comm, const std::vector<Extent>& extents, DataType dtype,
                     Scratch& scratch);

// Latency-optimal allreduce (sum, in place) by recursive doubling: log2 p rounds (p the largest
// power of two <= N) in which partners r and r XOR 2^k swap their whole buffers and add, plus a
// fold before and after for the N - p ranks beyond p (rank p + i hands its buffer to rank i and
// gets the result back). Each rank sends log2 p whole buffers: the fewest steps, for buffers
// small enough that each step's latency outweighs its bytes. Any rank count; every rank ends with
// the same bits.
Status RecursiveDoublingAllreduce(Comm& comm, transport::Region& buf, size_t offset_bytes,
                                  size_t count, DataType dtype, Scratch& scratch);
// The same on the concatenation of `extents`, staged through scratch (copied in and out).
Status RecursiveDoublingAllreduce(Comm& comm, const std::vector<Extent>& extents, DataType dtype,
                                  Scratch& scratch);

// The same over the ranks of `group` only (this rank among them; every member passes the same
// list, in the same order): the cross-host step of hierarchical allreduce for small buffers.
Status RecursiveDoublingAllreduce(Comm& comm, const std::vector<int>& group, transport::Region& buf,
                                  size_t offset_bytes, size_t count, DataType dtype,
                                  Scratch& scratch);
Status RecursiveDoublingAllreduce(Comm& comm, const std::vector<int>& group,
                                  const std::vector<Extent>& extents, DataType dtype,
                                  Scratch& scratch);

// Allreduce (sum, in place) by recursive halving then doubling (Rabenseifner): a reduce-scatter
// in log2 p steps that each halve the blocks a rank holds (sending the other half to r XOR 2^k),
// then an allgather in log2 p steps that each double them; the same fold as recursive doubling
// for a rank count that is not a power of two. Each rank sends 2 (p-1)/p of the buffer, as the
// ring does, in 2 log2 p steps instead of 2 (N-1): for medium buffers.
Status HalvingDoublingAllreduce(Comm& comm, transport::Region& buf, size_t offset_bytes,
                                size_t count, DataType dtype, Scratch& scratch);
Status HalvingDoublingAllreduce(Comm& comm, const std::vector<Extent>& extents, DataType dtype,
                                Scratch& scratch);

// Allreduce (sum, in place) in one step through comm.host_area: every rank copies its buffer into
// its slot of the area, then sums every slot in rank order (the same bits on every rank). A buffer
// larger than a slot goes in slot-sized pieces. No message crosses the transport: for ranks of one
// host, small buffers, where each step of the other algorithms costs a message and a wake-up.
// FailedPrecondition without a host area.
Status OneShotAllreduce(Comm& comm, transport::Region& buf, size_t offset_bytes, size_t count,
                        DataType dtype);
Status OneShotAllreduce(Comm& comm, const std::vector<Extent>& extents, DataType dtype);

// Collective: makes the host-wide shared-memory area of a communicator whose ranks all share one
// host (transport/shm/host_area.h; rank 0 announces it in `store` under `key`, `secret` labels
// it) and agrees (AllRanksTrue) that every rank mapped it. Null on every rank when some rank
// could not, each such rank logging why (a warning: the one-shot algorithm is then unavailable,
// the others run). `spin`: how long its waits spin before they sleep. Set comm.host_area from it.
StatusOr<std::unique_ptr<transport::shm::HostArea>> AttachHostArea(
    Comm& comm, bootstrap::Store& store, const std::string& key, const std::string& secret,
    std::chrono::microseconds spin, Scratch& scratch);
// The same for the ranks of one host of several (`local`: this host's ranks, in order; `key`
// names this host's area): every host's ranks map their own area, and every rank of the job
// agrees that every rank did (null everywhere otherwise). For HostGroups::area.
StatusOr<std::unique_ptr<transport::shm::HostArea>> AttachHostArea(
    Comm& comm, const std::vector<int>& local, bootstrap::Store& store, const std::string& key,
    const std::string& secret, std::chrono::microseconds spin, Scratch& scratch);

// The bit exchange through the host area. Where comm.host_area holds every rank of the
// communicator and an exchange's words and payload fit one bank of a slot, BitwiseAllreduceRiding
// (and so BitwiseAllreduce) takes one step through the area instead of messages: each rank writes
// its words and payload into its slot, and once every rank has, combines every slot (AND, OR, the
// payload summed in rank order, as the direct exchange does). The decision is the same on every
// rank (it depends only on the communicator and the word and payload bounds).
bool BitExchangeThroughHostArea(const Comm& comm, size_t max_bytes);

// A rank whose negotiation goes through the host area waits there for its peers instead of in
// the transport: no message would wake it when a peer enters an exchange. Its engine thread, with
// nothing to exchange, reads its doorbell (HostDoorbell) before it looks for work, then waits in
// AwaitHostDoorbell until `until`, until the doorbell moves from `rung` (RingHostDoorbell: a
// submission on this rank, or its shutdown), or until a peer enters an exchange this rank has not
// (*peer_ahead); it looks at the device every few milliseconds (lost peers, keepalives; a message
// that arrived sets *peer_ahead too). REQUIRES: comm.host_area.
uint32_t HostDoorbell(const transport::shm::HostArea& area);
Status AwaitHostDoorbell(Comm& comm, uint32_t rung, std::chrono::steady_clock::time_point until,
                         bool* peer_ahead);
// Wakes this rank's AwaitHostDoorbell (any thread; a no-op without a host area).
void RingHostDoorbell(transport::shm::HostArea* area);

// Whether `mine` is true on every rank (a BitwiseAllreduce of one AND word): how ranks agree on
// something each found out alone, such as whether it could map the host area.
StatusOr<bool> AllRanksTrue(Comm& comm, bool mine, Scratch& scratch);

// The ranks a hierarchical allreduce groups this rank with: `local`, the ranks on its host, and
// `cross`, the rank at the same position on every host, one per host in host order. Both list
// this rank, every rank of the job lies in exactly one local group, and every host has the same
// number of ranks (local.size() * cross.size() == comm.size()). All ranks of a host must pass the
// same `local`, all ranks of a cross group the same `cross`.
struct HostGroups {
  std::vector<int> local;
  std::vector<int> cross;
  // The host-wide shared-memory area of this rank's host, where the ranks of every host mapped
  // one (HierarchicalSmallAllreduce); null elsewhere.
  transport::shm::HostArea* area = nullptr;
};

// Scratch for the two rings of a hierarchical allreduce that run at once.
struct HierarchicalScratch {
  Scratch local;
  Scratch cross;
};

// Allreduce (sum, in place on buf[offset, offset + count)) in three rings: a reduce-scatter among
// the ranks of each host leaves local position i holding slice i + 1 (mod ranks per host) summed
// over its host; each slice is then allreduced across hosts by the ranks holding it (one ring per
// local position, all at once); an allgather among the ranks of each host spreads the slices.
// The buffer goes in chunks of about comm.hierarchical_chunk_bytes: while one chunk crosses hosts,
// the next is reduced within the host and the one before spread, so that the rings within the host
// hide behind the ring across hosts.
// Each rank sends 2 (R-1)/R of the buffer within its host and 2 (H-1)/(H R) of it across hosts
// (R ranks per host, H hosts), against 2 (N-1)/N over the flat ring's links, most of them
// between hosts: when links between hosts are the bottleneck, about R times fewer bytes cross
// them per rank. The result equals RingAllreduce's up to the order of the additions.
Status HierarchicalAllreduce(Comm& comm, const HostGroups& groups, transport::Region& buf,
                             size_t offset_bytes, size_t count, DataType dtype,
                             HierarchicalScratch& scratch);

// The same, in place on the concatenation of `extents` (zero-copy Tensor Fusion).
Status HierarchicalAllreduce(Comm& comm, const HostGroups& groups,
                             const std::vector<Extent>& extents, DataType dtype,
                             HierarchicalScratch& scratch);

// Hierarchical allreduce for small buffers (sum, in place): one step through the host's area
// (groups.area: every rank of the host ends with the host's sum, as OneShotAllreduce within the
// host), then recursive doubling across hosts among the ranks at the same position (groups.cross),
// every position at once, so that no rank needs a result from another of its host: log2 H steps
// over the network, H hosts, where the flat algorithms take log2 N. Every rank ends with the same
// bits. FailedPrecondition without an area.
Status HierarchicalSmallAllreduce(Comm& comm, const HostGroups& groups, transport::Region& buf,
                                  size_t offset_bytes, size_t count, DataType dtype,
                                  Scratch& scratch);
Status HierarchicalSmallAllreduce(Comm& comm, const HostGroups& groups,
                                  const std::vector<Extent>& extents, DataType dtype,
                                  Scratch& scratch);

// Moves exactly the bytes RingAllreduce moves, along the same ring and in the same order, with no
// reduction: every piece received is written into the buffer where it belongs (the
// reduce-scatter's over the data there), as a send/receive test writes into its receive buffer.
// The link ceiling the allreduce's bus bandwidth is read against; the buffer's contents after it
// are meaningless.
Status RingExchangeNoReduce(Comm& comm, transport::Region& buf, size_t offset_bytes, size_t count,
                            DataType dtype);

// Broadcast buf[offset, offset + nbytes) from `root` to every rank: pipelined along the ring.
Status RingBroadcast(Comm& comm, transport::Region& buf, size_t offset_bytes, size_t nbytes,
                     int root);

// Allgather with per-rank sizes: rank r's block is buf[displ[r], displ[r] + bytes[r]) where displ
// is the prefix sum of `bytes_per_rank`. Each rank fills its own block before the call; after it
// every block holds its owner's bytes. Ring algorithm.
Status RingAllgatherv(Comm& comm, transport::Region& buf, size_t offset_bytes,
                      const std::vector<size_t>& bytes_per_rank);

// Small allreduce for coordination: `and_words` words combined with AND followed by `or_words`
// words combined with OR, in place on buf (registered, at least (and_words + or_words) * 8 bytes).
// Latency-optimised: up to comm.bitwise_direct_max_ranks ranks, every rank sends its words to
// every other and combines what it receives (one hop: the last rank to arrive waits for nobody);
// beyond, recursive doubling (log2 N rounds, plus two for a rank count that is not a power of
// two), which sends log2 N messages per rank instead of N - 1.
Status BitwiseAllreduce(Comm& comm, transport::Region& buf, size_t and_words, size_t or_words,
                        Scratch& scratch);

// BitwiseAllreduce with a payload riding after the words: buf holds the words and then this
// rank's payload_bytes (at most max_payload_bytes, the same on every rank; 0 sends none), and
// has room for the words and max_payload_bytes. Where every rank sent payload_bytes (> 0), `sum`
// gets the payloads summed as `dtype`, the same bits on every rank, and *summed is set: in rank
// order in the direct exchange; in recursive doubling, each round's partners adding the same two
// partial sums (buf's payload is then overwritten). The words are combined whatever the
// payloads.
Status BitwiseAllreduceRiding(Comm& comm, transport::Region& buf, size_t and_words, size_t or_words,
                              size_t payload_bytes, size_t max_payload_bytes, DataType dtype,
                              uint8_t* sum, bool* summed, Scratch& scratch);

// Sends a variable-length message to `peer` / receives one from `peer`, as a length message then a
// payload message (both posted at once). Point-to-point building blocks; negotiation uses
// GatherMessages/BroadcastMessage instead.
Status SendMessage(Comm& comm, int peer, const std::vector<uint8_t>& payload, uint64_t tag);
StatusOr<std::vector<uint8_t>> RecvMessage(Comm& comm, int peer, uint64_t tag);

// Gathers one variable-length message from every rank at `root` (root's own included, in rank
// order) — the negotiation's request phase — and broadcasts one message from root to all.
StatusOr<std::vector<std::vector<uint8_t>>> GatherMessages(Comm& comm, int root,
                                                           const std::vector<uint8_t>& mine);
StatusOr<std::vector<uint8_t>> BroadcastMessage(Comm& comm, int root,
                                                const std::vector<uint8_t>& message);

// Barrier: returns once every rank has entered.
Status Barrier(Comm& comm);

}  // namespace kolo::collectives
