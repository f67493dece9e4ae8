// Device tensors in the fusion layer: the device context's batched pack/unpack kernels against the
// host reference (kernels::ScaleCopy), and the planner and negotiation rules that keep host
// and device tensors apart. The kernel tests need a CUDA device and skip without one.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/coordinator/message.h"
#include "engine/cuda/device_context.h"
#include "engine/fusion/planner.h"
#include "engine/kernels/reduce.h"
#include "kolo/config.h"
#if KOLO_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace kolo {
namespace {

using coordinator::CollectiveType;
using coordinator::Request;
using coordinator::Response;

Response Allreduce(const std::string& name, int64_t count, bool on_device) {
  Response r;
  r.request = {name, CollectiveType::kAllreduce, DataType::kFloat32, 0, 0, {count}};
  r.request.on_device = on_device;
  return r;
}

TEST(DevicePlanning, HostAndDeviceTensorsNeverShareAGroup) {
  const std::vector<Response> list = {Allreduce("h0", 10, false), Allreduce("d0", 10, true),
                                      Allreduce("h1", 10, false), Allreduce("d1", 10, true),
                                      Allreduce("d2", 10, true)};
  const auto groups = fusion::PlanFusion(list, 1 << 20);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].members, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(groups[1].members, (std::vector<size_t>{1, 3, 4}));
  for (const auto& g : groups) {
    for (size_t i : g.members) {
      EXPECT_EQ(list[i].request.on_device, list[g.members[0]].request.on_device);
    }
  }
}

TEST(DeviceNegotiation, PlaceTravelsAndMustAgree) {
  coordinator::RequestList rl;
  rl.requests.push_back(Allreduce("d", 4, true).request);
  rl.requests.push_back(Allreduce("h", 4, false).request);
  auto parsed = coordinator::ParseRequestList(coordinator::Serialize(rl));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->requests[0].on_device);
  EXPECT_FALSE(parsed->requests[1].on_device);

  Request host = Allreduce("x", 4, false).request;
  Request device = Allreduce("x", 4, true).request;
  EXPECT_FALSE(host.Compatible(device));
  EXPECT_TRUE(device.Compatible(device));
  EXPECT_NE(device.Describe().find("on device"), std::string::npos) << device.Describe();
  EXPECT_EQ(host.Describe().find("device"), std::string::npos) << host.Describe();
}

TEST(DeviceContext, MissingDeviceIsRefusedWithTheReason) {
  const int count = cuda::DeviceCount();
  auto ctx = cuda::CreateDeviceContext(count, std::chrono::seconds(5));
  ASSERT_FALSE(ctx.ok());
  EXPECT_NE(ctx.status().message().find(fmt::format("CUDA device {}", count)), std::string::npos)
      << ctx.status().ToString();
}

#if KOLO_HAVE_CUDA

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

class DeviceKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda::DeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    auto ctx = cuda::CreateDeviceContext(0, std::chrono::seconds(30));
    ASSERT_TRUE(ctx.ok()) << ctx.status().ToString();
    ctx_ = std::move(ctx).value();
    ASSERT_TRUE(ctx_->Activate().ok());
  }
  void TearDown() override {
    for (void* p : allocations_) cudaFree(p);
  }
  uint8_t* Alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1) + 64), cudaSuccess);
    allocations_.push_back(p);
    return static_cast<uint8_t*>(p);
  }

  std::unique_ptr<cuda::DeviceContext> ctx_;
  std::vector<void*> allocations_;
};

// Tensors of mixed sizes (odd byte counts, misaligned starts) packed into the fusion buffer in one
// launch come out byte for byte; the scaled unpack matches the host's ScaleCopy exactly.
TEST_F(DeviceKernels, PackAndScaledUnpackMatchTheHostReference) {
  std::mt19937 rng(7);
  for (DataType dtype : AllDataTypes()) {
    const size_t elem = DataTypeSize(dtype);
    const std::vector<size_t> counts = {1, 3, 17, 1000, 4099, 1 << 18, 5, 0, 123457};
    std::vector<std::vector<uint8_t>> host;
    std::vector<uint8_t*> in, out;
    std::vector<fusion::CopyEntry> pack, unpack;
    size_t total = 0;
    for (size_t c : counts) total += c * elem;
    auto fused = ctx_->FusionBuffer(total);
    ASSERT_TRUE(fused.ok()) << fused.status().ToString();
    size_t offset = 0;
    for (size_t k = 0; k < counts.size(); ++k) {
      std::vector<uint8_t> h(counts[k] * elem);
      for (size_t i = 0; i < counts[k]; ++i) {
        StoreElement(dtype, h.data(), i, static_cast<double>(rng() % 200) - 50);
      }
      // Misaligned by one element for every other tensor.
      in.push_back(Alloc(h.size()) + (k % 2) * elem);
      out.push_back(Alloc(h.size()) + ((k + 1) % 2) * elem);
      ASSERT_CUDA(cudaMemcpy(in.back(), h.data(), h.size(), cudaMemcpyHostToDevice));
      pack.push_back({in.back(), *fused + offset, h.size()});
      unpack.push_back({*fused + offset, out.back(), h.size()});
      offset += h.size();
      host.push_back(std::move(h));
    }
    ASSERT_TRUE(ctx_->Pack(pack.data(), pack.size()).ok());
    ASSERT_TRUE(ctx_->Synchronize().ok());
    std::vector<uint8_t> packed(total);
    ASSERT_CUDA(cudaMemcpy(packed.data(), *fused, total, cudaMemcpyDeviceToHost));
    offset = 0;
    for (const auto& h : host) {
      EXPECT_EQ(0, std::memcmp(packed.data() + offset, h.data(), h.size())) << DataTypeName(dtype);
      offset += h.size();
    }
    for (double scale : {1.0, 1.0 / 3}) {
      ASSERT_TRUE(ctx_->Unpack(unpack.data(), unpack.size(), dtype, scale).ok());
      ASSERT_TRUE(ctx_->Synchronize().ok());
      for (size_t k = 0; k < host.size(); ++k) {
        std::vector<uint8_t> want(host[k].size()), got(host[k].size());
        kernels::ScaleCopy(dtype, want.data(), host[k].data(), counts[k], scale);
        ASSERT_CUDA(cudaMemcpy(got.data(), out[k], got.size(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(want, got) << DataTypeName(dtype) << " tensor " << k << " scale " << scale;
      }
    }
  }
}

TEST_F(DeviceKernels, ScalesInPlaceAndSaturatesIntegers) {
  const std::vector<int32_t> values = {2147483647, -2147483647 - 1, 7, -7, 0};
  uint8_t* d = Alloc(values.size() * 4);
  ASSERT_CUDA(cudaMemcpy(d, values.data(), values.size() * 4, cudaMemcpyHostToDevice));
  const fusion::CopyEntry e{d, d, values.size() * 4};
  ASSERT_TRUE(ctx_->Unpack(&e, 1, DataType::kInt32, 2.5).ok());
  ASSERT_TRUE(ctx_->Synchronize().ok());
  std::vector<int32_t> got(values.size()), want = values;
  kernels::Scale(DataType::kInt32, want.data(), want.size(), 2.5);
  ASSERT_CUDA(cudaMemcpy(got.data(), d, got.size() * 4, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], 2147483647);
  EXPECT_EQ(got[2], 17);  // 17.5 truncated toward zero
  EXPECT_EQ(got[3], -17);
}

TEST_F(DeviceKernels, FusionBufferGrowsAndStaysAligned) {
  auto a = ctx_->FusionBuffer(1000);
  ASSERT_TRUE(a.ok());
  auto b = ctx_->FusionBuffer(10);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*a, *b);  // big enough already: the same buffer
  auto c = ctx_->FusionBuffer(64 << 20);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*c) % 256, 0u);
  ASSERT_CUDA(cudaMemset(*c, 1, 64 << 20));
  ASSERT_CUDA(cudaDeviceSynchronize());
}

// A batch larger than the kernel's grid rows (32768) still copies every entry.
TEST_F(DeviceKernels, ManyTinyEntriesInOneLaunch) {
  constexpr size_t kEntries = 40000;
  uint8_t* src = Alloc(kEntries * 4);
  uint8_t* dst = Alloc(kEntries * 4);
  std::vector<uint32_t> h(kEntries);
  for (size_t i = 0; i < kEntries; ++i) h[i] = static_cast<uint32_t>(i * 2654435761u);
  ASSERT_CUDA(cudaMemcpy(src, h.data(), kEntries * 4, cudaMemcpyHostToDevice));
  ASSERT_CUDA(cudaMemset(dst, 0, kEntries * 4));
  std::vector<fusion::CopyEntry> entries;
  // Reversed order: entry i moves word i to slot kEntries-1-i.
  for (size_t i = 0; i < kEntries; ++i)
    entries.push_back({src + 4 * i, dst + 4 * (kEntries - 1 - i), 4});
  ASSERT_TRUE(ctx_->Pack(entries.data(), entries.size()).ok());
  ASSERT_TRUE(ctx_->Synchronize().ok());
  std::vector<uint32_t> got(kEntries);
  ASSERT_CUDA(cudaMemcpy(got.data(), dst, kEntries * 4, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (size_t i = 0; i < kEntries; ++i) wrong += got[kEntries - 1 - i] != h[i];
  EXPECT_EQ(wrong, 0u);
}

#endif  // KOLO_HAVE_CUDA

}  // namespace
}  // namespace kolo
