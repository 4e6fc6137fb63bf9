// CUDA tree verification, exactly the rules of reference/tree.py: one block per request walks its
// accepted path (only the path rows are read); each step reduces over the row with the whole block
// (16-byte loads). Stochastic trees keep the running target p and draft q of the current node in a
// per-request workspace [2, V] floats.
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

template <DType D>
__global__ void tree_walk_kernel(CudaTreeArgs a, float* workspace) {
  __shared__ DevArgMax amax[32];
  __shared__ double smem[32];
  const int64_t b = blockIdx.x;
  const Span span = request_span(a.cu, b, a.num_nodes);
  const int64_t first = span.first, n = span.n;
  const int64_t width = a.max_depth + 1;
  const int64_t V = a.vocab;
  int32_t* out = a.out_tokens + b * width;
  int32_t* path = a.accepted_nodes + b * width;
  if (n <= 0) {
    if (threadIdx.x == 0) a.num_accepted[b] = 0;
    return;
  }
  float* p = workspace + b * 2 * V;
  float* q = p + V;
  const RequestSampling rs = request_sampling(a, b);
  const float temp = rs.temperature;
  const int64_t seed = rs.seed;
  const PhiloxKey key = rs.key;
  const size_t elem = a.logits_dtype == DType::kFloat32 ? 4 : 2;
  const size_t q_elem = a.probs_dtype == DType::kFloat32 ? 4 : 2;
  if (threadIdx.x == 0) path[0] = 0;
  int64_t cur = 0;
  for (int64_t d = 0; d < width; ++d) {
    const int64_t g = first + cur;
    const void* row = static_cast<const char*>(a.logits) + g * V * elem;
    // Children of cur in sibling order: nodes i > cur with parent == cur (detached nodes excluded).
    int64_t num_kids = 0;
    if (d < a.max_depth) {
      for (int64_t i = cur + 1; i < n; ++i) num_kids += a.parent[first + i] == cur ? 1 : 0;
    }
    const bool leaf = num_kids == 0;
    const int64_t pos = rs.position + d;
    int64_t y = 0;
    int64_t slot = -1;
    bool decided = false;
    if (temp == 0.0f) {
      DevArgMax best{-kInf, 0x7fffffff};
      for_each_elem<D>(row, 0, V, [&](int64_t v, float x) { best = better(best, DevArgMax{sanitize(x), static_cast<int32_t>(v)}); });
      best = block_argmax(best, amax);
      y = best.value == -kInf ? 0 : best.index;
      if (threadIdx.x == 0) store_threshold(a.row_threshold, g, best.value);
    } else {
      const uint32_t lo_key = row_lo_key<D>(row, V, temp, rs.top_k, rs.top_p,
                                            smem, amax);
      if (threadIdx.x == 0) store_threshold(a.row_threshold, g, key_threshold(lo_key));
      if (a.draft_probs == nullptr || leaf) {  // two-level Gumbel-max (gumbel.h)
        const int stream = leaf ? kStreamBonus : kStreamRecovery;
        const uint32_t hi = philox_offset_hi(pos);
        const TruncatedZ<D> src{row, temp, lo_key, V};
        const DevArgMax best = block_argmax(block_pick(src, key, hi, stream, 0, V), amax);
        y = sample_in_block(src, key, hi, stream, best.value == -kInf ? 0 : best.index);
      } else {
        // p = softmax(z), q = draft row of this node. The barrier first: every thread must have read the
        // previous node's p[x] and q[x] (its acceptance coin) before any thread overwrites them.
        __syncthreads();
        DevArgMax mx{-kInf, 0x7fffffff};
        for_each_elem<D>(row, 0, V, [&](int64_t v, float x) {
          const float z = truncated(x, temp, lo_key);
          p[v] = z;
          mx = better(mx, DevArgMax{z, static_cast<int32_t>(v)});
        });
        const float m = block_argmax(mx, amax).value;
        double part = 0.0;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
          const float e = m == -kInf ? (v == 0 ? 1.0f : 0.0f) : exp_f32(p[v] - m);
          p[v] = e;
          part += static_cast<double>(e);
        }
        const float total = static_cast<float>(block_sum(part, smem));
        const void* q_row = static_cast<const char*>(a.draft_probs) + g * V * q_elem;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
          p[v] = p[v] / total;
          q[v] = load_prob(q_row, a.probs_dtype, v);
        }
        __syncthreads();
        int64_t s = 0;
        for (int64_t i = cur + 1; i < n && slot < 0; ++i) {
          if (a.parent[first + i] != cur) continue;
          const int64_t this_slot = s++;
          const int64_t x = a.node_token_ids[first + i];
          if (!(x >= 0 && x < V)) continue;
          const float coin = philox_rand(seed, pos, kStreamCoin, static_cast<uint32_t>(this_slot));
          if (coin * q[x] < p[x]) {
            slot = this_slot;
            break;
          }
          // p <- norm(max(0, p - q)) (unchanged if empty), with this step's q; RRS also renormalises q
          // without x.
          double rpart = 0.0, qpart = 0.0;
          for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
            const float diff = p[v] - q[v];
            rpart += static_cast<double>(diff > 0.0f ? diff : 0.0f);
            qpart += v == x ? 0.0 : static_cast<double>(q[v]);
          }
          const float rtotal = static_cast<float>(block_sum(rpart, smem));
          const float qtotal = static_cast<float>(block_sum(qpart, smem));
          for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
            const float diff = p[v] - q[v];
            if (rtotal > 0.0f) p[v] = (diff > 0.0f ? diff : 0.0f) / rtotal;
            if (a.without_replacement) q[v] = (v == x || !(qtotal > 0.0f)) ? 0.0f : q[v] / qtotal;
          }
          __syncthreads();
        }
        if (slot < 0) {  // two-level Gumbel-max of norm(p) on the recovery stream
          const uint32_t hi = philox_offset_hi(pos);
          const WeightSource src{p, V};
          const DevArgMax best = block_argmax(block_pick(src, key, hi, kStreamRecovery, 0, V), amax);
          y = sample_in_block(src, key, hi, kStreamRecovery, best.value == -kInf ? 0 : best.index);
        }
        decided = true;
      }
    }
    int64_t child = -1;
    if (decided) {
      if (slot >= 0) {
        int64_t s = 0;
        for (int64_t i = cur + 1; i < n; ++i) {
          if (a.parent[first + i] != cur) continue;
          if (s++ == slot) {
            child = i;
            break;
          }
        }
      }
    } else {
      for (int64_t i = cur + 1; i < n && num_kids > 0; ++i) {
        if (a.parent[first + i] != cur) continue;
        const int64_t t = a.node_token_ids[first + i];
        if (t >= 0 && t < V && t == y) {
          child = i;
          break;
        }
      }
    }
    if (child >= 0) {
      if (threadIdx.x == 0) {
        out[d] = static_cast<int32_t>(a.node_token_ids[first + child]);
        if (d + 1 < width) path[d + 1] = static_cast<int32_t>(child);
      }
      cur = child;
      continue;
    }
    if (threadIdx.x == 0) {
      out[d] = static_cast<int32_t>(y);
      a.num_accepted[b] = static_cast<int32_t>(d);
    }
    return;
  }
}

}  // namespace dev
SPECDEC_NS_END

