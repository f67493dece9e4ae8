// The ring collectives over the shared-memory transport and over auto (shared memory within a host
// name, TCP between), ranks as threads, against reference sums computed here independently of the
// code under test. (collectives_test.cc runs the same algorithms over TCP.)
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/collectives/collectives.h"
#include "tests/engine/ring_test_util.h"
#include "tests/engine/transport_test_util.h"

namespace kolo::collectives {
namespace {

using std::chrono::milliseconds;

using kolo::testing::RingJob;

// n ranks connected through `transport`, on the hosts `hosts` names (one host if empty).
class Job : public RingJob {
 public:
  Job(int n, const std::string& transport, size_t chunk_bytes,
      const std::vector<std::string>& hosts = {})
      : RingJob(n, transport, Settings(n, hosts), chunk_bytes) {}

 private:
  static transport::ConnectSettings Settings(int n, const std::vector<std::string>& hosts) {
    transport::ConnectSettings settings = kolo::testing::TestSettings();
    settings.hosts = kolo::testing::Layout(n, hosts);
    return settings;
  }
};

void CheckAllreduce(Job& job, DataType dtype, size_t count) {
  kolo::testing::CheckRingAllreduce(job, dtype, count);
}

class ShmRingAllreduce : public ::testing::TestWithParam<std::tuple<int, DataType>> {};

TEST_P(ShmRingAllreduce, MatchesReferenceSum) {
  const auto [n, dtype] = GetParam();
  Job job(n, "shm", 64 << 10);
  ASSERT_TRUE(job.ok());
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, static_cast<size_t>(n - 1),
                       static_cast<size_t>(n + 1), size_t{1000003}}) {
    SCOPED_TRACE(::testing::Message() << "count " << count);
    CheckAllreduce(job, dtype, count);
  }
}

INSTANTIATE_TEST_SUITE_P(RanksByDtype, ShmRingAllreduce,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::ValuesIn(AllDataTypes())),
                         [](const auto& info) {
                           return "np" + std::to_string(std::get<0>(info.param)) + "_" +
                                  DataTypeName(std::get<1>(info.param));
                         });

// 64 MiB, more than a ring per direction, at the engine's default chunk.
TEST(ShmRingAllreduceLarge, SixtyFourMiBFloat32) {
  for (int n : {2, 4, 8}) {
    SCOPED_TRACE(::testing::Message() << n << " ranks");
    Job job(n, "shm", 512 << 10);
    ASSERT_TRUE(job.ok());
    CheckAllreduce(job, DataType::kFloat32, (64 << 20) / 4);
  }
}

// The path of a transport that cannot combine as bytes arrive (whole pieces into scratch, summed
// from there), over shared memory.
TEST(ShmRingAllreduceLarge, ScratchPathMatchesReferenceSum) {
  for (int n : {2, 3, 5}) {
    Job job(n, "shm", 64 << 10);
    ASSERT_TRUE(job.ok());
    for (int r = 0; r < n; ++r) job.comm(r).accumulate_on_arrival = false;
    for (DataType dtype : {DataType::kFloat32, DataType::kFloat16, DataType::kInt64}) {
      for (size_t count : {size_t{1}, static_cast<size_t>(n + 1), size_t{1000003}}) {
        SCOPED_TRACE(::testing::Message() << n << " ranks, count " << count);
        CheckAllreduce(job, dtype, count);
      }
    }
  }
}

// The auto transport with the ranks on two host names: the ring runs over shared memory between
// ranks of a host and over TCP between the hosts.
TEST(AutoRingAllreduce, TwoHostsOfTwoAndThreeRanks) {
  for (const auto& hosts : std::vector<std::vector<std::string>>{
           {"a", "a", "b", "b"}, {"a", "b", "a", "b"}, {"a", "a", "a", "b", "b", "b"}}) {
    const int n = static_cast<int>(hosts.size());
    Job job(n, "auto", 64 << 10, hosts);
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(transport::PairTransports(job.device(0)), "shm+tcp");
    for (DataType dtype : AllDataTypes()) {
      for (size_t count : {size_t{0}, size_t{5}, size_t{1000003}}) {
        SCOPED_TRACE(::testing::Message()
                     << n << " ranks, " << DataTypeName(dtype) << ", count " << count);
        CheckAllreduce(job, dtype, count);
      }
    }
    CheckAllreduce(job, DataType::kFloat32, (64 << 20) / 4);
  }
}

TEST(ShmCollectives, BroadcastAndAllgatherFromEveryRank) {
  Job job(5, "shm", 4096);
  ASSERT_TRUE(job.ok());
  const size_t bytes = 100003;
  for (int root = 0; root < 5; ++root) {
    std::vector<std::vector<uint8_t>> bufs(5, std::vector<uint8_t>(bytes, 0));
    bufs[static_cast<size_t>(root)] = kolo::testing::Pattern(bytes, static_cast<uint32_t>(root));
    auto statuses = job.Run([&](int r) -> Status {
      KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), bytes));
      return RingBroadcast(job.comm(r), *region, 0, bytes, root);
    });
    for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
    for (int r = 0; r < 5; ++r) EXPECT_TRUE(bufs[r] == bufs[root]) << "root " << root;
  }
  std::vector<size_t> per_rank = {10, 0, 70001, 3, 4096};
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
    return RingAllgatherv(job.comm(r), *region, 0, per_rank);
  });
  for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  for (int r = 0; r < 5; ++r) EXPECT_TRUE(bufs[r] == want) << "rank " << r;
}

}  // namespace
}  // namespace kolo::collectives
