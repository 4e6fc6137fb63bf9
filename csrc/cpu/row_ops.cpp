// One instruction-set build of the hot row loops (compiled with SPECDEC_CPU_ISA = generic, avx2 or
// avx512 and the matching -m flags; see CMakeLists.txt).
// GCC 12 flags the undefined upper operand inside its own AVX-512 multiply/shift intrinsics (a false
// positive of -Wmaybe-uninitialized / -Wuninitialized once they are inlined into the hot loops).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "specdec/cpu/row_ops.h"

#include "cpu_kernels.h"

#define SPECDEC_CAT2(a, b) a##b
#define SPECDEC_CAT(a, b) SPECDEC_CAT2(a, b)

namespace specdec::cpu {

RowKernels SPECDEC_CAT(row_kernels_, SPECDEC_CPU_ISA)() { return make_row_kernels(); }

}  // namespace specdec::cpu
