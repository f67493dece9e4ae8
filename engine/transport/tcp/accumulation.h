// One accumulating receive in progress (Pair::RecvAccumulate): reads deliver the message's bytes
// in pieces of any length, through a staging buffer; whole units are combined into the
// destination at once and a partial unit is carried to the front of the next read.
// Internal to the TCP transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "engine/transport/transport.h"

namespace kolo::transport::tcp {

class Accumulation {
 public:
  Accumulation() = default;
  // Combines into dst with `acc`. REQUIRES: 1 <= acc.unit <= Pair::kMaxAccumulateUnit.
  Accumulation(uint8_t* dst, const Accumulator& acc) : dst_(dst), acc_(acc) {}

  bool active() const { return acc_.add != nullptr; }
  // Bytes of a partial unit waiting for the rest of it.
  size_t carry_bytes() const { return carry_bytes_; }

  // Readies `staging` (which other receives may have used since) for the next read: puts the
  // carried bytes in front. Returns where the read goes; *room is how many bytes it may take.
  // REQUIRES: staging_bytes >= 2 * Pair::kMaxAccumulateUnit.
  uint8_t* Prepare(uint8_t* staging, size_t staging_bytes, size_t* room) {
    std::memcpy(staging, carry_, carry_bytes_);
    *room = staging_bytes - carry_bytes_;
    return staging + carry_bytes_;
  }

  // Combines the whole units of the carry plus the `got` bytes just read behind it, and keeps the
  // rest for the next read.
  void Consume(const uint8_t* staging, size_t got) {
    const size_t staged = carry_bytes_ + got;
    const size_t whole = staged - staged % acc_.unit;
    if (whole > 0) acc_.add(dst_, staging, whole, acc_.arg);
    dst_ += whole;
    carry_bytes_ = staged - whole;
    std::memcpy(carry_, staging + whole, carry_bytes_);
  }

 private:
  uint8_t* dst_ = nullptr;
  Accumulator acc_;
  uint8_t carry_[Pair::kMaxAccumulateUnit] = {};
  size_t carry_bytes_ = 0;
};

}  // namespace kolo::transport::tcp
