// Check of the Gumbel searches' word-threshold table (gumbel_search.h kWordThresholds), which the compiler
// evaluates (a load-time constructor would run one instruction set's code before dispatch): every entry
// against the same formula with the C library's exp at run time. An entry may sit one word below the
// run-time value (exp_neg_const's few-ulp error near an integer), never above it: a threshold above the
// exact one could prune a block that can win. Built and run by tests/native/test_native.py once per instruction
// set; prints "entries N equal E below B other O".
#include <cmath>
#include <cstdio>

#include "specdec/cpu/gumbel_search.h"

using namespace specdec;

int main() {
  static_assert(kWordThresholds.at[0] == 0, "e = 0 lifts nothing: no word can be skipped");
  long equal = 0, below = 0, other = 0;
  for (int k = 0; k <= WordThresholds::kLast; ++k) {
    const double t = (1.0 - std::exp(-static_cast<double>(k) / WordThresholds::kSteps)) * 2147483648.0 - 1024.0;
    const long want = t > 0.0 ? static_cast<long>(static_cast<uint32_t>(t)) : 0L;
    const long got = kWordThresholds.at[k];
    equal += got == want;
    below += got == want - 1;
    other += got > want || got < want - 1;
  }
  std::printf("entries %d equal %ld below %ld other %ld\n", WordThresholds::kLast + 1, equal, below, other);
  return 0;
}
