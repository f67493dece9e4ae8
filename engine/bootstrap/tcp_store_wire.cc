#include "engine/bootstrap/tcp_store_wire.h"

#include <algorithm>
#include <cstring>

namespace kolo::bootstrap {
namespace {

constexpr size_t kLabelBytes = 64;

Digest Proof(std::string_view label, std::string_view secret, const StoreNonce& server_nonce,
             const StoreNonce& client_nonce) {
  uint8_t message[kLabelBytes + 2 * kStoreNonceBytes] = {};
  std::memcpy(message, label.data(), std::min(label.size(), kLabelBytes));
  std::memcpy(message + kLabelBytes, server_nonce.data(), kStoreNonceBytes);
  std::memcpy(message + kLabelBytes + kStoreNonceBytes, client_nonce.data(), kStoreNonceBytes);
  return HmacSha256(secret, message, sizeof message);
}

}  // namespace

Digest StoreClientProof(std::string_view secret, const StoreNonce& server_nonce,
                        const StoreNonce& client_nonce) {
  return Proof("kolo store client proof v1", secret, server_nonce, client_nonce);
}

Digest StoreServerProof(std::string_view secret, const StoreNonce& server_nonce,
                        const StoreNonce& client_nonce) {
  return Proof("kolo store server proof v1", secret, server_nonce, client_nonce);
}

}  // namespace kolo::bootstrap
