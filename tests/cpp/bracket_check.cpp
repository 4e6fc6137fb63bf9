// Check of the normalizer bracket (normalizer.h normalizer_bound_t, chain.h bracket_error): the sum over
// a row of exp(z - shift) in double, z = sanitize(row * (1 / T)) as the exact pass computes it, must lie
// in [(sum - slack) / (1 + e), (sum + slack) / (1 - e)] whenever the bracket claims to be usable. Rows:
// normal logits with NaN and infinite entries, a long -inf prefix, ~1000 nats at T = 0.02 (the shift
// raised chunk after chunk), exponents in the band 2^-150 .. 2^-126 (flushed or subnormal terms), every
// exponent at either polynomial's worst point, and +inf rows (no bracket), in fp32, bf16 and fp16. Built and
// run by tests/native/test_native.py once per instruction set; prints "rows N usable U outside O caught C", C being
// the rows whose true sum falls outside a bracket a quarter as wide (the check shown able to fail).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "specdec/cpu/row_ops.h"
#include "specdec/host/chain.h"

using namespace specdec;

namespace {

uint16_t to_16bit(float x, DType d) {
  if (d == DType::kBFloat16) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    return static_cast<uint16_t>(bits >> 16);  // truncation: any 16-bit pattern will do
  }
  uint32_t b;  // fp16 by truncation: +-inf beyond its range, signed zero below its normals, NaN kept
  std::memcpy(&b, &x, sizeof(b));
  const auto sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const int e = static_cast<int>((b >> 23) & 0xFFu) - 127 + 15;
  if (((b >> 23) & 0xFFu) == 0xFFu) return sign | 0x7C00u | ((b & 0x7FFFFFu) != 0 ? 0x200u : 0u);
  if (e >= 31) return sign | 0x7C00u;
  if (e <= 0) return sign;
  return static_cast<uint16_t>(sign | (e << 10) | ((b & 0x7FFFFFu) >> 13));
}

struct Tally {
  long rows = 0, usable = 0, outside = 0, caught = 0;
};

template <DType D>
void check_row(const std::vector<float>& x, float temperature, Tally& t) {
  const int64_t vocab = static_cast<int64_t>(x.size());
  std::vector<uint16_t> half(x.size());
  for (size_t i = 0; i < x.size(); ++i) half[i] = to_16bit(x[i], D);
  const void* row = D == DType::kFloat32 ? static_cast<const void*>(x.data()) : static_cast<const void*>(half.data());
  const NormalizerBound nb = normalizer_bound_t<D>(row, temperature, 0, vocab);
  ++t.rows;
  const BracketError be = bracket_error(nb, vocab);
  if (!be.ok) return;
  ++t.usable;
  const float inv_t = 1.0f / temperature;
  double exact = 0.0;
  for (int64_t v = 0; v < vocab; ++v) {
    const float z = sanitize(load_elem(row, D, v) * inv_t);
    if (z != -kInf) exact += std::exp(static_cast<double>(z) - static_cast<double>(nb.shift));
  }
  const auto inside = [&](double e) {
    return (nb.sum - be.slack) / (1.0 + e) <= exact && exact <= (nb.sum + be.slack) / (1.0 - e);
  };
  t.outside += !inside(be.e);
  t.caught += !inside(be.e / 4.0);
}

template <DType D>
void check_family(int family, std::mt19937& gen, Tally& t) {
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform;
  const int64_t vocab = family == 0 ? 151936 : 20011;
  std::vector<float> x(vocab);
  float temperature = 1.0f;
  for (int64_t v = 0; v < vocab; ++v) {
    const float u = uniform(gen);
    switch (family) {
      case 0:  // normal x 2, NaN and -inf entries
        x[v] = u < 0.001f ? std::nanf("") : u < 0.002f ? -kInf : 2.0f * normal(gen);
        break;
      case 1:  // a long -inf prefix, then normal entries and NaN
        temperature = 1.3f;
        x[v] = v < vocab / 3 ? -kInf : u < 0.01f ? std::nanf("") : 2.0f * normal(gen);
        break;
      case 2:  // ~1000 nats at T = 0.02: the shift is raised as larger chunks come
        temperature = 0.02f;
        x[v] = 4.0f * normal(gen) + 1e-4f * static_cast<float>(v);
        break;
      case 3:  // the first chunk sets the shift; most terms then lie 2^-150 .. 2^-126 below it
        x[v] = v < 256 ? 10.0f : u < 0.5f ? 10.0f - (126.0f + 24.0f * uniform(gen)) * 0.6931472f : normal(gen);
        break;
      case 4:  // every exponent just below an integer: the polynomial's largest error
        x[v] = 5.0f - (static_cast<float>(static_cast<int>(8.0f * u)) * 0.6931472f + 1e-4f);
        break;
      case 5:  // every exponent 0.2805 below an integer (the shift K ln 2): the bf16 fit's largest error
        x[v] = (7.0f - static_cast<float>(static_cast<int>(8.0f * u)) - 0.2805f) * 0.6931472f;
        break;
      default:  // a +inf entry: no bracket
        x[v] = v == vocab / 2 ? kInf : normal(gen);
        break;
    }
  }
  check_row<D>(x, temperature, t);
}

}  // namespace

int main() {
  std::mt19937 gen(11);
  Tally t;
  for (int trial = 0; trial < 4; ++trial) {
    for (int family = 0; family < 7; ++family) {
      check_family<DType::kFloat32>(family, gen, t);
      check_family<DType::kBFloat16>(family, gen, t);
      check_family<DType::kFloat16>(family, gen, t);
    }
  }
  std::printf("rows %ld usable %ld outside %ld caught %ld\n", t.rows, t.usable, t.outside, t.caught);
  return 0;
}
