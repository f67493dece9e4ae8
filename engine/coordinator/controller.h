// The negotiation protocol: which submitted tensors are ready on every rank, agreed in one order
// (engine/docs/negotiation.md). One Controller per rank, driven by the engine's background thread;
// it knows requests, the response cache and (rank 0) the coordinator's table, and nothing of
// buffers, fusion or transports: it talks to the other ranks' controllers through Peers and reads
// time from a Clock, so tests run it with in-memory peers and a fake clock, and a simulator can
// link it without sockets.
//
// Per cycle: Add() each tensor drained from the submission queue, then Negotiate() once. In steady
// state (every name in the response cache) Negotiate is one bit-vector allreduce: cache hits ANDed,
// a flags word and invalidated cache bits ORed. When some rank has a tensor the cache does not
// hold (or a hit that waited past the stall time, or rank 0 a stall check due), every rank also
// takes part in a coordinator round: requests gathered at rank 0, whose table answers one ordered
// list of responses (collectives ready everywhere, or errors) that every rank receives.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/common/status.h"
#include "engine/coordinator/message.h"
#include "engine/coordinator/message_table.h"
#include "engine/coordinator/response_cache.h"

namespace kolo::coordinator {

using SteadyClock = std::chrono::steady_clock;

// Where the controller reads the time: the steady clock in the engine, a hand-advanced one in
// tests.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual SteadyClock::time_point Now() = 0;
};

// The steady clock.
Clock& SystemClock();

// The controller's link to the other ranks' controllers. Every rank calls the same operation in
// the same order; each returns an error naming the failed peer, within the transport's timeout.
// A small allreduce's data riding along one bit exchange (Controller::SetRiding): this rank's
// bytes, and every rank's summed in rank order (the same bits on every rank) where every rank sent
// as many.
struct RidingPayload {
  // This rank's bytes: where Peers::RidingSpace() points (no copy), else anywhere.
  uint8_t* data = nullptr;
  size_t bytes = 0;  // 0: nothing rides
  DataType dtype = DataType::kFloat32;
  uint8_t* sum = nullptr;  // `bytes` bytes: the sum, where summed
  bool summed = false;     // set by the exchange
};

class Peers {
 public:
  virtual ~Peers() = default;
  // In place on words[0, and_words + or_words): the first and_words ANDed over every rank, the
  // rest ORed.
  virtual Status BitwiseAllreduce(uint64_t* words, size_t and_words, size_t or_words) = 0;
  // The most payload bytes one exchange can carry, the same on every rank; 0: none.
  virtual size_t RidingMaxBytes() const { return 0; }
  // RidingMaxBytes() bytes the exchange sends the payload from: a payload written there travels
  // without a copy. Null where there is none.
  virtual uint8_t* RidingSpace() { return nullptr; }
  // BitwiseAllreduce with `payload` riding along (at most RidingMaxBytes(); its bytes may be 0,
  // and may differ between ranks): sets payload->summed, and the sum, where every rank sent as
  // many bytes.
  virtual Status BitwiseAllreduceRiding(uint64_t* words, size_t and_words, size_t or_words,
                                        RidingPayload* payload) {
    payload->summed = false;
    return BitwiseAllreduce(words, and_words, or_words);
  }
  // Rank 0 receives every rank's message in rank order (its own included); other ranks get none.
  virtual StatusOr<std::vector<std::vector<uint8_t>>> GatherAtRoot(
      const std::vector<uint8_t>& mine) = 0;
  // Every rank receives rank 0's message (the argument on rank 0; ignored elsewhere).
  virtual StatusOr<std::vector<uint8_t>> BroadcastFromRoot(const std::vector<uint8_t>& message) = 0;
};

struct ControllerSettings {
  int rank = 0;
  int size = 1;
  int cache_capacity = 1024;  // response-cache entries; 0: no cache
  // Rank 0 warns about a tensor some ranks submitted and others not after this long (0: never),
  // and fails it after stall_shutdown_s (0: never). Options::stall_warning_s, stall_shutdown_s.
  double stall_warning_s = 60.0;
  double stall_shutdown_s = 0.0;
};

// What one Negotiate call did, for the engine's statistics.
struct NegotiationStats {
  int64_t cache_hits = 0;  // tensors agreed through the response cache
  int64_t rounds = 0;      // coordinator rounds (0 or 1)
  // The responses are exactly the cache hits every rank offered, and the payload that rode the
  // exchange (SetRiding) holds their allreduce, summed: they need no collective of their own.
  bool riding = false;
};

// What the engine puts on an exchange (Controller::SetRiding): given the cache hits this rank
// offers, in bit order (the order their responses would have), writes their data (at most
// max_bytes) to payload->data when it is set (Peers::RidingSpace), else points it at a buffer of
// its own, fills in the rest of `payload` and returns true; or returns false to send none.
using RidingPrepare = std::function<bool(const std::vector<const Request*>& hits, size_t max_bytes,
                                         RidingPayload* payload)>;

class Controller {
 public:
  // How often rank 0 inspects its table for stalls while something waits there.
  static constexpr auto kStallCheckEvery = std::chrono::seconds(1);

  // `peers` and `clock` must outlive the controller.
  Controller(const ControllerSettings& settings, Peers& peers, Clock& clock);

  // The most 64-bit words one Negotiate exchanges through Peers::BitwiseAllreduce.
  static size_t ExchangeWords(const ControllerSettings& settings);

  // A tensor drained from this rank's submission queue, submitted at `submitted`. Looks its
  // request up in the response cache: a hit waits for the bit exchange; a miss, or an entry whose
  // request differs (which every rank then drops from its cache), is reported to the coordinator
  // at the next round. REQUIRES: no tensor of that name is pending here.
  void Add(const Request& request, SteadyClock::time_point submitted);

  // Whether this rank knows something its peers need for agreement (besides new submissions
  // still in the engine's queue): tensors added since the last exchange, requests to report, a
  // cache hit that has waited past the stall time, or (rank 0) a stall check due.
  bool HasNews(SteadyClock::time_point now) const;
  // While the engine is idle: the time at which HasNews will turn true by itself (a hit's stall
  // time, rank 0's next stall check); max() when nothing is due.
  SteadyClock::time_point NextDue() const;
  // Whether a tensor added since the last exchange is one some peer offered in that exchange
  // (a response-cache hit there and here) or, for a request to report, whether other ranks
  // reported theirs then: peers wait on this rank, and its next exchange should start at once.
  bool Urgent() const { return urgent_; }

  // One agreement with every other rank. Appends to *responses, in the same order on every rank,
  // the collectives ready everywhere (cache hits in bit order, then the coordinator's list) and
  // error responses (mismatched requests, stalls past stall_shutdown_s; these may name tensors
  // this rank never submitted). A tensor leaves this controller once a response names it. Sets
  // *stop when some rank asked to shut down (`shutdown` is this rank's request).
  Status Negotiate(bool shutdown, std::vector<Response>* responses, bool* stop,
                   NegotiationStats* stats);

  // Tensors added and not yet named by a response.
  size_t pending() const { return pending_.size(); }
  // Whether the last Negotiate failed with an error every rank reaches on its own in the same
  // exchange (ranks out of step, a stall past the shutdown time): no rank needs telling, so the
  // engine need not abort its peers (whose abort would overtake the message that tells them why).
  bool FailedEverywhere() const { return failed_everywhere_; }
  // After a Negotiate that set *stop: the rank that asked to shut down, or kSeveralRanks when more
  // than one did; -1 before.
  static constexpr int kSeveralRanks = -2;
  int ShutDownBy() const { return shut_down_by_; }
  // Forgets every pending tensor (after a fatal error, the engine fails them itself).
  void Clear();

  // Small allreduces ride the bit exchange. Where this rank's news is only cache hits and Peers
  // can carry a payload, `prepare` may put their data on the exchange; when every rank offered
  // exactly the same hits and nothing else (no request to report, no invalidation, no shutdown),
  // Negotiate sets NegotiationStats::riding and the payload's sum is their result: one exchange
  // instead of an exchange and then a collective. Every rank must set the same (or none).
  void SetRiding(RidingPrepare prepare) { riding_ = std::move(prepare); }

  const ResponseCache& cache() const { return cache_; }

 private:
  struct Entry {
    Request request;
    SteadyClock::time_point submitted;
    int64_t order = 0;   // Add() order: a single rank's responses follow it
    int cache_bit = -1;  // >= 0 while waiting as a response-cache hit
  };

  using PendingMap = std::unordered_map<std::string, Entry>;

  // Takes `name` out of pending_, keeping its node (and the capacity of its strings) for a later
  // Add: a steady step adds and agrees hundreds of tensors, and allocating and freeing a node and
  // its request for each costs more than the bit exchange itself.
  void Release(PendingMap::iterator it);
  Status CoordinatorRound(std::vector<Response>* responses);
  // The step check of an exchange failed (ranks sent different words): finds out what each rank
  // has agreed and returns the error naming them, on every rank.
  Status OutOfStep(const uint64_t (&check)[2]);
  void InspectStalls(SteadyClock::time_point now, std::vector<Response>* errors);
  // Recomputes hit_stall_due_ from the pending cache hits.
  void UpdateHitStallDue();

  const ControllerSettings settings_;
  Peers& peers_;
  Clock& clock_;
  // How long a tensor may wait here as a response-cache hit before this rank hands it back to the
  // coordinator, whose table sees stalls: the stall warning time, or the shutdown time if that is
  // shorter or the only one set. Zero when stall inspection is off.
  const SteadyClock::duration hit_stall_after_;

  RidingPrepare riding_;
  // Negotiate's riding scratch, kept between cycles: the offered hits' requests and bits.
  std::vector<const Request*> riding_hits_;
  std::vector<uint64_t> riding_offered_;
  ResponseCache cache_;
  std::optional<MessageTable> table_;  // rank 0
  PendingMap pending_;
  std::vector<PendingMap::node_type> spare_;  // released nodes, reused by Add
  int64_t next_order_ = 0;
  std::vector<std::string> unreported_;  // to report at the next coordinator round
  bool fresh_ = false;                   // tensors were added since the last exchange
  bool urgent_ = false;                  // see Urgent()
  // Cache bits offered by some rank and agreed by none in the last exchange; whether others
  // reported requests to the coordinator in it while this rank had none.
  std::vector<uint64_t> awaited_;
  bool others_reported_ = false;
  // The cycle's bit vector (its layout: Layout in controller.cc).
  std::vector<uint64_t> bits_;
  // The step check (negotiation.md): exchanges done, a running fingerprint of every response
  // handed out, how many, and the last one's name (for the error).
  bool failed_everywhere_ = false;
  int shut_down_by_ = -1;
  uint64_t exchanges_ = 0;
  uint64_t history_ = 0;
  int64_t agreed_ = 0;
  std::string last_agreed_;
  SteadyClock::time_point last_stall_check_;
  // When the oldest pending cache hit will have waited hit_stall_after_; max() when none will.
  SteadyClock::time_point hit_stall_due_ = SteadyClock::time_point::max();
  std::unordered_map<std::string, SteadyClock::time_point> stall_warned_;  // rank 0
};

}  // namespace kolo::coordinator
