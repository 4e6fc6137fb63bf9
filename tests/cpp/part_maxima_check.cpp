// Bit-for-bit check of the residual searches' part maxima (gumbel_search.h z_part_maxima: with AVX-512BW,
// 16-bit logits take the four parts' integer extremes and one transposed reduction) against z_group_max of
// each part and against a scalar max of sanitize(x / T), on bf16 and fp16 groups built around what the
// integer shortcut reads: random signs, all-negative parts, one spike per part at a position that moves
// with the trial (largest or smallest, of either sign), +-0, -inf, +inf and NaN of either sign, two
// temperatures. The same rows, and float32 rows with the same specials, check the unit maxima of rejected
// rows (unit_maxima_t): every unit's value against z_group_max of its blocks, the returned argmax against
// greedy_argmax_t, the row cut in two slices anywhere on a unit, and unit_part_maxima against z_part_maxima
// at every group start a slice can have. Built and run by tests/native/test_native.py once per instruction set;
// prints "compared N different D units N different D".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "specdec/cpu/row_ops.h"

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

// The unit maxima of a row against z_group_max, greedy_argmax_t and z_part_maxima (file comment).
template <DType D, class E>
long check_units(const std::vector<E>& row, int64_t vocab, float temperature, long* compared) {
  const ZSource z{row.data(), D, temperature, vocab};
  const auto differ = [](float a, float b) { return std::memcmp(&a, &b, sizeof(a)) != 0; };
  const auto same = [&](ArgMax a, ArgMax b) { return !differ(a.value, b.value) && a.index == b.index; };
  const int64_t num_units = (vocab + kUnit - 1) / kUnit, num_blocks = (vocab + kBlock - 1) / kBlock;
  long bad = 0;
  std::vector<float> units(num_units, 1234.5f);
  const ArgMax want = greedy_argmax_t<D>(row.data(), 0, vocab);
  bad += !same(unit_maxima_t<D>(row.data(), temperature, 0, vocab, units.data()), want);
  *compared += 1;
  for (int64_t u = 0; u < num_units; ++u) {
    const int n = static_cast<int>(std::min<int64_t>(kUnitBlocks, num_blocks - u * kUnitBlocks));
    bad += differ(units[u], z_group_max<D>(z, u * kUnitBlocks, n));
    *compared += 1;
  }
  for (int64_t cut = kUnit; cut < vocab; cut += 7 * kUnit) {  // two slices, as a split pass cuts the row
    std::vector<float> sliced(num_units, -1234.5f);
    const ArgMax a = unit_maxima_t<D>(row.data(), temperature, 0, cut, sliced.data());
    const ArgMax b = unit_maxima_t<D>(row.data(), temperature, cut, vocab, sliced.data());
    bad += !same(better(a, b), want) || std::memcmp(sliced.data(), units.data(), num_units * sizeof(float)) != 0;
    *compared += 1;
  }
  for (int64_t b0 = 0; b0 < num_blocks; b0 += kUnitBlocks) {
    const int nb = static_cast<int>(std::min<int64_t>(kGroupBlocks, num_blocks - b0));
    float want_part[kParts], got_part[kParts];
    bad += differ(unit_part_maxima(units.data(), num_units, b0, nb, got_part), z_part_maxima<D>(z, b0, nb, want_part));
    for (int q = 0; q < kParts; ++q) bad += differ(got_part[q], want_part[q]);
    *compared += 1;
  }
  return bad;
}

template <DType D>
long run(long* compared, long* units_compared, long* units_bad) {
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
    for (float t : {1.0f, 0.7f}) {
      bad += check<D>(row, vocab, t, compared);
      *units_bad += check_units<D>(row, vocab, t, units_compared);
    }
  }
  return bad;
}

// Float32 rows with the same specials for the unit maxima: random signs, all negative, a unit of NaN only,
// one of -inf only, +-0, +-inf and NaN of either sign, a spike per unit, rows of -inf with one entry (-0 or
// 5) or none; three temperatures.
long run_f32(long* compared) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t vocab = 8 * kGroup + 77;
  long bad = 0;
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> row(vocab);
    const int kind = trial % 4;  // 0 random signs, 1 all negative, 2 specials, 3 every entry -inf but one
    for (auto& x : row) x = kind == 1 ? -std::fabs(normal(rng)) - 0.01f : kind == 3 ? -kInf : normal(rng);
    if (kind == 2) {
      for (int64_t v = 0; v < kUnit; ++v) row[kUnit + v] = std::nanf("");
      for (int64_t v = 0; v < kUnit; ++v) row[3 * kUnit + v] = -kInf;
      row[rng() % vocab] = -std::nanf("");
      row[rng() % vocab] = kInf;
      row[rng() % vocab] = -kInf;
      row[rng() % vocab] = 0.0f;
      row[rng() % vocab] = -0.0f;
    }
    if (kind == 3 && trial != 19) row[rng() % vocab] = trial % 8 == 3 ? -0.0f : 5.0f;  // trial 19: all -inf
    for (int64_t u0 = 0; u0 + kUnit <= 4 * kGroup; u0 += kUnit) {
      if (kind == 3) break;
      row[u0 + (u0 / kUnit * 29 + trial * 13) % kUnit] = (trial / 4) % 2 ? 30.0f : -30.0f;
    }
    for (float t : {1.0f, 0.7f, 1.5f}) bad += check_units<DType::kFloat32>(row, vocab, t, compared);
  }
  return bad;
}

int main() {
  long compared = 0, units_compared = 0, units_bad = 0;
  const long bad = run<DType::kBFloat16>(&compared, &units_compared, &units_bad) +
                   run<DType::kFloat16>(&compared, &units_compared, &units_bad);
  units_bad += run_f32(&units_compared);
  std::printf("compared %ld different %ld units %ld different %ld\n", compared, bad, units_compared, units_bad);
  return 0;
}
