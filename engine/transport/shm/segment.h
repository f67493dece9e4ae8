// The shared-memory segment of one pair of ranks: a header, the control words of the two rings
// (one per direction) and the rings' bytes, in one anonymous shared-memory file.
//
// Life of a segment (set-up in mesh.cc): the lower rank of the pair makes it with memfd_create
// (close-on-exec; the name "kolo-<job>-<low>-<high>" only labels it in /proc/<pid>/fd and
// /proc/<pid>/maps, <job> being 16 hex digits of SHA-256 over the job secret, never the secret
// itself), sizes it, reserves its memory (posix_fallocate: memory that is short is an error at
// set-up, not a SIGBUS later), seals its size (F_SEAL_SHRINK|F_SEAL_GROW|F_SEAL_SEAL: no side can
// ever truncate it under the other's mapping), maps it and writes the header, which carries a
// nonce. It then passes the descriptor, with the nonce and the ring size, to the higher rank over
// their authenticated AF_UNIX socket (SCM_RIGHTS); the higher rank refuses a descriptor that is
// not a sealed regular file of this user of the expected size, maps it, refuses a header that is
// not the one announced, and closes the descriptor; the lower rank closes its own once it is
// sent. The segment never has a name in any file system: whatever kills either rank, at whatever
// moment (SIGKILL included, when no code of ours runs), nothing is left behind, and the memory
// goes with the last mapping or descriptor, in the kernel's hands.
#pragma once

#include <fcntl.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/common/status.h"
#include "engine/transport/tcp/socket.h"

namespace kolo::transport::shm {

using SegmentNonce = std::array<uint8_t, 16>;

inline constexpr uint64_t kSegmentMagic = 0x314d48534f4c4f4bull;  // "KOLOSHM1"
inline constexpr uint32_t kSegmentVersion = 1;
// Ring sizes allowed: a power of two in this range.
inline constexpr uint64_t kMinRingBytes = 64 << 10;
inline constexpr uint64_t kMaxRingBytes = 1ull << 30;

// The control words of one direction. Each side writes only its own line; the waiting flags are
// set by their owner and cleared by whichever side rings the doorbell (exchange).
struct RingControl {
  // Bytes the producer has published, ever (a position: the ring offset is head % ring_bytes).
  alignas(64) std::atomic<uint64_t> head{0};
  // Bytes the consumer has released, ever.
  alignas(64) std::atomic<uint64_t> tail{0};
  // The consumer sleeps until head reaches consumer_wake_at, and wants a doorbell then.
  alignas(64) std::atomic<uint32_t> consumer_waiting{0};
  std::atomic<uint64_t> consumer_wake_at{0};
  // The producer sleeps until tail reaches producer_wake_at (room in the ring).
  alignas(64) std::atomic<uint32_t> producer_waiting{0};
  std::atomic<uint64_t> producer_wake_at{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared atomics must be lock-free");

struct SegmentHeader {
  uint64_t magic = 0;
  uint32_t version = 0;
  int32_t low_rank = -1;
  int32_t high_rank = -1;
  uint32_t reserved = 0;
  uint64_t ring_bytes = 0;
  uint64_t total_bytes = 0;
  SegmentNonce nonce{};
};

// Direction 0 carries the lower rank's messages to the higher one, direction 1 the reverse.
inline int SendDirection(int rank, int peer) { return rank < peer ? 0 : 1; }

// The seals every segment carries, and that the opener requires: with them nobody, the creator
// included, can shrink the file under the other side's mapping (a SIGBUS there) or change the
// seals again.
inline constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

// An anonymous memory file labelled `label`, close-on-exec, that allows sealing; -1 with errno set
// on failure. MFD_NOEXEC_SEAL (Linux 6.3) where the kernel knows it: such kernels warn about memory
// files made without it, and refuse them when vm.memfd_noexec is 2; older ones reject the unknown
// flag with EINVAL.
int MemoryFile(const std::string& label);

// "0123456789abcdef": 16 hex digits of SHA-256("kolo shm job v1" || secret). Names this job's
// listening sockets (mesh.cc) and labels its segments.
std::string JobId(const std::string& secret);

// Bytes of a segment with two rings of `ring_bytes`.
size_t SegmentBytes(uint64_t ring_bytes);

// InvalidArgument naming the value unless it is a power of two in [kMinRingBytes, kMaxRingBytes].
Status CheckRingBytes(uint64_t ring_bytes);

// A mapped segment; unmaps on destruction. Movable.
class Segment {
 public:
  Segment() = default;
  ~Segment();
  Segment(Segment&& other) noexcept;
  Segment& operator=(Segment&& other) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates the segment of ranks low < high (memfd_create, labelled "kolo-<job_id>-<low>-<high>"),
  // sizes it, reserves its memory, seals its size, maps it and writes the header with a fresh
  // nonce. *descriptor receives the file, to be passed to the peer; the caller closes it once sent.
  static StatusOr<Segment> Create(const std::string& job_id, int low, int high, uint64_t ring_bytes,
                                  tcp::Fd* descriptor);
  // Maps the segment whose descriptor the lower rank `low` passed to `high`, refusing anything but
  // a regular file of this user, sealed against any change of its size, of the expected size,
  // whose header matches (magic, version, ranks, ring size, nonce). Closes the descriptor, mapped
  // or refused: the mapping alone keeps the memory.
  static StatusOr<Segment> Open(tcp::Fd descriptor, int low, int high, uint64_t ring_bytes,
                                const SegmentNonce& nonce);

  bool valid() const { return base_ != nullptr; }
  const SegmentNonce& nonce() const { return header()->nonce; }
  uint64_t ring_bytes() const { return header()->ring_bytes; }
  RingControl& control(int direction) const;
  uint8_t* ring(int direction) const;

 private:
  Segment(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base_); }
  void Unmap();

  void* base_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kolo::transport::shm
