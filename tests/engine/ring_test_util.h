// Ring collectives of n ranks as threads over a named transport, with the reference data the
// collectives tests check against: small integers whose partial sums are exact in every dtype.
// Shared by the tests that run the ring over each transport (shm_collectives_test,
// rdma_transport_test; collectives_test uses the data helpers).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/collectives/collectives.h"
#include "engine/common/dtype.h"
#include "tests/engine/transport_test_util.h"

namespace kolo::testing {

// n ranks connected through `transport` with `settings` (every rank on one host unless
// settings.hosts says otherwise), or rank r with settings_of(r), with the collectives' per-rank
// state. The ranks shut down at once, as in a real job.
class RingJob {
 public:
  RingJob(int n, const std::string& transport, const transport::ConnectSettings& settings,
          size_t chunk_bytes, std::chrono::milliseconds timeout = std::chrono::milliseconds(30000))
      : RingJob(
            n, transport, [&](int) { return settings; }, chunk_bytes, timeout) {}
  RingJob(int n, const std::string& transport,
          const std::function<transport::ConnectSettings(int)>& settings_of, size_t chunk_bytes,
          std::chrono::milliseconds timeout = std::chrono::milliseconds(30000))
      : n_(n) {
    devices_ = ConnectAll(transport, n, store_, settings_of);
    comms_.resize(static_cast<size_t>(n));
    scratch_.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      comms_[r].device = devices_[r].get();
      comms_[r].chunk_bytes = chunk_bytes;
      comms_[r].timeout = timeout;
    }
  }
  ~RingJob() {
    RunRankThreads(n_, [&](int r) {
      devices_[static_cast<size_t>(r)].reset();
      return Status::OK();
    });
  }
  bool ok() const {
    for (const auto& d : devices_) {
      if (!d) return false;
    }
    return true;
  }
  int size() const { return n_; }
  transport::Device& device(int r) { return *devices_[static_cast<size_t>(r)]; }
  collectives::Comm& comm(int r) { return comms_[static_cast<size_t>(r)]; }
  collectives::Scratch& scratch(int r) { return scratch_[static_cast<size_t>(r)]; }
  // Runs fn(rank) on every rank; a rank that fails aborts its device so the others stop too.
  template <typename Fn>
  std::vector<Status> Run(Fn fn) {
    return RunRankThreads(n_, [&](int r) -> Status {
      Status s = fn(r);
      if (!s.ok()) device(r).Abort(s);
      return s;
    });
  }

 private:
  int n_;
  bootstrap::InMemoryStore store_;
  Devices devices_;
  std::vector<collectives::Comm> comms_;
  std::vector<collectives::Scratch> scratch_;
};

// Stores integer v as element i of a `dtype` array (uint8 and integers wrap).
inline void SetInt(DataType dtype, uint8_t* p, size_t i, int64_t v) {
  auto put = [&](auto x) { std::memcpy(p + i * sizeof x, &x, sizeof x); };
  switch (dtype) {
    case DataType::kFloat32:
      put(static_cast<float>(v));
      break;
    case DataType::kFloat64:
      put(static_cast<double>(v));
      break;
    case DataType::kFloat16:
      put(FloatToHalf(static_cast<float>(v)));
      break;
    case DataType::kBFloat16:
      put(FloatToBFloat16(static_cast<float>(v)));
      break;
    case DataType::kInt32:
      put(static_cast<int32_t>(v));
      break;
    case DataType::kInt64:
      put(v);
      break;
    case DataType::kUInt8:
      put(static_cast<uint8_t>(v));
      break;
  }
}

// Small integers: every partial sum of up to 8 ranks is exact in every dtype, whatever the order.
inline int64_t Value(int rank, size_t i) {
  return static_cast<int64_t>((i * 7 + rank * 13) % 11) - 5;
}

inline constexpr size_t kGuard = 24;  // bytes before and after the data that must stay untouched

// Fills every rank's buffer of `count` elements (with guard bytes around it), runs
// `reduce(rank, region, guard offset)` on every rank of `job` (RingJob or any job with size(),
// device(r) and Run), and checks that every rank got the exact sum and left its guards untouched.
template <typename Job, typename Reduce>
void CheckAllreduceWith(Job& job, DataType dtype, size_t count, Reduce reduce) {
  const int n = job.size();
  const size_t elem = DataTypeSize(dtype);
  std::vector<uint8_t> expected(count * elem);
  for (size_t i = 0; i < count; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < n; ++r) sum += Value(r, i);
    SetInt(dtype, expected.data(), i, sum);
  }
  std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto& b = bufs[static_cast<size_t>(r)];
    b.assign(count * elem + 2 * kGuard, 0xa5);
    for (size_t i = 0; i < count; ++i) SetInt(dtype, b.data() + kGuard, i, Value(r, i));
  }
  auto statuses = job.Run([&](int r) -> Status {
    auto& b = bufs[static_cast<size_t>(r)];
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(b.data(), b.size()));
    return reduce(r, *region);
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(statuses[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << statuses[static_cast<size_t>(r)].ToString();
  }
  for (int r = 0; r < n; ++r) {
    const auto& b = bufs[static_cast<size_t>(r)];
    EXPECT_EQ(std::memcmp(b.data() + kGuard, expected.data(), expected.size()), 0)
        << "rank " << r << " of " << n << ", " << count << " " << DataTypeName(dtype);
    for (size_t g = 0; g < kGuard; ++g) {
      ASSERT_EQ(b[g], 0xa5) << "rank " << r << " wrote before its buffer";
      ASSERT_EQ(b[kGuard + expected.size() + g], 0xa5) << "rank " << r << " wrote past its buffer";
    }
  }
}

// A ring allreduce of `count` elements on every rank of `job` must give every rank the exact sum
// and leave the guard bytes around its buffer untouched.
inline void CheckRingAllreduce(RingJob& job, DataType dtype, size_t count) {
  CheckAllreduceWith(job, dtype, count, [&](int r, auto& region) {
    return collectives::RingAllreduce(job.comm(r), region, kGuard, count, dtype, job.scratch(r));
  });
}

}  // namespace kolo::testing
