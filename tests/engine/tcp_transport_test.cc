// The TCP transport over real loopback sockets: ranks are threads (one Device each) over an
// InMemoryStore, or a forked process over a file store where a rank has to die for real.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/common/crypto.h"
#include "engine/transport/tcp/accumulation.h"
#include "engine/transport/tcp/device.h"
#include "engine/transport/tcp/pair.h"
#include "engine/transport/tcp/socket.h"
#include "tests/engine/flood_test_util.h"
#include "tests/engine/rank_threads.h"

namespace kolo::transport::tcp {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// The devices of one job. They shut down concurrently, as the ranks of a real job do (a closing
// device waits, bounded, for its peers to close their side too).
struct Devices : std::vector<std::unique_ptr<Device>> {
  using std::vector<std::unique_ptr<Device>>::vector;
  Devices(Devices&&) = default;
  ~Devices() {
    std::vector<std::thread> threads;
    for (auto& d : *this) threads.emplace_back([&d] { d.reset(); });
    for (auto& t : threads) t.join();
  }
};

constexpr char kSecret[] = "0123456789abcdef-test-secret";

TcpOptions Options(milliseconds timeout = milliseconds(20000)) {
  TcpOptions o;
  o.secret = kSecret;
  o.timeout = timeout;
  return o;
}

// Connects ranks 0..n-1 of a job of `size` ranks (the others, if any, join from elsewhere).
Devices ConnectAll(int n, bootstrap::Store& store, const TcpOptions& options = Options(),
                   int size = 0) {
  if (size == 0) size = n;
  Devices devices(static_cast<size_t>(n));
  auto statuses = kolo::testing::RunRankThreads(n, [&](int r) -> Status {
    KOLO_ASSIGN_OR_RETURN(devices[static_cast<size_t>(r)], Connect(options, store, r, size));
    return Status::OK();
  });
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(statuses[static_cast<size_t>(r)].ok()) << statuses[r].ToString();
  return devices;
}

std::vector<uint8_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

std::string Listening(bootstrap::Store& store, int rank) {
  auto v = store.Get("tcp/addr/" + std::to_string(rank), milliseconds(10000));
  EXPECT_TRUE(v.ok()) << v.status().ToString();
  return v.ok() ? std::string(v->begin(), v->end()) : "";
}

// Connects a raw socket to `addr`, sends `bytes`, and returns whether the peer closed it within
// `within`.
bool ClosedByPeer(const std::string& addr, const std::vector<uint8_t>& bytes, milliseconds within) {
  auto sa = ParseAddress(addr);
  EXPECT_TRUE(sa.ok());
  Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&*sa), sizeof *sa) != 0) return false;
  if (!bytes.empty()) (void)::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
  const auto deadline = Clock::now() + within;
  uint8_t sink[256];
  while (Clock::now() < deadline) {
    pollfd p{fd.get(), POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    const ssize_t n = ::recv(fd.get(), sink, sizeof sink, 0);
    if (n <= 0) return true;  // EOF or reset; a challenge (n > 0) is read past
  }
  return false;
}

double ThreadCpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

TEST(TcpTransport, SendRecvEverySize) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(2, store);
  const std::vector<size_t> sizes = {0, 1, 7, 24, 4096, 65539, 1 << 20, 64 << 20};
  for (size_t size : sizes) {
    const std::vector<uint8_t> sent = Pattern(size, static_cast<uint32_t>(size));
    std::vector<uint8_t> got(size + 16, 0xee);
    auto statuses = kolo::testing::RunRankThreads(2, [&](int r) -> Status {
      Device& dev = *d[r];
      std::vector<Completion> done;
      if (r == 0) {
        KOLO_ASSIGN_OR_RETURN(auto region, dev.Register(const_cast<uint8_t*>(sent.data()), size));
        KOLO_RETURN_IF_ERROR(dev.pair(1).Send(*region, 0, size, 1000 + size));
        KOLO_RETURN_IF_ERROR(WaitFor(dev, 1, &done, milliseconds(20000)));
      } else {
        KOLO_ASSIGN_OR_RETURN(auto region, dev.Register(got.data(), got.size()));
        KOLO_RETURN_IF_ERROR(dev.pair(0).Recv(*region, 8, size + 8, 1000 + size));
        KOLO_RETURN_IF_ERROR(WaitFor(dev, 1, &done, milliseconds(20000)));
      }
      if (done.size() != 1 || done[0].nbytes != size || done[0].tag != 1000 + size ||
          done[0].peer != 1 - r) {
        return Internal("rank {}: unexpected completion for size {}", r, size);
      }
      return Status::OK();
    });
    ASSERT_TRUE(statuses[0].ok()) << statuses[0].ToString();
    ASSERT_TRUE(statuses[1].ok()) << statuses[1].ToString();
    ASSERT_TRUE(std::equal(sent.begin(), sent.end(), got.begin() + 8)) << "size " << size;
    EXPECT_EQ(got[7], 0xee);
    EXPECT_EQ(got[size + 8], 0xee);  // nothing written past the message
  }
  size_t total = 0;
  for (size_t s : sizes) total += s;
  EXPECT_EQ(d[0]->bytes_sent(), total);
  EXPECT_EQ(d[1]->bytes_received(), total);
}

TEST(TcpTransport, PacedSendsCapTheSocketAndStillDeliver) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(2, store);
  auto& paced = dynamic_cast<TcpPair&>(d[0]->pair(1));
  auto& back = dynamic_cast<TcpPair&>(d[1]->pair(0));
  ASSERT_TRUE(paced.PaceSends(50e6).ok());
  EXPECT_EQ(*MaxPacingRate(paced.fd()), 50000000u);
  EXPECT_EQ(*MaxPacingRate(back.fd()), ~uint64_t{0});  // only the one direction, one connection
  // 1 MiB goes through intact at 50 MB/s.
  const size_t size = 1 << 20;
  const std::vector<uint8_t> sent = Pattern(size, 7);
  std::vector<uint8_t> got(size, 0);
  auto statuses = kolo::testing::RunRankThreads(2, [&](int r) -> Status {
    Device& dev = *d[r];
    std::vector<Completion> done;
    if (r == 0) {
      KOLO_ASSIGN_OR_RETURN(auto region, dev.Register(const_cast<uint8_t*>(sent.data()), size));
      KOLO_RETURN_IF_ERROR(dev.pair(1).Send(*region, 0, size, 5));
      return WaitFor(dev, 1, &done, milliseconds(20000));
    }
    KOLO_ASSIGN_OR_RETURN(auto region, dev.Register(got.data(), size));
    KOLO_RETURN_IF_ERROR(dev.pair(0).Recv(*region, 0, size, 5));
    return WaitFor(dev, 1, &done, milliseconds(20000));
  });
  ASSERT_TRUE(statuses[0].ok()) << statuses[0].ToString();
  ASSERT_TRUE(statuses[1].ok()) << statuses[1].ToString();
  EXPECT_EQ(got, sent);
  // Above 32 bits, and lifted again.
  ASSERT_TRUE(paced.PaceSends(6e9).ok());
  EXPECT_EQ(*MaxPacingRate(paced.fd()), 6000000000u);
  ASSERT_TRUE(paced.PaceSends(0).ok());
  EXPECT_EQ(*MaxPacingRate(paced.fd()), ~uint64_t{0});
  const Status bad = paced.PaceSends(-1);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad.ToString();
}

TEST(TcpTransport, FifoOrderBothDirectionsAndShortMessages) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(3, store);
  constexpr int kMessages = 300;  // more than the pre-reserved queue, so it must grow
  auto statuses = kolo::testing::RunRankThreads(3, [&](int r) -> Status {
    Device& dev = *d[r];
    std::vector<std::vector<uint8_t>> out, in;
    std::vector<std::unique_ptr<Region>> regions;
    for (int peer = 0; peer < 3; ++peer) {
      if (peer == r) continue;
      for (int i = 0; i < kMessages; ++i) {
        const size_t size = static_cast<size_t>((i * 37) % 5000);
        out.push_back(Pattern(size, static_cast<uint32_t>(r * 100000 + peer * 1000 + i)));
        in.emplace_back(size + 100);  // capacity larger than the message
      }
    }
    size_t k = 0;
    for (int peer = 0; peer < 3; ++peer) {
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
    KOLO_RETURN_IF_ERROR(WaitFor(dev, 4 * kMessages, &done, milliseconds(20000)));
    std::vector<int> next(3, 0);
    for (const Completion& c : done) {
      if (c.kind != OpKind::kRecv) continue;
      const int i = next[c.peer]++;
      if (c.tag != static_cast<uint64_t>(7 * i) ||
          c.nbytes != static_cast<size_t>((i * 37) % 5000)) {
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

TEST(TcpTransport, TagMismatchAndOversizeAreProtocolErrors) {
  for (const bool oversize : {false, true}) {
    bootstrap::InMemoryStore store;
    Devices d = ConnectAll(2, store);
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
    // Sticky.
    EXPECT_EQ(d[1]->Poll(&done, milliseconds(0)).code(), StatusCode::kProtocol);
  }
}

TEST(TcpTransport, TimeoutNamesPendingPeerAndIsNotSticky) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(2, store);
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

// Rank 0 waits on rank 1, which is alive (polled: it sends keepalives) but waits itself; rank 2 is
// never polled, as a stopped process. The timeout names rank 2 as the silent one, not rank 1,
// and the keepalives leave the stream intact for the message that follows.
TEST(TcpTransport, TimeoutNamesTheSilentPeerNotTheLiveOneWaitedOn) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(3, store, Options(milliseconds(800)));  // keepalive every 100 ms
  uint64_t word = 0, sent = 42;
  auto in = d[0]->Register(&word, 8);
  auto out = d[1]->Register(&sent, 8);
  ASSERT_TRUE(in.ok() && out.ok());
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

TEST(TcpTransport, PeerShutdownWithPendingReceiveIsUnavailable) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(3, store);
  std::vector<uint8_t> buf(1 << 16);
  auto r0 = d[0]->Register(buf.data(), buf.size());
  auto r2 = d[2]->Register(buf.data(), buf.size());
  ASSERT_TRUE(r0.ok() && r2.ok());
  // Rank 2 sends one message, then shuts down cleanly; rank 0 takes the message afterwards (it
  // was queued before the GOODBYE) and then fails on a second receive it is still waiting for.
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

// A file-backed store, so that a forked process can rendezvous with threads of this one.
class FileStore final : public bootstrap::Store {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  Status Set(const std::string& key, const std::vector<uint8_t>& value) override {
    const std::string path = Path(key);
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    std::ofstream(tmp, std::ios::binary)
        .write(reinterpret_cast<const char*>(value.data()),
               static_cast<std::streamsize>(value.size()));
    std::filesystem::rename(tmp, path);
    return Status::OK();
  }
  StatusOr<std::vector<uint8_t>> Get(const std::string& key, milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    while (!std::filesystem::exists(Path(key))) {
      if (Clock::now() >= deadline) return DeadlineExceeded("no key {}", key);
      std::this_thread::sleep_for(milliseconds(2));
    }
    std::ifstream in(Path(key), std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string Path(std::string key) const {
    for (char& c : key) c = c == '/' ? '_' : c;
    return dir_ + "/" + key;
  }
  std::string dir_;
};

TEST(TcpTransport, CrashedPeerSurfacesWhileWaitingOnAnother) {
  char dir_template[] = "/tmp/kolo_tcp_test_XXXXXX";
  ASSERT_NE(::mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Rank 2 connects, then dies without a word (no GOODBYE): the kernel closes its sockets.
    FileStore store(dir);
    auto device = Connect(Options(), store, 2, 3);
    ::usleep(300 * 1000);
    ::_exit(device.ok() ? 0 : 1);
  }
  struct Reap {  // no process outlives the test, whatever fails
    pid_t pid;
    ~Reap() {
      if (pid <= 0) return;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{child};
  FileStore store(dir);
  Devices d = ConnectAll(2, store, Options(), 3);
  ASSERT_TRUE(d[0] && d[1]);
  // Rank 0 waits on rank 1, which never sends; rank 2's death must end the wait early.
  uint64_t word = 0;
  auto region = d[0]->Register(&word, 8);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(d[0]->pair(1).Recv(**region, 0, 8, 1).ok());
  std::vector<Completion> done;
  const auto start = Clock::now();
  Status s = d[0]->Poll(&done, milliseconds(15000));
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("connection to rank 2 lost"), std::string::npos) << s.message();
  int wstatus = 0;
  ASSERT_EQ(::waitpid(child, &wstatus, 0), child);
  reap.pid = -1;
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  std::filesystem::remove_all(dir);
}

TEST(TcpTransport, AbortReachesEveryPeerEvenBehindUnreadMessages) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(3, store);
  std::vector<uint8_t> buf(1 << 20, 1);
  auto r1 = d[1]->Register(buf.data(), buf.size());
  ASSERT_TRUE(r1.ok());
  // Rank 1 queues messages rank 0 has not asked for, then aborts.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(d[1]->pair(0).Send(**r1, 0, 1 << 18, 100 + i).ok());
  std::vector<Completion> done;
  ASSERT_TRUE(WaitFor(*d[1], 3, &done, milliseconds(5000)).ok());
  d[1]->Abort(Internal("disk on fire"));
  d[1]->Abort(Internal("second call is a no-op"));
  auto statuses = kolo::testing::RunRankThreads(3, [&](int r) -> Status {
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

TEST(TcpTransport, ImpostorsAndGarbageDuringSetupAreRejected) {
  bootstrap::InMemoryStore store;
  std::unique_ptr<Device> rank0;
  std::thread t0([&] {
    auto dev = Connect(Options(), store, 0, 2);
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    if (dev.ok()) rank0 = std::move(dev).value();
  });
  const std::string addr = Listening(store, 0);
  // Random bytes at the listening port, and a silent connection that just sits there.
  std::mt19937 rng(7);
  std::vector<uint8_t> garbage(300);
  for (auto& b : garbage) b = static_cast<uint8_t>(rng());
  EXPECT_TRUE(ClosedByPeer(addr, garbage, milliseconds(5000)));
  auto sa = ParseAddress(addr);
  Fd silent(::socket(AF_INET, SOCK_STREAM, 0));
  ASSERT_EQ(::connect(silent.get(), reinterpret_cast<const sockaddr*>(&*sa), sizeof *sa), 0);
  // A real handshake with the wrong secret, claiming rank 1.
  {
    bootstrap::InMemoryStore fake;
    ASSERT_TRUE(fake.Set("tcp/addr/0", std::vector<uint8_t>(addr.begin(), addr.end())).ok());
    TcpOptions wrong = Options(milliseconds(5000));
    wrong.secret = "not-the-job-secret";
    auto impostor = Connect(wrong, fake, 1, 2);
    EXPECT_FALSE(impostor.ok());
    EXPECT_EQ(impostor.status().code(), StatusCode::kUnavailable) << impostor.status().ToString();
  }
  // The real rank 1 still gets in, and the pair works.
  auto rank1 = Connect(Options(), store, 1, 2);
  t0.join();
  ASSERT_TRUE(rank1.ok()) << rank1.status().ToString();
  ASSERT_TRUE(rank0);
  uint64_t a = 77, b = 0;
  auto ra = (*rank1)->Register(&a, 8);
  auto rb = rank0->Register(&b, 8);
  ASSERT_TRUE((*rank1)->pair(0).Send(**ra, 0, 8, 3).ok());
  ASSERT_TRUE(rank0->pair(1).Recv(**rb, 0, 8, 3).ok());
  std::vector<Completion> done;
  ASSERT_TRUE(WaitFor(*rank0, 1, &done, milliseconds(5000)).ok());
  EXPECT_EQ(b, 77u);
}

TEST(TcpTransport, ConnectionsAfterSetupAreClosedAndHarmless) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(2, store);
  const std::string addr = Listening(store, 0);
  std::vector<uint8_t> buf(1 << 20, 5), in(1 << 20, 0);
  auto out = d[1]->Register(buf.data(), buf.size());
  auto into = d[0]->Register(in.data(), in.size());
  ASSERT_TRUE(out.ok() && into.ok());
  ASSERT_TRUE(d[0]->pair(1).Recv(**into, 0, in.size(), 8).ok());
  // Rank 0 polls (which is what serves its listener) until both intruders are done: random bytes
  // at its port, and a full handshake attempt with the correct secret claiming rank 1 (refused
  // because set-up is over, not because of the secret).
  std::atomic<bool> closed{false}, intruders_done{false}, received{false}, poll_failed{false};
  Status impostor_status;
  std::vector<Completion> done;
  Status poll_status;
  std::thread poller([&] {
    while (!intruders_done && poll_status.ok()) {
      poll_status = d[0]->Poll(&done, milliseconds(50));
      if (poll_status.code() == StatusCode::kDeadlineExceeded) poll_status = Status::OK();
      received = !done.empty();
    }
    poll_failed = !poll_status.ok();
  });
  std::thread intruder([&] {
    std::mt19937 rng(11);
    std::vector<uint8_t> garbage(500);
    for (auto& b : garbage) b = static_cast<uint8_t>(rng());
    closed = ClosedByPeer(addr, garbage, milliseconds(5000));
  });
  std::thread impostor([&] {
    bootstrap::InMemoryStore fake;
    if (!fake.Set("tcp/addr/0", std::vector<uint8_t>(addr.begin(), addr.end())).ok()) return;
    impostor_status = Connect(Options(milliseconds(1000)), fake, 1, 2).status();
  });
  intruder.join();
  impostor.join();
  // Then the job still completes a transfer on the same pair.
  Status sent = d[1]->pair(0).Send(**out, 0, buf.size(), 8);
  for (int i = 0; i < 1000 && sent.ok() && !poll_failed && !received; ++i) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  intruders_done = true;
  poller.join();
  EXPECT_TRUE(closed);
  // Rank 0 keeps closing the impostor's connections, so it never connects and its set-up times out.
  EXPECT_EQ(impostor_status.code(), StatusCode::kDeadlineExceeded) << impostor_status.ToString();
  EXPECT_NE(impostor_status.message().find("not connected to rank(s) 0"), std::string::npos)
      << impostor_status.message();
  ASSERT_TRUE(sent.ok()) << sent.ToString();
  ASSERT_TRUE(poll_status.ok()) << poll_status.ToString();
  EXPECT_EQ(done.size(), 1u);
  EXPECT_EQ(in, buf);
  std::vector<Completion> sender;
  EXPECT_TRUE(WaitFor(*d[1], 1, &sender, milliseconds(5000)).ok());
}

// Hundreds of idle and garbage connections at a rank's TCP listener, during set-up and after it:
// every one is turned away, yet the listener writes a few lines about them (at most 5 in 10 s,
// through one RejectionLog from set-up to close; before, each connection after set-up wrote a line
// of its own), and when the device closes one line counts the rest. Set-up completes and the pair
// carries data afterwards.
TEST(TcpTransport, AFloodOfIdleAndGarbageConnectionsLogsAFewLines) {
  using kolo::testing::AllClosedByPeerWithin;
  using kolo::testing::ClientFds;
  using kolo::testing::ConnectWithin;
  using kolo::testing::CountedInSummaries;
  using kolo::testing::LinesWith;
  using kolo::testing::StderrToFile;
  constexpr int kSetupIdle = 100, kGarbage = 50, kLateIdle = 300;
  bootstrap::InMemoryStore store;
  StderrToFile log;
  ASSERT_TRUE(log.ok());
  std::mt19937 rng(5);
  std::vector<uint8_t> garbage(300);  // more than a hello, and no hello's magic
  for (auto& b : garbage) b = static_cast<uint8_t>(rng());

  // Set-up: rank 0 accepts while garbage arrives and idle connections sit at its port.
  std::unique_ptr<Device> rank0;
  Status setup0;
  std::thread t0([&] {
    auto dev = Connect(Options(), store, 0, 2);
    setup0 = dev.status();
    if (dev.ok()) rank0 = std::move(dev).value();
  });
  const std::string addr = Listening(store, 0);
  const std::string prefix = "rank 0: TCP listener " + addr;
  {
    ClientFds idle, rejected;
    // (No ASSERT until t0 is joined: the thread must not outlive the test.)
    for (int i = 0; i < kSetupIdle + kGarbage; ++i) {
      const int fd = ConnectWithin(addr);
      if (fd < 0) break;
      (i < kSetupIdle ? idle : rejected).push_back(fd);
      if (i >= kSetupIdle) (void)::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
    }
    EXPECT_EQ(idle.size() + rejected.size(), static_cast<size_t>(kSetupIdle + kGarbage));
    EXPECT_TRUE(AllClosedByPeerWithin(rejected, milliseconds(10000)));
    auto rank1 = Connect(Options(), store, 1, 2);
    t0.join();
    ASSERT_TRUE(setup0.ok()) << setup0.ToString();
    ASSERT_TRUE(rank1.ok()) << rank1.status().ToString();
    // Set-up is over: the idle ones are closed with it.
    EXPECT_TRUE(AllClosedByPeerWithin(idle, milliseconds(10000)));

    // After set-up: rank 0 polls (which serves its listener) while hundreds more arrive.
    std::atomic<bool> stop{false};
    Status poll_status;
    std::vector<Completion> done;
    std::thread poller([&] {
      while (!stop && poll_status.ok()) {
        poll_status = rank0->Poll(&done, milliseconds(50));
        if (poll_status.code() == StatusCode::kDeadlineExceeded) poll_status = Status::OK();
      }
    });
    ClientFds late;
    for (int i = 0; i < kLateIdle + kGarbage; ++i) {
      const int fd = ConnectWithin(addr);
      if (fd < 0) break;
      late.push_back(fd);
      if (i >= kLateIdle) (void)::send(fd, garbage.data(), garbage.size(), MSG_NOSIGNAL);
    }
    EXPECT_EQ(late.size(), static_cast<size_t>(kLateIdle + kGarbage));
    EXPECT_TRUE(AllClosedByPeerWithin(late, milliseconds(10000)));
    stop = true;
    poller.join();
    ASSERT_TRUE(poll_status.ok()) << poll_status.ToString();

    // The pair still carries data.
    uint64_t a = 77, b = 0;
    auto ra = (*rank1)->Register(&a, 8);
    auto rb = rank0->Register(&b, 8);
    ASSERT_TRUE(ra.ok() && rb.ok());
    ASSERT_TRUE((*rank1)->pair(0).Send(**ra, 0, 8, 3).ok());
    ASSERT_TRUE(rank0->pair(1).Recv(**rb, 0, 8, 3).ok());
    done.clear();
    ASSERT_TRUE(WaitFor(*rank0, 1, &done, milliseconds(5000)).ok());
    EXPECT_EQ(b, 77u);
    std::vector<Completion> sent;
    EXPECT_TRUE(WaitFor(**rank1, 1, &sent, milliseconds(5000)).ok());

    const std::string during = log.Text();
    const int lines = LinesWith(during, "connection from");  // whatever the wording
    EXPECT_GE(lines, 1);
    EXPECT_LE(lines, 5) << "the flood's lines flood the log; the first of them:\n"
                        << during.substr(0, 3000);
    // Both close, as the ranks of a job do, concurrently.
    std::thread close1([&] { rank1->reset(); });
    rank0.reset();
    close1.join();
  }
  log.Stop();
  // Every rejection is either written on its own line or counted (at the latest when rank 0's
  // device closed).
  const std::string all = log.Text();
  const int written = LinesWith(all, prefix + ": rejected connection from");
  EXPECT_EQ(written + CountedInSummaries(all, prefix), kGarbage + kLateIdle + kGarbage)
      << all.substr(0, 3000);
}

TEST(TcpTransport, SetupTimeoutNamesMissingRanks) {
  bootstrap::InMemoryStore store;
  // Rank 0 only accepts, so it waits for ranks 1 and 2 rather than failing on a store lookup.
  auto dev = Connect(Options(milliseconds(300)), store, 0, 3);
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kDeadlineExceeded) << dev.status().ToString();
  EXPECT_NE(dev.status().message().find("not connected to rank(s) 1, 2"), std::string::npos)
      << dev.status().message();
}

// A peer whose kernel accepts the connection but whose process never answers (stopped during
// set-up) is named as the silent one, apart from peers that simply have not connected.
TEST(TcpTransport, SetupTimeoutNamesAPeerThatAcceptedButNeverAnswered) {
  bootstrap::InMemoryStore store;
  // "Rank 0": a socket that listens (the kernel completes connections) and never accepts.
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 8), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string where = fmt::format("127.0.0.1:{}", ntohs(addr.sin_port));
  ASSERT_TRUE(store.Set("tcp/addr/0", std::vector<uint8_t>(where.begin(), where.end())).ok());
  auto dev = Connect(Options(milliseconds(400)), store, 1, 3);
  ::close(listener);
  ASSERT_FALSE(dev.ok());
  const std::string m = dev.status().message();
  EXPECT_NE(m.find("not connected to rank(s) 0, 2"), std::string::npos) << m;
  EXPECT_NE(m.find("rank 0 has sent nothing for"), std::string::npos) << m;
  EXPECT_NE(m.find("since it accepted our connection"), std::string::npos) << m;
  EXPECT_EQ(m.find("rank 2 has sent nothing"), std::string::npos) << m;
}

TEST(TcpTransport, IdlePollSleepsUnlessBusyPolling) {
  for (const bool busy : {false, true}) {
    bootstrap::InMemoryStore store;
    TcpOptions options = Options();
    options.busy_poll = busy;
    Devices d = ConnectAll(2, store, options);
    uint64_t word = 0;
    auto region = d[0]->Register(&word, 8);
    ASSERT_TRUE(region.ok());
    ASSERT_TRUE(d[0]->pair(1).Recv(**region, 0, 8, 1).ok());
    std::vector<Completion> done;
    const double cpu0 = ThreadCpuMs();
    EXPECT_EQ(d[0]->Poll(&done, milliseconds(500)).code(), StatusCode::kDeadlineExceeded);
    const double cpu_ms = ThreadCpuMs() - cpu0;
    if (busy) {
      EXPECT_GT(cpu_ms, 100.0) << "busy polling should spin (and this test can tell)";
    } else {
      EXPECT_LT(cpu_ms, 25.0) << "an idle Poll must sleep in epoll_wait";
    }
  }
}

std::string Hex(const Digest& d) {
  std::string out;
  for (uint8_t b : d) out += fmt::format("{:02x}", b);
  return out;
}

TEST(TcpHandshake, Sha256AndHmacKnownAnswers) {
  Sha256 h;
  h.Update("abc", 3);
  EXPECT_EQ(Hex(h.Final()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string million(1000000, 'a');  // FIPS 180-2 long message, crosses many blocks
  Sha256 m;
  m.Update(million.data(), 999999);
  m.Update(million.data(), 1);
  EXPECT_EQ(Hex(m.Final()), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  const std::string data = "what do ya want for nothing?";  // RFC 4231 test case 2
  EXPECT_EQ(Hex(HmacSha256("Jefe", data.data(), data.size())),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  const std::string long_key(131, '\xaa');  // RFC 4231 test case 6: key longer than a block
  const std::string text = "Test Using Larger Than Block-Size Key - Hash Key First";
  EXPECT_EQ(Hex(HmacSha256(long_key, text.data(), text.size())),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  Digest a{}, b{};
  EXPECT_TRUE(DigestsEqual(a, b));
  b[31] = 1;
  EXPECT_FALSE(DigestsEqual(a, b));
}

TEST(TcpTransport, ArgumentErrors) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(2, store);
  EXPECT_EQ(d[0]->Register(nullptr, 8).status().code(), StatusCode::kInvalidArgument);
  uint8_t b[16];
  auto region = d[0]->Register(b, sizeof b);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(d[0]->pair(1).Send(**region, 8, 9, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(d[0]->pair(1).Recv(**region, 17, 0, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Connect(Options(), store, 2, 2).status().code(), StatusCode::kInvalidArgument);
  EXPECT_STREQ(d[0]->name(), "tcp");
  EXPECT_EQ(d[1]->rank(), 1);
  EXPECT_EQ(d[1]->size(), 2);
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

std::vector<int64_t> Int64s(size_t n, int64_t seed) {
  std::vector<int64_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int64_t>(i * 2654435761u % 1000003) * seed - 7;
  return v;
}

// The carry between reads, against a reference, for reads of every length from 1 byte up: the
// combiner only ever sees whole units, in order, and the result is the elementwise sum.
TEST(TcpAccumulation, ReadsOfAnyLengthCombineWholeUnits) {
  std::mt19937 rng(3);
  for (size_t unit : {size_t{1}, size_t{2}, size_t{4}, size_t{8}, size_t{16}}) {
    const size_t bytes = unit * 5003;
    const std::vector<uint8_t> message = Pattern(bytes, static_cast<uint32_t>(unit));
    std::vector<uint8_t> dst = Pattern(bytes, 99), want = dst;
    for (size_t i = 0; i < bytes; ++i) want[i] = static_cast<uint8_t>(want[i] + message[i]);
    struct Seen {
      const uint8_t* base;
      size_t unit;
      size_t next = 0;  // where the next call must start
      int bad = 0;
    } seen{dst.data(), unit};
    Accumulator acc{[](uint8_t* d, const uint8_t* src, size_t n, uintptr_t arg) {
                      auto* s = reinterpret_cast<Seen*>(arg);
                      if (n % s->unit != 0 || static_cast<size_t>(d - s->base) != s->next) ++s->bad;
                      s->next += n;
                      for (size_t k = 0; k < n; ++k) d[k] = static_cast<uint8_t>(d[k] + src[k]);
                    },
                    reinterpret_cast<uintptr_t>(&seen), unit};
    Accumulation a(dst.data(), acc);
    ASSERT_TRUE(a.active());
    std::vector<uint8_t> staging(64);
    size_t done = 0;
    while (done < bytes) {
      size_t room = 0;
      uint8_t* into = a.Prepare(staging.data(), staging.size(), &room);
      const size_t got = std::min({room, bytes - done, size_t{1} + rng() % 40});
      std::fill(staging.begin() + static_cast<std::ptrdiff_t>(a.carry_bytes()), staging.end(),
                0xcc);  // what a read did not write must not matter
      std::memcpy(into, message.data() + done, got);
      a.Consume(staging.data(), got);
      // Another receive may use the staging buffer between two reads of this one.
      std::fill(staging.begin(), staging.end(), 0xdd);
      done += got;
    }
    EXPECT_EQ(a.carry_bytes(), 0u) << "unit " << unit;
    EXPECT_EQ(seen.bad, 0) << "unit " << unit;
    EXPECT_EQ(dst, want) << "unit " << unit;
  }
  EXPECT_FALSE(Accumulation().active());
}

// Accumulating receives over real sockets, mixed with plain ones on the same pair: sizes from
// empty to many times the staging buffer, taken as they arrive (the receiver is already waiting),
// so reads end wherever the kernel's segments do, mid-element included.
TEST(TcpTransport, RecvAccumulateSumsIntoPlaceAsBytesArrive) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(2, store);
  const std::vector<size_t> counts = {0, 1, 3, 4096, 131075, 1 << 20};
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
  auto statuses = kolo::testing::RunRankThreads(2, [&](int r) -> Status {
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
        if (!dev.pair(0).CanAccumulate()) return Internal("the TCP pair cannot accumulate");
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
  EXPECT_TRUE(statuses[1].ok()) << statuses[1].ToString();
  ASSERT_TRUE(statuses[0].ok()) << statuses[0].ToString();
  ASSERT_TRUE(statuses[1].ok());
  for (size_t i = 0; i < counts.size(); ++i) {
    EXPECT_EQ(dst[i], want[i]) << counts[i] << " elements";
    EXPECT_EQ(sums[i].misaligned, 0) << counts[i] << " elements";
    EXPECT_EQ(plain_in[i], 1000 + i);
  }
  // A message of many staging buffers is combined in many runs, not at its end.
  EXPECT_GE(sums.back().calls, static_cast<int>((8u << 20) / TcpState::kStagingBytes));
  EXPECT_EQ(d[1]->bytes_received(), d[0]->bytes_sent());
}

TEST(TcpTransport, RecvAccumulateRejectsPartialElementsAndBadArguments) {
  bootstrap::InMemoryStore store;
  Devices d = ConnectAll(2, store);
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

}  // namespace
}  // namespace kolo::transport::tcp
