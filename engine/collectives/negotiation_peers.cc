#include "engine/collectives/negotiation_peers.h"

#include <algorithm>
#include <cstring>

#include "engine/transport/shm/host_area.h"

namespace kolo::collectives {

size_t NegotiationPeers::RidingMaxBytes(size_t riding_max_bytes, int size, int direct_max_ranks) {
  if (size <= 1) return 0;
  // The messages a rank receives: one from every peer in the direct exchange, one a round (and a
  // fold) in recursive doubling.
  size_t receives = static_cast<size_t>(size - 1);
  if (size > direct_max_ranks) {
    receives = 1;
    while ((size_t{1} << receives) < static_cast<size_t>(size)) ++receives;
  }
  const size_t cap = std::min(riding_max_bytes, kRidingReceiveBytes / receives);
  return cap / 64 * 64;
}

StatusOr<std::unique_ptr<NegotiationPeers>> NegotiationPeers::Create(Comm* comm, size_t words,
                                                                     size_t riding_max_bytes) {
  std::unique_ptr<NegotiationPeers> peers(new NegotiationPeers(comm));
  peers->words_ = words;
  const size_t word_bytes = words * sizeof(uint64_t);
  if (BitExchangeThroughHostArea(*comm, word_bytes)) {
    // Through the host area the payload shares the words' bank of a slot.
    const size_t room = comm->host_area->slot_bytes() - word_bytes;
    peers->riding_max_ = std::min(riding_max_bytes, room) / 64 * 64;
  } else {
    peers->riding_max_ =
        RidingMaxBytes(riding_max_bytes, comm->size(), comm->bitwise_direct_max_ranks);
  }
  peers->bits_.assign(words + peers->riding_max_ / sizeof(uint64_t), 0);
  KOLO_ASSIGN_OR_RETURN(
      peers->bits_region_,
      comm->device->Register(peers->bits_.data(), peers->bits_.size() * sizeof(uint64_t)));
  return peers;
}

Status NegotiationPeers::BitwiseAllreduceRiding(uint64_t* words, size_t and_words, size_t or_words,
                                                coordinator::RidingPayload* payload) {
  payload->summed = false;
  const size_t n = and_words + or_words;
  if (n > words_ || payload->bytes > riding_max_) {
    return InvalidArgument(
        "bit exchange of {} words and {} payload bytes; the registered buffer holds {} and {}", n,
        payload->bytes, words_, riding_max_);
  }
  // The payload goes right after the words sent; RidingSpace() is there when they are all.
  auto* at = reinterpret_cast<uint8_t*>(bits_.data());
  std::memcpy(at, words, n * sizeof(uint64_t));
  uint8_t* space = at + n * sizeof(uint64_t);
  if (payload->bytes > 0 && payload->data != space) {
    std::memmove(space, payload->data, payload->bytes);
  }
  KOLO_RETURN_IF_ERROR(collectives::BitwiseAllreduceRiding(
      *comm_, *bits_region_, and_words, or_words, payload->bytes, riding_max_, payload->dtype,
      payload->sum, &payload->summed, scratch_));
  std::memcpy(words, bits_.data(), n * sizeof(uint64_t));
  return Status::OK();
}

Status NegotiationPeers::BitwiseAllreduce(uint64_t* words, size_t and_words, size_t or_words) {
  const size_t n = and_words + or_words;
  if (n > words_) {
    return InvalidArgument("bit exchange of {} words; the registered buffer holds {}", n, words_);
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
