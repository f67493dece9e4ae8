// Response cache: responses the coordinator has issued before, each at a bit position, so that a
// steady-state step agrees on ready tensors by AND-ing bit vectors instead of going through rank 0.
//
// Every rank keeps an identical cache: it is changed only by the ordered, job-wide sequence of
// Put / Touch / Erase calls the engine makes after each cycle, so bit positions agree everywhere.
// Eviction is least-recently-used. Not thread-safe (background thread only).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/coordinator/message.h"

namespace kolo::coordinator {

class ResponseCache {
 public:
  explicit ResponseCache(int capacity);

  int capacity() const { return capacity_; }
  // 64-bit words a bit vector over the cache needs.
  size_t words() const { return WordsFor(capacity_); }
  // The 64-bit words a bit vector over `capacity` entries takes.
  static size_t WordsFor(int capacity) { return (static_cast<size_t>(capacity) + 63) / 64; }

  enum class Lookup { kMiss, kHit, kMismatch };
  // kHit: `name` is cached with a response compatible with `request` as submitted by `rank`;
  // kMismatch: cached with different properties (the entry must be invalidated job-wide).
  Lookup Find(const Request& request, int rank, int* bit) const;

  // Caches `response` (a collective, not an error). Reuses the name's bit if cached, else a free
  // bit, else evicts the least recently used entry.
  void Put(const Response& response);
  // Marks the entry at `bit` most recently used.
  void Touch(int bit);
  void Erase(int bit);
  // The response at `bit`. REQUIRES: the bit is occupied.
  const Response& Get(int bit) const;
  // Fingerprint(Get(bit)), kept since Put. REQUIRES: the bit is occupied.
  uint64_t fingerprint(int bit) const { return fingerprints_[static_cast<size_t>(bit)]; }
  bool Occupied(int bit) const;
  size_t entries() const { return by_name_.size(); }
  // A fingerprint of the whole cache (which response in which bit, and the order of recency that
  // decides evictions); equal on ranks whose caches are equal, which they must be: every rank
  // reads this cycle's hits from its own. Cheap: kept up to date by Put, Touch and Erase.
  uint64_t digest() const { return contents_ ^ recency_; }

 private:
  // The term of `bit` holding a response of fingerprint `f` in contents_.
  static uint64_t Term(int bit, uint64_t f);
  int capacity_;
  std::vector<std::optional<Response>> slots_;  // by bit
  std::unordered_map<std::string, int> by_name_;
  std::list<int> lru_;  // most recent at front
  std::vector<std::list<int>::iterator> lru_pos_;
  std::vector<int> free_;               // free bits, lowest last
  std::vector<uint64_t> fingerprints_;  // by bit, of the occupied slots
  uint64_t contents_ = 0;               // XOR of Term(bit, fingerprint) over occupied bits
  uint64_t recency_ = 0;                // running mix of the bits touched, in order
};

}  // namespace kolo::coordinator
