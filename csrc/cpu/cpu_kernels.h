// Host kernel entry points (framework-free): the run-time instruction-set choice and the OpenMP
// drivers of the chain and tree walks.
#pragma once

#include "specdec/core/types.h"
#include "specdec/host/chain.h"
#include "specdec/host/tree.h"

namespace specdec::cpu {

RowKernels row_kernels_generic();
#if defined(SPECDEC_HAVE_X86_ISAS)
RowKernels row_kernels_avx2();
RowKernels row_kernels_avx512();
#endif

// The widest build the running CPU supports ("avx512", "avx2" or "generic") within SPECDEC_CPU_ISA's cap,
// chosen once; isa_message() is empty, or says in one line why the choice is not the build the variable named.
const char* isa_name();
const char* isa_message();
const RowKernels& row_kernels();

// Chain verification of a whole batch with OpenMP; out_tokens must be pre-filled with -1.
void verify_chain(const ChainArgs& a);

// Tree verification of a whole batch with OpenMP; outputs must be pre-filled with -1.
void verify_tree(const TreeArgs& a);

// Block verification of chains / traversal verification of trees (csrc/cpu/block_traversal_cpu.cpp); outputs as
// verify_chain / verify_tree.
void verify_chain_block(const ChainArgs& a);
void verify_tree_traversal(const TreeArgs& a);

}  // namespace specdec::cpu
