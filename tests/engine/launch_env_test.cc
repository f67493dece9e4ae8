// Where a rank finds its place from each launcher's environment (launch_env.h), and the
// rendezvous that srun and Hydra launches use: rank 0 serving the store at an agreed address.
#include "engine/common/launch_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "engine/bootstrap/rendezvous.h"
#include "engine/common/options.h"

namespace kolo {
namespace {

using Env = std::map<std::string, std::string>;
using ::testing::HasSubstr;

Env SrunEnv(int rank, int size) {
  return Env{{"SLURM_PROCID", std::to_string(rank)},
             {"SLURM_STEP_NUM_TASKS", std::to_string(size)},
             {"SLURM_LOCALID", std::to_string(rank % 4)},
             {"SLURM_NODEID", std::to_string(rank / 4)},
             {"SLURM_STEP_TASKS_PER_NODE", "4(x2),2"},
             {"SLURM_STEP_NODELIST", "gpu[07-09]"},
             {"SLURM_JOB_ID", "123456"},
             {"SLURM_STEP_ID", "2"}};
}

TEST(LaunchEnv, SrunStepGivesRankSizeLocalPlaceAndTheFirstNodeAsStore) {
  auto p = ReadLaunchPlace(SrunEnv(9, 10));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->launcher, "srun");
  EXPECT_EQ(p->rank, 9);
  EXPECT_EQ(p->size, 10);
  EXPECT_EQ(p->local_rank, 1);
  EXPECT_EQ(p->local_size, 2);  // node 2 has 2 tasks
  // 29400 + (123456 * 31 + 2) % 2000
  EXPECT_EQ(p->serve_store_addr, "gpu07:" + std::to_string(29400 + (123456 * 31 + 2) % 2000));
  Env env = SrunEnv(0, 10);
  env["KOLO_STORE_PORT"] = "40000";
  EXPECT_EQ(ReadLaunchPlace(env)->serve_store_addr, "gpu07:40000");
  env["KOLO_STORE_ADDR"] = "10.0.0.5:41000";
  EXPECT_EQ(ReadLaunchPlace(env)->serve_store_addr, "10.0.0.5:41000");
}

TEST(LaunchEnv, BatchScriptWithoutAStepIsNotALaunch) {
  // sbatch's own shell has SLURM_PROCID and SLURM_NTASKS but is not a step of N ranks.
  auto p = ReadLaunchPlace(Env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->launcher, "");
  EXPECT_EQ(p->size, 1);
}

TEST(LaunchEnv, HydraNeedsAStoreAddress) {
  Env env{{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}};
  auto missing = ReadLaunchPlace(env);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("KOLO_STORE_ADDR"));
  env["KOLO_STORE_ADDR"] = "node01:29400";
  auto p = ReadLaunchPlace(env);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->launcher, "hydra");
  EXPECT_EQ(p->rank, 1);
  EXPECT_EQ(p->size, 4);
  EXPECT_EQ(p->local_rank, 1);
  EXPECT_EQ(p->local_size, 2);
  EXPECT_EQ(p->serve_store_addr, "node01:29400");
}

TEST(LaunchEnv, OpenMpiAndKoloRunWinOverSlurm) {
  Env env = SrunEnv(3, 10);
  env["KOLO_SIZE"] = "2";
  env["KOLO_RANK"] = "1";
  EXPECT_EQ(ReadLaunchPlace(env)->launcher, "kolo-run");
  env["OMPI_COMM_WORLD_SIZE"] = "4";
  env["OMPI_COMM_WORLD_RANK"] = "0";
  EXPECT_EQ(ReadLaunchPlace(env)->launcher, "mpirun");
}

TEST(LaunchEnv, TasksPerNode) {
  EXPECT_EQ(*SlurmTasksOnNode("4", 0), 4);
  EXPECT_EQ(*SlurmTasksOnNode("4(x2),3", 1), 4);
  EXPECT_EQ(*SlurmTasksOnNode("4(x2),3", 2), 3);
  EXPECT_EQ(*SlurmTasksOnNode("1,2,3(x3)", 5), 3);
  for (const char* bad : {"", "x", "4(2)", "4(x0)", "0", "4,", "4(x2", "4;3", "-1"}) {
    auto r = SlurmTasksOnNode(bad, 0);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_THAT(r.status().message(), HasSubstr("SLURM_STEP_TASKS_PER_NODE"));
    }
  }
  auto beyond = SlurmTasksOnNode("4(x2)", 2);
  ASSERT_FALSE(beyond.ok());
  EXPECT_THAT(beyond.status().message(), HasSubstr("lists 2 node(s), but SLURM_NODEID is 2"));
}

TEST(LaunchEnv, FirstHostOfANodeList) {
  EXPECT_EQ(*FirstSlurmHost("node01"), "node01");
  EXPECT_EQ(*FirstSlurmHost("a,b"), "a");
  EXPECT_EQ(*FirstSlurmHost("gpu[007-010,012],cpu1"), "gpu007");
  EXPECT_EQ(*FirstSlurmHost("gpu[3]"), "gpu3");
  for (const char* bad : {"", ",a", "[1-2]", "gpu[", "gpu[a-b]", "gpu[1-2"}) {
    auto r = FirstSlurmHost(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
}

TEST(LaunchEnv, MalformedValuesAreNamed) {
  Env env = SrunEnv(0, 10);
  env["SLURM_PROCID"] = "ten";
  auto r = OptionsFromEnvironment(env);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("SLURM_PROCID='ten'"));
  env = SrunEnv(12, 10);
  env["SLURM_NODEID"] = "0";
  r = OptionsFromEnvironment(env);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("rank 12 is outside [0, 10)"));
  env = SrunEnv(0, 10);
  env.erase("SLURM_STEP_TASKS_PER_NODE");
  r = OptionsFromEnvironment(env);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("SLURM_STEP_TASKS_PER_NODE"));
}

TEST(LaunchEnv, SrunWithoutASecretIsRefusedNamingIt) {
  Env env = SrunEnv(0, 2);
  env["SLURM_STEP_TASKS_PER_NODE"] = "2";
  env["KOLO_STORE_ADDR"] = "127.0.0.1:1";
  auto o = OptionsFromEnvironment(env);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(o.status().message(), HasSubstr("KOLO_JOB_SECRET is not set"));
  env["KOLO_JOB_SECRET"] = "00112233445566778899aabbccddeeff";
  o = OptionsFromEnvironment(env);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->launcher, "srun");
  // The rendezvous checks it too, for options made by hand.
  o->job_secret.clear();
  auto rv = bootstrap::StartRendezvous(*o);
  ASSERT_FALSE(rv.ok());
  EXPECT_THAT(rv.status().message(), HasSubstr("KOLO_JOB_SECRET is not set"));
}

// Four ranks as threads, each with srun's variables, meet at the store rank 0 serves.
TEST(LaunchEnv, SrunRanksMeetAtTheStoreRankZeroServes) {
  // A port that is free now (bind 0, read it, close), on loopback.
  bootstrap::TcpStoreServerOptions probe_options;
  probe_options.secret = "0123456789abcdef0123";
  auto probe = bootstrap::TcpStoreServer::Start(probe_options);
  ASSERT_TRUE(probe.ok());
  const std::string addr = (*probe)->address();
  (*probe)->Stop();
  probe->reset();
  constexpr int kRanks = 4;
  std::vector<std::string> seen(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      Env env = SrunEnv(r, kRanks);
      env["SLURM_STEP_TASKS_PER_NODE"] = "4";
      env["SLURM_NODEID"] = "0";
      env["SLURM_LOCALID"] = std::to_string(r);
      env["KOLO_STORE_ADDR"] = addr;
      env["KOLO_JOB_SECRET"] = "00112233445566778899aabbccddeeff";
      env["KOLO_PEER_TIMEOUT_SECONDS"] = "10";
      auto o = OptionsFromEnvironment(env);
      if (!o.ok()) {
        seen[r] = o.status().ToString();
        return;
      }
      auto rv = bootstrap::StartRendezvous(*o);
      if (!rv.ok()) {
        seen[r] = rv.status().ToString();
        return;
      }
      const std::string key = "rank/" + std::to_string(r);
      const std::string value = std::to_string(r * 10);
      Status s = rv->store->Set(key, std::vector<uint8_t>(value.begin(), value.end()));
      auto next = rv->store->Get("rank/" + std::to_string((r + 1) % kRanks),
                                 std::chrono::milliseconds(10000));
      seen[r] = s.ok() && next.ok() ? std::string(next->begin(), next->end()) : "error";
      // Rank 0 serves: it leaves only after every rank has read what it needed.
      (void)rv->store->Set("done/" + std::to_string(r), std::vector<uint8_t>{1});
      if (r == 0) {
        for (int p = 0; p < kRanks; ++p) {
          (void)rv->store->Get("done/" + std::to_string(p), std::chrono::milliseconds(10000));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[r], std::to_string(((r + 1) % kRanks) * 10));
}

}  // namespace
}  // namespace kolo
