#include "engine/transport/rdma/registration_cache.h"

#include <cerrno>
#include <cstring>

#include "engine/common/logging.h"

namespace kolo::transport::rdma {

StatusOr<MrEntry*> RegCache::Acquire(void* data, size_t size) {
  const auto lo = reinterpret_cast<uintptr_t>(data);
  const uintptr_t hi = lo + size;
  for (MrEntry& e : entries_) {
    if (e.start <= lo && hi <= e.end) {
      ++e.refs;
      return &e;
    }
  }
  const uintptr_t start = lo & ~uintptr_t{4095};
  const uintptr_t end = (hi + 4095) & ~uintptr_t{4095};
  void* base = reinterpret_cast<void*>(start);
  bool writable = true;
  ibv_mr* mr =
      verbs_->reg_mr(pd_, base, end - start, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  const int err = errno;
  if (mr == nullptr) {
    // Read-only memory can still be sent from.
    mr = verbs_->reg_mr(pd_, base, end - start, 0);
    writable = false;
  }
  if (mr == nullptr) {
    return ErrnoStatus(StatusCode::kUnavailable,
                       fmt::format("ibv_reg_mr of {} bytes at {} (the memory lock limit, ulimit "
                                   "-l, may be too low)",
                                   end - start, base),
                       err);
  }
  MrEntry& e = entries_.emplace_back();
  e.start = start;
  e.end = end;
  e.mr = mr;
  e.refs = 1;
  e.writable = writable;
  return &e;
}

// An operation in flight keeps its MR registered even if its Region is destroyed before the
// operation completes.
void RegCache::Retain(MrEntry* entry) {
  if (!closed_ && entry != nullptr) ++entry->refs;
}

void RegCache::Release(MrEntry* entry) {
  if (closed_ || entry == nullptr) return;
  if (--entry->refs > 0) return;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (&*it != entry) continue;
    if (verbs_->dereg_mr(it->mr) != 0) {
      KOLO_LOG(kWarning, "rdma: ibv_dereg_mr failed: {}", std::strerror(errno));
    }
    entries_.erase(it);
    return;
  }
}

void RegCache::Close() {
  if (closed_) return;
  closed_ = true;
  for (MrEntry& e : entries_) verbs_->dereg_mr(e.mr);
  entries_.clear();
}

RdmaRegion::RdmaRegion(void* data, size_t size, const void* owner, std::shared_ptr<RegCache> cache,
                       MrEntry* entry)
    : Region(data, size), owner_(owner), cache_(std::move(cache)), entry_(entry) {
  if (entry_ != nullptr) {
    lkey_ = entry_->mr->lkey;
    rkey_ = entry_->mr->rkey;
    writable_ = entry_->writable;
  }
}

RdmaRegion::~RdmaRegion() { cache_->Release(entry_); }

}  // namespace kolo::transport::rdma
