// CUDA chain verification (docs/design.md §2-§4), exactly the rules of reference/chain.py.
//
// Every row's decision depends only on that row (stateless Philox), so the GPU decides all rows in
// parallel and a final per-request pass keeps the prefix up to the first rejection:
//   1. threshold_kernel  (rows with top-k/top-p only): exact truncation thresholds by bisection on
//                         order keys, one block per row;
//   2. row_pass_kernel   grid (slices, rows <= 65535): ONE pass over each logits row: greedy argmax (16-byte
//                         loads), or level 1 of the two-level Gumbel-max sample of the truncated target
//                         (gumbel.h: one thread per 16-entry block; deterministic drafts need nothing
//                         else), plus the online-softmax (max, sum) of stochastic rows;
//   3. decide_kernel     per row: combine slices, level 2 in the winning block; stochastic rows draw the
//                         acceptance coin; the row's sampling-mask threshold when asked for (row_threshold);
//   4. residual_kernel   grid (slices, rows <= 65535), stochastic rows that rejected only: recovery sample from
//                         norm(max(0, p - q)) (level 1; level 2 in residual_combine_kernel);
//   5. assemble_kernel   per request: accepted prefix, then the recovery or bonus token.
// Splitting the vocabulary across blocks keeps the whole GPU busy at small batch sizes.
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/cuda/cuda_api.h"
#include "specdec/cuda/cuda_common.cuh"
#include "specdec/cuda/gumbel.cuh"
#include "specdec/cuda/prologue.cuh"

SPECDEC_NS_BEGIN
namespace dev {

struct RowInfo {
  int64_t req, local, k;
  bool bonus;
  int64_t draft;      // -1 for bonus rows and placeholders
  int64_t draft_row;  // index into draft_token_ids / draft_probs (meaningful when !bonus)
};

__device__ __forceinline__ RowInfo row_info(const CudaChainArgs& a, int64_t r) {
  // Request b owns rows start_b + b ... start_b + b + k_b: binary search on start_b + b <= r. Rows outside
  // every span (only with an inconsistent cu) are sampled as bonus rows and never assembled.
  int64_t lo = 0, hi = a.num_reqs - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) >> 1;
    if (chain_span(a, mid).start + mid <= r) lo = mid; else hi = mid - 1;
  }
  const ChainSpan span = chain_span(a, lo);
  RowInfo info;
  info.req = lo;
  info.local = r - (span.start + lo);
  info.k = span.k;
  info.bonus = info.local < 0 || info.local >= info.k;
  info.draft_row = span.start + (info.bonus ? 0 : info.local);
  const int64_t d = info.bonus ? -1 : a.draft_ids[info.draft_row];
  info.draft = (d >= 0 && d < a.vocab) ? d : -1;
  return info;
}

// --- 1. thresholds ------------------------------------------------------------------------------------

template <DType D>
__global__ void threshold_kernel(CudaChainArgs a, ChainRowState* state) {
  __shared__ double smem[32];
  __shared__ DevArgMax amax[32];
  const int64_t r = blockIdx.x;
  const RowInfo info = row_info(a, r);
  const float temp = a.temperature[info.req];
  const int32_t k = a.top_k != nullptr ? a.top_k[info.req] : 0;
  const float top_p = a.top_p != nullptr ? a.top_p[info.req] : 1.0f;
  const void* row = static_cast<const char*>(a.logits) + r * a.vocab * (a.logits_dtype == DType::kFloat32 ? 4 : 2);
  const uint32_t lo_key = temp == 0.0f ? 0u : row_lo_key<D>(row, a.vocab, temp, k, top_p, smem, amax);
  if (threadIdx.x == 0) state[r].lo_key = lo_key;
}

// --- 2. one pass over each row -------------------------------------------------------------------------

// Slice blockIdx.x of row r.
template <DType D>
__device__ void row_pass(const CudaChainArgs& a, int64_t slice, int64_t r, const ChainRowState* state,
                         ChainRowPartial* partial, DevArgMax* amax, double* smem) {
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * slice;
  const int64_t v1 = v0 + slice < a.vocab ? v0 + slice : a.vocab;
  const RowInfo info = row_info(a, r);
  const float temp = a.temperature[info.req];
  const void* row = static_cast<const char*>(a.logits) + r * a.vocab * (a.logits_dtype == DType::kFloat32 ? 4 : 2);
  DevArgMax pick{-kInf, 0x7fffffff};
  float m = -kInf;
  double s = 0.0;
  if (temp == 0.0f) {
    for_each_elem<D>(row, v0, v1, [&](int64_t v, float x) {
      pick = better(pick, DevArgMax{sanitize(x), static_cast<int32_t>(v)});
    });
  } else {
    const uint32_t lo_key = state[r].lo_key;
    const bool stochastic = a.draft_probs != nullptr && !info.bonus;
    const PhiloxKey key = philox_key(a.seed[info.req]);
    const uint32_t hi = philox_offset_hi(a.position[info.req] + info.local);
    const int stream = info.bonus ? kStreamBonus : kStreamRecovery;
    const TruncatedZ<D> src{row, temp, lo_key, a.vocab};
    pick = block_pick(src, key, hi, stream, v0, v1);  // level 1 of the Gumbel-max sample
    if (stochastic) {  // online softmax statistics
      for_each_elem<D>(row, v0, v1, [&](int64_t v, float x) {
        const float z = truncated(x, temp, lo_key);
        if (z == -kInf) return;
        if (z > m) {
          s = s * static_cast<double>(exp_fma_f32(m - z)) + 1.0;
          m = z;
        } else {
          s += static_cast<double>(exp_fma_f32(z - m));
        }
      });
    }
    if (stochastic) {
      // Combine (m, s) across the block through the argmax of m, then rescale in double.
      const float bm = block_argmax(DevArgMax{m, 0}, amax).value;
      const double scaled = (m == -kInf) ? 0.0 : s * static_cast<double>(exp_fma_f32(m - bm));
      s = block_sum(scaled, smem);
      m = bm;
    }
  }
  pick = block_argmax(pick, amax);
  if (threadIdx.x == 0) {
    partial[r * gridDim.x + blockIdx.x] = ChainRowPartial{pick.value, pick.index, m, s};
  }
}

// Grid (slices, min(rows, 65535)): rows beyond the grid's y limit loop (T + B exceeds it in large batches).
template <DType D>
__global__ void row_pass_kernel(CudaChainArgs a, int64_t slice, const ChainRowState* state,
                                ChainRowPartial* partial) {
  __shared__ DevArgMax amax[32];
  __shared__ double smem[32];
  for (int64_t r = blockIdx.y; r < a.num_rows; r += gridDim.y) row_pass<D>(a, slice, r, state, partial, amax, smem);
}

// --- 3. per-row decisions ------------------------------------------------------------------------------

template <DType D>
__global__ void decide_kernel(CudaChainArgs a, int64_t slices, const ChainRowPartial* partial, ChainRowState* state) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= a.num_rows) return;
  const RowInfo info = row_info(a, r);
  DevArgMax pick{-kInf, 0x7fffffff};
  float m = -kInf;
  for (int64_t s = 0; s < slices; ++s) {
    const ChainRowPartial& p = partial[r * slices + s];
    pick = better(pick, DevArgMax{p.pick_value, p.pick_index});
    m = p.max > m ? p.max : m;
  }
  ChainRowState st = state[r];
  st.token = pick.value == -kInf ? 0 : pick.index;  // greedy: the argmax (an all -inf row samples token 0)
  st.accept = 0;
  st.recovered = -1;
  const float temp = a.temperature[info.req];
  // The sampling mask's threshold, of every row (greedy: the combined argmax's value is the row max).
  store_threshold(a.row_threshold, r, temp == 0.0f ? pick.value : key_threshold(st.lo_key));
  if (temp != 0.0f) {  // level 2 of the Gumbel-max sample, in the winning block (block 0 if all are -inf)
    const PhiloxKey key = philox_key(a.seed[info.req]);
    const uint32_t hi = philox_offset_hi(a.position[info.req] + info.local);
    const TruncatedZ<D> src{static_cast<const char*>(a.logits) + r * a.vocab * sizeof(typename Elem<D>::type), temp,
                            st.lo_key, a.vocab};
    st.token = static_cast<int32_t>(
        sample_in_block(src, key, hi, info.bonus ? kStreamBonus : kStreamRecovery, pick.value == -kInf ? 0 : pick.index));
  }
  if (temp != 0.0f && a.draft_probs != nullptr && !info.bonus) {
    double total = 0.0;
    for (int64_t s = 0; s < slices; ++s) {
      const ChainRowPartial& p = partial[r * slices + s];
      if (p.max != -kInf) total += p.sum * static_cast<double>(exp_fma_f32(p.max - m));
    }
    st.max = m;
    st.total = m == -kInf ? 1.0f : static_cast<float>(total);
    const int64_t x = info.draft >= 0 ? info.draft : 0;
    using T = typename Elem<D>::type;
    const T* row = static_cast<const T*>(a.logits) + r * a.vocab;
    const float z_x = truncated(Elem<D>::load(row, x), temp, st.lo_key);
    const float p_x = m == -kInf ? (x == 0 ? 1.0f : 0.0f) : exp_fma_f32(z_x - m) / st.total;
    const int64_t t = info.draft_row;
    const float q_x = load_prob(static_cast<const char*>(a.draft_probs) +
                                    t * a.vocab * (a.probs_dtype == DType::kFloat32 ? 4 : 2),
                                a.probs_dtype, x);
    const float coin = philox_rand(a.seed[info.req], a.position[info.req] + info.local, kStreamCoin, 0);
    st.accept = (info.draft >= 0 && coin * q_x < p_x) ? 1 : 0;
  }
  state[r] = st;
}

// --- 4. residual samples -------------------------------------------------------------------------------

// Slice blockIdx.x of row r.
template <DType D>
__device__ void residual(const CudaChainArgs& a, int64_t slice, int64_t r, const ChainRowState* state,
                         ChainRowPartial* partial, DevArgMax* amax) {
  const RowInfo info = row_info(a, r);
  const float temp = a.temperature[info.req];
  const ChainRowState st = state[r];
  if (temp == 0.0f || info.bonus || st.accept) return;  // uniform per block: safe to skip the row
  const int64_t v0 = static_cast<int64_t>(blockIdx.x) * slice;
  const int64_t v1 = v0 + slice < a.vocab ? v0 + slice : a.vocab;
  const int64_t t = info.draft_row;
  const void* q = static_cast<const char*>(a.draft_probs) + t * a.vocab * (a.probs_dtype == DType::kFloat32 ? 4 : 2);
  const void* row = static_cast<const char*>(a.logits) + r * a.vocab * (a.logits_dtype == DType::kFloat32 ? 4 : 2);
  const PhiloxKey key = philox_key(a.seed[info.req]);
  const uint32_t hi = philox_offset_hi(a.position[info.req] + info.local);
  const TruncatedResidual<D> src{TruncatedZ<D>{row, temp, st.lo_key, a.vocab}, st.max, st.total, q, a.probs_dtype};
  DevArgMax pick{-kInf, 0x7fffffff};
  float any = 0.0f;
  for (int64_t b = v0 / kBlock + threadIdx.x; b < (v1 + kBlock - 1) / kBlock; b += blockDim.x) {
    const float mass = src.log_mass(b);  // -inf iff the block's residual is all zero
    if (mass == -kInf) continue;
    any = 1.0f;
    const float u = philox_draw(key, hi, kStreamRecovery, kBlockDraws + static_cast<uint32_t>(b));
    pick = better(pick, DevArgMax{mass - gumbel_log_term(u), static_cast<int32_t>(b)});
  }
  const DevArgMax anyv = block_argmax(DevArgMax{any, 0}, amax);
  pick = block_argmax(pick, amax);
  if (threadIdx.x == 0) {
    partial[r * gridDim.x + blockIdx.x] = ChainRowPartial{pick.value, pick.index, anyv.value, 0.0};
  }
}

// Grid (slices, min(rows, 65535)), rows looping as in row_pass_kernel.
template <DType D>
__global__ void residual_kernel(CudaChainArgs a, int64_t slice, const ChainRowState* state,
                                ChainRowPartial* partial) {
  __shared__ DevArgMax amax[32];
  for (int64_t r = blockIdx.y; r < a.num_rows; r += gridDim.y) residual<D>(a, slice, r, state, partial, amax);
}

template <DType D>
__global__ void residual_combine_kernel(CudaChainArgs a, int64_t slices, const ChainRowPartial* partial,
                                        ChainRowState* state) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= a.num_rows) return;
  const RowInfo info = row_info(a, r);
  const float temp = a.temperature[info.req];
  if (temp == 0.0f || info.bonus || state[r].accept) return;
  DevArgMax pick{-kInf, 0x7fffffff};
  bool any = false;
  for (int64_t s = 0; s < slices; ++s) {
    const ChainRowPartial& p = partial[r * slices + s];
    any = any || p.max > 0.0f;
    pick = better(pick, DevArgMax{p.pick_value, p.pick_index});
  }
  // Level 2 in the winning block. Empty residual: the reference samples from p itself, i.e. the row's
  // stream-1 Gumbel sample (the row's token).
  const ChainRowState& st = state[r];
  const int64_t t = info.draft_row;
  const void* q = static_cast<const char*>(a.draft_probs) + t * a.vocab * (a.probs_dtype == DType::kFloat32 ? 4 : 2);
  const void* row = static_cast<const char*>(a.logits) + r * a.vocab * sizeof(typename Elem<D>::type);
  const TruncatedResidual<D> src{TruncatedZ<D>{row, temp, st.lo_key, a.vocab}, st.max, st.total, q, a.probs_dtype};
  const PhiloxKey key = philox_key(a.seed[info.req]);
  const uint32_t hi = philox_offset_hi(a.position[info.req] + info.local);
  state[r].recovered =
      any ? static_cast<int32_t>(sample_in_block(src, key, hi, kStreamRecovery, pick.value == -kInf ? 0 : pick.index))
          : -1;
}

// --- 5. assemble -----------------------------------------------------------------------------------------

__global__ void assemble_kernel(CudaChainArgs a, const ChainRowState* state) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= a.num_reqs) return;
  const ChainSpan span = chain_span(a, b);
  const int64_t k = span.k;
  const int64_t row0 = span.start + b;
  const bool greedy = a.temperature[b] == 0.0f;
  const bool stochastic = !greedy && a.draft_probs != nullptr;
  int32_t* out = a.out_tokens + b * a.out_width;
  int64_t j = 0;
  for (; j < k; ++j) {  // k <= out_width - 1 (chain_span): the row stays inside its output row
    const ChainRowState& st = state[row0 + j];
    const int64_t d = a.draft_ids[span.start + j];
    const bool valid = d >= 0 && d < a.vocab;
    const bool accept = stochastic ? st.accept != 0 : (valid && st.token == d);
    if (!accept) break;
    out[j] = static_cast<int32_t>(d);
  }
  const ChainRowState& last = state[row0 + j];
  int32_t token = last.token;
  if (j < k && stochastic && last.recovered >= 0) token = last.recovered;
  out[j] = token;
  a.num_accepted[b] = static_cast<int32_t>(j);
}

}  // namespace dev
SPECDEC_NS_END

