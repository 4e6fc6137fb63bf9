// Philox4x32-10, bit-identical to Triton's tl.rand(seed, offset) and to
// specdec_kernels/reference/philox.py (DESIGN.md §4):
//   u = rand(seed, offset),  offset = (position << 32) | (stream << 30) | v.
// Counter (offset_lo, offset_hi, 0, 0), key (seed_lo, seed_hi); the first output word is folded
// (w >= 2^31 -> 2^32 - 1 - w), converted to float32 and multiplied by float32 4.6566127342e-10.
#pragma once

#include "common.h"

namespace specdec {

// Round keys of one seed: rounds use (k0 + r * KEY_A, k1 + r * KEY_B) mod 2^32.
constexpr int kPhiloxRounds = 10;
struct PhiloxKey {
  uint32_t k0[kPhiloxRounds];
  uint32_t k1[kPhiloxRounds];
};

}  // namespace specdec

SPECDEC_NS_BEGIN

constexpr uint32_t kPhiloxRoundA = 0xD2511F53u;
constexpr uint32_t kPhiloxRoundB = 0xCD9E8D57u;
constexpr uint32_t kPhiloxKeyA = 0x9E3779B9u;
constexpr uint32_t kPhiloxKeyB = 0xBB67AE85u;
constexpr float kUniformScale = 4.6566127342e-10f;

constexpr int kStreamCoin = 0;
constexpr int kStreamRecovery = 1;
constexpr int kStreamBonus = 2;

SPECDEC_HD PhiloxKey philox_key(int64_t seed) {
  PhiloxKey key;
  uint32_t a = static_cast<uint32_t>(static_cast<uint64_t>(seed));
  uint32_t b = static_cast<uint32_t>(static_cast<uint64_t>(seed) >> 32);
  for (int r = 0; r < kPhiloxRounds; ++r) {
    key.k0[r] = a;
    key.k1[r] = b;
    a += kPhiloxKeyA;
    b += kPhiloxKeyB;
  }
  return key;
}

// First Philox word for counter (c0, c1, 0, 0). Written as straight-line integer code so that
// compilers vectorise loops over c0 (one vocabulary index per lane).
SPECDEC_HD uint32_t philox_word(const PhiloxKey& key, uint32_t c0, uint32_t c1) {
  uint32_t c2 = 0, c3 = 0;
#if defined(__CUDA_ARCH__)
#pragma unroll
#elif defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#pragma GCC unroll 10
#endif
  for (int r = 0; r < kPhiloxRounds; ++r) {
    const uint64_t pb = static_cast<uint64_t>(kPhiloxRoundB) * c2;
    const uint64_t pa = static_cast<uint64_t>(kPhiloxRoundA) * c0;
    const uint32_t n0 = static_cast<uint32_t>(pb >> 32) ^ c1 ^ key.k0[r];
    const uint32_t n1 = static_cast<uint32_t>(pb);
    const uint32_t n2 = static_cast<uint32_t>(pa >> 32) ^ c3 ^ key.k1[r];
    const uint32_t n3 = static_cast<uint32_t>(pa);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return c0;
}

// Triton's uint_to_uniform_float for 32-bit words.
SPECDEC_HD float philox_uniform(uint32_t word) {
  const uint32_t folded = word >= 0x80000000u ? ~word : word;
  return static_cast<float>(static_cast<int32_t>(folded)) * kUniformScale;
}

// Low and high counter words of offset = (position << 32) | (stream << 30) | v.
SPECDEC_HD uint32_t philox_offset_lo(int stream, uint32_t v) { return (static_cast<uint32_t>(stream) << 30) | v; }
SPECDEC_HD uint32_t philox_offset_hi(int64_t position) { return static_cast<uint32_t>(position); }

// u = rand(seed, (position << 32) | (stream << 30) | v).
SPECDEC_HD float philox_rand(int64_t seed, int64_t position, int stream, uint32_t v) {
  const PhiloxKey key = philox_key(seed);
  return philox_uniform(philox_word(key, philox_offset_lo(stream, v), philox_offset_hi(position)));
}

// Sequence-level coins of block and traversal verification (reference/philox.py sequence_coins):
// u = rand(seed, ((position | 2^31) << 32) | index), position = the round's first position.
constexpr int64_t kSequenceCoinFlag = int64_t{1} << 31;
SPECDEC_HD float sequence_coin(int64_t seed, int64_t position, uint32_t index) {
  return philox_rand(seed, position | kSequenceCoinFlag, kStreamCoin, index);
}

SPECDEC_NS_END
