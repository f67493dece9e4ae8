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

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/rendezvous.h"
#include "engine/bootstrap/store.h"
#include "engine/bootstrap/tcp_store.h"
#include "gtest/gtest.h"

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

  // A correct hello, then a request announcing a value larger than allowed.
  const int o = RawConnect(server->address());
  ASSERT_GE(o, 0);
  std::string frame;
  PutLe32(&frame, kStoreMagic);
  PutLe32(&frame, static_cast<uint32_t>(kSecret.size()));
  frame += kSecret;
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

}  // namespace
}  // namespace kolo::bootstrap
