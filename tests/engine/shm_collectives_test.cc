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
#include "tests/engine/transport_test_util.h"

namespace kolo::collectives {
namespace {

using std::chrono::milliseconds;

// n ranks connected through `transport`, on the hosts `hosts` names (one host if empty).
class Job {
 public:
  Job(int n, const std::string& transport, size_t chunk_bytes,
      const std::vector<std::string>& hosts = {})
      : n_(n) {
    transport::ConnectSettings settings = kolo::testing::TestSettings();
    settings.hosts = kolo::testing::Layout(n, hosts);
    devices_ = kolo::testing::ConnectAll(transport, n, store_, settings);
    comms_.resize(static_cast<size_t>(n));
    scratch_.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      comms_[r].device = devices_[r].get();
      comms_[r].chunk_bytes = chunk_bytes;
      comms_[r].timeout = milliseconds(30000);
    }
  }
  bool ok() const {
    for (const auto& d : devices_) {
      if (!d) return false;
    }
    return true;
  }
  int size() const { return n_; }
  transport::Device& device(int r) { return *devices_[static_cast<size_t>(r)]; }
  Comm& comm(int r) { return comms_[static_cast<size_t>(r)]; }
  Scratch& scratch(int r) { return scratch_[static_cast<size_t>(r)]; }
  // Runs fn(rank) on every rank; a rank that fails aborts its device so the others stop too.
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
  kolo::testing::Devices devices_;
  std::vector<Comm> comms_;
  std::vector<Scratch> scratch_;
};

// Stores integer v as element i of a `dtype` array (uint8 and integers wrap).
void SetInt(DataType dtype, uint8_t* p, size_t i, int64_t v) {
  auto put = [&](auto x) { std::memcpy(p + i * sizeof x, &x, sizeof x); };
  switch (dtype) {
    case DataType::kFloat32:
      put(static_cast<float>(v));
      break;
    case DataType::kFloat64:
      put(static_cast<double>(v));
      break;
    case DataType::kFloat16:
      put(FloatToHalf(static_cast<float>(v)));
      break;
    case DataType::kBFloat16:
      put(FloatToBFloat16(static_cast<float>(v)));
      break;
    case DataType::kInt32:
      put(static_cast<int32_t>(v));
      break;
    case DataType::kInt64:
      put(v);
      break;
    case DataType::kUInt8:
      put(static_cast<uint8_t>(v));
      break;
  }
}

// Small integers: every partial sum of up to 8 ranks is exact in every dtype, whatever the order.
int64_t Value(int rank, size_t i) { return static_cast<int64_t>((i * 7 + rank * 13) % 11) - 5; }

constexpr size_t kGuard = 24;  // bytes before and after the data that must stay untouched

void CheckAllreduce(Job& job, DataType dtype, size_t count) {
  const int n = job.size();
  const size_t elem = DataTypeSize(dtype);
  std::vector<uint8_t> expected(count * elem);
  for (size_t i = 0; i < count; ++i) {
    int64_t sum = 0;
    for (int r = 0; r < n; ++r) sum += Value(r, i);
    SetInt(dtype, expected.data(), i, sum);
  }
  std::vector<std::vector<uint8_t>> bufs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto& b = bufs[static_cast<size_t>(r)];
    b.assign(count * elem + 2 * kGuard, 0xa5);
    for (size_t i = 0; i < count; ++i) SetInt(dtype, b.data() + kGuard, i, Value(r, i));
  }
  auto statuses = job.Run([&](int r) -> Status {
    auto& b = bufs[static_cast<size_t>(r)];
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(b.data(), b.size()));
    return RingAllreduce(job.comm(r), *region, kGuard, count, dtype, job.scratch(r));
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(statuses[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << statuses[static_cast<size_t>(r)].ToString();
  }
  for (int r = 0; r < n; ++r) {
    const auto& b = bufs[static_cast<size_t>(r)];
    EXPECT_EQ(std::memcmp(b.data() + kGuard, expected.data(), expected.size()), 0)
        << "rank " << r << " of " << n << ", " << count << " " << DataTypeName(dtype);
    for (size_t g = 0; g < kGuard; ++g) {
      ASSERT_EQ(b[g], 0xa5) << "rank " << r << " wrote before its buffer";
      ASSERT_EQ(b[kGuard + expected.size() + g], 0xa5) << "rank " << r << " wrote past its buffer";
    }
  }
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
