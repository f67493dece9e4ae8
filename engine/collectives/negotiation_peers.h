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
  // least the and_words + or_words of every later call). `comm` must outlive the result.
  static StatusOr<std::unique_ptr<NegotiationPeers>> Create(Comm* comm, size_t words);

  Status BitwiseAllreduce(uint64_t* words, size_t and_words, size_t or_words) override;
  StatusOr<std::vector<std::vector<uint8_t>>> GatherAtRoot(
      const std::vector<uint8_t>& mine) override;
  StatusOr<std::vector<uint8_t>> BroadcastFromRoot(const std::vector<uint8_t>& message) override;

 private:
  explicit NegotiationPeers(Comm* comm) : comm_(comm) {}

  Comm* comm_;
  std::vector<uint64_t> bits_;
  std::unique_ptr<transport::Region> bits_region_;
  Scratch scratch_;
};

}  // namespace kolo::collectives
