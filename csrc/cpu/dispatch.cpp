// Run-time choice of the host kernel build: baseline plus, on x86-64, AVX2 + FMA and AVX-512 + FMA variants
// of the hot loops (identical results), the widest one the running CPU supports. Nothing compiled for an
// instruction set runs before this choice: the per-ISA objects have no load-time initialisers
// (cmake/CheckIsaObjects.cmake fails the build otherwise).
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu_kernels.h"

namespace specdec::cpu {
namespace {

// The builds, narrowest first; a level is an index into this table.
constexpr const char* kNames[] = {"generic", "avx2", "avx512"};
constexpr int kLevels = static_cast<int>(sizeof(kNames) / sizeof(kNames[0]));

struct Choice {
  int level;
  std::string message;  // empty, or why the choice differs from what SPECDEC_CPU_ISA asked for
};

// The widest build the CPU can run.
int supported_level() {
#if defined(SPECDEC_HAVE_X86_ISAS)
  __builtin_cpu_init();
  const bool fma = __builtin_cpu_supports("fma");
  if (fma && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
    return 2;
  }
  if (fma && __builtin_cpu_supports("avx2")) return 1;
#endif
  return 0;
}

// SPECDEC_CPU_ISA=generic|avx2|avx512 caps the choice (tests and benchmarks compare the builds on one
// machine). It never makes the CPU run an instruction it lacks: a build the CPU cannot run gives the widest
// one it can, an unknown name is ignored, and either way the message says so in one line.
Choice detect() {
  const int supported = supported_level();
  const char* cap = std::getenv("SPECDEC_CPU_ISA");
  if (cap == nullptr || *cap == '\0') return {supported, ""};
  for (int level = 0; level < kLevels; ++level) {
    if (std::strcmp(cap, kNames[level]) != 0) continue;
    if (level <= supported) return {level, ""};
    return {supported, std::string("SPECDEC_CPU_ISA=") + cap + ": this CPU cannot run the " + cap +
                           " kernels; using " + kNames[supported]};
  }
  return {supported, std::string("SPECDEC_CPU_ISA=") + cap +
                         ": unknown instruction set (generic, avx2 or avx512); using " + kNames[supported]};
}

const Choice& choice() {
  static const Choice c = detect();
  return c;
}

RowKernels kernels_at(int level) {
#if defined(SPECDEC_HAVE_X86_ISAS)
  if (level == 2) return row_kernels_avx512();
  if (level == 1) return row_kernels_avx2();
#endif
  return row_kernels_generic();
}

}  // namespace

const char* isa_name() { return kNames[choice().level]; }
const char* isa_message() { return choice().message.c_str(); }
const RowKernels& row_kernels() {
  static const RowKernels k = kernels_at(choice().level);
  return k;
}

}  // namespace specdec::cpu
