// The transport registry: names, errors for unknown and absent transports (rdma in a build without
// rdma-core's headers), a real connection through each transport (two ranks as threads; rdma over
// the software verbs device), the rdma options, and the engine refusing a bad KOLO_TRANSPORT, or
// rdma on a host without a device, before it connects to anyone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/bootstrap/store.h"
#include "engine/engine.h"
#include "engine/transport/registry.h"
#include "kolo/config.h"
#if KOLO_HAVE_IBVERBS
#include "engine/transport/rdma/soft/soft_verbs.h"
#endif

namespace kolo::transport {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TransportRegistry, NamesTheTransportsOfThisBuild) {
#if KOLO_HAVE_IBVERBS
  EXPECT_THAT(TransportNames(), ElementsAre("auto", "shm", "tcp", "rdma"));
  EXPECT_TRUE(CheckTransport("rdma").ok());
#else
  EXPECT_THAT(TransportNames(), ElementsAre("auto", "shm", "tcp"));
#endif
  for (const char* name : {"auto", "shm", "tcp"}) EXPECT_TRUE(CheckTransport(name).ok()) << name;
  EXPECT_EQ(Options{}.transport, "auto");
}

TEST(TransportRegistry, UnknownAndAbsentNamesSayWhatIsAllowed) {
#if KOLO_HAVE_IBVERBS
  const char* allowed = "allowed: auto, shm, tcp, rdma";
#else
  const char* allowed = "allowed: auto, shm, tcp";
  const Status rdma = CheckTransport("rdma");
  EXPECT_EQ(rdma.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(rdma.message(), HasSubstr("transport 'rdma' is not available"));
  EXPECT_THAT(rdma.message(), HasSubstr("lacks rdma-core's headers"));
  EXPECT_THAT(rdma.message(), HasSubstr(allowed));
#endif
  const Status unknown = CheckTransport("udp");
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr(std::string("transport 'udp' is unknown; ") + allowed));
  // Connect refuses before it touches the store: nothing is published under any key.
  bootstrap::InMemoryStore store;
  auto device = Connect("udp", ConnectSettings{}, store, 0, 2);
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Get("tcp/addr/0", std::chrono::milliseconds(0)).status().code(),
            StatusCode::kDeadlineExceeded);
}

TEST(TransportRegistry, SettingsComeFromTheOptions) {
  Options o;
  o.peer_timeout_s = 2.5;
  o.socket_buffer_bytes = 1 << 20;
  o.shm_ring_bytes = 256 << 10;
  o.busy_poll = true;
  o.host_name = "node7";
  const ConnectSettings s = SettingsFrom(o, "127.0.0.1", "0123456789abcdef");
  EXPECT_EQ(s.timeout, std::chrono::milliseconds(2500));
  EXPECT_EQ(s.socket_buffer_bytes, 1 << 20);
  EXPECT_EQ(s.shm_ring_bytes, 256 << 10);
  EXPECT_EQ(s.host_name, "node7");
  EXPECT_TRUE(s.busy_poll);
  EXPECT_EQ(s.listen_addr, "127.0.0.1");
  EXPECT_EQ(s.secret, "0123456789abcdef");
  EXPECT_EQ(s.ib_device, "");
  EXPECT_EQ(s.ib_port, 1);
  EXPECT_EQ(s.ib_gid_index, -1);
  EXPECT_EQ(s.ib_verbs, "libibverbs");
  o.ib_device = "mlx5_1";
  o.ib_port = 2;
  o.ib_gid_index = 3;
  o.ib_verbs = "soft";
  const ConnectSettings r = SettingsFrom(o, "127.0.0.1", "0123456789abcdef");
  EXPECT_EQ(r.ib_device, "mlx5_1");
  EXPECT_EQ(r.ib_port, 2);
  EXPECT_EQ(r.ib_gid_index, 3);
  EXPECT_EQ(r.ib_verbs, "soft");
}

TEST(TransportRegistry, RdmaOptionsAreCheckedAndReadFromTheEnvironment) {
  auto o = OptionsFromEnvironment({{"KOLO_IB_DEVICE", "mlx5_0"},
                                   {"KOLO_IB_PORT", "2"},
                                   {"KOLO_IB_GID_INDEX", "3"},
                                   {"KOLO_IB_VERBS", "soft"}});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->ib_device, "mlx5_0");
  EXPECT_EQ(o->ib_port, 2);
  EXPECT_EQ(o->ib_gid_index, 3);
  EXPECT_EQ(o->ib_verbs, "soft");
  EXPECT_EQ(OptionsFromEnvironment({})->ib_gid_index, -1);
  auto port = OptionsFromEnvironment({{"KOLO_IB_PORT", "0"}});
  EXPECT_EQ(port.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(port.status().message(), HasSubstr("KOLO_IB_PORT=0"));
  auto verbs = OptionsFromEnvironment({{"KOLO_IB_VERBS", "mlx"}});
  EXPECT_EQ(verbs.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(verbs.status().message(), HasSubstr("verbs 'mlx' (KOLO_IB_VERBS) is unknown"));
  EXPECT_TRUE(UnknownKoloVariables({{"KOLO_IB_DEVICE", "x"},
                                    {"KOLO_IB_PORT", "1"},
                                    {"KOLO_IB_GID_INDEX", "0"},
                                    {"KOLO_IB_VERBS", "soft"}})
                  .empty());
}

TEST(TransportRegistry, ConnectsRanksThroughTheNamedTransport) {
  std::vector<const char*> names = {"tcp", "shm", "auto"};
#if KOLO_HAVE_IBVERBS
  names.push_back("rdma");  // over the software verbs device
#endif
  for (const char* name : names) {
    SCOPED_TRACE(name);
    bootstrap::InMemoryStore store;
    ConnectSettings s;
    s.ib_verbs = "soft";
    s.secret = "0123456789abcdef0123";
    s.timeout = std::chrono::milliseconds(10000);
    // The host layout unknown: Connect exchanges the host names (both this host's) first.
    std::unique_ptr<Device> devices[2];
    Status status[2];
    std::thread peer([&] {
      auto d = Connect(name, s, store, 1, 2);
      status[1] = d.status();
      if (d.ok()) devices[1] = std::move(d).value();
    });
    auto d = Connect(name, s, store, 0, 2);
    status[0] = d.status();
    if (d.ok()) devices[0] = std::move(d).value();
    peer.join();
    ASSERT_TRUE(status[0].ok()) << status[0].ToString();
    ASSERT_TRUE(status[1].ok()) << status[1].ToString();
    EXPECT_STREQ(devices[0]->name(), name);
    const std::string kind = name;
    EXPECT_EQ(PairTransports(*devices[0]), kind == "tcp" || kind == "rdma" ? kind : "shm");
    EXPECT_TRUE(store.Get("host/1", std::chrono::milliseconds(0)).ok());

    // One message from rank 0 to rank 1 over the pair the registry's device made.
    std::vector<uint8_t> out(64, 7), in(64, 0);
    auto out_region = devices[0]->Register(out.data(), out.size());
    auto in_region = devices[1]->Register(in.data(), in.size());
    ASSERT_TRUE(out_region.ok() && in_region.ok());
    ASSERT_TRUE(devices[1]->pair(0).Recv(**in_region, 0, in.size(), 42).ok());
    ASSERT_TRUE(devices[0]->pair(1).Send(**out_region, 0, out.size(), 42).ok());
    std::vector<Completion> done;
    std::thread sender([&] {
      std::vector<Completion> sent;
      EXPECT_TRUE(WaitFor(*devices[0], 1, &sent, std::chrono::milliseconds(10000)).ok());
    });
    ASSERT_TRUE(WaitFor(*devices[1], 1, &done, std::chrono::milliseconds(10000)).ok());
    sender.join();
    EXPECT_EQ(in, out);
    std::thread closer([&] { devices[1].reset(); });
    devices[0].reset();
    closer.join();
  }
}

TEST(TransportRegistry, TheEngineRefusesAnUnknownTransportBeforeConnecting) {
  Options o;
  o.size = 2;
  o.local_size = 2;
  o.transport = "udp";
  bootstrap::InMemoryStore store;
  const auto start = std::chrono::steady_clock::now();
  auto engine = Engine::Create(o, &store);
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(engine.status().message(), HasSubstr("transport 'udp' is unknown"));
  // Rank 1 never comes: a refusal that waited for it would take the peer timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  o.transport = "";
  EXPECT_THAT(Engine::Create(o, &store).status().message(), HasSubstr("transport '' is empty"));
}

#if KOLO_HAVE_IBVERBS
// --transport rdma on a host without an RDMA device fails at start-up naming the host, without
// waiting for the other ranks (the software verbs device stands in for a host with none).
TEST(TransportRegistry, TheEngineRefusesRdmaWithoutADeviceAtStartUp) {
  rdma::soft::SetDeviceCount(0);
  Options o;
  o.size = 2;
  o.local_size = 2;
  o.transport = "rdma";
  o.ib_verbs = "soft";
  o.host_name = "node42";
  bootstrap::InMemoryStore store;
  const auto start = std::chrono::steady_clock::now();
  auto engine = Engine::Create(o, &store);
  rdma::soft::SetDeviceCount(1);
  EXPECT_EQ(engine.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(engine.status().message(), HasSubstr("host node42"));
  EXPECT_THAT(engine.status().message(), HasSubstr("needs an RDMA device"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  o.ib_device = "mlx5_3";
  engine = Engine::Create(o, &store);
  EXPECT_EQ(engine.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(engine.status().message(), HasSubstr("'mlx5_3' does not exist"));
  EXPECT_THAT(engine.status().message(), HasSubstr("softverbs0"));
}
#endif

TEST(TransportRegistry, ShmRingSizeIsCheckedAndReadFromTheEnvironment) {
  auto o = OptionsFromEnvironment({{"KOLO_SHM_RING_BYTES", "1048576"}});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->shm_ring_bytes, 1 << 20);
  auto bad = OptionsFromEnvironment({{"KOLO_SHM_RING_BYTES", "3000000"}});
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("power of two"));
  EXPECT_EQ(OptionsFromEnvironment({{"KOLO_SHM_RING_BYTES", "1024"}}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TransportRegistry, KoloTransportIsReadFromTheEnvironment) {
  for (const char* name : {"tcp", "shm", "auto"}) {
    auto o = OptionsFromEnvironment({{"KOLO_TRANSPORT", name}});
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    EXPECT_EQ(o->transport, name);
  }
  EXPECT_EQ(OptionsFromEnvironment({})->transport, "auto");
  EXPECT_TRUE(
      UnknownKoloVariables({{"KOLO_TRANSPORT", "tcp"}, {"KOLO_SHM_RING_BYTES", "65536"}}).empty());
}

}  // namespace
}  // namespace kolo::transport
