// Philox4x32-10, bit-identical to Triton's tl.rand4x / tl.randint4x and to
// specdec_kernels/reference/philox.py (docs/design.md §4): the uniform of draw index i on (seed, position,
// stream) is word (i & 3) of the call with offset = (position << 32) | (stream << 30) | (i >> 2), i.e.
// counter (offset_lo, offset_hi, 0, 0) and key (seed_lo, seed_hi); each word is folded
// (w >= 2^31 -> 2^32 - 1 - w), converted to float32 and multiplied by float32 4.6566127342e-10.
// Draw indices: the vocabulary index v for an entry's noise, kBlockDraws + b for vocabulary block b
// (two-level Gumbel-max, gumbel.h), the sibling slot for acceptance coins (0 in chains).
#pragma once

#include "specdec/core/common.h"

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

constexpr uint32_t kBlockDraws = 1u << 30;  // draw index of vocabulary block 0 (reference BLOCK_DRAWS)

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

// The four words of counter (c0, c1, 0, 0) (Triton's randint4x).
SPECDEC_HD void philox_words(const PhiloxKey& key, uint32_t c0, uint32_t c1, uint32_t out[4]) {
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
    const uint32_t n2 = static_cast<uint32_t>(pa >> 32) ^ c3 ^ key.k1[r];
    c1 = static_cast<uint32_t>(pb);
    c3 = static_cast<uint32_t>(pa);
    c0 = n0;
    c2 = n2;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// First word of counter (c0, c1, 0, 0) (Triton's randint).
SPECDEC_HD uint32_t philox_word(const PhiloxKey& key, uint32_t c0, uint32_t c1) {
  uint32_t w[4];
  philox_words(key, c0, c1, w);
  return w[0];
}

// The 31-bit integer of a word that philox_uniform scales (the searches compare it with thresholds).
SPECDEC_HD uint32_t fold_word(uint32_t word) { return word >= 0x80000000u ? ~word : word; }

// Triton's uint_to_uniform_float for 32-bit words.
SPECDEC_HD float philox_uniform(uint32_t word) {
  return static_cast<float>(static_cast<int32_t>(fold_word(word))) * kUniformScale;
}

// Low and high counter words of draw index i: offset = (position << 32) | (stream << 30) | (i >> 2).
SPECDEC_HD uint32_t philox_offset_lo(int stream, uint32_t i) { return (static_cast<uint32_t>(stream) << 30) | (i >> 2); }
SPECDEC_HD uint32_t philox_offset_hi(int64_t position) { return static_cast<uint32_t>(position); }

// Uniform of draw index i, given the key and the position word hi = philox_offset_hi(position).
SPECDEC_HD float philox_draw(const PhiloxKey& key, uint32_t hi, int stream, uint32_t i) {
  uint32_t w[4];
  philox_words(key, philox_offset_lo(stream, i), hi, w);
  return philox_uniform(w[i & 3]);
}

// u = uniform(seed, position, stream, i) (reference/philox.py).
SPECDEC_HD float philox_rand(int64_t seed, int64_t position, int stream, uint32_t i) {
  return philox_draw(philox_key(seed), philox_offset_hi(position), stream, i);
}

// Sequence-level coins of block and traversal verification (reference/philox.py sequence_coins):
// u = uniform(seed, position | 2^31, stream 0, index), position = the round's first position.
constexpr int64_t kSequenceCoinFlag = int64_t{1} << 31;
SPECDEC_HD float sequence_coin(int64_t seed, int64_t position, uint32_t index) {
  return philox_rand(seed, position | kSequenceCoinFlag, kStreamCoin, index);
}

SPECDEC_NS_END
