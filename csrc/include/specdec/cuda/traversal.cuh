// CUDA traversal verification of trees, exactly the rules of reference/traversal.py (whose docstring
// derives them): one block per request runs the depth-first traversal; each row step reduces over the
// vocabulary with the whole block. Per request the workspace holds the mass rows of the nodes on the
// current path ([D + 1, V] floats), the running draft laws when siblings are drawn without replacement
// (another [D + 1, V]) and the per-depth scalars (TraversalDepth). Thread 0 writes the scalars; every
// thread reads them after a barrier, so all threads follow the same control flow. Greedy requests take
// the token-level walk; the binding runs tree.cuh for deterministic trees.
#pragma once

#include <cstdint>

#include "specdec/core/common.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/cuda/block.cuh"
#include "specdec/cuda/cuda_api.h"
#include "specdec/cuda/cuda_common.cuh"
#include "specdec/cuda/prologue.cuh"
#include "specdec/cuda/tree.cuh"

SPECDEC_NS_BEGIN
namespace dev {

// First child of local node `node` at local index >= `from` whose token is a real one (placeholders are
// skipped), or -1. Children are the nodes whose parent is `node` (detached nodes never are).
__device__ __forceinline__ int64_t next_real_child(const CudaTreeArgs& a, int64_t first, int64_t n, int64_t node,
                                                  int64_t from) {
  for (int64_t i = from > node ? from : node + 1; i < n; ++i) {
    if (a.parent[first + i] != node) continue;
    const int64_t x = a.node_token_ids[first + i];
    if (x >= 0 && x < a.vocab) return i;
  }
  return -1;
}

template <DType D>
__global__ void tree_traversal_kernel(CudaTreeArgs a, float* rows, TraversalDepth* states) {
  __shared__ DevArgMax amax[32];
  __shared__ double smem[32];
  const int64_t b = blockIdx.x;
  const Span span = request_span(a.cu, b, a.num_nodes);
  const int64_t first = span.first, n = span.n;
  const int64_t width = a.max_depth + 1;
  const int64_t V = a.vocab;
  int32_t* out = a.out_tokens + b * width;
  int32_t* out_path = a.accepted_nodes + b * width;
  if (n <= 0) {
    if (threadIdx.x == 0) a.num_accepted[b] = 0;
    return;
  }
  const RequestSampling rs = request_sampling(a, b);
  const float temp = rs.temperature;
  const int64_t seed = rs.seed;
  const int64_t position = rs.position;
  const PhiloxKey key = rs.key;
  const size_t elem = a.logits_dtype == DType::kFloat32 ? 4 : 2;
  const size_t q_elem = a.probs_dtype == DType::kFloat32 ? 4 : 2;
  const int32_t top_k = rs.top_k;
  const float top_p = rs.top_p;
  const bool wor = a.without_replacement;
  auto row_ptr = [&](int64_t local) {
    return static_cast<const void*>(static_cast<const char*>(a.logits) + (first + local) * V * elem);
  };
  auto draft_row = [&](int64_t local) {
    return static_cast<const void*>(static_cast<const char*>(a.draft_probs) + (first + local) * V * q_elem);
  };
  float* r_rows = rows + b * (wor ? 2 : 1) * width * V;
  float* q_rows = r_rows + width * V;  // without replacement only
  TraversalDepth* st = states + b * width;
  auto r_at = [&](int64_t d) { return r_rows + d * V; };

  if (temp == 0.0f) {  // greedy: descend into the first child whose token is the argmax
    int64_t cur = 0;
    int64_t d = 0;
    int64_t y = 0;
    for (;; ++d) {
      DevArgMax best{-kInf, 0x7fffffff};
      for_each_elem<D>(row_ptr(cur), 0, V, [&](int64_t v, float x) {
        best = better(best, DevArgMax{sanitize(x), static_cast<int32_t>(v)});
      });
      best = block_argmax(best, amax);
      y = best.value == -kInf ? 0 : best.index;
      if (threadIdx.x == 0) store_threshold(a.row_threshold, first + cur, best.value);
      int64_t child = -1;
      for (int64_t i = cur + 1; i < n && d < a.max_depth; ++i) {
        if (a.parent[first + i] == cur && a.node_token_ids[first + i] == y) {
          child = i;
          break;
        }
      }
      if (child < 0) break;
      if (threadIdx.x == 0) {
        out[d] = static_cast<int32_t>(y);
        out_path[d + 1] = static_cast<int32_t>(child);
      }
      cur = child;
    }
    if (threadIdx.x == 0) {
      out_path[0] = 0;
      out[d] = static_cast<int32_t>(y);
      a.num_accepted[b] = static_cast<int32_t>(d);
    }
    return;
  }

  // Enter node `local` at depth d with weight w: r = w * p, M = w (dead subtrees read nothing).
  auto enter = [&](int64_t d, int64_t local, float w) {
    if (threadIdx.x == 0) {
      st[d].path = local;
      st[d].cursor = local + 1;
      st[d].mass = static_cast<double>(w);
      st[d].last = 0.0;
      st[d].divisor = 1.0f;
      st[d].flags = w > 0.0f ? kTraversalAlive : 0;
    }
    if (w > 0.0f) {
      const uint32_t lo_key = row_lo_key<D>(row_ptr(local), V, temp, top_k, top_p, smem, amax);
      if (threadIdx.x == 0) store_threshold(a.row_threshold, first + local, key_threshold(lo_key));
      float* r = r_at(d);
      row_probs<D>(row_ptr(local), V, temp, lo_key, r, smem, amax);
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) r[v] = w * r[v];
      if (wor) {
        const void* q = draft_row(local);
        float* qd = q_rows + d * V;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) qd[v] = load_prob(q, a.probs_dtype, v);
      }
    }
    __syncthreads();
  };

  enter(0, 0, 1.0f);
  int64_t d = 0;
  for (;;) {
    const int64_t node = st[d].path;
    const int64_t c = (st[d].flags & kTraversalAlive) && d < a.max_depth ? next_real_child(a, first, n, node, st[d].cursor)
                                                                         : -1;
    if (c >= 0) {
      const int64_t x = a.node_token_ids[first + c];
      const float num = r_at(d)[x] / st[d].divisor;
      const float q_x = wor ? q_rows[d * V + x] : load_prob(draft_row(node), a.probs_dtype, x);
      const float w = ratio_weight(num, q_x);
      __syncthreads();
      if (threadIdx.x == 0) st[d].cursor = c + 1;
      enter(d + 1, c, w);
      ++d;
      continue;
    }
    if (d == 0) break;  // the root is always accepted when reached
    const float coin = sequence_coin(seed, position, static_cast<uint32_t>(node & ((int64_t{1} << 30) - 1)));
    if (static_cast<double>(coin) < st[d].mass) break;
    // Delete the node from its parent's mass: r <- max(0, r / divisor - q), M <- Z / (Z + 1 - M).
    const int64_t up = d - 1;
    float* r = r_at(up);
    const float div = st[up].divisor;
    const void* q = wor ? static_cast<const void*>(q_rows + up * V) : draft_row(st[up].path);
    const DType q_dtype = wor ? DType::kFloat32 : a.probs_dtype;
    double part = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const float diff = r[v] / div - load_prob(q, q_dtype, v);
      r[v] = diff > 0.0f ? diff : 0.0f;
      part += static_cast<double>(r[v]);
    }
    const double z = block_sum(part, smem);
    if (wor) {  // the next sibling is drawn without this token: q <- norm(q with q(x) = 0)
      const int64_t x = a.node_token_ids[first + node];
      float* qd = q_rows + up * V;
      double qpart = 0.0;
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) qpart += v == x ? 0.0 : static_cast<double>(qd[v]);
      const float qtotal = static_cast<float>(block_sum(qpart, smem));
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        qd[v] = (v == x || !(qtotal > 0.0f)) ? 0.0f : qd[v] / qtotal;
      }
    }
    if (threadIdx.x == 0) {
      const double denom = z + (1.0 - st[up].mass);
      st[up].mass = denom > 0.0 ? z / denom : 0.0;
      st[up].divisor = denom > 0.0 ? static_cast<float>(denom) : 1.0f;
      st[up].last = z;
      st[up].flags |= kTraversalDeleted;
    }
    __syncthreads();
    d = up;
  }

  // Emission at the accepted node (depth d).
  const int64_t node = st[d].path;
  const int64_t pos = position + d;
  const bool deleted = (st[d].flags & kTraversalDeleted) != 0;
  int64_t token = -1;
  if (deleted && st[d].last > 0.0) token = weights_gumbel_sample(r_at(d), V, key, pos, amax);
  if (token < 0) {
    bool has_children = false;
    for (int64_t i = node + 1; i < n && !has_children; ++i) has_children = a.parent[first + i] == node;
    const bool leaf = d >= a.max_depth || !has_children;
    const uint32_t lo_key = row_lo_key<D>(row_ptr(node), V, temp, top_k, top_p, smem, amax);
    token = row_gumbel_sample<D>(row_ptr(node), V, temp, lo_key, key, pos,
                                 !deleted && leaf ? kStreamBonus : kStreamRecovery, amax);
  }
  if (threadIdx.x == 0) {
    for (int64_t i = 0; i < d; ++i) {
      out[i] = static_cast<int32_t>(a.node_token_ids[first + st[i + 1].path]);
      out_path[i] = static_cast<int32_t>(st[i].path);
    }
    out[d] = static_cast<int32_t>(token);
    out_path[d] = static_cast<int32_t>(node);
    a.num_accepted[b] = static_cast<int32_t>(d);
  }
}

}  // namespace dev
SPECDEC_NS_END
