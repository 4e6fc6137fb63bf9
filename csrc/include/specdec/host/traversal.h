// Traversal verification of stochastic draft trees on the host (Weng et al., NeurIPS 2025): exactly the
// rules of specdec_kernels/reference/traversal.py, whose docstring derives them. Framework-free; generic
// over the executor like tree.h.
//
// An explicit depth-first walk: every node on the current path holds its mass row r (m = r / divisor),
// its total M and, for siblings drawn without replacement, its running draft law. Entering a node reads
// its target row once (scaled row, softmax, r = a * p); deleting a rejected child is one pass over the
// parent's row (r <- max(0, m - q), its mass). Dead subtrees (weight 0) are never read. Greedy requests
// and deterministic trees run tree.h's token-level walk.
#pragma once

#include <cstdint>
#include <vector>

#include "specdec/core/common.h"
#include "specdec/core/math.h"
#include "specdec/core/philox.h"
#include "specdec/core/types.h"
#include "specdec/host/block.h"
#include "specdec/host/chain.h"
#include "specdec/host/tree.h"

SPECDEC_NS_BEGIN

struct TraversalScratch {
  TreeScratch tree;            // row scratch and children lists (shared with the token-level walk)
  std::vector<float> r, q;     // [(D + 1) * V]: mass rows and (without replacement) draft laws by depth
  std::vector<float> divisor;  // [D + 1]
  std::vector<double> mass, last_mass;
  std::vector<uint8_t> deleted, alive;
  std::vector<int64_t> path, cursor;  // local node and next child slot at each depth
};

// Children lists of request b's nodes in sibling (local index) order, global indices; nodes whose parent
// does not point backwards are detached (unreachable), as in the reference.
inline void build_children(const TreeArgs& a, int64_t first, int64_t n, TreeScratch& s) {
  s.child_start.assign(n + 1, 0);
  for (int64_t i = 1; i < n; ++i) {
    const int64_t par = a.parent[first + i];
    if (par >= 0 && par < i) ++s.child_start[par + 1];
  }
  for (int64_t i = 0; i < n; ++i) s.child_start[i + 1] += s.child_start[i];
  s.children.assign(s.child_start[n], 0);
  std::vector<int64_t> fill(s.child_start.begin(), s.child_start.end() - 1);
  for (int64_t i = 1; i < n; ++i) {
    const int64_t par = a.parent[first + i];
    if (par >= 0 && par < i) s.children[fill[par]++] = first + i;
  }
}

template <class Exec>
void verify_tree_traversal_request(const RowKernels& K, const TreeArgs& a, int64_t b, Exec& exec,
                                   TraversalScratch& s) {
  const float temp = a.temperature[b];
  if (temp == 0.0f || a.draft_probs == nullptr) {  // greedy / deterministic trees: token level
    verify_tree_request(K, a, b, exec, s.tree);
    return;
  }
  const int64_t V = a.vocab;
  const int64_t first = a.cu[b];
  const int64_t n = a.cu[b + 1] - first;
  const int64_t D = a.max_depth;
  const int64_t width = D + 1;
  int32_t* out = a.out_tokens + b * width;
  int32_t* out_path = a.accepted_nodes + b * width;
  if (n <= 0) {  // only reachable without validation: nothing to verify
    a.num_accepted[b] = 0;
    return;
  }
  build_children(a, first, n, s.tree);
  const int64_t* tokens = a.node_token_ids;
  const int64_t seed = a.seed[b];
  const int64_t position = a.position[b];
  const size_t elem = a.logits_dtype == DType::kFloat32 ? 4 : 2;
  const size_t q_elem = a.probs_dtype == DType::kFloat32 ? 4 : 2;
  const bool wor = a.without_replacement;
  s.r.resize(static_cast<size_t>(width) * V);
  if (wor) s.q.resize(static_cast<size_t>(width) * V);
  s.divisor.assign(width, 1.0f);
  s.mass.assign(width, 0.0);
  s.last_mass.assign(width, 0.0);
  s.deleted.assign(width, 0);
  s.alive.assign(width, 0);
  s.path.assign(width, 0);
  s.cursor.assign(width, 0);
  RowScratch& rs = s.tree.row;
  auto row_ptr = [&](int64_t local) {
    return static_cast<const void*>(static_cast<const char*>(a.logits) + static_cast<size_t>(first + local) * V * elem);
  };
  auto draft_row = [&](int64_t local) {
    return static_cast<const void*>(static_cast<const char*>(a.draft_probs) +
                                    static_cast<size_t>(first + local) * V * q_elem);
  };
  auto r_at = [&](int64_t d) { return s.r.data() + static_cast<size_t>(d) * V; };
  // The law the children of the depth-d node are drawn from next: its draft row, or the running copy.
  auto q_at = [&](int64_t d) { return wor ? static_cast<const void*>(s.q.data() + static_cast<size_t>(d) * V)
                                          : draft_row(s.path[d]); };
  const DType q_dtype = wor ? DType::kFloat32 : a.probs_dtype;
  auto enter = [&](int64_t d, int64_t local, float weight) {
    s.path[d] = local;
    s.cursor[d] = 0;
    s.mass[d] = static_cast<double>(weight);
    s.divisor[d] = 1.0f;
    s.deleted[d] = 0;
    s.alive[d] = weight > 0.0f;
    if (weight <= 0.0f) return;  // dead subtree: its rows are never needed (nor emitted)
    float* threshold = a.row_threshold != nullptr ? a.row_threshold + first + local : nullptr;  // the sampling mask's
    const ArgMax mx =
        prepare_row(K, exec, row_ptr(local), a.logits_dtype, temp, a.top_k, a.top_p, b, V, rs, threshold);
    float* z = rs.z.data();
    const float total = softmax_in_place(K, exec, z, mx, V);
    float* r = r_at(d);
    exec.sum([&](int64_t v0, int64_t v1) { return K.weighted_residual(z, total, weight, nullptr, q_dtype, r, v0, v1); });
    if (wor) {
      const void* q = draft_row(local);
      float* qd = s.q.data() + static_cast<size_t>(d) * V;
      for (int64_t v = 0; v < V; ++v) qd[v] = load_elem(q, a.probs_dtype, v);
    }
  };

  enter(0, 0, 1.0f);
  int64_t d = 0;
  for (;;) {
    const int64_t node = s.path[d];
    bool descended = false;
    if (s.alive[d] && d < D) {
      const int64_t begin = s.tree.child_start[node];
      const int64_t count = s.tree.child_start[node + 1] - begin;
      for (int64_t c = s.cursor[d]; c < count; ++c) {
        const int64_t x = tokens[s.tree.children[begin + c]];
        if (!(x >= 0 && x < V)) continue;  // placeholders are skipped: no update
        s.cursor[d] = c + 1;
        const float num = r_at(d)[x] / s.divisor[d];
        const float weight = ratio_weight(num, load_elem(q_at(d), q_dtype, x));
        enter(d + 1, s.tree.children[begin + c] - first, weight);
        ++d;
        descended = true;
        break;
      }
      if (!descended) s.cursor[d] = count;
    }
    if (descended) continue;
    if (d == 0) break;  // the root is always accepted when reached
    const float coin = sequence_coin(seed, position, static_cast<uint32_t>(node & ((int64_t{1} << 30) - 1)));
    if (static_cast<double>(coin) < s.mass[d]) break;
    // Delete the node from its parent's mass: r <- max(0, r / divisor - q), M <- Z / (Z + 1 - M).
    const int64_t up = d - 1;
    float* r = r_at(up);
    const float div = s.divisor[up];
    const void* q = q_at(up);
    const double z = exec.sum([&](int64_t v0, int64_t v1) { return K.weighted_residual(r, div, 1.0f, q, q_dtype, r, v0, v1); });
    const double denom = z + (1.0 - s.mass[up]);
    s.mass[up] = denom > 0.0 ? z / denom : 0.0;
    s.divisor[up] = denom > 0.0 ? static_cast<float>(denom) : 1.0f;
    s.deleted[up] = 1;
    s.last_mass[up] = z;
    if (wor) {  // the next sibling is drawn without this one's token: q <- norm(q with q(x) = 0)
      float* qd = s.q.data() + static_cast<size_t>(up) * V;
      qd[tokens[first + node]] = 0.0f;
      const float qtotal = row_sum(qd, V);
      for (int64_t v = 0; v < V; ++v) qd[v] = qtotal > 0.0f ? qd[v] / qtotal : 0.0f;
    }
    d = up;
  }

  // Emission at the accepted node (depth d).
  const int64_t node = s.path[d];
  const int64_t pos = position + d;
  int64_t token;
  if (s.deleted[d] && s.last_mass[d] > 0.0) {
    token = sample_weights(K, exec, r_at(d), V, seed, pos, kStreamRecovery);
  } else {
    const bool leaf = d >= D || s.tree.child_start[node + 1] == s.tree.child_start[node];
    const int stream = !s.deleted[d] && leaf ? kStreamBonus : kStreamRecovery;
    const ArgMax mx = prepare_row(K, exec, row_ptr(node), a.logits_dtype, temp, a.top_k, a.top_p, b, V, rs);
    token = sample_prepared(K, exec, rs.z.data(), mx, V, seed, pos, stream);
  }
  for (int64_t i = 0; i < d; ++i) {
    out[i] = static_cast<int32_t>(tokens[first + s.path[i + 1]]);
    out_path[i] = static_cast<int32_t>(s.path[i]);
  }
  out[d] = static_cast<int32_t>(token);
  out_path[d] = static_cast<int32_t>(s.path[d]);
  a.num_accepted[b] = static_cast<int32_t>(d);
}

SPECDEC_NS_END
