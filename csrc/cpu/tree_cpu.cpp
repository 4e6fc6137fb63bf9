// Tree verification of a batch on the CPU (OpenMP over requests, or over each row's vocabulary).
#include "specdec/host/tree.h"

#include "cpu_kernels.h"
#include "parallel.h"

namespace specdec::cpu {

void verify_tree(const TreeArgs& a) {
  const RowKernels& K = row_kernels();
  for_each_request(a.num_reqs, a.vocab, [&](int64_t b, auto& exec, RowScratch& scratch) {
    thread_local TreeScratch tree_scratch;
    tree_scratch.row.z.swap(scratch.z);  // reuse the executor's row buffer
    verify_tree_request(K, a, b, exec, tree_scratch);
    tree_scratch.row.z.swap(scratch.z);
  });
}

}  // namespace specdec::cpu
