// kolo-test-needs: IBVERBS
// The RDMA transport (engine/transport/rdma) beyond the transport contract
// (transport_contract_test.cc runs that over rdma too): the collectives, the engine (negotiation,
// fusion, the parameter server) over it, device selection, the registration cache, set-up
// authentication, and every fault a transport must survive. Ranks are threads of this process.
//
// Each case runs over the software verbs device ("SoftVerbs" in the names: it proves kolo's
// protocol logic, ordering, flow control and teardown, not RDMA performance; no QP, MR, CQ,
// channel, PD or context may outlive a case), and again over every real device libibverbs finds
// ("Libibverbs"), skipped with the reason where there is none. Fault injection needs the software
// device.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/collectives/collectives.h"
#include "engine/common/dtype.h"
#include "engine/engine.h"
#include "engine/transport/rdma/device.h"
#include "engine/transport/rdma/soft/soft_verbs.h"
#include "engine/transport/rdma/verbs.h"
#include "tests/engine/engine_test_util.h"
#include "tests/engine/ps_test_util.h"
#include "tests/engine/ring_test_util.h"
#include "tests/engine/transport_test_util.h"

namespace kolo {
namespace {

using collectives::Comm;
using collectives::Scratch;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Why real devices cannot be tested here, or "" when libibverbs lists some.
std::string NoRealDevice() {
  auto table = transport::rdma::LoadLibibverbs();
  if (!table.ok()) return "no real RDMA device to test: " + table.status().ToString();
  auto names = transport::rdma::DeviceNames(**table);
  if (!names.ok()) return "no real RDMA device to test: " + names.status().ToString();
  if (names->empty()) return "no real RDMA device to test: libibverbs lists none";
  return "";
}

void ExpectNothingLeft() {
  const transport::rdma::soft::Live live = transport::rdma::soft::LiveObjects();
  EXPECT_EQ(live.qps, 0) << "leaked queue pairs";
  EXPECT_EQ(live.mrs, 0) << "leaked memory regions";
  EXPECT_EQ(live.cqs, 0) << "leaked completion queues";
  EXPECT_EQ(live.channels, 0) << "leaked completion channels";
  EXPECT_EQ(live.pds, 0) << "leaked protection domains";
  EXPECT_EQ(live.contexts, 0) << "leaked device contexts";
}

// Parameterized by the verbs table: "soft" or "libibverbs".
class RdmaTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (soft()) {
      transport::rdma::soft::SetDeviceCount(1);
    } else if (const std::string why = NoRealDevice(); !why.empty()) {
      GTEST_SKIP() << why;
    }
  }
  void TearDown() override {
    if (soft()) {
      ExpectNothingLeft();
      transport::rdma::soft::SetDeviceCount(1);
    }
  }
  bool soft() const { return std::string(GetParam()) == "soft"; }
  transport::ConnectSettings Settings(milliseconds timeout = milliseconds(20000)) const {
    transport::ConnectSettings s = kolo::testing::TestSettings(timeout);
    s.ib_verbs = GetParam();
    return s;
  }
};

std::string VerbsName(const ::testing::TestParamInfo<const char*>& info) {
  return std::string(info.param) == "soft" ? "SoftVerbs" : "Libibverbs";
}

// n ranks connected over rdma, with the collectives' per-rank state.
class Job : public kolo::testing::RingJob {
 public:
  Job(int n, const transport::ConnectSettings& settings, size_t chunk_bytes,
      milliseconds timeout = milliseconds(30000))
      : RingJob(n, "rdma", settings, chunk_bytes, timeout) {}
};

void CheckAllreduce(Job& job, DataType dtype, size_t count) {
  kolo::testing::CheckRingAllreduce(job, dtype, count);
}

// --- Collectives.

class RdmaRingAllreduce : public ::testing::TestWithParam<std::tuple<const char*, int, DataType>> {
 protected:
  void SetUp() override {
    if (!soft()) {
      if (const std::string why = NoRealDevice(); !why.empty()) GTEST_SKIP() << why;
    }
  }
  void TearDown() override {
    if (soft()) ExpectNothingLeft();
  }
  bool soft() const { return std::string(std::get<0>(GetParam())) == "soft"; }
};

TEST_P(RdmaRingAllreduce, MatchesReferenceSum) {
  const auto [verbs, n, dtype] = GetParam();
  transport::ConnectSettings s = kolo::testing::TestSettings();
  s.ib_verbs = verbs;
  Job job(n, s, 64 << 10);
  ASSERT_TRUE(job.ok());
  if (n > 1) {
    // The collectives' scratch path takes over: bytes land in memory directly.
    EXPECT_FALSE(job.device(0).pair(1).CanAccumulate());
  }
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, static_cast<size_t>(n - 1),
                       static_cast<size_t>(n + 1), size_t{1000003}}) {
    SCOPED_TRACE(::testing::Message() << "count " << count);
    CheckAllreduce(job, dtype, count);
  }
}

INSTANTIATE_TEST_SUITE_P(RanksByDtype, RdmaRingAllreduce,
                         ::testing::Combine(::testing::Values("soft", "libibverbs"),
                                            ::testing::Range(1, 9),
                                            ::testing::ValuesIn(AllDataTypes())),
                         [](const auto& info) {
                           return std::string(std::string(std::get<0>(info.param)) == "soft"
                                                  ? "SoftVerbs"
                                                  : "Libibverbs") +
                                  "_np" + std::to_string(std::get<1>(info.param)) + "_" +
                                  DataTypeName(std::get<2>(info.param));
                         });

// 64 MiB at the engine's default chunk, and sizes between, up to 8 ranks.
TEST_P(RdmaTest, RingAllreduceUpToSixtyFourMiB) {
  for (int n : {2, 3, 8}) {
    SCOPED_TRACE(::testing::Message() << n << " ranks");
    Job job(n, Settings(), 512 << 10);
    ASSERT_TRUE(job.ok());
    for (size_t bytes : {size_t{4} << 10, size_t{33} << 10, size_t{1} << 20, size_t{64} << 20}) {
      SCOPED_TRACE(::testing::Message() << bytes << " bytes");
      CheckAllreduce(job, DataType::kFloat32, bytes / 4);
    }
  }
}

TEST_P(RdmaTest, BroadcastAndAllgatherFromEveryRank) {
  Job job(5, Settings(), 4096);
  ASSERT_TRUE(job.ok());
  for (size_t bytes : {size_t{0}, size_t{100003}, size_t{3} << 20}) {
    for (int root = 0; root < 5; ++root) {
      std::vector<std::vector<uint8_t>> bufs(5, std::vector<uint8_t>(bytes, 0));
      bufs[static_cast<size_t>(root)] = kolo::testing::Pattern(bytes, static_cast<uint32_t>(root));
      auto statuses = job.Run([&](int r) -> Status {
        KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), bytes));
        return collectives::RingBroadcast(job.comm(r), *region, 0, bytes, root);
      });
      for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
      for (int r = 0; r < 5; ++r) EXPECT_TRUE(bufs[r] == bufs[root]) << "root " << root;
    }
  }
  std::vector<size_t> per_rank = {10, 0, 70001, 3, 1 << 20};
  size_t total = 0;
  for (size_t b : per_rank) total += b;
  std::vector<std::vector<uint8_t>> bufs(5, std::vector<uint8_t>(total, 0));
  std::vector<uint8_t> want(total);
  for (size_t r = 0, at = 0; r < 5; at += per_rank[r], ++r) {
    const auto mine = kolo::testing::Pattern(per_rank[r], static_cast<uint32_t>(r + 9));
    std::copy(mine.begin(), mine.end(), want.begin() + static_cast<ptrdiff_t>(at));
    std::copy(mine.begin(), mine.end(), bufs[r].begin() + static_cast<ptrdiff_t>(at));
  }
  auto statuses = job.Run([&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), total));
    return collectives::RingAllgatherv(job.comm(r), *region, 0, per_rank);
  });
  for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  for (int r = 0; r < 5; ++r) EXPECT_TRUE(bufs[r] == want) << "rank " << r;
}

// --- The engine over rdma: negotiation (and its bit-vector exchange), fusion, the ring, the
// parameter server.

Options RdmaRankOptions(int rank, int size, const char* verbs) {
  Options o = kolo::testing::RankOptions(rank, size);
  o.transport = "rdma";
  o.ib_verbs = verbs;
  return o;
}

TEST_P(RdmaTest, EngineNegotiatesFusesAllreducesAndBroadcasts) {
  constexpr int kRanks = 4;
  const char* verbs = GetParam();
  kolo::testing::RunRanks(
      kRanks, [&](int r) { return RdmaRankOptions(r, kRanks, verbs); },
      [&](int r, Engine& e) {
        // Many tensors at once, submitted in a different order on each rank: negotiation agrees
        // on them and fusion packs them.
        constexpr int kTensors = 24;
        std::vector<std::vector<float>> in(kTensors), out(kTensors);
        std::vector<Handle> handles;
        std::vector<int> order(kTensors);
        for (int t = 0; t < kTensors; ++t) order[t] = (t * 7 + r * 5) % kTensors;
        for (int t : order) {
          const size_t n = static_cast<size_t>(1 + t * 997);
          in[t].resize(n);
          out[t].resize(n);
          for (size_t i = 0; i < n; ++i) {
            in[t][i] = static_cast<float>(kolo::testing::InputValue(r, i + t));
          }
          auto h = e.AllreduceAsync(fmt::format("grad{}", t), in[t].data(), out[t].data(),
                                    DataType::kFloat32, {static_cast<int64_t>(n)}, ReduceOp::kSum);
          ASSERT_TRUE(h.ok()) << h.status().ToString();
          handles.push_back(*h);
        }
        for (Handle h : handles) ASSERT_TRUE(e.Wait(h, std::chrono::seconds(60)).ok());
        for (int t = 0; t < kTensors; ++t) {
          for (size_t i = 0; i < out[t].size(); ++i) {
            ASSERT_EQ(out[t][i], static_cast<float>(kolo::testing::ExpectedSum(kRanks, i + t)))
                << "tensor " << t << " element " << i;
          }
        }
        std::vector<int32_t> b(1000, r == 2 ? 7 : 0);
        auto h = e.BroadcastAsync("weights", b.data(), DataType::kInt32, {1000}, 2);
        ASSERT_TRUE(h.ok()) << h.status().ToString();
        ASSERT_TRUE(e.Wait(*h, std::chrono::seconds(60)).ok());
        EXPECT_EQ(b, std::vector<int32_t>(1000, 7));
        EXPECT_TRUE(e.Barrier().ok());
      });
}

// The parameter server over rdma: 2 workers and 2 servers, split placement; the weights equal
// the reference SGD of the averaged gradients.
TEST_P(RdmaTest, ParameterServerMatchesTheReference) {
  constexpr int kWorkers = 2, kServers = 2, kSteps = 3, kSize = kWorkers + kServers;
  const char* verbs = GetParam();
  const auto vars = kolo::testing::PsVariables(/*large=*/true);
  const auto want = kolo::testing::PsReference(vars, kWorkers, kSteps);
  bootstrap::InMemoryStore store;
  std::vector<Status> out(kSize);
  std::vector<std::thread> threads;
  for (int r = 0; r < kSize; ++r) {
    threads.emplace_back([&, r] {
      Options o = RdmaRankOptions(r, kSize, verbs);
      o.backend = "ps";
      o.ps_servers = kServers;
      o.ps_placement = "split";
      o.ring_chunk_bytes = 4096;
      auto engine = Engine::Create(o, &store);
      if (!engine.ok()) {
        out[r] = engine.status();
        return;
      }
      Engine& e = **engine;
      Status st = Status::OK();
      if (e.role() == Role::kServer) {
        st = e.Serve();
      } else {
        st = [&]() -> Status {
          KOLO_RETURN_IF_ERROR(e.RegisterVariables(vars));
          std::vector<std::vector<float>> w(vars.size()), g(vars.size());
          for (size_t v = 0; v < vars.size(); ++v) {
            const size_t n = static_cast<size_t>(NumElements(vars[v].shape));
            w[v].resize(n);
            g[v].resize(n);
            for (size_t i = 0; i < n; ++i) {
              w[v][i] = e.rank() == 0 ? kolo::testing::PsInitial(static_cast<int>(v), i) : 1e6f;
            }
          }
          for (int t = 0; t < kSteps; ++t) {
            std::vector<Handle> hs;
            for (size_t v = 0; v < vars.size(); ++v) {
              for (size_t i = 0; i < g[v].size(); ++i) {
                g[v][i] = kolo::testing::PsGrad(e.rank(), t, static_cast<int>(v), i);
              }
              KOLO_ASSIGN_OR_RETURN(
                  Handle h, e.PushPullAsync(vars[v].name, g[v].data(), w[v].data(), vars[v].dtype,
                                            vars[v].shape, kolo::testing::PsSgd(t)));
              hs.push_back(h);
            }
            for (Handle h : hs) KOLO_RETURN_IF_ERROR(e.Wait(h, std::chrono::seconds(60)));
          }
          for (size_t v = 0; v < vars.size(); ++v) {
            const std::string diff = kolo::testing::PsCompare(vars[v].name, w[v], want[v]);
            if (!diff.empty()) return Internal("worker {}: {}", e.rank(), diff);
          }
          return e.Barrier();
        }();
      }
      const Status down = e.Shutdown();
      out[r] = st.ok() ? down : st;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kSize; ++r)
    EXPECT_TRUE(out[r].ok()) << "rank " << r << ": " << out[r].ToString();
}

// --- Device selection, registration, authentication.

TEST(RdmaSoftVerbs, DeviceSelectionErrorsNameWhatExists) {
  bootstrap::InMemoryStore store;
  transport::rdma::RdmaOptions o;
  o.secret = kolo::testing::FreshSecret();
  o.verbs = "soft";
  o.host_name = "node17";
  transport::rdma::soft::SetDeviceCount(2);
  o.device = "mlx5_9";
  auto missing = transport::rdma::Connect(o, store, 0, 1);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'mlx5_9' does not exist"), std::string::npos)
      << missing.status().message();
  EXPECT_NE(missing.status().message().find("softverbs0, softverbs1"), std::string::npos)
      << missing.status().message();
  o.device = "softverbs1";
  o.port = 2;
  auto port = transport::rdma::Connect(o, store, 0, 1);
  ASSERT_FALSE(port.ok());
  EXPECT_NE(port.status().message().find("no port 2"), std::string::npos)
      << port.status().message();
  transport::rdma::soft::SetDeviceCount(0);
  o.device.clear();
  o.port = 1;
  auto none = transport::rdma::Connect(o, store, 0, 1);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("host node17"), std::string::npos)
      << none.status().message();
  EXPECT_NE(none.status().message().find("needs an RDMA device"), std::string::npos)
      << none.status().message();
  transport::rdma::soft::SetDeviceCount(1);
  o.verbs = "hardware";
  auto bad = transport::rdma::Connect(o, store, 0, 1);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'hardware' is unknown"), std::string::npos)
      << bad.status().message();
  // A named device that exists is used.
  transport::rdma::soft::SetDeviceCount(2);
  o.verbs = "soft";
  o.device = "softverbs1";
  auto named = transport::rdma::Connect(o, store, 0, 1);
  EXPECT_TRUE(named.ok()) << named.status().ToString();
  if (named.ok()) named->reset();
  transport::rdma::soft::SetDeviceCount(1);
  ExpectNothingLeft();
}

TEST(RdmaSoftVerbs, TheEngineFailsAtStartUpWithoutADevice) {
  transport::rdma::soft::SetDeviceCount(0);
  bootstrap::InMemoryStore store;
  Options o = RdmaRankOptions(0, 2, "soft");
  o.host_name = "gpu-node-3";
  const auto start = Clock::now();
  auto engine = Engine::Create(o, &store);
  transport::rdma::soft::SetDeviceCount(1);
  ASSERT_FALSE(engine.ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << "failed only after waiting";
  EXPECT_NE(engine.status().message().find("host gpu-node-3"), std::string::npos)
      << engine.status().ToString();
  ExpectNothingLeft();
}

TEST(RdmaSoftVerbs, RegistrationCacheReusesCoveringRegions) {
  bootstrap::InMemoryStore store;
  transport::ConnectSettings s = kolo::testing::TestSettings();
  s.ib_verbs = "soft";
  {
    kolo::testing::Devices d = kolo::testing::ConnectAll("rdma", 2, store, s);
    ASSERT_TRUE(d[0] && d[1]);
    const int base = transport::rdma::soft::LiveObjects().mrs;
    std::vector<uint8_t> big(1 << 20), other(1 << 16);
    auto whole = d[0]->Register(big.data(), big.size());
    ASSERT_TRUE(whole.ok());
    EXPECT_EQ(transport::rdma::soft::LiveObjects().mrs, base + 1);
    auto part = d[0]->Register(big.data() + 4096, 100000);  // inside: the same MR
    ASSERT_TRUE(part.ok());
    EXPECT_EQ(transport::rdma::soft::LiveObjects().mrs, base + 1);
    auto elsewhere = d[0]->Register(other.data(), other.size());
    ASSERT_TRUE(elsewhere.ok());
    EXPECT_EQ(transport::rdma::soft::LiveObjects().mrs, base + 2);
    whole->reset();  // the part still uses the MR
    EXPECT_EQ(transport::rdma::soft::LiveObjects().mrs, base + 2);
    // ... and it still works.
    std::vector<uint8_t> got(100000);
    auto in = d[1]->Register(got.data(), got.size());
    ASSERT_TRUE(in.ok());
    for (size_t i = 0; i < 100000; ++i) big[4096 + i] = static_cast<uint8_t>(i * 13);
    auto statuses = kolo::testing::RunRankThreads(2, [&](int r) -> Status {
      std::vector<transport::Completion> done;
      if (r == 0) {
        KOLO_RETURN_IF_ERROR(d[0]->pair(1).Send(**part, 0, 100000, 5));
      } else {
        KOLO_RETURN_IF_ERROR(d[1]->pair(0).Recv(**in, 0, 100000, 5));
      }
      return transport::WaitFor(*d[r], 1, &done, milliseconds(10000));
    });
    for (const Status& st : statuses) EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_TRUE(std::equal(got.begin(), got.end(), big.begin() + 4096));
    part->reset();
    elsewhere->reset();
    in->reset();
    EXPECT_EQ(transport::rdma::soft::LiveObjects().mrs, base);
  }
  ExpectNothingLeft();
}

TEST(RdmaSoftVerbs, AWrongJobSecretFailsTheSetUp) {
  bootstrap::InMemoryStore store;
  transport::ConnectSettings good = kolo::testing::TestSettings(milliseconds(3000));
  good.ib_verbs = "soft";
  transport::ConnectSettings bad = good;
  bad.secret = kolo::testing::FreshSecret();
  std::vector<Status> statuses = kolo::testing::RunRankThreads(2, [&](int r) -> Status {
    auto s = r == 0 ? good : bad;
    s.hosts = kolo::testing::Layout(2);
    return transport::Connect("rdma", s, store, r, 2).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(statuses[r].code(), StatusCode::kUnavailable) << statuses[r].ToString();
    EXPECT_NE(statuses[r].message().find("fails authentication"), std::string::npos)
        << statuses[r].ToString();
  }
  ExpectNothingLeft();
}

// --- Faults: every rank fails within the peer timeout, naming the peer; nothing leaks.

enum class Fault { kErrorCompletion, kQpError, kVanish };

class RdmaSoftVerbsFault : public ::testing::TestWithParam<Fault> {
 protected:
  void TearDown() override { ExpectNothingLeft(); }
};

TEST_P(RdmaSoftVerbsFault, EveryRankFailsWithinThePeerTimeoutNamingThePeer) {
  constexpr int kRanks = 4;
  constexpr auto kPeerTimeout = milliseconds(3000);
  const Fault fault = GetParam();
  transport::ConnectSettings s = kolo::testing::TestSettings(kPeerTimeout);
  s.ib_verbs = "soft";
  Job job(kRanks, s, 64 << 10, kPeerTimeout);
  ASSERT_TRUE(job.ok());
  CheckAllreduce(job, DataType::kFloat32, 100000);  // the job works before the fault
  std::vector<std::vector<float>> bufs(kRanks, std::vector<float>(1 << 20, 1.0f));
  std::vector<double> took(kRanks, 0);
  auto statuses = job.Run([&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), bufs[r].size() * 4));
    if (r == 2) {
      ibv_qp* qp = transport::rdma::QueuePairForTests(job.device(2), 3);
      if (qp == nullptr) return Internal("no QP");
      if (fault == Fault::kErrorCompletion) {
        transport::rdma::soft::FailNextCompletion(qp, IBV_WC_REM_ACCESS_ERR);
      } else if (fault == Fault::kQpError) {
        transport::rdma::soft::ForceError(qp);
      }
    }
    if (r == 3 && fault == Fault::kVanish) {
      // A killed process: its port stops responding and it does nothing more.
      transport::rdma::soft::Vanish(transport::rdma::ContextForTests(job.device(3)));
      return Aborted("vanished");
    }
    const auto start = Clock::now();
    // Rounds until the fault surfaces (bounded: it must surface within the first).
    Status st = Status::OK();
    for (int round = 0; round < 3 && st.ok(); ++round) {
      st = collectives::RingAllreduce(job.comm(r), *region, 0, bufs[r].size(), DataType::kFloat32,
                                      job.scratch(r));
    }
    took[r] = std::chrono::duration<double>(Clock::now() - start).count();
    return st.ok() ? Internal("rank {}: three allreduces succeeded after the fault", r) : st;
  });
  for (int r = 0; r < kRanks; ++r) {
    if (fault == Fault::kVanish && r == 3) continue;
    const Status& st = statuses[r];
    SCOPED_TRACE(::testing::Message() << "rank " << r << ": " << st.ToString());
    EXPECT_TRUE(st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kAborted);
    // The peer at fault: rank 3 for everyone, rank 2 for rank 3 itself.
    const std::string named = fault != Fault::kVanish && r == 3 ? "rank 2" : "rank 3";
    EXPECT_NE(st.message().find(named), std::string::npos);
    EXPECT_LT(took[r], std::chrono::duration<double>(kPeerTimeout).count() + 0.5);
  }
}

INSTANTIATE_TEST_SUITE_P(Faults, RdmaSoftVerbsFault,
                         ::testing::Values(Fault::kErrorCompletion, Fault::kQpError,
                                           Fault::kVanish),
                         [](const auto& info) {
                           switch (info.param) {
                             case Fault::kErrorCompletion:
                               return std::string("ErrorCompletion");
                             case Fault::kQpError:
                               return std::string("QpForcedToError");
                             case Fault::kVanish:
                               return std::string("VanishedPeer");
                           }
                           return std::string("unknown");
                         });

// An idle rank (nothing posted, waiting for arrivals) learns of a vanished peer too.
TEST(RdmaSoftVerbs, AnIdleRankLearnsOfAVanishedPeer) {
  bootstrap::InMemoryStore store;
  transport::ConnectSettings s = kolo::testing::TestSettings(milliseconds(2000));
  s.ib_verbs = "soft";
  {
    kolo::testing::Devices d = kolo::testing::ConnectAll("rdma", 2, store, s);
    ASSERT_TRUE(d[0] && d[1]);
    transport::rdma::soft::Vanish(transport::rdma::ContextForTests(*d[1]));
    const auto start = Clock::now();
    Status st = Status::OK();
    while (st.ok() && Clock::now() - start < std::chrono::seconds(5)) {
      bool arrived = false;
      st = d[0]->WaitForArrival(std::chrono::microseconds(100000), &arrived);
    }
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("connection to rank 1 lost"), std::string::npos) << st.ToString();
    EXPECT_LT(Clock::now() - start, milliseconds(2500));
  }
  ExpectNothingLeft();
}

INSTANTIATE_TEST_SUITE_P(Verbs, RdmaTest, ::testing::Values("soft", "libibverbs"), VerbsName);

}  // namespace
}  // namespace kolo
