// The read-bandwidth probe (benchmarks/bench_native_cpu.py): the sum of a float32 tensor, split across the
// OpenMP threads the verification ops use (SplitExec, parallel.h), each slice read by the instruction-set
// build's stream_sum; and the same read carrying `rounds` multiply-adds per loaded vector
// (benchmarks/stream_compute_probe.py).
#include <ATen/ATen.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <tuple>

#include "cpu_kernels.h"
#include "parallel.h"

namespace specdec {

inline constexpr int64_t kMaxStreamRounds = 1024;

namespace {

// The sum over the threads' slices of x (checked: contiguous float32 on the CPU) of pass(slice, length).
template <class Pass>
double split_stream(const at::Tensor& x, Pass pass) {
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x must be a CPU tensor, got ", x.device());
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "x must be float32, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.is_contiguous(), "x must be contiguous");
  const float* p = x.data_ptr<float>();
  cpu::SplitExec exec{x.numel(), std::max(1, omp_get_max_threads())};
  return exec.sum([&](int64_t b, int64_t e) { return pass(p + b, e - b); });
}

}  // namespace

std::tuple<int64_t, int64_t> stream_minmax16_cpu(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x must be a CPU tensor, got ", x.device());
  TORCH_CHECK_VALUE(x.is_contiguous(), "x must be contiguous");
  const int64_t bytes = x.numel() * static_cast<int64_t>(x.element_size());
  TORCH_CHECK_VALUE(bytes % 2 == 0, "x must hold a whole number of 16-bit words, got ", bytes, " bytes");
  TORCH_CHECK_VALUE(bytes > 0, "x must not be empty");
  const auto* p = static_cast<const uint16_t*>(x.data_ptr());
  const RowKernels& K = cpu::row_kernels();
  cpu::SplitExec exec{bytes / 2, std::max(1, omp_get_max_threads())};
  const Int16Range r = exec.reduce<Int16Range>(
      [&](int64_t b, int64_t e) { return b < e ? K.stream_minmax16(p + b, e - b) : Int16Range{INT16_MIN, INT16_MAX}; },
      Int16Range{INT16_MIN, INT16_MAX},
      [](Int16Range a, Int16Range b) { return Int16Range{std::max(a.max, b.max), std::min(a.min, b.min)}; });
  return {r.max, r.min};
}

double stream_sum_cpu(const at::Tensor& x) { return split_stream(x, cpu::row_kernels().stream_sum); }

double stream_work_cpu(const at::Tensor& x, int64_t rounds) {
  TORCH_CHECK_VALUE(rounds >= 0 && rounds <= kMaxStreamRounds, "rounds must be in [0, ", kMaxStreamRounds, "], got ",
                    rounds);
  if (rounds == 0) return stream_sum_cpu(x);  // the read probe itself
  const RowKernels& K = cpu::row_kernels();
  return split_stream(x, [&](const float* p, int64_t n) { return K.stream_work(p, n, static_cast<int>(rounds)); });
}

}  // namespace specdec
