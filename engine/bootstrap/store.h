// A key-value store for rendezvous: ranks publish their listening addresses and read each other's.
//
// Implementations: InMemoryStore (ranks as threads in one process, for tests), and the TCP store
// (tcp_store.h) that rank 0 serves for a launch by kolo-run or mpirun. Keys are set once;
// Get waits until the key exists or the timeout passes.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/common/mutex.h"
#include "engine/common/status.h"
#include "engine/common/thread_annotations.h"

namespace kolo::bootstrap {

class Store {
 public:
  virtual ~Store() = default;
  // Sets `key` to `value`. Setting an existing key to a different value is an error.
  virtual Status Set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits for `key` and returns its value; DeadlineExceeded names the key after `timeout`.
  virtual StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                             std::chrono::milliseconds timeout) = 0;
};

// Thread-safe, in-process. Shared by the rank threads of one test.
class InMemoryStore final : public Store {
 public:
  Status Set(const std::string& key, const std::vector<uint8_t>& value) override KOLO_EXCLUDES(mu_);
  StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                     std::chrono::milliseconds timeout) override KOLO_EXCLUDES(mu_);

 private:
  Mutex mu_;
  CondVar cv_;
  std::map<std::string, std::vector<uint8_t>> data_ KOLO_GUARDED_BY(mu_);
};

// Prefixes every key, so that several jobs or phases can share one store.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, Store& base) : prefix_(std::move(prefix)), base_(base) {}
  Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    return base_.Set(prefix_ + key, value);
  }
  StatusOr<std::vector<uint8_t>> Get(const std::string& key,
                                     std::chrono::milliseconds timeout) override {
    return base_.Get(prefix_ + key, timeout);
  }

 private:
  std::string prefix_;
  Store& base_;
};

}  // namespace kolo::bootstrap
