// kolo-test-links: kolo_common
// The crypto kolo takes from libcrypto (engine/common/crypto.h): key agreement, the one-message
// seal that carries the job secret under mpirun, and the random source.
#include "engine/common/crypto.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "engine/common/random.h"

namespace kolo {
namespace {

TEST(Crypto, X25519BothSidesDeriveTheSameKey) {
  auto a = X25519Key::Generate();
  auto b = X25519Key::Generate();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->public_key(), b->public_key());
  auto ka = a->Agree(b->public_key(), a->public_key(), b->public_key(), "purpose");
  auto kb = b->Agree(a->public_key(), a->public_key(), b->public_key(), "purpose");
  ASSERT_TRUE(ka.ok()) << ka.status().ToString();
  ASSERT_TRUE(kb.ok()) << kb.status().ToString();
  EXPECT_TRUE(DigestsEqual(*ka, *kb));
  // Another purpose, or the salt's order swapped, gives another key.
  auto other = a->Agree(b->public_key(), a->public_key(), b->public_key(), "other");
  auto swapped = a->Agree(b->public_key(), b->public_key(), a->public_key(), "purpose");
  ASSERT_TRUE(other.ok() && swapped.ok());
  EXPECT_FALSE(DigestsEqual(*ka, *other));
  EXPECT_FALSE(DigestsEqual(*ka, *swapped));
  // A third party's key agrees on something else.
  auto c = X25519Key::Generate();
  ASSERT_TRUE(c.ok());
  auto kc = c->Agree(b->public_key(), a->public_key(), b->public_key(), "purpose");
  ASSERT_TRUE(kc.ok());
  EXPECT_FALSE(DigestsEqual(*ka, *kc));
}

TEST(Crypto, X25519RefusesASmallOrderPeerKey) {
  auto a = X25519Key::Generate();
  ASSERT_TRUE(a.ok());
  const X25519Key::PublicKey zero{};  // order 1: the shared secret would be all zeros
  auto k = a->Agree(zero, a->public_key(), zero, "purpose");
  EXPECT_FALSE(k.ok());
  EXPECT_EQ(k.status().code(), StatusCode::kProtocol) << k.status().ToString();
}

TEST(Crypto, SealOnceRoundTripsAndRefusesAnyChange) {
  Digest key{};
  ASSERT_TRUE(FillRandom(key.data(), key.size()));
  const std::string secret = "0123456789abcdef0123456789abcdef";
  auto sealed = SealOnce(key, "aad", secret);
  ASSERT_TRUE(sealed.ok()) << sealed.status().ToString();
  EXPECT_EQ(sealed->size(), secret.size() + 16);
  EXPECT_EQ(sealed->find(secret), std::string::npos);
  auto opened = OpenOnce(key, "aad", *sealed);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(*opened, secret);
  // One bit anywhere in ciphertext or tag, other associated data, another key, a short message.
  for (size_t i = 0; i < sealed->size(); ++i) {
    std::string bad = *sealed;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    EXPECT_EQ(OpenOnce(key, "aad", bad).status().code(), StatusCode::kProtocol) << i;
  }
  EXPECT_FALSE(OpenOnce(key, "aae", *sealed).ok());
  Digest other = key;
  other[0] ^= 1;
  EXPECT_FALSE(OpenOnce(other, "aad", *sealed).ok());
  EXPECT_EQ(OpenOnce(key, "aad", "short").status().code(), StatusCode::kProtocol);
  // An empty message still carries (and checks) a tag.
  auto empty = SealOnce(key, "", "");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 16u);
  auto back = OpenOnce(key, "", *empty);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(back->empty());
}

TEST(Crypto, RandomBytesDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 64; ++i) {
    std::string b(16, '\0');
    ASSERT_TRUE(FillRandom(b.data(), b.size()));
    seen.insert(b);
  }
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_TRUE(FillRandom(nullptr, 0));
}

}  // namespace
}  // namespace kolo
