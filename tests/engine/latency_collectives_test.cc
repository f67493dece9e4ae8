// The latency-optimal allreduces (recursive doubling, halving-doubling), the connection plan and
// the algorithm rule: ranks as threads over the real TCP and shm transports, each connected only
// to the peers the plan names, so that an algorithm that used any other pair would fail.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/collectives/collectives.h"
#include "engine/collectives/plan.h"
#include "engine/common/options.h"
#include "engine/transport/shm/device.h"
#include "engine/transport/shm/segment.h"
#include "tests/engine/rank_threads.h"
#include "tests/engine/ring_test_util.h"

namespace kolo::collectives {
namespace {

using kolo::testing::CheckAllreduceWith;
using kolo::testing::kGuard;
using kolo::testing::RingJob;

transport::ConnectSettings PlannedSettings() {
  transport::ConnectSettings s;
  s.secret = "latency-collectives-secret";
  s.timeout = std::chrono::milliseconds(20000);
  s.shm_ring_bytes = 64 << 10;
  s.socket_buffer_bytes = 256 << 10;
  return s;
}

// n ranks over `transport`, rank r connected only to PlanConnections(r, n).
class PlannedJob : public RingJob {
 public:
  PlannedJob(int n, const std::string& transport, int direct_max_ranks = 16)
      : RingJob(
            n, transport,
            [&](int r) {
              transport::ConnectSettings s = PlannedSettings();
              s.peers = PlanConnections(r, n, direct_max_ranks, nullptr);
              return s;
            },
            16 << 10, std::chrono::milliseconds(20000)) {
    for (int r = 0; r < n; ++r) comm(r).bitwise_direct_max_ranks = direct_max_ranks;
  }
};

enum class Algo { kRecursiveDoubling, kHalvingDoubling };

Status RunAlgo(Algo a, Comm& comm, transport::Region& region, size_t offset, size_t count,
               DataType dtype, Scratch& scratch) {
  return a == Algo::kRecursiveDoubling
             ? RecursiveDoublingAllreduce(comm, region, offset, count, dtype, scratch)
             : HalvingDoublingAllreduce(comm, region, offset, count, dtype, scratch);
}

// --- the connection plan -------------------------------------------------------------------

TEST(ConnectionPlan, IsSymmetricAndLogarithmic) {
  for (int n = 1; n <= 300; n += (n < 40 ? 1 : 37)) {
    std::vector<std::set<int>> plan(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      const auto peers = PlanConnections(r, n, 16, nullptr);
      plan[static_cast<size_t>(r)] = {peers.begin(), peers.end()};
      EXPECT_EQ(plan[static_cast<size_t>(r)].count(r), 0u) << "rank " << r << " of " << n;
      if (n > 16) {
        const size_t bound = 2 + static_cast<size_t>(std::ceil(std::log2(n)));
        EXPECT_LE(peers.size(), bound) << "rank " << r << " of " << n;
      } else {
        EXPECT_EQ(peers.size(), static_cast<size_t>(n - 1));
      }
    }
    for (int a = 0; a < n; ++a) {
      for (int b : plan[static_cast<size_t>(a)]) {
        ASSERT_GE(b, 0);
        ASSERT_LT(b, n);
        EXPECT_EQ(plan[static_cast<size_t>(b)].count(a), 1u)
            << n << " ranks: " << a << " plans " << b << " but not the reverse";
      }
    }
  }
}

TEST(ConnectionPlan, HierarchicalAddsTheHostRings) {
  // 4 hosts x 8 ranks: rank 10 is local position 2 of host 1; its cross group is 2, 10, 18, 26.
  HostGroups g{{8, 9, 10, 11, 12, 13, 14, 15}, {2, 10, 18, 26}};
  const auto peers = PlanConnections(10, 32, 16, &g);
  for (int want : {9, 11, 2, 18}) {
    EXPECT_NE(std::find(peers.begin(), peers.end(), want), peers.end()) << want;
  }
}

TEST(ConnectionPlan, AnUnplannedPairFailsCleanly) {
  PlannedJob job(20, "tcp");
  ASSERT_TRUE(job.ok());
  // 0 and 5 are neither ring neighbours nor r XOR 2^k partners.
  EXPECT_FALSE(job.device(0).connected(5));
  EXPECT_TRUE(job.device(0).connected(1));
  EXPECT_EQ(job.device(0).connections(), 6);  // 1, 19 (ring); 1, 2, 4, 8, 16 (r XOR 2^k)
  uint8_t byte = 0;
  auto region = job.device(0).Register(&byte, 1);
  ASSERT_TRUE(region.ok());
  Status s = job.device(0).pair(5).Send(**region, 0, 1, 7);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("rank 0 has no tcp connection to rank 5"), std::string::npos)
      << s.ToString();
  EXPECT_GT(job.device(0).transport_memory_bytes(), 0u);
}

// Shared memory gives the ring neighbours full rings and the other planned pairs small ones; the
// algorithms run over both, with messages larger than a small ring.
TEST(ConnectionPlan, SharedMemoryRingsAreFullOnlyForRingNeighbours) {
  const int n = 20;
  std::vector<std::unique_ptr<transport::Device>> devices(n);
  bootstrap::InMemoryStore store;
  transport::ConnectSettings base = PlannedSettings();
  base.shm_ring_bytes = 1 << 20;
  base.hosts = kolo::testing::Layout(n);
  auto statuses = kolo::testing::RunRankThreads(n, [&](int r) -> Status {
    transport::ConnectSettings s = base;
    s.peers = PlanConnections(r, n, 16, nullptr);
    s.full_ring_peers = PlanFullRingPeers(r, n, nullptr);
    KOLO_ASSIGN_OR_RETURN(devices[static_cast<size_t>(r)],
                          transport::Connect("shm", s, store, r, n));
    return Status::OK();
  });
  for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  // Rank 0: full rings with 1 and 19, small ones with 2, 4, 8 and 16.
  const uint64_t full = transport::shm::SegmentBytes(1 << 20);
  const uint64_t small = transport::shm::SegmentBytes(transport::shm::ShmOptions::kSmallRingBytes);
  EXPECT_EQ(devices[0]->transport_memory_bytes(), 2 * full + 4 * small);
  std::vector<Comm> comms(n);
  std::vector<Scratch> scratch(n);
  for (int r = 0; r < n; ++r) {
    comms[r].device = devices[r].get();
    comms[r].timeout = std::chrono::milliseconds(20000);
  }
  const size_t count = (3 << 20) / 4;  // 3 MiB of floats: halving-doubling's first message 1.5 MiB
  std::vector<std::vector<float>> bufs(n, std::vector<float>(count));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) bufs[r][i] = static_cast<float>((i + r) % 7);
  }
  statuses = kolo::testing::RunRankThreads(n, [&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(auto region, devices[r]->Register(bufs[r].data(), count * 4));
    KOLO_RETURN_IF_ERROR(
        HalvingDoublingAllreduce(comms[r], *region, 0, count, DataType::kFloat32, scratch[r]));
    return Status::OK();
  });
  for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; i += 997) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += static_cast<float>((i + q) % 7);
      ASSERT_EQ(bufs[r][i], want) << "rank " << r << " element " << i;
    }
  }
  kolo::testing::RunRankThreads(n, [&](int r) {
    devices[static_cast<size_t>(r)].reset();
    return Status::OK();
  });
}

// --- the algorithms, exact results on every rank -----------------------------------------------

using AlgoCase = std::tuple<std::string, Algo, int>;

class LatencyAllreduce : public ::testing::TestWithParam<AlgoCase> {};

TEST_P(LatencyAllreduce, ExactOnEveryDtypeAndCount) {
  const auto& [transport, algo, n] = GetParam();
  PlannedJob job(n, transport);
  ASSERT_TRUE(job.ok());
  for (DataType dtype :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
        DataType::kInt32, DataType::kInt64, DataType::kUInt8}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, static_cast<size_t>(n + 1), size_t{1000},
                         size_t{40001}}) {
      CheckAllreduceWith(job, dtype, count, [&](int r, transport::Region& region) {
        return RunAlgo(algo, job.comm(r), region, kGuard, count, dtype, job.scratch(r));
      });
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, LatencyAllreduce,
                         ::testing::Combine(::testing::Values("tcp", "shm"),
                                            ::testing::Values(Algo::kRecursiveDoubling,
                                                              Algo::kHalvingDoubling),
                                            ::testing::Values(1, 2, 3, 4, 5, 7, 8, 13, 20)),
                         [](const ::testing::TestParamInfo<AlgoCase>& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) == Algo::kRecursiveDoubling ? "_rd_"
                                                                                       : "_hd_") +
                                  std::to_string(std::get<2>(info.param));
                         });

// Halving-doubling sums on arrival where the transport can; the path through scratch (a
// transport that cannot, or accumulate_on_arrival off) must give the same sums.
TEST(LatencyAllreduceScratch, HalvingDoublingWithoutSummingOnArrival) {
  for (const char* transport : {"tcp", "shm"}) {
    PlannedJob job(6, transport);
    ASSERT_TRUE(job.ok());
    for (int r = 0; r < 6; ++r) job.comm(r).accumulate_on_arrival = false;
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64}) {
      CheckAllreduceWith(job, dtype, 30011, [&](int r, transport::Region& region) {
        return HalvingDoublingAllreduce(job.comm(r), region, kGuard, 30011, dtype, job.scratch(r));
      });
    }
  }
}

// Random floats: every rank must end with the same bits (the result is one sum, copied), and it
// must be the sum to float rounding.
TEST(LatencyAllreduceBits, EveryRankEndsWithTheSameBits) {
  for (Algo algo : {Algo::kRecursiveDoubling, Algo::kHalvingDoubling}) {
    PlannedJob job(11, "shm");
    ASSERT_TRUE(job.ok());
    const size_t count = 5003;
    std::vector<std::vector<float>> bufs(11, std::vector<float>(count));
    std::vector<double> exact(count, 0);
    std::mt19937 gen(42);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (auto& b : bufs) {
      for (size_t i = 0; i < count; ++i) {
        b[i] = dist(gen);
        exact[i] += b[i];
      }
    }
    auto statuses = job.Run([&](int r) -> Status {
      auto& b = bufs[static_cast<size_t>(r)];
      KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(b.data(), count * 4));
      return RunAlgo(algo, job.comm(r), *region, 0, count, DataType::kFloat32, job.scratch(r));
    });
    for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
    for (int r = 1; r < 11; ++r) {
      ASSERT_EQ(std::memcmp(bufs[0].data(), bufs[static_cast<size_t>(r)].data(), count * 4), 0)
          << "rank " << r;
    }
    for (size_t i = 0; i < count; ++i) ASSERT_NEAR(bufs[0][i], exact[i], 1e-5) << i;
  }
}

TEST(LatencyAllreduceExtents, ReducesScatteredPiecesInPlace) {
  PlannedJob job(6, "tcp");
  ASSERT_TRUE(job.ok());
  // Three pieces of 5, 0 and 9 floats.
  std::vector<std::vector<float>> a(6, std::vector<float>(5)), b(6, std::vector<float>(9));
  for (int r = 0; r < 6; ++r) {
    for (size_t i = 0; i < 5; ++i) a[r][i] = static_cast<float>(r + i);
    for (size_t i = 0; i < 9; ++i) b[r][i] = static_cast<float>(10 * r - i);
  }
  for (Algo algo : {Algo::kRecursiveDoubling, Algo::kHalvingDoubling}) {
    auto before_a = a, before_b = b;
    auto statuses = job.Run([&](int r) -> Status {
      KOLO_ASSIGN_OR_RETURN(auto ra, job.device(r).Register(a[r].data(), 20));
      KOLO_ASSIGN_OR_RETURN(auto rb, job.device(r).Register(b[r].data(), 36));
      std::vector<Extent> e{{ra.get(), 0, 20}, {rb.get(), 0, 0}, {rb.get(), 0, 36}};
      return algo == Algo::kRecursiveDoubling
                 ? RecursiveDoublingAllreduce(job.comm(r), e, DataType::kFloat32, job.scratch(r))
                 : HalvingDoublingAllreduce(job.comm(r), e, DataType::kFloat32, job.scratch(r));
    });
    for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
    for (int r = 0; r < 6; ++r) {
      for (size_t i = 0; i < 5; ++i) {
        float sum = 0;
        for (int q = 0; q < 6; ++q) sum += before_a[q][i];
        EXPECT_EQ(a[r][i], sum);
      }
      for (size_t i = 0; i < 9; ++i) {
        float sum = 0;
        for (int q = 0; q < 6; ++q) sum += before_b[q][i];
        EXPECT_EQ(b[r][i], sum);
      }
    }
  }
}

// Ranks calling different algorithms fail with a protocol error rather than mixing bytes.
TEST(LatencyAllreduceMismatch, DifferentAlgorithmsFailNamingTheTags) {
  PlannedJob job(4, "tcp");
  ASSERT_TRUE(job.ok());
  for (int r = 0; r < 4; ++r) job.comm(r).timeout = std::chrono::milliseconds(3000);
  std::vector<std::vector<float>> bufs(4, std::vector<float>(64, 1.0f));
  auto statuses = job.Run([&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), 256));
    return RunAlgo(r == 0 ? Algo::kHalvingDoubling : Algo::kRecursiveDoubling, job.comm(r), *region,
                   0, 64, DataType::kFloat32, job.scratch(r));
  });
  int failed = 0;
  for (const Status& s : statuses) failed += s.ok() ? 0 : 1;
  EXPECT_GT(failed, 0);
}

// --- negotiation's messages, the barrier and the bit exchange beyond the direct exchange --------

TEST(PlannedMessages, GatherBroadcastBarrierAndBitsOverTheTree) {
  for (int n : {17, 20, 33}) {
    PlannedJob job(n, "shm");
    ASSERT_TRUE(job.ok());
    std::vector<std::vector<std::vector<uint8_t>>> gathered(static_cast<size_t>(n));
    std::vector<std::vector<uint8_t>> broadcast(static_cast<size_t>(n));
    std::vector<std::vector<uint64_t>> bits(static_cast<size_t>(n));
    auto statuses = job.Run([&](int r) -> Status {
      KOLO_RETURN_IF_ERROR(Barrier(job.comm(r)));
      std::vector<uint8_t> mine(static_cast<size_t>(r % 5), static_cast<uint8_t>(r));
      KOLO_ASSIGN_OR_RETURN(gathered[r], GatherMessages(job.comm(r), 0, mine));
      std::vector<uint8_t> message = {1, 2, 3, static_cast<uint8_t>(n)};
      KOLO_ASSIGN_OR_RETURN(
          broadcast[r],
          BroadcastMessage(job.comm(r), 0, r == 0 ? message : std::vector<uint8_t>{}));
      bits[r] = {~uint64_t{0} ^ (uint64_t{1} << (r % 64)), uint64_t{1} << (r % 64)};
      KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bits[r].data(), 16));
      KOLO_RETURN_IF_ERROR(BitwiseAllreduce(job.comm(r), *region, 1, 1, job.scratch(r)));
      return Barrier(job.comm(r));
    });
    for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
    ASSERT_EQ(gathered[0].size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(gathered[0][r],
                std::vector<uint8_t>(static_cast<size_t>(r % 5), static_cast<uint8_t>(r)))
          << "rank " << r << " of " << n;
      EXPECT_EQ(broadcast[r], (std::vector<uint8_t>{1, 2, 3, static_cast<uint8_t>(n)}));
      uint64_t and_want = ~uint64_t{0}, or_want = 0;
      for (int q = 0; q < n; ++q) {
        and_want &= ~uint64_t{0} ^ (uint64_t{1} << (q % 64));
        or_want |= uint64_t{1} << (q % 64);
      }
      EXPECT_EQ(bits[r][0], and_want);
      EXPECT_EQ(bits[r][1], or_want);
    }
  }
}

// --- the rule and the names ----------------------------------------------------------------

TEST(AllreduceAlgorithmRule, PicksByBytes) {
  EXPECT_EQ(ChooseAllreduceAlgorithm(4096, 1, 1), AllreduceAlgorithm::kRing);
  EXPECT_EQ(ChooseAllreduceAlgorithm(4096, 4, 1), AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(ChooseAllreduceAlgorithm(kRecursiveDoublingMaxBytes + 4, 4, 1),
            AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(ChooseAllreduceAlgorithm(64 << 20, 4, 1), AllreduceAlgorithm::kRing);
}

TEST(AllreduceAlgorithmNames, ParseAndRefuse) {
  for (const std::string& name : AllreduceAlgorithmNames()) {
    auto a = ParseAllreduceAlgorithm(name);
    ASSERT_TRUE(a.ok()) << name;
    EXPECT_EQ(AllreduceAlgorithmName(*a), name);
  }
  auto bad = ParseAllreduceAlgorithm("tree");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'tree'"), std::string::npos);
  EXPECT_NE(bad.status().message().find("recursive-doubling"), std::string::npos);

  Options o;
  o.allreduce_algorithm = "tree";
  Status s = o.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("allowed are auto, ring, recursive-doubling, halving-doubling"),
            std::string::npos)
      << s.ToString();
  o.allreduce_algorithm = "recursive-doubling";
  EXPECT_TRUE(o.Validate().ok());
  o.hierarchical_allreduce = true;
  s = o.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("hierarchical"), std::string::npos) << s.ToString();
  o.allreduce_algorithm = "auto";
  EXPECT_TRUE(o.Validate().ok());
}

}  // namespace
}  // namespace kolo::collectives
