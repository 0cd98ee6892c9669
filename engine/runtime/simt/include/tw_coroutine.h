// tileweave cuda-sim: stackful coroutines for the emulated CUDA threads (runtime.cpp only). Stacks are
// mapped lazily with a guard page under each (while the map count allows) and a canary at the bottom; an
// x86-64 context switch saves the callee-saved registers; ucontext does the same elsewhere (or with
// -DTW_UCONTEXT, which is how the fallback gets tested on x86-64).
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#if !defined(__x86_64__) || defined(TW_UCONTEXT)
#include <ucontext.h>
#endif

namespace {

struct Stack {
    char* map = nullptr;  // the mapping (guard page first when guarded)
    char* lo = nullptr;   // lowest usable byte (holds the canary)
    size_t size = 0;      // usable bytes
};

size_t g_stack_size = 256 * 1024;
size_t g_page = 4096;
std::vector<Stack> g_free_stacks;
size_t g_guarded = 0;  // guard pages split mappings: at most this many, so the map count stays in bounds
constexpr size_t MAX_GUARDED = 12000;
constexpr size_t MAX_POOLED_STACKS = 4096;

Stack get_stack() {
    if (!g_free_stacks.empty()) {
        Stack s = g_free_stacks.back();
        g_free_stacks.pop_back();
        return s;
    }
    const bool guard = g_guarded < MAX_GUARDED;
    const size_t total = g_stack_size + (guard ? g_page : 0);
    void* m = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
        std::fprintf(stderr, "tileweave cuda-sim: cannot map a %zu-byte thread stack\n", total);
        std::abort();
    }
    Stack s;
    s.map = (char*)m;
    s.lo = s.map + (guard ? g_page : 0);
    s.size = g_stack_size;
    if (guard) {
        mprotect(s.map, g_page, PROT_NONE);
        ++g_guarded;
    }
    return s;
}

struct Thread;
void thread_main(Thread* t);

#if defined(__x86_64__) && !defined(TW_UCONTEXT)
extern "C" void tw_ctx_switch(void** save, void* load) __attribute__((visibility("hidden")));
extern "C" void tw_ctx_start() __attribute__((visibility("hidden")));
// Saves the callee-saved registers on the current stack, stores the stack pointer in *save, switches to
// `load` and restores the same from there (MXCSR and the x87 control word are left alone: nothing in a
// kernel changes them). A new stack starts in tw_ctx_start with the Thread* in rbx, the entry in r12.
asm(R"(
.text
.globl tw_ctx_switch
.hidden tw_ctx_switch
.type tw_ctx_switch,@function
tw_ctx_switch:
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
.size tw_ctx_switch,.-tw_ctx_switch
.globl tw_ctx_start
.hidden tw_ctx_start
.type tw_ctx_start,@function
tw_ctx_start:
    movq %rbx, %rdi
    callq *%r12
    ud2
.size tw_ctx_start,.-tw_ctx_start
)");

struct Context {
    void* sp = nullptr;
};

void ctx_init(Context& c, const Stack& s, Thread* t) {
    uint64_t* top = (uint64_t*)(((uintptr_t)(s.lo + s.size)) & ~(uintptr_t)15);
    top[-1] = 0;
    top[-2] = 0;
    top[-3] = (uint64_t)&tw_ctx_start;  // ret lands here with rsp 16-byte aligned for the call
    top[-4] = 0;                        // rbp
    top[-5] = (uint64_t)t;              // rbx
    top[-6] = (uint64_t)&thread_main;   // r12
    top[-7] = 0;                        // r13
    top[-8] = 0;                        // r14
    top[-9] = 0;                        // r15
    c.sp = &top[-9];
}
Context g_sched;
inline void ctx_switch(Context& from, Context& to) { tw_ctx_switch(&from.sp, to.sp); }
#else
struct Context {
    ucontext_t uc;
};
void ctx_trampoline(unsigned hi, unsigned lo) { thread_main((Thread*)(((uintptr_t)hi << 32) | lo)); }
Context g_sched;
void ctx_init(Context& c, const Stack& s, Thread* t) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = s.lo;
    c.uc.uc_stack.ss_size = s.size;
    c.uc.uc_link = nullptr;
    const uintptr_t p = (uintptr_t)t;
    makecontext(&c.uc, (void (*)())ctx_trampoline, 2, (unsigned)(p >> 32), (unsigned)p);
}
inline void ctx_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

}  // namespace
