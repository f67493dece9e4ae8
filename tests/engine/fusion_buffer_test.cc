#include "engine/fusion/fusion_buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/kernels/reduce.h"

namespace kolo::fusion {
namespace {

bool AllPagesResident(const uint8_t* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((bytes + page - 1) / page);
  if (mincore(const_cast<uint8_t*>(p), bytes, vec.data()) != 0) return false;
  for (unsigned char v : vec) {
    if ((v & 1) == 0) return false;
  }
  return true;
}

TEST(FusionBufferTest, ReserveGrowsOnlyAndKeepsAlignment) {
  FusionBuffer buf;
  EXPECT_EQ(buf.data(), nullptr);
  EXPECT_EQ(buf.capacity(), 0u);
  ASSERT_TRUE(buf.Reserve(0).ok());
  EXPECT_EQ(buf.data(), nullptr);

  ASSERT_TRUE(buf.Reserve(100).ok());
  ASSERT_NE(buf.data(), nullptr);
  EXPECT_GE(buf.capacity(), 100u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % FusionBuffer::kAlignment, 0u);
  uint8_t* const first = buf.data();
  const size_t first_capacity = buf.capacity();

  // Smaller or equal requests change nothing: no reallocation per call.
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{100}, first_capacity}) {
    ASSERT_TRUE(buf.Reserve(bytes).ok());
    EXPECT_EQ(buf.data(), first);
    EXPECT_EQ(buf.capacity(), first_capacity);
  }

  const size_t big = (size_t{10} << 20) + 3;
  ASSERT_TRUE(buf.Reserve(big).ok());
  EXPECT_GE(buf.capacity(), big);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf.data()) % FusionBuffer::kAlignment, 0u);
  std::memset(buf.data(), 0x5a, buf.capacity());  // the whole capacity is writable
  EXPECT_EQ(buf.data()[buf.capacity() - 1], 0x5a);
}

TEST(FusionBufferTest, ReservePrefaultsEveryPage) {
  FusionBuffer buf;
  ASSERT_TRUE(buf.Reserve(size_t{8} << 20).ok());
  EXPECT_TRUE(AllPagesResident(buf.data(), buf.capacity()));
}

TEST(FusionBufferTest, FailedReserveLeavesBufferIntact) {
  FusionBuffer buf;
  ASSERT_TRUE(buf.Reserve(4096).ok());
  std::memset(buf.data(), 0x3c, 4096);
  uint8_t* const before = buf.data();
  const size_t capacity = buf.capacity();
  const size_t huge = size_t{1} << 62;
  Status s = buf.Reserve(huge);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(std::to_string(huge)), std::string::npos) << s.ToString();
  EXPECT_EQ(buf.data(), before);
  EXPECT_EQ(buf.capacity(), capacity);
  EXPECT_EQ(buf.data()[4095], 0x3c);
  EXPECT_FALSE(buf.Reserve(SIZE_MAX).ok());
}

TEST(FusionBufferTest, MoveTransfersOwnership) {
  FusionBuffer a;
  ASSERT_TRUE(a.Reserve(1000).ok());
  uint8_t* const p = a.data();
  FusionBuffer b(std::move(a));
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is specified
  EXPECT_EQ(a.capacity(), 0u);
  FusionBuffer c;
  ASSERT_TRUE(c.Reserve(10).ok());
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
}

// A list of tensors of `dtype` with random bytes (NaN patterns included), at odd offsets.
struct Tensors {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<size_t> offset;
  std::vector<size_t> bytes;
};

Tensors MakeTensors(DataType dtype, std::mt19937_64& rng) {
  const size_t counts[] = {1, 3, 17, 1000, 4099, 1, 65536 + 5, 7};
  Tensors t;
  for (size_t i = 0; i < std::size(counts); ++i) {
    const size_t bytes = counts[i] * DataTypeSize(dtype);
    const size_t off = i % 5;
    std::vector<uint8_t> s(bytes + off);
    for (auto& byte : s) byte = static_cast<uint8_t>(rng());
    t.storage.push_back(std::move(s));
    t.offset.push_back(off);
    t.bytes.push_back(bytes);
  }
  return t;
}

TEST(FusionBufferTest, PackThenUnpackRoundTripsEveryDtype) {
  std::mt19937_64 rng(5);
  FusionBuffer buf;
  for (DataType dtype : AllDataTypes()) {
    SCOPED_TRACE(DataTypeName(dtype));
    Tensors in = MakeTensors(dtype, rng);
    size_t total = 0;
    for (size_t b : in.bytes) total += b;
    ASSERT_TRUE(buf.Reserve(total).ok());

    std::vector<CopyEntry> pack, unpack;
    Tensors out = in;
    size_t pos = 0;
    for (size_t i = 0; i < in.bytes.size(); ++i) {
      std::fill(out.storage[i].begin(), out.storage[i].end(), 0);
      pack.push_back({in.storage[i].data() + in.offset[i], buf.data() + pos, in.bytes[i]});
      unpack.push_back({buf.data() + pos, out.storage[i].data() + out.offset[i], in.bytes[i]});
      pos += in.bytes[i];
    }
    PackEntries(pack.data(), pack.size());
    pos = 0;
    for (size_t i = 0; i < in.bytes.size(); ++i) {
      ASSERT_EQ(std::memcmp(buf.data() + pos, in.storage[i].data() + in.offset[i], in.bytes[i]), 0)
          << "tensor " << i << " packed wrongly";
      pos += in.bytes[i];
    }
    UnpackEntries(unpack.data(), unpack.size(), dtype, 1.0);
    for (size_t i = 0; i < in.bytes.size(); ++i) {
      EXPECT_EQ(std::memcmp(out.storage[i].data() + out.offset[i],
                            in.storage[i].data() + in.offset[i], in.bytes[i]),
                0)
          << "tensor " << i;
    }
  }
}

TEST(FusionBufferTest, ScaledUnpackEqualsCopyThenScale) {
  std::mt19937_64 rng(9);
  for (DataType dtype : AllDataTypes()) {
    for (double scale : {0.25, 1.0 / 3}) {
      SCOPED_TRACE(::testing::Message() << DataTypeName(dtype) << " scale " << scale);
      Tensors in = MakeTensors(dtype, rng);
      Tensors out = in;
      std::vector<CopyEntry> unpack;
      for (size_t i = 0; i < in.bytes.size(); ++i) {
        unpack.push_back({in.storage[i].data() + in.offset[i],
                          out.storage[i].data() + out.offset[i], in.bytes[i]});
      }
      UnpackEntries(unpack.data(), unpack.size(), dtype, scale);
      for (size_t i = 0; i < in.bytes.size(); ++i) {
        std::vector<uint8_t> want = in.storage[i];
        kernels::Scale(dtype, want.data() + in.offset[i], in.bytes[i] / DataTypeSize(dtype), scale);
        ASSERT_EQ(out.storage[i], want) << "tensor " << i;
        ASSERT_NE(out.storage[i], in.storage[i]) << "not scaled";
      }
    }
  }
}

TEST(FusionBufferTest, ScaledUnpackKnownValues) {
  const std::vector<int32_t> sum_i = {8, 7, -7, 1};
  const std::vector<float> sum_f = {3.0f, -1.0f};
  std::vector<int32_t> avg_i(4);
  std::vector<float> avg_f(2);
  CopyEntry ei{sum_i.data(), avg_i.data(), sum_i.size() * 4};
  CopyEntry ef{sum_f.data(), avg_f.data(), sum_f.size() * 4};
  UnpackEntries(&ei, 1, DataType::kInt32, 0.5);
  UnpackEntries(&ef, 1, DataType::kFloat32, 0.25);
  EXPECT_EQ(avg_i, (std::vector<int32_t>{4, 3, -3, 0}));
  EXPECT_EQ(avg_f, (std::vector<float>{0.75f, -0.25f}));
}

}  // namespace
}  // namespace kolo::fusion
