// The parameter-server backend end to end, ranks as threads of one process over an in-memory
// store: after k steps of PushPull every worker holds what an allreduce-average and the same SGD
// give (computed independently in ps_test_util.h), for 2-4 workers, 1-2 servers, both placements;
// worker collectives keep working; misuse and mismatched registrations fail with clear errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "engine/backends/ps/job.h"
#include "engine/bootstrap/store.h"
#include "engine/engine.h"
#include "engine/transport/tcp/pair.h"
#include "engine/transport/tcp/socket.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/ps_test_util.h"

namespace kolo {
namespace {

using testing::PsCompare;
using testing::PsGrad;
using testing::PsInitial;
using testing::PsReference;
using testing::PsSgd;
using testing::PsVariables;

constexpr auto kWait = std::chrono::seconds(60);

Options PsRankOptions(int rank, int size, int servers, const std::string& placement) {
  Options o = testing::RankOptions(rank, size);
  o.backend = "ps";
  o.ps_servers = servers;
  o.ps_placement = placement;
  o.ring_chunk_bytes = 4096;  // many chunks per push: exercises the server's staging
  return o;
}

// Runs a job of size ranks as threads: servers Serve, workers run `worker`. Returns each launch
// rank's status (a server's Serve result, a worker's body result).
std::vector<Status> RunPsJob(int size, const std::function<Options(int)>& options_for,
                             const std::function<Status(Engine&)>& worker,
                             const std::function<void(Engine&)>& after_serve = nullptr) {
  bootstrap::InMemoryStore store;
  std::vector<Status> out(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto engine = Engine::Create(options_for(r), &store);
      if (!engine.ok()) {
        out[static_cast<size_t>(r)] = engine.status();
        return;
      }
      Engine& e = **engine;
      Status s = e.role() == Role::kServer ? e.Serve() : worker(e);
      if (e.role() == Role::kServer && after_serve) after_serve(e);
      const Status down = e.Shutdown();
      out[static_cast<size_t>(r)] = s.ok() ? down : s;
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Trains `steps` steps of the test variables; weights start as PsInitial on worker 0 and as
// garbage elsewhere (the first push carries worker 0's). Pushes go out in a per-worker order.
Status TrainAndCheck(Engine& e, int steps, bool large, DataType push = DataType::kFloat32) {
  const auto vars = PsVariables(large);
  std::vector<std::vector<float>> weights(vars.size()), grads(vars.size());
  for (size_t v = 0; v < vars.size(); ++v) {
    const size_t n = static_cast<size_t>(NumElements(vars[v].shape));
    weights[v].resize(n);
    grads[v].resize(n);
    for (size_t i = 0; i < n; ++i) {
      weights[v][i] = e.rank() == 0 ? PsInitial(static_cast<int>(v), i) : 1e6f;
    }
  }
  KOLO_RETURN_IF_ERROR(e.RegisterVariables(vars));
  std::mt19937 rng(static_cast<unsigned>(e.rank()));
  std::vector<size_t> order(vars.size());
  std::iota(order.begin(), order.end(), 0);
  for (int t = 0; t < steps; ++t) {
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<Handle> handles;
    for (size_t v : order) {
      for (size_t i = 0; i < grads[v].size(); ++i) {
        grads[v][i] = PsGrad(e.rank(), t, static_cast<int>(v), i);
      }
      KOLO_ASSIGN_OR_RETURN(
          Handle h, e.PushPullAsync(vars[v].name, grads[v].data(), weights[v].data(), vars[v].dtype,
                                    vars[v].shape, PsSgd(t)));
      handles.push_back(h);
    }
    for (Handle h : handles) KOLO_RETURN_IF_ERROR(e.Wait(h, kWait));
  }
  const auto want = PsReference(vars, e.size(), steps, push);
  for (size_t v = 0; v < vars.size(); ++v) {
    const std::string diff = PsCompare(vars[v].name, weights[v], want[v]);
    if (!diff.empty()) return Internal("worker {}: {}", e.rank(), diff);
  }
  if (e.stats().ps_updates != static_cast<int64_t>(steps * vars.size())) {
    return Internal("worker {}: {} PushPulls completed, expected {}", e.rank(),
                    e.stats().ps_updates, steps * vars.size());
  }
  // Collectives among the workers still work (as the trainer's broadcast and images/sec sum).
  int32_t rank = e.rank();
  KOLO_ASSIGN_OR_RETURN(
      Handle h, e.AllreduceAsync("rank_sum", &rank, &rank, DataType::kInt32, {1}, ReduceOp::kSum));
  KOLO_RETURN_IF_ERROR(e.Wait(h, kWait));
  if (rank != e.size() * (e.size() - 1) / 2) {
    return Internal("worker {}: allreduce among workers gave {}", e.rank(), rank);
  }
  return e.Barrier();
}

struct PsCase {
  int workers;
  int servers;
  const char* placement;
};

class PsEquivalence : public ::testing::TestWithParam<PsCase> {};

TEST_P(PsEquivalence, WeightsEqualAllreduceAverageAndSgd) {
  const PsCase c = GetParam();
  const int size = c.workers + c.servers;
  std::atomic<int64_t> server_updates{0};
  const auto results = RunPsJob(
      size, [&](int r) { return PsRankOptions(r, size, c.servers, c.placement); },
      [&](Engine& e) -> Status {
        if (e.role() != Role::kWorker || !e.updates_on_servers() || e.size() != c.workers) {
          return Internal("worker: role/size wrong: size {}", e.size());
        }
        return TrainAndCheck(e, 3, /*large=*/true);
      },
      [&](Engine& e) {
        EXPECT_EQ(e.size(), c.servers);
        server_updates += e.stats().ps_updates;
      });
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(results[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << results[static_cast<size_t>(r)].ToString();
  }
  // Every shard is updated once per step: 6 variables, the large one cut in K with split.
  const int shards = 6 + (std::string(c.placement) == "split" ? c.servers - 1 : 0);
  EXPECT_EQ(server_updates.load(), 3 * shards);
}

INSTANTIATE_TEST_SUITE_P(WorkersServersPlacement, PsEquivalence,
                         ::testing::Values(PsCase{2, 1, "greedy"}, PsCase{2, 1, "split"},
                                           PsCase{3, 1, "greedy"}, PsCase{2, 2, "greedy"},
                                           PsCase{2, 2, "split"}, PsCase{3, 2, "split"},
                                           PsCase{4, 1, "split"}, PsCase{4, 2, "greedy"},
                                           PsCase{4, 2, "split"}),
                         [](const auto& info) {
                           return fmt::format("w{}_s{}_{}", info.param.workers, info.param.servers,
                                              info.param.placement);
                         });

// With pacing, every worker's connections to the servers carry the cap (in bytes/s), and nothing
// else does: not the servers' connections, not a worker's to another worker.
TEST(PsEngine, WorkersPaceTheirConnectionsToTheServersOnly) {
  const int size = 4;  // workers 0, 1; servers 2, 3
  bootstrap::InMemoryStore store;
  std::vector<StatusOr<backends::ps::Job>> jobs;
  for (int r = 0; r < size; ++r) jobs.emplace_back(Internal("not joined"));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Options o = PsRankOptions(r, size, 2, "greedy");
      o.transport = "tcp";
      o.ps_pacing_bits_per_s = 800e6;
      jobs[static_cast<size_t>(r)] = backends::ps::Join(o, &store);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    ASSERT_TRUE(jobs[static_cast<size_t>(r)].ok())
        << jobs[static_cast<size_t>(r)].status().ToString();
  }
  for (int r = 0; r < size; ++r) {
    for (int peer = 0; peer < size; ++peer) {
      if (peer == r) continue;
      // The job connects workers to servers and every rank to rank 0, nothing else: the two
      // servers have no pair.
      const bool connected = jobs[static_cast<size_t>(r)]->device->connected(peer);
      EXPECT_EQ(connected, !(r >= 2 && peer >= 2)) << "rank " << r << " to " << peer;
      if (!connected) continue;
      auto& pair =
          dynamic_cast<transport::tcp::TcpPair&>(jobs[static_cast<size_t>(r)]->device->pair(peer));
      auto rate = transport::tcp::MaxPacingRate(pair.fd());
      ASSERT_TRUE(rate.ok()) << rate.status().ToString();
      const bool paced = r < 2 && peer >= 2;
      EXPECT_EQ(*rate, paced ? uint64_t{100000000} : ~uint64_t{0})
          << "rank " << r << " to " << peer;
    }
  }
  // The devices close together, as a job's ranks do.
  threads.clear();
  for (auto& job : jobs) threads.emplace_back([&job] { job = Internal("closed"); });
  for (auto& t : threads) t.join();
}

// Paced pushes train to the same weights.
TEST(PsEngine, PacedPushesGiveTheSameWeights) {
  const int size = 3;
  const auto results = RunPsJob(
      size,
      [&](int r) {
        Options o = PsRankOptions(r, size, 1, "split");
        o.transport = "tcp";
        o.ps_pacing_bits_per_s = 4e9;
        return o;
      },
      [&](Engine& e) { return TrainAndCheck(e, 3, /*large=*/true); });
  for (int r = 0; r < size; ++r) {
    EXPECT_TRUE(results[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << results[static_cast<size_t>(r)].ToString();
  }
}

// Compressed pushes: the servers sum the workers' gradients as rounded to fp16 or bf16 (in float32)
// and train to the reference computed from those rounded gradients, which differs from float32's
// by far more than the comparison's tolerance. The pushes' bytes halve; pulls stay float32.
TEST(PsEngine, CompressedPushesTrainOnTheRoundedGradients) {
  for (const char* compression : {"fp16", "bf16"}) {
    SCOPED_TRACE(compression);
    const DataType push =
        std::string(compression) == "fp16" ? DataType::kFloat16 : DataType::kBFloat16;
    const int size = 4;
    const auto results = RunPsJob(
        size,
        [&](int r) {
          Options o = PsRankOptions(r, size, 2, "split");
          o.compression = compression;
          return o;
        },
        [&](Engine& e) { return TrainAndCheck(e, 3, /*large=*/true, push); });
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(results[static_cast<size_t>(r)].ok())
          << "rank " << r << ": " << results[static_cast<size_t>(r)].ToString();
    }
  }
  // The same gradients checked against float32's reference fail: the rounding is visible.
  const auto vars = testing::PsVariables(true);
  const auto exact = testing::PsReference(vars, 2, 3);
  const auto rounded = testing::PsReference(vars, 2, 3, DataType::kFloat16);
  EXPECT_NE(testing::PsCompare("fc/weight", rounded.back(), exact.back()), "");
}

// A worker's pushes of a 1.2 MB variable: half the bytes with compression.
TEST(PsEngine, CompressedPushesSendHalfTheBytes) {
  std::vector<int64_t> sent(2);
  for (int pass = 0; pass < 2; ++pass) {
    const int size = 2;
    std::vector<int64_t> per_worker(1);
    const auto results = RunPsJob(
        size,
        [&](int r) {
          Options o = PsRankOptions(r, size, 1, "greedy");
          o.compression = pass == 0 ? "none" : "bf16";
          return o;
        },
        [&](Engine& e) -> Status {
          const std::vector<VariableSpec> vars = {{"w", DataType::kFloat32, {300, 1000}}};
          std::vector<float> w(300000, 0.5f), g(300000, 0.25f);
          KOLO_RETURN_IF_ERROR(e.RegisterVariables(vars));
          // The first push also carries the initial weights (float32): count from the second.
          KOLO_ASSIGN_OR_RETURN(Handle h0, e.PushPullAsync("w", g.data(), w.data(),
                                                           DataType::kFloat32, {300, 1000}, {}));
          KOLO_RETURN_IF_ERROR(e.Wait(h0, kWait));
          const int64_t before = e.stats().ps_bytes_sent;
          KOLO_ASSIGN_OR_RETURN(Handle h1, e.PushPullAsync("w", g.data(), w.data(),
                                                           DataType::kFloat32, {300, 1000}, {}));
          KOLO_RETURN_IF_ERROR(e.Wait(h1, kWait));
          per_worker[0] = e.stats().ps_bytes_sent - before;
          return e.Barrier();
        });
    for (int r = 0; r < size; ++r) {
      ASSERT_TRUE(results[static_cast<size_t>(r)].ok())
          << "rank " << r << ": " << results[static_cast<size_t>(r)].ToString();
    }
    sent[static_cast<size_t>(pass)] = per_worker[0];
  }
  EXPECT_GE(sent[0], 1200000);
  EXPECT_LT(sent[0], 1200000 * 1.01);
  EXPECT_GE(sent[1], 600000);
  EXPECT_LT(sent[1], 600000 * 1.01);
}

TEST(PsEngine, ExplicitServerRanksInTheMiddleOfTheJob) {
  // Launch ranks 0..4; ranks 1 and 3 serve. Workers are launch ranks 0, 2, 4 = worker 0, 1, 2.
  const auto results = RunPsJob(
      5,
      [](int r) {
        Options o = PsRankOptions(r, 5, 2, "split");
        o.ps_server_ranks = {3, 1};
        return o;
      },
      [](Engine& e) { return TrainAndCheck(e, 2, /*large=*/true); });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].ToString();
  }
}

TEST(PsEngine, MismatchedRegistrationsFailEveryRankNamingTheWorker) {
  const auto results = RunPsJob(
      3, [](int r) { return PsRankOptions(r, 3, 1, "greedy"); },
      [](Engine& e) -> Status {
        auto vars = PsVariables(false);
        if (e.rank() == 1) vars[0].shape = {16, 3, 3, 4};
        return e.RegisterVariables(vars);
      });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_NE(results[r].message().find("worker 1 (rank 1) registered variables other than "
                                        "worker 0 (rank 0)'s: variable 0: 'conv1/weight'"),
              std::string::npos)
        << "rank " << r << ": " << results[r].ToString();
  }
}

TEST(PsEngine, MisuseIsRejectedAtSubmission) {
  const auto results = RunPsJob(
      3, [](int r) { return PsRankOptions(r, 3, 1, "greedy"); },
      [](Engine& e) -> Status {
        float g[4] = {}, w[4] = {};
        auto early = e.PushPullAsync("a", g, w, DataType::kFloat32, {4}, {});
        EXPECT_EQ(early.status().code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(e.Serve().code(), StatusCode::kFailedPrecondition);
        KOLO_RETURN_IF_ERROR(e.RegisterVariables({{"a", DataType::kFloat32, {4}}}));
        EXPECT_EQ(e.RegisterVariables({{"a", DataType::kFloat32, {4}}}).code(),
                  StatusCode::kFailedPrecondition);
        auto unknown = e.PushPullAsync("b", g, w, DataType::kFloat32, {4}, {});
        EXPECT_NE(unknown.status().message().find("'b': not a registered variable"),
                  std::string::npos);
        auto shape = e.PushPullAsync("a", g, w, DataType::kFloat32, {2, 2}, {});
        EXPECT_NE(shape.status().message().find("got float32 [2,2], but it was registered as "
                                                "float32 [4]"),
                  std::string::npos);
        // The other worker has not pushed yet on worker 1, so "a" is still in flight when pushed
        // again.
        if (e.rank() == 1) {
          KOLO_ASSIGN_OR_RETURN(Handle h, e.PushPullAsync("a", g, w, DataType::kFloat32, {4}, {}));
          auto twice = e.PushPullAsync("a", g, w, DataType::kFloat32, {4}, {});
          EXPECT_NE(twice.status().message().find("already in flight"), std::string::npos)
              << twice.status().ToString();
          KOLO_RETURN_IF_ERROR(e.Barrier());
          return e.Wait(h, kWait);
        }
        KOLO_RETURN_IF_ERROR(e.Barrier());
        KOLO_ASSIGN_OR_RETURN(Handle h, e.PushPullAsync("a", g, w, DataType::kFloat32, {4}, {}));
        return e.Wait(h, kWait);
      },
      [](Engine& e) {
        EXPECT_EQ(e.rank(), 0);
        int x = 0;
        auto a = e.AllreduceAsync("x", &x, &x, DataType::kInt32, {1}, ReduceOp::kSum);
        EXPECT_EQ(a.status().code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(e.RegisterVariables({}).code(), StatusCode::kFailedPrecondition);
        EXPECT_EQ(e.Serve().code(), StatusCode::kFailedPrecondition);  // only once
      });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].ToString();
  }
}

TEST(PsEngine, OtherBackendsHaveNoParameterServers) {
  testing::RunRanks(1, [](int, Engine& e) {
    EXPECT_EQ(e.role(), Role::kWorker);
    EXPECT_FALSE(e.updates_on_servers());
    float g = 0, w = 0;
    EXPECT_EQ(e.PushPullAsync("a", &g, &w, DataType::kFloat32, {1}, {}).status().code(),
              StatusCode::kFailedPrecondition);
    EXPECT_EQ(e.RegisterVariables({}).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(e.Serve().code(), StatusCode::kFailedPrecondition);
  });
}

// Worker 0 leaves right after registering; worker 1 pushes after `delay`. However late the push,
// by when the workers' own engine has heard of worker 0's shutdown, it fails naming worker 0.
void ExpectTheWorkerThatLeftIsNamed(std::chrono::milliseconds delay) {
  const auto results = RunPsJob(
      3, [](int r) { return PsRankOptions(r, 3, 1, "greedy"); },
      [&](Engine& e) -> Status {
        KOLO_RETURN_IF_ERROR(e.RegisterVariables({{"a", DataType::kFloat32, {4}}}));
        if (e.rank() == 0) return Status::OK();  // leaves without pushing
        std::this_thread::sleep_for(delay);
        float g[4] = {}, w[4] = {};
        KOLO_ASSIGN_OR_RETURN(Handle h, e.PushPullAsync("a", g, w, DataType::kFloat32, {4}, {}));
        return e.Wait(h, kWait);
      });
  EXPECT_TRUE(results[0].ok()) << results[0].ToString();
  for (size_t r : {1, 2}) {
    EXPECT_FALSE(results[r].ok()) << "rank " << r;
    EXPECT_NE(results[r].message().find("worker 0 (rank 0)"), std::string::npos)
        << "rank " << r << ": " << results[r].ToString();
  }
}

TEST(PsEngine, AWorkerLeavingMidStepFailsTheOthersNamingIt) {
  ExpectTheWorkerThatLeftIsNamed(std::chrono::milliseconds(0));
}

// The workers' engine (their collectives among themselves) stops when worker 0 shuts down; the
// push still goes to the servers, which know who left.
TEST(PsEngine, APushAfterTheWorkersEngineStoppedStillNamesTheWorkerThatLeft) {
  ExpectTheWorkerThatLeftIsNamed(std::chrono::milliseconds(1000));
}

TEST(PsEngine, AStalledStepFailsAfterTheStallShutdownNamingTheMissingWorker) {
  const auto results = RunPsJob(
      3,
      [](int r) {
        Options o = PsRankOptions(r, 3, 1, "greedy");
        o.stall_shutdown_s = 1;
        return o;
      },
      [](Engine& e) -> Status {
        KOLO_RETURN_IF_ERROR(e.RegisterVariables({{"a", DataType::kFloat32, {4}}}));
        if (e.rank() == 1) {
          // Never pushes, but stays until the server has given up.
          std::this_thread::sleep_for(std::chrono::seconds(4));
          return Status::OK();
        }
        float g[4] = {}, w[4] = {};
        KOLO_ASSIGN_OR_RETURN(Handle h, e.PushPullAsync("a", g, w, DataType::kFloat32, {4}, {}));
        return e.Wait(h, kWait);
      });
  for (size_t r : {0, 2}) {
    EXPECT_NE(results[r].message().find("'a' update 0 stalled for"), std::string::npos)
        << "rank " << r << ": " << results[r].ToString();
    EXPECT_NE(results[r].message().find("not yet by workers [1]"), std::string::npos)
        << "rank " << r << ": " << results[r].ToString();
  }
  EXPECT_FALSE(results[1].ok());  // its Shutdown reports the job's failure
}

TEST(PsEngine, TimelineShowsPushServerWaitUpdateAndPull) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("kolo_ps_timeline_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "t.json").string();
  const auto results = RunPsJob(
      3,
      [&](int r) {
        Options o = PsRankOptions(r, 3, 1, "greedy");
        o.timeline_path = path;
        return o;
      },
      [](Engine& e) { return TrainAndCheck(e, 1, /*large=*/false); });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].ToString();
  }
  auto read = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const std::string worker = read(path);
  const std::string server = read((dir / "t.rank2.json").string());  // server 0 = rank W + 0
  for (const char* phase : {"PS_PUSH", "PS_PULL"}) {
    EXPECT_NE(worker.find(phase), std::string::npos) << phase;
  }
  for (const char* phase : {"PS_SERVER_WAIT", "PS_UPDATE"}) {
    EXPECT_NE(server.find(phase), std::string::npos) << phase;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kolo
