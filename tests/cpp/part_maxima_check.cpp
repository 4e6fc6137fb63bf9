// Bit-for-bit check of the residual searches' part maxima (gumbel_search.h z_part_maxima: with AVX-512BW,
// 16-bit logits take the four parts' integer extremes and one transposed reduction) against z_group_max of
// each part and against a scalar max of sanitize(x / T), on bf16 and fp16 groups built around what the
// integer shortcut reads: random signs, all-negative parts, one spike per part at a position that moves
// with the trial (largest or smallest, of either sign), +-0, -inf, +inf and NaN of either sign, two
// temperatures. Built and run by tests/test_native.py once per instruction set; prints "compared N
// different D".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "specdec/row_ops.h"

using namespace specdec;

static uint16_t to_bits(float x, DType d) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  if (d == DType::kBFloat16) return static_cast<uint16_t>(u >> 16);  // truncation: any 16-bit pattern will do
  // fp16 by way of the float's fields (round toward zero, enough for test values)
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
  if (x != x) return static_cast<uint16_t>(sign | 0x7E00u);
  if (std::isinf(x) || exp >= 31) return static_cast<uint16_t>(sign | 0x7C00u);
  if (exp <= 0) return static_cast<uint16_t>(sign);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | ((u >> 13) & 0x3FFu));
}

template <DType D>
long check(const std::vector<uint16_t>& row, int64_t vocab, float temperature, long* compared) {
  const ZSource z{row.data(), D, temperature, vocab};
  const auto differ = [](float a, float b) { return std::memcmp(&a, &b, sizeof(a)) != 0; };
  long bad = 0;
  for (int64_t b0 = 0; b0 < (vocab + kBlock - 1) / kBlock; b0 += kGroupBlocks) {
    const int nb = static_cast<int>(std::min<int64_t>(kGroupBlocks, (vocab + kBlock - 1) / kBlock - b0));
    float part[kParts];
    const float best = z_part_maxima<D>(z, b0, nb, part);
    float want_best = -kInf;
    for (int q = 0; q < kParts; ++q) {
      const int n = nb - q * kPartBlocks < kPartBlocks ? nb - q * kPartBlocks : kPartBlocks;
      float want = -kInf;
      if (n > 0) {
        want = z_group_max<D>(z, b0 + q * kPartBlocks, n);
        float scalar = -kInf;  // the plain definition
        const int64_t first = (b0 + q * kPartBlocks) * kBlock;
        const int64_t last = std::min<int64_t>(first + static_cast<int64_t>(n) * kBlock, vocab);
        for (int64_t v = first; v < last; ++v) scalar = std::max(scalar, z.z(v));
        bad += differ(want, scalar);
      }
      bad += differ(part[q], want);
      want_best = std::max(want_best, want);
      *compared += 1;
    }
    bad += differ(best, want_best);
  }
  return bad;
}

template <DType D>
long run(long* compared) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t vocab = 8 * kGroup + 77;  // whole groups, then a partial one
  const int part = kPartBlocks * kBlock;
  long bad = 0;
  const uint16_t nan = D == DType::kBFloat16 ? 0x7FC0 : 0x7E00, inf = D == DType::kBFloat16 ? 0x7F80 : 0x7C00;
  for (int trial = 0; trial < 40; ++trial) {
    std::vector<uint16_t> row(vocab);
    const int kind = trial % 5;  // 0 random signs, 1 all negative, 2 all positive, 3 +-0 and -inf, 4 specials
    for (auto& x : row) {
      const float v = normal(rng);
      x = to_bits(kind == 1 ? -std::fabs(v) - 0.01f : kind == 2 ? std::fabs(v) + 0.01f : v, D);
    }
    if (kind == 3) {
      for (int64_t v = 0; v < vocab; v += 3) row[v] = (v / 3) % 2 ? 0x8000 : 0x0000;
      for (int64_t v = 1; v < vocab; v += 3) row[v] = to_bits(-kInf, D);
      for (int64_t v = 0; v < part; ++v) row[v] = to_bits(-kInf, D);  // a part of -inf only
    }
    if (kind == 4) {
      row[rng() % vocab] = nan;
      row[rng() % vocab] = static_cast<uint16_t>(nan | 0x8000);
      row[rng() % vocab] = inf;
      row[rng() % vocab] = static_cast<uint16_t>(inf | 0x8000);
      for (int64_t v = part; v < 2 * part; ++v) row[v] = static_cast<uint16_t>(nan | 0x8000);  // only -NaN
    }
    // One spike per part of the first four groups, at a position that moves with the part and the trial:
    // the part's largest or smallest entry, of either sign.
    for (int64_t p0 = 0; p0 + part <= 4 * kGroup; p0 += part) {
      const int64_t at = p0 + (p0 / part * 37 + trial * 11) % part;
      const float s = (trial / 5) % 2 ? 40.0f : -40.0f;
      row[at] = to_bits((p0 / part) % 2 ? s : -s * 0.01f, D);
    }
    for (float t : {1.0f, 0.7f}) bad += check<D>(row, vocab, t, compared);
  }
  return bad;
}

int main() {
  long compared = 0;
  const long bad = run<DType::kBFloat16>(&compared) + run<DType::kFloat16>(&compared);
  std::printf("compared %ld different %ld\n", compared, bad);
  return 0;
}
