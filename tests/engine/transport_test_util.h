// Test helpers for the transports: the devices of one job connected through the registry (ranks
// as threads), a store on files that forked rank processes share, byte patterns, and what the
// shared-memory transport leaves in /dev/shm.
#pragma once

#include <dirent.h>
#include <gtest/gtest.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/host_layout.h"
#include "engine/bootstrap/store.h"
#include "engine/common/random.h"
#include "engine/transport/registry.h"
#include "engine/transport/transport.h"
#include "tests/engine/rank_threads.h"

namespace kolo::testing {

using std::chrono::milliseconds;
using TestClock = std::chrono::steady_clock;

// The devices of one job. They shut down concurrently, as the ranks of a real job do (a closing
// device waits, bounded, for its peers to close their side too).
struct Devices : std::vector<std::unique_ptr<transport::Device>> {
  using std::vector<std::unique_ptr<transport::Device>>::vector;
  Devices(Devices&&) = default;
  Devices& operator=(Devices&&) = default;
  ~Devices() {
    std::vector<std::thread> threads;
    for (auto& d : *this) threads.emplace_back([&d] { d.reset(); });
    for (auto& t : threads) t.join();
  }
};

// A secret of its own for each job of a test, so that jobs of tests running at the same time
// never share segment names.
inline std::string FreshSecret() {
  uint8_t bytes[12];
  FillRandom(bytes, sizeof bytes);
  std::string s = "test-";
  for (uint8_t b : bytes) s += "0123456789abcdef"[b >> 4], s += "0123456789abcdef"[b & 15];
  return s;
}

inline transport::ConnectSettings TestSettings(milliseconds timeout = milliseconds(20000)) {
  transport::ConnectSettings s;
  s.secret = FreshSecret();
  s.timeout = timeout;
  return s;
}

// Every rank on one host, unless `host_of_rank` names each rank's host.
inline bootstrap::HostLayout Layout(int size, const std::vector<std::string>& host_of_rank = {}) {
  if (!host_of_rank.empty()) return bootstrap::HostLayout(host_of_rank);
  return bootstrap::HostLayout(std::vector<std::string>(static_cast<size_t>(size), "h0"));
}

// Connects ranks 0..n-1 of a job of `size` ranks (the others, if any, join from elsewhere)
// through the transport `name`, rank r with settings_of(r). A rank that fails leaves its device
// null (and the test fails).
inline Devices ConnectAll(const std::string& name, int n, bootstrap::Store& store,
                          const std::function<transport::ConnectSettings(int)>& settings_of,
                          int size = 0) {
  if (size == 0) size = n;
  Devices devices(static_cast<size_t>(n));
  std::vector<Status> statuses = RunRankThreads(n, [&](int r) -> Status {
    transport::ConnectSettings settings = settings_of(r);
    if (!settings.hosts.known()) settings.hosts = Layout(size);
    KOLO_ASSIGN_OR_RETURN(devices[static_cast<size_t>(r)],
                          transport::Connect(name, settings, store, r, size));
    return Status::OK();
  });
  for (int r = 0; r < n; ++r) {
    if (!statuses[static_cast<size_t>(r)].ok()) {
      ADD_FAILURE() << "rank " << r << ": " << statuses[static_cast<size_t>(r)].ToString();
    }
  }
  return devices;
}

// The same, every rank with `settings`.
inline Devices ConnectAll(const std::string& name, int n, bootstrap::Store& store,
                          const transport::ConnectSettings& settings, int size = 0) {
  return ConnectAll(
      name, n, store, [&](int) { return settings; }, size);
}

inline std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

inline double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// The entries of /dev/shm whose names start with `prefix`.
inline std::vector<std::string> ShmFiles(const std::string& prefix) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) out.push_back(name);
  }
  return out;
}

// A file-backed store, so that a forked process can rendezvous with threads of this one.
class FileStore final : public bootstrap::Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    const std::string path = Path(key);
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    std::ofstream(tmp, std::ios::binary)
        .write(reinterpret_cast<const char*>(value.data()),
               static_cast<std::streamsize>(value.size()));
    std::filesystem::rename(tmp, path);
    return Status::OK();
  }
  StatusOr<std::vector<uint8_t>> Get(const std::string& key, milliseconds timeout) override {
    const auto deadline = TestClock::now() + timeout;
    while (!std::filesystem::exists(Path(key))) {
      if (TestClock::now() >= deadline) return DeadlineExceeded("no key {}", key);
      std::this_thread::sleep_for(milliseconds(2));
    }
    std::ifstream in(Path(key), std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string Path(std::string key) const {
    for (char& c : key) c = c == '/' ? '_' : c;
    return dir_ + "/" + key;
  }
  std::string dir_;
};

}  // namespace kolo::testing
