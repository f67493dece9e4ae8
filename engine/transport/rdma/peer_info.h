// The RDMA transport's set-up records (the protocol is described in device.h). Internal to rdma/.
//
// Each rank publishes one record: a 16-byte header (magic "RDMA", version 1, its rank, the job
// size), one PeerInfo per rank (what it tells that rank about its end of their QP; its own slot is
// zero) and an HMAC-SHA-256 of all of it under the job secret. After the QPs are up each side
// writes a proof over its QP, HMAC(secret, label, both ranks, both nonces, both QP numbers), which
// the other checks: the endpoint at the end of the QP knows the secret.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/common/crypto.h"
#include "engine/common/status.h"

namespace kolo::transport::rdma {

// What rank A tells rank B about A's end of their QP.
struct PeerInfo {
  uint16_t lid = 0;
  uint8_t gid[16] = {};
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint64_t ctrl_addr = 0;  // the control block B writes into, and its key
  uint32_t ctrl_rkey = 0;
  uint8_t nonce[16] = {};  // fresh per connection: a proof cannot be replayed
  uint8_t mtu = 0;         // ibv_mtu
  uint8_t global = 0;      // route by GID
  static constexpr size_t kBytes = 2 + 16 + 4 + 4 + 8 + 4 + 16 + 1 + 1;
};

// The record `rank` of a job of `size` publishes, `infos[p]` for each peer p (infos[rank] is not
// sent). REQUIRES: infos.size() == size.
std::vector<uint8_t> EncodeInfoRecord(std::string_view secret, int rank, int size,
                                      const std::vector<PeerInfo>& infos);

// What the record of rank `from` tells rank `to`. Unavailable, naming both ranks, when the record
// is malformed, from a job of another size, or fails authentication (wrong job secret).
StatusOr<PeerInfo> DecodeInfoRecord(std::string_view secret, const std::vector<uint8_t>& record,
                                    int from, int to, int size);

// The proof rank `from` writes over its QP to rank `to`.
Digest ProofMac(std::string_view secret, int from, int to, const PeerInfo& from_info,
                const PeerInfo& to_info);

}  // namespace kolo::transport::rdma
