// Executors for the host walks: a vocabulary reduction runs serially (one request per thread) or
// split across OpenMP threads (small batches: every core works on the same row).
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "specdec/core/types.h"
#include "specdec/host/chain.h"

namespace specdec::cpu {

inline constexpr int64_t kSliceAlign = 64;     // slices hold whole row_ops chunks (and unit_maxima units)
static_assert(kSliceAlign % kUnitEntries == 0, "slices start on units");
inline constexpr int64_t kSerialWork = 1 << 16;  // requests x vocabulary below which no threads start

struct SerialExec {
  int64_t vocab;
  template <class F>
  ArgMax argmax(F f) { return f(0, vocab); }
  template <class F>
  SoftmaxStats stats(F f) { return f(0, vocab); }
  template <class F>
  NormalizerBound normalizer(F f) { return f(0, vocab); }
  template <class F>
  double sum(F f) { return f(0, vocab); }
  template <class F>
  ResidualResult residual(F f) { return f(0, vocab); }
  template <class F>
  IntervalPick interval(F f) { return f(0, vocab); }
};

// Softmax statistics of two slices of a row as one.
inline SoftmaxStats merge_stats(SoftmaxStats x, SoftmaxStats y) {
  const float m = x.max > y.max ? x.max : y.max;
  if (m == -kInf) return {m, 0.0};
  const double sx = x.max == -kInf ? 0.0 : x.sum * static_cast<double>(exp_fma_f32(x.max - m));
  const double sy = y.max == -kInf ? 0.0 : y.sum * static_cast<double>(exp_fma_f32(y.max - m));
  return {m, sx + sy};
}

// Normalizer bounds of two slices of a row as one (the sums brought to the larger shift in double).
inline NormalizerBound merge_bounds(NormalizerBound x, NormalizerBound y) {
  if (!x.ok || !y.ok) return {-kInf, 0.0, 0.0f, false};
  if (x.shift == -kInf) return y;
  if (y.shift == -kInf) return x;
  const float s = x.shift > y.shift ? x.shift : y.shift;
  const double sum = x.sum * std::exp(static_cast<double>(x.shift) - s) + y.sum * std::exp(static_cast<double>(y.shift) - s);
  return {s, sum, x.max_abs_shift > y.max_abs_shift ? x.max_abs_shift : y.max_abs_shift, true};
}

// Interval picks of two slices of a row as one: y's best offered to x, and both runners-up.
inline IntervalPick merge_picks(IntervalPick x, IntervalPick y) {
  offer(x, y.best, y.best_hi);
  x.runner_hi = std::max(x.runner_hi, y.runner_hi);
  return x;
}

struct SplitExec {
  int64_t vocab;
  int threads;

  int64_t bound(int t) const {
    const int64_t chunks = (vocab + kSliceAlign - 1) / kSliceAlign;
    return std::min<int64_t>(vocab, (chunks * t / threads) * kSliceAlign);
  }
  template <class R, class F, class C>
  R reduce(F f, R init, C combine) {
    std::vector<R> part(threads, init);
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num();
      const int n = omp_get_num_threads();
      if (n == threads) {
        part[t] = f(bound(t), bound(t + 1));
      } else if (t == 0) {
        part[0] = f(0, vocab);  // the runtime gave fewer threads: one does the whole row
      }
    }
    R acc = init;
    for (const R& p : part) acc = combine(acc, p);
    return acc;
  }
  template <class F>
  ArgMax argmax(F f) { return reduce<ArgMax>(f, kArgMaxInit, better); }
  template <class F>
  SoftmaxStats stats(F f) { return reduce<SoftmaxStats>(f, SoftmaxStats{-kInf, 0.0}, merge_stats); }
  template <class F>
  NormalizerBound normalizer(F f) {
    return reduce<NormalizerBound>(f, NormalizerBound{-kInf, 0.0, 0.0f, true}, merge_bounds);
  }
  template <class F>
  double sum(F f) { return reduce<double>(f, 0.0, [](double x, double y) { return x + y; }); }
  template <class F>
  ResidualResult residual(F f) {
    return reduce<ResidualResult>(f, ResidualResult{kArgMaxInit, false}, [](ResidualResult x, ResidualResult y) {
      return ResidualResult{better(x.best, y.best), x.any_positive || y.any_positive};
    });
  }
  template <class F>
  IntervalPick interval(F f) { return reduce<IntervalPick>(f, kIntervalPickInit, merge_picks); }
};

// Runs walk(b, exec, scratch) for every request: request-parallel when the batch covers the threads
// twice over, otherwise one request at a time with each row split across the threads.
template <class Walk>
void for_each_request(int64_t num_reqs, int64_t vocab, Walk walk) {
  // Small batches of small rows run on the calling thread: waking a thread team costs more than the work.
  if (num_reqs * vocab < kSerialWork) {
    RowScratch scratch;
    SerialExec exec{vocab};
    for (int64_t b = 0; b < num_reqs; ++b) walk(b, exec, scratch);
    return;
  }
  const int threads = omp_get_max_threads();
  if (threads <= 1 || num_reqs >= 2 * threads || vocab < 16 * kSliceAlign) {
#pragma omp parallel num_threads(threads)
    {
      RowScratch scratch;
      SerialExec exec{vocab};
#pragma omp for schedule(dynamic, 1)
      for (int64_t b = 0; b < num_reqs; ++b) walk(b, exec, scratch);
    }
  } else {
    RowScratch scratch;
    SplitExec exec{vocab, threads};
    for (int64_t b = 0; b < num_reqs; ++b) walk(b, exec, scratch);
  }
}

}  // namespace specdec::cpu
