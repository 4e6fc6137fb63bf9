// Bit-for-bit check of the searches' lane-wise block log-masses (gumbel_search.h z_log_mass,
// residual_log_mass, and the batched candidate_z_masses, every slot or a scattered subset) against the
// scalar ZSource / ResidualSource::log_mass that the walks and the reference's order define, on random
// fp32 and bf16 rows with NaN, +-inf and -inf entries, three logit scales and two temperatures. Built and run by
// tests/native/test_native.py once per instruction set; prints "compared N different D".
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "specdec/cpu/row_ops.h"

using namespace specdec;

template <DType D>
long compare_row(const void* row, const std::vector<float>& q, float temperature, int64_t vocab, long* compared) {
  const ZSource z{row, D, temperature, vocab};
  const SoftmaxStats st = softmax_stats_t<D>(row, temperature, 0, vocab);
  const ResidualSource r{z, st.max, static_cast<float>(st.sum), q.data(), DType::kFloat32};
  const auto differ = [](float a, float b) { return std::memcmp(&a, &b, sizeof(a)) != 0 && !(a != a && b != b); };
  long bad = 0;
  for (int64_t b = 0; b < (vocab + kBlock - 1) / kBlock; ++b) {
    bad += differ(z.log_mass(b), z_log_mass<D>(z, b));
    bad += differ(r.log_mass(b), residual_log_mass<D, DType::kFloat32>(r, b));
    *compared += 2;
  }
  // The batched candidates' log-masses (search_blocks scores 16 blocks at a time): blocks in a scattered
  // order, batches of 1 to 16, the partial last block among them.
  const int64_t blocks = (vocab + kBlock - 1) / kBlock;
  int64_t next = 0;
  for (int n = 1; next < 4 * blocks; n = n % kBatch + 1) {
    Candidates c;
    c.n = n;
    for (int i = 0; i < n; ++i) c.block[i] = (next++ * 7919) % blocks;
    load_candidates<D>(z, c);
    alignas(64) float mx[kBatch], mass[kBatch];
    candidate_maxima(c, mx);
    // Every slot, then a scattered subset (only the masked slots are scored).
    const uint32_t all = (1u << n) - 1u, some = (static_cast<uint32_t>(next) * 2654435761u >> 7) & all;
    for (uint32_t mask : {all, some}) {
      candidate_z_masses(c, mx, mask, mass);
      for (int i = 0; i < n; ++i) {
        if ((mask >> i) & 1u) {
          bad += differ(z.log_mass(c.block[i]), mass[i]);
          *compared += 1;
        }
      }
    }
  }
  return bad;
}

int main() {
  std::mt19937 gen(7);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uniform;
  const int64_t vocab = 16 * 2048 + 5;  // a partial last block too
  long compared = 0, bad = 0;
  for (int trial = 0; trial < 24; ++trial) {
    std::vector<float> x(vocab), q(vocab);
    std::vector<uint16_t> xb(vocab);
    const float scale = trial % 3 == 0 ? 30.0f : trial % 3 == 1 ? 0.1f : 3.0f;
    for (int64_t i = 0; i < vocab; ++i) {
      const float u = uniform(gen);
      x[i] = u < 0.01f ? -kInf : u < 0.015f ? std::nanf("") : u < 0.016f && trial % 8 == 3 ? kInf : normal(gen) * scale;
      uint32_t bits;
      std::memcpy(&bits, &x[i], sizeof(bits));
      xb[i] = static_cast<uint16_t>(bits >> 16);
      q[i] = uniform(gen) * 4e-5f;
    }
    const float temperature = trial % 2 == 0 ? 0.7f : 1.0f;
    bad += compare_row<DType::kFloat32>(x.data(), q, temperature, vocab, &compared);
    bad += compare_row<DType::kBFloat16>(xb.data(), q, temperature, vocab, &compared);
  }
  std::printf("compared %ld different %ld\n", compared, bad);
  return 0;
}
