// The ring collectives over the real TCP transport, ranks as threads, against references computed
// here independently of the code under test.
#include "engine/collectives/collectives.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/bootstrap/host_layout.h"
#include "engine/bootstrap/store.h"
#include "engine/collectives/settings_check.h"
#include "engine/transport/tcp/device.h"
#include "tests/engine/rank_threads.h"
#include "tests/engine/ring_test_util.h"

namespace kolo::collectives {
namespace {

using std::chrono::milliseconds;
using transport::Device;
using transport::Region;

// n ranks connected over loopback, each with its own Comm and Scratch.
class Job {
 public:
  explicit Job(int n, size_t chunk_bytes = 64 << 10) : n_(n) {
    devices_.resize(static_cast<size_t>(n));
    transport::tcp::TcpOptions options;
    options.secret = "collectives-test-secret";
    auto statuses = kolo::testing::RunRankThreads(n, [&](int r) -> Status {
      KOLO_ASSIGN_OR_RETURN(devices_[static_cast<size_t>(r)],
                            transport::tcp::Connect(options, store_, r, n));
      return Status::OK();
    });
    for (const Status& s : statuses) EXPECT_TRUE(s.ok()) << s.ToString();
    comms_.resize(static_cast<size_t>(n));
    scratch_.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      comms_[r].device = devices_[r].get();
      comms_[r].chunk_bytes = chunk_bytes;
      comms_[r].timeout = milliseconds(20000);
    }
  }
  // Every rank shuts down at once, as in a real job (a closing device waits, bounded, for its
  // peers to close their side too).
  ~Job() {
    kolo::testing::RunRankThreads(n_, [&](int r) {
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
  Device& device(int r) { return *devices_[static_cast<size_t>(r)]; }
  Comm& comm(int r) { return comms_[static_cast<size_t>(r)]; }
  Scratch& scratch(int r) { return scratch_[static_cast<size_t>(r)]; }
  // Runs fn(rank) on every rank; if a rank fails it aborts its device so the others stop too.
  template <typename Fn>
  std::vector<Status> Run(Fn fn) {
    return kolo::testing::RunRankThreads(n_, [&](int r) -> Status {
      Status s = fn(r);
      if (!s.ok()) device(r).Abort(s);
      return s;
    });
  }

 private:
  int n_;
  bootstrap::InMemoryStore store_;
  std::vector<std::unique_ptr<Device>> devices_;
  std::vector<Comm> comms_;
  std::vector<Scratch> scratch_;
};

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

void ExpectAllOk(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r].ToString();
  }
}

using kolo::testing::kGuard;

// Fills rank r's buffer (with guards), runs RingAllreduce on every rank (HierarchicalAllreduce
// with groups[r] when `groups` is given) and checks every buffer against the reference sum.
void CheckAllreduce(Job& job, DataType dtype, size_t count,
                    const std::vector<HostGroups>* groups = nullptr) {
  std::vector<HierarchicalScratch> hierarchical(static_cast<size_t>(job.size()));
  kolo::testing::CheckAllreduceWith(job, dtype, count, [&](int r, auto& region) {
    if (groups != nullptr) {
      return HierarchicalAllreduce(job.comm(r), (*groups)[static_cast<size_t>(r)], region, kGuard,
                                   count, dtype, hierarchical[static_cast<size_t>(r)]);
    }
    return RingAllreduce(job.comm(r), region, kGuard, count, dtype, job.scratch(r));
  });
}

class RingAllreduceTest : public ::testing::TestWithParam<std::tuple<int, DataType>> {};

TEST_P(RingAllreduceTest, MatchesReferenceSum) {
  const auto [n, dtype] = GetParam();
  // A small chunk, so that the larger sizes move as many pipelined pieces.
  Job job(n, 64 << 10);
  ASSERT_TRUE(job.ok());
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, static_cast<size_t>(n - 1),
                       static_cast<size_t>(n + 1), size_t{1000003}}) {
    SCOPED_TRACE(::testing::Message() << "count " << count);
    CheckAllreduce(job, dtype, count);
  }
}

INSTANTIATE_TEST_SUITE_P(RanksByDtype, RingAllreduceTest,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::ValuesIn(AllDataTypes())),
                         [](const auto& info) {
                           return "np" + std::to_string(std::get<0>(info.param)) + "_" +
                                  DataTypeName(std::get<1>(info.param));
                         });

// The path of a transport that cannot sum bytes as they arrive: whole pieces into scratch, summed
// from there (the parameterized test above takes the TCP transport's accumulating path).
TEST(RingAllreduce, ScratchPathMatchesReferenceSum) {
  for (int n : {2, 3, 5}) {
    Job job(n, 64 << 10);
    ASSERT_TRUE(job.ok());
    for (int r = 0; r < n; ++r) job.comm(r).accumulate_on_arrival = false;
    for (DataType dtype : AllDataTypes()) {
      for (size_t count : {size_t{1}, static_cast<size_t>(n + 1), size_t{1000003}}) {
        SCOPED_TRACE(::testing::Message() << n << " ranks, count " << count);
        CheckAllreduce(job, dtype, count);
      }
    }
  }
}

TEST(RingAllreduce, SixtyFourMiBFloat32) {
  for (int n : {2, 4}) {
    Job job(n, 1 << 20);
    ASSERT_TRUE(job.ok());
    CheckAllreduce(job, DataType::kFloat32, (64 << 20) / 4);
  }
}

TEST(RingAllreduce, OddChunkSizesAndPhases) {
  // A chunk that is not a multiple of the element size, and the timeline's phase callbacks.
  Job job(3, 1001);
  ASSERT_TRUE(job.ok());
  std::vector<std::vector<std::string>> phases(3);
  for (int r = 0; r < 3; ++r) {
    job.comm(r).on_phase = [&phases, r](Phase p, bool start) {
      phases[static_cast<size_t>(r)].push_back(std::string(start ? "+" : "-") + PhaseName(p));
    };
  }
  CheckAllreduce(job, DataType::kFloat64, 10007);
  const std::vector<std::string> want = {"+REDUCE_SCATTER", "-REDUCE_SCATTER", "+ALLGATHER",
                                         "-ALLGATHER"};
  for (int r = 0; r < 3; ++r) EXPECT_EQ(phases[static_cast<size_t>(r)], want) << "rank " << r;
}

// The hierarchical groups of every rank of a job whose ranks sit on hosts named `host_of_rank`,
// as the engine derives them from the agreed host layout.
std::vector<HostGroups> GroupsFromNames(const std::vector<std::string>& host_of_rank) {
  const bootstrap::HostLayout layout(host_of_rank);
  std::vector<HostGroups> groups;
  for (int r = 0; r < layout.size(); ++r) {
    groups.push_back({layout.ranks_on(layout.host(r)), layout.CrossGroup(r)});
  }
  return groups;
}

// Hosts h0.. with `per_host` ranks each, ranks numbered host by host (or dealt round-robin).
std::vector<std::string> HostNames(int hosts, int per_host, bool round_robin) {
  std::vector<std::string> names;
  for (int r = 0; r < hosts * per_host; ++r) {
    names.push_back("h" + std::to_string(round_robin ? r % hosts : r / per_host));
  }
  return names;
}

class HierarchicalAllreduceTest
    : public ::testing::TestWithParam<std::tuple<std::pair<int, int>, DataType>> {};

TEST_P(HierarchicalAllreduceTest, MatchesReferenceSum) {
  const auto [shape, dtype] = GetParam();
  const auto [hosts, per_host] = shape;
  const int n = hosts * per_host;
  Job job(n, 64 << 10);
  ASSERT_TRUE(job.ok());
  // Several chunks for the larger counts, so that the rings within and across hosts overlap.
  for (int r = 0; r < n; ++r) job.comm(r).hierarchical_chunk_bytes = 256 << 10;
  for (const bool round_robin : {false, true}) {
    const auto groups = GroupsFromNames(HostNames(hosts, per_host, round_robin));
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, static_cast<size_t>(per_host - 1),
                         static_cast<size_t>(n + 1), size_t{300007}}) {
      SCOPED_TRACE(::testing::Message()
                   << hosts << " hosts x " << per_host << " ranks"
                   << (round_robin ? ", round-robin" : "") << ", count " << count);
      CheckAllreduce(job, dtype, count, &groups);
    }
  }
}

std::string ShapeName(
    const ::testing::TestParamInfo<std::tuple<std::pair<int, int>, DataType>>& info) {
  const std::pair<int, int> shape = std::get<0>(info.param);
  return std::to_string(shape.first) + "x" + std::to_string(shape.second) + "_" +
         DataTypeName(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(HostsByDtype, HierarchicalAllreduceTest,
                         ::testing::Combine(::testing::Values(std::pair{1, 3}, std::pair{3, 1},
                                                              std::pair{2, 2}, std::pair{2, 3},
                                                              std::pair{3, 2}, std::pair{2, 4},
                                                              std::pair{4, 2}),
                                            ::testing::ValuesIn(AllDataTypes())),
                         ShapeName);

// Chunks of one element: most chunks leave most ranks no slice to carry across hosts, and the
// chunk count is capped.
TEST(HierarchicalAllreduce, TinyChunks) {
  Job job(6, 64 << 10);
  ASSERT_TRUE(job.ok());
  for (int r = 0; r < 6; ++r) job.comm(r).hierarchical_chunk_bytes = 4;
  const auto groups = GroupsFromNames(HostNames(2, 3, false));
  for (size_t count : {size_t{1}, size_t{2}, size_t{13}, size_t{1000}}) {
    SCOPED_TRACE(::testing::Message() << "count " << count);
    CheckAllreduce(job, DataType::kInt32, count, &groups);
  }
}

TEST(HierarchicalAllreduce, ScratchPathAndSixtyFourMiB) {
  Job job(4, 1 << 20);
  ASSERT_TRUE(job.ok());
  const auto groups = GroupsFromNames(HostNames(2, 2, false));
  CheckAllreduce(job, DataType::kFloat32, (64 << 20) / 4, &groups);
  for (int r = 0; r < 4; ++r) job.comm(r).accumulate_on_arrival = false;
  CheckAllreduce(job, DataType::kFloat32, 1000003, &groups);
}

// Each rank sends (R-1)/R of the buffer in the reduce-scatter within its host, 2 (H-1)/H of its
// 1/R slice across hosts and (R-1)/R in the allgather: 1.75 buffers at 2 hosts x 4 ranks, as many
// as the flat ring's 2 (N-1)/N, but a host's link carries R x 0.25 = 1 buffer out instead of the
// flat ring's 1.75 (the one rank at each host boundary sends all of its 1.75 across).
TEST(HierarchicalAllreduce, MovesTheBytesItsDesignSays) {
  const int hosts = 2, per_host = 4, n = hosts * per_host;
  Job job(n, 64 << 10);
  ASSERT_TRUE(job.ok());
  const auto names = HostNames(hosts, per_host, false);
  const auto groups = GroupsFromNames(names);
  const size_t count = 1 << 20;  // 4 MiB of float32, divisible by every split
  std::vector<uint64_t> hier(static_cast<size_t>(n)), flat(static_cast<size_t>(n));
  std::vector<HierarchicalScratch> scratch(static_cast<size_t>(n));
  for (const bool hierarchical : {true, false}) {
    std::vector<std::vector<float>> bufs(static_cast<size_t>(n), std::vector<float>(count, 1.0f));
    auto statuses = job.Run([&](int r) -> Status {
      Device& d = job.device(r);
      const uint64_t sent0 = d.bytes_sent();
      KOLO_ASSIGN_OR_RETURN(auto region, d.Register(bufs[r].data(), count * 4));
      KOLO_RETURN_IF_ERROR(
          hierarchical
              ? HierarchicalAllreduce(job.comm(r), groups[r], *region, 0, count, DataType::kFloat32,
                                      scratch[r])
              : RingAllreduce(job.comm(r), *region, 0, count, DataType::kFloat32, job.scratch(r)));
      (hierarchical ? hier : flat)[r] = d.bytes_sent() - sent0;
      for (float v : bufs[r]) {
        if (v != static_cast<float>(n)) return Internal("rank {} holds {} not {}", r, v, n);
      }
      return Status::OK();
    });
    ExpectAllOk(statuses);
  }
  const uint64_t total = count * 4;
  // Within a host: 2 (R-1)/R; across: 2 (H-1)/H of a 1/R slice.
  const uint64_t want_hier = 2 * total * (per_host - 1) / per_host + 2 * total / per_host / 2;
  const uint64_t want_flat = 2 * total * (n - 1) / n;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(hier[static_cast<size_t>(r)], want_hier) << "rank " << r;
    EXPECT_EQ(flat[static_cast<size_t>(r)], want_flat) << "rank " << r;
  }
}

TEST(HierarchicalAllreduce, RefusesGroupsThatDoNotCoverTheJob) {
  Job job(4);
  ASSERT_TRUE(job.ok());
  std::vector<uint8_t> buf(64);
  auto region = job.device(0).Register(buf.data(), buf.size());
  HierarchicalScratch scratch;
  ASSERT_TRUE(region.ok());
  // Three ranks per host and two hosts is not four ranks.
  Status s = HierarchicalAllreduce(job.comm(0), HostGroups{{0, 1, 2}, {0, 3}}, **region, 0, 4,
                                   DataType::kFloat32, scratch);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("3 ranks per host times 2 hosts"), std::string::npos) << s.ToString();
  // A group without this rank.
  s = HierarchicalAllreduce(job.comm(0), HostGroups{{1, 2}, {1, 3}}, **region, 0, 4,
                            DataType::kFloat32, scratch);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("missing from its own groups"), std::string::npos) << s.ToString();
  s = HierarchicalAllreduce(job.comm(0), HostGroups{{0, 9}, {0, 1}}, **region, 0, 4,
                            DataType::kFloat32, scratch);
  EXPECT_NE(s.message().find("rank 9 in a group is not a rank"), std::string::npos) << s.ToString();
}

TEST(RingExchangeNoReduce, MovesExactlyTheAllreduceBytes) {
  for (int n : {2, 3, 5}) {
    Job job(n);
    ASSERT_TRUE(job.ok());
    const size_t count = 100003;  // uneven segments
    const size_t elem = 4;
    std::vector<size_t> seg(static_cast<size_t>(n) + 1, 0);  // segment byte bounds
    for (int s = 0; s < n; ++s) {
      seg[s + 1] = seg[s] + (count / n + (static_cast<size_t>(s) < count % n)) * elem;
    }
    auto seg_bytes = [&](int s) { return seg[static_cast<size_t>(s % n) + 1] - seg[s % n]; };
    std::vector<std::vector<uint64_t>> moved(static_cast<size_t>(n));
    std::vector<std::vector<uint8_t>> inputs, exchanged;
    for (int r = 0; r < n; ++r)
      inputs.push_back(RandomBytes(count * elem, static_cast<uint32_t>(r)));
    for (const bool reduce : {false, true}) {
      std::vector<std::vector<uint8_t>> bufs = inputs;
      auto statuses = job.Run([&](int r) -> Status {
        Device& d = job.device(r);
        const uint64_t sent0 = d.bytes_sent(), received0 = d.bytes_received();
        KOLO_ASSIGN_OR_RETURN(auto region, d.Register(bufs[r].data(), bufs[r].size()));
        KOLO_RETURN_IF_ERROR(
            reduce
                ? RingAllreduce(job.comm(r), *region, 0, count, DataType::kFloat32, job.scratch(r))
                : RingExchangeNoReduce(job.comm(r), *region, 0, count, DataType::kFloat32));
        moved[r].push_back(d.bytes_sent() - sent0);
        moved[r].push_back(d.bytes_received() - received0);
        return Status::OK();
      });
      ExpectAllOk(statuses);
      if (!reduce) exchanged = bufs;
    }
    const size_t total = count * elem;
    for (int r = 0; r < n; ++r) {
      // Each rank sends every segment but r+1 (reduce-scatter) and every one but r+2 (allgather),
      // and receives every segment but r and every one but r+1.
      const uint64_t sent = 2 * total - seg_bytes(r + 1) - seg_bytes(r + 2);
      const uint64_t received = 2 * total - seg_bytes(r) - seg_bytes(r + 1);
      EXPECT_EQ(moved[r], (std::vector<uint64_t>{sent, received, sent, received}))
          << "rank " << r << " of " << n;
      // Every piece lands in place: segment s travels from rank s all the way round, overwriting
      // as it goes, so each rank ends with every rank's own segment.
      for (int s = 0; s < n; ++s) {
        EXPECT_TRUE(std::equal(inputs[s].begin() + static_cast<std::ptrdiff_t>(seg[s]),
                               inputs[s].begin() + static_cast<std::ptrdiff_t>(seg[s + 1]),
                               exchanged[r].begin() + static_cast<std::ptrdiff_t>(seg[s])))
            << "segment " << s << " at rank " << r << " of " << n;
      }
    }
  }
}

TEST(RingBroadcast, FromEveryRoot) {
  for (int n : {1, 2, 3, 5}) {
    Job job(n, 64 << 10);
    ASSERT_TRUE(job.ok());
    for (size_t nbytes : {size_t{0}, size_t{1}, size_t{(1 << 20) + 3}}) {
      for (int root = 0; root < n; ++root) {
        std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(n));
        for (int r = 0; r < n; ++r) {
          bufs[r].assign(nbytes + 8, static_cast<uint8_t>(r));
          for (size_t i = 0; r == root && i < nbytes; ++i) {
            bufs[r][i + 4] = static_cast<uint8_t>(i * 31 + root);
          }
        }
        auto statuses = job.Run([&](int r) -> Status {
          KOLO_ASSIGN_OR_RETURN(auto region,
                                job.device(r).Register(bufs[r].data(), bufs[r].size()));
          return RingBroadcast(job.comm(r), *region, 4, nbytes, root);
        });
        ExpectAllOk(statuses);
        for (int r = 0; r < n; ++r) {
          EXPECT_TRUE(std::equal(bufs[r].begin() + 4, bufs[r].end() - 4, bufs[root].begin() + 4))
              << "rank " << r << " of " << n << ", root " << root << ", " << nbytes << " bytes";
          EXPECT_EQ(bufs[r].back(), static_cast<uint8_t>(r));
        }
      }
    }
    auto empty = job.device(0).Register(nullptr, 0);
    ASSERT_TRUE(empty.ok());
    EXPECT_EQ(RingBroadcast(job.comm(0), **empty, 0, 0, n).code(), StatusCode::kInvalidArgument);
  }
}

TEST(RingAllgatherv, UnevenBlocksIncludingEmptyOnes) {
  for (int n : {1, 2, 3, 4, 7}) {
    Job job(n, 4096);
    ASSERT_TRUE(job.ok());
    std::vector<size_t> sizes(static_cast<size_t>(n));
    size_t total = 0;
    for (int r = 0; r < n; ++r) total += sizes[r] = r % 3 == 1 ? 0 : (r * 12347 + 5) % 20000;
    std::vector<uint8_t> expected;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < sizes[r]; ++i) expected.push_back(static_cast<uint8_t>(r * 7 + i));
    }
    std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      bufs[r].assign(total + 16, 0);
      size_t displ = 0;
      for (int q = 0; q < r; ++q) displ += sizes[q];
      std::copy(expected.begin() + static_cast<std::ptrdiff_t>(displ),
                expected.begin() + static_cast<std::ptrdiff_t>(displ + sizes[r]),
                bufs[r].begin() + 16 + static_cast<std::ptrdiff_t>(displ));
    }
    auto statuses = job.Run([&](int r) -> Status {
      KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), bufs[r].size()));
      return RingAllgatherv(job.comm(r), *region, 16, sizes);
    });
    ExpectAllOk(statuses);
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), bufs[r].begin() + 16))
          << "rank " << r << " of " << n;
    }
  }
}

// Both algorithms: the direct exchange (the default up to 16 ranks) and recursive doubling.
class BitwiseAllreduceTest : public ::testing::TestWithParam<bool> {};

TEST_P(BitwiseAllreduceTest, AndThenOrWords) {
  const bool direct = GetParam();
  for (int n = 1; n <= 8; ++n) {
    Job job(n);
    ASSERT_TRUE(job.ok());
    for (int r = 0; r < n; ++r) job.comm(r).bitwise_direct_max_ranks = direct ? n : 1;
    constexpr size_t kAnd = 3, kOr = 2;
    std::mt19937_64 rng(static_cast<uint64_t>(n));
    std::vector<std::vector<uint64_t>> words(static_cast<size_t>(n));
    std::vector<uint64_t> want(kAnd + kOr);
    for (size_t w = 0; w < kAnd + kOr; ++w) want[w] = w < kAnd ? ~uint64_t{0} : 0;
    for (int r = 0; r < n; ++r) {
      for (size_t w = 0; w < kAnd + kOr; ++w) {
        // Dense bits for AND, sparse for OR, so neither result is trivially all-0 or all-1.
        const uint64_t v = w < kAnd ? rng() | rng() | rng() : rng() & rng() & rng();
        words[r].push_back(v);
        want[w] = w < kAnd ? want[w] & v : want[w] | v;
      }
    }
    auto statuses = job.Run([&](int r) -> Status {
      KOLO_ASSIGN_OR_RETURN(auto region,
                            job.device(r).Register(words[r].data(), 8 * words[r].size()));
      return BitwiseAllreduce(job.comm(r), *region, kAnd, kOr, job.scratch(r));
    });
    ExpectAllOk(statuses);
    for (int r = 0; r < n; ++r) EXPECT_EQ(words[r], want) << "rank " << r << " of " << n;
  }
}

// A rank that passes more words than its peers: every rank fails, none hangs.
TEST_P(BitwiseAllreduceTest, MismatchedWordCountsFailOnEveryRank) {
  const int n = 3;
  Job job(n);
  ASSERT_TRUE(job.ok());
  for (int r = 0; r < n; ++r) {
    job.comm(r).bitwise_direct_max_ranks = GetParam() ? n : 1;
    job.comm(r).timeout = std::chrono::milliseconds(3000);
  }
  std::vector<std::vector<uint64_t>> words(n, std::vector<uint64_t>(4, 1));
  words[2].push_back(1);
  auto statuses = job.Run([&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(auto region,
                          job.device(r).Register(words[r].data(), 8 * words[r].size()));
    return BitwiseAllreduce(job.comm(r), *region, 2, words[r].size() - 2, job.scratch(r));
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(statuses[r].ok()) << "rank " << r;
    EXPECT_NE(statuses[r].ToString().find("bitwise allreduce"), std::string::npos)
        << "rank " << r << ": " << statuses[r].ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Algorithms, BitwiseAllreduceTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "direct" : "recursive_doubling";
                         });

// A payload riding the direct bit exchange: summed in rank order, the same bits on every rank,
// where every rank sent as many bytes; otherwise not summed, the words combined all the same.
// Both forms: the direct exchange (sums in rank order) and recursive doubling (partners add the
// same partial sums).
class RidingExchangeTest : public ::testing::TestWithParam<bool> {};

TEST_P(RidingExchangeTest, SumsWhereEveryRankSentAsMany) {
  const bool direct = GetParam();
  constexpr size_t kAnd = 2, kOr = 1, kFloats = 300, kMax = 2048;
  for (int n = 1; n <= 7; ++n) {
    for (const int short_rank : {-1, 0, n - 1}) {
      const bool one_short = short_rank >= 0;
      if (one_short && n == 1) continue;
      SCOPED_TRACE(fmt::format(
          "{} ranks{}", n,
          one_short ? fmt::format(", rank {} sends no payload", short_rank) : std::string()));
      Job job(n);
      ASSERT_TRUE(job.ok());
      for (int r = 0; r < n; ++r) job.comm(r).bitwise_direct_max_ranks = direct ? n : 1;
      std::vector<std::vector<uint64_t>> bufs(static_cast<size_t>(n));
      std::vector<std::vector<float>> sums(static_cast<size_t>(n), std::vector<float>(kFloats, -1));
      std::vector<uint8_t> summed(static_cast<size_t>(n), 2);
      std::vector<float> want(kFloats, 0);
      std::mt19937 rng(static_cast<uint32_t>(n));
      std::uniform_real_distribution<float> u(-1, 1);
      for (int r = 0; r < n; ++r) {
        auto& b = bufs[static_cast<size_t>(r)];
        b.assign(kAnd + kOr + kMax / 8, 0);
        b[0] = ~uint64_t{0} ^ (uint64_t{1} << r);
        b[1] = ~uint64_t{0};
        b[2] = uint64_t{1} << r;
        auto* f = reinterpret_cast<float*>(b.data() + kAnd + kOr);
        for (size_t i = 0; i < kFloats; ++i) {
          f[i] = u(rng);
          want[i] = r == 0 ? f[i] : want[i] + f[i];  // rank order
        }
      }
      auto statuses = job.Run([&](int r) -> Status {
        auto& b = bufs[static_cast<size_t>(r)];
        KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(b.data(), 8 * b.size()));
        const size_t bytes = r == short_rank ? 0 : kFloats * sizeof(float);
        bool ok = false;
        KOLO_RETURN_IF_ERROR(BitwiseAllreduceRiding(
            job.comm(r), *region, kAnd, kOr, bytes, kMax, DataType::kFloat32,
            reinterpret_cast<uint8_t*>(sums[static_cast<size_t>(r)].data()), &ok, job.scratch(r)));
        summed[static_cast<size_t>(r)] = ok ? 1 : 0;
        return Status::OK();
      });
      ExpectAllOk(statuses);
      const uint64_t all = n == 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
      for (int r = 0; r < n; ++r) {
        const auto& b = bufs[static_cast<size_t>(r)];
        EXPECT_EQ(b[0], ~uint64_t{0} & ~all) << "rank " << r;
        EXPECT_EQ(b[1], ~uint64_t{0}) << "rank " << r;
        EXPECT_EQ(b[2], all) << "rank " << r;
        EXPECT_EQ(summed[static_cast<size_t>(r)], one_short ? 0 : 1) << "rank " << r;
        if (!one_short && direct) {
          // Bit for bit: every rank adds in rank order.
          EXPECT_EQ(std::memcmp(sums[static_cast<size_t>(r)].data(), want.data(),
                                kFloats * sizeof(float)),
                    0)
              << "rank " << r;
        }
        if (!one_short) {
          // The same bits on every rank, and the sum to float32's rounding.
          EXPECT_EQ(std::memcmp(sums[static_cast<size_t>(r)].data(), sums[0].data(),
                                kFloats * sizeof(float)),
                    0)
              << "rank " << r;
          for (size_t i = 0; i < kFloats; ++i) {
            ASSERT_NEAR(sums[static_cast<size_t>(r)][i], want[i], 1e-5) << "rank " << r << " " << i;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, RidingExchangeTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "direct" : "recursive_doubling";
                         });

TEST(RidingExchangeArgs, RefusesWhatItCannotCarry) {
  Job job(3);
  ASSERT_TRUE(job.ok());
  std::vector<uint64_t> b(64, 0);
  std::vector<uint8_t> sum(512);
  auto statuses = job.Run([&](int r) -> Status {
    std::vector<uint64_t> mine = b;
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(mine.data(), 8 * mine.size()));
    bool ok = false;
    Status big = BitwiseAllreduceRiding(job.comm(r), *region, 1, 1, 256, 128, DataType::kFloat32,
                                        sum.data(), &ok, job.scratch(r));
    if (big.ok() || big.message().find("at most 128") == std::string::npos) {
      return Internal("over the most: {}", big.ToString());
    }
    Status ragged = BitwiseAllreduceRiding(job.comm(r), *region, 1, 1, 6, 128, DataType::kFloat32,
                                           sum.data(), &ok, job.scratch(r));
    if (ragged.ok() || ragged.message().find("whole float32") == std::string::npos) {
      return Internal("not whole elements: {}", ragged.ToString());
    }
    return Status::OK();
  });
  ExpectAllOk(statuses);
}

TEST(Messages, GatherAndBroadcastFromEveryRoot) {
  for (int n : {1, 2, 3, 5}) {
    Job job(n);
    ASSERT_TRUE(job.ok());
    auto message = [](int r, int round) {
      std::vector<uint8_t> m(static_cast<size_t>((r * 977 + round * 13) % 3000));
      if (r == 1) m.clear();  // an empty message
      for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<uint8_t>(i + r + round);
      return m;
    };
    for (int root = 0; root < n; ++root) {
      std::vector<std::vector<std::vector<uint8_t>>> gathered(static_cast<size_t>(n));
      std::vector<std::vector<uint8_t>> broadcast(static_cast<size_t>(n));
      auto statuses = job.Run([&](int r) -> Status {
        KOLO_ASSIGN_OR_RETURN(gathered[r], GatherMessages(job.comm(r), root, message(r, root)));
        KOLO_ASSIGN_OR_RETURN(broadcast[r],
                              BroadcastMessage(job.comm(r), root, message(root, root + 100)));
        return Status::OK();
      });
      ExpectAllOk(statuses);
      ASSERT_EQ(gathered[root].size(), static_cast<size_t>(n));
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(gathered[root][r], message(r, root)) << "from rank " << r;
        EXPECT_EQ(broadcast[r], message(root, root + 100)) << "at rank " << r;
      }
    }
  }
}

TEST(Messages, PointToPointAndBarrier) {
  Job job(5);
  ASSERT_TRUE(job.ok());
  std::atomic<int> entered{0};
  auto statuses = job.Run([&](int r) -> Status {
    Comm& comm = job.comm(r);
    // A ring of point-to-point messages, one of them empty.
    const std::vector<uint8_t> mine(r == 2 ? 0 : 100 + r, static_cast<uint8_t>(r));
    KOLO_RETURN_IF_ERROR(r % 2 == 0 ? SendMessage(comm, (r + 1) % 5, mine, 0xabc) : Status::OK());
    KOLO_ASSIGN_OR_RETURN(auto got, RecvMessage(comm, (r + 4) % 5, 0xabc));
    KOLO_RETURN_IF_ERROR(r % 2 == 1 ? SendMessage(comm, (r + 1) % 5, mine, 0xabc) : Status::OK());
    const int left = (r + 4) % 5;
    if (got != std::vector<uint8_t>(left == 2 ? 0 : 100 + left, static_cast<uint8_t>(left))) {
      return Internal("rank {}: wrong message from rank {}", r, left);
    }
    // Nobody leaves the barrier before the last rank (which is late) has entered it.
    std::this_thread::sleep_for(milliseconds(r == 3 ? 200 : 0));
    entered.fetch_add(1);
    KOLO_RETURN_IF_ERROR(Barrier(comm));
    if (entered.load() != 5) return Internal("rank {} left the barrier early", r);
    return Status::OK();
  });
  ExpectAllOk(statuses);
}

TEST(Collectives, MismatchedCallsFailWithProtocolError) {
  Job job(2);
  ASSERT_TRUE(job.ok());
  for (int r = 0; r < 2; ++r) job.comm(r).timeout = milliseconds(5000);
  std::vector<std::vector<float>> bufs(2, std::vector<float>(1000, 1.0f));
  auto statuses = job.Run([&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), 4000));
    if (r == 0)
      return RingAllreduce(job.comm(r), *region, 0, 1000, DataType::kFloat32, job.scratch(r));
    return RingBroadcast(job.comm(r), *region, 0, 4000, 1);
  });
  EXPECT_TRUE(statuses[0].code() == StatusCode::kProtocol ||
              statuses[1].code() == StatusCode::kProtocol)
      << statuses[0].ToString() << " / " << statuses[1].ToString();
}

TEST(Collectives, AbortingRankFailsTheOthers) {
  Job job(4);
  ASSERT_TRUE(job.ok());
  std::vector<std::vector<float>> bufs(4, std::vector<float>(1 << 20, 1.0f));
  auto statuses = kolo::testing::RunRankThreads(4, [&](int r) -> Status {
    if (r == 2) {
      job.device(r).Abort(Internal("rank 2 ran out of memory"));
      return Status::OK();
    }
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), 4 << 20));
    return RingAllreduce(job.comm(r), *region, 0, 1 << 20, DataType::kFloat32, job.scratch(r));
  });
  for (int r : {0, 1, 3}) {
    EXPECT_TRUE(statuses[r].code() == StatusCode::kAborted ||
                statuses[r].code() == StatusCode::kUnavailable)
        << statuses[r].ToString();
    EXPECT_NE(statuses[r].message().find("rank 2"), std::string::npos) << statuses[r].message();
  }
}

// Zero-copy fusion: one allreduce over several separately registered buffers, with extents
// smaller than a piece, larger than a ring segment, empty, and straddling segment boundaries.
class RingExtents : public ::testing::TestWithParam<int> {};

TEST_P(RingExtents, ReduceTheConcatenationInPlace) {
  const int n = GetParam();
  const std::vector<size_t> counts = {3, 0, 70000, 1, 5000, 131072, 17, 0, 40000};
  Job job(n, /*chunk_bytes=*/16 << 10);
  ASSERT_TRUE(job.ok());
  std::vector<std::vector<std::vector<float>>> bufs(static_cast<size_t>(n));
  ExpectAllOk(job.Run([&](int r) -> Status {
    auto& mine = bufs[static_cast<size_t>(r)];
    std::vector<std::unique_ptr<Region>> regions;
    std::vector<Extent> extents;
    size_t base = 0;
    for (size_t c : counts) {
      // One guard element on each side, outside the extent: it must stay untouched.
      mine.emplace_back(c + 2, -7.0f);
      for (size_t i = 0; i < c; ++i) mine.back()[i + 1] = static_cast<float>((base + i) % 97 + r);
      base += c;
      KOLO_ASSIGN_OR_RETURN(auto region,
                            job.device(r).Register(mine.back().data(), (c + 2) * sizeof(float)));
      extents.push_back({region.get(), sizeof(float), c * sizeof(float)});
      regions.push_back(std::move(region));
    }
    return RingAllreduce(job.comm(r), extents, DataType::kFloat32, job.scratch(r));
  }));
  for (int r = 0; r < n; ++r) {
    size_t base = 0, wrong = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      const auto& b = bufs[static_cast<size_t>(r)][k];
      EXPECT_EQ(b.front(), -7.0f);
      EXPECT_EQ(b.back(), -7.0f);
      for (size_t i = 0; i < counts[k]; ++i) {
        const float want = static_cast<float>(n * ((base + i) % 97) + n * (n - 1) / 2);
        wrong += b[i + 1] != want;
      }
      base += counts[k];
    }
    EXPECT_EQ(wrong, 0u) << "rank " << r;
  }
}

TEST(RingExtentsErrors, MisalignedExtentIsRejected) {
  Job job(1);
  ASSERT_TRUE(job.ok());
  std::vector<float> buf(8);
  auto region = job.device(0).Register(buf.data(), sizeof(float) * buf.size());
  ASSERT_TRUE(region.ok());
  Status s =
      RingAllreduce(job.comm(0), {{region->get(), 0, 6}}, DataType::kFloat32, job.scratch(0));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
}

INSTANTIATE_TEST_SUITE_P(Ranks, RingExtents, ::testing::Values(1, 2, 3, 4, 5));

}  // namespace
}  // namespace kolo::collectives

namespace kolo::collectives {
namespace {

TEST(SettingMismatch, NamesEverySettingThatDiffersWithItsRanks) {
  const std::vector<MatchedSetting> base = {
      {"size", "4"}, {"backend", "ring"}, {"num_batches", "40"}};
  std::vector<std::vector<MatchedSetting>> all(4, base);
  EXPECT_EQ(DescribeSettingMismatch(all), "");
  all[3][2].value = "3";
  all[1][1].value = "mpi";
  all[2].pop_back();  // an older build that does not list it
  EXPECT_EQ(DescribeSettingMismatch(all),
            "ranks disagree on settings that must match: backend is 'mpi' on rank 1, 'ring' on "
            "ranks 0,2,3; num_batches is '3' on rank 3, '40' on ranks 0,1, not set on rank 2");
  // Same settings in another order: named as such, not passed.
  std::vector<std::vector<MatchedSetting>> swapped(2, base);
  std::swap(swapped[1][0], swapped[1][1]);
  EXPECT_NE(DescribeSettingMismatch(swapped).find("another order"), std::string::npos);
}

}  // namespace
}  // namespace kolo::collectives
