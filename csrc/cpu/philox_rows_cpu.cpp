// Philox uniforms for rows of (seed, position) on one stream, over a vocabulary: the noise of the drafters'
// samplers (Philox stream 3, specdec_kernels/drafters/base.py): draw v is word v & 3 of call v >> 2, with
// the spec's own helpers (specdec/core/philox.h), bit-identical to specdec_kernels.reference.philox.uniform_rows.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "specdec/core/philox.h"

namespace specdec {

at::Tensor philox_uniform_rows_cpu(const at::Tensor& seed, const at::Tensor& position, int64_t stream,
                                   int64_t vocab) {
  TORCH_CHECK(seed.device().is_cpu() && position.device().is_cpu(), "seed and position must be CPU tensors");
  TORCH_CHECK_TYPE(seed.scalar_type() == at::kLong, "seed must be int64, got ", seed.scalar_type());
  TORCH_CHECK_TYPE(position.scalar_type() == at::kLong, "position must be int64, got ", position.scalar_type());
  TORCH_CHECK_VALUE(seed.dim() == 1 && position.dim() == 1 && seed.numel() == position.numel(),
                    "seed and position must be 1-D with the same length, got ", seed.sizes(), " and ",
                    position.sizes());
  TORCH_CHECK_VALUE(stream >= 0 && stream < 4, "stream must be in [0, 4), got ", stream);
  TORCH_CHECK_VALUE(vocab > 0 && vocab <= (int64_t{1} << 30), "vocab must be in [1, 2^30], got ", vocab);
  const at::Tensor s = seed.contiguous(), p = position.contiguous();
  const int64_t rows = s.numel();
  const int64_t* sd = s.data_ptr<int64_t>();
  const int64_t* ps = p.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK_VALUE(ps[r] >= 0 && ps[r] < (int64_t{1} << 31), "position[", r, "] = ", ps[r],
                      " is outside [0, 2^31)");
  }
  at::Tensor out = at::empty({rows, vocab}, s.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  const int st = static_cast<int>(stream);
  at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const PhiloxKey key = philox_key(sd[r]);
      const uint32_t hi = philox_offset_hi(ps[r]);
      float* row = o + r * vocab;
      for (int64_t v = 0; v < vocab; v += 4) {  // draws v .. v + 3 are the four words of one call
        uint32_t w[4];
        philox_words(key, philox_offset_lo(st, static_cast<uint32_t>(v)), hi, w);
        for (int i = 0; i < 4 && v + i < vocab; ++i) row[v + i] = philox_uniform(w[i]);
      }
    }
  });
  return out;
}

}  // namespace specdec
