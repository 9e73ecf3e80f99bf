// ncclguard's dlsym(): lookups of NCCL functions on the handle of an NCCL library return
// ncclguard's wrappers. Frameworks that dlopen() libnccl and call what dlsym() gives them (Paddle,
// JAX/XLA, vLLM through ctypes) are otherwise invisible to an LD_PRELOAD library.
//
// glibc's dlsym(RTLD_NEXT, ...) means "the next definition after the *caller*", and glibc finds
// the caller from its return address. So dlsym() is a small assembly trampoline that asks
// ncclguard_dlsym_replacement() whether to answer, and otherwise *jumps* (a true tail call, at
// every optimisation level and under sanitizers) to glibc's dlsym with the caller's return
// address untouched.
#include <dlfcn.h>

#include <optional>

#include "shim/libraries.h"
#include "shim/wrappers.h"
#include "watchdog/common/nccl_api.h"
#include "watchdog/record/hooks.h"

// glibc's dlsym (libraries.cc finds it); the trampoline below jumps through it.
extern "C" __attribute__((visibility("hidden"))) void* ncclguard_real_dlsym;

// Returns the wrapper to hand out, or nullptr to let glibc answer. Runs for every dlsym() in the
// process, sanitizer runtimes' early lookups included: it must stay cheap and uninstrumented.
extern "C" __attribute__((visibility("hidden"), used, NCCLGUARD_UNINSTRUMENTED)) void*
ncclguard_dlsym_replacement(void* handle, const char* name) noexcept {
  using namespace ncclguard;
  shim::RealDlsym();  // the trampoline jumps through ncclguard_real_dlsym
  if (handle == RTLD_NEXT || handle == RTLD_DEFAULT || name == nullptr) return nullptr;
  const std::optional<Api> api = FindApi(name);
  if (!api || hooks::Disabled()) return nullptr;
  void* real = shim::RealDlsym()(handle, name);
  if (real == nullptr) return nullptr;  // glibc answers again, with its own dlerror()
  const int library = shim::SlotForLookup(handle, *api, real);
  return library < 0 ? nullptr : shim::Wrapper(library, *api);
}

#if defined(__x86_64__)
asm(R"(
  .text
  .globl dlsym
  .type dlsym, @function
  .p2align 4
dlsym:
  .cfi_startproc
  pushq %rdi
  .cfi_adjust_cfa_offset 8
  pushq %rsi
  .cfi_adjust_cfa_offset 8
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  call ncclguard_dlsym_replacement
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %rsi
  .cfi_adjust_cfa_offset -8
  popq %rdi
  .cfi_adjust_cfa_offset -8
  testq %rax, %rax
  jz 1f
  ret
1:
  jmp *ncclguard_real_dlsym(%rip)
  .cfi_endproc
  .size dlsym, .-dlsym
)");
#elif defined(__aarch64__)
asm(R"(
  .text
  .globl dlsym
  .type dlsym, %function
  .p2align 4
dlsym:
  .cfi_startproc
  stp x29, x30, [sp, #-32]!
  .cfi_def_cfa_offset 32
  .cfi_offset 29, -32
  .cfi_offset 30, -24
  mov x29, sp
  stp x0, x1, [sp, #16]
  bl ncclguard_dlsym_replacement
  cbnz x0, 1f
  ldp x0, x1, [sp, #16]
  ldp x29, x30, [sp], #32
  .cfi_remember_state
  .cfi_def_cfa_offset 0
  adrp x16, ncclguard_real_dlsym
  ldr x16, [x16, #:lo12:ncclguard_real_dlsym]
  br x16
1:
  .cfi_restore_state
  ldp x29, x30, [sp], #32
  .cfi_def_cfa_offset 0
  ret
  .cfi_endproc
  .size dlsym, .-dlsym
)");
#else
#error "ncclguard's dlsym trampoline supports x86-64 and AArch64"
#endif
