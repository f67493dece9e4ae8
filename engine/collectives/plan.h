// Which allreduce algorithm runs a collective, and which peers a rank connects to so that every
// algorithm it may run has its connections.
//
// The connection plan: a rank connects only to the peers the job's collectives use — its ring
// neighbours, its partners in recursive doubling and halving-doubling (r XOR 2^k, which also
// carry the fold of a rank count that is not a power of two, the binomial trees of negotiation's
// gather and broadcast and the barrier), and, with hierarchical allreduce, its neighbours in the
// rings within its host and across hosts and its recursive-doubling partners in the group across
// hosts (HierarchicalSmallAllreduce). That is at most 2 + ceil(log2 N) peers for N ranks (plus
// 4 + ceil(log2 H) with hierarchical allreduce over H hosts), against N - 1 for a full mesh. Up to
// Comm::bitwise_direct_max_ranks ranks the bit exchange is direct (one hop to every rank), so a
// job that small connects every pair, as before.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/collectives/collectives.h"
#include "engine/common/status.h"

namespace kolo::collectives {

enum class AllreduceAlgorithm { kAuto, kRing, kRecursiveDoubling, kHalvingDoubling, kOneShot };

// "auto", "ring", "recursive-doubling", "halving-doubling", "one-shot".
const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm);
// Parses one of those names; InvalidArgument naming the value and the allowed names otherwise.
StatusOr<AllreduceAlgorithm> ParseAllreduceAlgorithm(const std::string& name);

// The rule that picks an algorithm for one allreduce of `bytes` over `ranks` ranks on `hosts`
// hosts (never kAuto); `host_area`: the ranks share a host-wide shared-memory area
// (Comm::host_area). Every rank computes the same choice from the same arguments. The
// crossovers were measured with kolo-allreduce-bench on loopback (engine/docs/collectives.md):
//   - one-shot through the host area up to kOneShotMaxBytes, and while each rank sums no more
//     than kOneShotMaxSummedBytes ((N - 1) times the buffer), where every rank is on one host and
//     has the area: one step through memory, whatever the rank count, but every rank reads every
//     rank's buffer;
//   - recursive doubling up to kRecursiveDoublingMaxBytes: log2 N exchanges of the whole buffer
//     beat 2 (N-1) ring steps while a step costs more than its bytes;
//   - halving-doubling up to kHalvingDoublingMaxBytes: the ring's bytes in 2 log2 N steps;
//   - the ring beyond, whose pipelined neighbour-to-neighbour transfers keep every link busy and
//     cross each host boundary once per direction.
// A single rank runs nothing (kRing).
constexpr size_t kRecursiveDoublingMaxBytes = 32 << 10;
constexpr size_t kHalvingDoublingMaxBytes = 1 << 20;
constexpr size_t kOneShotMaxBytes = 64 << 10;
constexpr size_t kOneShotMaxSummedBytes = 1 << 20;
AllreduceAlgorithm ChooseAllreduceAlgorithm(size_t bytes, int ranks, int hosts,
                                            bool host_area = false);

// With hierarchical allreduce on, algorithm auto and every host's area mapped: whether an
// allreduce of `bytes` runs as HierarchicalSmallAllreduce (the one-shot within the host, then
// recursive doubling across hosts): the one-shot's bounds with the ranks of one host.
bool HierarchicalSmallFits(size_t bytes, int ranks_per_host);

// Allreduce (sum, in place on buf[offset, offset + count)) with `algorithm`, or, for kAuto, the
// rule's choice for the call's bytes, comm.size() ranks and `hosts` hosts.
Status AllreduceWith(AllreduceAlgorithm algorithm, int hosts, Comm& comm, transport::Region& buf,
                     size_t offset_bytes, size_t count, DataType dtype, Scratch& scratch);
// The same on the concatenation of `extents` (zero-copy Tensor Fusion).
Status AllreduceWith(AllreduceAlgorithm algorithm, int hosts, Comm& comm,
                     const std::vector<Extent>& extents, DataType dtype, Scratch& scratch);

// The peers `rank` of `size` connects to (sorted, without `rank`): see the file comment.
// `direct_max_ranks` is Comm::bitwise_direct_max_ranks; `hierarchical` the rank's host groups
// when hierarchical allreduce is on. Symmetric: every rank computes the same plan, in which a
// lists b exactly when b lists a.
std::vector<int> PlanConnections(int rank, int size, int direct_max_ranks,
                                 const HostGroups* hierarchical);

// Of those, the peers whose pairs carry the ring's large buffers: the ring neighbours (and, with
// hierarchical allreduce, the neighbours in the rings within and across hosts). The transports
// may give the other pairs smaller buffers (transport::ConnectSettings::full_ring_peers): the
// latency-optimal algorithms send them buffers below kHalvingDoublingMaxBytes. Symmetric.
std::vector<int> PlanFullRingPeers(int rank, int size, const HostGroups* hierarchical);

}  // namespace kolo::collectives
