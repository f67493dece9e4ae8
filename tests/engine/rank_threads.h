// Test helper: runs one function per rank on its own thread.
#pragma once

#include <cstddef>
#include <thread>
#include <vector>

#include "engine/common/status.h"

namespace kolo::testing {

// Runs fn(rank) for ranks 0..n-1, each on its own thread, joins them all and returns each rank's
// status (index = rank). fn must be callable concurrently from `n` threads.
template <typename Fn>
std::vector<Status> RunRankThreads(int n, Fn fn) {
  std::vector<Status> out(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { out[static_cast<size_t>(r)] = fn(r); });
  for (auto& t : threads) t.join();
  return out;
}

}  // namespace kolo::testing
