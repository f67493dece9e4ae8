// A rank of a parameter-server test job (backend "ps" from the environment, as kolo-run or
// mpirun launch it). Workers train the test variables of tests/engine/ps_test_util.h and check
// the weights against the independent reference; servers serve. On request one rank dies by
// SIGKILL: a worker right after submitting a step's pushes, a server some time into Serve.
//
//   kolo_ps_probe STEPS LARGE DIE_RANK DIE_AT STEP_SLEEP_MS
//     STEPS          training steps
//     LARGE          1: include the 1.2 MB variable (cut by split placement)
//     DIE_RANK       launch rank that dies (-1: none)
//     DIE_AT         a worker: the step after whose pushes it dies; a server: milliseconds
//     STEP_SLEEP_MS  pause between a worker's steps
// Exits 0 with "rank R: ok" when everything was correct; 1 with "rank R: FAILED: <status>".
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "tests/engine/ps_test_util.h"

namespace {

using namespace kolo;  // NOLINT: a small test program

Status RunWorker(Engine& e, int launch_rank, int steps, bool large, int die_rank, int die_at,
                 int sleep_ms) {
  const auto vars = testing::PsVariables(large);
  std::vector<std::vector<float>> weights(vars.size()), grads(vars.size());
  for (size_t v = 0; v < vars.size(); ++v) {
    const size_t n = static_cast<size_t>(NumElements(vars[v].shape));
    weights[v].assign(n, 0.0f);
    grads[v].assign(n, 0.0f);
    if (e.rank() == 0) {
      for (size_t i = 0; i < n; ++i) weights[v][i] = testing::PsInitial(static_cast<int>(v), i);
    }
  }
  // As the trainer does: worker 0's initial weights to every worker, among the workers only.
  for (size_t v = 0; v < vars.size(); ++v) {
    KOLO_ASSIGN_OR_RETURN(Handle h, e.BroadcastAsync("init/" + vars[v].name, weights[v].data(),
                                                     vars[v].dtype, vars[v].shape, 0));
    KOLO_RETURN_IF_ERROR(e.Wait(h, std::chrono::seconds(60)));
  }
  KOLO_RETURN_IF_ERROR(e.RegisterVariables(vars));
  for (int t = 0; t < steps; ++t) {
    std::vector<Handle> handles;
    // Backprop order: last variable first.
    for (size_t k = vars.size(); k-- > 0;) {
      for (size_t i = 0; i < grads[k].size(); ++i) {
        grads[k][i] = testing::PsGrad(e.rank(), t, static_cast<int>(k), i);
      }
      KOLO_ASSIGN_OR_RETURN(
          Handle h, e.PushPullAsync(vars[k].name, grads[k].data(), weights[k].data(), vars[k].dtype,
                                    vars[k].shape, testing::PsSgd(t)));
      handles.push_back(h);
    }
    if (launch_rank == die_rank && t == die_at) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      raise(SIGKILL);
    }
    for (Handle h : handles) KOLO_RETURN_IF_ERROR(e.Wait(h, std::chrono::seconds(60)));
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  const auto want = testing::PsReference(vars, e.size(), steps);
  for (size_t v = 0; v < vars.size(); ++v) {
    const std::string diff = testing::PsCompare(vars[v].name, weights[v], want[v]);
    if (!diff.empty()) return Internal("{}", diff);
  }
  float one = 1.0f;
  KOLO_ASSIGN_OR_RETURN(
      Handle h, e.AllreduceAsync("workers", &one, &one, DataType::kFloat32, {1}, ReduceOp::kSum));
  KOLO_RETURN_IF_ERROR(e.Wait(h, std::chrono::seconds(60)));
  if (one != static_cast<float>(e.size())) {
    return Internal("allreduce among {} workers gave {}", e.size(), one);
  }
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s STEPS LARGE DIE_RANK DIE_AT STEP_SLEEP_MS\n", argv[0]);
    return 2;
  }
  const int steps = std::atoi(argv[1]);
  const bool large = std::atoi(argv[2]) != 0;
  const int die_rank = std::atoi(argv[3]);
  const int die_at = std::atoi(argv[4]);
  const int sleep_ms = std::atoi(argv[5]);
  auto options = OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "FAILED: %s\n", options.status().ToString().c_str());
    return 1;
  }
  const int launch_rank = options->rank;
  auto engine = Engine::Create(*options);
  if (!engine.ok()) {
    std::fprintf(stderr, "rank %d: FAILED: %s\n", launch_rank, engine.status().ToString().c_str());
    return 1;
  }
  Engine& e = **engine;
  Status s;
  if (e.role() == Role::kServer) {
    if (launch_rank == die_rank) {
      std::thread([die_at] {
        std::this_thread::sleep_for(std::chrono::milliseconds(die_at));
        raise(SIGKILL);
      }).detach();
    }
    s = e.Serve();
  } else {
    s = RunWorker(e, launch_rank, steps, large, die_rank, die_at, sleep_ms);
  }
  const Status down = e.Shutdown();
  if (s.ok()) s = down;
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: FAILED: %s\n", launch_rank, s.ToString().c_str());
    return 1;
  }
  std::fprintf(stderr, "rank %d: ok\n", launch_rank);
  return 0;
}
