#include "engine/coordinator/message.h"

#include <cstring>

#include "engine/common/random.h"

namespace kolo::coordinator {
namespace {

constexpr uint32_t kRequestMagic = 0x4b524551;   // "KREQ"
constexpr uint32_t kResponseMagic = 0x4b525350;  // "KRSP"
// Bounds that keep a malformed message from asking for absurd allocations.
constexpr uint32_t kMaxNameBytes = 1 << 16;
constexpr uint32_t kMaxRank = 32;
constexpr uint32_t kMaxItems = 1 << 24;

class Writer {
 public:
  void U8(uint8_t v) { out_.push_back(v); }
  void U32(uint32_t v) { Raw(&v, sizeof v); }
  void I32(int32_t v) { Raw(&v, sizeof v); }
  void I64(int64_t v) { Raw(&v, sizeof v); }
  void Str(const std::string& s) {
    U32(static_cast<uint32_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void Dims(const std::vector<int64_t>& d) {
    U32(static_cast<uint32_t>(d.size()));
    for (int64_t x : d) I64(x);
  }
  std::vector<uint8_t> Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<uint8_t> out_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& in) : in_(in) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U32(uint32_t* v) { return Raw(v, sizeof *v); }
  bool I32(int32_t* v) { return Raw(v, sizeof *v); }
  bool I64(int64_t* v) { return Raw(v, sizeof *v); }
  bool Str(std::string* s, uint32_t max) {
    uint32_t n;
    if (!U32(&n) || n > max || n > in_.size() - pos_) return false;
    s->assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool Dims(std::vector<int64_t>* d, uint32_t max) {
    uint32_t n;
    if (!U32(&n) || n > max || static_cast<size_t>(n) * 8 > in_.size() - pos_) return false;
    d->resize(n);
    for (auto& x : *d) {
      if (!I64(&x)) return false;
    }
    return true;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  bool Raw(void* p, size_t n) {
    if (in_.size() - pos_ < n) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  const std::vector<uint8_t>& in_;
  size_t pos_ = 0;
};

void WriteRequest(Writer& w, const Request& r) {
  w.Str(r.name);
  w.U8(static_cast<uint8_t>(r.type));
  w.U8(static_cast<uint8_t>(r.dtype));
  w.U8(r.reduce_op);
  w.I32(r.root);
  w.Dims(r.shape);
  w.U8(r.on_device ? 1 : 0);
}

bool ReadRequest(Reader& rd, Request* r) {
  uint8_t type, dtype, on_device;
  if (!rd.Str(&r->name, kMaxNameBytes) || !rd.U8(&type) || !rd.U8(&dtype) ||
      !rd.U8(&r->reduce_op) || !rd.I32(&r->root) || !rd.Dims(&r->shape, kMaxRank) ||
      !rd.U8(&on_device)) {
    return false;
  }
  if (type > static_cast<uint8_t>(CollectiveType::kAllgather) || dtype >= kNumDataTypes ||
      r->reduce_op > 1 || on_device > 1) {
    return false;
  }
  r->on_device = on_device != 0;
  for (int64_t d : r->shape) {
    if (d < 0) return false;
  }
  r->type = static_cast<CollectiveType>(type);
  r->dtype = static_cast<DataType>(dtype);
  return true;
}

}  // namespace

const char* CollectiveTypeName(CollectiveType type) {
  switch (type) {
    case CollectiveType::kAllreduce:
      return "allreduce";
    case CollectiveType::kBroadcast:
      return "broadcast";
    case CollectiveType::kAllgather:
      return "allgather";
  }
  return "unknown";
}

bool Request::Compatible(const Request& o) const {
  if (type != o.type || dtype != o.dtype || on_device != o.on_device) return false;
  if (type == CollectiveType::kAllreduce && reduce_op != o.reduce_op) return false;
  if (type == CollectiveType::kBroadcast && root != o.root) return false;
  if (type == CollectiveType::kAllgather) {
    if (shape.size() != o.shape.size() || shape.empty()) return false;
    return std::equal(shape.begin() + 1, shape.end(), o.shape.begin() + 1);
  }
  return shape == o.shape;
}

std::string Request::Describe() const {
  std::string s =
      fmt::format("{} {} {}", CollectiveTypeName(type), DataTypeName(dtype), ShapeToString(shape));
  if (type == CollectiveType::kAllreduce) s += reduce_op == 0 ? " sum" : " average";
  if (type == CollectiveType::kBroadcast) s += fmt::format(" root {}", root);
  if (on_device) s += " on device";
  return s;
}

size_t Response::bytes() const {
  if (request.type == CollectiveType::kAllgather) return 0;
  return static_cast<size_t>(NumElements(request.shape)) * DataTypeSize(request.dtype);
}

namespace {

// Spreads every input bit over the output.
uint64_t Spread(uint64_t x) { return SplitMix64(x); }

// FNV-1a over bytes, continuing from `h`.
uint64_t Fnv(uint64_t h, const void* data, size_t n) {
  const auto* b = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

}  // namespace

uint64_t MixFingerprint(uint64_t state, uint64_t value) { return Spread(state ^ Spread(value)); }

uint64_t Fingerprint(const Response& r) {
  uint64_t h = 0xcbf29ce484222325ull;
  const Request& q = r.request;
  const uint8_t fixed[] = {static_cast<uint8_t>(r.kind), static_cast<uint8_t>(q.type),
                           static_cast<uint8_t>(q.dtype), q.reduce_op,
                           static_cast<uint8_t>(q.on_device)};
  h = Fnv(h, fixed, sizeof fixed);
  h = Fnv(h, &q.root, sizeof q.root);
  h = Fnv(h, q.name.data(), q.name.size());
  const uint64_t dims = q.shape.size();
  h = Fnv(h, &dims, sizeof dims);
  for (int64_t d : q.shape) h = Fnv(h, &d, sizeof d);
  for (int64_t d : r.first_dims) h = Fnv(h, &d, sizeof d);
  h = Fnv(h, r.error.data(), r.error.size());
  return Spread(h);
}

std::vector<uint8_t> Serialize(const RequestList& list) {
  Writer w;
  w.U32(kRequestMagic);
  w.U8(list.shutdown ? 1 : 0);
  w.U32(static_cast<uint32_t>(list.requests.size()));
  for (const Request& r : list.requests) WriteRequest(w, r);
  for (size_t i = 0; i < list.requests.size(); ++i) {
    w.U32(i < list.waited_ms.size() ? list.waited_ms[i] : 0);
  }
  return w.Take();
}

std::vector<uint8_t> Serialize(const ResponseList& list) {
  Writer w;
  w.U32(kResponseMagic);
  w.U32(static_cast<uint32_t>(list.responses.size()));
  for (const Response& r : list.responses) {
    w.U8(static_cast<uint8_t>(r.kind));
    WriteRequest(w, r.request);
    w.Dims(r.first_dims);
    w.Str(r.error);
  }
  return w.Take();
}

StatusOr<RequestList> ParseRequestList(const std::vector<uint8_t>& bytes) {
  Reader rd(bytes);
  uint32_t magic, n;
  uint8_t shutdown;
  RequestList list;
  if (!rd.U32(&magic) || magic != kRequestMagic || !rd.U8(&shutdown) || !rd.U32(&n) ||
      n > kMaxItems) {
    return ProtocolError("malformed request list header ({} bytes)", bytes.size());
  }
  list.shutdown = shutdown != 0;
  list.requests.resize(n);
  for (auto& r : list.requests) {
    if (!ReadRequest(rd, &r)) return ProtocolError("malformed request in request list");
  }
  list.waited_ms.resize(n);
  for (uint32_t& ms : list.waited_ms) {
    if (!rd.U32(&ms)) return ProtocolError("malformed waiting times in request list");
  }
  if (!rd.done()) return ProtocolError("trailing bytes after request list");
  return list;
}

StatusOr<ResponseList> ParseResponseList(const std::vector<uint8_t>& bytes) {
  Reader rd(bytes);
  uint32_t magic, n;
  ResponseList list;
  if (!rd.U32(&magic) || magic != kResponseMagic || !rd.U32(&n) || n > kMaxItems) {
    return ProtocolError("malformed response list header ({} bytes)", bytes.size());
  }
  list.responses.resize(n);
  for (auto& r : list.responses) {
    uint8_t kind;
    if (!rd.U8(&kind) || kind > 2 || !ReadRequest(rd, &r.request) ||
        !rd.Dims(&r.first_dims, kMaxItems) || !rd.Str(&r.error, 1 << 20)) {
      return ProtocolError("malformed response in response list");
    }
    r.kind = static_cast<Response::Kind>(kind);
  }
  if (!rd.done()) return ProtocolError("trailing bytes after response list");
  return list;
}

}  // namespace kolo::coordinator
