// Block verification of chains and traversal verification of trees on the CPU (OpenMP over requests,
// or over each row's vocabulary), the drivers of block.h and traversal.h.
#include "specdec/host/block.h"
#include "specdec/host/traversal.h"

#include "cpu_kernels.h"
#include "parallel.h"

namespace specdec::cpu {

void verify_chain_block(const ChainArgs& a) {
  const RowKernels& K = row_kernels();
  for_each_request(a.num_reqs, a.vocab, [&](int64_t b, auto& exec, RowScratch& scratch) {
    thread_local BlockScratch block_scratch;
    verify_chain_block_request(K, a, b, exec, scratch, block_scratch);
  });
}

void verify_tree_traversal(const TreeArgs& a) {
  const RowKernels& K = row_kernels();
  for_each_request(a.num_reqs, a.vocab, [&](int64_t b, auto& exec, RowScratch& scratch) {
    thread_local TraversalScratch traversal_scratch;
    traversal_scratch.tree.row.z.swap(scratch.z);  // reuse the executor's row buffer
    verify_tree_traversal_request(K, a, b, exec, traversal_scratch);
    traversal_scratch.tree.row.z.swap(scratch.z);
  });
}

}  // namespace specdec::cpu
