// Chain verification of a batch on the CPU (OpenMP over requests, or over each row's vocabulary).
#include "cpu_kernels.h"
#include "parallel.h"

namespace specdec::cpu {

void verify_chain(const ChainArgs& a) {
  const RowKernels& K = row_kernels();
  for_each_request(a.num_reqs, a.vocab, [&](int64_t b, auto& exec, RowScratch& scratch) {
    verify_chain_request(K, a, b, exec, scratch);
  });
}

}  // namespace specdec::cpu
