#include "engine/bootstrap/store.h"

namespace kolo::bootstrap {

Status InMemoryStore::Set(const std::string& key, const std::vector<uint8_t>& value) {
  MutexLock lock(mu_);
  auto [it, inserted] = data_.emplace(key, value);
  if (!inserted && it->second != value) {
    return InvalidArgument("store key '{}' is already set to a different value", key);
  }
  cv_.notify_all();
  return Status::OK();
}

StatusOr<std::vector<uint8_t>> InMemoryStore::Get(const std::string& key,
                                                  std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  if (!cv_.WaitFor(mu_, timeout, [&]() KOLO_REQUIRES(mu_) { return data_.count(key) > 0; })) {
    return DeadlineExceeded("store key '{}' was not set within {} ms", key, timeout.count());
  }
  return data_.at(key);
}

}  // namespace kolo::bootstrap
