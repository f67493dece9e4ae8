// Tests of the bootstrap: InMemoryStore, the TCP store (real sockets on loopback), listen-address
// rules, secrets and StartRendezvous. The Launched.* tests run only under a launcher (kolo-run or
// mpirun; tests/scripts/kolo_run.sh starts them) and skip otherwise.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/host_layout.h"
#include "engine/bootstrap/rendezvous.h"
#include "engine/bootstrap/store.h"
#include "engine/bootstrap/tcp_store.h"
#include "engine/bootstrap/tcp_store_wire.h"
#include "gtest/gtest.h"
#include "tests/engine/flood_test_util.h"

namespace kolo::bootstrap {
namespace {

using std::chrono::milliseconds;
using Bytes = std::vector<uint8_t>;

Bytes B(const std::string& s) { return Bytes(s.begin(), s.end()); }

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

const std::string kSecret = "0123456789abcdef0123456789abcdef";

std::unique_ptr<TcpStoreServer> StartServer(milliseconds hello_timeout = milliseconds(5000)) {
  TcpStoreServerOptions o;
  o.secret = kSecret;
  o.hello_timeout = hello_timeout;
  auto s = TcpStoreServer::Start(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : nullptr;
}

std::unique_ptr<TcpStoreClient> ConnectClient(const std::string& addr) {
  auto c = TcpStoreClient::Connect(addr, kSecret, milliseconds(5000));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// A raw TCP connection to `addr`, for speaking (or garbling) the protocol by hand.
int RawConnect(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True if the peer closes `fd` within `bound` (reads and discards whatever it sends first).
bool ClosedByPeerWithin(int fd, milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  char buf[256];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) return true;  // EOF or reset
  }
  return false;
}

void PutLe32(std::string* s, uint32_t v) {
  for (int i = 0; i < 4; ++i) s->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint32_t GetLe32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<uint8_t>(s[at + i])} << (8 * i);
  return v;
}

// Reads exactly `n` bytes within `bound`; empty on EOF, error or timeout.
std::string RecvExactly(int fd, size_t n, milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  std::string out;
  char buf[256];
  while (out.size() < n && Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t r = recv(fd, buf, std::min(sizeof(buf), n - out.size()), 0);
    if (r <= 0) return "";
    out.append(buf, static_cast<size_t>(r));
  }
  return out.size() == n ? out : "";
}

bool SendAll(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

StoreNonce NonceAt(const std::string& s, size_t at) {
  StoreNonce n;
  std::memcpy(n.data(), s.data() + at, n.size());
  return n;
}

std::string DigestBytes(const Digest& d) { return std::string(d.begin(), d.end()); }

// The client's side of the handshake done by hand on a raw connection: reads the challenge, sends
// a hello proving `secret` and returns the verdict ("" when a step fails).
std::string RawHandshake(int fd, const std::string& secret) {
  const std::string challenge = RecvExactly(fd, kChallengeBytes, milliseconds(3000));
  if (challenge.empty()) return "";
  StoreNonce mine{};
  mine[0] = 42;
  std::string hello;
  PutLe32(&hello, kStoreMagic);
  hello.append(mine.begin(), mine.end());
  hello += DigestBytes(StoreClientProof(secret, NonceAt(challenge, 4), mine));
  if (!SendAll(fd, hello)) return "";
  return RecvExactly(fd, kVerdictBytes, milliseconds(3000));
}

// A listening socket on an ephemeral loopback port; `addr` gets "127.0.0.1:port".
int ListenLoopback(std::string* addr) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  *addr = "127.0.0.1:" + std::to_string(ntohs(sa.sin_port));
  return fd;
}

// Accepts one connection within `bound`; -1 if none came.
int AcceptWithin(int listen_fd, milliseconds bound) {
  pollfd p{listen_fd, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(bound.count())) <= 0) return -1;
  return accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
}

// Appends everything `fd` sends until it closes or `bound` passes.
void RecvUntilClosed(int fd, std::string* out, milliseconds bound) {
  const auto deadline = Clock::now() + bound;
  char buf[4096];
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    const ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r <= 0) return;
    out->append(buf, static_cast<size_t>(r));
  }
}

// Sits between one client and a store server, forwarding both ways and keeping a copy of every
// byte: `up` what the client sent, `down` what the server sent. Ends when either side closes.
struct RecordingProxy {
  std::string address;
  std::string up, down;

  explicit RecordingProxy(const std::string& server_addr) {
    listen_fd_ = ListenLoopback(&address);
    thread_ = std::thread([this, server_addr] { Run(server_addr); });
  }
  ~RecordingProxy() {
    Join();
    close(listen_fd_);
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run(const std::string& server_addr) {
    const int client = AcceptWithin(listen_fd_, milliseconds(10000));
    if (client < 0) return;
    const int server = RawConnect(server_addr);
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    char buf[64 << 10];
    while (server >= 0 && Clock::now() < deadline) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (poll(p, 2, 50) <= 0) continue;
      bool closed = false;
      for (int i = 0; i < 2 && !closed; ++i) {
        if (p[i].revents == 0) continue;
        const ssize_t r = recv(p[i].fd, buf, sizeof(buf), 0);
        if (r <= 0) {
          closed = true;
          break;
        }
        (i == 0 ? up : down).append(buf, static_cast<size_t>(r));
        const std::string chunk(buf, static_cast<size_t>(r));
        if (!SendAll(i == 0 ? server : client, chunk)) closed = true;
      }
      if (closed) break;
    }
    if (server >= 0) close(server);
    close(client);
  }

  int listen_fd_ = -1;
  std::thread thread_;
};

// One client session (connect, Set, Get, disconnect) through a RecordingProxy.
struct Recorded {
  std::string up, down;
};
Recorded RecordSession(const std::string& server_addr) {
  RecordingProxy proxy(server_addr);
  {
    auto c = TcpStoreClient::Connect(proxy.address, kSecret, milliseconds(5000));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    if (c.ok()) {
      EXPECT_TRUE((*c)->Set("recorded/key", B("recorded value")).ok());
      EXPECT_EQ(*(*c)->Get("recorded/key", milliseconds(1000)), B("recorded value"));
    }
  }
  proxy.Join();
  return {proxy.up, proxy.down};
}

// A store impostor for one connection: sends a challenge, reads the hello, answers with the
// verdict that `answer` makes from (nonce_s, hello), and records every byte the client sends.
struct FakeServer {
  using Answer = std::function<std::string(const StoreNonce&, const std::string&)>;
  std::string address;
  std::string received;

  explicit FakeServer(Answer answer) {
    listen_fd_ = ListenLoopback(&address);
    thread_ = std::thread([this, answer = std::move(answer)] {
      const int fd = AcceptWithin(listen_fd_, milliseconds(10000));
      if (fd < 0) return;
      StoreNonce nonce{};
      for (size_t i = 0; i < nonce.size(); ++i) nonce[i] = static_cast<uint8_t>(7 * i + 1);
      std::string challenge;
      PutLe32(&challenge, kStoreMagic);
      challenge.append(nonce.begin(), nonce.end());
      if (SendAll(fd, challenge)) {
        const std::string hello = RecvExactly(fd, kHelloBytes, milliseconds(5000));
        received += hello;
        if (!hello.empty() && SendAll(fd, answer(nonce, hello))) {
          RecvUntilClosed(fd, &received, milliseconds(5000));
        }
      }
      close(fd);
    });
  }
  ~FakeServer() {
    Join();
    close(listen_fd_);
  }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  int listen_fd_ = -1;
  std::thread thread_;
};

std::string Verdict(uint8_t accepted, const std::string& mac) {
  std::string v;
  PutLe32(&v, kStoreMagic);
  v.push_back(static_cast<char>(accepted));
  v += mac;
  return v;
}

// Whether `haystack` holds `secret` or any 8-byte piece of it.
bool ContainsSecret(const std::string& haystack, const std::string& secret) {
  for (size_t i = 0; i + 8 <= secret.size(); ++i) {
    if (haystack.find(secret.substr(i, 8)) != std::string::npos) return true;
  }
  return false;
}

// ------------------------------------------------------------------------------------------------
// Store semantics, shared by both implementations.

void CheckStoreSemantics(Store& store, Store& other) {
  ASSERT_TRUE(store.Set("a", B("alpha")).ok());
  auto a = other.Get("a", milliseconds(1000));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, B("alpha"));
  // Binary values with zero bytes and an empty value survive unchanged.
  Bytes binary = {0, 1, 2, 0, 255, 0};
  ASSERT_TRUE(store.Set("bin", binary).ok());
  ASSERT_TRUE(store.Set("empty", {}).ok());
  EXPECT_EQ(*other.Get("bin", milliseconds(1000)), binary);
  EXPECT_TRUE(other.Get("empty", milliseconds(1000))->empty());
  // Same value again is fine; a different one is not.
  EXPECT_TRUE(other.Set("a", B("alpha")).ok());
  Status s = other.Set("a", B("beta"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'a'"), std::string::npos) << s.message();
  EXPECT_EQ(*store.Get("a", milliseconds(1000)), B("alpha"));

  // Get waits for a Set made later by someone else.
  const auto t0 = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(150));
    EXPECT_TRUE(store.Set("late", B("here")).ok());
  });
  auto late = other.Get("late", milliseconds(5000));
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_EQ(*late, B("here"));
  EXPECT_GE(SecondsSince(t0), 0.1);

  // A key nobody sets: DeadlineExceeded naming the key, after about the timeout.
  const auto t1 = Clock::now();
  auto missing = other.Get("never/set", milliseconds(200));
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("never/set"), std::string::npos);
  EXPECT_GE(SecondsSince(t1), 0.19);
  EXPECT_LT(SecondsSince(t1), 3.0);
}

TEST(InMemoryStore, Semantics) {
  InMemoryStore store;
  CheckStoreSemantics(store, store);
}

TEST(TcpStore, SemanticsAcrossTwoClients) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  auto c1 = ConnectClient(server->address());
  auto c2 = ConnectClient(server->address());
  ASSERT_TRUE(c1 && c2);
  CheckStoreSemantics(*c1, *c2);
  EXPECT_EQ(server->accepted_clients(), 2u);
  EXPECT_EQ(server->rejected_connections(), 0u);
}

TEST(TcpStore, AddressIsLoopbackWithEphemeralPort) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  const std::string addr = server->address();
  EXPECT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr;
  EXPECT_GT(std::stoi(addr.substr(addr.rfind(':') + 1)), 0);
}

TEST(TcpStore, LargeValueAndTimeoutMessageNamesAddress) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  auto c = ConnectClient(server->address());
  ASSERT_TRUE(c);
  Bytes big(3 << 20);
  std::mt19937 rng(7);
  for (auto& b : big) b = static_cast<uint8_t>(rng());
  ASSERT_TRUE(c->Set("big", big).ok());
  EXPECT_EQ(*c->Get("big", milliseconds(2000)), big);
  auto missing = c->Get("nope", milliseconds(50));
  EXPECT_NE(missing.status().message().find(server->address()), std::string::npos)
      << missing.status().message();
  // Bounds are checked before anything is sent.
  EXPECT_EQ(c->Set("", B("x")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Set("huge", Bytes(kStoreMaxValueBytes + 1)).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(c->Set("after", B("still works")).ok());
}

TEST(TcpStore, ConcurrentClientsExchangeAll) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  constexpr int kClients = 16;
  std::vector<std::thread> threads;
  std::vector<int> wrong(kClients, 0);
  std::vector<std::string> errors(kClients);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = TcpStoreClient::Connect(server->address(), kSecret, milliseconds(5000));
      if (!c.ok()) {
        errors[i] = c.status().ToString();
        return;
      }
      Status s = (*c)->Set("addr/" + std::to_string(i), B("value-" + std::to_string(i * 31)));
      if (!s.ok()) errors[i] = s.ToString();
      for (int j = 0; j < kClients; ++j) {
        auto v = (*c)->Get("addr/" + std::to_string(j), milliseconds(10000));
        if (!v.ok()) {
          errors[i] = v.status().ToString();
          return;
        }
        if (*v != B("value-" + std::to_string(j * 31))) wrong[i]++;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(errors[i], "") << "client " << i;
    EXPECT_EQ(wrong[i], 0) << "client " << i;
  }
  EXPECT_EQ(server->accepted_clients(), static_cast<uint64_t>(kClients));
}

// A local user who floods the store with wrong secrets gets a few warning lines, not one per
// connection; every connection is still rejected and counted.
TEST(TcpStore, AFloodOfWrongSecretsLogsAFewLines) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  char path[] = "/tmp/kolo-store-log-XXXXXX";
  const int log = ::mkstemp(path);
  ASSERT_GE(log, 0);
  std::fflush(stderr);
  const int saved = ::dup(2);
  ASSERT_EQ(::dup2(log, 2), 2);
  constexpr int kFlood = 40;
  for (int i = 0; i < kFlood; ++i) {
    auto bad = TcpStoreClient::Connect(server->address(), "ffffffffffffffffffffffffffffffff",
                                       milliseconds(3000));
    EXPECT_FALSE(bad.ok());
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::ifstream in(path);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) lines += line.find("wrong job secret") != std::string::npos;
  ::close(log);
  ::unlink(path);
  EXPECT_EQ(server->rejected_connections(), static_cast<uint64_t>(kFlood));
  EXPECT_GE(lines, 1);
  EXPECT_LE(lines, 5) << "one warning per rejected connection floods the log";
}

// Hundreds of connections that never say a word, garbage ones and ones that hang up at once, at
// the store: every one is turned away, yet the server writes a few lines about them (at most 5 in
// 10 s, not one each: before, 300 idle connections wrote 300 lines in one second), and when it
// stops one line counts the rest. A client connected before the flood and one after are served.
TEST(TcpStore, AFloodOfIdleAndGarbageConnectionsLogsAFewLines) {
  using kolo::testing::AllClosedByPeerWithin;
  using kolo::testing::ClientFds;
  using kolo::testing::ConnectWithin;
  using kolo::testing::CountedInSummaries;
  using kolo::testing::LinesWith;
  using kolo::testing::StderrToFile;
  auto server = StartServer(milliseconds(300));
  ASSERT_TRUE(server);
  const std::string addr = server->address();
  auto before = ConnectClient(addr);
  ASSERT_TRUE(before);
  constexpr int kIdle = 300, kGarbage = 50, kHangUps = 20;
  constexpr uint64_t kTotal = kIdle + kGarbage + kHangUps;
  StderrToFile log;
  ASSERT_TRUE(log.ok());
  ClientFds fds;
  for (int i = 0; i < kIdle + kGarbage; ++i) {
    const int fd = ConnectWithin(addr);
    ASSERT_GE(fd, 0) << "connection " << i;
    fds.push_back(fd);
    if (i >= kIdle) {
      const std::string garbage(64, '\xab');  // magic 0xabababab
      ASSERT_TRUE(SendAll(fd, garbage));
    }
  }
  for (int i = 0; i < kHangUps; ++i) {
    const int fd = ConnectWithin(addr);
    ASSERT_GE(fd, 0);
    close(fd);
  }
  EXPECT_TRUE(AllClosedByPeerWithin(fds, milliseconds(10000)));
  const auto deadline = Clock::now() + milliseconds(5000);
  while (server->rejected_connections() < kTotal && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(server->rejected_connections(), kTotal);
  ASSERT_TRUE(before->Set("after/flood", B("served")).ok());
  auto after = ConnectClient(addr);
  ASSERT_TRUE(after);
  EXPECT_EQ(*after->Get("after/flood", milliseconds(2000)), B("served"));

  const std::string prefix = "store " + addr + ": ";
  const std::string during = log.Text();
  const int lines = LinesWith(during, prefix);
  EXPECT_GE(lines, 1);
  EXPECT_LE(lines, 5) << "the flood's lines flood the log; the first of them:\n"
                      << during.substr(0, 3000);
  server->Stop();
  log.Stop();
  // Every rejection is either written on its own line or counted in a summary (on Stop).
  const std::string all = log.Text();
  const int written = LinesWith(all, prefix + "closed connection from");
  EXPECT_EQ(written + CountedInSummaries(all, "store " + addr), static_cast<int64_t>(kTotal))
      << all.substr(0, 3000);
  EXPECT_GE(LinesWith(all, prefix + "... and "), 1) << all.substr(0, 3000);
}

TEST(TcpStore, WrongSecretIsRejectedAndServerKeepsServing) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  auto bad = TcpStoreClient::Connect(server->address(), "ffffffffffffffffffffffffffffffff",
                                     milliseconds(3000));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("rejected the job secret"), std::string::npos);
  EXPECT_NE(bad.status().message().find(server->address()), std::string::npos);
  // A secret that is a prefix of the real one is no better.
  auto prefix =
      TcpStoreClient::Connect(server->address(), kSecret.substr(0, 20), milliseconds(3000));
  EXPECT_FALSE(prefix.ok());
  EXPECT_EQ(server->rejected_connections(), 2u);
  auto good = ConnectClient(server->address());
  ASSERT_TRUE(good);
  EXPECT_TRUE(good->Set("k", B("v")).ok());
  EXPECT_EQ(*good->Get("k", milliseconds(1000)), B("v"));
}

TEST(TcpStore, GarbageOversizedAndIdleConnectionsAreDropped) {
  auto server = StartServer(milliseconds(300));
  ASSERT_TRUE(server);
  auto good = ConnectClient(server->address());
  ASSERT_TRUE(good);
  ASSERT_TRUE(good->Set("before", B("1")).ok());

  // Random bytes instead of a hello.
  std::mt19937 rng(1234);
  std::string garbage(4096, '\0');
  for (auto& ch : garbage) ch = static_cast<char>(rng());
  const int g = RawConnect(server->address());
  ASSERT_GE(g, 0);
  ASSERT_EQ(send(g, garbage.data(), garbage.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(garbage.size()));
  EXPECT_TRUE(ClosedByPeerWithin(g, milliseconds(3000)));
  close(g);

  // A correct handshake, then a request announcing a value larger than allowed.
  const int o = RawConnect(server->address());
  ASSERT_GE(o, 0);
  const std::string verdict = RawHandshake(o, kSecret);
  ASSERT_EQ(verdict.size(), kVerdictBytes);
  ASSERT_EQ(verdict[4], 1);
  std::string frame;
  frame.push_back(1);  // Set
  PutLe32(&frame, 3);
  PutLe32(&frame, static_cast<uint32_t>(kStoreMaxValueBytes + 1));
  PutLe32(&frame, 0);
  frame += "key";
  ASSERT_EQ(send(o, frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
  EXPECT_TRUE(ClosedByPeerWithin(o, milliseconds(3000)));
  close(o);

  // A connection that never says anything is closed after the hello timeout.
  const int idle = RawConnect(server->address());
  ASSERT_GE(idle, 0);
  const auto t0 = Clock::now();
  EXPECT_TRUE(ClosedByPeerWithin(idle, milliseconds(3000)));
  EXPECT_GE(SecondsSince(t0), 0.25);
  close(idle);

  EXPECT_EQ(server->rejected_connections(), 3u);
  // The established client and new clients are unaffected.
  EXPECT_EQ(*good->Get("before", milliseconds(1000)), B("1"));
  auto fresh = ConnectClient(server->address());
  ASSERT_TRUE(fresh);
  EXPECT_TRUE(fresh->Set("after", B("2")).ok());
  EXPECT_EQ(*good->Get("after", milliseconds(1000)), B("2"));
}

// Every byte a client sends during a whole session (handshake, Set, Get) is recorded between it
// and the server: the requests are there, the secret is not.
TEST(TcpStore, ClientNeverSendsTheSecret) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  const Recorded rec = RecordSession(server->address());
  EXPECT_EQ(server->accepted_clients(), 1u);
  // The recording holds the session, so the check below looks at real traffic.
  ASSERT_GE(rec.up.size(), kHelloBytes);
  EXPECT_NE(rec.up.find("recorded/key"), std::string::npos);
  EXPECT_NE(rec.up.find("recorded value"), std::string::npos);
  EXPECT_FALSE(ContainsSecret(rec.up, kSecret)) << "the client sent (part of) the job secret";
  EXPECT_FALSE(ContainsSecret(rec.down, kSecret)) << "the server sent (part of) the job secret";
}

// A hello recorded from a successful exchange proves the secret for that exchange's nonce only:
// replayed on a new connection it is refused, and the server keeps serving.
TEST(TcpStore, ReplayedHelloIsRejected) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  const Recorded rec = RecordSession(server->address());
  ASSERT_GE(rec.down.size(), kChallengeBytes);
  ASSERT_GE(rec.up.size(), kHelloBytes);
  const std::string old_challenge = rec.down.substr(0, kChallengeBytes);
  const std::string old_hello = rec.up.substr(0, kHelloBytes);
  // The recording is a valid proof of the secret for the recorded challenge.
  ASSERT_EQ(
      old_hello.substr(4 + kStoreNonceBytes),
      DigestBytes(StoreClientProof(kSecret, NonceAt(old_challenge, 4), NonceAt(old_hello, 4))));

  for (int attempt = 0; attempt < 3; ++attempt) {
    const int fd = RawConnect(server->address());
    ASSERT_GE(fd, 0);
    const std::string challenge = RecvExactly(fd, kChallengeBytes, milliseconds(3000));
    ASSERT_EQ(challenge.size(), kChallengeBytes);
    EXPECT_EQ(GetLe32(challenge, 0), kStoreMagic);
    EXPECT_NE(challenge.substr(4), old_challenge.substr(4)) << "the server reused a nonce";
    ASSERT_TRUE(SendAll(fd, old_hello));
    const std::string verdict = RecvExactly(fd, kVerdictBytes, milliseconds(3000));
    ASSERT_EQ(verdict.size(), kVerdictBytes);
    EXPECT_EQ(verdict[4], 0) << "a replayed hello was accepted";
    EXPECT_EQ(verdict.substr(5), std::string(32, '\0')) << "a rejection must carry no proof";
    EXPECT_TRUE(ClosedByPeerWithin(fd, milliseconds(3000)));
    close(fd);
  }
  EXPECT_EQ(server->rejected_connections(), 3u);
  EXPECT_EQ(server->accepted_clients(), 1u);
  auto good = ConnectClient(server->address());
  ASSERT_TRUE(good);
  EXPECT_EQ(*good->Get("recorded/key", milliseconds(1000)), B("recorded value"));
}

// A server that does not know the secret cannot pass itself off as the store: the client checks
// the server's proof. The impostor also records what the client sent, which holds no secret.
TEST(TcpStore, ClientRejectsServerThatCannotProveTheSecret) {
  const std::string other_secret = "fedcba9876543210fedcba9876543210";
  struct Case {
    const char* name;
    FakeServer::Answer answer;
  };
  const Case cases[] = {
      {"no proof",
       [](const StoreNonce&, const std::string&) { return Verdict(1, std::string(32, '\0')); }},
      {"proof under another secret",
       [&](const StoreNonce& nonce, const std::string& hello) {
         return Verdict(1, DigestBytes(StoreServerProof(other_secret, nonce, NonceAt(hello, 4))));
       }},
      {"the client's own proof sent back",
       [](const StoreNonce&, const std::string& hello) {
         return Verdict(1, hello.substr(4 + kStoreNonceBytes));
       }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    FakeServer fake(c.answer);
    const auto t0 = Clock::now();
    auto client = TcpStoreClient::Connect(fake.address, kSecret, milliseconds(3000));
    ASSERT_FALSE(client.ok()) << "the client trusted a server without the secret";
    EXPECT_EQ(client.status().code(), StatusCode::kUnavailable) << client.status().ToString();
    EXPECT_NE(client.status().message().find("failed to prove the job secret"), std::string::npos)
        << client.status().message();
    EXPECT_NE(client.status().message().find(fake.address), std::string::npos);
    EXPECT_LT(SecondsSince(t0), 3.0);
    fake.Join();
    ASSERT_EQ(fake.received.size(), kHelloBytes);  // the hello, then the client hung up
    EXPECT_EQ(GetLe32(fake.received, 0), kStoreMagic);
    EXPECT_FALSE(ContainsSecret(fake.received, kSecret));
  }

  // The same impostor given the secret passes, so the failures above come from the proof alone.
  FakeServer knowing([](const StoreNonce& nonce, const std::string& hello) {
    return Verdict(1, DigestBytes(StoreServerProof(kSecret, nonce, NonceAt(hello, 4))));
  });
  auto client = TcpStoreClient::Connect(knowing.address, kSecret, milliseconds(3000));
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  client = Internal("closed");  // hang up, so the impostor stops recording
  knowing.Join();
  EXPECT_FALSE(ContainsSecret(knowing.received, kSecret));

  // A rejection from the impostor reads as a wrong secret, as from the real store.
  FakeServer refusing(
      [](const StoreNonce&, const std::string&) { return Verdict(0, std::string(32, '\0')); });
  auto refused = TcpStoreClient::Connect(refusing.address, kSecret, milliseconds(3000));
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("rejected the job secret"), std::string::npos);
}

// Short, malformed and overlong hellos are refused without an answer that proves anything; the
// server neither crashes nor hangs and keeps serving old and new clients.
TEST(TcpStore, ShortAndGarbageHellosAreRejected) {
  auto server = StartServer(milliseconds(300));
  ASSERT_TRUE(server);
  auto good = ConnectClient(server->address());
  ASSERT_TRUE(good);
  ASSERT_TRUE(good->Set("before", B("1")).ok());
  std::string magic;
  PutLe32(&magic, kStoreMagic);
  std::mt19937 rng(99);
  const auto random_bytes = [&](size_t n) {
    std::string out(n, '\0');
    for (auto& ch : out) ch = static_cast<char>(rng());
    return out;
  };
  uint64_t expected_rejections = 0;
  const auto connect_and_read_challenge = [&] {
    const int fd = RawConnect(server->address());
    EXPECT_GE(fd, 0);
    EXPECT_EQ(RecvExactly(fd, kChallengeBytes, milliseconds(3000)).size(), kChallengeBytes);
    return fd;
  };

  {  // A few bytes of a hello, then the client leaves.
    const int fd = connect_and_read_challenge();
    ASSERT_TRUE(SendAll(fd, magic + "abc"));
    close(fd);
    ++expected_rejections;
  }
  {  // A few bytes of a hello, then silence: closed at the hello timeout.
    const int fd = connect_and_read_challenge();
    ASSERT_TRUE(SendAll(fd, magic + random_bytes(20)));
    const auto t0 = Clock::now();
    EXPECT_TRUE(ClosedByPeerWithin(fd, milliseconds(3000)));
    EXPECT_GE(SecondsSince(t0), 0.1);
    close(fd);
    ++expected_rejections;
  }
  {  // A wrong magic: closed at once, without a verdict.
    const int fd = connect_and_read_challenge();
    ASSERT_TRUE(SendAll(fd, "KST1"));
    std::string rest;
    RecvUntilClosed(fd, &rest, milliseconds(3000));
    EXPECT_EQ(rest, "");
    close(fd);
    ++expected_rejections;
  }
  {  // The right magic and a hello's length of random bytes: a wrong proof.
    const int fd = connect_and_read_challenge();
    ASSERT_TRUE(SendAll(fd, magic + random_bytes(kHelloBytes - 4)));
    const std::string verdict = RecvExactly(fd, kVerdictBytes, milliseconds(3000));
    ASSERT_EQ(verdict.size(), kVerdictBytes);
    EXPECT_EQ(verdict[4], 0);
    EXPECT_TRUE(ClosedByPeerWithin(fd, milliseconds(3000)));
    close(fd);
    ++expected_rejections;
  }
  {  // More than a hello before the verdict: closed without one.
    const int fd = connect_and_read_challenge();
    ASSERT_TRUE(SendAll(fd, magic + random_bytes(4096)));
    std::string rest;
    RecvUntilClosed(fd, &rest, milliseconds(3000));
    EXPECT_EQ(rest, "");
    close(fd);
    ++expected_rejections;
  }
  {  // A valid proof for the secret of another job.
    const int fd = RawConnect(server->address());
    ASSERT_GE(fd, 0);
    const std::string verdict = RawHandshake(fd, "fedcba9876543210fedcba9876543210");
    ASSERT_EQ(verdict.size(), kVerdictBytes);
    EXPECT_EQ(verdict[4], 0);
    close(fd);
    ++expected_rejections;
  }

  // Rejections are counted as the server gets to them; wait for the last (bounded).
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  while (server->rejected_connections() < expected_rejections && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(server->rejected_connections(), expected_rejections);
  EXPECT_EQ(*good->Get("before", milliseconds(1000)), B("1"));
  auto fresh = ConnectClient(server->address());
  ASSERT_TRUE(fresh);
  EXPECT_TRUE(fresh->Set("after", B("2")).ok());
  EXPECT_EQ(*good->Get("after", milliseconds(1000)), B("2"));
  EXPECT_EQ(server->accepted_clients(), 2u);
}

// The proofs differ by direction, by nonce and by secret.
TEST(TcpStore, ProofsDependOnDirectionNoncesAndSecret) {
  StoreNonce a{}, b{};
  b[15] = 1;
  const Digest client = StoreClientProof(kSecret, a, b);
  EXPECT_NE(client, StoreServerProof(kSecret, a, b));
  EXPECT_NE(client, StoreClientProof(kSecret, b, a));
  EXPECT_NE(client, StoreClientProof(kSecret, b, b));
  EXPECT_NE(client, StoreClientProof("fedcba9876543210fedcba9876543210", a, b));
  EXPECT_EQ(client, StoreClientProof(kSecret, a, b));
}

// A port that was free a moment ago (bound and released).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

TEST(TcpStore, ClientRetriesUntilServerStarts) {
  const int port = FreePort();
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  StatusOr<std::unique_ptr<TcpStoreClient>> client = Internal("not run");
  std::thread t([&] { client = TcpStoreClient::Connect(addr, kSecret, milliseconds(10000)); });
  std::this_thread::sleep_for(milliseconds(400));
  TcpStoreServerOptions o;
  o.port = port;
  o.secret = kSecret;
  auto server = TcpStoreServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  t.join();
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_TRUE((*client)->Set("x", B("y")).ok());
}

TEST(TcpStore, ConnectGivesUpAtDeadlineNamingAddress) {
  const std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  const auto t0 = Clock::now();
  auto c = TcpStoreClient::Connect(addr, kSecret, milliseconds(300));
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(c.status().message().find(addr), std::string::npos) << c.status().message();
  EXPECT_LT(SecondsSince(t0), 3.0);
  EXPECT_EQ(TcpStoreClient::Connect("no-port-here", kSecret).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TcpStore, StopEndsPendingGetPromptly) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  auto c = ConnectClient(server->address());
  ASSERT_TRUE(c);
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(200));
    server->Stop();
  });
  const auto t0 = Clock::now();
  auto v = c->Get("never", milliseconds(30000));
  stopper.join();
  EXPECT_EQ(v.status().code(), StatusCode::kUnavailable) << v.status().ToString();
  EXPECT_LT(SecondsSince(t0), 5.0);
  server->Stop();  // idempotent
  // The broken connection stays broken, with the same cause.
  EXPECT_EQ(c->Set("k", B("v")).code(), StatusCode::kUnavailable);
}

TEST(TcpStore, ServerRejectsShortSecretAndBadHost) {
  TcpStoreServerOptions o;
  o.secret = "short";
  EXPECT_EQ(TcpStoreServer::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.secret = kSecret;
  o.host = "203.0.113.77";  // TEST-NET-3: not an address of this host
  auto s = TcpStoreServer::Start(o);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("203.0.113.77"), std::string::npos);
}

// ------------------------------------------------------------------------------------------------
// Listen address, secrets, rendezvous.

struct Iface {
  std::string name, ip;
  bool up, loopback;
};

// This host's IPv4 interfaces, read independently of the code under test.
std::vector<Iface> Interfaces() {
  std::vector<Iface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
    out.push_back(
        {i->ifa_name, buf, (i->ifa_flags & IFF_UP) != 0, (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  freeifaddrs(list);
  return out;
}

Options Ranks(int size, int local_size) {
  Options o;
  o.size = size;
  o.local_size = local_size;
  return o;
}

TEST(ResolveListenAddress, ExplicitIpv4IsUsedAsIs) {
  Options o;
  o.iface = "10.1.2.3";
  EXPECT_EQ(*ResolveListenAddress(o), "10.1.2.3");
}

TEST(ResolveListenAddress, InterfaceNameGivesItsAddress) {
  Options o;
  o.iface = "lo";
  EXPECT_EQ(*ResolveListenAddress(o), "127.0.0.1");
  for (const Iface& i : Interfaces()) {
    o.iface = i.name;
    auto a = ResolveListenAddress(o);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    // An interface may carry several addresses; the answer must be one of this interface's.
    bool found = false;
    for (const Iface& j : Interfaces()) found |= (j.name == i.name && j.ip == *a);
    EXPECT_TRUE(found) << i.name << " -> " << *a;
  }
}

TEST(ResolveListenAddress, UnknownInterfaceListsAvailableOnes) {
  Options o;
  o.iface = "nosuchif9";
  auto a = ResolveListenAddress(o);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("nosuchif9"), std::string::npos);
  EXPECT_NE(a.status().message().find("lo (127.0.0.1)"), std::string::npos) << a.status().message();
}

TEST(ResolveListenAddress, EmptyMeansLoopbackWhenAllRanksAreLocal) {
  EXPECT_EQ(*ResolveListenAddress(Ranks(1, 1)), "127.0.0.1");
  EXPECT_EQ(*ResolveListenAddress(Ranks(4, 4)), "127.0.0.1");
}

TEST(ResolveListenAddress, EmptyWithRemoteRanksIsReachableFromOtherHosts) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::vector<std::string> resolved;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host, nullptr, &hints, &res) == 0) {
    for (addrinfo* r = res; r; r = r->ai_next) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(r->ai_addr)->sin_addr, buf, sizeof(buf));
      resolved.push_back(buf);
    }
    freeaddrinfo(res);
  }
  std::string first_real;
  for (const auto& ip : resolved) {
    if (ip.rfind("127.", 0) != 0 && first_real.empty()) first_real = ip;
  }
  std::set<std::string> up_non_loopback;
  for (const Iface& i : Interfaces()) {
    if (i.up && !i.loopback) up_non_loopback.insert(i.ip);
  }
  auto a = ResolveListenAddress(Ranks(4, 2));
  if (!first_real.empty()) {
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(*a, first_real);
  } else if (!up_non_loopback.empty()) {
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_EQ(up_non_loopback.count(*a), 1u) << *a;
  } else {
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("KOLO_IFACE"), std::string::npos);
  }
}

TEST(GenerateSecret, IsHexAndUnique) {
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    const std::string s = GenerateSecret();
    ASSERT_EQ(s.size(), 32u);
    EXPECT_EQ(s.find_first_not_of("0123456789abcdef"), std::string::npos) << s;
    seen.insert(s);
  }
  EXPECT_EQ(seen.size(), 200u);
}

TEST(StartRendezvous, SeveralRanksWithoutLauncherExplainsHowToLaunch) {
  auto rv = StartRendezvous(Ranks(4, 4));
  ASSERT_FALSE(rv.ok());
  EXPECT_EQ(rv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rv.status().message().find("mpirun"), std::string::npos);
  EXPECT_NE(rv.status().message().find("kolo-run"), std::string::npos);
}

TEST(StartRendezvous, StoreAddressWithoutSecretIsRejected) {
  Options o = Ranks(2, 2);
  o.store_addr = "127.0.0.1:1";
  auto rv = StartRendezvous(o);
  EXPECT_EQ(rv.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rv.status().message().find("KOLO_JOB_SECRET"), std::string::npos);
}

TEST(StartRendezvous, BadInterfaceFailsBeforeAnythingStarts) {
  Options o;
  o.iface = "nosuchif9";
  EXPECT_EQ(StartRendezvous(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(StartRendezvous, SingleRankUsesAnInMemoryStore) {
  auto rv = StartRendezvous(Options());
  ASSERT_TRUE(rv.ok()) << rv.status().ToString();
  ASSERT_NE(rv->store, nullptr);
  EXPECT_NE(dynamic_cast<InMemoryStore*>(rv->store), nullptr);
  EXPECT_EQ(rv->secret.size(), 32u);
  EXPECT_EQ(rv->listen_addr, "127.0.0.1");
  EXPECT_EQ(rv->server, nullptr);
  EXPECT_TRUE(rv->store->Set("k", B("v")).ok());
  Options with_secret;
  with_secret.job_secret = kSecret;
  EXPECT_EQ(StartRendezvous(with_secret)->secret, kSecret);
}

TEST(StartRendezvous, ExternalStoreSecretIsSharedPerStore) {
  InMemoryStore a;
  InMemoryStore b;
  Options r0 = Ranks(2, 2);
  Options r1 = Ranks(2, 2);
  r1.rank = 1;
  r1.local_rank = 1;
  auto a0 = StartRendezvous(r0, &a);
  auto a1 = StartRendezvous(r1, &a);
  auto b0 = StartRendezvous(r0, &b);
  ASSERT_TRUE(a0.ok() && a1.ok() && b0.ok());
  EXPECT_EQ(a0->store, &a);
  EXPECT_EQ(a0->secret, a1->secret);
  EXPECT_NE(a0->secret, b0->secret);
  EXPECT_GE(a0->secret.size(), 16u);
  EXPECT_EQ(a0->listen_addr, "127.0.0.1");
  r0.job_secret = kSecret;
  EXPECT_EQ(StartRendezvous(r0, &a)->secret, kSecret);
}

TEST(StartRendezvous, StoreAddressConnectsWithTheJobSecret) {
  auto server = StartServer();
  ASSERT_TRUE(server);
  Options o = Ranks(2, 2);
  o.store_addr = server->address();
  o.job_secret = kSecret;
  Options o1 = o;
  o1.rank = o1.local_rank = 1;
  auto r0 = StartRendezvous(o);
  auto r1 = StartRendezvous(o1);
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  EXPECT_EQ(r0->secret, kSecret);
  EXPECT_TRUE(r0->store->Set("from0", B("hello")).ok());
  EXPECT_EQ(*r1->store->Get("from0", milliseconds(1000)), B("hello"));
  // A rank with the wrong secret is told so.
  Options bad = o;
  bad.job_secret = "ffffffffffffffffffffffffffffffff";
  auto rb = StartRendezvous(bad);
  EXPECT_NE(rb.status().message().find("rejected the job secret"), std::string::npos)
      << rb.status().ToString();
}

// Runs in every rank of a real launch: all ranks meet in the store, see each other's keys, and
// agree on the secret. Rank 0 keeps its rendezvous (which may host the store) until all are done.
TEST(Launched, RanksMeetThroughTheStore) {
  auto options = OptionsFromEnvironment();
  ASSERT_TRUE(options.ok()) << options.status().ToString();
  if (!options->launched_by_mpirun && options->store_addr.empty()) {
    GTEST_SKIP() << "not started by kolo-run or mpirun (see tests/scripts/kolo_run.sh)";
  }
  auto rv = StartRendezvous(*options);
  ASSERT_TRUE(rv.ok()) << rv.status().ToString();
  const int rank = options->rank;
  const int size = options->size;
  EXPECT_EQ(rv->server != nullptr, options->launched_by_mpirun && rank == 0);
  Store& store = *rv->store;
  ASSERT_TRUE(store.Set("rank/" + std::to_string(rank), B("r" + std::to_string(rank * 7))).ok());
  ASSERT_TRUE(store.Set("secret/" + std::to_string(rank), B(rv->secret)).ok());
  for (int r = 0; r < size; ++r) {
    auto v = store.Get("rank/" + std::to_string(r), milliseconds(30000));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, B("r" + std::to_string(r * 7)));
    EXPECT_EQ(*store.Get("secret/" + std::to_string(r), milliseconds(30000)), B(rv->secret));
  }
  ASSERT_TRUE(store.Set("done/" + std::to_string(rank), {}).ok());
  if (rank == 0) {
    for (int r = 0; r < size; ++r) {
      EXPECT_TRUE(store.Get("done/" + std::to_string(r), milliseconds(30000)).ok());
    }
  }
  std::printf("launched rank %d of %d met %d ranks\n", rank, size, size);
}

TEST(HostLayout, GroupsRanksByHostName) {
  const HostLayout layout({"b", "a", "b", "a", "c", "c"});
  ASSERT_TRUE(layout.known());
  EXPECT_EQ(layout.size(), 6);
  EXPECT_EQ(layout.num_hosts(), 3);
  // Hosts are numbered by their lowest rank.
  EXPECT_EQ(layout.host_name(0), "b");
  EXPECT_EQ(layout.host_name(1), "a");
  EXPECT_EQ(layout.ranks_on(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(layout.ranks_on(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(layout.ranks_on(2), (std::vector<int>{4, 5}));
  EXPECT_EQ(layout.local_index(3), 1);
  EXPECT_EQ(layout.local_index(4), 0);
  EXPECT_TRUE(layout.same_host(1, 3));
  EXPECT_FALSE(layout.same_host(0, 1));
  EXPECT_TRUE(layout.uniform());
  EXPECT_EQ(layout.CrossGroup(3), (std::vector<int>{2, 3, 5}));
  EXPECT_EQ(layout.Describe(4), "rank 4 (host c)");
  EXPECT_EQ(layout.Summary(), "b: ranks 0,2, a: ranks 1,3, c: ranks 4-5");
  EXPECT_FALSE(HostLayout({"x", "x", "y"}).uniform());
  EXPECT_FALSE(HostLayout().known());
  EXPECT_EQ(HostLayout().Describe(2), "rank 2");
}

TEST(HostLayout, ErrorsNameTheHostsOfTheRanksTheyName) {
  const HostLayout two({"h0", "h0", "h1", "h1"});
  EXPECT_EQ(two.NameHosts("connection to rank 2 lost: reset"),
            "connection to rank 2 lost: reset [rank 2 is on host h1]");
  EXPECT_EQ(
      two.NameHosts("rank 0: pending: rank 3, rank 2; rank 3 has sent nothing"),
      "rank 0: pending: rank 3, rank 2; rank 3 has sent nothing [rank 0 is on host h0, rank 3 "
      "is on host h1, rank 2 is on host h1]");
  // Not a rank of the job, not the word "rank", no number: unchanged.
  EXPECT_EQ(two.NameHosts("rank 9 is unknown"), "rank 9 is unknown");
  EXPECT_EQ(two.NameHosts("crank 1 and rank x"), "crank 1 and rank x");
  // One host: nothing to add.
  EXPECT_EQ(HostLayout({"a", "a"}).NameHosts("rank 1 lost"), "rank 1 lost");
}

TEST(HostLayout, RanksAgreeThroughTheStore) {
  const int n = 4;
  InMemoryStore store;
  std::vector<StatusOr<HostLayout>> got(n, Internal("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      got[static_cast<size_t>(r)] =
          ExchangeHostLayout(store, r % 2 == 0 ? "even" : "odd", r, n, milliseconds(5000));
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(got[static_cast<size_t>(r)].ok())
        << got[static_cast<size_t>(r)].status().ToString();
    EXPECT_EQ(got[static_cast<size_t>(r)]->Summary(), "even: ranks 0,2, odd: ranks 1,3");
  }
}

TEST(HostLayout, BadNamesAndMissingRanksAreErrors) {
  InMemoryStore store;
  auto s = ExchangeHostLayout(store, "has space", 0, 1, milliseconds(100));
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status().ToString();
  EXPECT_EQ(ExchangeHostLayout(store, "", 0, 1, milliseconds(100)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ThisHostName("tab\there").status().code(), StatusCode::kInvalidArgument);
  auto named = ThisHostName("node-7");
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(*named, "node-7");
  auto system = ThisHostName("");
  ASSERT_TRUE(system.ok()) << system.status().ToString();
  EXPECT_FALSE(system->empty());
  // Rank 1 of 2 never publishes: rank 0's wait is bounded and names what it waited for.
  const auto t0 = Clock::now();
  auto missing = ExchangeHostLayout(store, "alone", 0, 2, milliseconds(200));
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("host name of rank 1"), std::string::npos)
      << missing.status().ToString();
  EXPECT_LT(SecondsSince(t0), 5.0);
}

}  // namespace
}  // namespace kolo::bootstrap
