// Helpers for in-process multi-rank engine tests: N ranks as threads sharing an InMemoryStore.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/common/dtype.h"
#include "engine/engine.h"

namespace kolo::testing {

inline Options RankOptions(int rank, int size) {
  Options o;
  o.rank = rank;
  o.size = size;
  o.local_rank = rank;
  o.local_size = size;
  o.job_secret = "0123456789abcdef0123456789abcdef";
  o.peer_timeout_s = 20;
  return o;
}

// Runs body(rank, engine) on `size` threads, each with its own Engine created from
// options_for(rank) over one shared store. Failures inside body are recorded by gtest, and so is
// an engine whose Shutdown reports an error, unless `clean_shutdown` is false (a job that ends
// in a fatal error, such as a stall past the shutdown time).
inline void RunRanks(int size, const std::function<Options(int)>& options_for,
                     const std::function<void(int, Engine&)>& body, bool clean_shutdown = true) {
  bootstrap::InMemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto engine = Engine::Create(options_for(r), &store);
      ASSERT_TRUE(engine.ok()) << "rank " << r << ": " << engine.status().ToString();
      body(r, **engine);
      Status s = (*engine)->Shutdown();
      if (clean_shutdown) {
        EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s.ToString();
      }
    });
  }
  for (auto& t : threads) t.join();
}

inline void RunRanks(int size, const std::function<void(int, Engine&)>& body) {
  RunRanks(
      size, [size](int r) { return RankOptions(r, size); }, body);
}

// Creates `size` engines at once, rank r from options_for(r), over one store, and returns each
// rank's Engine::Create status (the engines themselves are destroyed): for start-up refusals.
inline std::vector<Status> CreateStatuses(int size,
                                          const std::function<Options(int)>& options_for) {
  bootstrap::InMemoryStore store;
  std::vector<Status> results(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      results[static_cast<size_t>(r)] = Engine::Create(options_for(r), &store).status();
    });
  }
  for (auto& t : threads) t.join();
  return results;
}

// Value element i of rank r's input holds (as a double): small integers, exact in every dtype
// (sums over up to 8 ranks stay below 256 for uint8 and are exact in float16/bfloat16).
inline double InputValue(int rank, size_t i) {
  return static_cast<double>((i * 7 + rank * 3) % 29);
}

inline std::vector<uint8_t> MakeInput(DataType dtype, size_t count, int rank) {
  std::vector<uint8_t> buf(count * DataTypeSize(dtype) + 1);
  for (size_t i = 0; i < count; ++i) StoreElement(dtype, buf.data(), i, InputValue(rank, i));
  return buf;
}

// The expected sum over `size` ranks of element i.
inline double ExpectedSum(int size, size_t i) {
  double s = 0;
  for (int r = 0; r < size; ++r) s += InputValue(r, i);
  return s;
}

}  // namespace kolo::testing
