// Run-time choice of the host kernel build: baseline x86-64 plus AVX2 + FMA and AVX-512 + FMA variants of
// the hot loops (identical results), the widest one the running CPU supports.
#include <cstdlib>
#include <cstring>

#include "cpu_kernels.h"

namespace specdec::cpu {
namespace {

struct Choice {
  const char* name;
  RowKernels kernels;
};

// SPECDEC_CPU_ISA=generic|avx2|avx512 caps the choice (tests compare the builds on one machine).
Choice detect() {
  const char* cap = std::getenv("SPECDEC_CPU_ISA");
  const bool allow_avx512 = cap == nullptr || std::strcmp(cap, "avx512") == 0;
  const bool allow_avx2 = allow_avx512 || std::strcmp(cap, "avx2") == 0;
#if defined(SPECDEC_HAVE_X86_ISAS)
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  if (allow_avx512 && fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return {"avx512", row_kernels_avx512()};
  }
  if (allow_avx2 && fma && __builtin_cpu_supports("avx2")) return {"avx2", row_kernels_avx2()};
#else
  (void)allow_avx2;
#endif
  return {"generic", row_kernels_generic()};
}

const Choice& choice() {
  static const Choice c = detect();
  return c;
}

}  // namespace

const char* isa_name() { return choice().name; }
const RowKernels& row_kernels() { return choice().kernels; }

}  // namespace specdec::cpu
