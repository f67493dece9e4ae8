// Memory registration for the RDMA transport: a cache of memory regions (MRs) keyed by address
// range, and the Region the device hands out. Internal to rdma/.
//
// Registering pins and maps memory, which is slow, so a Region inside memory already registered
// reuses that MR (ranges are rounded out to whole 4 KiB pages), and an MR is deregistered when the
// last user lets go: a Region, or an operation still in flight whose Region was destroyed first.
// Memory that cannot be registered for writing (read-only pages) is registered for sending only.
//
// Thread-safety: none; the device's thread only, like the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>

#include "engine/common/status.h"
#include "engine/transport/rdma/verbs.h"
#include "engine/transport/transport.h"

namespace kolo::transport::rdma {

// One registered range [start, end) and its users.
struct MrEntry {
  uintptr_t start = 0, end = 0;
  ibv_mr* mr = nullptr;
  int refs = 0;
  bool writable = true;  // registered for local and remote writes, not only for sending
};

class RegCache {
 public:
  // `verbs` and `pd` must outlive the cache or its Close.
  RegCache(const Verbs* verbs, ibv_pd* pd) : verbs_(verbs), pd_(pd) {}

  // The entry covering [data, data + size), registering the page-rounded range if none does;
  // one more user either way. Unavailable naming the size and address (and the memory lock limit)
  // when the memory cannot be registered at all. REQUIRES: size > 0.
  StatusOr<MrEntry*> Acquire(void* data, size_t size);
  // One more user of `entry` (null: none). No-op once closed.
  void Retain(MrEntry* entry);
  // One user less; deregisters the MR when it was the last (null: none). No-op once closed.
  void Release(MrEntry* entry);
  // Deregisters every MR (the device is going away; Regions still alive keep dangling keys and
  // must not be used). Idempotent.
  void Close();
  size_t count() const { return entries_.size(); }

 private:
  const Verbs* verbs_;
  ibv_pd* pd_;
  std::list<MrEntry> entries_;  // a list: entries are pointed to and never move
  bool closed_ = false;
};

// A Region registered with an RDMA device: its keys, and the cache entry it holds (null for an
// empty Region). `owner` identifies the device, so that a pair can refuse another device's
// Regions. The cache is shared so that a Region may outlive the device.
class RdmaRegion final : public Region {
 public:
  RdmaRegion(void* data, size_t size, const void* owner, std::shared_ptr<RegCache> cache,
             MrEntry* entry);
  ~RdmaRegion() override;

  const void* owner() const { return owner_; }
  MrEntry* entry() const { return entry_; }
  uint32_t lkey() const { return lkey_; }
  uint32_t rkey() const { return rkey_; }
  bool writable() const { return writable_; }

 private:
  const void* owner_;
  std::shared_ptr<RegCache> cache_;
  MrEntry* entry_;
  uint32_t lkey_ = 0, rkey_ = 0;
  bool writable_ = true;
};

}  // namespace kolo::transport::rdma
