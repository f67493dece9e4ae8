#include "engine/collectives/negotiation_peers.h"

#include <cstring>

namespace kolo::collectives {

StatusOr<std::unique_ptr<NegotiationPeers>> NegotiationPeers::Create(Comm* comm, size_t words) {
  std::unique_ptr<NegotiationPeers> peers(new NegotiationPeers(comm));
  peers->bits_.assign(words, 0);
  KOLO_ASSIGN_OR_RETURN(peers->bits_region_,
                        comm->device->Register(peers->bits_.data(), words * sizeof(uint64_t)));
  return peers;
}

Status NegotiationPeers::BitwiseAllreduce(uint64_t* words, size_t and_words, size_t or_words) {
  const size_t n = and_words + or_words;
  if (n > bits_.size()) {
    return InvalidArgument("bit exchange of {} words; the registered buffer holds {}", n,
                           bits_.size());
  }
  std::memcpy(bits_.data(), words, n * sizeof(uint64_t));
  KOLO_RETURN_IF_ERROR(
      collectives::BitwiseAllreduce(*comm_, *bits_region_, and_words, or_words, scratch_));
  std::memcpy(words, bits_.data(), n * sizeof(uint64_t));
  return Status::OK();
}

StatusOr<std::vector<std::vector<uint8_t>>> NegotiationPeers::GatherAtRoot(
    const std::vector<uint8_t>& mine) {
  return GatherMessages(*comm_, 0, mine);
}

StatusOr<std::vector<uint8_t>> NegotiationPeers::BroadcastFromRoot(
    const std::vector<uint8_t>& message) {
  return BroadcastMessage(*comm_, 0, message);
}

}  // namespace kolo::collectives
