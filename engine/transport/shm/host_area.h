// One shared-memory area for every rank of a host: a slot per rank, which each rank writes and
// every rank reads, for collectives that take one step through memory (collectives/one_shot.cc),
// where pair segments (segment.h) take one step per partner.
//
// Layout: a header page; then per rank its control words (HostSlotControl, on cache lines of
// their own); then per rank two banks of slot_bytes, so that a call can be written while the
// ranks still read the one before it.
//
// Set-up (Attach, collective over the ranks of the area): rank 0 makes the area as a pair segment
// is made (an anonymous memory file, "kolo-<job>-host", its memory reserved and its size sealed),
// maps it and publishes in the store where the others find it: its process id, the descriptor's
// number and the header's nonce. Every other rank opens the file through /proc/<pid>/fd/<fd>
// (which the kernel allows only to this user's processes), refuses it unless it is a regular file
// of this user sealed against any change of its size, of the expected size, whose header carries
// the nonce announced, maps it and closes its descriptor. Rank 0 keeps its descriptor until
// CloseDescriptor (once the ranks have agreed that every one mapped it). As for pair segments,
// the area never has a name in a file system: nothing is left behind whatever kills the ranks.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/bootstrap/store.h"
#include "engine/common/status.h"
#include "engine/transport/shm/segment.h"
#include "engine/transport/tcp/socket.h"

namespace kolo::transport::shm {

// One rank's control words. `published` is the last call whose input the rank has put in its
// slot, `consumed` the last call it has finished reading every slot of; each has a count of the
// threads asleep on it (futex), so that the writer makes the wake-up system call only when
// somebody sleeps.
struct HostSlotControl {
  alignas(64) std::atomic<uint32_t> published{0};
  std::atomic<uint32_t> published_sleepers{0};
  uint64_t bytes[2] = {0, 0};  // bytes of the call in each bank
  alignas(64) std::atomic<uint32_t> consumed{0};
  std::atomic<uint32_t> consumed_sleepers{0};
  // The engine thread of this rank sleeps on `doorbell` while it has nothing to exchange (its
  // negotiation goes through the area: collectives::AwaitHostDoorbell); a peer that enters an
  // exchange, or a submission on this rank, bumps it and wakes the sleeper.
  alignas(64) std::atomic<uint32_t> doorbell{0};
  std::atomic<uint32_t> doorbell_sleepers{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shared atomics must be lock-free");

class HostArea {
 public:
  // Bytes of each bank of a slot by default: the one-shot allreduce's piece.
  static constexpr size_t kDefaultSlotBytes = 32 << 10;

  // Collective over ranks 0..size-1 (all on this host; `rank` is this one's index): see the file
  // comment. `store` carries the announcement under `key`; `job_id` labels the file (JobId).
  // Errors name what was refused and why; a rank whose rank 0 could not make the area fails at
  // once with rank 0's reason. DeadlineExceeded after `timeout`.
  static StatusOr<std::unique_ptr<HostArea>> Attach(bootstrap::Store& store, const std::string& key,
                                                    const std::string& job_id, int rank, int size,
                                                    size_t slot_bytes,
                                                    std::chrono::milliseconds timeout);
  ~HostArea();
  HostArea(const HostArea&) = delete;
  HostArea& operator=(const HostArea&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slot_bytes() const { return slot_bytes_; }
  size_t mapped_bytes() const { return bytes_; }
  HostSlotControl& control(int r) const;
  uint8_t* slot(int r, int bank) const;

  // Rank 0: closes the descriptor it kept for the others to open. Idempotent; a no-op elsewhere.
  void CloseDescriptor() { descriptor_.reset(); }

  // Calls this rank has run through the area (the next one is calls + 1); the same on every rank,
  // since every rank runs the same collectives in the same order. Owned by the driving thread.
  // 64 bits here; the control words carry its low 32, compared modulo 2^32.
  uint64_t calls = 0;
  // How long a wait spins (yielding the processor between looks) before it sleeps: the device's
  // poll spin (Device::SetPollSpin).
  std::chrono::microseconds spin{20};
  // Bytes this rank put into its slot and read out of the others' slots, ever (the traffic the
  // area carried in place of the transport's; Engine::Stats counts it with the transport's).
  uint64_t bytes_written = 0;
  uint64_t bytes_read = 0;

 private:
  HostArea(void* base, size_t bytes, int rank, int size, size_t slot_bytes)
      : base_(base), bytes_(bytes), rank_(rank), size_(size), slot_bytes_(slot_bytes) {}

  void* base_;
  size_t bytes_;
  int rank_;
  int size_;
  size_t slot_bytes_;
  tcp::Fd descriptor_;
};

// Bytes of an area of `size` ranks with banks of `slot_bytes`.
size_t HostAreaBytes(int size, size_t slot_bytes);

}  // namespace kolo::transport::shm
