// Failure injection with real processes: a rank killed mid-allreduce, and strangers writing to a
// rank's port. The test hosts the rendezvous store and starts the rank processes itself.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/rendezvous.h"
#include "engine/bootstrap/tcp_store.h"

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;

struct RankProcess {
  pid_t pid = -1;
  int out_fd = -1;  // stderr of the rank
  std::string output;
  int status = 0;
};

class Job {
 public:
  // `host_names`: KOLO_HOST_NAME of each rank (none when empty).
  Job(int size, const std::vector<std::string>& args,
      const std::vector<std::string>& extra_env = {},
      const std::vector<std::string>& host_names = {}) {
    bootstrap::TcpStoreServerOptions so;
    so.secret = bootstrap::GenerateSecret();
    auto server = bootstrap::TcpStoreServer::Start(so);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(server).value();
    secret_ = so.secret;
    for (int r = 0; r < size; ++r) {
      int fds[2];
      EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
      RankProcess p;
      p.out_fd = fds[0];
      std::vector<std::string> env = {
          "KOLO_RANK=" + std::to_string(r),        "KOLO_SIZE=" + std::to_string(size),
          "KOLO_LOCAL_RANK=" + std::to_string(r),  "KOLO_LOCAL_SIZE=" + std::to_string(size),
          "KOLO_STORE_ADDR=" + server_->address(), "KOLO_JOB_SECRET=" + secret_,
          "KOLO_PEER_TIMEOUT_SECONDS=20"};
      env.insert(env.end(), extra_env.begin(), extra_env.end());
      if (!host_names.empty()) env.push_back("KOLO_HOST_NAME=" + host_names[r]);
      std::vector<char*> envp, argv;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);
      std::string prog = KOLO_PROBE_PATH;
      argv.push_back(prog.data());
      std::vector<std::string> a = args;
      for (auto& s : a) argv.push_back(s.data());
      argv.push_back(nullptr);
      p.pid = fork();
      if (p.pid == 0) {
        dup2(fds[1], 2);
        execve(prog.c_str(), argv.data(), envp.data());
        _exit(127);
      }
      close(fds[1]);
      procs_.push_back(p);
    }
  }
  ~Job() {
    for (auto& p : procs_) {
      if (p.pid > 0) {
        kill(p.pid, SIGKILL);
        waitpid(p.pid, nullptr, 0);
      }
      if (p.out_fd >= 0) close(p.out_fd);
    }
  }

  // Waits for every rank (up to `limit`), collecting output. Returns false on timeout.
  bool WaitAll(std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    for (auto& p : procs_) {
      while (true) {
        pid_t got = waitpid(p.pid, &p.status, WNOHANG);
        if (got == p.pid) break;
        if (Clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      p.pid = -1;
      char buf[4096];
      ssize_t n;
      while ((n = read(p.out_fd, buf, sizeof buf)) > 0)
        p.output.append(buf, static_cast<size_t>(n));
    }
    return true;
  }

  // The "ip:port" rank r's transport listens on.
  std::string RankAddress(int r) {
    auto client = bootstrap::TcpStoreClient::Connect(server_->address(), secret_);
    EXPECT_TRUE(client.ok());
    auto v = (*client)->Get("tcp/addr/" + std::to_string(r), std::chrono::seconds(20));
    EXPECT_TRUE(v.ok()) << v.status().ToString();
    return v.ok() ? std::string(v->begin(), v->end()) : "";
  }

  std::vector<RankProcess>& procs() { return procs_; }

 private:
  std::unique_ptr<bootstrap::TcpStoreServer> server_;
  std::string secret_;
  std::vector<RankProcess> procs_;
};

std::string Describe(const std::vector<RankProcess>& procs) {
  std::string s;
  for (size_t r = 0; r < procs.size(); ++r) {
    s += "--- rank " + std::to_string(r) + " status " + std::to_string(procs[r].status) + "\n" +
         procs[r].output;
  }
  return s;
}

TEST(Faults, RankKilledMidAllreduceFailsEveryOtherRankNamingIt) {
  // 4 ranks on two hosts, 16 Mi floats per allreduce; rank 2 dies by SIGKILL during iteration 2.
  const auto start = Clock::now();
  Job job(4, {"16777216", "6", "2", "2"}, {}, {"alpha", "alpha", "beta", "beta"});
  ASSERT_TRUE(job.WaitAll(std::chrono::seconds(60))) << "ranks hung after a peer died";
  const double took = std::chrono::duration<double>(Clock::now() - start).count();
  auto& procs = job.procs();
  ASSERT_TRUE(WIFSIGNALED(procs[2].status) && WTERMSIG(procs[2].status) == SIGKILL)
      << Describe(procs);
  for (int r : {0, 1, 3}) {
    ASSERT_TRUE(WIFEXITED(procs[r].status)) << Describe(procs);
    EXPECT_EQ(WEXITSTATUS(procs[r].status), 1) << Describe(procs);
    EXPECT_NE(procs[r].output.find("FAILED"), std::string::npos) << Describe(procs);
    EXPECT_NE(procs[r].output.find("rank 2"), std::string::npos)
        << "rank " << r << " must name the lost rank\n"
        << Describe(procs);
    EXPECT_NE(procs[r].output.find("rank 2 is on host beta"), std::string::npos)
        << "rank " << r << " must name the lost rank's host\n"
        << Describe(procs);
  }
  EXPECT_LT(took, 45.0) << "failure must surface within the peer timeout";
}

int ConnectTo(const std::string& addr) {
  const auto colon = addr.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
  inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(Faults, GarbageAndStrangersOnARanksPortLeaveTheJobUnharmed) {
  // A 3-rank job runs 300 small allreduces while strangers connect to rank 1's port: over TCP,
  // whose listener stays open for the whole job (the shm transport's closes after set-up).
  Job job(3, {"1000", "300", "-1", "-1"}, {"KOLO_LOG_LEVEL=error", "KOLO_TRANSPORT=tcp"});
  const std::string addr = job.RankAddress(1);
  ASSERT_FALSE(addr.empty());
  std::mt19937 rng(42);
  for (int i = 0; i < 20; ++i) {
    int fd = ConnectTo(addr);
    if (fd < 0) continue;
    std::vector<uint8_t> junk(1 + rng() % 4096);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    if (i % 4 == 0) {
      // Something shaped like a handshake but with a random secret proof.
      const char kHello[] = "KOLO";
      std::memcpy(junk.data(), kHello, std::min(junk.size(), sizeof kHello - 1));
    }
    (void)!write(fd, junk.data(), junk.size());
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(job.WaitAll(std::chrono::seconds(90))) << "the job hung";
  for (auto& p : job.procs()) {
    EXPECT_TRUE(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 0) << Describe(job.procs());
  }
}

}  // namespace
}  // namespace kolo
