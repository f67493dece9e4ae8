// The shared-memory segment of one pair of ranks: a header, the control words of the two rings
// (one per direction) and the rings' bytes, in one POSIX shared-memory object.
//
// Life of a segment (set-up in mesh.cc): the lower rank of the pair creates it under a fresh name
// "/kolo-<job>-<low>-<high>-<random>" (<job>: 16 hex digits of SHA-256 over the job secret, never
// the secret itself; <random>: 64 bits from the kernel) with O_CREAT|O_EXCL|O_NOFOLLOW and mode
// 0600, reserves its memory (posix_fallocate: a full /dev/shm is an error at set-up, not a SIGBUS
// later), maps it and writes the header, which carries a nonce. It then sends the name and the
// nonce to the higher rank over their authenticated socket; the higher rank opens the name without
// O_CREAT and O_NOFOLLOW, refuses an object that is not a regular file of this user with mode
// 0600 and the expected size, maps it, refuses a header that is not the one announced (a stale
// segment, someone else's), and unlinks the name at once. The lower rank unlinks it too when the
// higher rank answers, or fails, or set-up times out. From then on the segment has no name: a
// killed job leaves nothing in /dev/shm, and the memory goes when the last mapping does.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "engine/common/status.h"

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

// "0123456789abcdef": 16 hex digits of SHA-256("kolo shm job v1" || secret).
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

  // Creates a segment for ranks low < high under a fresh name "/kolo-<job_id>-<low>-<high>-<hex>"
  // (exclusively, mode 0600), reserves and maps it, and writes the header with a fresh nonce.
  // A name that exists already is never opened: another random name is tried, a few times.
  // The caller must Unlink(name()) once the peer has opened it, or has failed to.
  static StatusOr<Segment> Create(const std::string& job_id, int low, int high,
                                  uint64_t ring_bytes);
  // Opens and maps the segment `name` the lower rank announced, refusing anything but a regular
  // file of this user, mode 0600, of the expected size, whose header matches (magic, version,
  // ranks, ring size, nonce). Does not unlink it.
  static StatusOr<Segment> Open(const std::string& name, const std::string& job_id, int low,
                                int high, uint64_t ring_bytes, const SegmentNonce& nonce);

  bool valid() const { return base_ != nullptr; }
  const std::string& name() const { return name_; }
  const SegmentNonce& nonce() const { return header()->nonce; }
  uint64_t ring_bytes() const { return header()->ring_bytes; }
  RingControl& control(int direction) const;
  uint8_t* ring(int direction) const;

 private:
  Segment(void* base, size_t bytes, std::string name)
      : base_(base), bytes_(bytes), name_(std::move(name)) {}
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base_); }
  void Unmap();

  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
};

// Removes the name from /dev/shm; a name already gone is not an error.
Status Unlink(const std::string& name);

// Whether `name` has the form of a segment name of this job for ranks low and high.
bool IsSegmentName(const std::string& name, const std::string& job_id, int low, int high);

}  // namespace kolo::transport::shm
