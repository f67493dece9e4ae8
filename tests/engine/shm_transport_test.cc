// What is particular to the shared-memory transport: its segments (anonymous memory files passed
// by descriptor, never named in /dev/shm, refused unless they are what was announced), its set-up
// (impostors, offers without their descriptor or with extra ones, timeouts, ranks on several
// hosts), and peers in real processes that are killed or stopped. The contract it shares with the
// other transports is tested in transport_contract_test.cc; SIGKILLs of whole jobs during set-up,
// under kolo-run, in tests/scripts/shm_kill_setup.sh.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/transport/registry.h"
#include "engine/transport/shm/mesh.h"
#include "engine/transport/shm/segment.h"
#include "engine/transport/tcp/handshake.h"
#include "engine/transport/tcp/socket.h"
#include "tests/engine/flood_test_util.h"
#include "tests/engine/rank_threads.h"
#include "tests/engine/transport_test_util.h"

namespace kolo::transport::shm {
namespace {

using kolo::testing::ConnectAll;
using kolo::testing::Devices;
using kolo::testing::FileStore;
using kolo::testing::RunRankThreads;
using kolo::testing::ShmFiles;
using kolo::testing::TestSettings;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::string SegmentPrefix(const std::string& secret) { return "kolo-" + JobId(secret) + "-"; }

// Descriptors of this process open on a memory file whose label starts with `label`.
int MemoryFileDescriptors(const std::string& label) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    std::error_code link_ec;
    const std::string target = std::filesystem::read_symlink(e.path(), link_ec).string();
    if (!link_ec && target.rfind("/memfd:" + label, 0) == 0) ++n;
  }
  return n;
}

// Descriptors of this process open on a segment of the job of `secret` (memory files labelled
// "kolo-<job>-...", which /proc shows as "/memfd:kolo-<job>-<low>-<high> (deleted)").
int SegmentDescriptors(const std::string& secret) {
  return MemoryFileDescriptors(SegmentPrefix(secret));
}

// Mappings of this process of a segment of the job of `secret`.
int SegmentMappings(const std::string& secret) {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) {
    n += line.find("/memfd:" + SegmentPrefix(secret)) != std::string::npos;
  }
  return n;
}

// A memory file labelled "kolo-test" of `bytes`, unsealed unless `seals`, or -1.
int MemoryFile(size_t bytes, int seals = 0) {
  const int fd = ::memfd_create("kolo-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      (seals != 0 && ::fcntl(fd, F_ADD_SEALS, seals) != 0)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Rank 0 posts a receive from `from` and waits for it; returns the Poll's status.
Status ExchangeOne(Devices& d, int from, int to, uint64_t tag) {
  uint64_t out = tag, in = 0;
  auto statuses = RunRankThreads(2, [&](int i) -> Status {
    Device& dev = *d[i == 0 ? from : to];
    KOLO_ASSIGN_OR_RETURN(auto region, dev.Register(i == 0 ? &out : &in, 8));
    if (i == 0) {
      KOLO_RETURN_IF_ERROR(dev.pair(to).Send(*region, 0, 8, tag));
    } else {
      KOLO_RETURN_IF_ERROR(dev.pair(from).Recv(*region, 0, 8, tag));
    }
    std::vector<Completion> done;
    return WaitFor(dev, 1, &done, milliseconds(10000));
  });
  if (!statuses[0].ok()) return statuses[0];
  if (!statuses[1].ok()) return statuses[1];
  return in == tag ? Status::OK() : Internal("received {} instead of {}", in, tag);
}

TEST(ShmSegment, TheCreatorsSegmentOpensAndNothingElseDoes) {
  const std::string secret = kolo::testing::FreshSecret();
  const std::string job = JobId(secret);
  EXPECT_EQ(job.size(), 16u);
  EXPECT_EQ(JobId("same secret"), JobId("same secret"));
  EXPECT_NE(JobId("same secret"), JobId("other secret"));
  const size_t bytes = SegmentBytes(64 << 10);
  tcp::Fd fd;
  auto made = Segment::Create(job, 1, 3, 64 << 10, &fd);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  ASSERT_TRUE(fd.valid());
  // No name anywhere: only a label in /proc, which never holds the secret.
  EXPECT_TRUE(ShmFiles(SegmentPrefix(secret)).empty());
  std::error_code ec;
  const std::string target =
      std::filesystem::read_symlink(fmt::format("/proc/self/fd/{}", fd.get()), ec).string();
  EXPECT_EQ(target, fmt::format("/memfd:kolo-{}-1-3 (deleted)", job)) << ec.message();
  EXPECT_EQ(target.find(secret), std::string::npos);
  EXPECT_EQ(::fcntl(fd.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  struct stat st {};
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_uid, ::geteuid());
  EXPECT_EQ(static_cast<size_t>(st.st_size), bytes);
  // Its size is sealed: nobody can shrink it under a mapping.
  EXPECT_NE(::ftruncate(fd.get(), 4096), 0);
  EXPECT_NE(::ftruncate(fd.get(), static_cast<off_t>(2 * bytes)), 0);

  // The descriptor passed opens, and both see the same rings; Open closes what it was given.
  EXPECT_EQ(SegmentDescriptors(secret), 1);
  auto opened = Segment::Open(tcp::Fd(::dup(fd.get())), 1, 3, 64 << 10, made->nonce());
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(SegmentDescriptors(secret), 1);
  made->ring(1)[5] = 42;
  EXPECT_EQ(opened->ring(1)[5], 42);
  made->control(0).head.store(7);
  EXPECT_EQ(opened->control(0).head.load(), 7u);

  // Not what was announced: another nonce, other ranks, another ring size.
  SegmentNonce other = made->nonce();
  other[0] ^= 1;
  Status s = Segment::Open(tcp::Fd(::dup(fd.get())), 1, 3, 64 << 10, other).status();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("is not the one announced"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("segment of ranks 1 and 3 that rank 1 sent"), std::string::npos)
      << s.message();
  s = Segment::Open(tcp::Fd(::dup(fd.get())), 0, 3, 64 << 10, made->nonce()).status();
  EXPECT_NE(s.message().find("ranks 1 and 3, ring 65536 bytes) is not the one announced"),
            std::string::npos)
      << s.ToString();
  s = Segment::Open(tcp::Fd(::dup(fd.get())), 1, 3, 128 << 10, made->nonce()).status();
  EXPECT_NE(s.message().find(fmt::format("{} bytes, expected {}", bytes, SegmentBytes(128 << 10))),
            std::string::npos)
      << s.ToString();
  EXPECT_EQ(SegmentDescriptors(secret), 1);  // each refused descriptor was closed

  // Not a sealed memory file: a pipe, a file on disk, a memory file that could still shrink.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ::close(pipe_fds[1]);
  s = Segment::Open(tcp::Fd(pipe_fds[0]), 1, 3, 64 << 10, made->nonce()).status();
  EXPECT_NE(s.message().find("expected a regular file"), std::string::npos) << s.ToString();
  char path[] = "/tmp/kolo_shm_segment_XXXXXX";
  const int file = ::mkstemp(path);
  ASSERT_GE(file, 0);
  ::unlink(path);
  ASSERT_EQ(::ftruncate(file, static_cast<off_t>(bytes)), 0);
  s = Segment::Open(tcp::Fd(file), 1, 3, 64 << 10, made->nonce()).status();
  EXPECT_NE(s.message().find("sealed against any change of its size"), std::string::npos)
      << s.ToString();
  const int unsealed = MemoryFile(bytes);
  ASSERT_GE(unsealed, 0);
  s = Segment::Open(tcp::Fd(unsealed), 1, 3, 64 << 10, made->nonce()).status();
  EXPECT_NE(s.message().find("sealed against any change of its size"), std::string::npos)
      << s.ToString();
  // A sealed memory file of the right size whose header is not a segment's.
  const int blank = MemoryFile(bytes, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  ASSERT_GE(blank, 0);
  s = Segment::Open(tcp::Fd(blank), 1, 3, 64 << 10, made->nonce()).status();
  EXPECT_NE(s.message().find("magic 0x0"), std::string::npos) << s.ToString();
  // Another owner.
  if (::geteuid() == 0) {
    const int foreign = MemoryFile(bytes, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    ASSERT_GE(foreign, 0);
    ASSERT_EQ(::fchown(foreign, 65534, 65534), 0);
    s = Segment::Open(tcp::Fd(foreign), 1, 3, 64 << 10, made->nonce()).status();
    EXPECT_NE(s.message().find("owner uid 65534"), std::string::npos) << s.ToString();
  }

  // The creator's descriptor closed: the mappings alone keep the memory.
  fd.reset();
  EXPECT_EQ(SegmentDescriptors(secret), 0);
  EXPECT_EQ(SegmentMappings(secret), 2);
  EXPECT_EQ(opened->ring(1)[5], 42);
  *opened = Segment();
  *made = Segment();
  EXPECT_EQ(SegmentMappings(secret), 0);

  EXPECT_EQ(CheckRingBytes(3 << 20).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRingBytes(32 << 10).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckRingBytes(1 << 20).ok());
}

TEST(ShmTransport, NothingIsLeftInDevShmAfterSetupShutdownOrAbort) {
  for (const bool abort : {false, true}) {
    bootstrap::InMemoryStore store;
    ConnectSettings settings = TestSettings();
    const std::string prefix = SegmentPrefix(settings.secret);
    {
      Devices d = ConnectAll("shm", 4, store, settings);
      ASSERT_TRUE(d[0] && d[1] && d[2] && d[3]);
      // No segment has a name, and once set-up has returned no descriptor of one is left open:
      // the 6 pairs' segments are held by their mappings alone, one per rank of the pair.
      EXPECT_TRUE(ShmFiles(prefix).empty()) << ShmFiles(prefix).front();
      EXPECT_EQ(SegmentDescriptors(settings.secret), 0);
      EXPECT_EQ(SegmentMappings(settings.secret), 12);
      ASSERT_TRUE(ExchangeOne(d, 3, 0, 11).ok());
      if (abort) d[2]->Abort(Internal("test abort"));
    }
    EXPECT_TRUE(ShmFiles(prefix).empty());
    EXPECT_EQ(SegmentMappings(settings.secret), 0);
  }
}

TEST(ShmTransport, RanksOnSeveralHostsAreRefusedNamingThem) {
  bootstrap::InMemoryStore store;
  ConnectSettings settings = TestSettings();
  settings.hosts = bootstrap::HostLayout({"node-a", "node-a", "node-b", "node-b"});
  const auto start = Clock::now();
  auto device = Connect("shm", settings, store, 0, 4);
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kFailedPrecondition);
  const std::string& m = device.status().message();
  EXPECT_NE(m.find("node-a: ranks 0-1, node-b: ranks 2-3"), std::string::npos) << m;
  EXPECT_NE(m.find("--transport auto"), std::string::npos) << m;
  EXPECT_LT(Clock::now() - start, milliseconds(1000));  // refused before any connection
}

TEST(ShmTransport, SetupTimeoutNamesMissingRanks) {
  bootstrap::InMemoryStore store;
  ConnectSettings settings = TestSettings(milliseconds(300));
  settings.hosts = kolo::testing::Layout(3);
  // Rank 0 only accepts: it waits for ranks 1 and 2.
  auto dev = Connect("shm", settings, store, 0, 3);
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.status().code(), StatusCode::kDeadlineExceeded) << dev.status().ToString();
  EXPECT_NE(dev.status().message().find("not connected to rank(s) 1, 2"), std::string::npos)
      << dev.status().message();
  EXPECT_TRUE(ShmFiles(SegmentPrefix(settings.secret)).empty());
}

// A name published for a rank that nothing listens under (the rank is gone, or sits in another
// network namespace behind the same host name) fails the set-up at once, saying what to do.
TEST(ShmTransport, APublishedSocketNobodyListensOnFailsAtOnce) {
  bootstrap::InMemoryStore store;
  ConnectSettings settings = TestSettings(milliseconds(10000));
  settings.hosts = kolo::testing::Layout(2);
  const std::string name = fmt::format("@kolo-shm-{}-0-{:016x}", JobId(settings.secret), 12345);
  ASSERT_TRUE(IsListenerName(name, JobId(settings.secret), 0));
  ASSERT_TRUE(store.Set("shm/addr/0", std::vector<uint8_t>(name.begin(), name.end())).ok());
  const auto start = Clock::now();
  auto dev = Connect("shm", settings, store, 1, 2);
  ASSERT_FALSE(dev.ok());
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  EXPECT_EQ(dev.status().code(), StatusCode::kUnavailable) << dev.status().ToString();
  EXPECT_NE(dev.status().message().find("KOLO_HOST_NAME"), std::string::npos)
      << dev.status().message();
  EXPECT_NE(dev.status().message().find("rank 0"), std::string::npos) << dev.status().message();
}

// Raw bytes at the listener and a handshake with the wrong secret are turned away (the
// connection closed, no segment made); the real rank 1 still gets in.
// A client socket connected to a published shared-memory listener ("@name"), with a 10 s receive
// timeout; invalid if the connection failed.
tcp::Fd ConnectToListener(const std::string& listener) {
  tcp::Fd fd(::socket(AF_UNIX, SOCK_STREAM, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, listener.data() + 1, listener.size() - 1);
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + listener.size());
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) return tcp::Fd();
  timeval tv{10, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

TEST(ShmTransport, ImpostorsAndGarbageDuringSetupAreRejected) {
  bootstrap::InMemoryStore store;
  ConnectSettings settings = TestSettings(milliseconds(15000));
  settings.hosts = kolo::testing::Layout(2);
  std::unique_ptr<Device> rank0;
  std::thread t0([&] {
    auto dev = Connect("shm", settings, store, 0, 2);
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    if (dev.ok()) rank0 = std::move(dev).value();
  });
  auto published = store.Get("shm/addr/0", milliseconds(10000));
  ASSERT_TRUE(published.ok());
  const std::string listener(published->begin(), published->end());
  EXPECT_TRUE(IsListenerName(listener, JobId(settings.secret), 0)) << listener;
  EXPECT_FALSE(IsListenerName(listener, JobId(settings.secret), 1));
  EXPECT_FALSE(IsListenerName(listener, JobId("another secret"), 0));
  // Connects to rank 0's listener, reads its challenge and sends `bytes`, or, if empty, a hello
  // as rank 1 proven with the wrong secret. True if rank 0 then closes the connection.
  auto closed_by_rank0 = [&](const std::string& bytes) {
    tcp::Fd fd = ConnectToListener(listener);
    if (!fd.valid()) return false;
    uint8_t wire[tcp::Challenge::kBytes];
    if (::recv(fd.get(), wire, sizeof wire, MSG_WAITALL) != sizeof wire) return false;
    tcp::Challenge challenge;
    if (!tcp::Decode(wire, &challenge).ok() || challenge.acceptor_rank != 0) return false;
    std::string out = bytes;
    if (out.empty()) {
      tcp::Hello hello;
      hello.from_rank = 1;
      hello.to_rank = 0;
      hello.size = 2;
      hello.mac = tcp::ConnectorProof("not-the-job-secret", challenge.nonce, hello);
      uint8_t hello_wire[tcp::Hello::kBytes];
      tcp::Encode(hello, hello_wire);
      out.assign(reinterpret_cast<const char*>(hello_wire), sizeof hello_wire);
    }
    (void)::send(fd.get(), out.data(), out.size(), MSG_NOSIGNAL);
    char sink[256];
    ssize_t n;
    while ((n = ::recv(fd.get(), sink, sizeof sink, 0)) > 0) {
    }
    // Closed with our bytes unread, the kernel reports a reset rather than the end.
    return n == 0 || (n < 0 && errno == ECONNRESET);
  };
  EXPECT_TRUE(closed_by_rank0(std::string(200, '\x5a')));
  EXPECT_TRUE(closed_by_rank0(""));
  EXPECT_TRUE(ShmFiles(SegmentPrefix(settings.secret)).empty());
  auto rank1 = Connect("shm", settings, store, 1, 2);
  t0.join();
  ASSERT_TRUE(rank1.ok()) << rank1.status().ToString();
  ASSERT_TRUE(rank0);
  Devices d;
  d.push_back(std::move(rank0));
  d.push_back(std::move(rank1).value());
  EXPECT_TRUE(ExchangeOne(d, 1, 0, 3).ok());
  EXPECT_TRUE(ShmFiles(SegmentPrefix(settings.secret)).empty());
}

// A flood of garbage at the shared-memory listener during set-up writes a few lines and a count,
// not a line each, and set-up still completes.
TEST(ShmTransport, AFloodOfGarbageDuringSetupLogsAFewLines) {
  constexpr int kGarbage = 100;
  bootstrap::InMemoryStore store;
  ConnectSettings settings = TestSettings(milliseconds(20000));
  settings.hosts = kolo::testing::Layout(2);
  kolo::testing::StderrToFile log;
  ASSERT_TRUE(log.ok());
  std::unique_ptr<Device> rank0;
  std::thread t0([&] {
    auto dev = Connect("shm", settings, store, 0, 2);
    EXPECT_TRUE(dev.ok()) << dev.status().ToString();
    if (dev.ok()) rank0 = std::move(dev).value();
  });
  auto published = store.Get("shm/addr/0", milliseconds(10000));
  ASSERT_TRUE(published.ok());
  const std::string listener(published->begin(), published->end());
  int rejected = 0;
  for (int i = 0; i < kGarbage; ++i) {
    tcp::Fd fd = ConnectToListener(listener);
    ASSERT_TRUE(fd.valid()) << "connection " << i;
    uint8_t wire[tcp::Challenge::kBytes];
    ASSERT_EQ(::recv(fd.get(), wire, sizeof wire, MSG_WAITALL), static_cast<ssize_t>(sizeof wire));
    const std::string garbage(200, '\x5a');
    (void)::send(fd.get(), garbage.data(), garbage.size(), MSG_NOSIGNAL);
    char sink[64];
    ssize_t n;
    while ((n = ::recv(fd.get(), sink, sizeof sink, 0)) > 0) {
    }
    if (n == 0 || (n < 0 && errno == ECONNRESET)) ++rejected;
  }
  EXPECT_EQ(rejected, kGarbage);
  auto rank1 = Connect("shm", settings, store, 1, 2);
  t0.join();
  ASSERT_TRUE(rank1.ok()) << rank1.status().ToString();
  ASSERT_TRUE(rank0);
  log.Stop();
  const std::string text = log.Text();
  int lines = 0, counted = 0;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = std::min(text.find('\n', at), text.size());
    const std::string line = text.substr(at, nl - at);
    if (line.find("shared-memory listener") != std::string::npos) {
      ++lines;
      const size_t more = line.find("... and ");
      if (more != std::string::npos) counted += std::atoi(line.c_str() + more + 8);
    }
    at = nl + 1;
  }
  EXPECT_LE(lines, 5) << text;
  // Every rejection is written or counted (the count comes when the set-up's listener closes).
  EXPECT_EQ(lines - (counted > 0 ? 1 : 0) + counted, kGarbage) << text;
}

// Rank 0 played by the test, through the real handshake, making offers the real one never makes:
// without the segment's descriptor, with two, with more than rank 1 takes, with one that is not a
// segment. Rank 1 refuses each, naming rank 0 and what was wrong, tells rank 0 why (the refusal on
// the socket), and closes every descriptor that came.
TEST(ShmTransport, OffersWithoutTheirDescriptorOrWithExtraOnesAreRefused) {
  struct Case {
    int descriptors;
    bool pipe;
    const char* expect;
  };
  const Case cases[] = {
      {0, false, "rank 0's segment offer came with 0 descriptors, expected one"},
      {2, false, "rank 0's segment offer came with 2 descriptors, expected one"},
      {9, false, "more descriptors than the 8 this rank takes (MSG_CTRUNC)"},
      {1, true, "expected a regular file"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    bootstrap::InMemoryStore store;
    ConnectSettings settings = TestSettings(milliseconds(10000));
    settings.hosts = kolo::testing::Layout(2);
    const std::string name = fmt::format("kolo-shm-{}-0-{:016x}", JobId(settings.secret), 777);
    tcp::Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    ASSERT_EQ(::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), len), 0);
    ASSERT_EQ(::listen(listener.get(), 4), 0);
    const std::string published = "@" + name;
    ASSERT_TRUE(
        store.Set("shm/addr/0", std::vector<uint8_t>(published.begin(), published.end())).ok());
    Status rank1 = Status::OK();
    std::thread t1([&] { rank1 = Connect("shm", settings, store, 1, 2).status(); });
    std::string refusal;
    {
      pollfd pfd{listener.get(), POLLIN, 0};
      ASSERT_EQ(::poll(&pfd, 1, 10000), 1);
      tcp::Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      ASSERT_TRUE(conn.valid());
      timeval tv{10, 0};
      ::setsockopt(conn.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      tcp::Challenge challenge{0, {}};
      challenge.nonce = *tcp::RandomNonce();
      uint8_t challenge_wire[tcp::Challenge::kBytes];
      tcp::Encode(challenge, challenge_wire);
      ASSERT_EQ(::send(conn.get(), challenge_wire, sizeof challenge_wire, MSG_NOSIGNAL),
                static_cast<ssize_t>(sizeof challenge_wire));
      uint8_t hello_wire[tcp::Hello::kBytes];
      ASSERT_EQ(::recv(conn.get(), hello_wire, sizeof hello_wire, MSG_WAITALL),
                static_cast<ssize_t>(sizeof hello_wire));
      tcp::Hello hello;
      ASSERT_TRUE(tcp::Decode(hello_wire, &hello).ok());
      uint8_t welcome_wire[tcp::Welcome::kBytes];
      tcp::Encode(tcp::Welcome{tcp::AcceptorProof(settings.secret, challenge.nonce, hello)},
                  welcome_wire);
      ASSERT_EQ(::send(conn.get(), welcome_wire, sizeof welcome_wire, MSG_NOSIGNAL),
                static_cast<ssize_t>(sizeof welcome_wire));
      // The offer: a nonce, the ring size, and the descriptors of the case on its first byte.
      uint8_t offer[sizeof(SegmentNonce) + sizeof(uint64_t)] = {};
      const uint64_t ring_bytes = 64 << 10;
      std::memcpy(offer + sizeof(SegmentNonce), &ring_bytes, sizeof ring_bytes);
      std::vector<tcp::Fd> passed;
      for (int i = 0; i < c.descriptors; ++i) {
        if (c.pipe) {
          int pipe_fds[2];
          ASSERT_EQ(::pipe2(pipe_fds, O_CLOEXEC), 0);
          ::close(pipe_fds[1]);
          passed.emplace_back(pipe_fds[0]);
        } else {
          passed.emplace_back(
              MemoryFile(SegmentBytes(ring_bytes), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
          ASSERT_TRUE(passed.back().valid());
        }
      }
      std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(passed.size(), 1)));
      iovec iov{offer, sizeof offer};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      if (!passed.empty()) {
        msg.msg_control = control.data();
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * passed.size());
        cmsghdr* cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * passed.size());
        for (size_t i = 0; i < passed.size(); ++i) {
          const int d = passed[i].get();
          std::memcpy(CMSG_DATA(cm) + i * sizeof(int), &d, sizeof d);
        }
      }
      ASSERT_EQ(::sendmsg(conn.get(), &msg, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof offer));
      passed.clear();  // in flight, the socket holds them; rank 1 must close what it receives
      uint8_t head[3];
      ASSERT_EQ(::recv(conn.get(), head, sizeof head, MSG_WAITALL), 3);
      EXPECT_EQ(head[0], 1);  // refused
      refusal.resize(head[1] | (size_t{head[2]} << 8));
      ASSERT_EQ(::recv(conn.get(), refusal.data(), refusal.size(), MSG_WAITALL),
                static_cast<ssize_t>(refusal.size()));
    }
    t1.join();
    EXPECT_NE(refusal.find(c.expect), std::string::npos) << refusal;
    EXPECT_FALSE(rank1.ok());
    EXPECT_NE(rank1.message().find(c.expect), std::string::npos) << rank1.ToString();
    EXPECT_NE(rank1.message().find("rank 1: shared-memory set-up with rank 0"), std::string::npos)
        << rank1.ToString();
    EXPECT_EQ(MemoryFileDescriptors("kolo-test"), 0);
  }
}

// A forked process as one rank of the job, for the tests where a rank must die or stop for real.
class ChildRank {
 public:
  ChildRank() {
    char dir_template[] = "/tmp/kolo_shm_test_XXXXXX";
    dir_ = ::mkdtemp(dir_template) ? dir_template : "";
  }
  ~ChildRank() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::kill(pid_, SIGCONT);
      ::waitpid(pid_, nullptr, 0);
    }
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  const std::string& dir() const { return dir_; }
  // Forks rank `rank` of `size` ranks on one host; it connects through `transport`, then runs
  // `body` on its device and exits.
  template <typename Body>
  void Start(const std::string& transport, ConnectSettings settings, int rank, int size,
             Body body) {
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      FileStore store(dir_);
      settings.hosts = kolo::testing::Layout(size);
      auto device = Connect(transport, settings, store, rank, size);
      if (!device.ok()) ::_exit(1);
      body(**device);
      // A clean shutdown says GOODBYE: a child that just exited would look like a dead peer to
      // a parent still reading the child's last message out of the ring.
      device->reset();
      ::_exit(0);
    }
  }
  pid_t pid() const { return pid_; }
  // Waits (bounded) for the child's exit; its wait status, or -1.
  int Reap(milliseconds within) {
    const auto deadline = Clock::now() + within;
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return status;
      }
      std::this_thread::sleep_for(milliseconds(5));
    }
    return -1;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

// Rank 2 is a process that connects and is then killed (SIGKILL: no GOODBYE, no clean-up of its
// own). Rank 0, waiting on rank 1 (which never sends), learns at once that rank 2 is gone, and
// nothing of the job is left in /dev/shm.
TEST(ShmTransport, AKilledPeerProcessIsNamedAtOnce) {
  for (const char* transport : {"shm", "auto"}) {
    SCOPED_TRACE(transport);
    ConnectSettings settings = TestSettings(milliseconds(10000));
    ChildRank child;
    ASSERT_FALSE(child.dir().empty());
    child.Start(transport, settings, 2, 3, [](Device&) {
      ::usleep(300 * 1000);
      ::kill(::getpid(), SIGKILL);
    });
    FileStore store(child.dir());
    Devices d = ConnectAll(transport, 2, store, settings, 3);
    ASSERT_TRUE(d[0] && d[1]);
    EXPECT_TRUE(ShmFiles(SegmentPrefix(settings.secret)).empty());
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
    const int status = child.Reap(milliseconds(5000));
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
    EXPECT_TRUE(ShmFiles(SegmentPrefix(settings.secret)).empty());
  }
}

// Rank 2 is a process that waits for messages (sending keepalives) until it is stopped
// (SIGSTOP). After half the peer timeout rank 0 names rank 2 as silent while rank 1, alive and
// polled, stays fresh; killed, rank 2 is then reported lost.
TEST(ShmTransport, AStoppedPeerProcessIsNamedBySilentSeconds) {
  ConnectSettings settings = TestSettings(milliseconds(1000));  // silent after 500 ms
  ChildRank child;
  ASSERT_FALSE(child.dir().empty());
  child.Start("shm", settings, 2, 3, [](Device& device) {
    for (int i = 0; i < 3000; ++i) {  // bounded: 30 s at most
      bool arrived = false;
      if (!device.WaitForArrival(std::chrono::microseconds(10000), &arrived).ok()) return;
    }
  });
  FileStore store(child.dir());
  Devices d = ConnectAll("shm", 2, store, settings, 3);
  ASSERT_TRUE(d[0] && d[1]);
  std::atomic<bool> stop{false};
  std::thread alive([&] {
    while (!stop.load()) {
      bool arrived = false;
      if (!d[1]->WaitForArrival(std::chrono::microseconds(20000), &arrived).ok()) return;
    }
  });
  std::this_thread::sleep_for(milliseconds(300));
  std::vector<Completion> done;
  // Both peers alive: neither silent.
  EXPECT_EQ(d[0]->Poll(&done, milliseconds(300)).code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(d[0]->SilentSeconds(2), 0.5);
  EXPECT_LT(d[0]->SilentSeconds(1), 0.5);
  ASSERT_EQ(::kill(child.pid(), SIGSTOP), 0);
  uint64_t word = 0;
  auto region = d[0]->Register(&word, 8);
  ASSERT_TRUE(region.ok());
  ASSERT_TRUE(d[0]->pair(1).Recv(**region, 0, 8, 1).ok());
  Status s = d[0]->Poll(&done, milliseconds(1200));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("rank 2 has sent nothing for"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("rank 1 has sent nothing"), std::string::npos) << s.message();
  EXPECT_GE(d[0]->SilentSeconds(2), 0.5);
  EXPECT_LT(d[0]->SilentSeconds(1), 0.5);
  EXPECT_EQ(SilentPeers(*d[0], milliseconds(500)), std::vector<int>{2});
  stop = true;
  alive.join();
  ASSERT_EQ(::kill(child.pid(), SIGKILL), 0);
  s = d[0]->Poll(&done, milliseconds(5000));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("connection to rank 2 lost"), std::string::npos) << s.message();
  child.Reap(milliseconds(5000));
  EXPECT_TRUE(ShmFiles(SegmentPrefix(settings.secret)).empty());
}

// Ranks in two processes move data both ways through the segment they share.
TEST(ShmTransport, RanksInTwoProcessesExchangeData) {
  ConnectSettings settings = TestSettings(milliseconds(10000));
  ChildRank child;
  ASSERT_FALSE(child.dir().empty());
  constexpr size_t kBytes = 20 << 20;
  child.Start("shm", settings, 1, 2, [](Device& device) {
    // Echo one message back, incremented bytewise.
    std::vector<uint8_t> buf(kBytes);
    auto region = device.Register(buf.data(), buf.size());
    if (!region.ok() || !device.pair(0).Recv(**region, 0, kBytes, 1).ok()) ::_exit(2);
    std::vector<Completion> done;
    if (!WaitFor(device, 1, &done, std::chrono::milliseconds(10000)).ok()) ::_exit(3);
    for (auto& b : buf) ++b;
    if (!device.pair(0).Send(**region, 0, kBytes, 2).ok()) ::_exit(4);
    if (!WaitFor(device, 1, &done, std::chrono::milliseconds(10000)).ok()) ::_exit(5);
  });
  FileStore store(child.dir());
  Devices d = ConnectAll("shm", 1, store, settings, 2);
  ASSERT_TRUE(d[0]);
  const std::vector<uint8_t> sent = kolo::testing::Pattern(kBytes, 3);
  std::vector<uint8_t> back(kBytes);
  auto out = d[0]->Register(const_cast<uint8_t*>(sent.data()), kBytes);
  auto in = d[0]->Register(back.data(), kBytes);
  ASSERT_TRUE(out.ok() && in.ok());
  ASSERT_TRUE(d[0]->pair(1).Send(**out, 0, kBytes, 1).ok());
  ASSERT_TRUE(d[0]->pair(1).Recv(**in, 0, kBytes, 2).ok());
  std::vector<Completion> done;
  ASSERT_TRUE(WaitFor(*d[0], 2, &done, milliseconds(20000)).ok());
  for (size_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(back[i], static_cast<uint8_t>(sent[i] + 1)) << "byte " << i;
  }
  const int status = child.Reap(milliseconds(10000));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(ShmFiles(SegmentPrefix(settings.secret)).empty());
}

}  // namespace
}  // namespace kolo::transport::shm
