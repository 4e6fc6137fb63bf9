// Temperature, top-k and top-p on one row of scaled logits, by the exact rules of
// specdec_kernels/reference/sampling.py, without sorting the row:
//   z = sanitize(logit / temperature)      (NaN -> -inf, +inf -> float32 max)
//   top-k: keep v iff z_v >= the k-th largest z (ties at the k-th value all kept); k <= 0 or >= V: off
//   top-p: keep v iff (mass of tokens with strictly larger z) < top_p * (total mass), mass = exp(z - max)
// Host code (CPU kernels); the CUDA kernels implement the same rules in csrc/include/specdec/cuda/*.cuh.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "specdec/core/common.h"
#include "specdec/core/math.h"

SPECDEC_NS_BEGIN

// The k-th largest value of z[0, n) counting multiplicity (1 <= k <= n). `scratch` is reused storage.
inline float kth_largest(const float* z, int64_t n, int64_t k, std::vector<float>& scratch) {
  scratch.assign(z, z + n);
  auto nth = scratch.begin() + (k - 1);
  std::nth_element(scratch.begin(), nth, scratch.end(), [](float a, float b) { return a > b; });
  return *nth;
}

// Smallest kept value of top-p over z[0, n) (already top-k masked; max finite), reproducing the
// reference's float32 arithmetic: weights w = exp(z - max), cumulative mass in double rounded to float,
// exclusive = cum - w, kept iff exclusive(first of its tie group) < float(top_p) * float(total).
// Uses a histogram over the high 16 bits of the order key, then sorts only one bucket.
struct TopPScratch {
  std::vector<double> bucket_mass;
  std::vector<float> values;
};

// Walks the tie groups of values sorted descending, starting with `cum` mass above them; returns the last
// kept value (+inf if none).
inline float walk_top_p_groups(const std::vector<float>& values, double cum, float zmax, float limit) {
  float threshold = kInf;
  size_t i = 0;
  while (i < values.size()) {
    const float v = values[i];
    const float w = exp_f32(v - zmax);
    // Reference: exclusive = float(inclusive cumsum) - w at the first element of the tie group.
    const float exclusive = static_cast<float>(cum + static_cast<double>(w)) - w;
    if (!(exclusive < limit)) break;
    threshold = v;
    size_t j = i;
    while (j < values.size() && values[j] == v) {
      cum += static_cast<double>(exp_f32(values[j] - zmax));
      ++j;
    }
    i = j;
  }
  return threshold;
}

inline float top_p_threshold(const float* z, int64_t n, float zmax, float top_p, TopPScratch& s) {
  if (n <= 4096) {  // small rows: sort them outright
    s.values.assign(z, z + n);
    std::sort(s.values.begin(), s.values.end(), [](float a, float b) { return a > b; });
    double total_d = 0.0;
    for (const float v : s.values) total_d += static_cast<double>(exp_f32(v - zmax));
    return walk_top_p_groups(s.values, 0.0, zmax, top_p * static_cast<float>(total_d));
  }
  constexpr int kBuckets = 1 << 16;
  s.bucket_mass.assign(kBuckets, 0.0);
  double total_d = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float w = exp_f32(z[i] - zmax);
    s.bucket_mass[order_key(z[i]) >> 16] += static_cast<double>(w);
    total_d += static_cast<double>(w);
  }
  const float total = static_cast<float>(total_d);
  const float limit = top_p * total;
  // Walk buckets from the largest values down: the last kept group lies in the last non-empty bucket
  // whose mass-above is below the limit (mass-above of a bucket's first element is the mass before it).
  double before = 0.0;
  int chosen = -1, previous = -1;
  double chosen_before = 0.0;
  for (int b = kBuckets - 1; b >= 0; --b) {
    const double m = s.bucket_mass[b];
    if (m == 0.0) continue;
    if (chosen >= 0 && !(static_cast<float>(before) < limit)) break;
    previous = chosen;
    chosen = b;
    chosen_before = before;
    before += m;
  }
  if (chosen < 0) return kInf;  // no positive mass: the row is all -inf
  // Refine within the chosen bucket: sort its values descending and walk the tie groups.
  s.values.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<int>(order_key(z[i]) >> 16) == chosen) s.values.push_back(z[i]);
  }
  std::sort(s.values.begin(), s.values.end(), [](float a, float b) { return a > b; });
  float threshold = walk_top_p_groups(s.values, chosen_before, zmax, limit);
  if (threshold == kInf && previous >= 0) {
    // Rounding put the boundary exactly at the bucket edge: every group of the previous bucket is kept.
    for (int64_t k = 0; k < n; ++k) {
      if (static_cast<int>(order_key(z[k]) >> 16) == previous) threshold = std::min(threshold, z[k]);
    }
  }
  return threshold;
}

SPECDEC_NS_END
