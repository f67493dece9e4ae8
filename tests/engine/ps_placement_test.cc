// Parameter-server placement arithmetic, the wire registration, and the settings that select a
// parameter-server job (options, environment, flags, role mapping).
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/backends/ps/job.h"
#include "engine/backends/ps/placement.h"
#include "engine/backends/ps/sgd.h"
#include "engine/backends/ps/wire.h"
#include "engine/common/flags.h"
#include "engine/common/options.h"

namespace kolo::backends::ps {
namespace {

VariableSpec Var(const std::string& name, Shape shape) {
  return VariableSpec{name, DataType::kFloat32, std::move(shape)};
}

TEST(PsPlacement, GreedyGivesEachWholeTensorToTheLeastLoadedServerInCreationOrder) {
  // Bytes: 400, 100, 100, 200, 40, 400.
  const std::vector<VariableSpec> vars = {Var("a", {100}), Var("b", {25}), Var("c", {25}),
                                          Var("d", {50}),  Var("e", {10}), Var("f", {100})};
  const Placement p = Place(vars, 2, PlacementPolicy::kGreedy);
  ASSERT_EQ(p.shards.size(), vars.size());
  // a -> 0 (0,0 tie: lowest); b -> 1 (400,0); c -> 1 (400,100); d -> 1 (400,200);
  // e -> 0 (400,400 tie); f -> 1 (440,400).
  const std::vector<int> expected = {0, 1, 1, 1, 0, 1};
  for (size_t v = 0; v < vars.size(); ++v) {
    ASSERT_EQ(p.variable_shards[v].size(), 1u) << vars[v].name;
    const Shard& s = p.shards[static_cast<size_t>(p.variable_shards[v][0])];
    EXPECT_EQ(s.server, expected[v]) << vars[v].name;
    EXPECT_EQ(s.begin, 0);
    EXPECT_EQ(s.count, NumElements(vars[v].shape));
  }
  EXPECT_EQ(p.bytes_per_server, (std::vector<int64_t>{440, 800}));
  EXPECT_EQ(p.server_shards[0], (std::vector<int>{0, 4}));
}

TEST(PsPlacement, GreedyNeverSplitsEvenAHugeTensor) {
  const std::vector<VariableSpec> vars = {Var("fc6", {25088, 4096}), Var("b", {4096})};
  const Placement p = Place(vars, 4, PlacementPolicy::kGreedy);
  EXPECT_EQ(p.shards.size(), 2u);
  EXPECT_EQ(p.bytes_per_server[0], int64_t{25088} * 4096 * 4);
  EXPECT_EQ(p.bytes_per_server[1], 4096 * 4);
  EXPECT_EQ(p.bytes_per_server[2], 0);
}

TEST(PsPlacement, SplitCutsLargeTensorsEvenlyAndPlacesSmallOnesGreedily) {
  // 1000003 elements: not a multiple of 3, pieces differ by at most one element.
  const std::vector<VariableSpec> vars = {Var("small", {100}), Var("big", {1000003}),
                                          Var("tiny", {3})};
  const Placement p = Place(vars, 3, PlacementPolicy::kSplit);
  ASSERT_EQ(p.variable_shards[1].size(), 3u);
  int64_t next = 0;
  std::vector<int> servers;
  for (int id : p.variable_shards[1]) {
    const Shard& s = p.shards[static_cast<size_t>(id)];
    EXPECT_EQ(s.begin, next);
    EXPECT_GE(s.count, 1000003 / 3);
    EXPECT_LE(s.count, 1000003 / 3 + 1);
    EXPECT_EQ(s.bytes, s.count * 4);
    next += s.count;
    servers.push_back(s.server);
  }
  EXPECT_EQ(next, 1000003);
  EXPECT_EQ(servers, (std::vector<int>{0, 1, 2}));
  // small -> 0; big's pieces everywhere; tiny -> the least loaded: 1 or 2 (0 holds small too).
  const Shard& tiny = p.shards[static_cast<size_t>(p.variable_shards[2][0])];
  EXPECT_NE(tiny.server, 0);
  const int64_t total =
      std::accumulate(p.bytes_per_server.begin(), p.bytes_per_server.end(), int64_t{0});
  EXPECT_EQ(total, (100 + 1000003 + 3) * 4);
}

TEST(PsPlacement, SplitThresholdAndFewElements) {
  // Below the threshold: whole. A "large" tensor with fewer elements than servers: one piece
  // per element, on the least-loaded servers.
  const std::vector<VariableSpec> vars = {Var("a", {10}), Var("b", {2})};
  const Placement p = Place(vars, 4, PlacementPolicy::kSplit, /*split_min_bytes=*/8);
  ASSERT_EQ(p.variable_shards[0].size(), 4u);
  ASSERT_EQ(p.variable_shards[1].size(), 2u);
  std::vector<int64_t> counts;
  for (int id : p.variable_shards[0]) counts.push_back(p.shards[static_cast<size_t>(id)].count);
  EXPECT_EQ(counts, (std::vector<int64_t>{2, 3, 2, 3}));
  // After a: bytes 8,12,8,12 -> b's two pieces go to servers 0 and 2.
  EXPECT_EQ(p.shards[static_cast<size_t>(p.variable_shards[1][0])].server, 0);
  EXPECT_EQ(p.shards[static_cast<size_t>(p.variable_shards[1][1])].server, 2);
  const Placement whole = Place(vars, 4, PlacementPolicy::kSplit, /*split_min_bytes=*/41);
  EXPECT_EQ(whole.shards.size(), 2u);
}

TEST(PsPlacement, EmptyTensorsAndScalarsGetOneShard) {
  const std::vector<VariableSpec> vars = {Var("e", {0, 5}), Var("s", {})};
  for (auto policy : {PlacementPolicy::kGreedy, PlacementPolicy::kSplit}) {
    const Placement p = Place(vars, 2, policy, 1);
    ASSERT_EQ(p.shards.size(), 2u);
    EXPECT_EQ(p.shards[0].count, 0);
    EXPECT_EQ(p.shards[1].count, 1);
  }
}

TEST(PsPlacement, PolicyNames) {
  EXPECT_EQ(*ParsePlacementPolicy("greedy"), PlacementPolicy::kGreedy);
  EXPECT_EQ(*ParsePlacementPolicy("split"), PlacementPolicy::kSplit);
  auto bad = ParsePlacementPolicy("roundrobin");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'roundrobin'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("greedy, split"), std::string::npos);
}

TEST(PsSgd, MatchesTorchSgdWithMomentumAndClearsTheSum) {
  std::vector<float> w = {1.0f, -2.0f}, v = {0.5f, 0.0f}, sum = {4.0f, -2.0f};
  SgdSettings s{0.1, 0.9, 0.01, 0.5};
  ApplySgd(w.data(), v.data(), sum.data(), 2, 2, s);
  // g = sum / 2 * 0.5 + 0.01 * w; v = 0.9 v + g; w -= 0.1 v.
  const double g0 = 4.0 / 2 * 0.5 + 0.01 * 1.0, v0 = 0.9 * 0.5 + g0;
  const double g1 = -2.0 / 2 * 0.5 + 0.01 * -2.0, v1 = g1;
  EXPECT_NEAR(v[0], v0, 1e-6);
  EXPECT_NEAR(v[1], v1, 1e-6);
  EXPECT_NEAR(w[0], 1.0 - 0.1 * v0, 1e-6);
  EXPECT_NEAR(w[1], -2.0 - 0.1 * v1, 1e-6);
  EXPECT_EQ(sum, (std::vector<float>{0.0f, 0.0f}));
}

TEST(PsWire, RegistrationRoundTripsAndDifferencesAreNamed) {
  Registration r;
  r.servers = 2;
  r.policy = PlacementPolicy::kSplit;
  r.chunk_bytes = 1 << 20;
  r.vars = {Var("a", {3, 4}), Var("b", {})};
  auto parsed = ParseRegistration(SerializeRegistration(r));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(DescribeDifference(r, *parsed), "");
  Registration other = r;
  other.vars[0].shape = {4, 3};
  EXPECT_EQ(DescribeDifference(r, other), "variable 0: 'a' float32 [3,4] vs 'a' float32 [4,3]");
  other = r;
  other.vars.pop_back();
  EXPECT_EQ(DescribeDifference(r, other), "2 vs 1 variables");
  EXPECT_FALSE(ParseRegistration({'{', 'x'}).ok());
}

TEST(PsWire, RegistrationRejectsWhatServersCannotUpdate) {
  Registration r;
  r.servers = 1;
  r.chunk_bytes = 4096;
  r.vars = {Var("a", {3}), Var("a", {4})};
  EXPECT_NE(ValidateRegistration(r).message().find("'a' is registered twice"), std::string::npos);
  r.vars = {VariableSpec{"h", DataType::kFloat16, {8}}};
  EXPECT_NE(ValidateRegistration(r).message().find("float32 variables only"), std::string::npos);
  r.vars = {Var("", {1})};
  EXPECT_FALSE(ValidateRegistration(r).ok());
  r.vars = {Var("n", {-1})};
  EXPECT_NE(ValidateRegistration(r).message().find("negative"), std::string::npos);
}

Options PsOptions(int size, int servers) {
  Options o;
  o.size = size;
  o.local_size = size;
  o.backend = "ps";
  o.ps_servers = servers;
  return o;
}

TEST(PsRoles, DefaultServersAreTheLastRanks) {
  const Roles r = AssignRoles(PsOptions(6, 2));
  EXPECT_EQ(r.server_ranks, (std::vector<int>{4, 5}));
  EXPECT_EQ(r.worker_ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(r.Describe(5), "server 1 (rank 5)");
  EXPECT_EQ(r.Describe(2), "worker 2 (rank 2)");
}

TEST(PsRoles, ExplicitServerRanksInTheOrderGiven) {
  Options o = PsOptions(8, 2);
  o.ps_server_ranks = {7, 3};
  const Roles r = AssignRoles(o);
  EXPECT_EQ(r.server_ranks, (std::vector<int>{7, 3}));
  EXPECT_EQ(r.worker_ranks, (std::vector<int>{0, 1, 2, 4, 5, 6}));
  EXPECT_EQ(r.Describe(3), "server 1 (rank 3)");
  EXPECT_EQ(r.Describe(4), "worker 3 (rank 4)");
}

// A worker connects to the servers and rank 0 (start-up's gather), a server to the workers and
// rank 0, never worker to worker or server to server beyond that; beyond 16 ranks the gather's
// tree partners instead of rank 0. Symmetric, so that every transport's set-up pairs up.
TEST(PsConnections, WorkersMeetServersAndTheGatherOnly) {
  for (int size : {3, 6, 10, 17, 40}) {
    for (int servers : {1, 2, 4}) {
      if (servers >= size) continue;
      const Roles r = AssignRoles(PsOptions(size, servers));
      std::vector<std::vector<int>> plan(static_cast<size_t>(size));
      for (int a = 0; a < size; ++a) plan[a] = PlanJobConnections(a, r, 16);
      for (int a = 0; a < size; ++a) {
        for (int b : plan[a]) {
          ASSERT_NE(a, b);
          const auto& theirs = plan[static_cast<size_t>(b)];
          EXPECT_TRUE(std::count(theirs.begin(), theirs.end(), a)) << a << " -> " << b;
        }
        const bool worker = r.role[a] == Role::kWorker;
        for (int b = 0; b < size; ++b) {
          if (b == a) continue;
          const bool listed = std::count(plan[a].begin(), plan[a].end(), b) > 0;
          // Every worker-server pair is connected.
          if (worker != (r.role[b] == Role::kWorker)) {
            EXPECT_TRUE(listed) << a << " " << b;
          }
        }
        if (worker && a != 0) {
          const size_t bound = static_cast<size_t>(servers) +
                               (size <= 16 ? 1 : static_cast<size_t>(std::ceil(std::log2(size))));
          EXPECT_LE(plan[a].size(), bound) << "worker rank " << a << " of " << size;
        }
      }
      // Rank 0 reaches every rank in one hop up to 16 ranks.
      if (size <= 16) {
        EXPECT_EQ(plan[0].size(), static_cast<size_t>(size - 1));
      }
    }
  }
}

void ExpectInvalid(const Options& o, const std::string& fragment) {
  const Status s = o.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << fragment;
  EXPECT_NE(s.message().find(fragment), std::string::npos) << s.message();
}

TEST(PsSettings, BadSettingsFailWithTheValueAndWhatIsAllowed) {
  EXPECT_TRUE(PsOptions(4, 3).Validate().ok());
  ExpectInvalid(PsOptions(4, 4), "allowed are 1 to size - 1 = 3 servers");
  ExpectInvalid(PsOptions(4, 0), "4 rank(s)");
  ExpectInvalid(PsOptions(1, 1), "needs at least one server and one worker");
  Options dup = PsOptions(4, 2);
  dup.ps_server_ranks = {3, 3};
  ExpectInvalid(dup, "parameter-server rank 3 is listed twice");
  Options range = PsOptions(4, 2);
  range.ps_server_ranks = {1, 4};
  ExpectInvalid(range, "parameter-server rank 4 is outside [0, 4)");
  Options count = PsOptions(4, 1);
  count.ps_server_ranks = {1, 2};
  ExpectInvalid(count, "names 2 rank(s) but 1 server(s)");
  Options placement = PsOptions(4, 1);
  placement.ps_placement = "random";
  ExpectInvalid(placement, "placement 'random' is unknown: allowed are greedy, split");
  Options backend = PsOptions(4, 1);
  backend.backend = "parameter-server";
  ExpectInvalid(backend, "allowed are ring, mpi, ps");
}

TEST(PsSettings, FromTheEnvironment) {
  auto o = OptionsFromEnvironment({{"KOLO_SIZE", "5"},
                                   {"KOLO_RANK", "0"},
                                   {"KOLO_BACKEND", "ps"},
                                   {"KOLO_PS_SERVER_RANKS", "4,0"},
                                   {"KOLO_PS_PLACEMENT", "split"}});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->ps_servers, 2);
  EXPECT_EQ(o->ps_server_ranks, (std::vector<int>{4, 0}));
  EXPECT_EQ(o->ps_placement, "split");
  EXPECT_TRUE(UnknownKoloVariables({{"KOLO_PS_SERVERS", "1"}}).empty());

  auto too_many = OptionsFromEnvironment(
      {{"KOLO_SIZE", "3"}, {"KOLO_RANK", "0"}, {"KOLO_BACKEND", "ps"}, {"KOLO_PS_SERVERS", "3"}});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("3 parameter server(s) in a job of 3"),
            std::string::npos);
  auto garbage = OptionsFromEnvironment({{"KOLO_SIZE", "3"},
                                         {"KOLO_RANK", "0"},
                                         {"KOLO_BACKEND", "ps"},
                                         {"KOLO_PS_SERVER_RANKS", "2,x"}});
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("item 'x' is not a rank"), std::string::npos);
}

// Parses `args` (after the program name) as engine flags and applies them to `o`.
Status ApplyFlags(std::vector<const char*> args, Options* o) {
  CLI::App app;
  EngineFlags flags;
  flags.Add(app);
  args.insert(args.begin(), "prog");
  app.parse(static_cast<int>(args.size()), const_cast<char**>(args.data()));
  return flags.Apply(o);
}

TEST(PsSettings, FromFlags) {
  Options o = PsOptions(4, 1);
  o.backend = "ring";
  ASSERT_TRUE(ApplyFlags({"--backend", "ps", "--ps-server-ranks", "1,2", "--ps-placement", "split",
                          "--ps-pacing", "1.5gbit"},
                         &o)
                  .ok());
  EXPECT_EQ(o.ps_servers, 2);
  EXPECT_EQ(o.ps_server_ranks, (std::vector<int>{1, 2}));
  EXPECT_EQ(o.ps_placement, "split");
  EXPECT_EQ(o.ps_pacing_bits_per_s, 1.5e9);

  Options o2 = PsOptions(4, 1);
  const Status s = ApplyFlags({"--backend", "ps", "--ps-servers", "4"}, &o2);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("4 parameter server(s)"), std::string::npos) << s.message();

  Options o3 = PsOptions(4, 1);
  const Status s3 = ApplyFlags({"--backend", "ps", "--ps-pacing", "fast"}, &o3);
  EXPECT_EQ(s3.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s3.message().find("--ps-pacing='fast' is not a rate"), std::string::npos)
      << s3.message();
}

}  // namespace
}  // namespace kolo::backends::ps
