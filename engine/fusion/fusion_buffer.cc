#include "engine/fusion/fusion_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/common/logging.h"
#include "engine/kernels/reduce.h"

namespace kolo::fusion {
namespace {

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

FusionBuffer::~FusionBuffer() { Release(); }

FusionBuffer::FusionBuffer(FusionBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), capacity_(std::exchange(other.capacity_, 0)) {}

FusionBuffer& FusionBuffer::operator=(FusionBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void FusionBuffer::Release() {
  if (data_ != nullptr) munmap(data_, capacity_);
  data_ = nullptr;
  capacity_ = 0;
}

Status FusionBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_) return Status::OK();
  const size_t page = PageSize();
  if (bytes > SIZE_MAX - page) {
    return InvalidArgument("fusion buffer: cannot reserve {} bytes (size overflows)", bytes);
  }
  const size_t rounded = (bytes + page - 1) / page * page;
  // mmap gives page alignment (>= kAlignment) and memory the kernel can back with huge pages.
  void* p = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return ErrnoStatus(StatusCode::kInternal, fmt::format("fusion buffer: mmap({} bytes)", rounded),
                       errno);
  }
  // Advice only: fewer TLB misses and faults when transparent huge pages are available.
  madvise(p, rounded, MADV_HUGEPAGE);
  // Fault every page in now, by writing to it (MAP_POPULATE is best-effort and would fault the
  // pages before the huge-page advice applies).
  auto* bytes_ptr = static_cast<volatile uint8_t*>(p);
  for (size_t off = 0; off < rounded; off += page) bytes_ptr[off] = 0;
  Release();
  data_ = static_cast<uint8_t*>(p);
  capacity_ = rounded;
  KOLO_LOG(kDebug, "fusion buffer: reserved {} bytes", rounded);
  return Status::OK();
}

void PackEntries(const CopyEntry* entries, size_t n) {
  for (size_t i = 0; i < n; ++i) std::memcpy(entries[i].dst, entries[i].src, entries[i].bytes);
}

void UnpackEntries(const CopyEntry* entries, size_t n, DataType dtype, double scale) {
  if (scale == 1.0) {
    PackEntries(entries, n);
    return;
  }
  const size_t elem = DataTypeSize(dtype);
  for (size_t i = 0; i < n; ++i) {
    kernels::ScaleCopy(dtype, entries[i].dst, entries[i].src, entries[i].bytes / elem, scale);
  }
}

}  // namespace kolo::fusion
