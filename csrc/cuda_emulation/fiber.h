// Minimal cooperative context switching for the CUDA host emulation: a fiber is a stack and a saved
// stack pointer. x86-64 switches by hand (the callee-saved registers: a handful of instructions, so that
// blocks of 1024 fibers meeting at thousands of barriers stay cheap); other architectures fall back to
// ucontext.
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace specdec_emu {

struct Context {
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t uc;
#endif
};

// Prepares `ctx` to start `entry()` on the stack [stack, stack + size) at its first switch_context.
// `entry` must never return.
void make_context(Context& ctx, void* stack, size_t size, void (*entry)());

// Saves the running context into `from` and resumes `to`.
void switch_context(Context& from, Context& to);

}  // namespace specdec_emu
