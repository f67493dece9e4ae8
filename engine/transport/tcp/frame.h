// The frame that carries every message after the handshake, and the queue the pairs keep their
// posted operations in.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace kolo::transport::tcp {

enum class FrameType : uint32_t {
  kData = 1,       // a message: `length` payload bytes with `tag`
  kAbort = 2,      // the sender is failing; the payload is its reason (at most kMaxAbortReason)
  kGoodbye = 3,    // the sender is shutting down cleanly; no payload, nothing follows
  kKeepalive = 4,  // the sender is alive and waiting; no payload, completes nothing
  kStriped = 5,    // a message of `length` bytes cut across the pair's streams; part 0 follows
};

// The part of a striped message of `length` bytes over `streams` streams that stream `k` carries:
// parts of ceil(length / streams) bytes rounded up to 64 (so that every part boundary is a whole
// number of elements of any dtype), the last shorter or empty.
inline void StripePart(uint64_t length, int streams, int k, uint64_t* offset, uint64_t* bytes) {
  const uint64_t n = static_cast<uint64_t>(streams);
  const uint64_t part = ((length + n - 1) / n + 63) / 64 * 64;
  const uint64_t begin = std::min<uint64_t>(length, part * static_cast<uint64_t>(k));
  *offset = begin;
  *bytes = std::min<uint64_t>(length - begin, part);
}

// Host byte order: every rank of a job runs on the same architecture.
struct FrameHeader {
  uint64_t tag = 0;
  uint64_t length = 0;
  uint32_t type = 0;
  uint32_t check = 0;  // kFrameCheck; catches a desynchronised stream at the next header
};
static_assert(sizeof(FrameHeader) == 24, "the frame header is 24 bytes on the wire");

inline constexpr uint32_t kFrameCheck = 0x6d617266;  // "fram"
inline constexpr size_t kMaxAbortReason = 4096;

// A FIFO of trivially copyable items in one pre-reserved ring; it doubles when full, so a steady
// state allocates nothing.
template <typename T>
class RingQueue {
 public:
  explicit RingQueue(size_t capacity) {
    size_t c = 1;
    while (c < capacity) c <<= 1;
    items_.resize(c);
  }
  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  T& front() { return items_[head_]; }
  const T& front() const { return items_[head_]; }
  T& at(size_t i) { return items_[(head_ + i) & (items_.size() - 1)]; }
  void push_back(const T& item) {
    if (count_ == items_.size()) Grow();
    items_[(head_ + count_) & (items_.size() - 1)] = item;
    ++count_;
  }
  void pop_front() {
    head_ = (head_ + 1) & (items_.size() - 1);
    --count_;
  }
  void clear() { head_ = count_ = 0; }

 private:
  void Grow() {
    std::vector<T> bigger(items_.size() * 2);
    for (size_t i = 0; i < count_; ++i) bigger[i] = at(i);
    items_ = std::move(bigger);
    head_ = 0;
  }

  std::vector<T> items_;
  size_t head_ = 0;
  size_t count_ = 0;
};

}  // namespace kolo::transport::tcp
