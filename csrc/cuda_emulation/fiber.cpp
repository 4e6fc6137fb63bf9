// Context switching of the CUDA host emulation (see fiber.h).
#include "fiber.h"

#include <cstdint>

#if defined(__x86_64__)

// specdec_emu_switch(void** from_sp, void* to_sp): pushes the callee-saved registers, stores the stack
// pointer in *from_sp, switches to to_sp and pops the same frame there. The FP control state (MXCSR, x87
// control word) is shared by all fibers: kernel code never changes it (device code cannot).
extern "C" void specdec_emu_switch(void** from_sp, void* to_sp);
asm(R"(
  .pushsection .text
  .p2align 4
  .globl specdec_emu_switch
  .hidden specdec_emu_switch
  .type specdec_emu_switch,@function
specdec_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size specdec_emu_switch, .-specdec_emu_switch
  .popsection
)");

namespace specdec_emu {

void make_context(Context& ctx, void* stack, size_t size, void (*entry)()) {
  auto top = (reinterpret_cast<uintptr_t>(stack) + size) & ~static_cast<uintptr_t>(15);
  void** sp = reinterpret_cast<void**>(top);
  *--sp = nullptr;                            // return address of entry (it never returns)
  *--sp = reinterpret_cast<void*>(entry);     // popped by `ret`: rsp % 16 == 8 at entry, as after a call
  for (int i = 0; i < 6; ++i) *--sp = nullptr;  // rbp rbx r12 r13 r14 r15
  ctx.sp = sp;
}

void switch_context(Context& from, Context& to) { specdec_emu_switch(&from.sp, to.sp); }

}  // namespace specdec_emu

#else

namespace specdec_emu {

void make_context(Context& ctx, void* stack, size_t size, void (*entry)()) {
  getcontext(&ctx.uc);
  ctx.uc.uc_stack.ss_sp = stack;
  ctx.uc.uc_stack.ss_size = size;
  ctx.uc.uc_link = nullptr;
  makecontext(&ctx.uc, entry, 0);
}

void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

}  // namespace specdec_emu

#endif
