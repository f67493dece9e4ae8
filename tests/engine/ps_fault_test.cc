// Parameter-server faults with real processes: a server or a worker killed mid-training. Every
// surviving rank must fail, with an error naming the dead rank, within a bound, and leave nothing
// running. The test hosts the rendezvous store and starts kolo_ps_probe ranks itself (a launcher
// would kill the survivors before they could report).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/rendezvous.h"
#include "engine/bootstrap/tcp_store.h"

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;

struct Rank {
  pid_t pid = -1;
  int out_fd = -1;  // the rank's stderr
  std::string output;
  int status = 0;
};

class PsJob {
 public:
  // Starts `size` probe ranks with `servers` servers and the probe's arguments.
  PsJob(int size, int servers, const std::vector<std::string>& args) {
    bootstrap::TcpStoreServerOptions so;
    so.secret = bootstrap::GenerateSecret();
    auto server = bootstrap::TcpStoreServer::Start(so);
    EXPECT_TRUE(server.ok()) << server.status().ToString();
    if (!server.ok()) return;
    store_ = std::move(server).value();
    for (int r = 0; r < size; ++r) {
      int fds[2];
      EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
      // Non-blocking reads: output is collected while the ranks run, so no pipe fills up.
      fcntl(fds[0], F_SETFL, O_NONBLOCK);
      std::vector<std::string> env = {"KOLO_RANK=" + std::to_string(r),
                                      "KOLO_SIZE=" + std::to_string(size),
                                      "KOLO_LOCAL_RANK=" + std::to_string(r),
                                      "KOLO_LOCAL_SIZE=" + std::to_string(size),
                                      "KOLO_STORE_ADDR=" + store_->address(),
                                      "KOLO_JOB_SECRET=" + so.secret,
                                      "KOLO_PEER_TIMEOUT_SECONDS=20",
                                      "KOLO_BACKEND=ps",
                                      "KOLO_PS_SERVERS=" + std::to_string(servers)};
      std::vector<char*> envp, argv;
      for (auto& s : env) envp.push_back(s.data());
      envp.push_back(nullptr);
      std::string prog = KOLO_PS_PROBE_PATH;
      std::vector<std::string> a = args;
      argv.push_back(prog.data());
      for (auto& s : a) argv.push_back(s.data());
      argv.push_back(nullptr);
      Rank rank;
      rank.out_fd = fds[0];
      rank.pid = fork();
      if (rank.pid == 0) {
        dup2(fds[1], 2);
        execve(prog.c_str(), argv.data(), envp.data());
        _exit(127);
      }
      close(fds[1]);
      ranks_.push_back(rank);
    }
  }

  ~PsJob() {
    for (Rank& r : ranks_) {
      if (r.pid > 0) {
        kill(r.pid, SIGKILL);
        waitpid(r.pid, nullptr, 0);
      }
      if (r.out_fd >= 0) close(r.out_fd);
    }
  }

  // Waits up to `limit` for every rank to exit, reading their output meanwhile. False on timeout
  // (the destructor then kills what is left).
  bool WaitAll(std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    size_t running = ranks_.size();
    while (running > 0) {
      running = 0;
      for (Rank& r : ranks_) {
        Drain(r);
        if (r.pid <= 0) continue;
        if (waitpid(r.pid, &r.status, WNOHANG) == r.pid) {
          r.pid = -1;
          Drain(r);
        } else {
          ++running;
        }
      }
      if (running == 0) break;
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  const std::vector<Rank>& ranks() const { return ranks_; }

 private:
  static void Drain(Rank& r) {
    char buf[4096];
    ssize_t n;
    while ((n = read(r.out_fd, buf, sizeof buf)) > 0) r.output.append(buf, static_cast<size_t>(n));
  }

  std::unique_ptr<bootstrap::TcpStoreServer> store_;
  std::vector<Rank> ranks_;
};

bool Killed(const Rank& r) { return WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGKILL; }
bool Failed(const Rank& r) { return WIFEXITED(r.status) && WEXITSTATUS(r.status) == 1; }

TEST(PsFault, ACleanJobOfProcessesTrainsCorrectly) {
  PsJob job(5, 2, {"4", "1", "-1", "0", "0"});
  ASSERT_TRUE(job.WaitAll(std::chrono::seconds(120)));
  for (size_t r = 0; r < job.ranks().size(); ++r) {
    const Rank& rank = job.ranks()[r];
    EXPECT_TRUE(WIFEXITED(rank.status) && WEXITSTATUS(rank.status) == 0) << "rank " << r << ":\n"
                                                                         << rank.output;
    EXPECT_NE(rank.output.find("rank " + std::to_string(r) + ": ok"), std::string::npos)
        << rank.output;
  }
}

TEST(PsFault, AServerDiesAndEveryOtherRankFailsNamingIt) {
  // 3 workers (ranks 0-2), 2 servers (3, 4); server rank 4 dies 1.5 s into serving, while the
  // workers are still training (1000 steps, 5 ms apart).
  PsJob job(5, 2, {"1000", "0", "4", "1500", "5"});
  ASSERT_TRUE(job.WaitAll(std::chrono::seconds(60))) << "a rank hung after the server died";
  EXPECT_TRUE(Killed(job.ranks()[4])) << job.ranks()[4].output;
  for (int r = 0; r < 4; ++r) {
    const Rank& rank = job.ranks()[static_cast<size_t>(r)];
    EXPECT_TRUE(Failed(rank)) << "rank " << r << ":\n" << rank.output;
    EXPECT_NE(rank.output.find("rank " + std::to_string(r) + ": FAILED"), std::string::npos)
        << rank.output;
    EXPECT_NE(rank.output.find("rank 4"), std::string::npos)
        << "rank " << r << " does not name the dead server:\n"
        << rank.output;
  }
}

TEST(PsFault, AWorkerDiesAndTheServersAndOtherWorkersFailNamingIt) {
  // 3 workers (0-2), 1 server (3); worker rank 1 dies after pushing step 5.
  PsJob job(4, 1, {"1000", "0", "1", "5", "2"});
  ASSERT_TRUE(job.WaitAll(std::chrono::seconds(60))) << "a rank hung after the worker died";
  EXPECT_TRUE(Killed(job.ranks()[1])) << job.ranks()[1].output;
  for (int r : {0, 2, 3}) {
    const Rank& rank = job.ranks()[static_cast<size_t>(r)];
    EXPECT_TRUE(Failed(rank)) << "rank " << r << ":\n" << rank.output;
    EXPECT_NE(rank.output.find("rank 1"), std::string::npos)
        << "rank " << r << " does not name the dead worker:\n"
        << rank.output;
  }
}

}  // namespace
}  // namespace kolo
