#include "engine/common/crypto.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>

#include <cstring>

namespace kolo {
namespace {

constexpr size_t kTagBytes = 16;

// OpenSSL's last error, for a message; "no detail" when its queue is empty.
std::string OpenSslError() {
  const unsigned long e = ERR_get_error();  // NOLINT(google-runtime-int): OpenSSL's type
  ERR_clear_error();
  if (e == 0) return "no detail";
  char text[256];
  ERR_error_string_n(e, text, sizeof text);
  return text;
}

struct CipherCtxDeleter {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
struct PkeyCtxDeleter {
  void operator()(EVP_PKEY_CTX* c) const { EVP_PKEY_CTX_free(c); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxDeleter>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, PkeyCtxDeleter>;

}  // namespace

struct Sha256::Context {
  EVP_MD_CTX* ctx = nullptr;
  ~Context() { EVP_MD_CTX_free(ctx); }
};

// SHA-256 is in every build of libcrypto; a failure here is memory exhaustion, which kolo does
// not survive anywhere else either.
Sha256::Sha256() : context_(std::make_unique<Context>()) {
  context_->ctx = EVP_MD_CTX_new();
  if (context_->ctx == nullptr || EVP_DigestInit_ex(context_->ctx, EVP_sha256(), nullptr) != 1) {
    std::abort();
  }
}

Sha256::~Sha256() = default;

void Sha256::Update(const void* data, size_t size) {
  if (EVP_DigestUpdate(context_->ctx, data, size) != 1) std::abort();
}

Digest Sha256::Final() {
  Digest out{};
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(context_->ctx, out.data(), &n) != 1 || n != out.size()) std::abort();
  return out;
}

Digest HmacSha256(std::string_view key, const void* message, size_t size) {
  Digest out{};
  unsigned int n = 0;
  // An empty message is a valid input; HMAC wants a non-null pointer for it.
  static constexpr uint8_t kNothing = 0;
  const auto* m = size == 0 ? &kNothing : static_cast<const uint8_t*>(message);
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), m, size, out.data(), &n) ==
          nullptr ||
      n != out.size()) {
    std::abort();
  }
  return out;
}

bool DigestsEqual(const Digest& a, const Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

struct X25519Key::Pkey {
  EVP_PKEY* key = nullptr;
  ~Pkey() { EVP_PKEY_free(key); }
};

X25519Key::X25519Key(std::unique_ptr<Pkey> key, const PublicKey& pub)
    : key_(std::move(key)), public_(pub) {}
X25519Key::X25519Key(X25519Key&&) noexcept = default;
X25519Key& X25519Key::operator=(X25519Key&&) noexcept = default;
X25519Key::~X25519Key() = default;

StatusOr<X25519Key> X25519Key::Generate() {
  PkeyCtx ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr));
  auto pkey = std::make_unique<Pkey>();
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx.get()) != 1 ||
      EVP_PKEY_keygen(ctx.get(), &pkey->key) != 1) {
    return Internal("X25519 key generation failed: {}", OpenSslError());
  }
  PublicKey pub{};
  size_t n = pub.size();
  if (EVP_PKEY_get_raw_public_key(pkey->key, pub.data(), &n) != 1 || n != pub.size()) {
    return Internal("reading the X25519 public key failed: {}", OpenSslError());
  }
  return X25519Key(std::move(pkey), pub);
}

StatusOr<Digest> X25519Key::Agree(const PublicKey& peer, const PublicKey& initiator,
                                  const PublicKey& responder, std::string_view purpose) const {
  EVP_PKEY* raw = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer.data(), peer.size());
  if (raw == nullptr)
    return ProtocolError("a peer's X25519 public key is unusable: {}", OpenSslError());
  Pkey peer_key{raw};
  PkeyCtx ctx(EVP_PKEY_CTX_new(key_->key, nullptr));
  std::array<uint8_t, 32> shared{};
  size_t n = shared.size();
  if (ctx == nullptr || EVP_PKEY_derive_init(ctx.get()) != 1 ||
      EVP_PKEY_derive_set_peer(ctx.get(), peer_key.key) != 1 ||
      EVP_PKEY_derive(ctx.get(), shared.data(), &n) != 1 || n != shared.size()) {
    // OpenSSL refuses the all-zero result of a small-order peer key here.
    return ProtocolError("X25519 key agreement with a peer failed: {}", OpenSslError());
  }
  std::array<uint8_t, 64> salt{};
  std::memcpy(salt.data(), initiator.data(), 32);
  std::memcpy(salt.data() + 32, responder.data(), 32);
  PkeyCtx kdf(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr));
  Digest out{};
  size_t out_n = out.size();
  const bool ok =
      kdf != nullptr && EVP_PKEY_derive_init(kdf.get()) == 1 &&
      EVP_PKEY_CTX_set_hkdf_md(kdf.get(), EVP_sha256()) == 1 &&
      EVP_PKEY_CTX_set1_hkdf_salt(kdf.get(), salt.data(), static_cast<int>(salt.size())) == 1 &&
      EVP_PKEY_CTX_set1_hkdf_key(kdf.get(), shared.data(), static_cast<int>(shared.size())) == 1 &&
      EVP_PKEY_CTX_add1_hkdf_info(kdf.get(), reinterpret_cast<const unsigned char*>(purpose.data()),
                                  static_cast<int>(purpose.size())) == 1 &&
      EVP_PKEY_derive(kdf.get(), out.data(), &out_n) == 1 && out_n == out.size();
  OPENSSL_cleanse(shared.data(), shared.size());
  if (!ok) return Internal("HKDF-SHA-256 failed: {}", OpenSslError());
  return out;
}

namespace {

// One message per key: the all-zero nonce is then safe (RFC 8439, section 4).
constexpr std::array<uint8_t, 12> kNonce{};

StatusOr<std::string> Crypt(bool seal, const Digest& key, std::string_view aad,
                            std::string_view in) {
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  if (ctx == nullptr || EVP_CipherInit_ex(ctx.get(), EVP_chacha20_poly1305(), nullptr, key.data(),
                                          kNonce.data(), seal ? 1 : 0) != 1) {
    return Internal("ChaCha20-Poly1305 set-up failed: {}", OpenSslError());
  }
  size_t body = in.size();
  if (!seal) {
    if (in.size() < kTagBytes)
      return ProtocolError("sealed message of {} bytes has no tag", in.size());
    body -= kTagBytes;
    std::string tag(in.substr(body));
    if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_AEAD_SET_TAG, kTagBytes, tag.data()) != 1) {
      return Internal("ChaCha20-Poly1305 tag: {}", OpenSslError());
    }
  }
  int n = 0;
  if (!aad.empty() &&
      EVP_CipherUpdate(ctx.get(), nullptr, &n, reinterpret_cast<const unsigned char*>(aad.data()),
                       static_cast<int>(aad.size())) != 1) {
    return Internal("ChaCha20-Poly1305 associated data: {}", OpenSslError());
  }
  std::string out(body + (seal ? kTagBytes : 0), '\0');
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  if (body > 0 &&
      EVP_CipherUpdate(ctx.get(), o, &n, reinterpret_cast<const unsigned char*>(in.data()),
                       static_cast<int>(body)) != 1) {
    return Internal("ChaCha20-Poly1305: {}", OpenSslError());
  }
  int tail = 0;
  if (EVP_CipherFinal_ex(ctx.get(), o + body, &tail) != 1) {
    if (!seal) {
      ERR_clear_error();
      return ProtocolError("a sealed message failed its authentication (changed, or another key)");
    }
    return Internal("ChaCha20-Poly1305: {}", OpenSslError());
  }
  if (seal && EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_AEAD_GET_TAG, kTagBytes, o + body) != 1) {
    return Internal("ChaCha20-Poly1305 tag: {}", OpenSslError());
  }
  return out;
}

}  // namespace

StatusOr<std::string> SealOnce(const Digest& key, std::string_view aad, std::string_view plain) {
  return Crypt(true, key, aad, plain);
}

StatusOr<std::string> OpenOnce(const Digest& key, std::string_view aad, std::string_view sealed) {
  return Crypt(false, key, aad, sealed);
}

std::string Hex(const void* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* b = static_cast<const uint8_t*>(bytes);
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[b[i] >> 4];
    out[2 * i + 1] = kDigits[b[i] & 15];
  }
  return out;
}

bool FromHex(std::string_view hex, std::string* bytes) {
  if (hex.size() % 2 != 0) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  bytes->assign(hex.size() / 2, '\0');
  for (size_t i = 0; i < bytes->size(); ++i) {
    const int hi = nibble(hex[2 * i]);
    const int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*bytes)[i] = static_cast<char>(hi << 4 | lo);
  }
  return true;
}

}  // namespace kolo
