// The read-bandwidth probe (benchmarks/bench_native_cpu.py): the sum of a float32 tensor, split across the
// OpenMP threads the verification ops use, each slice read by the instruction-set build's stream_sum.
#include <ATen/ATen.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "cpu_kernels.h"

namespace specdec {

double stream_sum_cpu(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.device().is_cpu(), "x must be a CPU tensor, got ", x.device());
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "x must be float32, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.is_contiguous(), "x must be contiguous");
  const float* p = x.data_ptr<float>();
  const int64_t n = x.numel();
  const RowKernels& K = cpu::row_kernels();
  const int threads = std::max(1, omp_get_max_threads());
  std::vector<double> part(threads, 0.0);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    const int64_t lines = (n + 15) / 16;  // slices of whole 64-byte lines
    const int64_t b = std::min(n, lines * t / nt * 16);
    const int64_t e = std::min(n, lines * (t + 1) / nt * 16);
    part[t] = K.stream_sum(p + b, e - b);
  }
  double total = 0.0;
  for (double s : part) total += s;
  return total;
}

}  // namespace specdec
