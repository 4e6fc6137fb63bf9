// Bit-for-bit check of two lane-wise exponentials whose AVX2 (and AVX-512) builds use instructions of their
// own for the baseline code's values, entry by entry against that code written out in scalars:
// - exp2_rough (the 2^y bound of normalizer.h's bracket, proven for the baseline's values): the baseline
//   floors by truncation and a compare and builds 2^n from the integer n + 127; AVX2 takes the floor from
//   vroundps and 2^n's bits from the float n + 2^23 + 127. The AVX-512 build computes values of its own
//   (vreduceps / vscalefps; only the bound holds) and is not compared.
// - exp_nonpositive (the exact normalizer's terms, the same on every instruction set): the baseline rounds
//   x log2 e by the magic-number sum; AVX2 by vroundps, AVX-512 by vrndscaleps and vscalefps.
// y and x: the clamps' edges, integers and their one-ulp neighbours and halves, +-0, +-inf, NaN, and random
// floats. Built and run by tests/native/test_native.py once per instruction set; prints
// "exp2_rough compared N different D exp_nonpositive compared N different D" (exp2_rough "compared 0" on
// AVX-512).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "specdec/cpu/simd.h"

using namespace specdec;

namespace {

float times_pow2(float p, float n) {
  const uint32_t e = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof(scale));
  return p * scale;
}

[[maybe_unused]] float exp2_rough_baseline(float y) {  // unused on AVX-512
  const float yc = y > -126.0f ? y : -126.0f;  // NaN -> -126 (max_v keeps its second operand)
  const float yb = yc < 128.0f ? yc : 128.0f;
  const float t = static_cast<float>(static_cast<int32_t>(yb));
  const float n = t > yb ? t - 1.0f : t;
  const float f = yb - n;
  return times_pow2(std::fma(std::fma(kExp2RoughC2, f, kExp2RoughC1), f, kExp2RoughC0), n);
}

float exp_nonpositive_baseline(float x) {
  const float xc = x > -87.0f ? x : -87.0f;
  const float n = (xc * 1.44269504089f + 12582912.0f) - 12582912.0f;
  float r = std::fma(n, -0.693359375f, xc);
  r = std::fma(n, 2.12194440e-4f, r);
  float p = std::fma(1.9875691500e-4f, r, 1.3981999507e-3f);
  p = std::fma(p, r, 8.3334519073e-3f);
  p = std::fma(p, r, 4.1665795894e-2f);
  p = std::fma(p, r, 1.6666665459e-1f);
  p = std::fma(p, r, 5.0000001201e-1f);
  p = std::fma(p, r * r, r + 1.0f);
  return times_pow2(p, n);
}

// Entries of ys whose lane-wise f differs from the scalar baseline in any bit.
template <class F, class B>
long compare(std::vector<float> ys, F f, B baseline) {
  while (ys.size() % simd::W != 0) ys.push_back(-0.25f);
  long different = 0;
  for (size_t i = 0; i < ys.size(); i += simd::W) {
    const simd::f32v got = f(simd::load(ys.data() + i));
    for (int l = 0; l < simd::W; ++l) {
      const float want = baseline(ys[i + l]);
      different += std::memcmp(&want, &got[l], sizeof(want)) != 0;
    }
  }
  return different;
}

std::vector<float> inputs(int lo, int hi, unsigned seed) {
  std::vector<float> ys{-kInf, __builtin_nanf(""), -__builtin_nanf(""), 0.0f, -0.0f};
  for (int i = lo; i <= hi; ++i) {
    const float x = static_cast<float>(i);
    ys.insert(ys.end(), {x, std::nextafter(x, -kInf), x - 0.5f});
    if (i < hi) ys.insert(ys.end(), {std::nextafter(x, kInf), x + 0.5f});
  }
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(static_cast<float>(lo), static_cast<float>(hi));
  for (int i = 0; i < 200000; ++i) ys.push_back(u(gen));
  return ys;
}

}  // namespace

int main() {
  size_t rough_n = 0;
  long rough_diff = 0;
#if !defined(__AVX512F__)
  std::vector<float> ys = inputs(-140, 140, 46);
  ys.push_back(kInf);
  rough_n = ys.size();
  rough_diff = compare(ys, [](simd::f32v y) { return simd::exp2_rough(y); }, exp2_rough_baseline);
#endif
  const std::vector<float> xs = inputs(-100, 0, 47);
  const long exp_diff = compare(xs, [](simd::f32v x) { return simd::exp_nonpositive(x); }, exp_nonpositive_baseline);
  std::printf("exp2_rough compared %zu different %ld exp_nonpositive compared %zu different %ld\n", rough_n,
              rough_diff, xs.size(), exp_diff);
  return 0;
}
