// A rank of a test job: repeated allreduces with a check of every result, and on request a death
// by SIGKILL in the middle of one. Driven by tests/engine/fault_test.cc.
//
//   kolo_engine_probe COUNT ITERS DIE_RANK DIE_ITER
// Exits 0 when every allreduce was correct; 1 with "rank R: FAILED: <status>" otherwise.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "engine/engine.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s COUNT ITERS DIE_RANK DIE_ITER\n", argv[0]);
    return 2;
  }
  const size_t count = std::strtoull(argv[1], nullptr, 10);
  const int iters = std::atoi(argv[2]);
  const int die_rank = std::atoi(argv[3]);
  const int die_iter = std::atoi(argv[4]);
  auto options = kolo::OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "FAILED: %s\n", options.status().ToString().c_str());
    return 1;
  }
  auto engine = kolo::Engine::Create(*options);
  if (!engine.ok()) {
    std::fprintf(stderr, "rank %d: FAILED: %s\n", options->rank,
                 engine.status().ToString().c_str());
    return 1;
  }
  kolo::Engine& e = **engine;
  std::vector<float> buf(count);
  for (int it = 0; it < iters; ++it) {
    std::fill(buf.begin(), buf.end(), 1.0f);
    auto h = e.AllreduceAsync("probe", buf.data(), buf.data(), kolo::DataType::kFloat32,
                              {static_cast<int64_t>(count)}, kolo::ReduceOp::kSum);
    if (e.rank() == die_rank && it == die_iter) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      raise(SIGKILL);
    }
    kolo::Status s = h.ok() ? e.Wait(*h) : h.status();
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: FAILED: %s\n", e.rank(), s.ToString().c_str());
      return 1;
    }
    if (count > 0 && buf[count - 1] != static_cast<float>(e.size())) {
      std::fprintf(stderr, "rank %d: FAILED: wrong result %f\n", e.rank(), buf[count - 1]);
      return 1;
    }
  }
  kolo::Status s = e.Shutdown();
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: FAILED: %s\n", e.rank(), s.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "rank %d: ok\n", e.rank());
  return 0;
}
