#include "engine/transport/rdma/peer_info.h"

#include <cstring>

#include "engine/transport/rdma/wire_ids.h"

namespace kolo::transport::rdma {
namespace {

constexpr size_t kRecordHeaderBytes = 16;
constexpr size_t kMacBytes = 32;
constexpr uint32_t kInfoMagic = 0x414d4452;  // "RDMA"
constexpr uint32_t kInfoVersion = 1;
// Distinct labels: a record's MAC can never pass for a proof, nor the other way round.
constexpr std::string_view kInfoLabel = "kolo-rdma-info-v1";
constexpr std::string_view kProofLabel = "kolo-rdma-proof-v1";

void Encode(const PeerInfo& i, uint8_t* p) {
  p[0] = static_cast<uint8_t>(i.lid);
  p[1] = static_cast<uint8_t>(i.lid >> 8);
  std::memcpy(p + 2, i.gid, 16);
  Put32(p + 18, i.qpn);
  Put32(p + 22, i.psn);
  Put64(p + 26, i.ctrl_addr);
  Put32(p + 34, i.ctrl_rkey);
  std::memcpy(p + 38, i.nonce, 16);
  p[54] = i.mtu;
  p[55] = i.global;
}

PeerInfo Decode(const uint8_t* p) {
  PeerInfo i;
  i.lid = static_cast<uint16_t>(p[0] | (p[1] << 8));
  std::memcpy(i.gid, p + 2, 16);
  i.qpn = Get32(p + 18);
  i.psn = Get32(p + 22);
  i.ctrl_addr = Get64(p + 26);
  i.ctrl_rkey = Get32(p + 34);
  std::memcpy(i.nonce, p + 38, 16);
  i.mtu = p[54];
  i.global = p[55];
  return i;
}

Digest InfoMac(std::string_view secret, const uint8_t* body, size_t n) {
  std::vector<uint8_t> m(kInfoLabel.begin(), kInfoLabel.end());
  m.insert(m.end(), body, body + n);
  return HmacSha256(secret, m.data(), m.size());
}

size_t BodyBytes(int size) {
  return kRecordHeaderBytes + static_cast<size_t>(size) * PeerInfo::kBytes;
}

}  // namespace

std::vector<uint8_t> EncodeInfoRecord(std::string_view secret, int rank, int size,
                                      const std::vector<PeerInfo>& infos) {
  std::vector<uint8_t> record(BodyBytes(size), 0);
  Put32(record.data(), kInfoMagic);
  Put32(record.data() + 4, kInfoVersion);
  Put32(record.data() + 8, static_cast<uint32_t>(rank));
  Put32(record.data() + 12, static_cast<uint32_t>(size));
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    Encode(infos[static_cast<size_t>(peer)],
           record.data() + kRecordHeaderBytes + static_cast<size_t>(peer) * PeerInfo::kBytes);
  }
  const Digest mac = InfoMac(secret, record.data(), record.size());
  record.insert(record.end(), mac.begin(), mac.end());
  return record;
}

StatusOr<PeerInfo> DecodeInfoRecord(std::string_view secret, const std::vector<uint8_t>& record,
                                    int from, int to, int size) {
  const uint8_t* v = record.data();
  const size_t body = BodyBytes(size);
  if (record.size() != body + kMacBytes || Get32(v) != kInfoMagic || Get32(v + 4) != kInfoVersion ||
      Get32(v + 8) != static_cast<uint32_t>(from) || Get32(v + 12) != static_cast<uint32_t>(size)) {
    return Unavailable(
        "rank {}: the RDMA set-up record of rank {} is malformed or from a job of another size", to,
        from);
  }
  Digest got;
  std::memcpy(got.data(), v + body, kMacBytes);
  if (!DigestsEqual(got, InfoMac(secret, v, body))) {
    return Unavailable(
        "rank {}: the RDMA set-up record of rank {} fails authentication (wrong job secret?)", to,
        from);
  }
  return Decode(v + kRecordHeaderBytes + static_cast<size_t>(to) * PeerInfo::kBytes);
}

Digest ProofMac(std::string_view secret, int from, int to, const PeerInfo& from_info,
                const PeerInfo& to_info) {
  std::vector<uint8_t> m(kProofLabel.begin(), kProofLabel.end());
  uint8_t b[4 + 4 + 16 + 16 + 4 + 4];
  Put32(b, static_cast<uint32_t>(from));
  Put32(b + 4, static_cast<uint32_t>(to));
  std::memcpy(b + 8, from_info.nonce, 16);
  std::memcpy(b + 24, to_info.nonce, 16);
  Put32(b + 40, from_info.qpn);
  Put32(b + 44, to_info.qpn);
  m.insert(m.end(), b, b + sizeof b);
  return HmacSha256(secret, m.data(), m.size());
}

}  // namespace kolo::transport::rdma
