// Check of normalizer.h's bf16 terms on builds without AVX-512 (chunk_sum_ranged):
// - the polynomial: |p(f) / 2^f - 1| with p(f) = fma(fma(kExp2HalfC2, f, kExp2HalfC1), f, kExp2HalfC0) in
//   float32, for every float f with 1/8 <= |f| <= 1/2 (where the largest errors lie) and every 256th float
//   below; prints its largest value, which must stay below the 1.72490e-3 that math.h states (and within
//   kExp2RoughErr, which chain.h's bracket uses);
// - the chunk sums: rows of 4096 bf16 entries, normal logits at T = 1 and T = 0.5 with the shift of
//   bound_shift, must give a sum within kExp2RoughErr + 2^-15 of the sum of exp(z - shift) in double; rows
//   holding a NaN, +inf or -inf entry, or an entry whose exponent lies just outside [-125, 126], must be
//   declined (the caller then sums them with exp2_rough), and entries on those edges accepted.
// Built and run by tests/native/test_native.py once per instruction set; prints "worst E at F ranged R declined D
// wrong W" (R = 0 and D = 0 on AVX-512, where normalizer_bound_t does not take this path).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "specdec/core/gumbel.h"
#include "specdec/cpu/normalizer.h"

using namespace specdec;

namespace {

uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

double polynomial_worst(float& at) {
  double worst = 0.0;
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t b = 0;; ++b) {
      const uint32_t bits = b | (sign << 31);
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      if (!(std::fabs(f) <= 0.5f)) break;
      if (std::fabs(f) < 0.125f && b % 256 != 0) continue;
      const float p = std::fma(std::fma(kExp2HalfC2, f, kExp2HalfC1), f, kExp2HalfC0);
      const double e = std::fabs(static_cast<double>(p) / std::exp2(static_cast<double>(f)) - 1.0);
      if (e > worst) {
        worst = e;
        at = f;
      }
    }
  }
  return worst;
}

struct Tally {
  long ranged = 0, declined = 0, wrong = 0;
};

// One chunk: whether chunk_sum_ranged takes it must match `expect`, and a sum it gives must lie within
// the bound of the exact one.
void check_chunk(const std::vector<uint16_t>& row, float temperature, float first_max, bool expect, Tally& t) {
  const float scale = (1.0f / temperature) * 1.44269504089f;
  const float shift = bound_shift<DType::kBFloat16>(first_max);
  float sum = 0.0f;
  const auto n = static_cast<int64_t>(row.size());
  const bool took = chunk_sum_ranged(row.data(), 0, n, n, scale, shift, sum);
  if (simd::kExp2FastUnclamped) return;  // AVX-512: the path is not used
  if (took != expect) {
    ++t.wrong;
    return;
  }
  if (!took) {
    ++t.declined;
    return;
  }
  ++t.ranged;
  double exact = 0.0;
  for (uint16_t h : row) exact += std::exp(static_cast<double>(bf16_to_float(h) * (1.0f / temperature)) - shift);
  if (!(std::fabs(static_cast<double>(sum) / exact - 1.0) <= kExp2RoughErr + 0x1p-15)) ++t.wrong;
}

}  // namespace

int main() {
  float at = 0.0f;
  const double worst = polynomial_worst(at);
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  Tally t;
  for (int trial = 0; trial < 8; ++trial) {
    for (float temperature : {1.0f, 0.5f}) {
      std::vector<uint16_t> row(4096);
      float m = -kInf;
      for (auto& h : row) {
        h = to_bf16(3.0f * normal(gen));
        m = std::max(m, bf16_to_float(h) * (1.0f / temperature));
      }
      check_chunk(row, temperature, m, true, t);
      // The exponent edges, relative to the shift: just inside [-125, 126] is summed, just outside declined.
      const float scale = (1.0f / temperature) * 1.44269504089f;
      const double k = std::nearbyint(static_cast<double>(bound_shift<DType::kBFloat16>(m)) * 1.4426950408889634);
      for (double edge : {126.0, -125.0}) {
        for (bool inside : {true, false}) {
          // The bf16 entry nearest the edge on the wanted side, among the neighbours of the target's bits.
          const uint16_t h0 = to_bf16(static_cast<float>((edge + k) / static_cast<double>(scale)));
          int best = -1;
          double best_gap = 1e30;
          for (int d = -8; d <= 8; ++d) {
            const auto h = static_cast<uint16_t>(h0 + d);
            const double y = static_cast<double>(bf16_to_float(h)) * scale - k;
            const bool in = edge > 0 ? y <= edge : y >= edge;
            if (in == inside && std::fabs(y - edge) < best_gap) {
              best_gap = std::fabs(y - edge);
              best = d;
            }
          }
          if (best < -8 || best_gap > 1.0) {
            ++t.wrong;  // no such entry: the check itself is broken
            continue;
          }
          const auto h = static_cast<uint16_t>(h0 + best);
          std::vector<uint16_t> r = row;
          r[trial * 97 % 4096] = h;
          check_chunk(r, temperature, m, inside, t);
        }
      }
      for (float special : {std::nanf(""), kInf, -kInf}) {
        std::vector<uint16_t> r = row;
        r[(trial * 389 + 7) % 4096] = to_bf16(special);
        check_chunk(r, temperature, m, false, t);
      }
    }
  }
  std::printf("worst %.6e at %.9g ranged %ld declined %ld wrong %ld\n", worst, at, t.ranged, t.declined, t.wrong);
  return 0;
}
