// Negotiation pieces in isolation: message encoding, the coordinator's table, the response cache,
// and the fusion planner.
#include <gtest/gtest.h>

#include <random>

#include "engine/coordinator/message.h"
#include "engine/coordinator/message_table.h"
#include "engine/coordinator/response_cache.h"
#include "engine/fusion/planner.h"

namespace kolo::coordinator {
namespace {

Request Req(const std::string& name, Shape shape, DataType d = DataType::kFloat32,
            CollectiveType t = CollectiveType::kAllreduce) {
  Request r;
  r.name = name;
  r.shape = std::move(shape);
  r.dtype = d;
  r.type = t;
  return r;
}

TEST(Message, RoundTrips) {
  RequestList rl;
  rl.shutdown = true;
  rl.requests.push_back(Req("conv1/weight", {64, 3, 7, 7}));
  rl.requests.push_back(Req("emb \"quoted\"", {}, DataType::kBFloat16, CollectiveType::kBroadcast));
  rl.requests.back().root = 3;
  auto parsed = ParseRequestList(Serialize(rl));
  ASSERT_TRUE(parsed.ok());
  ASSERT_EQ(parsed->requests.size(), 2u);
  EXPECT_TRUE(parsed->shutdown);
  EXPECT_EQ(parsed->requests[0].shape, (Shape{64, 3, 7, 7}));
  EXPECT_EQ(parsed->requests[1].root, 3);
  EXPECT_EQ(parsed->requests[1].name, "emb \"quoted\"");
  // Waiting times ride along; missing ones are sent as 0.
  rl.waited_ms = {1500};
  auto with_waits = ParseRequestList(Serialize(rl));
  ASSERT_TRUE(with_waits.ok());
  EXPECT_EQ(with_waits->waited_ms, (std::vector<uint32_t>{1500, 0}));

  ResponseList resp;
  Response r;
  r.request = Req("g", {5, 2}, DataType::kInt64, CollectiveType::kAllgather);
  r.first_dims = {5, 0, 7};
  resp.responses.push_back(r);
  Response e;
  e.kind = Response::Kind::kError;
  e.error = "boom";
  resp.responses.push_back(e);
  auto back = ParseResponseList(Serialize(resp));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->responses[0].first_dims, (std::vector<int64_t>{5, 0, 7}));
  EXPECT_TRUE(back->responses[1].is_error());
  EXPECT_EQ(back->responses[1].error, "boom");
}

TEST(Message, MalformedBytesAreProtocolErrors) {
  RequestList rl;
  rl.requests.push_back(Req("x", {1, 2, 3}));
  const auto good = Serialize(rl);
  for (size_t cut = 0; cut < good.size(); ++cut) {
    std::vector<uint8_t> truncated(good.begin(), good.begin() + static_cast<long>(cut));
    auto p = ParseRequestList(truncated);
    ASSERT_FALSE(p.ok()) << "cut at " << cut;
    EXPECT_EQ(p.status().code(), StatusCode::kProtocol);
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> junk(rng() % 64);
    for (auto& b : junk) b = static_cast<uint8_t>(rng());
    EXPECT_FALSE(ParseResponseList(junk).ok());  // must not crash or allocate wildly
  }
  auto extra = good;
  extra.push_back(0);
  EXPECT_FALSE(ParseRequestList(extra).ok());
}

TEST(MessageTable, ReadyWhenEveryRankReported) {
  MessageTable t(3);
  std::vector<Response> ready;
  const auto now = MessageTable::Clock::now();
  t.Add(0, Req("a", {4}), now, &ready);
  t.Add(2, Req("a", {4}), now, &ready);
  EXPECT_TRUE(ready.empty());
  t.Add(1, Req("a", {4}), now, &ready);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_FALSE(ready[0].is_error());
  EXPECT_EQ(t.pending(), 0u);
}

TEST(MessageTable, MismatchBecomesErrorNamingBoth) {
  MessageTable t(2);
  std::vector<Response> ready;
  const auto now = MessageTable::Clock::now();
  t.Add(0, Req("w", {64, 3, 7, 7}), now, &ready);
  t.Add(1, Req("w", {64, 3, 3, 3}), now, &ready);
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_TRUE(ready[0].is_error());
  EXPECT_NE(ready[0].error.find("rank 1 sent allreduce float32 [64,3,3,3]"), std::string::npos)
      << ready[0].error;
  EXPECT_NE(ready[0].error.find("rank 0 sent allreduce float32 [64,3,7,7]"), std::string::npos);
}

TEST(MessageTable, AllgatherAllowsDifferentFirstDims) {
  MessageTable t(2);
  std::vector<Response> ready;
  const auto now = MessageTable::Clock::now();
  t.Add(0, Req("g", {3, 5}, DataType::kFloat32, CollectiveType::kAllgather), now, &ready);
  t.Add(1, Req("g", {1, 5}, DataType::kFloat32, CollectiveType::kAllgather), now, &ready);
  ASSERT_EQ(ready.size(), 1u);
  ASSERT_FALSE(ready[0].is_error()) << ready[0].error;
  EXPECT_EQ(ready[0].first_dims, (std::vector<int64_t>{3, 1}));
}

TEST(MessageTable, ATensorIsDatedByItsOldestReport) {
  MessageTable t(3);
  std::vector<Response> ready;
  const auto now = MessageTable::Clock::now();
  // Rank 1 reports now; rank 0's report says it had waited 10 s (as a cache hit) before.
  t.Add(1, Req("s", {1}), now, &ready);
  t.Add(0, Req("s", {1}), now - std::chrono::seconds(10), &ready);
  auto stalled = t.FindStalled(now, std::chrono::seconds(5));
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_GE(stalled[0].waited_s, 10.0);
  EXPECT_EQ(FormatRanks(stalled[0].missing_ranks), "2");
}

TEST(MessageTable, StalledListsReadyAndMissingRanks) {
  MessageTable t(5);
  std::vector<Response> ready;
  const auto then = MessageTable::Clock::now() - std::chrono::seconds(10);
  t.Add(0, Req("s", {1}), then, &ready);
  t.Add(3, Req("s", {1}), then, &ready);
  auto stalled = t.FindStalled(MessageTable::Clock::now(), std::chrono::seconds(5));
  ASSERT_EQ(stalled.size(), 1u);
  EXPECT_EQ(stalled[0].ready_ranks, (std::vector<int>{0, 3}));
  EXPECT_EQ(FormatRanks(stalled[0].missing_ranks), "1,2,4");
  EXPECT_TRUE(t.FindStalled(MessageTable::Clock::now(), std::chrono::seconds(60)).empty());
  Response f = t.Fail("s", "stalled");
  EXPECT_TRUE(f.is_error());
  EXPECT_EQ(t.pending(), 0u);
  EXPECT_EQ(FormatRanks({0, 1, 2, 3, 7, 9, 10}), "0-3,7,9,10");
}

TEST(ResponseCache, HitMissMismatchAndLruEviction) {
  ResponseCache c(2);
  Response a, b, d;
  a.request = Req("a", {4});
  b.request = Req("b", {8});
  d.request = Req("d", {2});
  int bit = -1;
  EXPECT_EQ(c.Find(a.request, 0, &bit), ResponseCache::Lookup::kMiss);
  c.Put(a);
  c.Put(b);
  EXPECT_EQ(c.Find(a.request, 0, &bit), ResponseCache::Lookup::kHit);
  const int bit_a = bit;
  EXPECT_EQ(c.Find(Req("a", {5}), 0, &bit), ResponseCache::Lookup::kMismatch);
  c.Touch(bit_a);  // b is now least recently used
  c.Put(d);
  EXPECT_EQ(c.Find(b.request, 0, &bit), ResponseCache::Lookup::kMiss);
  EXPECT_EQ(c.Find(a.request, 0, &bit), ResponseCache::Lookup::kHit);
  EXPECT_EQ(c.Find(d.request, 0, &bit), ResponseCache::Lookup::kHit);
  c.Erase(bit);
  EXPECT_EQ(c.Find(d.request, 0, &bit), ResponseCache::Lookup::kMiss);
  EXPECT_EQ(c.entries(), 1u);
}

TEST(ResponseCache, IdenticalOperationSequencesGiveIdenticalBits) {
  ResponseCache x(16), y(16);
  for (int i = 0; i < 40; ++i) {
    Response r;
    r.request = Req("t" + std::to_string(i % 23), {i % 5 + 1});
    x.Put(r);
    y.Put(r);
    if (i % 7 == 0) {
      x.Touch(i % 16 < 16 && x.Occupied(i % 16) ? i % 16 : 0);
      y.Touch(i % 16 < 16 && y.Occupied(i % 16) ? i % 16 : 0);
    }
  }
  for (int b = 0; b < 16; ++b) {
    ASSERT_EQ(x.Occupied(b), y.Occupied(b));
    if (x.Occupied(b)) {
      EXPECT_EQ(x.Get(b).request.name, y.Get(b).request.name);
    }
  }
}

TEST(FusionPlanner, GroupsCompatibleTensorsUpToThresholdLookingAhead) {
  std::vector<Response> rs;
  auto add = [&](const std::string& n, int64_t count, DataType d = DataType::kFloat32,
                 CollectiveType t = CollectiveType::kAllreduce) {
    Response r;
    r.request = Req(n, {count}, d, t);
    rs.push_back(r);
  };
  add("a", 100);                   // 0: 400 B
  add("b", 10, DataType::kInt32);  // 1: other dtype, skipped over by a's group
  add("c", 100);                   // 2: 400 B -> joins a
  add("d", 100);                   // 3: 400 B -> would exceed 1000 with a, c
  add("e", 1000);                  // 4: 4000 B > threshold: alone
  add("f", 10, DataType::kFloat32, CollectiveType::kBroadcast);  // 5: alone
  add("g", 10);                                                  // 6: 40 B -> joins a, c (840 B)
  auto groups = fusion::PlanFusion(rs, 1000);
  ASSERT_EQ(groups.size(), 5u);
  EXPECT_EQ(groups[0].members, (std::vector<size_t>{0, 2, 6}));
  EXPECT_TRUE(groups[0].fused);
  EXPECT_EQ(groups[0].bytes, 840u);
  EXPECT_EQ(groups[1].members, (std::vector<size_t>{1}));
  EXPECT_FALSE(groups[1].fused);
  EXPECT_EQ(groups[2].members, (std::vector<size_t>{3}));
  EXPECT_EQ(groups[3].members, (std::vector<size_t>{4}));
  EXPECT_EQ(groups[4].members, (std::vector<size_t>{5}));
  size_t planned = 0;
  for (const auto& g : groups) planned += g.members.size();
  EXPECT_EQ(planned, rs.size());
  auto none = fusion::PlanFusion(rs, 0);
  EXPECT_EQ(none.size(), rs.size());
  for (const auto& g : none) EXPECT_FALSE(g.fused);
}

}  // namespace
}  // namespace kolo::coordinator
