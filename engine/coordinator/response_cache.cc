#include "engine/coordinator/response_cache.h"

namespace kolo::coordinator {

ResponseCache::ResponseCache(int capacity)
    : capacity_(capacity), slots_(capacity), lru_pos_(capacity), fingerprints_(capacity, 0) {
  for (int b = capacity - 1; b >= 0; --b) free_.push_back(b);
}

ResponseCache::Lookup ResponseCache::Find(const Request& request, int rank, int* bit) const {
  auto it = by_name_.find(request.name);
  if (it == by_name_.end()) return Lookup::kMiss;
  *bit = it->second;
  const Response& cached = *slots_[it->second];
  if (!cached.request.Compatible(request)) return Lookup::kMismatch;
  if (request.type == CollectiveType::kAllgather) {
    if (rank >= static_cast<int>(cached.first_dims.size()) ||
        cached.first_dims[rank] != request.shape[0]) {
      return Lookup::kMismatch;
    }
  }
  return Lookup::kHit;
}

void ResponseCache::Put(const Response& response) {
  if (capacity_ == 0) return;
  int bit;
  auto it = by_name_.find(response.request.name);
  if (it != by_name_.end()) {
    bit = it->second;
  } else if (!free_.empty()) {
    bit = free_.back();
    free_.pop_back();
    lru_.push_front(bit);
    lru_pos_[bit] = lru_.begin();
  } else {
    bit = lru_.back();
    by_name_.erase(slots_[bit]->request.name);
  }
  if (slots_[bit]) contents_ ^= Term(bit, fingerprints_[bit]);
  slots_[bit] = response;
  fingerprints_[bit] = Fingerprint(response);
  contents_ ^= Term(bit, fingerprints_[bit]);
  by_name_[response.request.name] = bit;
  Touch(bit);
}

void ResponseCache::Touch(int bit) {
  lru_.splice(lru_.begin(), lru_, lru_pos_[bit]);
  recency_ = MixFingerprint(recency_, static_cast<uint64_t>(bit));
}

uint64_t ResponseCache::Term(int bit, uint64_t f) {
  return MixFingerprint(static_cast<uint64_t>(bit) + 1, f);
}

void ResponseCache::Erase(int bit) {
  if (!slots_[bit]) return;
  contents_ ^= Term(bit, fingerprints_[bit]);
  recency_ = MixFingerprint(recency_, ~static_cast<uint64_t>(bit));
  by_name_.erase(slots_[bit]->request.name);
  slots_[bit].reset();
  lru_.erase(lru_pos_[bit]);
  free_.push_back(bit);
}

const Response& ResponseCache::Get(int bit) const { return *slots_[bit]; }
bool ResponseCache::Occupied(int bit) const {
  return bit >= 0 && bit < capacity_ && slots_[bit].has_value();
}

}  // namespace kolo::coordinator
