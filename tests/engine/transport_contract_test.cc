// The transport contract (engine/transport/transport.h), the same cases over every transport of
// the registry: tcp, shm, auto on one host (all pairs over shared memory) and auto with the ranks
// split over two host names (shared memory within each, TCP between them), and, in builds with
// rdma-core's headers, rdma over the software verbs device (rdma_SoftVerbs: the protocol logic,
// not RDMA hardware; no QP, MR or CQ may outlive a test) and over every real RDMA device
// libibverbs finds (rdma_libibverbs: skipped, saying why, where there is none). Ranks are threads
// over an InMemoryStore; the transports are real (loopback sockets, shared memory, verbs).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/transport/registry.h"
#include "kolo/config.h"
#if KOLO_HAVE_IBVERBS
#include "engine/transport/rdma/device.h"
#include "engine/transport/rdma/soft/soft_verbs.h"
#endif
#include "tests/engine/rank_threads.h"
#include "tests/engine/transport_test_util.h"

namespace kolo::transport {
namespace {

using kolo::testing::ConnectAll;
using kolo::testing::Devices;
using kolo::testing::Pattern;
using kolo::testing::RunRankThreads;
using kolo::testing::TestSettings;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

struct Variant {
  const char* label;
  const char* transport;
  bool two_hosts;  // ranks [0, n/2) on host "a", the others on host "b"
  // The rdma transport's verbs table ("soft", "libibverbs"); null for the others.
  const char* ib_verbs = nullptr;
  // TCP: connections per pair; messages of 4 KiB and more are striped across them.
  int tcp_streams = 1;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.label; }

class TransportContract : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
#if KOLO_HAVE_IBVERBS
    const char* verbs = GetParam().ib_verbs;
    if (verbs != nullptr && std::string(verbs) == "libibverbs") {
      auto table = rdma::LoadLibibverbs();
      if (!table.ok()) GTEST_SKIP() << "no real RDMA device to test: " << table.status().ToString();
      auto names = rdma::DeviceNames(**table);
      if (!names.ok() || names->empty()) {
        GTEST_SKIP() << "no real RDMA device to test: libibverbs lists none";
      }
    }
#endif
  }
  void TearDown() override {
#if KOLO_HAVE_IBVERBS
    if (GetParam().ib_verbs != nullptr && std::string(GetParam().ib_verbs) == "soft") {
      const rdma::soft::Live live = rdma::soft::LiveObjects();
      EXPECT_EQ(live.qps, 0);
      EXPECT_EQ(live.mrs, 0);
      EXPECT_EQ(live.cqs, 0);
      EXPECT_EQ(live.channels, 0);
      EXPECT_EQ(live.pds, 0);
      EXPECT_EQ(live.contexts, 0);
    }
#endif
  }
  // Whether a sender's messages complete without a posted receive up to a few hundred KiB (socket
  // buffers, shared-memory rings); RDMA buffers only eager-sized messages and waits for the
  // receive's advert beyond.
  bool BuffersLargeSends() const { return GetParam().ib_verbs == nullptr; }

  // Connects n ranks as threads through the variant's transport.
  Devices Connect(int n, bootstrap::Store& store, milliseconds timeout = milliseconds(20000),
                  bool busy_poll = false) {
    ConnectSettings s = TestSettings(timeout);
    s.busy_poll = busy_poll;
    if (GetParam().ib_verbs != nullptr) s.ib_verbs = GetParam().ib_verbs;
    s.tcp_streams = GetParam().tcp_streams;
    s.tcp_stripe_min_bytes = 4096;
    if (GetParam().two_hosts) {
      std::vector<std::string> hosts;
      for (int r = 0; r < n; ++r) hosts.push_back(r < (n + 1) / 2 ? "a" : "b");
      s.hosts = bootstrap::HostLayout(hosts);
    }
    return ConnectAll(GetParam().transport, n, store, s);
  }
};

TEST_P(TransportContract, SendRecvEverySize) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(4, store);
  ASSERT_TRUE(d[0] && d[1] && d[2] && d[3]);
  // Rank 0 to a rank of its own host and to one of the other host (two_hosts), larger messages
  // than a shared-memory ring included.
  const std::vector<size_t> sizes = {0, 1, 7, 24, 4096, 65539, 1 << 20, 9 << 20, 64 << 20};
  size_t total = 0;
  for (int to : {1, 3}) {
    for (size_t size : sizes) {
      const std::vector<uint8_t> sent = Pattern(size, static_cast<uint32_t>(size + to));
      std::vector<uint8_t> got(size + 16, 0xee);
      auto statuses = RunRankThreads(2, [&](int i) -> Status {
        Device& dev = *d[i == 0 ? 0 : to];
        std::vector<Completion> done;
        if (i == 0) {
          KOLO_ASSIGN_OR_RETURN(auto region, dev.Register(const_cast<uint8_t*>(sent.data()), size));
          KOLO_RETURN_IF_ERROR(dev.pair(to).Send(*region, 0, size, 1000 + size));
        } else {
          KOLO_ASSIGN_OR_RETURN(auto region, dev.Register(got.data(), got.size()));
          KOLO_RETURN_IF_ERROR(dev.pair(0).Recv(*region, 8, size + 8, 1000 + size));
        }
        KOLO_RETURN_IF_ERROR(WaitFor(dev, 1, &done, milliseconds(20000)));
        if (done.size() != 1 || done[0].nbytes != size || done[0].tag != 1000 + size ||
            done[0].peer != (i == 0 ? to : 0) ||
            done[0].kind != (i == 0 ? OpKind::kSend : OpKind::kRecv)) {
          return Internal("rank {}: unexpected completion for size {}", i == 0 ? 0 : to, size);
        }
        return Status::OK();
      });
      ASSERT_TRUE(statuses[0].ok()) << statuses[0].ToString();
      ASSERT_TRUE(statuses[1].ok()) << statuses[1].ToString();
      ASSERT_TRUE(std::equal(sent.begin(), sent.end(), got.begin() + 8))
          << "size " << size << " to rank " << to;
      EXPECT_EQ(got[7], 0xee);
      EXPECT_EQ(got[size + 8], 0xee);  // nothing written past the message
      total += size;
    }
  }
  EXPECT_EQ(d[0]->bytes_sent(), total);
  EXPECT_EQ(d[1]->bytes_received() + d[3]->bytes_received(), total);
}

TEST_P(TransportContract, FifoOrderAndTagsEveryPairBothDirections) {
  bootstrap::InMemoryStore store;
  constexpr int kRanks = 4;
  Devices d = Connect(kRanks, store);
  constexpr int kMessages = 300;  // more than the pre-reserved queues, so they must grow
  auto size_of = [](int i) {
    return static_cast<size_t>(i % 50 == 7 ? 300000 + i : (i * 37) % 5000);  // some large ones
  };
  auto statuses = RunRankThreads(kRanks, [&](int r) -> Status {
    Device& dev = *d[r];
    std::vector<std::vector<uint8_t>> out, in;
    std::vector<std::unique_ptr<Region>> regions;
    for (int peer = 0; peer < kRanks; ++peer) {
      if (peer == r) continue;
      for (int i = 0; i < kMessages; ++i) {
        out.push_back(Pattern(size_of(i), static_cast<uint32_t>(r * 100000 + peer * 1000 + i)));
        in.emplace_back(size_of(i) + 100);  // capacity larger than the message
      }
    }
    size_t k = 0;
    for (int peer = 0; peer < kRanks; ++peer) {
      if (peer == r) continue;
      for (int i = 0; i < kMessages; ++i, ++k) {
        KOLO_ASSIGN_OR_RETURN(auto o, dev.Register(out[k].data(), out[k].size()));
        KOLO_ASSIGN_OR_RETURN(auto n, dev.Register(in[k].data(), in[k].size()));
        KOLO_RETURN_IF_ERROR(dev.pair(peer).Send(*o, 0, out[k].size(), 7 * i));
        KOLO_RETURN_IF_ERROR(dev.pair(peer).Recv(*n, 0, in[k].size(), 7 * i));
        regions.push_back(std::move(o));
        regions.push_back(std::move(n));
      }
    }
    std::vector<Completion> done;
    KOLO_RETURN_IF_ERROR(WaitFor(dev, 2 * (kRanks - 1) * kMessages, &done, milliseconds(60000)));
    std::vector<int> next(kRanks, 0);
    for (const Completion& c : done) {
      if (c.kind != OpKind::kRecv) continue;
      const int i = next[c.peer]++;
      if (c.tag != static_cast<uint64_t>(7 * i) || c.nbytes != size_of(i)) {
        return Internal("rank {}: message {} from rank {} arrived out of order (tag {})", r, i,
                        c.peer, c.tag);
      }
      const auto want = Pattern(c.nbytes, static_cast<uint32_t>(c.peer * 100000 + r * 1000 + i));
      const size_t slot = static_cast<size_t>((c.peer < r ? c.peer : c.peer - 1) * kMessages + i);
      if (!std::equal(want.begin(), want.end(), in[slot].begin())) {
        return Internal("rank {}: message {} from rank {} is corrupt", r, i, c.peer);
      }
    }
    return Status::OK();
  });
  for (const Status& s : statuses) EXPECT_TRUE(s.ok()) << s.ToString();
}

// Many round trips of small messages, each side waiting for the other: a doorbell lost between
// a sleeper and the rank that moves its ring would hang here (and fail on the timeout).
TEST_P(TransportContract, ManyRoundTripsNeverMissAWakeUp) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(2, store);
  constexpr int kRounds = 3000;
  auto statuses = RunRankThreads(2, [&](int r) -> Status {
    Device& dev = *d[r];
    uint64_t out = 0, in = 0;
    KOLO_ASSIGN_OR_RETURN(auto o, dev.Register(&out, 8));
    KOLO_ASSIGN_OR_RETURN(auto i, dev.Register(&in, 8));
    std::vector<Completion> done;
    for (int k = 0; k < kRounds; ++k) {
      if (r == 0) {
        out = static_cast<uint64_t>(k);
        KOLO_RETURN_IF_ERROR(dev.pair(1).Send(*o, 0, 8, 1));
        KOLO_RETURN_IF_ERROR(dev.pair(1).Recv(*i, 0, 8, 2));
      } else {
        KOLO_RETURN_IF_ERROR(dev.pair(0).Recv(*i, 0, 8, 1));
        KOLO_RETURN_IF_ERROR(WaitFor(dev, 1, &done, milliseconds(10000)));
        out = in + 1;
        KOLO_RETURN_IF_ERROR(dev.pair(0).Send(*o, 0, 8, 2));
      }
      KOLO_RETURN_IF_ERROR(WaitFor(dev, r == 0 ? 2 : 1, &done, milliseconds(10000)));
      if (r == 0 && in != static_cast<uint64_t>(k + 1)) {
        return Internal("round {}: got {}", k, in);
      }
    }
    return Status::OK();
  });
  for (const Status& s : statuses) EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_P(TransportContract, TagMismatchAndOversizeAreStickyProtocolErrors) {
  for (const bool oversize : {false, true}) {
    bootstrap::InMemoryStore store;
    Devices d = Connect(2, store);
    std::vector<uint8_t> buf(64);
    auto region = d[0]->Register(buf.data(), buf.size());
    auto region1 = d[1]->Register(buf.data(), buf.size());
    ASSERT_TRUE(region.ok() && region1.ok());
    ASSERT_TRUE(d[0]->pair(1).Send(**region, 0, 32, 0x11).ok());
    std::vector<Completion> done;
    ASSERT_TRUE(WaitFor(*d[0], 1, &done, milliseconds(5000)).ok());
    // The message is already there, so the error may surface as the receive is posted.
    Status s = d[1]->pair(0).Recv(**region1, 0, oversize ? 16 : 32, oversize ? 0x11 : 0x22);
    if (s.ok()) s = WaitFor(*d[1], 1, &done, milliseconds(5000));
    EXPECT_EQ(s.code(), StatusCode::kProtocol) << s.ToString();
    EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("0x11"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(oversize ? "holds 16 bytes" : "0x22"), std::string::npos)
        << s.message();
    EXPECT_EQ(d[1]->Poll(&done, milliseconds(0)).code(), StatusCode::kProtocol);
  }
}

TEST_P(TransportContract, TimeoutNamesThePendingPeerAndIsNotSticky) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(2, store);
  uint64_t word = 0, sent = 42;
  auto in = d[0]->Register(&word, 8);
  auto out = d[1]->Register(&sent, 8);
  ASSERT_TRUE(in.ok() && out.ok());
  ASSERT_TRUE(d[0]->pair(1).Recv(**in, 0, 8, 5).ok());
  std::vector<Completion> done;
  const auto start = Clock::now();
  Status s = d[0]->Poll(&done, milliseconds(200));
  EXPECT_GE(Clock::now() - start, milliseconds(190));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("rank 1: 1 recv"), std::string::npos) << s.message();
  ASSERT_TRUE(d[1]->pair(0).Send(**out, 0, 8, 5).ok());
  EXPECT_TRUE(WaitFor(*d[0], 1, &done, milliseconds(5000)).ok());
  EXPECT_EQ(word, 42u);
}

// Rank 0 waits on rank 1, which is alive (it waits for arrivals, sending keepalives) but waits
// itself; rank 2 takes one message from rank 0 and is then never polled again, as a stopped
// process. The timeout names rank 2 as the silent one (its last sign of life, taking the message,
// is not mistaken for a recent one), not rank 1, and the keepalives leave the pair intact for the
// message that follows.
TEST_P(TransportContract, TimeoutNamesTheSilentPeerNotTheLiveOneWaitedOn) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(3, store, milliseconds(800));  // keepalive every 100 ms
  uint64_t word = 0, sent = 42, to_two = 7, at_two = 0;
  auto in = d[0]->Register(&word, 8);
  auto out = d[1]->Register(&sent, 8);
  auto o2 = d[0]->Register(&to_two, 8);
  auto i2 = d[2]->Register(&at_two, 8);
  ASSERT_TRUE(in.ok() && out.ok() && o2.ok() && i2.ok());
  {
    std::vector<Completion> c;
    ASSERT_TRUE(d[0]->pair(2).Send(**o2, 0, 8, 3).ok());
    ASSERT_TRUE(WaitFor(*d[0], 1, &c, milliseconds(5000)).ok());
    ASSERT_TRUE(d[2]->pair(0).Recv(**i2, 0, 8, 3).ok());
    ASSERT_TRUE(WaitFor(*d[2], 1, &c, milliseconds(5000)).ok());
    ASSERT_EQ(at_two, 7u);
  }
  std::atomic<bool> stop{false};
  std::thread alive([&] {
    while (!stop.load()) {
      bool arrived = false;
      ASSERT_TRUE(d[1]->WaitForArrival(std::chrono::microseconds(50000), &arrived).ok());
    }
  });
  ASSERT_TRUE(d[0]->pair(1).Recv(**in, 0, 8, 5).ok());
  std::vector<Completion> done;
  Status s = d[0]->Poll(&done, milliseconds(800));
  stop = true;
  alive.join();
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("rank 2 has sent nothing for"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("rank 1 has sent nothing"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("pending: rank 1: 1 recv"), std::string::npos) << s.message();
  EXPECT_GE(d[0]->SilentSeconds(2), 0.4);
  EXPECT_LT(d[0]->SilentSeconds(1), 0.4);
  EXPECT_LT(d[0]->SilentSeconds(0), 0);  // not a peer
  EXPECT_EQ(SilentPeers(*d[0], milliseconds(400)), std::vector<int>{2});
  ASSERT_TRUE(d[1]->pair(0).Send(**out, 0, 8, 5).ok());
  EXPECT_TRUE(WaitFor(*d[0], 1, &done, milliseconds(5000)).ok());
  EXPECT_EQ(word, 42u);
}

TEST_P(TransportContract, PeerShutdownWithPendingReceiveIsUnavailable) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(3, store);
  std::vector<uint8_t> buf(1 << 16);
  auto r0 = d[0]->Register(buf.data(), buf.size());
  auto r2 = d[2]->Register(buf.data(), buf.size());
  ASSERT_TRUE(r0.ok() && r2.ok());
  // Rank 2 sends one message, then shuts down cleanly; rank 0 takes the message afterwards (it
  // was sent before the GOODBYE) and then fails on a second receive it is still waiting for.
  ASSERT_TRUE(d[2]->pair(0).Send(**r2, 0, 1000, 9).ok());
  std::vector<Completion> done;
  ASSERT_TRUE(WaitFor(*d[2], 1, &done, milliseconds(5000)).ok());
  d[2].reset();
  // A clean shutdown of an idle peer harms nobody: rank 0 and rank 1 still talk.
  auto r1 = d[1]->Register(buf.data(), buf.size());
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(d[1]->pair(0).Send(**r1, 0, 10, 1).ok());
  ASSERT_TRUE(d[0]->pair(1).Recv(**r0, 0, 10, 1).ok());
  done.clear();
  ASSERT_TRUE(WaitFor(*d[0], 1, &done, milliseconds(5000)).ok());
  ASSERT_TRUE(d[0]->pair(2).Recv(**r0, 0, 1000, 9).ok());
  done.clear();
  Status s = WaitFor(*d[0], 1, &done, milliseconds(5000));
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(done[0].nbytes, 1000u);
  // The next receive from rank 2 can never be satisfied: it fails when posted or when polled.
  s = d[0]->pair(2).Recv(**r0, 0, 1000, 10);
  if (s.ok()) s = d[0]->Poll(&done, milliseconds(5000));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("connection to rank 2 lost"), std::string::npos) << s.message();
}

TEST_P(TransportContract, AbortReachesEveryPeerEvenBehindUnreadMessages) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(3, store);
  std::vector<uint8_t> buf(1 << 20, 1);
  auto r1 = d[1]->Register(buf.data(), buf.size());
  ASSERT_TRUE(r1.ok());
  // Rank 1 queues messages rank 0 has not asked for, then aborts.
  const size_t queued = BuffersLargeSends() ? 1 << 18 : 1 << 12;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(d[1]->pair(0).Send(**r1, 0, queued, 100 + i).ok());
  std::vector<Completion> done;
  ASSERT_TRUE(WaitFor(*d[1], 3, &done, milliseconds(5000)).ok());
  d[1]->Abort(Internal("disk on fire"));
  d[1]->Abort(Internal("second call is a no-op"));
  auto statuses = RunRankThreads(3, [&](int r) -> Status {
    if (r == 1) return Status::OK();
    // Each survivor waits on the other survivor, not on rank 1.
    uint64_t word = 0;
    KOLO_ASSIGN_OR_RETURN(auto region, d[r]->Register(&word, 8));
    KOLO_RETURN_IF_ERROR(d[r]->pair(2 - r).Recv(*region, 0, 8, 1));
    std::vector<Completion> got;
    return d[r]->Poll(&got, milliseconds(10000));
  });
  for (int r : {0, 2}) {
    EXPECT_EQ(statuses[r].code(), StatusCode::kAborted) << statuses[r].ToString();
    EXPECT_NE(statuses[r].message().find("rank 1 aborted"), std::string::npos);
    EXPECT_NE(statuses[r].message().find("disk on fire"), std::string::npos);
  }
  EXPECT_EQ(d[1]->Poll(&done, milliseconds(0)).code(), StatusCode::kAborted);
}

// A receiver that posts nothing holds the sender back: a send far larger than any buffer between
// them (socket buffers, a shared-memory ring) does not complete until the receive is posted, and
// then the bytes arrive intact.
TEST_P(TransportContract, AnUnpostedReceiveHoldsTheSenderBack) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(2, store);
  const size_t size = 64 << 20;
  const std::vector<uint8_t> sent = Pattern(size, 5);
  std::vector<uint8_t> got(size, 0);
  auto out = d[0]->Register(const_cast<uint8_t*>(sent.data()), size);
  auto in = d[1]->Register(got.data(), size);
  ASSERT_TRUE(out.ok() && in.ok());
  ASSERT_TRUE(d[0]->pair(1).Send(**out, 0, size, 77).ok());
  std::vector<Completion> done;
  Status s = d[0]->Poll(&done, milliseconds(300));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("rank 1: 1 send (next tag 0x4d"), std::string::npos) << s.message();
  EXPECT_EQ(d[0]->bytes_sent(), 0u);
  auto statuses = RunRankThreads(2, [&](int r) -> Status {
    std::vector<Completion> c;
    if (r == 1) KOLO_RETURN_IF_ERROR(d[1]->pair(0).Recv(**in, 0, size, 77));
    return WaitFor(*d[r], 1, &c, milliseconds(20000));
  });
  EXPECT_TRUE(statuses[0].ok()) << statuses[0].ToString();
  EXPECT_TRUE(statuses[1].ok()) << statuses[1].ToString();
  EXPECT_TRUE(got == sent);
}

// An Accumulator over int64 elements; counts calls that were not whole, aligned units.
struct Int64Sum {
  static void Add(uint8_t* dst, const uint8_t* src, size_t nbytes, uintptr_t arg) {
    auto* self = reinterpret_cast<Int64Sum*>(arg);
    if (nbytes % 8 != 0 || (dst - self->base) % 8 != 0) ++self->misaligned;
    ++self->calls;
    for (size_t k = 0; k < nbytes; k += 8) {
      int64_t a, b;
      std::memcpy(&a, dst + k, 8);
      std::memcpy(&b, src + k, 8);
      a += b;
      std::memcpy(dst + k, &a, 8);
    }
  }
  Accumulator accumulator() { return Accumulator{&Add, reinterpret_cast<uintptr_t>(this), 8}; }
  const uint8_t* base = nullptr;
  int misaligned = 0;
  int calls = 0;
};

// Bytes summed in elements of `unit` bytes (which need not divide any buffer or ring size).
struct ByteSum {
  static void Add(uint8_t* dst, const uint8_t* src, size_t nbytes, uintptr_t arg) {
    auto* self = reinterpret_cast<ByteSum*>(arg);
    const size_t at = static_cast<size_t>(dst - self->base);
    if (nbytes % self->unit != 0 || at % self->unit != 0 || (self->ordered && at != self->next)) {
      ++self->bad;
    }
    self->next += nbytes;
    for (size_t k = 0; k < nbytes; ++k) dst[k] = static_cast<uint8_t>(dst[k] + src[k]);
  }
  Accumulator accumulator() { return Accumulator{&Add, reinterpret_cast<uintptr_t>(this), unit}; }
  const uint8_t* base = nullptr;
  size_t unit = 1;
  size_t next = 0;  // with `ordered`, where the next combine must start; else bytes combined
  int bad = 0;
  // Several TCP streams combine a striped message's parts side by side (each in order), so only
  // whole units are checked there.
  bool ordered = true;
};

std::vector<int64_t> Int64s(size_t n, int64_t seed) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>(i * 2654435761u % 1000003) * seed - 7;
  return v;
}

// Accumulating receives mixed with plain ones on the same pair, from empty to many times any
// buffer of the transport.
// Pacing: a connection over TCP takes a cap; one that cannot pace (shared memory, verbs) says so.
TEST_P(TransportContract, PacingIsTakenByTcpAndRefusedClearlyElsewhere) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(2, store);
  for (int r = 0; r < 2; ++r) {
    Device& dev = *d[static_cast<size_t>(r)];
    const std::string kind = dev.pair_transport(1 - r);
    const Status s = dev.pair(1 - r).PaceSends(100e6);
    if (kind == "tcp") {
      EXPECT_TRUE(s.ok()) << GetParam().label << ": " << s.ToString();
    } else {
      EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << GetParam().label;
      EXPECT_NE(s.message().find(fmt::format("rank {} cannot pace its sends", 1 - r)),
                std::string::npos)
          << s.message();
    }
  }
}

TEST_P(TransportContract, RecvAccumulateSumsIntoPlace) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(2, store);
  if (!d[1]->pair(0).CanAccumulate()) {
    // The collectives' scratch path serves such a transport (rdma_transport_test covers it).
    EXPECT_EQ(d[1]->pair(0)
                  .RecvAccumulate(*d[1]->Register(nullptr, 0).value(), 0, 0, 1, Accumulator{})
                  .code(),
              StatusCode::kFailedPrecondition);
    GTEST_SKIP() << GetParam().label << " cannot combine bytes as they arrive (CanAccumulate)";
  }
  const std::vector<size_t> counts = {0, 1, 3, 4096, 131075, 1 << 20, 3 << 20};
  constexpr size_t kGuardWords = 2;
  std::vector<std::vector<int64_t>> sent, dst, want;
  for (size_t i = 0; i < counts.size(); ++i) {
    sent.push_back(Int64s(counts[i], static_cast<int64_t>(i) + 2));
    dst.push_back(Int64s(counts[i] + 2 * kGuardWords, -3));
    want.push_back(dst.back());
    for (size_t k = 0; k < counts[i]; ++k) want.back()[k + kGuardWords] += sent.back()[k];
  }
  std::vector<uint64_t> plain_in(counts.size(), 0), plain_out(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) plain_out[i] = 1000 + i;
  std::vector<Int64Sum> sums(counts.size());
  auto statuses = RunRankThreads(2, [&](int r) -> Status {
    Device& dev = *d[r];
    std::vector<std::unique_ptr<Region>> regions;
    std::vector<Completion> done;
    for (size_t i = 0; i < counts.size(); ++i) {
      const size_t bytes = counts[i] * 8;
      const uint64_t tag = 100 + i;
      if (r == 0) {
        KOLO_ASSIGN_OR_RETURN(auto a, dev.Register(sent[i].data(), bytes));
        KOLO_ASSIGN_OR_RETURN(auto b, dev.Register(&plain_out[i], 8));
        KOLO_RETURN_IF_ERROR(dev.pair(1).Send(*a, 0, bytes, tag));
        KOLO_RETURN_IF_ERROR(dev.pair(1).Send(*b, 0, 8, tag + 50));
        regions.push_back(std::move(a));
        regions.push_back(std::move(b));
      } else {
        KOLO_ASSIGN_OR_RETURN(auto a, dev.Register(dst[i].data(), dst[i].size() * 8));
        KOLO_ASSIGN_OR_RETURN(auto b, dev.Register(&plain_in[i], 8));
        sums[i].base = a->data() + kGuardWords * 8;
        if (!dev.pair(0).CanAccumulate()) return Internal("the pair cannot accumulate");
        KOLO_RETURN_IF_ERROR(dev.pair(0).RecvAccumulate(
            *a, kGuardWords * 8, bytes + kGuardWords * 8, tag, sums[i].accumulator()));
        KOLO_RETURN_IF_ERROR(dev.pair(0).Recv(*b, 0, 8, tag + 50));
        regions.push_back(std::move(a));
        regions.push_back(std::move(b));
      }
    }
    KOLO_RETURN_IF_ERROR(WaitFor(dev, 2 * counts.size(), &done, milliseconds(20000)));
    if (r == 1) {
      for (size_t i = 0; i < counts.size(); ++i) {
        const Completion& c = done[2 * i];
        if (c.kind != OpKind::kRecv || c.tag != 100 + i || c.nbytes != counts[i] * 8) {
          return Internal("completion {}: tag {:#x}, {} bytes", 2 * i, c.tag, c.nbytes);
        }
      }
    }
    return Status::OK();
  });
  EXPECT_TRUE(statuses[0].ok()) << statuses[0].ToString();
  ASSERT_TRUE(statuses[1].ok()) << statuses[1].ToString();
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_EQ(dst[i], want[i]) << counts[i] << " elements";
    EXPECT_EQ(sums[i].misaligned, 0) << counts[i] << " elements";
    EXPECT_EQ(plain_in[i], 1000 + i);
  }
  EXPECT_EQ(d[1]->bytes_received(), d[0]->bytes_sent());
}

// Elements of sizes that divide neither 16 nor a ring's size: some straddle the end of a
// shared-memory ring, and each is still combined whole, once, in order.
TEST_P(TransportContract, RecvAccumulateWithOddElementSizes) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(2, store);
  if (!d[1]->pair(0).CanAccumulate()) {
    GTEST_SKIP() << GetParam().label << " cannot combine bytes as they arrive (CanAccumulate)";
  }
  for (size_t unit : {size_t{3}, size_t{12}, size_t{16}}) {
    const size_t bytes = unit * ((5 << 20) / unit);  // more than a ring
    const std::vector<uint8_t> message = Pattern(bytes, static_cast<uint32_t>(unit));
    std::vector<uint8_t> dst = Pattern(bytes, 99), want = dst;
    for (size_t i = 0; i < bytes; ++i) want[i] = static_cast<uint8_t>(want[i] + message[i]);
    ByteSum sum;
    sum.base = dst.data();
    sum.unit = unit;
    sum.ordered = GetParam().tcp_streams == 1;
    auto statuses = RunRankThreads(2, [&](int r) -> Status {
      std::vector<Completion> done;
      if (r == 0) {
        KOLO_ASSIGN_OR_RETURN(auto a, d[0]->Register(const_cast<uint8_t*>(message.data()), bytes));
        // Something before it, so that the message does not start at the ring's start.
        KOLO_RETURN_IF_ERROR(d[0]->pair(1).Send(*a, 0, 40, 1));
        KOLO_RETURN_IF_ERROR(d[0]->pair(1).Send(*a, 0, bytes, 2));
        return WaitFor(*d[0], 2, &done, milliseconds(20000));
      }
      uint8_t first[40];
      KOLO_ASSIGN_OR_RETURN(auto f, d[1]->Register(first, sizeof first));
      KOLO_ASSIGN_OR_RETURN(auto b, d[1]->Register(dst.data(), bytes));
      KOLO_RETURN_IF_ERROR(d[1]->pair(0).Recv(*f, 0, sizeof first, 1));
      KOLO_RETURN_IF_ERROR(d[1]->pair(0).RecvAccumulate(*b, 0, bytes, 2, sum.accumulator()));
      return WaitFor(*d[1], 2, &done, milliseconds(20000));
    });
    EXPECT_TRUE(statuses[0].ok()) << statuses[0].ToString();
    EXPECT_TRUE(statuses[1].ok()) << statuses[1].ToString();
    EXPECT_EQ(sum.bad, 0) << "unit " << unit;
    EXPECT_EQ(sum.next, bytes) << "unit " << unit;
    EXPECT_TRUE(dst == want) << "unit " << unit;
  }
}

TEST_P(TransportContract, RecvAccumulateRejectsPartialElementsAndBadArguments) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(2, store);
  if (!d[1]->pair(0).CanAccumulate()) {
    GTEST_SKIP() << GetParam().label << " cannot combine bytes as they arrive (CanAccumulate)";
  }
  std::vector<uint8_t> out(12, 1), in(16, 0);
  auto o = d[0]->Register(out.data(), out.size());
  auto i = d[1]->Register(in.data(), in.size());
  ASSERT_TRUE(o.ok() && i.ok());
  Int64Sum sum;
  sum.base = in.data();
  Accumulator none{};
  EXPECT_EQ(d[1]->pair(0).RecvAccumulate(**i, 0, 16, 1, none).code(), StatusCode::kInvalidArgument);
  Accumulator wide = sum.accumulator();
  wide.unit = Pair::kMaxAccumulateUnit + 1;
  EXPECT_EQ(d[1]->pair(0).RecvAccumulate(**i, 0, 16, 1, wide).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d[1]->pair(0).RecvAccumulate(**i, 8, 16, 1, sum.accumulator()).code(),
            StatusCode::kInvalidArgument);  // past the region
  // 12 bytes cannot be combined as 8-byte elements.
  ASSERT_TRUE(d[0]->pair(1).Send(**o, 0, 12, 0x33).ok());
  std::vector<Completion> done;
  Status s = d[1]->pair(0).RecvAccumulate(**i, 0, 16, 0x33, sum.accumulator());
  if (s.ok()) s = WaitFor(*d[1], 1, &done, milliseconds(5000));
  EXPECT_EQ(s.code(), StatusCode::kProtocol) << s.ToString();
  EXPECT_NE(s.message().find("12-byte message"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("8-byte elements"), std::string::npos) << s.message();
  EXPECT_EQ(sum.calls, 0);
  EXPECT_EQ(in, std::vector<uint8_t>(16, 0));
}

TEST_P(TransportContract, IdlePollSleepsUnlessBusyPolling) {
  for (const bool busy : {false, true}) {
    bootstrap::InMemoryStore store;
    Devices d = Connect(4, store, milliseconds(20000), busy);
    uint64_t word = 0;
    auto region = d[0]->Register(&word, 8);
    ASSERT_TRUE(region.ok());
    // Receives on a pair of this host and (two_hosts) of the other.
    ASSERT_TRUE(d[0]->pair(1).Recv(**region, 0, 8, 1).ok());
    ASSERT_TRUE(d[0]->pair(3).Recv(**region, 0, 8, 1).ok());
    std::vector<Completion> done;
    const double cpu0 = kolo::testing::ThreadCpuMs();
    EXPECT_EQ(d[0]->Poll(&done, milliseconds(500)).code(), StatusCode::kDeadlineExceeded);
    bool arrived = true;
    EXPECT_TRUE(d[2]->WaitForArrival(std::chrono::microseconds(300000), &arrived).ok());
    EXPECT_FALSE(arrived);
    const double cpu_ms = kolo::testing::ThreadCpuMs() - cpu0;
    if (busy) {
      EXPECT_GT(cpu_ms, 150.0) << "busy polling should spin (and this test can tell)";
    } else {
      EXPECT_LT(cpu_ms, 40.0) << "an idle Poll or WaitForArrival must sleep";
    }
  }
}

TEST_P(TransportContract, WaitForArrivalSeesAMessageAndReturnsOnWake) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(4, store);
  // Wake from another thread ends the wait early, with nothing arrived.
  std::thread waker([&] {
    std::this_thread::sleep_for(milliseconds(100));
    d[0]->Wake();
  });
  bool arrived = true;
  auto start = Clock::now();
  ASSERT_TRUE(d[0]->WaitForArrival(std::chrono::microseconds(10000000), &arrived).ok());
  waker.join();
  EXPECT_FALSE(arrived);
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  // A message from a peer (one of each host, two_hosts) ends it; it stays for the receive.
  for (int from : {1, 3}) {
    uint64_t out = 1234 + static_cast<uint64_t>(from), in = 0;
    auto o = d[from]->Register(&out, 8);
    auto i = d[0]->Register(&in, 8);
    ASSERT_TRUE(o.ok() && i.ok());
    std::thread sender([&] {
      std::this_thread::sleep_for(milliseconds(50));
      EXPECT_TRUE(d[from]->pair(0).Send(**o, 0, 8, 9).ok());
      std::vector<Completion> sent;
      EXPECT_TRUE(WaitFor(*d[from], 1, &sent, milliseconds(5000)).ok());
    });
    arrived = false;
    start = Clock::now();
    Status s = Status::OK();
    while (s.ok() && !arrived && Clock::now() - start < milliseconds(5000)) {
      s = d[0]->WaitForArrival(std::chrono::microseconds(1000000), &arrived);
    }
    sender.join();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(arrived) << "from rank " << from;
    std::vector<Completion> done;
    ASSERT_TRUE(d[0]->pair(from).Recv(**i, 0, 8, 9).ok());
    ASSERT_TRUE(WaitFor(*d[0], 1, &done, milliseconds(5000)).ok());
    EXPECT_EQ(in, out);
  }
}

// A look (WaitForArrival with a timeout of zero, as the host area's waits make every few
// milliseconds) reads what came in since the last call, without sleeping: it sees a message that
// arrived. (A peer killed while a rank looks is named by the look too: train_fault.sh.)
TEST_P(TransportContract, ALookSeesAMessage) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(4, store);
  uint64_t out = 77;
  auto o = d[1]->Register(&out, 8);
  ASSERT_TRUE(o.ok());
  ASSERT_TRUE(d[1]->pair(0).Send(**o, 0, 8, 5).ok());
  std::vector<Completion> sent;
  ASSERT_TRUE(WaitFor(*d[1], 1, &sent, milliseconds(5000)).ok());
  bool arrived = false;
  const auto start = Clock::now();
  Status s = Status::OK();
  while (s.ok() && !arrived && Clock::now() - start < milliseconds(5000)) {
    s = d[0]->WaitForArrival(std::chrono::microseconds(0), &arrived);
    if (!arrived) std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(arrived) << "no look saw the message within 5 s";
}

TEST_P(TransportContract, NamesAndArgumentErrors) {
  bootstrap::InMemoryStore store;
  Devices d = Connect(4, store);
  EXPECT_STREQ(d[0]->name(), GetParam().transport);
  const std::string kinds = PairTransports(*d[0]);
  if (std::string(GetParam().transport) == "auto") {
    EXPECT_EQ(kinds, GetParam().two_hosts ? "shm+tcp" : "shm");
    EXPECT_STREQ(d[0]->pair_transport(1), "shm");
    EXPECT_STREQ(d[0]->pair_transport(3), GetParam().two_hosts ? "tcp" : "shm");
  } else {
    EXPECT_EQ(kinds, GetParam().transport);
  }
  EXPECT_EQ(d[0]->Register(nullptr, 8).status().code(), StatusCode::kInvalidArgument);
  uint8_t b[16];
  auto region = d[0]->Register(b, sizeof b);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(d[0]->pair(1).Send(**region, 8, 9, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d[0]->pair(1).Recv(**region, 17, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d[3]->rank(), 3);
  EXPECT_EQ(d[3]->size(), 4);
}

INSTANTIATE_TEST_SUITE_P(
    Transports, TransportContract,
    ::testing::Values(Variant{"tcp", "tcp", false},
                      Variant{"tcp_3_streams", "tcp", false, nullptr, 3},
                      Variant{"auto_two_hosts_2_streams", "auto", true, nullptr, 2},
                      Variant{"shm", "shm", false}, Variant{"auto", "auto", false},
                      Variant{"auto_two_hosts", "auto", true}
#if KOLO_HAVE_IBVERBS
                      ,
                      Variant{"rdma_SoftVerbs", "rdma", false, "soft"},
                      Variant{"rdma_libibverbs", "rdma", false, "libibverbs"}
#endif
                      ),
    [](const auto& info) { return std::string(info.param.label); });

}  // namespace
}  // namespace kolo::transport
