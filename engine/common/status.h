// Status and StatusOr: how every fallible call across a module boundary reports its outcome.
//
// A Status is OK or carries a code and a message that says what failed, naming the tensor, rank
// or value involved and, where it helps, what to do. Vendor codes (errno, MPI, ...) are converted
// at the edge of the module that calls the vendor library, with the call and the code in the text.
#pragma once

#include <fmt/format.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kolo {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // a bad value from the caller or the user (flag, env var, tensor)
  kFailedPrecondition,  // called in the wrong state (not initialised, already shut down)
  kDeadlineExceeded,    // a blocking wait ran past its timeout
  kUnavailable,         // a peer is gone: connection lost, rank died, aborted by a peer
  kAborted,             // the job was aborted (a peer reported a failure)
  kInternal,            // a broken invariant or an unexpected vendor error
  kProtocol,            // a peer sent bytes that violate the wire protocol
  kNotFound,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status OK() { return Status(); }
  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  const std::string& message() const;
  // "CodeName: message", or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context + ": "`.
  Status WithContext(const std::string& context) const;

  // Explicitly drops a status the caller has decided not to handle.
  void IgnoreError() const {}

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;  // null means OK; shared so copies are cheap
};

template <typename... Args>
Status InvalidArgument(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status FailedPrecondition(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kFailedPrecondition, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status DeadlineExceeded(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kDeadlineExceeded, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Unavailable(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kUnavailable, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Aborted(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kAborted, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status Internal(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kInternal, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status ProtocolError(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kProtocol, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status NotFound(fmt::format_string<Args...> f, Args&&... args) {
  return Status(StatusCode::kNotFound, fmt::format(f, std::forward<Args>(args)...));
}

// Converts a failed libc/syscall result: "<call>: <strerror(err)> (errno <err>)".
Status ErrnoStatus(StatusCode code, const std::string& call, int err);

// A value or the Status that explains its absence.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.ok()) status_ = Status(StatusCode::kInternal, "StatusOr built from OK status");
  }
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace kolo

#define KOLO_STATUS_CONCAT_INNER(a, b) a##b
#define KOLO_STATUS_CONCAT(a, b) KOLO_STATUS_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define KOLO_RETURN_IF_ERROR(expr)                       \
  do {                                                   \
    ::kolo::Status kolo_status_tmp_ = (expr);            \
    if (!kolo_status_tmp_.ok()) return kolo_status_tmp_; \
  } while (0)

// `KOLO_ASSIGN_OR_RETURN(auto x, Foo());` — declares x from a StatusOr or returns its error.
#define KOLO_ASSIGN_OR_RETURN(lhs, expr) \
  KOLO_ASSIGN_OR_RETURN_IMPL(KOLO_STATUS_CONCAT(kolo_statusor_, __LINE__), lhs, expr)
#define KOLO_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
