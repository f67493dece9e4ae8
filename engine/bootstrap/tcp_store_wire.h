// Frame layouts of the TCP store protocol (described in tcp_store.h). Internal to the store.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/bootstrap/tcp_store.h"

namespace kolo::bootstrap {

inline constexpr size_t kHelloHeaderBytes = 8;     // magic, secret_len
inline constexpr size_t kVerdictBytes = 5;         // magic, accepted
inline constexpr size_t kRequestHeaderBytes = 13;  // op, key_len, value_len, timeout_ms
inline constexpr size_t kReplyHeaderBytes = 5;     // code, len
inline constexpr size_t kStoreMaxFrameBytes =
    kRequestHeaderBytes + kStoreMaxKeyBytes + kStoreMaxValueBytes;

inline constexpr uint8_t kOpSet = 1;
inline constexpr uint8_t kOpGet = 2;

inline constexpr uint8_t kReplyOk = 0;
inline constexpr uint8_t kReplyInvalid = 1;
inline constexpr uint8_t kReplyDeadline = 2;

}  // namespace kolo::bootstrap
