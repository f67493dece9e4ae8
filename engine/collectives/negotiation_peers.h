// The negotiation's link between ranks (coordinator::Peers) over a communicator: the bit-vector
// exchange as BitwiseAllreduce on a registered buffer of its own, the coordinator round's messages
// as GatherMessages and BroadcastMessage with rank 0 as the root.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/collectives/collectives.h"
#include "engine/coordinator/controller.h"

namespace kolo::collectives {

class NegotiationPeers final : public coordinator::Peers {
 public:
  // A buffer of `words` 64-bit words, registered with comm->device, for the bit exchange (at
  // least the and_words + or_words of every later call), and room for a riding payload of
  // RidingMaxBytes(riding_max_bytes, size), or, where the exchange goes through the host area
  // (BitExchangeThroughHostArea), riding_max_bytes but no more than a slot's bank leaves beside
  // the words. `comm` must outlive the result.
  static StatusOr<std::unique_ptr<NegotiationPeers>> Create(Comm* comm, size_t words,
                                                            size_t riding_max_bytes = 0);

  // The payload an exchange of `size` ranks carries at most, given Options::riding_max_bytes:
  // none at one rank; else riding_max_bytes, but no more than kRidingReceiveBytes over the
  // messages a rank receives (size - 1 in the direct exchange, up to direct_max_ranks; ceil(log2
  // size) in recursive doubling beyond), in whole 64-byte lines.
  static constexpr size_t kRidingReceiveBytes = 192 << 10;
  static size_t RidingMaxBytes(size_t riding_max_bytes, int size, int direct_max_ranks);

  Status BitwiseAllreduce(uint64_t* words, size_t and_words, size_t or_words) override;
  size_t RidingMaxBytes() const override { return riding_max_; }
  uint8_t* RidingSpace() override {
    return riding_max_ > 0 ? reinterpret_cast<uint8_t*>(bits_.data() + words_) : nullptr;
  }
  Status BitwiseAllreduceRiding(uint64_t* words, size_t and_words, size_t or_words,
                                coordinator::RidingPayload* payload) override;
  StatusOr<std::vector<std::vector<uint8_t>>> GatherAtRoot(
      const std::vector<uint8_t>& mine) override;
  StatusOr<std::vector<uint8_t>> BroadcastFromRoot(const std::vector<uint8_t>& message) override;

 private:
  explicit NegotiationPeers(Comm* comm) : comm_(comm) {}

  Comm* comm_;
  size_t words_ = 0;
  size_t riding_max_ = 0;
  std::vector<uint64_t> bits_;  // the words, then room for a payload
  std::unique_ptr<transport::Region> bits_region_;
  Scratch scratch_;
};

}  // namespace kolo::collectives
