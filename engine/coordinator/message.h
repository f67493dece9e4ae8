// Negotiation messages: what a rank asks of the coordinator and what the coordinator answers.
//
// A Request says "this rank has tensor `name` ready for this collective, with these properties".
// A Response says "every rank has these tensors ready: run the collective" — or carries an error
// that every rank reports on the named tensors. Both serialise to a compact byte format in the
// host's byte order (every rank of a job runs on the same architecture); Parse* reject truncated or
// malformed input with a kProtocol status.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/status.h"

namespace kolo::coordinator {

enum class CollectiveType : uint8_t { kAllreduce = 0, kBroadcast = 1, kAllgather = 2 };
const char* CollectiveTypeName(CollectiveType type);  // "allreduce", "broadcast", "allgather"

struct Request {
  std::string name;
  CollectiveType type = CollectiveType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  uint8_t reduce_op = 0;  // ReduceOp (common/tensor.h), for allreduce
  int32_t root = 0;       // for broadcast
  Shape shape;
  // The tensor lives in CUDA device memory (TensorPlace, common/tensor.h). Every rank must agree:
  // device and host tensors never share a fusion group, and only some backends move device tensors.
  bool on_device = false;

  // True if `other` asks for the same collective, with the tensor in the same kind of memory: for
  // allgather every dimension but the first must agree; otherwise the whole shape.
  bool Compatible(const Request& other) const;
  // "allreduce float32 [64,3,7,7] sum" (" on device" for device tensors) — used in mismatch
  // errors.
  std::string Describe() const;
};

struct RequestList {
  std::vector<Request> requests;
  // How long each request had waited on its rank when sent, milliseconds (parallel to
  // `requests`; missing entries are 0). The coordinator dates a tensor by its oldest report, so a
  // tensor that waited as a response-cache hit before reaching it is not taken for a new one.
  std::vector<uint32_t> waited_ms;
  bool shutdown = false;
};

struct Response {
  // kFatal: an error that ends the job on every rank (a tensor stalled past the shutdown time).
  enum class Kind : uint8_t { kCollective = 0, kError = 1, kFatal = 2 };
  Kind kind = Kind::kCollective;
  // The agreed request (from the lowest rank that submitted it); for errors, the tensor's name.
  Request request;
  // Allgather: every rank's first dimension, in rank order. Empty otherwise.
  std::vector<int64_t> first_dims;
  std::string error;  // kError and kFatal only

  bool is_error() const { return kind != Kind::kCollective; }
  size_t bytes() const;  // the tensor's bytes on this rank (allgather: per-rank varies; 0)
};

struct ResponseList {
  std::vector<Response> responses;
};

// A 64-bit fingerprint of everything that makes a response the collective it is (kind, name, type,
// dtype, op, root, shape, memory, allgather sizes, error text): equal on every rank for the same
// response. Not cryptographic; it detects ranks that fell out of step (Controller).
uint64_t Fingerprint(const Response& response);
// Mixes `value` into `state` (order matters): for running fingerprints of sequences.
uint64_t MixFingerprint(uint64_t state, uint64_t value);

std::vector<uint8_t> Serialize(const RequestList& list);
std::vector<uint8_t> Serialize(const ResponseList& list);
StatusOr<RequestList> ParseRequestList(const std::vector<uint8_t>& bytes);
StatusOr<ResponseList> ParseResponseList(const std::vector<uint8_t>& bytes);

}  // namespace kolo::coordinator
