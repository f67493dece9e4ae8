#include "engine/bootstrap/store.h"

namespace kolo::bootstrap {

Status InMemoryStore::Set(const std::string& key, const std::vector<uint8_t>& value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = data_.emplace(key, value);
  if (!inserted && it->second != value) {
    return InvalidArgument("store key '{}' is already set to a different value", key);
  }
  cv_.notify_all();
  return Status::OK();
}

StatusOr<std::vector<uint8_t>> InMemoryStore::Get(const std::string& key,
                                                  std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return data_.count(key) > 0; })) {
    return DeadlineExceeded("store key '{}' was not set within {} ms", key, timeout.count());
  }
  return data_.at(key);
}

}  // namespace kolo::bootstrap
