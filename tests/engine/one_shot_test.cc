// The one-shot allreduce through a host-wide shared-memory area (collectives/one_shot.cc) and the
// area's set-up (transport/shm/host_area.h): ranks as threads of this process over the real shm
// transport, the area mapped through /proc as separate processes map it.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/collectives/collectives.h"
#include "engine/collectives/plan.h"
#include "engine/transport/shm/host_area.h"
#include "engine/transport/shm/segment.h"
#include "tests/engine/rank_threads.h"
#include "tests/engine/ring_test_util.h"

namespace kolo::collectives {
namespace {

using kolo::testing::CheckAllreduceWith;
using kolo::testing::kGuard;
using kolo::testing::RingJob;
using transport::shm::HostArea;

constexpr const char* kSecret = "one-shot-test-secret";

transport::ConnectSettings Settings() {
  transport::ConnectSettings s;
  s.secret = kSecret;
  s.timeout = std::chrono::milliseconds(20000);
  s.shm_ring_bytes = 64 << 10;
  return s;
}

// n ranks over shm, each with the host area attached (comm.host_area set).
class AreaJob : public RingJob {
 public:
  explicit AreaJob(int n, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000))
      : RingJob(n, "shm", Settings(), 16 << 10, timeout), areas_(static_cast<size_t>(n)) {
    if (!ok()) return;
    auto statuses = kolo::testing::RunRankThreads(n, [&](int r) -> Status {
      KOLO_ASSIGN_OR_RETURN(areas_[static_cast<size_t>(r)],
                            AttachHostArea(comm(r), store_, "area", kSecret,
                                           std::chrono::microseconds(20), scratch(r)));
      comm(r).host_area = areas_[static_cast<size_t>(r)].get();
      return Status::OK();
    });
    for (const Status& s : statuses) attached_ = attached_ && s.ok();
    for (const auto& a : areas_) attached_ = attached_ && a != nullptr;
  }
  bool attached() const { return attached_; }
  HostArea& area(int r) { return *areas_[static_cast<size_t>(r)]; }

 private:
  bootstrap::InMemoryStore store_;
  std::vector<std::unique_ptr<HostArea>> areas_;
  bool attached_ = true;
};

// The area is opened through /proc/<pid>/fd: where /proc is not mounted there is none to test.
#define KOLO_NEED_PROC()                                                                    \
  if (::access("/proc/self/fd", R_OK) != 0) {                                               \
    GTEST_SKIP() << "/proc/self/fd is not readable here (no /proc): the host-wide area is " \
                    "opened through /proc/<pid>/fd";                                        \
  }

class OneShot : public ::testing::TestWithParam<int> {};

// Every dtype, counts from nothing to several slots' worth (pieces), on every rank count.
TEST_P(OneShot, ExactOnEveryDtypeAndCount) {
  KOLO_NEED_PROC();
  const int n = GetParam();
  AreaJob job(n);
  ASSERT_TRUE(job.attached());
  for (DataType dtype :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16,
        DataType::kInt32, DataType::kInt64, DataType::kUInt8}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}, static_cast<size_t>(n + 1), size_t{1000},
                         size_t{40001}}) {
      CheckAllreduceWith(job, dtype, count, [&](int r, transport::Region& region) {
        return AllreduceWith(AllreduceAlgorithm::kOneShot, 1, job.comm(r), region, kGuard, count,
                             dtype, job.scratch(r));
      });
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, OneShot, ::testing::Values(1, 2, 3, 4, 5, 8, 13));

// Many calls back to back, the ranks held up at random between them, so that fast ranks write the
// next bank while slow ones still read the last: random floats must come out the same bits on
// every rank, and the float sum to rounding, call after call.
TEST(OneShotBanks, BackToBackCallsWithSkewedRanksAgreeBitForBit) {
  KOLO_NEED_PROC();
  const int n = 7;
  AreaJob job(n);
  ASSERT_TRUE(job.attached());
  const int calls = 60;
  std::vector<std::vector<std::vector<float>>> bufs(
      static_cast<size_t>(n), std::vector<std::vector<float>>(static_cast<size_t>(calls)));
  std::vector<std::vector<double>> exact(static_cast<size_t>(calls));
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int c = 0; c < calls; ++c) {
    // Sizes alternate across the slot: 1 to 3 pieces.
    const size_t count = 100 + static_cast<size_t>(c) * 397 % 20000;
    exact[static_cast<size_t>(c)].assign(count, 0);
    for (int r = 0; r < n; ++r) {
      auto& b = bufs[static_cast<size_t>(r)][static_cast<size_t>(c)];
      b.resize(count);
      for (size_t i = 0; i < count; ++i) {
        b[i] = dist(gen);
        exact[static_cast<size_t>(c)][i] += b[i];
      }
    }
  }
  auto statuses = job.Run([&](int r) -> Status {
    std::mt19937 delay(static_cast<uint32_t>(r) * 31 + 5);
    for (int c = 0; c < calls; ++c) {
      auto& b = bufs[static_cast<size_t>(r)][static_cast<size_t>(c)];
      if (delay() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(delay() % 300));
      KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(b.data(), b.size() * 4));
      KOLO_RETURN_IF_ERROR(OneShotAllreduce(job.comm(r), *region, 0, b.size(), DataType::kFloat32));
    }
    return Status::OK();
  });
  for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  for (int c = 0; c < calls; ++c) {
    const auto& first = bufs[0][static_cast<size_t>(c)];
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(
          std::memcmp(first.data(), bufs[static_cast<size_t>(r)][static_cast<size_t>(c)].data(),
                      first.size() * 4),
          0)
          << "call " << c << " rank " << r;
    }
    for (size_t i = 0; i < first.size(); ++i) {
      ASSERT_NEAR(first[i], exact[static_cast<size_t>(c)][i], 1e-5) << "call " << c << " " << i;
    }
  }
  // Every piece was a call of the area's, the same count on every rank.
  for (int r = 1; r < n; ++r) EXPECT_EQ(job.area(r).calls, job.area(0).calls);
  EXPECT_GT(job.area(0).calls, static_cast<uint64_t>(calls));
}

// The control words carry the call number's low 32 bits: calls go on across 2^32 (a long job's
// small allreduces), compared modulo 2^32, with the banks still waited for.
TEST(OneShotBanks, CallNumbersWrapAround) {
  KOLO_NEED_PROC();
  const int n = 3;
  AreaJob job(n);
  ASSERT_TRUE(job.attached());
  const uint64_t start = (uint64_t{1} << 32) - 6;
  for (int r = 0; r < n; ++r) {
    job.area(r).calls = start;
    job.area(0).control(r).published.store(static_cast<uint32_t>(start));
    job.area(0).control(r).consumed.store(static_cast<uint32_t>(start));
  }
  std::vector<std::vector<int32_t>> bufs(n);
  auto statuses = job.Run([&](int r) -> Status {
    for (int c = 0; c < 12; ++c) {
      auto& b = bufs[static_cast<size_t>(r)];
      b.assign(100, r + c);
      KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(b.data(), b.size() * 4));
      KOLO_RETURN_IF_ERROR(OneShotAllreduce(job.comm(r), *region, 0, b.size(), DataType::kInt32));
      for (int32_t v : b) {
        if (v != 3 + 3 * c) return Internal("call {}: {} where {} was due", c, v, 3 + 3 * c);
      }
    }
    return Status::OK();
  });
  for (const Status& st : statuses) ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(job.area(0).calls, start + 12);
  EXPECT_EQ(job.area(0).control(0).published.load(), static_cast<uint32_t>(start + 12));
}

TEST(OneShotExtents, ReducesScatteredPiecesInPlace) {
  KOLO_NEED_PROC();
  AreaJob job(5);
  ASSERT_TRUE(job.attached());
  // Pieces of 5, 0 and 9000 floats (the last spans two slots).
  std::vector<std::vector<float>> a(5, std::vector<float>(5)), b(5, std::vector<float>(9000));
  for (int r = 0; r < 5; ++r) {
    for (size_t i = 0; i < 5; ++i) a[r][i] = static_cast<float>(r + i);
    for (size_t i = 0; i < 9000; ++i)
      b[r][i] = static_cast<float>(10 * r - static_cast<int>(i % 50));
  }
  const auto before_a = a, before_b = b;
  auto statuses = job.Run([&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(auto ra, job.device(r).Register(a[r].data(), 20));
    KOLO_ASSIGN_OR_RETURN(auto rb, job.device(r).Register(b[r].data(), 36000));
    std::vector<Extent> e{{ra.get(), 0, 20}, {rb.get(), 0, 0}, {rb.get(), 0, 36000}};
    return AllreduceWith(AllreduceAlgorithm::kOneShot, 1, job.comm(r), e, DataType::kFloat32,
                         job.scratch(r));
  });
  for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  for (int r = 0; r < 5; ++r) {
    for (size_t i = 0; i < 5; ++i) {
      float sum = 0;
      for (int q = 0; q < 5; ++q) sum += before_a[q][i];
      ASSERT_EQ(a[r][i], sum);
    }
    for (size_t i = 0; i < 9000; ++i) {
      float sum = 0;
      for (int q = 0; q < 5; ++q) sum += before_b[q][i];
      ASSERT_EQ(b[r][i], sum) << i;
    }
  }
}

// A rank that never calls: the others stop within the timeout, naming it.
TEST(OneShotFailure, AMissingRankIsNamedWithinTheTimeout) {
  KOLO_NEED_PROC();
  AreaJob job(4, std::chrono::milliseconds(1500));
  ASSERT_TRUE(job.attached());
  std::vector<std::vector<float>> bufs(4, std::vector<float>(64, 1.0f));
  const auto start = std::chrono::steady_clock::now();
  auto statuses = kolo::testing::RunRankThreads(4, [&](int r) -> Status {
    if (r == 3) return Status::OK();
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), 256));
    return OneShotAllreduce(job.comm(r), *region, 0, 64, DataType::kFloat32);
  });
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < 3; ++r) {
    const Status& s = statuses[static_cast<size_t>(r)];
    ASSERT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
    EXPECT_NE(s.message().find("rank 3 has not published"), std::string::npos) << s.ToString();
  }
  EXPECT_LT(took, 10.0);
}

// Ranks that put in different sizes (they ran different collectives) fail naming both sizes.
TEST(OneShotFailure, DifferentSizesAreAProtocolError) {
  KOLO_NEED_PROC();
  AreaJob job(3, std::chrono::milliseconds(3000));
  ASSERT_TRUE(job.attached());
  std::vector<std::vector<float>> bufs(3, std::vector<float>(64, 1.0f));
  auto statuses = kolo::testing::RunRankThreads(3, [&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(bufs[r].data(), 256));
    return OneShotAllreduce(job.comm(r), *region, 0, r == 1 ? 32 : 64, DataType::kFloat32);
  });
  for (const Status& s : statuses) {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("put in"), std::string::npos) << s.ToString();
  }
}

// The negotiation's bit exchange through the area: the words combined (AND, OR) as the messages
// combine them, a payload summed in rank order where every rank offered one, none where a rank
// did not, and no byte through the transport.
TEST(HostAreaExchange, CombinesWordsAndRidesWithoutAMessage) {
  KOLO_NEED_PROC();
  for (int n : {2, 3, 5}) {
    SCOPED_TRACE(fmt::format("{} ranks", n));
    AreaJob job(n);
    ASSERT_TRUE(job.attached());
    constexpr size_t kAnd = 3, kOr = 2, kFloats = 37;
    constexpr size_t kWordBytes = (kAnd + kOr) * 8;
    ASSERT_TRUE(BitExchangeThroughHostArea(job.comm(0), kWordBytes + kFloats * 4));
    std::mt19937_64 gen(static_cast<uint64_t>(n));
    // words then payload, per rank; rank n - 1 offers nothing in the second exchange.
    std::vector<std::vector<uint64_t>> words(static_cast<size_t>(n));
    std::vector<std::vector<float>> payload(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (size_t w = 0; w < kAnd + kOr; ++w) words[static_cast<size_t>(r)].push_back(gen());
      for (size_t i = 0; i < kFloats; ++i) {
        payload[static_cast<size_t>(r)].push_back(static_cast<float>(gen() % 1000) / 7.0f);
      }
    }
    std::vector<uint64_t> want(kAnd + kOr);
    for (size_t w = 0; w < kAnd + kOr; ++w) {
      want[w] = w < kAnd ? ~uint64_t{0} : 0;
      for (int r = 0; r < n; ++r) {
        want[w] = w < kAnd ? want[w] & words[static_cast<size_t>(r)][w]
                           : want[w] | words[static_cast<size_t>(r)][w];
      }
    }
    std::vector<float> want_sum = payload[0];
    for (int r = 1; r < n; ++r) {
      for (size_t i = 0; i < kFloats; ++i) want_sum[i] += payload[static_cast<size_t>(r)][i];
    }
    std::vector<uint64_t> sent(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) sent[static_cast<size_t>(r)] = job.device(r).bytes_sent();
    for (int exchange = 0; exchange < 2; ++exchange) {
      std::vector<int> summed(static_cast<size_t>(n), -1);
      std::vector<std::vector<float>> sums(static_cast<size_t>(n), std::vector<float>(kFloats));
      std::vector<std::vector<uint64_t>> bufs(static_cast<size_t>(n));
      auto statuses = job.Run([&](int r) -> Status {
        auto& b = bufs[static_cast<size_t>(r)];
        b = words[static_cast<size_t>(r)];
        b.resize(kAnd + kOr + kFloats / 2 + 1);
        const bool offers = exchange == 0 || r != n - 1;
        std::memcpy(b.data() + kAnd + kOr, payload[static_cast<size_t>(r)].data(), kFloats * 4);
        KOLO_ASSIGN_OR_RETURN(auto region, job.device(r).Register(b.data(), b.size() * 8));
        bool did = false;
        KOLO_RETURN_IF_ERROR(BitwiseAllreduceRiding(
            job.comm(r), *region, kAnd, kOr, offers ? kFloats * 4 : 0, kFloats * 4,
            DataType::kFloat32, reinterpret_cast<uint8_t*>(sums[static_cast<size_t>(r)].data()),
            &did, job.scratch(r)));
        summed[static_cast<size_t>(r)] = did ? 1 : 0;
        return Status::OK();
      });
      for (const Status& st : statuses) ASSERT_TRUE(st.ok()) << st.ToString();
      for (int r = 0; r < n; ++r) {
        for (size_t w = 0; w < kAnd + kOr; ++w) {
          ASSERT_EQ(bufs[static_cast<size_t>(r)][w], want[w]) << "rank " << r << " word " << w;
        }
        ASSERT_EQ(summed[static_cast<size_t>(r)], exchange == 0 ? 1 : 0) << "rank " << r;
        if (exchange == 0) {
          for (size_t i = 0; i < kFloats; ++i) {
            ASSERT_EQ(sums[static_cast<size_t>(r)][i], want_sum[i]) << "rank " << r << " " << i;
          }
        }
      }
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(job.device(r).bytes_sent(), sent[static_cast<size_t>(r)])
          << "rank " << r << " sent through the transport";
    }
  }
}

// More than a slot's bank: the messages carry the exchange (the same decision on every rank).
TEST(HostAreaExchange, AnExchangeLargerThanASlotGoesByMessage) {
  KOLO_NEED_PROC();
  AreaJob job(3);
  ASSERT_TRUE(job.attached());
  const size_t words = HostArea::kDefaultSlotBytes / 8 + 1;
  EXPECT_FALSE(BitExchangeThroughHostArea(job.comm(0), words * 8));
  std::vector<std::vector<uint64_t>> bufs(3);
  auto statuses = job.Run([&](int r) -> Status {
    bufs[static_cast<size_t>(r)].assign(words, uint64_t{1} << r);
    KOLO_ASSIGN_OR_RETURN(auto region,
                          job.device(r).Register(bufs[static_cast<size_t>(r)].data(), words * 8));
    return BitwiseAllreduce(job.comm(r), *region, 0, words, job.scratch(r));
  });
  for (const Status& st : statuses) ASSERT_TRUE(st.ok()) << st.ToString();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(bufs[static_cast<size_t>(r)][words - 1], 7u);
    EXPECT_GT(job.device(r).bytes_sent(), words * 8);
  }
}

// A rank idle on its doorbell: woken by a peer entering an exchange (peer_ahead, and the exchange
// then completes), and by its own bell (a submission), long before its deadline; neither, it
// returns at the deadline.
TEST(HostAreaExchange, AnIdleRankWakesForAPeerOrItsBell) {
  KOLO_NEED_PROC();
  AreaJob job(2);
  ASSERT_TRUE(job.attached());
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point since) {
    return std::chrono::duration<double>(Clock::now() - since).count();
  };
  // Nothing happens: back at the deadline, nobody ahead.
  auto start = Clock::now();
  bool ahead = true;
  ASSERT_TRUE(AwaitHostDoorbell(job.comm(1), HostDoorbell(job.area(1)),
                                start + std::chrono::milliseconds(30), &ahead)
                  .ok());
  EXPECT_FALSE(ahead);
  EXPECT_GE(seconds(start), 0.029);
  // The bell.
  start = Clock::now();
  const uint32_t rung = HostDoorbell(job.area(1));
  std::thread bell([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    RingHostDoorbell(&job.area(1));
  });
  ASSERT_TRUE(AwaitHostDoorbell(job.comm(1), rung, start + std::chrono::seconds(20), &ahead).ok());
  bell.join();
  EXPECT_FALSE(ahead);
  EXPECT_LT(seconds(start), 10.0);
  // A peer's exchange.
  std::vector<uint64_t> w0{1, 3}, w1{3, 4};
  auto r0 = job.device(0).Register(w0.data(), 16);
  auto r1 = job.device(1).Register(w1.data(), 16);
  ASSERT_TRUE(r0.ok() && r1.ok());
  start = Clock::now();
  Status peer;
  std::thread enters([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    peer = BitwiseAllreduce(job.comm(0), **r0, 1, 1, job.scratch(0));
  });
  Status idle = AwaitHostDoorbell(job.comm(1), HostDoorbell(job.area(1)),
                                  start + std::chrono::seconds(20), &ahead);
  const double woke = seconds(start);
  if (idle.ok() && ahead) idle = BitwiseAllreduce(job.comm(1), **r1, 1, 1, job.scratch(1));
  enters.join();
  ASSERT_TRUE(idle.ok()) << idle.ToString();
  ASSERT_TRUE(peer.ok()) << peer.ToString();
  EXPECT_TRUE(ahead);
  EXPECT_LT(woke, 10.0);
  EXPECT_EQ(w0, (std::vector<uint64_t>{1, 7}));
  EXPECT_EQ(w1, (std::vector<uint64_t>{1, 7}));
}

// A rank that never enters the exchange: the others stop within the timeout, naming it and the
// exchange.
TEST(HostAreaExchange, AMissingRankIsNamedWithinTheTimeout) {
  KOLO_NEED_PROC();
  AreaJob job(3, std::chrono::milliseconds(1500));
  ASSERT_TRUE(job.attached());
  std::vector<std::vector<uint64_t>> bufs(3, std::vector<uint64_t>(2, 1));
  auto statuses = kolo::testing::RunRankThreads(3, [&](int r) -> Status {
    if (r == 2) return Status::OK();
    KOLO_ASSIGN_OR_RETURN(auto region,
                          job.device(r).Register(bufs[static_cast<size_t>(r)].data(), 16));
    return BitwiseAllreduce(job.comm(r), *region, 1, 1, job.scratch(r));
  });
  for (int r = 0; r < 2; ++r) {
    const Status& s = statuses[static_cast<size_t>(r)];
    ASSERT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
    EXPECT_NE(s.message().find("bit exchange (host-wide shared memory): rank 2 has not published"),
              std::string::npos)
        << s.ToString();
  }
}

// Without an area the algorithm refuses at once.
TEST(OneShotFailure, NoAreaIsRefused) {
  RingJob job(2, "shm", Settings(), 16 << 10);
  ASSERT_TRUE(job.ok());
  float x = 1;
  auto region = job.device(0).Register(&x, 4);
  ASSERT_TRUE(region.ok());
  Status s = OneShotAllreduce(job.comm(0), **region, 0, 1, DataType::kFloat32);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("host-wide"), std::string::npos) << s.ToString();
}

// --- the area's set-up ------------------------------------------------------------------------

// Rank 0 could not make it: the others fail at once with its reason.
TEST(HostAreaSetup, RankZerosFailureReachesTheOthersAtOnce) {
  bootstrap::InMemoryStore store;
  ASSERT_TRUE(
      store.Set("area", {'u', 'n', 'a', 'v', 'a', 'i', 'l', 'a', 'b', 'l', 'e', ' ', 'x'}).ok());
  const auto start = std::chrono::steady_clock::now();
  auto area = HostArea::Attach(store, "area", "0123456789abcdef", 1, 2, 32 << 10,
                               std::chrono::milliseconds(20000));
  ASSERT_FALSE(area.ok());
  EXPECT_NE(area.status().message().find("rank 0 could not make"), std::string::npos)
      << area.status().ToString();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

// An announcement that points at anything but rank 0's sealed area is refused, naming it.
TEST(HostAreaSetup, RefusesAFileThatIsNotTheAreaAnnounced) {
  KOLO_NEED_PROC();
  // A plain temporary file of the right size: not a sealed memory file.
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  const size_t bytes = transport::shm::HostAreaBytes(2, 32 << 10);
  ASSERT_EQ(::ftruncate(::fileno(f), static_cast<off_t>(bytes)), 0);
  bootstrap::InMemoryStore store;
  const std::string text = fmt::format("{} {} {}", ::getpid(), ::fileno(f), std::string(32, '0'));
  ASSERT_TRUE(store.Set("area", std::vector<uint8_t>(text.begin(), text.end())).ok());
  auto area = HostArea::Attach(store, "area", "0123456789abcdef", 1, 2, 32 << 10,
                               std::chrono::milliseconds(2000));
  ASSERT_FALSE(area.ok());
  EXPECT_NE(area.status().message().find("refusing"), std::string::npos)
      << area.status().ToString();
  std::fclose(f);

  // Rank 0's real area announced with another nonce: a foreign header.
  bootstrap::InMemoryStore store2;
  auto made = HostArea::Attach(store2, "area", "0123456789abcdef", 0, 2, 32 << 10,
                               std::chrono::milliseconds(2000));
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto announced = store2.Get("area", std::chrono::milliseconds(100));
  ASSERT_TRUE(announced.ok());
  std::string forged(announced->begin(), announced->end());
  forged.replace(forged.size() - 32, 32, std::string(32, 'f'));
  bootstrap::InMemoryStore store3;
  ASSERT_TRUE(store3.Set("area", std::vector<uint8_t>(forged.begin(), forged.end())).ok());
  auto opened = HostArea::Attach(store3, "area", "0123456789abcdef", 1, 2, 32 << 10,
                                 std::chrono::milliseconds(2000));
  ASSERT_FALSE(opened.ok());
  EXPECT_NE(opened.status().message().find("not the one rank 0 announced"), std::string::npos)
      << opened.status().ToString();
}

// One rank that cannot map the area: every rank ends without one (and says so), none fails.
TEST(HostAreaSetup, AllRanksGoWithoutWhenOneCannotMapIt) {
  const int n = 4;
  RingJob job(n, "shm", Settings(), 16 << 10);
  ASSERT_TRUE(job.ok());
  bootstrap::InMemoryStore store, other;
  const std::string bad = "unavailable made up for the test";
  ASSERT_TRUE(other.Set("area", std::vector<uint8_t>(bad.begin(), bad.end())).ok());
  std::vector<std::unique_ptr<HostArea>> areas(n);
  auto statuses = kolo::testing::RunRankThreads(n, [&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(areas[r],
                          AttachHostArea(job.comm(r), r == 2 ? other : store, "area", kSecret,
                                         std::chrono::microseconds(20), job.scratch(r)));
    return Status::OK();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r].ToString();
    EXPECT_EQ(areas[r], nullptr) << "rank " << r;
  }
}

// --- the rule ---------------------------------------------------------------------------------

TEST(OneShotRule, PickedOnOneHostWithAnAreaUpToItsBytes) {
  EXPECT_EQ(ChooseAllreduceAlgorithm(4096, 4, 1, true), AllreduceAlgorithm::kOneShot);
  EXPECT_EQ(ChooseAllreduceAlgorithm(kOneShotMaxBytes, 16, 1, true), AllreduceAlgorithm::kOneShot);
  // Every rank reads every rank's buffer: with more ranks, smaller buffers only.
  EXPECT_EQ(ChooseAllreduceAlgorithm(16 << 10, 64, 1, true), AllreduceAlgorithm::kOneShot);
  EXPECT_EQ(ChooseAllreduceAlgorithm(32 << 10, 64, 1, true),
            AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(ChooseAllreduceAlgorithm(kOneShotMaxBytes + 4, 4, 1, true),
            AllreduceAlgorithm::kHalvingDoubling);
  EXPECT_EQ(ChooseAllreduceAlgorithm(4096, 4, 1, false), AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(ChooseAllreduceAlgorithm(4096, 4, 2, true), AllreduceAlgorithm::kRecursiveDoubling);
  EXPECT_EQ(ChooseAllreduceAlgorithm(4096, 1, 1, true), AllreduceAlgorithm::kRing);
}

}  // namespace
}  // namespace kolo::collectives
