// kolo-test-needs: CUDNN
// The cuDNN backend's own elementwise kernels (models/compute/cudnn/kernels.cu) against a host
// reference, in every activation type: ReLU forward and backward (with and without
// accumulation), Add, and the row copy that concatenation, Add's backward and the loss use. The
// kernels take 16-byte vectors where every pointer is aligned and finish the tail one element at a
// time, so every case runs at lengths around the vector width and at pointers one element off
// alignment. Skips without a CUDA device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "models/compute/cudnn/cudnn_backend.h"
#include "models/compute/cudnn/kernels.h"

namespace kolo::models::compute::cudnn {
namespace {

const char* ElemName(Elem e) {
  switch (e) {
    case Elem::kFloat32:
      return "float32";
    case Elem::kFloat16:
      return "float16";
    case Elem::kBfloat16:
      return "bfloat16";
  }
  return "?";
}

// Host values rounded to the element type, and their bytes in that type.
float Round(Elem e, float v) {
  if (e == Elem::kFloat16) return __half2float(__float2half_rn(v));
  if (e == Elem::kBfloat16) return __bfloat162float(__float2bfloat16_rn(v));
  return v;
}

std::vector<uint8_t> ToBytes(Elem e, const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * ElemBytes(e));
  for (size_t i = 0; i < v.size(); ++i) {
    if (e == Elem::kFloat32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else if (e == Elem::kFloat16) {
      const __half h = __float2half_rn(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    } else {
      const __nv_bfloat16 b = __float2bfloat16_rn(v[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

std::vector<float> FromBytes(Elem e, const std::vector<uint8_t>& bytes) {
  const size_t n = bytes.size() / ElemBytes(e);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (e == Elem::kFloat32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else if (e == Elem::kFloat16) {
      __half h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = __half2float(h);
    } else {
      __nv_bfloat16 b;
      std::memcpy(&b, bytes.data() + 2 * i, 2);
      out[i] = __bfloat162float(b);
    }
  }
  return out;
}

// A device buffer of `n` elements starting `skew` elements past a 256-byte aligned allocation
// (skew 1: no 16-byte vectors), filled with rounded random values (never zeros).
class DeviceArray {
 public:
  DeviceArray(Elem e, size_t n, size_t skew, std::mt19937* rng) : e_(e), n_(n) {
    EXPECT_EQ(cudaMalloc(&base_, (n + skew + 16) * ElemBytes(e)), cudaSuccess);
    data_ = static_cast<uint8_t*>(base_) + skew * ElemBytes(e);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    host_.resize(n);
    for (float& v : host_) v = Round(e, d(*rng));
    const auto bytes = ToBytes(e, host_);
    EXPECT_EQ(cudaMemcpy(data_, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void* data() const { return data_; }
  const std::vector<float>& initial() const { return host_; }
  std::vector<float> Read() const {
    std::vector<uint8_t> bytes(n_ * ElemBytes(e_));
    EXPECT_EQ(cudaMemcpy(bytes.data(), data_, bytes.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return FromBytes(e_, bytes);
  }

 private:
  Elem e_;
  size_t n_;
  void* base_ = nullptr;
  void* data_ = nullptr;
  std::vector<float> host_;
};

// Lengths around the widest vector (8 halves) and one of many vectors with a tail.
const std::vector<size_t> kLengths = {1, 3, 4, 7, 8, 9, 15, 16, 17, 33, 4096 + 5};
const std::vector<Elem> kElems = {Elem::kFloat32, Elem::kFloat16, Elem::kBfloat16};

void ExpectEqualTo(Elem e, const std::vector<float>& got, const std::vector<float>& want,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], Round(e, want[i])) << what << " at " << i;
  }
}

TEST(CudnnKernelsTest, ReluForwardBackwardAndAdd) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device in this process";
  std::mt19937 rng(7);
  for (Elem e : kElems) {
    for (size_t n : kLengths) {
      for (size_t skew : {0u, 1u}) {
        const std::string what =
            std::string(ElemName(e)) + " n=" + std::to_string(n) + " skew=" + std::to_string(skew);
        DeviceArray x(e, n, skew, &rng), y(e, n, skew, &rng), dy(e, n, skew, &rng),
            dx(e, n, skew, &rng), sum(e, n, skew, &rng);
        ASSERT_EQ(LaunchReluForward(e, x.data(), y.data(), static_cast<int64_t>(n), nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> relu(n);
        for (size_t i = 0; i < n; ++i) relu[i] = std::fmax(x.initial()[i], 0.0f);
        ExpectEqualTo(e, y.Read(), relu, "relu forward " + what);

        for (bool accumulate : {false, true}) {
          const std::vector<float> before = dx.Read();
          ASSERT_EQ(LaunchReluBackward(e, y.data(), dy.data(), dx.data(), static_cast<int64_t>(n),
                                       accumulate, nullptr),
                    cudaSuccess);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          std::vector<float> want(n);
          for (size_t i = 0; i < n; ++i) {
            const float g = relu[i] > 0.0f ? dy.initial()[i] : 0.0f;
            want[i] = accumulate ? before[i] + g : g;
          }
          ExpectEqualTo(
              e, dx.Read(), want,
              std::string("relu backward") + (accumulate ? " accumulating " : " ") + what);
        }

        ASSERT_EQ(LaunchAdd(e, x.data(), dy.data(), sum.data(), static_cast<int64_t>(n), nullptr),
                  cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> want(n);
        for (size_t i = 0; i < n; ++i) want[i] = x.initial()[i] + dy.initial()[i];
        ExpectEqualTo(e, sum.Read(), want, "add " + what);
      }
    }
  }
}

// Concatenation's layout: `rows` rows of `len` elements copied into a wider destination row at an
// offset (and back, accumulating), and one contiguous run.
TEST(CudnnKernelsTest, RowCopyIntoOffsetsAndAccumulating) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device in this process";
  std::mt19937 rng(11);
  struct Case {
    int64_t rows, len, dst_stride, dst_offset;
  };
  const std::vector<Case> cases = {
      {1, 4096 + 5, 4096 + 5, 0},  // one contiguous run (Add's backward, the loss)
      {3, 16, 16, 0},              // rows that follow each other: one run
      {5, 16, 48, 16},             // aligned rows at an aligned offset: vectors
      {5, 16, 48, 8},              // an offset of 8 elements: vectors for halves only
      {4, 9, 30, 7},               // nothing aligned
      {70000, 1, 3, 2},            // more rows than a grid's y dimension holds
  };
  for (Elem e : kElems) {
    for (const Case& c : cases) {
      for (bool accumulate : {false, true}) {
        const std::string what = std::string(ElemName(e)) + " rows=" + std::to_string(c.rows) +
                                 " len=" + std::to_string(c.len) +
                                 " offset=" + std::to_string(c.dst_offset) +
                                 (accumulate ? " accumulating" : "");
        const auto src_n = static_cast<size_t>(c.rows * c.len);
        const auto dst_n = static_cast<size_t>(c.rows * c.dst_stride);
        DeviceArray src(e, src_n, 0, &rng), dst(e, dst_n, 0, &rng);
        ASSERT_EQ(LaunchRowCopy(e, src.data(), c.len, 0, dst.data(), c.dst_stride, c.dst_offset,
                                c.rows, c.len, accumulate, nullptr),
                  cudaSuccess)
            << what;
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        std::vector<float> want = dst.initial();
        for (int64_t r = 0; r < c.rows; ++r) {
          for (int64_t j = 0; j < c.len; ++j) {
            float& d = want[static_cast<size_t>(r * c.dst_stride + c.dst_offset + j)];
            const float s = src.initial()[static_cast<size_t>(r * c.len + j)];
            d = accumulate ? d + s : s;
          }
        }
        ExpectEqualTo(e, dst.Read(), want, what);
      }
    }
  }
}

}  // namespace
}  // namespace kolo::models::compute::cudnn
